"""Scene model: batched pytree dataclasses shared by the scorer, the scene generator,
the text layer and the simulators.

Frames and units (everywhere unless a docstring says otherwise):
  * the ego rear axle at t0 is the origin, x points forward, y left (right-handed);
  * metres, seconds, radians, m/s, m/s^2;
  * headings are measured from +x towards +y and wrapped to (-pi, pi].

Every array may carry arbitrary leading batch dims, written ``...`` in the shapes below.
Sizes are fixed and padded; a boolean ``valid`` mask says which entries are real. Invalid
entries must never be scored as valid: every consumer masks them.

Scenes in a global frame (UTM-sized coordinates, float64) are converted to this ego frame
by :func:`jax_drive.scenes.frames.to_ego_frame` before any float32 math.
"""

from __future__ import annotations

import enum

import chex
import jax.numpy as jnp

# Time grid of the observation: 0 .. 5 s every 0.1 s (NAVSIM: 2 Hz annotations interpolated).
OBS_DT = 0.1
NUM_OBS_STEPS = 51
# Planner output: 8 poses at 0.5 s spacing covering 4 s.
NUM_OUTPUT_POSES = 8
OUTPUT_DT = 0.5
# Scoring grid: 41 states, 0 .. 4 s every 0.1 s.
NUM_SCORE_STEPS = 41
# Ego history: 16 states at 0.1 s covering -1.5 .. 0 s (the MTDrive prompt keeps every 5th).
NUM_HISTORY_STEPS = 16


class AgentType(enum.IntEnum):
    """Object classes (nuPlan's TrackedObjectType order for the first seven)."""

    VEHICLE = 0
    PEDESTRIAN = 1
    BICYCLE = 2
    TRAFFIC_CONE = 3
    BARRIER = 4
    CZONE_SIGN = 5
    GENERIC_OBJECT = 6


# Classes that are "agents" (can move) in nuPlan; the others are static objects.
MOVING_AGENT_TYPES = (AgentType.VEHICLE, AgentType.PEDESTRIAN, AgentType.BICYCLE)
AGENT_TYPE_NAMES = {t: t.name.lower() for t in AgentType}  # "vehicle", ..., "traffic_cone", ...


class Command(enum.IntEnum):
    """Navigation command given to the planner (NAVSIM / MTDrive driving command)."""

    TURN_LEFT = 0
    GO_STRAIGHT = 1
    TURN_RIGHT = 2
    UNKNOWN = 3


COMMAND_TEXT = {c: c.name.replace("_", " ") for c in Command}  # "TURN LEFT", "GO STRAIGHT", ...


class PolygonType(enum.IntEnum):
    """Kinds of map polygons. Only drivable kinds count for DAC."""

    ROADBLOCK = 0
    INTERSECTION = 1
    CARPARK = 2


@chex.dataclass(frozen=True)
class VehicleParameters:
    """Ego vehicle geometry (NAVSIM's Chrysler Pacifica), metres. Scalars, not batched."""

    width: float = 2.297
    front_length: float = 4.049  # rear axle to front bumper
    rear_length: float = 1.127  # rear axle to rear bumper
    wheel_base: float = 3.089
    rear_axle_to_center: float = 1.461
    height: float = 1.777

    @property
    def length(self) -> float:
        return self.front_length + self.rear_length


@chex.dataclass(frozen=True)
class EgoState:
    """Ego state at t0 plus its logged history.

    Fields:
      velocity: (..., 2) [vx, vy] of the rear axle in the ego frame, m/s.
      acceleration: (..., 2) [ax, ay] in the ego frame, m/s^2.
      steering_angle: (...,) tyre steering angle, rad.
      history_poses: (..., 16, 3) [x, y, heading] at -1.5 .. 0 s every 0.1 s (last = 0, 0, 0).
      history_velocity: (..., 16, 2) [vx, vy] in each state's own body frame, m/s.
      history_acceleration: (..., 16, 2) [ax, ay] in each state's own body frame, m/s^2.
      history_yaw_rate: (..., 16) each state's yaw rate, rad/s (the last one is t0's).
      history_yaw_accel: (..., 16) each state's yaw acceleration, rad/s^2.
      history_valid: (...,) bool: the history was logged (False: no past is known; it is
        then a stand-in and NAVSIM v2's history comfort is 1).
    """

    velocity: chex.Array
    acceleration: chex.Array
    steering_angle: chex.Array
    history_poses: chex.Array
    history_velocity: chex.Array
    history_acceleration: chex.Array
    history_yaw_rate: chex.Array
    history_yaw_accel: chex.Array
    history_valid: chex.Array


