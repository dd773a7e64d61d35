"""Stateless, jittable physics of the cooperative simulator.

    state = reset(cfg, key, scenario)
    state = step(cfg, scenario, state, action)      # one decision period (k ticks)
    states = rollout(cfg, scenario, state, actions) # lax.scan over decisions

All functions take one episode; vmap them over a leading episode axis (see
:func:`batched_step`). Each tick: lights -> per-agent leader / stop-line gap ->
longitudinal control (PID to a desired speed for policy agents, IDM for scripted ones)
-> lateral PID towards an aim point on the lane (or on the waypoints) -> kinematic
bicycle -> events (collisions by oriented-box overlap, arrivals, red-light runs,
off-road, stagnation).

Cost per tick (what keeps the batched rollout fast): lane geometry is tabulated once per
decision (:class:`Tables` of :class:`jax_drive.geometry.PolylineTable`: segment starts,
unit directions, cumulative arcs), so a tick projects each agent once on its current lane
(reused as the next tick's start), plus the few agents off their goal lane; collisions
use :func:`jax_drive.geometry.boxes_overlap_pairwise`, a closed-form separating-axis test
on the four box axes; the waypoint follower and the all-lanes off-road test run only when some
agent needs them (``lax.cond`` at the batch level, so nothing is computed for nothing).

The interface is backend-neutral: a CARLA backend only has to provide ``reset`` and
``step`` with the same pytrees.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from jax_drive.geometry import (
    PolylineTable,
    boxes_overlap_pairwise,
    point_at_arc,
    polyline_table,
    project_on_table,
    wrap_angle,
)
from jax_drive.sim.state import (
    SPEED_STEP,
    Action,
    Behaviour,
    Cmd,
    Light,
    Lights,
    Scenario,
    SimConfig,
    SimState,
)


# ---------------------------------------------------------------------------- lights
def light_state(lights: Lights, t: chex.Array) -> chex.Array:
    """(..., K) int32 :class:`Light` state at time ``t`` (s) of fixed-cycle lights."""
    cycle = jnp.maximum(lights.green + lights.yellow + lights.red, 1e-6)
    phase = jnp.mod(t + lights.offset, cycle)
    state = jnp.where(
        phase < lights.green, Light.GREEN, jnp.where(phase < lights.green + lights.yellow, Light.YELLOW, Light.RED)
    )
    return jnp.where(lights.valid, state, Light.GREEN).astype(jnp.int32)


def lane_light(sc: Scenario, lane: chex.Array, t: chex.Array) -> chex.Array:
    """(A,) light state governing each agent's lane path (GREEN when none)."""
    states = light_state(sc.lights, t)
    idx = sc.lanes.light[lane]
    return jnp.where(idx >= 0, states[jnp.clip(idx, 0)], Light.GREEN)


# ------------------------------------------------------------------------ controllers
def pid_step(window: chex.Array, error: chex.Array, gains) -> tuple[chex.Array, chex.Array]:
    """CoLMDriver/TCP PID: output = kp*e + ki*mean(window) + kd*(e - e_prev).

    Args: window (..., W) past errors (oldest first); error (...); gains (kp, ki, kd).
    Returns: output (...), updated window (..., W).
    """
    kp, ki, kd = gains
    window = jnp.concatenate([window[..., 1:], error[..., None]], axis=-1)
    out = kp * error + ki * jnp.mean(window, -1) + kd * (window[..., -1] - window[..., -2])
    return out, window


def idm_accel(v, v0, gap, lead_v, cfg: SimConfig) -> chex.Array:
    """Intelligent Driver Model acceleration (m/s^2); ``gap`` is bumper to bumper."""
    v0 = jnp.maximum(v0, 0.1)
    s_star = cfg.idm_gap + v * cfg.idm_headway + v * (v - lead_v) / (2 * jnp.sqrt(cfg.idm_accel * cfg.idm_decel))
    s_star = jnp.maximum(s_star, cfg.idm_gap)
    acc = cfg.idm_accel * (1 - (v / v0) ** 4 - (s_star / jnp.maximum(gap, 0.1)) ** 2)
    return jnp.clip(acc, -cfg.brake_decel * 1.3, cfg.idm_accel)


