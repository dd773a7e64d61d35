"""Top-down rendering of an episode: lanes, trajectories, boxes with vehicle ids coloured by
role, outcomes and messages.

Every drawing reads an episode *story* (:func:`episode_story`): the JSON-serialisable part
of an :class:`~jax_drive.coop.runner.EpisodeResult` run with ``keep_trajectory=True``, so a
saved record and a live result draw the same way. Draws on an explicit matplotlib
``Figure`` with the Agg canvas, so importing this module never changes the process-wide
matplotlib backend.
"""

from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Polygon

from jax_drive.geometry import box_corners
from jax_drive.sim.state import Role

ROLE_COLOURS = {Role.FOCAL: "tab:green", Role.COLLIDER: "tab:red", Role.BACKGROUND: "tab:blue"}
ROLE_LEGEND = "green: focal, red: potential collider, blue: background"


def episode_story(result, episode: str = "") -> dict:
    """The JSON-serialisable record of one episode that the drawings read: scenario, label,
    policy, decision_dt, poses (T, n, 4) of its n vehicles (x, y, heading, present), lane
    centrelines, vehicle ids / roles / sizes, messages [t, vid, text], outcome lines and
    message counts. ``result`` must have been run with ``keep_trajectory=True``."""
    traj = result.trajectory
    if traj is None:
        raise ValueError("episode has no trajectory; run it with keep_trajectory=True")
    static = traj["static"]
    n = int(static["valid"].sum())
    keep = np.abs(static["lane_points"]).max((1, 2)) < 5e3  # padding lanes lie far away
    return {"episode": episode or result.scenario, "scenario": result.scenario,
            "accident_prone": bool(result.accident_prone), "policy": result.policy,
            "decision_dt": float(traj["decision_dt"]), "poses": np.round(traj["poses"][:, :n], 2).tolist(),
            "lanes": [np.round(p, 2).tolist() for p, ok in zip(static["lane_points"], keep) if ok],
            "vehicle_id": static["vehicle_id"][:n].tolist(), "role": static["role"][:n].tolist(),
            "length": static["length"][:n].tolist(), "width": static["width"][:n].tolist(),
            "messages": [[float(t), int(v), str(x)] for t, v, x in result.message_log],
            "outcomes": result.feedback, "messages_sent": int(result.messages_sent),
            "bytes_sent": int(result.bytes_sent)}


def as_story(episode) -> dict:
    """An EpisodeResult's or a saved story's drawable story, its poses already a (T, n, 4)
    array (converted once, not once per panel)."""
    story = episode if isinstance(episode, dict) else episode_story(episode)
    return {**story, "poses": _poses(story)}


def _poses(story: dict) -> np.ndarray:
    """(T, n, 4) poses, also for n = 0 (saved as T empty lists)."""
    return np.asarray(story["poses"], float).reshape(len(story["poses"]), -1, 4)


def story_label(story: dict) -> str:
    """'scenario (accident-prone, policy)'; records saved before the policy was stored name
    their method instead."""
    policy = story.get("policy", story.get("method", "?"))
    return f"{story['scenario']} ({'accident-prone' if story['accident_prone'] else 'safe'}, {policy})"


def as_written(text: str) -> str:
    """``text`` (a model's message or reply) drawn as written: its dollar signs escaped, so
    matplotlib does not read them as TeX (``parse_math=False`` is not enough: text wrapping
    measures lines as mathtext regardless, and an odd reply then stops the plot)."""
    return text.replace("$", r"\$")


def story_extent(story: dict, pad: float) -> tuple[np.ndarray, np.ndarray] | None:
    """(2,) lower and upper corners of every present vehicle position, widened by ``pad`` m
    (None when no vehicle is ever present: let matplotlib fit the lanes)."""
    poses = _poses(story)
    xy = poses[..., :2][poses[..., 3] > 0.5]
    if not len(xy):
        return None
    return xy.min(0) - pad, xy.max(0) + pad