@chex.dataclass(frozen=True)
class Agents:
    """Other objects as oriented boxes over the observation grid (0 .. 5 s, 0.1 s).

    Fields (N objects, T = 51 steps):
      x, y, z: (..., N, T) box centre, metres.
      heading: (..., N, T) rad.
      vx, vy: (..., N, T) velocity in the ego frame at t0, m/s.
      length, width, height: (..., N) box size, metres (one per object: NAVSIM's metric
        cache builds every frame's box with the size of the object's first appearance).
      agent_type: (..., N) int32 :class:`AgentType`.
      valid: (..., N, T) bool: the object exists at that step.
    An object's class, speed and heading used for collision classification come from its
    first valid step (NAVSIM semantics); its position from the current step.
    """

    x: chex.Array
    y: chex.Array
    z: chex.Array
    heading: chex.Array
    vx: chex.Array
    vy: chex.Array
    length: chex.Array
    width: chex.Array
    height: chex.Array
    agent_type: chex.Array
    valid: chex.Array


@chex.dataclass(frozen=True)
class Polygons:
    """Padded polygons, optionally with holes.

    Fields:
      vertices: (..., P, V, 2) metres: the exterior ring counter-clockwise, then for each
        hole [the exterior's first vertex, the hole ring clockwise, the hole's first
        vertex] (:func:`jax_drive.scenes.builders.ring_layout`); padding repeats the first
        vertex. Every consecutive pair is an edge, so an even-odd test over the padded
        ring is correct: each bridge between the exterior and a hole is walked once each
        way and cancels.
      valid: (..., P) bool: the polygon exists.
      kind: (..., P) int32: :class:`PolygonType` for drivable polygons; for lane polygons
        0 = lane, 1 = lane connector.
      on_route: (..., P) bool: the lane / connector belongs to the route (lanes only).
    """

    vertices: chex.Array
    valid: chex.Array
    kind: chex.Array
    on_route: chex.Array


@chex.dataclass(frozen=True)
class MapData:
    """Map elements within 100 m of the ego.

    Fields:
      drivable: Polygons (..., Pd, V, 2): roadblocks, intersections, car parks (used by DAC;
        intersections are the ones with kind == INTERSECTION).
      lanes: Polygons (..., Pl, V, 2): lanes (kind 0) and lane connectors (kind 1).
      lane_centerlines: (..., Pl, C, 2) centreline polyline of each lane polygon, metres.
      lane_centerline_valid: (..., Pl, C) bool.
      red_light: (..., Pl, 51) bool: the lane connector's light is red at that observation step.
      speed_limit: (...,) m/s on the route.
    """

    drivable: Polygons
    lanes: Polygons
    lane_centerlines: chex.Array
    lane_centerline_valid: chex.Array
    red_light: chex.Array
    speed_limit: chex.Array


@chex.dataclass(frozen=True)
class Route:
    """The route centreline the ego should follow (progress is measured along it).

    Fields:
      points: (..., R, 2) polyline, metres, ordered in the driving direction.
      valid: (..., R) bool; valid points form a prefix.
    """

    points: chex.Array
    valid: chex.Array


@chex.dataclass(frozen=True)
class Scene:
    """One NAVSIM-like planning problem.

    Fields:
      ego: EgoState at t0.
      agents: Agents over 0 .. 5 s.
      map: MapData.
      route: Route centreline.
      command: (...,) int32 :class:`Command`.
      expert: (..., 8, 3) human/expert future poses at 0.5 .. 4.0 s, [x, y, heading].
      expert_valid: (...,) bool: ``expert`` is the logged human trajectory (False: a
        stand-in, e.g. constant velocity; NAVSIM's synthetic scenes have none, and its
        human penalty filter then does not apply).
      scene_id: (...,) int32 identifier (index in the generated set).
    """

    ego: EgoState
    agents: Agents
    map: MapData
    route: Route
    command: chex.Array
    expert: chex.Array
    expert_valid: chex.Array
    scene_id: chex.Array


def batch_shape(scene: Scene) -> tuple[int, ...]:
    """Leading batch dims of a scene (those of ``scene.command``)."""
    return tuple(scene.command.shape)


def ego_speed(scene: Scene) -> chex.Array:
    """(...,) ego speed at t0 in m/s."""
    return jnp.linalg.norm(scene.ego.velocity, axis=-1)
