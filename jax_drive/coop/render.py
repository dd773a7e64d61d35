"""Top-down rendering of an episode: lanes, trajectories, final boxes with vehicle ids
coloured by role, outcomes and the last messages.

Draws on an explicit matplotlib ``Figure`` with the Agg canvas, so importing this module
never changes the process-wide matplotlib backend.
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


def _draw_lanes(ax, static):
    for pts in static["lane_points"]:
        if np.abs(pts).max() > 5e3:  # padding lanes lie far away
            continue
        ax.plot(pts[:, 0], pts[:, 1], color="0.85", lw=6, solid_capstyle="butt", zorder=0)
        ax.plot(pts[:, 0], pts[:, 1], color="0.6", lw=0.5, ls="--", zorder=1)


def _draw_vehicles(ax, static, pose, present):
    n = int(static["valid"].sum())
    corners = np.asarray(box_corners(pose[:n, 0], pose[:n, 1], pose[:n, 2], static["length"][:n],
                                     static["width"][:n]))
    for i in np.flatnonzero(present[:n]):
        x, y = pose[i, :2]
        ax.add_patch(Polygon(corners[i], closed=True, fc=ROLE_COLOURS[Role(int(static["role"][i]))], ec="k", lw=0.6,
                             alpha=0.85, zorder=3))
        ax.text(x, y + static["width"][i] / 2 + 1.0, str(int(static["vehicle_id"][i])), fontsize=6, ha="center",
                zorder=4)


def render_episode(result, path, title: str | None = None, max_messages: int = 6) -> str:
    """Saves a PNG of one episode (run it with ``keep_trajectory=True``)."""
    traj = result.trajectory
    if traj is None:
        raise ValueError("episode has no trajectory; run it with keep_trajectory=True")
    poses, static = traj["poses"], traj["static"]
    n = int(static["valid"].sum())
    fig = Figure(figsize=(12, 6))
    FigureCanvasAgg(fig)
    ax, side = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1.3]})
    _draw_lanes(ax, static)
    for i in range(n):
        keep = poses[:, i, 3] > 0.5
        ax.plot(poses[keep, i, 0], poses[keep, i, 1], color=ROLE_COLOURS[Role(int(static["role"][i]))], lw=1,
                alpha=0.6, zorder=2)
    _draw_vehicles(ax, static, poses[-1], poses[-1, :, 3] > 0.5)
    xy = poses[:, :n, :2][poses[:, :n, 3] > 0.5]
    if len(xy):
        lo, hi = xy.min(0) - 15, xy.max(0) + 15
        ax.set_xlim(lo[0], hi[0])
        ax.set_ylim(lo[1], hi[1])
    ax.set_aspect("equal")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    label = "accident-prone" if result.accident_prone else "safe"
    ax.set_title(title or f"{result.scenario} ({label}, {result.policy}) t = {result.end_time:.1f} s", fontsize=9)
    side.axis("off")
    lines = ["Outcomes:"] + [o.feedback() for o in result.outcomes]
    lines += ["", f"Messages ({result.messages_sent}, {result.bytes_sent} bytes):"]
    for t, vid, text in result.message_log[-max_messages:]:
        lines.append(f"[{t:.1f}s] {vid}: {text[:70]}")
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


def render_storyboard(result, panels: int = 4, max_messages: int = 3, columns: int = 4) -> Figure:
    """A storyboard of one episode (run with ``keep_trajectory=True``): ``panels`` snapshots
    evenly spaced in time, each with the trails so far, the vehicles at that moment and the
    messages sent since the previous panel (the last ``max_messages`` of them). Returns the
    Figure (Agg canvas); save it or display it."""
    traj = result.trajectory
    if traj is None:
        raise ValueError("episode has no trajectory; run it with keep_trajectory=True")
    poses, static, dt = traj["poses"], traj["static"], traj["decision_dt"]
    n = int(static["valid"].sum())
    steps = storyboard_steps(len(poses), panels)
    rows = -(-len(steps) // columns)
    fig = Figure(figsize=(4.2 * min(columns, len(steps)), 5.2 * rows))
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, min(columns, len(steps)), squeeze=False).ravel()
    xy = poses[:, :n, :2][poses[:, :n, 3] > 0.5]
    lo, hi = (xy.min(0) - 10, xy.max(0) + 10) if len(xy) else (np.full(2, -50.0), np.full(2, 50.0))
    previous = -np.inf
    for ax, k in zip(axes, steps):
        t = k * dt
        _draw_lanes(ax, static)
        for i in range(n):
            keep = poses[: k + 1, i, 3] > 0.5
            ax.plot(poses[: k + 1][keep, i, 0], poses[: k + 1][keep, i, 1],
                    color=ROLE_COLOURS[Role(int(static["role"][i]))], lw=1, alpha=0.6, zorder=2)
        _draw_vehicles(ax, static, poses[k], poses[k, :, 3] > 0.5)
        ax.set_xlim(lo[0], hi[0])
        ax.set_ylim(lo[1], hi[1])
        ax.set_aspect("equal")
        ax.set_title(f"t = {t:.1f} s", fontsize=9)
        sent = [(ts, vid, text) for ts, vid, text in result.message_log if previous < ts <= t + 1e-9]
        lines = [line for _, vid, text in sent[-max_messages:]
                 for line in textwrap.wrap(f"{vid}: {text}", 58, max_lines=2, placeholder=" ...")]
        if len(sent) > max_messages:
            lines.insert(0, f"(+{len(sent) - max_messages} earlier)")
        ax.text(0.0, -0.08, "\n".join(lines) or "(no messages)", transform=ax.transAxes, va="top", fontsize=6,
                family="monospace")
        previous = t
    for ax in axes[len(steps):]:
        ax.axis("off")
    label = "accident-prone" if result.accident_prone else "safe"
    outcome = "; ".join(o.feedback() for o in result.outcomes)
    fig.suptitle(f"{result.scenario} ({label}, {result.policy})\n{outcome[:160]}", fontsize=9)
    fig.tight_layout()
    return fig