def draw_frame(ax, story: dict, step: int, extent: tuple[np.ndarray, np.ndarray] | None,
               trail_alpha: float = 0.6) -> None:
    """Draws ``story`` at trajectory index ``step`` on ``ax``: lanes, each vehicle's trail up
    to ``step``, its box and id at ``step``, limits ``extent`` (see :func:`story_extent`)."""
    poses = _poses(story)  # (T, n, 4)
    length, width = np.asarray(story["length"], float), np.asarray(story["width"], float)
    colours = [ROLE_COLOURS.get(int(r), "0.5") for r in story["role"]]  # grey: an unknown role
    for pts in story["lanes"]:
        pts = np.asarray(pts, float)
        ax.plot(pts[:, 0], pts[:, 1], color="0.85", lw=6, solid_capstyle="butt", zorder=0)
        ax.plot(pts[:, 0], pts[:, 1], color="0.6", lw=0.5, ls="--", zorder=1)
    for i, colour in enumerate(colours):
        keep = poses[: step + 1, i, 3] > 0.5
        ax.plot(poses[: step + 1][keep, i, 0], poses[: step + 1][keep, i, 1], color=colour, lw=1,
                alpha=trail_alpha, zorder=2)
    pose = poses[step]
    corners = np.asarray(box_corners(pose[:, 0], pose[:, 1], pose[:, 2], length, width))
    for i in np.flatnonzero(pose[:, 3] > 0.5):
        ax.add_patch(Polygon(corners[i], closed=True, fc=colours[i], ec="k", lw=0.6, alpha=0.85, zorder=3))
        ax.text(pose[i, 0], pose[i, 1] + width[i] / 2 + 1.0, str(story["vehicle_id"][i]), fontsize=6,
                ha="center", zorder=4)
    if extent is not None:
        lo, hi = extent
        ax.set_xlim(lo[0], hi[0])
        ax.set_ylim(lo[1], hi[1])
    ax.set_aspect("equal")


def render_episode(episode, path, title: str | None = None, max_messages: int = 6) -> str:
    """Saves a PNG of one episode (an EpisodeResult run with ``keep_trajectory=True``, or its
    :func:`episode_story`): the whole trails and the final boxes, outcomes and last messages."""
    story = as_story(episode)
    fig = Figure(figsize=(12, 6))
    FigureCanvasAgg(fig)
    ax, side = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1.3]})
    last = len(story["poses"]) - 1
    draw_frame(ax, story, last, story_extent(story, 15.0))
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_title(title or f"{story_label(story)} t = {last * story['decision_dt']:.1f} s", fontsize=9)
    side.axis("off")
    lines = ["Outcomes:"] + list(story["outcomes"])
    sent, size = story.get("messages_sent", len(story["messages"])), story.get("bytes_sent", "?")
    lines += ["", f"Messages ({sent}, {size} bytes):"]
    for t, vid, text in story["messages"][-max_messages:]:
        lines.append(as_written(f"[{t:.1f}s] {vid}: {text[:70]}"))
    side.text(0.0, 1.0, "\n".join(lines), va="top", fontsize=7, family="monospace", wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def storyboard_steps(num_steps: int, panels: int) -> np.ndarray:
    """(panels,) increasing trajectory indices, evenly spaced from the first to the last step
    (fewer when the episode has fewer steps)."""
    if num_steps < 1 or panels < 1:
        raise ValueError(f"need num_steps >= 1 and panels >= 1, got {num_steps}, {panels}")
    return np.unique(np.linspace(0, num_steps - 1, panels).round().astype(int))


def render_storyboard(episode, panels: int = 4, max_messages: int = 3, columns: int = 4,
                      title: str | None = None) -> Figure:
    """A storyboard of one episode (an EpisodeResult run with ``keep_trajectory=True``, or
    its :func:`episode_story`, e.g. read back from a results JSON): ``panels`` snapshots
    evenly spaced in time, each with the trails so far, the vehicles at that moment and the
    messages sent since the previous panel (the last ``max_messages`` of them). Returns the
    Figure (Agg canvas); save it or display it."""
    story = as_story(episode)
    dt = story["decision_dt"]
    steps = storyboard_steps(len(story["poses"]), panels)
    rows = -(-len(steps) // columns)
    fig = Figure(figsize=(4.2 * min(columns, len(steps)), 5.2 * rows))
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, min(columns, len(steps)), squeeze=False).ravel()
    extent = story_extent(story, 10.0)
    previous = -np.inf
    for ax, k in zip(axes, steps):
        t = k * dt
        draw_frame(ax, story, int(k), extent)
        ax.set_title(f"t = {t:.1f} s", fontsize=9)
        sent = [(ts, vid, text) for ts, vid, text in story["messages"] if previous < ts <= t + 1e-9]
        lines = [as_written(line) for _, vid, text in sent[-max_messages:]
                 for line in textwrap.wrap(f"{vid}: {text}", 58, max_lines=2, placeholder=" ...")]
        if len(sent) > max_messages:
            lines.insert(0, f"(+{len(sent) - max_messages} earlier)")
        ax.text(0.0, -0.08, "\n".join(lines) or "(no messages)", transform=ax.transAxes, va="top", fontsize=6,
                family="monospace")
        previous = t
    for ax in axes[len(steps):]:
        ax.axis("off")
    outcome = "; ".join(story["outcomes"])
    fig.suptitle(f"{title or story_label(story)}\n{outcome[:160]}\n{ROLE_LEGEND}", fontsize=9)
    fig.tight_layout()
    return fig