def safe_speed(gap, lead_v, cfg: SimConfig) -> chex.Array:
    """Highest speed that can still stop ``follow_gap`` behind a leader braking at
    ``follow_decel`` (Gipps-style): sqrt(lead_v^2 + 2 b (gap - s0)) less a 0.5 s margin."""
    b = cfg.follow_decel
    room = jnp.maximum(gap - cfg.follow_gap, 0.0)
    return jnp.maximum(jnp.sqrt(lead_v**2 + 2 * b * room) - 0.5 * b, 0.0)


def bicycle(x, y, heading, v, accel, steer, length, dt) -> tuple:
    """Kinematic bicycle about the box centre (wheelbase = 0.6 length); speed >= 0."""
    wheelbase = 0.6 * length
    v_new = jnp.clip(v + accel * dt, 0.0, 40.0)
    v_mid = 0.5 * (v + v_new)
    yaw_rate = v_mid / wheelbase * jnp.tan(steer)
    h_mid = heading + 0.5 * yaw_rate * dt
    x = x + v_mid * jnp.cos(h_mid) * dt
    y = y + v_mid * jnp.sin(h_mid) * dt
    return x, y, wrap_angle(heading + yaw_rate * dt), v_new


# ------------------------------------------------------------------------- perception
def leader_gaps(cfg: SimConfig, sc: Scenario, st: SimState, present: chex.Array, arc: chex.Array,
                lat: chex.Array, width: chex.Array):
    """Nearest obstacle ahead of each agent.

    Candidates: vehicles on the same lane path further along it, and anything straight
    ahead of the body within the summed half widths (this covers paths that share
    geometry, lane changes in progress and stopped vehicles), restricted to vehicles
    moving the same way (cos of heading difference > 0.3) or stopped / crashed.
    O(A^2) per tick.

    Args: arc, lat (A,) each agent's projection on its current lane; width (A,) its width.
    Returns: gap (A,) bumper gap to the nearest candidate (inf if none), lead_v (A,) its
    speed along our heading, lead (A,) its index (-1 none).
    """
    pos = jnp.stack([st.x, st.y], -1)
    a = sc.valid.shape[-1]
    not_self = ~jnp.eye(a, dtype=bool)
    dh = jnp.cos(st.heading[None, :] - st.heading[:, None])
    stopped = (st.speed[None, :] < 0.5) | (st.collision_step[None, :] >= 0)
    same_dir = (dh > 0.3) | stopped
    half_len = (sc.length[:, None] + sc.length[None, :]) / 2
    ahead = arc[None, :] - arc[:, None]
    on_path = (st.lane[None, :] == st.lane[:, None]) & (jnp.abs(lat[None, :]) < width[None, :] / 2 + 0.5)
    cand = present[None, :] & not_self & on_path & same_dir & (ahead > 0) & (ahead < cfg.follow_range)
    gap = jnp.where(cand, ahead - half_len, jnp.inf)
    rel = pos[None, :, :] - pos[:, None, :]
    c, s = jnp.cos(st.heading)[:, None], jnp.sin(st.heading)[:, None]
    fwd = c * rel[..., 0] + s * rel[..., 1]
    side = -s * rel[..., 0] + c * rel[..., 1]
    body = (
        present[None, :] & not_self & same_dir & (fwd > 0) & (fwd < cfg.follow_range)
        & (jnp.abs(side) < (sc.width[:, None] + sc.width[None, :]) / 2 + 0.2)
    )
    gap = jnp.minimum(gap, jnp.where(body, fwd - half_len, jnp.inf))
    lead = jnp.argmin(gap, axis=-1)
    gmin = jnp.min(gap, axis=-1)
    pick = jnp.arange(a)[None, :] == lead[:, None]
    lead_v = jnp.sum(jnp.where(pick, st.speed[None, :] * jnp.maximum(dh, 0.0), 0.0), -1)
    lead_v = jnp.where(jnp.isfinite(gmin), lead_v, 0.0)
    lead = jnp.where(jnp.isfinite(gmin), lead, -1)
    return gmin, lead_v, lead


