"""Data model of the multi-agent cooperative simulator: padded, batched pytrees.

One generic scenario representation covers every scenario type (TalkingVehicles and
InterDrive): a small lane graph of centreline *paths* with widths and neighbours, a few
traffic lights, and padded agents with roles, behaviours and goals. Scenario types are
data produced by :mod:`jax_drive.sim.scenarios`, never separate code paths.

Frames and units: a flat world frame per scenario, x east, y north, metres, seconds,
radians (heading from +x towards +y), m/s. Every array may carry leading batch dims
(episodes), written ``...``. Static sizes come from :class:`SimConfig`.

Lane graph convention: a *lane* here is a full drivable path from an entry to an exit
(e.g. "south approach, turn left"). Paths may share geometry (an intersection, or the
opposite lane used for overtaking, which is a separate path with the direction of the
overtaker). ``left`` / ``right`` give the path an agent switches to on a lane change.
"""

from __future__ import annotations

import dataclasses
import enum

import chex


class Role(enum.IntEnum):
    """TalkingVehicles roles (Figure 3): focal agents, potential colliders, background."""

    FOCAL = 0
    COLLIDER = 1
    BACKGROUND = 2


class Behaviour(enum.IntEnum):
    """Who drives an agent.

    POLICY: follows the action given to :func:`jax_drive.sim.core.step` (focal agents).
    IDM: scripted lane following with IDM car-following at its cruise speed; obeys lights
      unless ``obeys_lights`` is False (the red-light runner).
    STOPPED: scripted stopped vehicle (a parked / broken-down truck); never moves.
    """

    POLICY = 0
    IDM = 1
    STOPPED = 2


class Cmd(enum.IntEnum):
    """High-level commands (TalkingVehicles action space plus direct waypoints).

    GO: drive to ``target_speed`` (m/s; <= 0 means the lane speed limit) along the lane,
      keeping distance to vehicles ahead in the lane and stopping at red lights.
    STOP: brake to standstill.  SLOW_DOWN / SPEED_UP: current target -/+ ``SPEED_STEP``.
    LANE_LEFT / LANE_RIGHT: switch to the neighbouring lane path (speed target kept).
    KEEP: keep the previous command.  WAYPOINTS: follow ``Action.waypoints`` (CoLMDriver
      planner output, 0.2 s apart), desired speed from the waypoint spacing.
    """

    GO = 0
    STOP = 1
    SLOW_DOWN = 2
    SPEED_UP = 3
    LANE_LEFT = 4
    LANE_RIGHT = 5
    KEEP = 6
    WAYPOINTS = 7


CMD_NAMES = {
    Cmd.GO: "go",
    Cmd.STOP: "stop",
    Cmd.SLOW_DOWN: "slow down",
    Cmd.SPEED_UP: "speed up",
    Cmd.LANE_LEFT: "change lane left",
    Cmd.LANE_RIGHT: "change lane right",
    Cmd.KEEP: "keep",
    Cmd.WAYPOINTS: "waypoints",
}
# Speed change of SLOW_DOWN / SPEED_UP, m/s (our choice; the papers give no value).
SPEED_STEP = 2.0


class Light(enum.IntEnum):
    GREEN = 0
    YELLOW = 1
    RED = 2


LIGHT_NAMES = {Light.GREEN: "green", Light.YELLOW: "yellow", Light.RED: "red"}


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """Static simulator settings (hashable; pass as a static argument to jit).

    Defaults reproduce TalkingVehiclesGym: 20 Hz simulation, a decision every 10 steps
    (0.5 s). CoLMDriver's 5 Hz control is ``decision_steps=4``.

    Controller constants are CoLMDriver's (reference page): lateral PID (1.0, 0.2, 0.1)
    over a window of 5, longitudinal PID (5, 1, 0.1) over a window of 20; integral =
    window mean, derivative = last difference; throttle delta clipped to [0, 0.25],
    throttle to [0, 0.75]; brake when desired < 0.4 m/s or speed > 1.1 x desired.
    """

    max_agents: int = 20
    max_lanes: int = 16
    lane_points: int = 64
    max_lights: int = 4
    num_waypoints: int = 20
    dt: float = 0.05
    decision_steps: int = 10
    waypoint_dt: float = 0.2
    lat_pid: tuple[float, float, float] = (1.0, 0.2, 0.1)
    lat_window: int = 5
    lon_pid: tuple[float, float, float] = (5.0, 1.0, 0.1)
    lon_window: int = 20
    max_steer: float = 1.0  # rad of road-wheel angle at |steer| = 1
    throttle_accel: float = 5.0  # m/s^2 at throttle = 0.75
    brake_decel: float = 7.0  # m/s^2 at full brake
    drag: float = 0.02  # 1/s, linear speed loss
    # Following in GO: keep a gap to same-direction / stopped vehicles ahead in the lane.
    follow_range: float = 40.0  # m
    follow_gap: float = 4.0  # m standstill gap
    follow_decel: float = 3.0  # m/s^2 used for the safe-speed curve
    # IDM (background agents).
    idm_accel: float = 1.5
    idm_decel: float = 3.0
    idm_headway: float = 1.2  # s
    idm_gap: float = 3.0  # m
    # Events.
    offroad_margin: float = 0.5  # m beyond the lane half width before "off road"
    stagnation_speed: float = 0.5  # m/s
    sensor_range: float = 60.0  # m (captioner / visibility)
    comm_radius: float = 100.0  # m (message bus)
    message_ttl: float = 2.0  # s

    @property
    def decision_dt(self) -> float:
        return self.dt * self.decision_steps


