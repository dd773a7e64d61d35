"""Top-down rendering of an episode (matplotlib, Agg): lanes, trajectories, final boxes
with vehicle ids coloured by role, outcomes and the last messages; optional GIF."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Polygon  # noqa: E402

from jax_drive.sim.state import Role  # noqa: E402

ROLE_COLOURS = {Role.FOCAL: "tab:green", Role.COLLIDER: "tab:red", Role.BACKGROUND: "tab:blue"}
OUTCOME_COLOURS = {"success": "tab:green", "collision": "tab:red", "timeout": "tab:orange"}


def _corners(x, y, h, length, width):
    c, s = np.cos(h), np.sin(h)
    local = np.array([[length / 2, width / 2], [-length / 2, width / 2], [-length / 2, -width / 2],
                      [length / 2, -width / 2]])
    return local @ np.array([[c, s], [-s, c]]) + np.array([x, y])


def _draw_lanes(ax, static):
    n_lanes = len(static["lane_points"])
    for lane in range(n_lanes):
        pts = static["lane_points"][lane]
        if np.abs(pts).max() > 5e3:
            continue
        ax.plot(pts[:, 0], pts[:, 1], color="0.85", lw=6, solid_capstyle="butt", zorder=0)
        ax.plot(pts[:, 0], pts[:, 1], color="0.6", lw=0.5, ls="--", zorder=1)


def _frame(ax, static, pose, present):
    n = int(static["valid"].sum())
    for i in range(n):
        if not present[i]:
            continue
        x, y, h = pose[i, :3]
        role = Role(int(static["role"][i]))
        poly = Polygon(_corners(x, y, h, static["length"][i], static["width"][i]), closed=True,
                       fc=ROLE_COLOURS[role], ec="k", lw=0.6, alpha=0.85, zorder=3)
        ax.add_patch(poly)
        ax.text(x, y + static["width"][i] / 2 + 1.0, str(int(static["vehicle_id"][i])), fontsize=6, ha="center", zorder=4)


def render_episode(result, path, title: str | None = None, max_messages: int = 6) -> str:
    """Saves a PNG of one episode (needs ``keep_trajectory=True`` in the runner)."""
    traj = result.trajectory
    if traj is None:
        raise ValueError("episode has no trajectory; run it with keep_trajectory=True")
    poses, static = traj["poses"], traj["static"]
    n = int(static["valid"].sum())
    fig, (ax, side) = plt.subplots(1, 2, figsize=(12, 6), gridspec_kw={"width_ratios": [3, 1.3]})
    _draw_lanes(ax, static)
    for i in range(n):
        keep = poses[:, i, 3] > 0.5
        ax.plot(poses[keep, i, 0], poses[keep, i, 1], color=ROLE_COLOURS[Role(int(static["role"][i]))], lw=1,
                alpha=0.6, zorder=2)
    _frame(ax, static, poses[-1], poses[-1, :, 3] > 0.5)
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
    plt.close(fig)
    return str(path)


def animate_episode(result, path, fps: int = 4) -> str:
    """Saves a GIF of one episode (one frame per decision)."""
    from matplotlib import animation

    traj = result.trajectory
    if traj is None:
        raise ValueError("episode has no trajectory; run it with keep_trajectory=True")
    poses, static = traj["poses"], traj["static"]
    n = int(static["valid"].sum())
    fig, ax = plt.subplots(figsize=(7, 5))
    xy = poses[:, :n, :2][poses[:, :n, 3] > 0.5]
    lo, hi = xy.min(0) - 15, xy.max(0) + 15

    def draw(k):
        ax.clear()
        _draw_lanes(ax, static)
        _frame(ax, static, poses[k], poses[k, :, 3] > 0.5)
        ax.set_xlim(lo[0], hi[0])
        ax.set_ylim(lo[1], hi[1])
        ax.set_aspect("equal")
        ax.set_title(f"{result.scenario} t = {k * traj['decision_dt']:.1f} s", fontsize=9)

    anim = animation.FuncAnimation(fig, draw, frames=len(poses))
    anim.save(path, writer=animation.PillowWriter(fps=fps))
    plt.close(fig)
    return str(path)