# ------------------------------------------------------------------------------ reset
def reset(cfg: SimConfig, key: chex.PRNGKey, sc: Scenario) -> SimState:
    """Initial state of one episode. ``key`` is accepted for backend neutrality (the
    scenario is already randomised by its builder); the JAX backend is deterministic."""
    del key
    a = sc.x.shape[-1]
    zeros = jnp.zeros((a,), jnp.float32)
    neg = -jnp.ones((a,), jnp.int32)
    target = jnp.where(sc.behaviour == Behaviour.STOPPED, 0.0, sc.cruise_speed)
    return SimState(
        step=jnp.zeros((), jnp.int32),
        x=sc.x.astype(jnp.float32),
        y=sc.y.astype(jnp.float32),
        heading=sc.heading.astype(jnp.float32),
        speed=jnp.where(sc.valid, sc.speed, 0.0).astype(jnp.float32),
        accel=zeros,
        steer=zeros,
        lane=sc.lane.astype(jnp.int32),
        command=jnp.full((a,), Cmd.GO, jnp.int32),
        speed_target=target.astype(jnp.float32),
        waypoints=jnp.zeros((a, cfg.num_waypoints, 2), jnp.float32),
        wp_step=jnp.zeros((a,), jnp.int32),
        lat_err=jnp.zeros((a, cfg.lat_window), jnp.float32),
        lon_err=jnp.zeros((a, cfg.lon_window), jnp.float32),
        progress=zeros,
        done=jnp.zeros((a,), bool),
        success_step=neg,
        collision_step=neg,
        collision_with=neg,
        red_runs=jnp.zeros((a,), jnp.int32),
        offroad_steps=jnp.zeros((a,), jnp.int32),
        stagnant_steps=jnp.zeros((a,), jnp.int32),
    )


# ---------------------------------------------------------------------------- actions
def apply_action(cfg: SimConfig, sc: Scenario, st: SimState, action: Action) -> SimState:
    """Latches a decision: speed target, lane change, waypoints (policy agents only)."""
    policy = (sc.behaviour == Behaviour.POLICY) & sc.valid
    cmd = jnp.where(action.command == Cmd.KEEP, st.command, action.command).astype(jnp.int32)
    limit = sc.lanes.speed_limit[st.lane]
    base = jnp.where(action.target_speed > 0, action.target_speed, jnp.where(sc.cruise_speed > 0, sc.cruise_speed, limit))
    lane_change = (action.command == Cmd.LANE_LEFT) | (action.command == Cmd.LANE_RIGHT)
    target = st.speed_target
    target = jnp.where(action.command == Cmd.GO, base, target)
    target = jnp.where(action.command == Cmd.STOP, 0.0, target)
    target = jnp.where(action.command == Cmd.SLOW_DOWN, jnp.maximum(st.speed - SPEED_STEP, 0.0), target)
    target = jnp.where(action.command == Cmd.SPEED_UP, jnp.minimum(st.speed + SPEED_STEP, 1.2 * limit), target)
    target = jnp.where(lane_change & (st.speed_target < 1.0), base, target)
    nb = jnp.where(action.command == Cmd.LANE_LEFT, sc.lanes.left[st.lane], sc.lanes.right[st.lane])
    lane = jnp.where(lane_change & (nb >= 0), nb, st.lane)
    is_wp = action.command == Cmd.WAYPOINTS
    return st.replace(
        command=jnp.where(policy, cmd, st.command),
        speed_target=jnp.where(policy, target, st.speed_target),
        lane=jnp.where(policy, lane, st.lane),
        waypoints=jnp.where((policy & is_wp)[:, None, None], action.waypoints, st.waypoints),
        wp_step=jnp.where(policy & is_wp, st.step, st.wp_step),
    )


# ------------------------------------------------------------------------------- tick
# Agents per episode whose goal lane differs from their current lane and who get
# a projection of their own on the fast path (more fall back to the general path).
FAST_SLOTS = 4


@chex.dataclass(frozen=True)
class Tables:
    """Per-episode geometry that does not change during a decision period (lanes change
    only when an action is latched), computed once per decision so ticks do only cheap
    look-ups.

    Fields (A agents, K slots, S segments):
      lanes: (L, S, ...) :class:`~jax_drive.geometry.PolylineTable` of every lane path.
      cur: (A, S, ...) rows of each agent's current lane; width, stop_arc (A,) float and
        light (A,) int32 of that lane.
      goal_idx: (K,) int32 agents whose goal lane is not their current lane (padded
        with A, an out-of-range index); goal: (K, S, ...) their goal lane rows.
      goal_width: (A,) width of each agent's goal lane.
      overflow: () bool, more such agents than K (only possible when K < A).
    """

    lanes: PolylineTable
    cur: PolylineTable
    width: chex.Array
    stop_arc: chex.Array
    light: chex.Array
    goal_idx: chex.Array
    goal: PolylineTable
    goal_width: chex.Array
    overflow: chex.Array