@chex.dataclass(frozen=True)
class LaneGraph:
    """Centreline paths.

    Fields (L lanes, C points):
      points: (..., L, C, 2) centreline, driving direction, metres.
      valid: (..., L) bool.
      width: (..., L) metres.
      left, right: (..., L) int32 path taken by a lane change to the left / right, -1 none.
      speed_limit: (..., L) m/s.
      light: (..., L) int32 index of the light governing the path, -1 none.
      stop_arc: (..., L) arc length of the stop line along the path, metres.
      label: (..., L) int32 lane number shown to agents (CARLA style: 1, 2 driving
        direction, -1 opposite).
      maneuver: (..., L) int32 0 straight / lane follow, 1 right turn, 2 left turn,
        3 merge or lane change path (used for right-of-way by the rule-based baseline).
    """

    points: chex.Array
    valid: chex.Array
    width: chex.Array
    left: chex.Array
    right: chex.Array
    speed_limit: chex.Array
    light: chex.Array
    stop_arc: chex.Array
    label: chex.Array
    maneuver: chex.Array


@chex.dataclass(frozen=True)
class Lights:
    """Fixed-cycle traffic lights: green, then yellow, then red, repeating.

    Fields (K lights): green, yellow, red: (..., K) durations, s; offset: (..., K) time
    into the cycle at t = 0, s; valid: (..., K) bool.
    """

    green: chex.Array
    yellow: chex.Array
    red: chex.Array
    offset: chex.Array
    valid: chex.Array


@chex.dataclass(frozen=True)
class Scenario:
    """One episode's static description (agents padded to A).

    Fields:
      lanes: LaneGraph; lights: Lights.
      x, y, heading, speed: (..., A) initial pose (box centre) and speed.
      length, width: (..., A) box size, metres.
      valid: (..., A) bool, the agent exists.
      lane: (..., A) int32 initial lane path (also the route for route completion).
      goal_lane: (..., A) int32 lane path the goal lies on.
      goal_arc: (..., A) arc length along ``goal_lane`` that counts as arrival, metres.
      route_length: (..., A) planned route length (metres) for route completion.
      lc_arc: (..., A) arc along the current lane after which a required lane change to
        ``goal_lane`` may start (metres); ``lc_end_arc`` where it must be done.
      role: (..., A) int32 :class:`Role`; reward: (..., A) bool reward-eligible.
      behaviour: (..., A) int32 :class:`Behaviour`.
      cruise_speed: (..., A) m/s desired speed (IDM v0, or the policy's task speed).
      obeys_lights: (..., A) bool.
      transceiver: (..., A) bool, can send and receive messages.
      vehicle_id: (..., A) int32 id shown in text (CARLA-like, e.g. 109).
      kind: (..., A) int32 0 car, 1 truck.
      timeout: (...,) episode length, s (ends with stagnation for unfinished agents).
      accident_prone: (...,) bool configuration flag.
      scenario_id: (...,) int32 index in :data:`jax_drive.sim.scenarios.SCENARIOS`.
    """

    lanes: LaneGraph
    lights: Lights
    x: chex.Array
    y: chex.Array
    heading: chex.Array
    speed: chex.Array
    length: chex.Array
    width: chex.Array
    valid: chex.Array
    lane: chex.Array
    goal_lane: chex.Array
    goal_arc: chex.Array
    route_length: chex.Array
    lc_arc: chex.Array
    lc_end_arc: chex.Array
    role: chex.Array
    reward: chex.Array
    behaviour: chex.Array
    cruise_speed: chex.Array
    obeys_lights: chex.Array
    transceiver: chex.Array
    vehicle_id: chex.Array
    kind: chex.Array
    timeout: chex.Array
    accident_prone: chex.Array
    scenario_id: chex.Array


@chex.dataclass(frozen=True)
class Action:
    """Per-agent actions for one decision period (ignored for scripted agents).

    Fields:
      command: (..., A) int32 :class:`Cmd`.
      target_speed: (..., A) m/s for GO (<= 0: lane speed limit).
      waypoints: (..., A, W, 2) world-frame waypoints 0.2 s apart (WAYPOINTS only).
    """

    command: chex.Array
    target_speed: chex.Array
    waypoints: chex.Array


@chex.dataclass(frozen=True)
class SimState:
    """Dynamic state.

    Fields:
      step: (...,) int32 simulation step; time = step * dt.
      x, y, heading, speed, accel, steer: (..., A) kinematics (box centre), steer in rad.
      lane: (..., A) int32 current lane path.
      command: (..., A) int32 active :class:`Cmd`; speed_target: (..., A) m/s.
      waypoints: (..., A, W, 2); wp_step: (..., A) int32 step the waypoints were issued.
      lat_err: (..., A, lat_window) and lon_err: (..., A, lon_window) PID error windows.
      progress: (..., A) route metres covered (route_length less the remaining distance
        to goal_arc along the goal lane, best so far), metres; route_length on arrival.
      done: (..., A) bool agent finished (success or collision); frozen afterwards.
      success_step, collision_step: (..., A) int32 first step, -1 none.
      collision_with: (..., A) int32 agent index of the first collision, -1 none.
      red_runs: (..., A) int32 red lights crossed; offroad_steps: (..., A) int32.
      stagnant_steps: (..., A) int32 current run of steps below the stagnation speed.
    """

    step: chex.Array
    x: chex.Array
    y: chex.Array
    heading: chex.Array
    speed: chex.Array
    accel: chex.Array
    steer: chex.Array
    lane: chex.Array
    command: chex.Array
    speed_target: chex.Array
    waypoints: chex.Array
    wp_step: chex.Array
    lat_err: chex.Array
    lon_err: chex.Array
    progress: chex.Array
    done: chex.Array
    success_step: chex.Array
    collision_step: chex.Array
    collision_with: chex.Array
    red_runs: chex.Array
    offroad_steps: chex.Array
    stagnant_steps: chex.Array
