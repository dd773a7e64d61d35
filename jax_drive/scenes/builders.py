"""Hand-built scenes: padding to fixed sizes, small spec helpers, stacking.

Tests and examples build scenes in a few lines::

    spec = straight_road(num_lanes=3, ego_lane=1, ego_speed=10.0)
    add_agent(spec, x=25.0, y=0.1, speed=0.0)        # stopped car ahead in the ego lane
    scene = spec.build()

Everything here is plain numpy on the host (inputs are checked, errors are clear); the
returned :class:`~jax_drive.types.Scene` holds float32 / int32 / bool jax arrays padded to
:class:`SceneSizes`. Coordinates are in the ego rear-axle frame at t0 (see
:mod:`jax_drive.scenes.frames` for global, UTM-sized inputs).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.types import (
    NUM_HISTORY_STEPS,
    NUM_OBS_STEPS,
    NUM_OUTPUT_POSES,
    OBS_DT,
    OUTPUT_DT,
    AgentType,
    Agents,
    Command,
    EgoState,
    MapData,
    Polygons,
    PolygonType,
    Route,
    Scene,
)

DEFAULT_SPEED_LIMIT = 15.0  # m/s, a scene's speed limit when its source gives none


@dataclasses.dataclass(frozen=True)
class SceneSizes:
    """Padded sizes of every scene array (fixed so scenes stack and jit once).

    Attributes:
      num_agents: N object slots (default 32).
      num_drivable: drivable polygons (roadblocks, intersections, car parks), default 16.
      drivable_vertices: vertices per drivable polygon, default 32 (16 per road side).
      num_lanes: lane / lane-connector polygons, default 32.
      lane_vertices: vertices per lane polygon, default 24 (12 per side).
      centerline_points: points per lane centreline, default 24.
      route_points: points of the route centreline, default 64.
    """

    num_agents: int = 32
    num_drivable: int = 16
    drivable_vertices: int = 32
    num_lanes: int = 32
    lane_vertices: int = 24
    centerline_points: int = 24
    route_points: int = 64


@dataclasses.dataclass
class AgentTrack:
    """One object over the 51 observation steps (numpy, ego frame).

    x, y, heading, vx, vy: (51,) arrays; valid: (51,) bool; sizes in metres.
    """

    x: np.ndarray
    y: np.ndarray
    heading: np.ndarray
    vx: np.ndarray
    vy: np.ndarray
    length: float = 4.5
    width: float = 2.0
    height: float = 1.6
    agent_type: int = int(AgentType.VEHICLE)
    valid: np.ndarray | None = None
    z: float = 0.0


@dataclasses.dataclass
class PolygonSpec:
    """A drivable polygon: (V, 2) exterior vertices (any orientation, made CCW), its kind,
    and optional holes ((H, 2) rings; see :func:`ring_layout` for how they are stored)."""

    vertices: np.ndarray
    kind: int = int(PolygonType.ROADBLOCK)
    holes: Sequence[np.ndarray] = ()


@dataclasses.dataclass
class LaneSpec:
    """A lane (kind 0) or lane connector (kind 1).

    vertices: (V, 2) polygon; centerline: (C, 2) in the driving direction, or None when
    unknown (then padded as invalid: NAVSIM's metric caches carry lane polygons only);
    red_light: bool or (51,) bool per observation step; holes: optional (H, 2) rings.
    """

    vertices: np.ndarray
    centerline: np.ndarray | None
    kind: int = 0
    on_route: bool = False
    red_light: bool | np.ndarray = False
    holes: Sequence[np.ndarray] = ()


@dataclasses.dataclass
class SceneSpec:
    """Mutable, host-side description of one scene; :meth:`build` pads it into a Scene."""

    route: np.ndarray
    ego_velocity: tuple[float, float] = (0.0, 0.0)
    ego_acceleration: tuple[float, float] = (0.0, 0.0)
    ego_steering: float = 0.0
    agents: list[AgentTrack] = dataclasses.field(default_factory=list)
    drivable: list[PolygonSpec] = dataclasses.field(default_factory=list)
    lanes: list[LaneSpec] = dataclasses.field(default_factory=list)
    speed_limit: float = DEFAULT_SPEED_LIMIT
    command: int = int(Command.GO_STRAIGHT)
    expert: np.ndarray | None = None
    history_poses: np.ndarray | None = None
    history_velocity: np.ndarray | None = None
    history_acceleration: np.ndarray | None = None
    history_yaw_rate: np.ndarray | None = None
    history_yaw_accel: np.ndarray | None = None
    history_valid: bool = True
    expert_valid: bool | None = None

    def build(self, scene_id: int = 0, sizes: SceneSizes = SceneSizes(), host: bool = False) -> Scene:
        """Pads this spec into a Scene (no batch dims); ``host``: numpy leaves (see make_scene)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return make_scene(**fields, scene_id=scene_id, sizes=sizes, host=host)


# ---------------------------------------------------------------------------------------
# padding helpers


def _as_array(name: str, value, shape_tail: tuple[int, ...] | None = None) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if shape_tail is not None and arr.shape[-len(shape_tail) :] != shape_tail:
        raise ValueError(f"{name}: expected shape (..., {', '.join(map(str, shape_tail))}), got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: contains NaN or inf")
    return arr


def signed_area(vertices: np.ndarray) -> float:
    """Shoelace signed area of a (V, 2) ring (positive = counter-clockwise)."""
    # relative to the first vertex: the same area, without the cancellation of products of
    # UTM-sized coordinates; that vertex's own terms are then 0, so the ring's wrap-around
    # term vanishes too
    x, y = vertices[1:, 0] - vertices[0, 0], vertices[1:, 1] - vertices[0, 1]
    return 0.5 * float(x[:-1] @ y[1:] - x[1:] @ y[:-1])


# A ring's last vertex closes it when it lies within this distance of the first (an
# absolute tolerance: np.allclose's relative one is ~50 m at UTM northings of 5e6 m).
RING_CLOSURE_TOLERANCE = 1e-6


def _ring(vertices, name: str) -> tuple[np.ndarray, float]:
    """(V, 2) float64 ring without a closing vertex (at least 3 vertices and a non-zero
    area) and its signed area."""
    v = _as_array(name, vertices, (2,))
    if v.ndim != 2 or len(v) < 3:
        raise ValueError(f"{name}: need at least 3 vertices of shape (V, 2), got {v.shape}")
    if abs(v[0, 0] - v[-1, 0]) <= RING_CLOSURE_TOLERANCE and abs(v[0, 1] - v[-1, 1]) <= RING_CLOSURE_TOLERANCE:
        v = v[:-1]
    if len(v) < 3:
        raise ValueError(f"{name}: need at least 3 distinct vertices, got {len(v)}")
    area = signed_area(v)
    if abs(area) < 1e-9:
        raise ValueError(f"{name}: degenerate polygon (zero area)")
    return v, area


def ring_layout(vertices, holes: Sequence = (), name: str = "polygon") -> np.ndarray:
    """(K, 2) float64 vertex sequence of a polygon, as the scene model stores it.

    The exterior comes first, counter-clockwise; then each hole as [exterior's first vertex,
    the hole clockwise, the hole's first vertex]; padding (or the wrap to index 0) repeats
    the exterior's first vertex. An even-odd test over consecutive vertices thus walks
    every bridge between the exterior and a hole once each way, so bridges cancel and holes
    are holes, without any extra field. K = V + sum(H_i + 2).
    """
    ext, area = _ring(vertices, name)
    ext = ext if area > 0 else ext[::-1]
    if not len(holes):
        return ext
    parts = [ext]
    for k, hole in enumerate(holes):
        ring, area = _ring(hole, f"{name}.holes[{k}]")
        ring = ring if area < 0 else ring[::-1]
        if np.any(np.all(ring == ext[0], axis=-1)):
            raise ValueError(f"{name}.holes[{k}]: touches the exterior's first vertex; start the exterior elsewhere")
        parts += [ext[:1], ring, ring[:1]]
    return np.concatenate(parts)


def polygon_rings(padded: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Inverse of :func:`ring_layout` on a padded (V, 2) array: (exterior, [holes])."""
    v = np.asarray(padded)
    first = v[0]
    same = np.all(v == first, axis=-1)
    end = int(np.argmax(same[1:])) + 1 if same[1:].any() else len(v)
    exterior, holes, pos = v[:end], [], end
    while pos + 1 < len(v) and same[pos] and not same[pos + 1]:
        start = pos + 1
        closing = np.flatnonzero(np.all(v[start + 1:] == v[start], axis=-1))
        if not len(closing):
            raise ValueError("polygon_rings: a hole is not closed")
        stop = start + 1 + int(closing[0])
        holes.append(v[start:stop])
        pos = stop + 1
    return exterior, holes


def pad_polygon(vertices, max_vertices: int, name: str = "polygon", holes: Sequence = ()) -> np.ndarray:
    """Makes a (V, 2) ring counter-clockwise and pads it (with its holes, see
    :func:`ring_layout`) to (max_vertices, 2).

    A closing vertex equal to the first is dropped; padding repeats the first vertex.
    """
    v = ring_layout(vertices, holes, name)
    if len(v) > max_vertices:
        extra = " (holes included)" if len(holes) else ""
        raise ValueError(f"{name}: {len(v)} vertices{extra} exceed the padded size {max_vertices}")
    out = np.repeat(v[:1], max_vertices, axis=0)
    out[: len(v)] = v
    return out


def pad_polyline(points, max_points: int, name: str = "polyline") -> tuple[np.ndarray, np.ndarray]:
    """Pads a (C, 2) polyline to (max_points, 2) repeating its last point; returns (points, valid)."""
    p = _as_array(name, points, (2,))
    if p.ndim != 2 or len(p) < 2:
        raise ValueError(f"{name}: need at least 2 points of shape (C, 2), got {p.shape}")
    if len(p) > max_points:
        raise ValueError(f"{name}: {len(p)} points exceed the padded size {max_points}")
    out = np.repeat(p[-1:], max_points, axis=0)
    out[: len(p)] = p
    valid = np.arange(max_points) < len(p)
    return out, valid


def history_from_motion(speed: float, accel: float, yaw_rate: float = 0.0) -> tuple[np.ndarray, ...]:
    """Ego history (-1.5 .. 0 s) consistent with a t0 speed, longitudinal acceleration and yaw rate.

    Integrates a unicycle backwards with constant acceleration and yaw rate (the speed is
    clipped at 0 going back in time). Returns history_poses (16, 3) in the t0 frame,
    history_velocity (16, 2) and history_acceleration (16, 2) in each state's body frame.
    """
    out = history_from_motion_jax(jnp.float32(speed), jnp.float32(accel), jnp.float32(yaw_rate))
    return tuple(np.asarray(a, np.float64) for a in out)


def history_from_motion_jax(speed, accel, yaw_rate):
    """Jittable twin of :func:`history_from_motion`; scalars in, (16, 3), (16, 2), (16, 2) out."""
    t = (jnp.arange(NUM_HISTORY_STEPS) - (NUM_HISTORY_STEPS - 1)) * OBS_DT  # -1.5 .. 0
    v_t = jnp.maximum(speed + accel * t, 0.0)
    heading = yaw_rate * t
    # x(t) = -integral_t^0 v cos(h) dtau (trapezoid on a fine grid from t up to 0).
    fine = 10
    tau = t[:, None] * (1.0 - jnp.arange(fine + 1)[None, :] / fine)
    v_tau = jnp.maximum(speed + accel * tau, 0.0)
    h_tau = yaw_rate * tau
    dtau = -t[:, None] / fine
    cx, cy = v_tau * jnp.cos(h_tau), v_tau * jnp.sin(h_tau)
    x = -jnp.sum(0.5 * (cx[:, 1:] + cx[:, :-1]) * dtau, axis=1)
    y = -jnp.sum(0.5 * (cy[:, 1:] + cy[:, :-1]) * dtau, axis=1)
    poses = jnp.stack([x, y, heading], -1)
    vel = jnp.stack([v_t, jnp.zeros_like(v_t)], -1)
    lon_acc = jnp.where(v_t > 0.0, accel, 0.0)
    acc = jnp.stack([lon_acc, v_t * yaw_rate], -1)
    return poses, vel, acc


def history_yaw_from_poses(history_poses: np.ndarray, dt: float = OBS_DT) -> tuple[np.ndarray, np.ndarray]:
    """Per-state yaw rate and yaw acceleration (16,) as finite differences (``np.gradient``)
    of the history's unwrapped headings: the stand-in when a log gives no dynamics."""
    heading = np.unwrap(np.asarray(history_poses, np.float64)[:, 2])
    yaw_rate = np.gradient(heading, dt)
    return yaw_rate, np.gradient(yaw_rate, dt)


def _constant_velocity_expert(velocity: np.ndarray) -> np.ndarray:
    t = (np.arange(NUM_OUTPUT_POSES) + 1) * OUTPUT_DT
    speed = float(np.hypot(*velocity))
    heading = float(np.arctan2(velocity[1], velocity[0])) if speed > 1e-6 else 0.0
    return np.stack([speed * t * np.cos(heading), speed * t * np.sin(heading), np.full_like(t, heading)], -1)


def make_scene(
    *,
    route,
    ego_velocity=(0.0, 0.0),
    ego_acceleration=(0.0, 0.0),
    ego_steering: float = 0.0,
    agents: Sequence[AgentTrack] = (),
    drivable: Sequence[PolygonSpec] = (),
    lanes: Sequence[LaneSpec] = (),
    speed_limit: float = DEFAULT_SPEED_LIMIT,
    command: int = int(Command.GO_STRAIGHT),
    expert=None,
    history_poses=None,
    history_velocity=None,
    history_acceleration=None,
    history_yaw_rate=None,
    history_yaw_accel=None,
    history_valid: bool = True,
    expert_valid: bool | None = None,
    scene_id: int = 0,
    sizes: SceneSizes = SceneSizes(),
    host: bool = False,
) -> Scene:
    """Builds one padded Scene (no batch dims) from plain numpy / lists.

    ``host``: numpy leaves (no device arrays, nothing compiled: many scenes are then stacked
    on the host with :func:`stack_scenes` and moved to the device once).

    Args:
      route: (R, 2) route centreline in the driving direction (R <= sizes.route_points).
      ego_velocity, ego_acceleration: (2,) in the ego frame; ego_steering: rad.
      agents: AgentTrack objects (<= sizes.num_agents).
      drivable: PolygonSpec objects (<= sizes.num_drivable).
      lanes: LaneSpec objects (<= sizes.num_lanes).
      speed_limit: m/s; command: :class:`Command`.
      expert: (8, 3) future poses; default: constant velocity from the t0 velocity.
      history_*: (16, 3) / (16, 2) / (16, 2); default: consistent with the t0 speed and
        longitudinal acceleration (straight motion). history_yaw_rate / history_yaw_accel
        (16,): each state's logged yaw rate / acceleration (the last is t0's); default:
        :func:`history_yaw_from_poses`. history_valid: False when the scene has no logged
        past (the history is then a stand-in).
      expert_valid: ``expert`` is the logged human trajectory; default: ``expert`` given.
    Raises:
      ValueError with the offending field when a shape, size or value is invalid.
    """
    velocity = _as_array("ego_velocity", ego_velocity, (2,)).reshape(2)
    acceleration = _as_array("ego_acceleration", ego_acceleration, (2,)).reshape(2)
    if history_poses is None:
        speed = float(np.hypot(*velocity))
        hp, hv, ha = history_from_motion(speed, float(acceleration[0]))
    else:
        hp = _as_array("history_poses", history_poses, (3,))
        hv = np.zeros((NUM_HISTORY_STEPS, 2)) if history_velocity is None else history_velocity
        ha = np.zeros((NUM_HISTORY_STEPS, 2)) if history_acceleration is None else history_acceleration
    hp = _as_array("history_poses", hp, (3,))
    hv = _as_array("history_velocity", hv, (2,))
    ha = _as_array("history_acceleration", ha, (2,))
    for name, arr in (("history_poses", hp), ("history_velocity", hv), ("history_acceleration", ha)):
        if arr.shape[0] != NUM_HISTORY_STEPS:
            raise ValueError(f"{name}: expected {NUM_HISTORY_STEPS} steps, got {arr.shape[0]}")
    yaw_fd = history_yaw_from_poses(hp)
    hyr = yaw_fd[0] if history_yaw_rate is None else _as_array("history_yaw_rate", history_yaw_rate)
    hya = yaw_fd[1] if history_yaw_accel is None else _as_array("history_yaw_accel", history_yaw_accel)
    for name, arr in (("history_yaw_rate", hyr), ("history_yaw_accel", hya)):
        if arr.shape != (NUM_HISTORY_STEPS,):
            raise ValueError(f"{name}: expected shape ({NUM_HISTORY_STEPS},), got {arr.shape}")
    expert_valid = expert is not None if expert_valid is None else bool(expert_valid)

    # Agents ------------------------------------------------------------------------
    n, t_steps = sizes.num_agents, NUM_OBS_STEPS
    if len(agents) > n:
        raise ValueError(f"agents: {len(agents)} exceed the padded size {n}")
    ax = np.zeros((n, t_steps))
    ay, az, ah, avx, avy = (np.zeros((n, t_steps)) for _ in range(5))
    alen, awid, ahei = np.ones(n), np.ones(n), np.ones(n)
    atype = np.zeros(n, np.int32)
    avalid = np.zeros((n, t_steps), bool)
    for i, a in enumerate(agents):
        for name, dst in (("x", ax), ("y", ay), ("heading", ah), ("vx", avx), ("vy", avy)):
            arr = _as_array(f"agents[{i}].{name}", getattr(a, name))
            if arr.shape != (t_steps,):
                raise ValueError(f"agents[{i}].{name}: expected shape ({t_steps},), got {arr.shape}")
            dst[i] = arr
        az[i] = float(a.z)
        if min(a.length, a.width, a.height) <= 0:
            raise ValueError(f"agents[{i}]: box sizes must be positive")
        alen[i], awid[i], ahei[i] = a.length, a.width, a.height
        if int(a.agent_type) not in {int(k) for k in AgentType}:
            raise ValueError(f"agents[{i}].agent_type: unknown type {a.agent_type}")
        atype[i] = int(a.agent_type)
        avalid[i] = True if a.valid is None else np.asarray(a.valid, bool).reshape(t_steps)

    # Map ---------------------------------------------------------------------------
    if len(drivable) > sizes.num_drivable:
        raise ValueError(f"drivable: {len(drivable)} polygons exceed the padded size {sizes.num_drivable}")
    if len(lanes) > sizes.num_lanes:
        raise ValueError(f"lanes: {len(lanes)} exceed the padded size {sizes.num_lanes}")
    dv = np.zeros((sizes.num_drivable, sizes.drivable_vertices, 2))
    dvalid = np.zeros(sizes.num_drivable, bool)
    dkind = np.zeros(sizes.num_drivable, np.int32)
    for i, p in enumerate(drivable):
        dv[i] = pad_polygon(p.vertices, sizes.drivable_vertices, f"drivable[{i}]", p.holes)
        dvalid[i], dkind[i] = True, int(p.kind)
    lv = np.zeros((sizes.num_lanes, sizes.lane_vertices, 2))
    lvalid = np.zeros(sizes.num_lanes, bool)
    lkind = np.zeros(sizes.num_lanes, np.int32)
    lroute = np.zeros(sizes.num_lanes, bool)
    cl = np.zeros((sizes.num_lanes, sizes.centerline_points, 2))
    clvalid = np.zeros((sizes.num_lanes, sizes.centerline_points), bool)
    red = np.zeros((sizes.num_lanes, t_steps), bool)
    for i, lane in enumerate(lanes):
        lv[i] = pad_polygon(lane.vertices, sizes.lane_vertices, f"lanes[{i}]", lane.holes)
        if lane.centerline is not None:
            cl[i], clvalid[i] = pad_polyline(lane.centerline, sizes.centerline_points, f"lanes[{i}].centerline")
        lvalid[i], lkind[i], lroute[i] = True, int(lane.kind), bool(lane.on_route)
        red[i] = np.broadcast_to(np.asarray(lane.red_light, bool), (t_steps,))
    rp, rvalid = pad_polyline(route, sizes.route_points, "route")
    if float(speed_limit) <= 0:
        raise ValueError("speed_limit must be positive")
    if int(command) not in {int(c) for c in Command}:
        raise ValueError(f"command: unknown command {command}")
    exp = _constant_velocity_expert(velocity) if expert is None else _as_array("expert", expert, (3,))
    if exp.shape != (NUM_OUTPUT_POSES, 3):
        raise ValueError(f"expert: expected shape ({NUM_OUTPUT_POSES}, 3), got {exp.shape}")

    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    scene = Scene(
        ego=EgoState(
            velocity=f32(velocity),
            acceleration=f32(acceleration),
            steering_angle=f32(ego_steering),
            history_poses=f32(hp),
            history_velocity=f32(hv),
            history_acceleration=f32(ha),
            history_yaw_rate=f32(hyr),
            history_yaw_accel=f32(hya),
            history_valid=np.asarray(bool(history_valid)),
        ),
        agents=Agents(
            x=f32(ax), y=f32(ay), z=f32(az), heading=f32(ah), vx=f32(avx), vy=f32(avy),
            length=f32(alen), width=f32(awid), height=f32(ahei),
            agent_type=np.asarray(atype, np.int32), valid=np.asarray(avalid),
        ),
        map=MapData(
            drivable=Polygons(
                vertices=f32(dv), valid=np.asarray(dvalid), kind=np.asarray(dkind),
                on_route=np.zeros(sizes.num_drivable, bool),
            ),
            lanes=Polygons(
                vertices=f32(lv), valid=np.asarray(lvalid), kind=np.asarray(lkind),
                on_route=np.asarray(lroute),
            ),
            lane_centerlines=f32(cl),
            lane_centerline_valid=np.asarray(clvalid),
            red_light=np.asarray(red),
            speed_limit=f32(speed_limit),
        ),
        route=Route(points=f32(rp), valid=np.asarray(rvalid)),
        command=np.asarray(int(command), np.int32),
        expert=f32(exp),
        expert_valid=np.asarray(expert_valid),
        scene_id=np.asarray(int(scene_id), np.int32),
    )
    return scene if host else jax.tree.map(jnp.asarray, scene)


# ---------------------------------------------------------------------------------------
# spec helpers


def rectangle(x0: float, x1: float, y0: float, y1: float) -> np.ndarray:
    """(4, 2) CCW axis-aligned rectangle [x0, x1] x [y0, y1]."""
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float64)


def straight_road(
    num_lanes: int = 3,
    ego_lane: int = 1,
    lane_width: float = 3.5,
    length_behind: float = 50.0,
    length_ahead: float = 150.0,
    ego_speed: float = 10.0,
    ego_accel: float = 0.0,
    speed_limit: float = DEFAULT_SPEED_LIMIT,
    command: int = int(Command.GO_STRAIGHT),
) -> SceneSpec:
    """A straight road along +x with ``num_lanes`` lanes in the ego's direction.

    Lane 0 is the rightmost; the ego's rear axle sits at (0, 0) on the centre of lane
    ``ego_lane`` heading +x. One roadblock covers all lanes; the ego lane is on the route;
    the route runs from ``-length_behind`` to ``length_ahead`` along the ego lane centre.
    The expert drives at constant speed along the lane.
    """
    if not 0 <= ego_lane < num_lanes:
        raise ValueError(f"ego_lane {ego_lane} not in [0, {num_lanes})")
    x0, x1 = -float(length_behind), float(length_ahead)
    y_right = -(ego_lane + 0.5) * lane_width
    y_left = y_right + num_lanes * lane_width
    xs = np.linspace(x0, x1, 24)
    lanes = []
    for j in range(num_lanes):
        yc = (j - ego_lane) * lane_width
        lanes.append(
            LaneSpec(
                vertices=rectangle(x0, x1, yc - lane_width / 2, yc + lane_width / 2),
                centerline=np.stack([xs, np.full_like(xs, yc)], -1),
                on_route=(j == ego_lane),
            )
        )
    route_x = np.linspace(x0, x1, 64)
    spec = SceneSpec(
        route=np.stack([route_x, np.zeros_like(route_x)], -1),
        ego_velocity=(float(ego_speed), 0.0),
        ego_acceleration=(float(ego_accel), 0.0),
        drivable=[PolygonSpec(rectangle(x0, x1, y_right, y_left))],
        lanes=lanes,
        speed_limit=speed_limit,
        command=command,
    )
    return spec


def agent_track(
    x: float,
    y: float,
    heading: float = 0.0,
    speed: float = 0.0,
    accel: float = 0.0,
    length: float = 4.5,
    width: float = 2.0,
    height: float = 1.6,
    agent_type: int = int(AgentType.VEHICLE),
) -> AgentTrack:
    """An object moving straight along ``heading`` with constant acceleration (stops at 0 speed)."""
    t = np.arange(NUM_OBS_STEPS) * OBS_DT
    if accel < 0 and speed > 0:
        t_stop = speed / -accel
        tc = np.minimum(t, t_stop)
    else:
        tc = t
    s = speed * tc + 0.5 * accel * tc**2
    v = np.maximum(speed + accel * tc, 0.0) if accel < 0 else speed + accel * tc
    c, sn = np.cos(heading), np.sin(heading)
    return AgentTrack(
        x=x + s * c, y=y + s * sn, heading=np.full_like(t, heading),
        vx=v * c, vy=v * sn, length=length, width=width, height=height, agent_type=int(agent_type),
    )


def add_agent(spec: SceneSpec, x: float, y: float, **kwargs) -> SceneSpec:
    """Appends :func:`agent_track` (x, y, heading, speed, accel, sizes, agent_type) to ``spec``."""
    spec.agents.append(agent_track(x, y, **kwargs))
    return spec


def add_static(
    spec: SceneSpec, x: float, y: float, agent_type: int = int(AgentType.TRAFFIC_CONE), heading: float = 0.0
) -> SceneSpec:
    """Appends a static object (cone 0.5 x 0.5 m, barrier 2.0 x 0.6 m, else 1 x 1 m)."""
    size = {int(AgentType.TRAFFIC_CONE): (0.5, 0.5, 0.8), int(AgentType.BARRIER): (2.0, 0.6, 1.0)}.get(
        int(agent_type), (1.0, 1.0, 1.0)
    )
    spec.agents.append(
        agent_track(x, y, heading, 0.0, length=size[0], width=size[1], height=size[2], agent_type=agent_type)
    )
    return spec


def straight_road_scene(agents: Sequence[dict] = (), scene_id: int = 0, **road_kwargs) -> Scene:
    """``straight_road(**road_kwargs)`` with ``add_agent(**a)`` for each dict, built into a Scene."""
    spec = straight_road(**road_kwargs)
    for a in agents:
        add_agent(spec, **a)
    return spec.build(scene_id=scene_id)


def spec_sizes(spec: SceneSpec) -> SceneSizes:
    """The smallest :class:`SceneSizes` that holds ``spec`` (each size at least 1; holes
    and their bridges counted in the vertex sizes)."""
    count = lambda polys, name: max([len(ring_layout(p.vertices, p.holes, f"{name}[{i}]"))  # noqa: E731
                                     for i, p in enumerate(polys)], default=1)
    centre = [len(lane.centerline) for lane in spec.lanes if lane.centerline is not None]
    return SceneSizes(num_agents=max(len(spec.agents), 1), num_drivable=max(len(spec.drivable), 1),
                      drivable_vertices=count(spec.drivable, "drivable"), num_lanes=max(len(spec.lanes), 1),
                      lane_vertices=count(spec.lanes, "lanes"), centerline_points=max(centre, default=2),
                      route_points=max(len(spec.route), 2))


# ---------------------------------------------------------------------------------------
# batches


def stack_scenes(scenes: Sequence[Scene]) -> Scene:
    """Stacks scenes of equal shapes along a new leading axis (on the host, with numpy
    leaves, when every leaf is a numpy array)."""
    if not scenes:
        raise ValueError("stack_scenes: empty list")
    host = all(isinstance(x, np.ndarray) for x in jax.tree.leaves(scenes[0]))
    return jax.tree.map(lambda *xs: np.stack(xs) if host else jnp.stack(xs), *scenes)


def scene_to_numpy(scene: Scene) -> Scene:
    """The same Scene with every leaf a numpy array (host copy)."""
    return jax.tree.map(np.asarray, scene)


def index_scene(scene: Scene, index) -> Scene:
    """Selects ``scene[index]`` along the leading batch axis of every leaf."""
    return jax.tree.map(lambda a: a[index], scene)