def tables(sc: Scenario, st: SimState, slots: int = FAST_SLOTS, lt: PolylineTable | None = None) -> Tables:
    """:class:`Tables` of one episode for the current lanes of ``st``; ``slots`` (static)
    is K, the number of separate goal-lane projections on the fast path; ``lt`` the
    lane table of ``sc`` when already computed."""
    a = sc.x.shape[-1]
    k = min(slots, a)
    lt = polyline_table(sc.lanes.points) if lt is None else lt
    need_g = sc.goal_lane != st.lane
    gi = jnp.nonzero(need_g, size=k, fill_value=a)[0]
    clip = lambda i: jnp.minimum(i, a - 1)  # noqa: E731
    return Tables(
        lanes=lt, cur=lt.take(st.lane), width=sc.lanes.width[st.lane], stop_arc=sc.lanes.stop_arc[st.lane],
        light=sc.lanes.light[st.lane], goal_idx=gi.astype(jnp.int32), goal=lt.take(sc.goal_lane[clip(gi)]),
        goal_width=sc.lanes.width[sc.goal_lane], overflow=jnp.sum(need_g) > k,
    )


def lane_coords(rows: PolylineTable, xy: chex.Array) -> tuple[chex.Array, chex.Array]:
    """Arc along and signed lateral offset from lane paths ``rows`` (..., S, ...) of points
    xy (..., 2), extrapolated before the start and past the end of the path."""
    proj = project_on_table(rows, xy, extrapolate=True)
    return proj.arc, proj.lateral


def tick_fast(cfg: SimConfig, sc: Scenario, st: SimState, tab: Tables, arc: chex.Array, lat: chex.Array,
              general: bool) -> tuple[SimState, chex.Array, chex.Array]:
    """One tick of one episode.

    Args: tab: :func:`tables` of the decision; arc, lat (A,): projection of each agent on
      its current lane at the start of the tick; general (static): True runs the waypoint
      follower and projects every agent on its goal lane; False (the fast
      path) is valid only when no agent's command is WAYPOINTS and ``tab.overflow`` is
      False, and projects only the agents listed in ``tab``.
    Returns: the next state and its projection on the (unchanged) current lanes, which is
      the next tick's ``arc, lat``.
    """
    t = st.step * cfg.dt
    removed = st.success_step >= 0
    collided = st.collision_step >= 0
    present = sc.valid & ~removed
    frozen = collided | (sc.behaviour == Behaviour.STOPPED) | ~present
    pos = jnp.stack([st.x, st.y], -1)
    gap, lead_v, _ = leader_gaps(cfg, sc, st, present, arc, lat, tab.width)

    # Stop lines.
    states = light_state(sc.lights, t)
    light = jnp.where(tab.light >= 0, states[jnp.clip(tab.light, 0)], Light.GREEN)
    stop_gap = tab.stop_arc - arc - sc.length / 2
    has_light = tab.light >= 0
    yellow_can_stop = stop_gap > st.speed**2 / (2 * 4.0)
    must_stop = (
        sc.obeys_lights
        & has_light
        & ((light == Light.RED) | ((light == Light.YELLOW) & yellow_can_stop))
        & (stop_gap > -1.0)
    )
    gap = jnp.where(must_stop, jnp.minimum(gap, jnp.maximum(stop_gap, 0.0)), gap)
    lead_v = jnp.where(must_stop & (stop_gap <= gap), 0.0, lead_v)

    # Longitudinal.
    follow = safe_speed(gap, lead_v, cfg)
    cmd_speed = jnp.where(st.command == Cmd.STOP, 0.0, jnp.minimum(st.speed_target, follow))
    lookahead = jnp.clip(0.8 * st.speed + 4.0, 5.0, 15.0)
    aim, _ = point_at_arc(tab.cur, arc + lookahead)
    desired = cmd_speed
    if general:
        wp_mode = st.command == Cmd.WAYPOINTS
        elapsed = (st.step - st.wp_step) * cfg.dt
        k = jnp.clip(jnp.floor(elapsed / cfg.waypoint_dt).astype(jnp.int32), 0, cfg.num_waypoints - 2)
        wp = st.waypoints
        a_idx = jnp.arange(wp.shape[0])
        wp_speed = jnp.linalg.norm(wp[a_idx, k + 1] - wp[a_idx, k], axis=-1) / cfg.waypoint_dt
        desired = jnp.where(wp_mode, wp_speed, cmd_speed)
        wp_rows = polyline_table(wp)
        aim_wp, _ = point_at_arc(wp_rows, lane_coords(wp_rows, pos)[0] + lookahead)
        aim = jnp.where(wp_mode[:, None], aim_wp, aim)
    delta = jnp.clip(desired - st.speed, 0.0, 0.25)
    throttle, lon_err = pid_step(st.lon_err, delta, cfg.lon_pid)
    throttle = jnp.clip(throttle, 0.0, 0.75)
    brake = (desired < 0.4) | (st.speed > 1.1 * desired)
    acc_pid = jnp.where(brake, -cfg.brake_decel, throttle / 0.75 * cfg.throttle_accel) - cfg.drag * st.speed
    acc_idm = idm_accel(st.speed, sc.cruise_speed, gap, lead_v, cfg)
    accel = jnp.where(sc.behaviour == Behaviour.IDM, acc_idm, acc_pid)

    # Lateral.
    rel = aim - pos
    angle = wrap_angle(jnp.arctan2(rel[:, 1], rel[:, 0]) - st.heading)
    steer_cmd, lat_err = pid_step(st.lat_err, angle / (jnp.pi / 2), cfg.lat_pid)
    steer = jnp.clip(steer_cmd, -1.0, 1.0) * cfg.max_steer

    # Motion.
    x, y, heading, speed = bicycle(st.x, st.y, st.heading, st.speed, accel, steer, sc.length, cfg.dt)
    x = jnp.where(frozen, st.x, x)
    y = jnp.where(frozen, st.y, y)
    heading = jnp.where(frozen, st.heading, heading)
    speed = jnp.where(frozen, 0.0, speed)
    accel = jnp.where(frozen, 0.0, accel)
    step = st.step + 1
    new = st.replace(
        step=step, x=x, y=y, heading=heading, speed=speed, accel=accel, steer=steer, lat_err=lat_err, lon_err=lon_err
    )
    return _events(cfg, sc, new, arc, light, present, tab, general)


