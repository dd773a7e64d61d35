"""Action helpers: CoLMDriver intentions -> waypoints, and command construction.

CoLMDriver's planner outputs 20 waypoints 0.2 s apart; its training labels re-time the
reference path with a constant acceleration per speed intention: STOP a = -10,
SLOWER a in [-8, -1], KEEP 0, FASTER a in [1, 5] m/s^2, speed capped at 8 m/s (reference
page). We use the midpoints of the ranges (SLOWER -4.5, FASTER +3) unless given. KEEP is
KEEP here at any speed: CoLMDriver turns KEEP below 4 m/s into FASTER only for the
intentions a negotiation agreed on (``KEEP_MIN_SPEED``, applied by the critic's sum-actions
step), not for the planner's own intentions or its safety cap. The navigation intention
picks the reference path: lane follow / straight / turns follow the agent's route path
(turns are encoded by the path itself), lane changes the neighbouring path.
"""

from __future__ import annotations

import enum
import functools

import chex
import jax
import jax.numpy as jnp

from jax_drive.geometry import point_at_arc, polyline_table, project_on_table
from jax_drive.sim.state import Action, Cmd, LaneGraph, SimConfig


class SpeedIntent(enum.IntEnum):
    STOP = 0
    SLOWER = 1
    KEEP = 2
    FASTER = 3


class NavIntent(enum.IntEnum):
    FOLLOW_LANE = 0
    GO_STRAIGHT = 1
    TURN_LEFT = 2
    TURN_RIGHT = 3
    LANE_LEFT = 4
    LANE_RIGHT = 5


SPEED_INTENT_ACCEL = (-10.0, -4.5, 0.0, 3.0)  # m/s^2 for STOP, SLOWER, KEEP, FASTER
SPEED_CAP = 8.0
KEEP_MIN_SPEED = 4.0  # m/s: a negotiated KEEP below this becomes FASTER (coop.negotiation.critic)


def reference_lane(lanes: LaneGraph, lane: chex.Array, nav: chex.Array) -> chex.Array:
    """(...) path followed for a navigation intention (neighbour for lane changes)."""
    left = lanes.left[lane]
    right = lanes.right[lane]
    out = jnp.where((nav == NavIntent.LANE_LEFT) & (left >= 0), left, lane)
    return jnp.where((nav == NavIntent.LANE_RIGHT) & (right >= 0), right, out)


def retime(speed: chex.Array, intent: chex.Array, num: int = 20, dt: float = 0.2, accel=None) -> chex.Array:
    """Distances travelled (..., num) at t = dt, 2 dt, ... under constant acceleration
    from ``speed`` (...), speed clipped to [0, SPEED_CAP] (exact piecewise integral)."""
    table = jnp.asarray(SPEED_INTENT_ACCEL if accel is None else accel, jnp.float32)
    a = table[intent][..., None]
    v0 = jnp.clip(speed, 0.0, SPEED_CAP)[..., None]
    t = dt * jnp.arange(1, num + 1, dtype=jnp.float32)
    v_lim = jnp.where(a >= 0, SPEED_CAP, 0.0)
    # time at which the speed limit (cap or standstill) is reached
    t_sat = jnp.where(a != 0, jnp.clip((v_lim - v0) / jnp.where(a != 0, a, 1.0), 0.0, jnp.inf), jnp.inf)
    t1 = jnp.minimum(t, t_sat)
    return v0 * t1 + 0.5 * a * t1**2 + v_lim * jnp.maximum(t - t_sat, 0.0) * (a > 0)


def intention_waypoints(cfg: SimConfig, lanes: LaneGraph, lane: chex.Array, x: chex.Array, y: chex.Array,
                        speed: chex.Array, nav: chex.Array, intent: chex.Array) -> chex.Array:
    """Waypoints (A, W, 2) for per-agent (nav, speed intention); world frame, 0.2 s apart.

    Args: lanes of one episode; lane, x, y, speed, nav, intent: (A,).
    """
    rows = polyline_table(lanes.points[reference_lane(lanes, lane, nav)])  # (A, S, ...)
    arc = project_on_table(rows, jnp.stack([x, y], -1), extrapolate=True).arc
    s = retime(speed, intent, cfg.num_waypoints, cfg.waypoint_dt)  # (A, W)
    wp, _ = point_at_arc(rows.expand(), arc[:, None] + s)
    return wp


def intention_action(cfg: SimConfig, lanes: LaneGraph, state, nav, intent) -> Action:
    """A WAYPOINTS action for every agent from intentions (scripted agents ignore it)."""
    wp = intention_waypoints(cfg, lanes, state.lane, state.x, state.y, state.speed, nav, intent)
    a = state.x.shape[-1]
    return Action(command=jnp.full((a,), Cmd.WAYPOINTS, jnp.int32), target_speed=jnp.zeros((a,), jnp.float32),
                  waypoints=wp.astype(jnp.float32))


def command_action(cfg: SimConfig, command, target_speed=None) -> Action:
    """Action from per-agent commands (A,) and optional target speeds (A,)."""
    command = jnp.asarray(command, jnp.int32)
    a = command.shape[-1]
    ts = jnp.zeros(command.shape, jnp.float32) if target_speed is None else jnp.asarray(target_speed, jnp.float32)
    return Action(command=command, target_speed=ts,
                  waypoints=jnp.zeros(command.shape + (cfg.num_waypoints, 2), jnp.float32))


@functools.partial(jax.jit, static_argnums=0)
def batched_intention_waypoints(cfg: SimConfig, lanes: LaneGraph, lane: chex.Array, x: chex.Array, y: chex.Array,
                                speed: chex.Array, nav: chex.Array, intent: chex.Array) -> chex.Array:
    """:func:`intention_waypoints` over episodes: lanes with (B, ...) fields, the rest (B, A);
    returns (B, A, W, 2)."""
    return jax.vmap(lambda *args: intention_waypoints(cfg, *args))(lanes, lane, x, y, speed, nav, intent)
