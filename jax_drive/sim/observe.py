"""Observations: line-of-sight visibility (jitted), the per-decision batch observation
(jitted), structured arrays for learned agents (jitted), NumPy views of one episode and
the partially observable text captioner (Python, over those views).

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

from jax_drive.geometry import box_corners, polyline_table, project_on_table, rotate, segments_intersect, wrap_angle
from jax_drive.sim.core import lane_coords, lane_light
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


@functools.partial(jax.jit, static_argnums=0)
def observe_batch(cfg: SimConfig, sc: Scenario, st: SimState) -> tuple[chex.Array, chex.Array, chex.Array]:
    """What the Python-side policies read at a decision, for a batch of episodes (leading
    axis E): visibility (E, A, A), each agent's arc along its current lane (E, A) and the
    :class:`~jax_drive.sim.state.Light` state governing that lane (E, A)."""

    def one(s, q):
        arc, _ = lane_coords(polyline_table(s.lanes.points[q.lane]), jnp.stack([q.x, q.y], -1))
        return _visibility(cfg, s, q), arc, lane_light(s, q.lane, q.step * cfg.dt)

    return jax.vmap(one)(sc, st)


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
    lane_rows = polyline_table(sc.lanes.points)
    own = project_on_table(lane_rows.take(st.lane), pos, extrapolate=True)
    arc, lat, lh = own.arc, own.lateral, own.heading
    g_arc = project_on_table(lane_rows.take(sc.goal_lane), pos, extrapolate=True).arc
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


# ------------------------------------------------------------------------- NumPy views
# Python-side readers (policies, the captioner) see one episode as a dict of NumPy arrays:
# the static fields of :func:`static_views` plus the state fields of :data:`VIEW_STATE`,
# ``visible`` (A, A), ``lane_arc`` (A,), ``light`` (A,) and the time ``t`` (s).
VIEW_STATE = ("x", "y", "heading", "speed", "lane", "done", "success_step", "collision_step")


def static_views(sc: Scenario, num: int | None = None) -> list[dict]:
    """Static NumPy fields of the first ``num`` episodes of a batched scenario (E, ...):
    the agents' (A,) scenario fields, the lane graph's (L, ...) fields prefixed ``lane_``
    (plus ``stop_arc`` and ``speed_limit``), ``init_lane`` and ``lane_table``, a float64
    :class:`~jax_drive.geometry.PolylineTable` (L, S, ...) of the lane paths."""
    arrays = {k: np.asarray(v) for k, v in sc.items() if k not in ("lanes", "lights")}
    lanes = {k: np.asarray(v) for k, v in sc.lanes.items()}
    num = len(arrays["valid"]) if num is None else num
    own = ("valid", "behaviour", "role", "reward", "transceiver", "vehicle_id", "kind", "length", "width",
           "cruise_speed", "goal_lane", "goal_arc", "lc_arc", "lc_end_arc")
    from_lanes = {"lane_points": "points", "lane_left": "left", "lane_right": "right", "lane_label": "label",
                  "lane_maneuver": "maneuver", "lane_light": "light", "stop_arc": "stop_arc",
                  "speed_limit": "speed_limit"}
    return [{**{k: arrays[k][e] for k in own}, "init_lane": arrays["lane"][e],
             **{k: lanes[v][e] for k, v in from_lanes.items()},
             "lane_table": polyline_table(lanes["points"][e].astype(np.float64))} for e in range(num)]


def numpy_view(static: dict, state: dict, e: int, visible, lane_arc, light, t: float) -> dict:
    """View of episode ``e``: its ``static`` fields, row ``e`` of the NumPy ``state``
    fields (:data:`VIEW_STATE`, each (E, A)) and of ``visible`` (E, A, A), ``lane_arc``
    and ``light`` (E, A) from :func:`observe_batch`, and the time ``t`` (s)."""
    view = dict(static)
    for k in VIEW_STATE:
        view[k] = state[k][e]
    view.update(visible=visible[e], lane_arc=lane_arc[e], light=light[e], t=t)
    return view


def task_text(view: dict, i: int) -> str:
    """Natural-language task of focal agent ``i`` of a view."""
    if view["behaviour"][i] != 0:
        return "You are stopped and cannot move; help the other vehicles with messages."
    lane, goal = int(view["lane"][i]), int(view["goal_lane"][i])
    dist = max(float(view["goal_arc"][i] - view["lane_arc"][i]), 0.0) if lane == goal else None
    text = "Reach your destination along your route without collisions"
    if goal != lane:
        side = "left" if view["lane_left"][lane] == goal else "right" if view["lane_right"][lane] == goal else None
        text += f"; you must change to the lane on your {side}" if side else "; return to your lane after passing"
    elif dist is not None:
        text += f", {dist:.0f} m ahead"
    return text + "."


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

    ``view``: one episode's NumPy view (:func:`numpy_view`). Only visible vehicles are
    described; ``messages`` are (age_s, sender_vid, text) tuples already filtered by the
    message bus.
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