def _project_some(rows: PolylineTable, idx: chex.Array, pos: chex.Array, arc: chex.Array,
                  lat: chex.Array) -> tuple[chex.Array, chex.Array]:
    """Overwrites arc, lat (A,) of agents ``idx`` (K,) (entries >= A ignored) with their
    projection on ``rows`` (K, S, ...)."""
    a = arc.shape[-1]
    k_arc, k_lat = lane_coords(rows, pos[jnp.minimum(idx, a - 1)])
    return arc.at[idx].set(k_arc, mode="drop"), lat.at[idx].set(k_lat, mode="drop")


def _events(cfg: SimConfig, sc: Scenario, st: SimState, old_arc, light, present,
            tab: Tables, general: bool) -> tuple[SimState, chex.Array, chex.Array]:
    """Collisions, arrivals, route progress, red-light runs, stagnation; also returns the
    new projection on the current lanes."""
    a = sc.x.shape[-1]
    pos = jnp.stack([st.x, st.y], -1)
    overlap = boxes_overlap_pairwise(st.x, st.y, st.heading, sc.length, sc.width)
    overlap = overlap & present[:, None] & present[None, :] & ~jnp.eye(a, dtype=bool)
    hit = jnp.any(overlap, -1)
    first_hit = hit & (st.collision_step < 0)
    collision_step = jnp.where(first_hit, st.step, st.collision_step)
    collision_with = jnp.where(first_hit, jnp.argmax(overlap, -1), st.collision_with)
    collided = collision_step >= 0

    # the goal lane is the current lane for all but the agents listed in the tables
    c_arc, c_lat = lane_coords(tab.cur, pos)
    if general:
        g_arc, g_lat = lane_coords(tab.lanes.take(sc.goal_lane), pos)
    else:
        g_arc, g_lat = _project_some(tab.goal, tab.goal_idx, pos, c_arc, c_lat)
    arrived = (g_arc >= sc.goal_arc) & (jnp.abs(g_lat) < tab.goal_width / 2 + 1.0)
    new_success = present & arrived & ~collided & (st.success_step < 0)
    success_step = jnp.where(new_success, st.step, st.success_step)

    # route metres covered: route length less the distance still to go along the goal lane
    covered = jnp.clip(sc.route_length - (sc.goal_arc - g_arc), 0.0, sc.route_length)
    progress = jnp.where(present & ~collided, jnp.maximum(st.progress, covered), st.progress)
    progress = jnp.where(success_step >= 0, sc.route_length, progress)

    crossed = (old_arc + sc.length / 2 < tab.stop_arc) & (c_arc + sc.length / 2 >= tab.stop_arc) & (jnp.abs(c_lat) < 2.5)
    ran = present & (tab.light >= 0) & (light == Light.RED) & crossed
    moving = present & ~collided & (sc.behaviour != Behaviour.STOPPED)
    slow = st.speed < cfg.stagnation_speed
    new = st.replace(
        collision_step=collision_step,
        collision_with=collision_with,
        success_step=success_step,
        progress=progress,
        done=collided | (success_step >= 0),
        red_runs=st.red_runs + ran.astype(jnp.int32),
        stagnant_steps=jnp.where(slow & moving, st.stagnant_steps + 1, 0),
    )
    return new, c_arc, c_lat


