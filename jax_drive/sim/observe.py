"""Observations: line-of-sight visibility (jitted), structured arrays for learned agents
(jitted) and the partially observable text captioner (Python, over NumPy copies).

Visibility: agent j is visible to i when it is present, within ``cfg.sensor_range`` of
i's centre, and at least one of five rays from i's centre to j's centre and corners
crosses no edge of any third vehicle's box (other boxes occlude).
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.geometry import box_corners, rotate, segments_intersect, wrap_angle
from jax_drive.sim import lanes as lanes_lib
from jax_drive.sim.core import lane_light
from jax_drive.sim.state import LIGHT_NAMES, Scenario, SimConfig, SimState

NUM_NEIGHBOURS = 6
EGO_FEATURES = 8
NEIGHBOUR_FEATURES = 7
OBS_SIZE = EGO_FEATURES + NUM_NEIGHBOURS * NEIGHBOUR_FEATURES


def present_mask(sc: Scenario, st: SimState) -> chex.Array:
    """(..., A) agents currently in the world (valid and not yet arrived / removed)."""
    return sc.valid & (st.success_step < 0)


def line_of_sight(centres: chex.Array, corners: chex.Array, blockers: chex.Array) -> chex.Array:
    """Unoccluded rays between boxes.

    Args:
      centres: (A, 2) observer positions; corners: (A, 4, 2) box corners of every agent.
      blockers: (A,) bool, boxes that can occlude.
    Returns: (A, A) bool, i sees some point (centre or a corner) of j without crossing
      the box of any k not in {i, j}.
    """
    a = centres.shape[0]
    targets = jnp.concatenate([centres[:, None], corners], axis=1)  # (A, 5, 2)
    p0 = centres[:, None, None, None, None, :]
    p1 = targets[None, :, :, None, None, :]
    q0 = corners[None, None, None, :, :, :]
    q1 = jnp.roll(corners, -1, axis=-2)[None, None, None, :, :, :]
    cross = jnp.any(segments_intersect(p0, p1, q0, q1), axis=-1)  # (i, j, 5, k)
    idx = jnp.arange(a)
    other = (idx[None, None, None, :] != idx[:, None, None, None]) & (idx[None, None, None, :] != idx[None, :, None, None])
    blocked = jnp.any(cross & other & blockers[None, None, None, :], axis=-1)  # (i, j, 5)
    return jnp.any(~blocked, axis=-1)


@functools.partial(jax.jit, static_argnums=0)
def visibility_batch(cfg: SimConfig, sc: Scenario, st: SimState) -> chex.Array:
    """(E, A, A) visibility over a leading episode axis."""
    return jax.vmap(lambda s, q: _visibility(cfg, s, q))(sc, st)


def _visibility(cfg: SimConfig, sc: Scenario, st: SimState) -> chex.Array:
    """(A, A) bool: j visible to i (one episode)."""
    present = present_mask(sc, st)
    centres = jnp.stack([st.x, st.y], -1)
    corners = box_corners(st.x, st.y, st.heading, sc.length, sc.width)
    dist = jnp.linalg.norm(centres[:, None] - centres[None], axis=-1)
    los = line_of_sight(centres, corners, present)
    a = st.x.shape[-1]
    return los & (dist <= cfg.sensor_range) & present[:, None] & present[None, :] & ~jnp.eye(a, dtype=bool)


visibility = jax.jit(_visibility, static_argnums=0)


def structured(cfg: SimConfig, sc: Scenario, st: SimState, visible: chex.Array) -> chex.Array:
    """Array observation per agent (one episode), for learned agents.

    Returns (A, OBS_SIZE) float32:
      ego: speed, lateral offset from its lane, heading error to the lane, distance to the
        goal along the goal lane (clipped 0..200), lane speed limit, light ahead
        (0 green / 1 yellow / 2 red, -1 none), distance to the stop line (clipped), done;
      then the NUM_NEIGHBOURS nearest visible agents in the ego frame: dx, dy, cos and
      sin of relative heading, speed, length, valid (zeros when fewer are visible).
    """
    pos = jnp.stack([st.x, st.y], -1)
    pts = sc.lanes.points[st.lane]
    arc, lat, lh = lanes_lib.project(pts, pos)
    g_arc, _, _ = lanes_lib.project(sc.lanes.points[sc.goal_lane], pos)
    light = lane_light(sc, st.lane, st.step * cfg.dt)
    has_light = sc.lanes.light[st.lane] >= 0
    stop_gap = jnp.clip(sc.lanes.stop_arc[st.lane] - arc, -10.0, 200.0)
    ego = jnp.stack(
        [
            st.speed,
            lat,
            wrap_angle(st.heading - lh),
            jnp.clip(sc.goal_arc - g_arc, 0.0, 200.0),
            sc.lanes.speed_limit[st.lane],
            jnp.where(has_light, light, -1).astype(jnp.float32),
            jnp.where(has_light, stop_gap, 200.0),
            st.done.astype(jnp.float32),
        ],
        -1,
    )
    rel = pos[None, :, :] - pos[:, None, :]  # (i, j, 2)
    local = rotate(rel, -st.heading[:, None])
    dist = jnp.where(visible, jnp.linalg.norm(rel, axis=-1), jnp.inf)
    order = jnp.argsort(dist, axis=-1)[:, :NUM_NEIGHBOURS]
    take = lambda v: jnp.take_along_axis(v, order, axis=-1)  # noqa: E731
    dh = st.heading[None, :] - st.heading[:, None]
    ok = jnp.isfinite(take(dist))
    nb = jnp.stack(
        [
            take(local[..., 0]),
            take(local[..., 1]),
            take(jnp.cos(dh)),
            take(jnp.sin(dh)),
            take(jnp.broadcast_to(st.speed[None, :], dist.shape)),
            take(jnp.broadcast_to(sc.length[None, :], dist.shape)),
            ok.astype(jnp.float32),
        ],
        -1,
    )
    nb = jnp.where(ok[..., None], nb, 0.0)
    return jnp.concatenate([ego, nb.reshape(nb.shape[0], -1)], -1).astype(jnp.float32)


structured_batch = jax.jit(
    lambda cfg, sc, st, vis: jax.vmap(lambda s, q, v: structured(cfg, s, q, v))(sc, st, vis), static_argnums=0
)


# ----------------------------------------------------------------------------- captioner
_SECTORS = ["ahead", "ahead-left", "to the left", "behind-left", "behind", "behind-right", "to the right", "ahead-right"]
_COMPASS = ["east", "north-east", "north", "north-west", "west", "south-west", "south", "south-east"]


def sector(angle: float) -> str:
    """Relative direction word for a bearing in the ego frame (rad, 0 = ahead)."""
    return _SECTORS[int(np.round(((angle + 2 * np.pi) % (2 * np.pi)) / (np.pi / 4))) % 8]


def compass(heading: float) -> str:
    return _COMPASS[int(np.round(((heading + 2 * np.pi) % (2 * np.pi)) / (np.pi / 4))) % 8]


def relative_motion(rel_heading: float) -> str:
    c = np.cos(rel_heading)
    if c > 0.7:
        return "in the same direction"
    if c < -0.7:
        return "towards you"
    return "across your path"


def caption(view: dict, i: int, messages: list | None = None, task: str | None = None) -> str:
    """Text observation of agent ``i`` from a NumPy view of one episode.

    ``view`` holds NumPy arrays (see :func:`jax_drive.sim.runner.numpy_view`): scenario and
    state fields plus ``visible`` (A, A), ``light`` (A,), ``t`` (s), ``lane_arc`` (A,),
    ``lane_lat`` (A,). Only visible vehicles are described; ``messages`` are
    (age_s, sender_vid, text) tuples already filtered by the message bus.
    """
    vid = int(view["vehicle_id"][i])
    x, y, h, v = (float(view[k][i]) for k in ("x", "y", "heading", "speed"))
    lane = int(view["lane"][i])
    label = int(view["lane_label"][lane])
    kind = "truck" if view["kind"][i] else "car"
    lines = [f"You are Vehicle {vid} ({kind}), driving {compass(h)} in lane {label} at {v:.1f} m/s."]
    lines.append(f"Speed limit: {float(view['speed_limit'][lane]):.0f} m/s. Time: {view['t']:.1f} s.")
    if view["lane_light"][lane] >= 0:
        gap = float(view["stop_arc"][lane] - view["lane_arc"][i])
        if gap > -2.0:
            lines.append(f"Traffic light ahead is {LIGHT_NAMES[int(view['light'][i])]}, stop line in {max(gap, 0):.0f} m.")
    left, right = int(view["lane_left"][lane]), int(view["lane_right"][lane])
    lanes_txt = []
    if left >= 0:
        lanes_txt.append("a lane to your left" + (" (opposite direction)" if view["lane_label"][left] < 0 else ""))
    if right >= 0:
        lanes_txt.append("a lane to your right")
    if lanes_txt:
        lines.append("There is " + " and ".join(lanes_txt) + ".")
    seen = np.nonzero(view["visible"][i])[0]
    if len(seen) == 0:
        lines.append("You see no other vehicles.")
    for j in sorted(seen, key=lambda j: np.hypot(view["x"][j] - x, view["y"][j] - y)):
        dx, dy = view["x"][j] - x, view["y"][j] - y
        dist = float(np.hypot(dx, dy))
        bearing = np.arctan2(dy, dx) - h
        rel_h = float(view["heading"][j] - h)
        sj = float(view["speed"][j])
        kind_j = "truck" if view["kind"][j] else "car"
        state = "stopped" if sj < 0.5 else f"moving {relative_motion(rel_h)} at {sj:.1f} m/s"
        lines.append(f"Vehicle {int(view['vehicle_id'][j])} ({kind_j}) is {dist:.0f} m {sector(bearing)}, {state}.")
    if task:
        lines.append(f"Task: {task}")
    if messages:
        lines.append("Messages received:")
        for age, sender, text in messages:
            lines.append(f"  [{age:.1f} s ago] Vehicle {sender}: {text}")
    return "\n".join(lines)