def measured_events(cfg: SimConfig, sc: Scenario, st: SimState, old_arc: chex.Array, light: chex.Array,
                    present: chex.Array, tab: Tables) -> tuple[SimState, chex.Array, chex.Array]:
    """The events of one tick (collisions, arrivals, progress, red-light runs, stagnation)
    for a state whose poses were measured elsewhere (a backend with its own physics, e.g.
    CARLA): ``st`` has the new poses, ``old_arc`` (A,) the arcs on the current lanes before
    the tick, ``light`` and ``present`` (A,) the lane lights and present agents during it.
    Returns the state and its new projection on the current lanes, as :func:`tick_fast`."""
    return _events(cfg, sc, st, old_arc, light, present, tab, True)


# ------------------------------------------------------------------------ public API
def _offroad_candidates(cfg: SimConfig, sc: Scenario, st: SimState, tab: Tables, arc, lat) -> tuple[chex.Array, chex.Array]:
    """(A,) moving agents and those of them not inside their own current lane (given
    their projection ``arc, lat`` on it); only the latter can be off road."""
    present = sc.valid & (st.success_step < 0)
    moving = present & (st.collision_step < 0) & (sc.behaviour != Behaviour.STOPPED)
    m = cfg.offroad_margin
    inside = ((jnp.abs(lat) <= tab.width / 2 + m) & (arc >= -m) & (arc <= tab.cur.length + m)
              & sc.lanes.valid[st.lane])
    return moving, moving & ~inside


def offroad(cfg: SimConfig, sc: Scenario, st: SimState, tab: Tables) -> chex.Array:
    """(A,) bool, agents off every lane path of one episode: farther than half the lane
    width plus ``cfg.offroad_margin`` from each valid path, or beyond its ends (O(A L S))."""
    arc, lat = jax.vmap(lambda rows: lane_coords(rows, jnp.stack([st.x, st.y], -1)), out_axes=-1)(tab.lanes)  # (A, L)
    m = cfg.offroad_margin
    inside = (jnp.abs(lat) <= sc.lanes.width / 2 + m) & (arc >= -m) & (arc <= tab.lanes.length + m)
    return ~jnp.any(inside & sc.lanes.valid, axis=-1)


def _decision(cfg: SimConfig, sc: Scenario, st: SimState, action: Action) -> SimState:
    """One decision period of one episode: latch ``action``, run ``cfg.decision_steps``
    ticks, then the off-road check (an agent found off road is charged the whole period)."""
    st = apply_action(cfg, sc, st, action)
    tab = tables(sc, st)
    arc, lat = lane_coords(tab.cur, jnp.stack([st.x, st.y], -1))

    def body(carry, _):
        q, a, l = carry
        return tick_fast(cfg, sc, q, tab, a, l, True), None

    (st, arc, lat), _ = jax.lax.scan(body, (st, arc, lat), None, length=cfg.decision_steps)
    moving, cand = _offroad_candidates(cfg, sc, st, tab, arc, lat)
    off = jax.lax.cond(jnp.any(cand), lambda: offroad(cfg, sc, st, tab), lambda: jnp.zeros_like(cand))
    return st.replace(offroad_steps=st.offroad_steps + cfg.decision_steps * (off & moving).astype(jnp.int32))


step = jax.jit(_decision, static_argnums=0)


def rollout(cfg: SimConfig, sc: Scenario, st: SimState, actions: Action) -> tuple[SimState, SimState]:
    """Scans :func:`step` over actions with a leading decision axis (D, ...).

    Returns: final state and the stacked states after each decision (D, ...).
    """

    def body(s, act):
        s = _decision(cfg, sc, s, act)
        return s, s

    return jax.lax.scan(body, st, actions)


@functools.partial(jax.jit, static_argnums=0)
def batched_reset(cfg: SimConfig, keys: chex.PRNGKey, sc: Scenario) -> SimState:
    """:func:`reset` vmapped over a leading episode axis."""
    return jax.vmap(lambda k, s: reset(cfg, k, s))(keys, sc)


def _batched_decision(cfg: SimConfig, sc: Scenario, st: SimState, action: Action,
                      lt: PolylineTable | None = None) -> SimState:
    """One decision of every episode (leading episode axis E).

    Each tick takes one of two compiled variants of the same physics, chosen with a
    ``lax.cond`` outside the vmap: the fast path when no agent follows waypoints and every
    episode has at most :data:`FAST_SLOTS` agents off their goal lane (those get their
    own projections), else the general path (waypoint follower on, goal-lane projections
    for every agent). The full off-road test runs only when some agent has
    left its own lane. The tick scan runs outside the vmap (faster on CPU than a vmapped
    scan). ``lt``: (E, L, S, ...) lane tables of ``sc`` when already computed.
    """
    st = jax.vmap(lambda s, q, a: apply_action(cfg, s, q, a))(sc, st, action)
    lt = polyline_table(sc.lanes.points) if lt is None else lt
    tab = jax.vmap(lambda s, q, t: tables(s, q, FAST_SLOTS, t))(sc, st, lt)
    fast = ~jnp.any(st.command == Cmd.WAYPOINTS) & ~jnp.any(tab.overflow)
    arc, lat = lane_coords(tab.cur, jnp.stack([st.x, st.y], -1))

    def vtick(general):
        return jax.vmap(lambda s, q, t, a, l: tick_fast(cfg, s, q, t, a, l, general))

    def body(c, _):
        return jax.lax.cond(fast, lambda: vtick(False)(sc, *c[:1], tab, *c[1:]),
                            lambda: vtick(True)(sc, *c[:1], tab, *c[1:])), None

    (st, arc, lat), _ = jax.lax.scan(body, (st, arc, lat), None, length=cfg.decision_steps)
    moving, cand = jax.vmap(lambda s, q, t, a, l: _offroad_candidates(cfg, s, q, t, a, l))(sc, st, tab, arc, lat)
    off = jax.lax.cond(jnp.any(cand), lambda: jax.vmap(lambda s, q, t: offroad(cfg, s, q, t))(sc, st, tab),
                       lambda: jnp.zeros_like(cand))
    return st.replace(offroad_steps=st.offroad_steps + cfg.decision_steps * (off & moving).astype(jnp.int32))


@functools.partial(jax.jit, static_argnums=0)
def batched_step(cfg: SimConfig, sc: Scenario, st: SimState, action: Action) -> SimState:
    """:func:`step` over a leading episode axis."""
    return _batched_decision(cfg, sc, st, action)


def batched_rollout(cfg: SimConfig, sc: Scenario, st: SimState, actions: Action) -> SimState:
    """Final state after scanning decisions with actions (E, D, ...) over a leading
    episode axis (jit it; the whole rollout is one XLA program)."""
    acts = jax.tree.map(lambda v: jnp.swapaxes(v, 0, 1), actions)  # (D, E, ...)
    lt = polyline_table(sc.lanes.points)  # static: once per rollout
    final, _ = jax.lax.scan(lambda q, act: (_batched_decision(cfg, sc, q, act, lt), None), st, acts)
    return final


def idle_action(cfg: SimConfig, batch: tuple[int, ...] = ()) -> Action:
    """KEEP for every agent (scripted agents ignore actions anyway)."""
    a = cfg.max_agents
    return Action(
        command=jnp.full(batch + (a,), Cmd.KEEP, jnp.int32),
        target_speed=jnp.zeros(batch + (a,), jnp.float32),
        waypoints=jnp.zeros(batch + (a, cfg.num_waypoints, 2), jnp.float32),
    )


def go_action(cfg: SimConfig, sc: Scenario) -> Action:
    """GO at each agent's cruise speed, for every agent (batch dims of ``sc``)."""
    act = idle_action(cfg, sc.x.shape[:-1])
    return act.replace(command=jnp.full_like(act.command, Cmd.GO), target_speed=sc.cruise_speed.astype(jnp.float32))

