"""Optional adapter: a Waymax ``SimulatorState`` -> our :class:`~jax_drive.types.Scene`.

Waymax (Waymo's JAX simulator, ``waymo-waymax``) is NOT a dependency: it is installed
from its own git source under the Waymax License Agreement for Non-Commercial Use, e.g.
``pip install git+https://github.com/waymo-research/waymax.git@main#egg=waymo-waymax``.
(The PyPI package named ``waymax`` is an unrelated project: do not install it.) This
module imports ``waymax`` lazily, only to check the input type; the conversion reads the
documented fields of its datatypes:

  * ``Trajectory``: x, y, z, vel_x, vel_y, yaw, valid, length, width, height, arrays
    (..., objects, time) at 0.1 s;
  * ``ObjectMetadata``: is_sdc, object_types (1 vehicle, 2 pedestrian, 3 cyclist);
  * ``RoadgraphPoints``: x, y, dir_x, dir_y, types, ids, valid (points of lane centres,
    road lines and edges; types 1-3 are lane centres).

Approximations (Waymax has polylines, NAVSIM-style scoring needs polygons): each lane
centre polyline near the ego becomes a lane polygon of ``lane_width`` and, widened by
``drivable_margin``, a drivable roadblock polygon; the route is the SDC's logged future
(extended straight) unless ``route`` is given; the speed limit is ``speed_limit``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jax_drive.scenes.builders import DEFAULT_SPEED_LIMIT, AgentTrack, LaneSpec, PolygonSpec, SceneSizes, make_scene
from jax_drive.scenes.frames import poses_to_local
from jax_drive.types import (NUM_HISTORY_STEPS, NUM_OBS_STEPS, NUM_OUTPUT_POSES, AgentType, Command, Scene,
                             VehicleParameters)

INSTALL_HINT = (
    "jax_drive.adapters.waymax needs Waymo's Waymax, installed from its own git source "
    "(pip install git+https://github.com/waymo-research/waymax.git@main#egg=waymo-waymax; "
    "Waymax License Agreement for Non-Commercial Use). The PyPI package named 'waymax' is a "
    "different project: do not install it."
)

# Waymax object_types -> AgentType
_TYPE_MAP = {1: AgentType.VEHICLE, 2: AgentType.PEDESTRIAN, 3: AgentType.BICYCLE}
_LANE_TYPES = (1, 2, 3)


def require_waymax():
    """Imports and returns the ``waymax`` module or raises ImportError with install instructions."""
    try:
        import waymax  # noqa: F401
        from waymax import datatypes  # noqa: F401
    except ImportError as e:  # pragma: no cover - exercised only without waymax
        raise ImportError(INSTALL_HINT) from e
    return waymax


@dataclasses.dataclass(frozen=True)
class WaymaxConversionConfig:
    """Settings of :func:`scene_from_waymax`.

    Attributes:
      lane_width: width of lane polygons built from lane centre polylines, metres (3.7).
      drivable_margin: extra half-width of the drivable polygon per lane, metres (0.5).
      map_radius: keep lanes with a point within this distance of the ego, metres (100).
      speed_limit: m/s used for the scene (Waymax has none), default 15.
      rear_axle_to_center: the SDC's box centre -> rear axle offset, metres (1.461).
      sizes: padded scene sizes.
    """

    lane_width: float = 3.7
    drivable_margin: float = 0.5
    map_radius: float = 100.0
    speed_limit: float = DEFAULT_SPEED_LIMIT
    rear_axle_to_center: float = VehicleParameters.rear_axle_to_center
    sizes: SceneSizes = SceneSizes()


def _resample(points: np.ndarray, n: int) -> np.ndarray:
    """(K, 2) polyline -> (n, 2) evenly spaced in arc length."""
    seg = np.linalg.norm(np.diff(points, axis=0), axis=1)
    cum = np.concatenate([[0.0], np.cumsum(seg)])
    if cum[-1] < 1e-6:
        return np.repeat(points[:1], n, axis=0)
    s = np.linspace(0.0, cum[-1], n)
    return np.stack([np.interp(s, cum, points[:, 0]), np.interp(s, cum, points[:, 1])], -1)


def _strip(center: np.ndarray, half_width: float) -> np.ndarray:
    """CCW polygon (2n, 2) of a polyline buffered by half_width (no caps)."""
    d = np.gradient(center, axis=0)
    d /= np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-9)
    left = np.stack([-d[:, 1], d[:, 0]], -1)
    return np.concatenate([center - half_width * left, (center + half_width * left)[::-1]])


def _arr(x) -> np.ndarray:
    return np.asarray(x)


def scene_from_arrays(
    traj: dict,
    sdc_index: int,
    object_types: np.ndarray,
    roadgraph: dict,
    timestep: int,
    config: WaymaxConversionConfig = WaymaxConversionConfig(),
    route: np.ndarray | None = None,
    scene_id: int = 0,
) -> Scene:
    """Builds a Scene from plain Waymax-layout arrays (one scenario, no batch dims).

    Args:
      traj: dict of x, y, z, vel_x, vel_y, yaw, valid (objects, time) and length, width,
        height (objects, time) or (objects,), global metres at 0.1 s.
      sdc_index: index of the self-driving car (the ego; its box centre is moved back to the rear axle).
      object_types: (objects,) Waymax object types.
      roadgraph: dict of x, y, types, ids, valid (points,).
      timestep: index of t0 in the trajectory (needs 15 steps of history for full
        history; missing steps repeat the first available).
      route: optional (R, 2) global route polyline.
    """
    x, y = _arr(traj["x"]).astype(np.float64), _arr(traj["y"]).astype(np.float64)
    n_obj, n_t = x.shape
    if not 0 <= timestep < n_t:
        raise ValueError(f"timestep {timestep} outside the trajectory's {n_t} steps")
    yaw, valid = _arr(traj["yaw"]).astype(np.float64), _arr(traj["valid"]).astype(bool)
    vx, vy = _arr(traj["vel_x"]).astype(np.float64), _arr(traj["vel_y"]).astype(np.float64)
    if not valid[sdc_index, timestep]:
        raise ValueError("the SDC is not valid at the given timestep")
    # Waymax boxes are centred; the ego frame is the rear axle (Pacifica offset).
    axle = config.rear_axle_to_center

    def global_pose(i, ts):
        p = np.stack([x[i, ts], y[i, ts], yaw[i, ts]], -1)
        if i == sdc_index:
            p = p - axle * np.stack([np.cos(p[..., 2]), np.sin(p[..., 2]), np.zeros_like(p[..., 2])], -1)
        return p

    origin = global_pose(sdc_index, timestep)

    def local_pose(i, ts):
        return poses_to_local(np.atleast_2d(global_pose(i, ts))[None], origin[None])[0].reshape(np.shape(global_pose(i, ts)))

    c, s = np.cos(origin[2]), np.sin(origin[2])

    def local_vel(i, ts):
        return np.stack([c * vx[i, ts] + s * vy[i, ts], -s * vx[i, ts] + c * vy[i, ts]], -1)

    # Observation window t0 .. t0 + 5 s (steps past the log are invalid).
    steps = timestep + np.arange(NUM_OBS_STEPS)
    in_log = steps < n_t
    steps_c = np.minimum(steps, n_t - 1)
    sizes = config.sizes
    agents = []
    others = [i for i in range(n_obj) if i != sdc_index and valid[i, timestep]]
    p0 = np.stack([x[others, timestep], y[others, timestep]], -1) if others else np.zeros((0, 2))
    order = np.argsort(np.linalg.norm(p0 - origin[:2], axis=1)) if others else []
    for k in list(order)[: sizes.num_agents]:
        i = others[k]
        pose = local_pose(i, steps_c)
        vel = local_vel(i, steps_c)
        length = np.broadcast_to(_arr(traj["length"])[i], (n_t,))[timestep] if np.ndim(traj["length"]) > 1 else _arr(traj["length"])[i]
        width = np.broadcast_to(_arr(traj["width"])[i], (n_t,))[timestep] if np.ndim(traj["width"]) > 1 else _arr(traj["width"])[i]
        height = np.broadcast_to(_arr(traj["height"])[i], (n_t,))[timestep] if np.ndim(traj["height"]) > 1 else _arr(traj["height"])[i]
        agents.append(
            AgentTrack(
                x=pose[:, 0], y=pose[:, 1], heading=pose[:, 2], vx=vel[:, 0], vy=vel[:, 1],
                length=float(max(length, 0.1)), width=float(max(width, 0.1)), height=float(max(height, 0.1)),
                agent_type=int(_TYPE_MAP.get(int(object_types[i]), AgentType.GENERIC_OBJECT)),
                valid=valid[i, steps_c] & in_log,
            )
        )
    # Ego state and history.
    hist = np.clip(timestep + np.arange(-NUM_HISTORY_STEPS + 1, 1), 0, None)
    hist = np.where(valid[sdc_index, hist], hist, timestep)
    history_poses = local_pose(sdc_index, hist)
    hv_world = local_vel(sdc_index, hist)
    # body-frame velocities of each history state
    hh = history_poses[:, 2]
    history_velocity = np.stack(
        [np.cos(hh) * hv_world[:, 0] + np.sin(hh) * hv_world[:, 1], -np.sin(hh) * hv_world[:, 0] + np.cos(hh) * hv_world[:, 1]], -1
    )
    velocity = local_vel(sdc_index, timestep)
    accel = (velocity - local_vel(sdc_index, max(timestep - 1, 0))) / 0.1 if timestep > 0 else np.zeros(2)
    # Expert: logged future at 0.5 s steps (held at the last valid pose past the log).
    fut = np.minimum(timestep + 5 * (np.arange(NUM_OUTPUT_POSES) + 1), n_t - 1)
    expert = local_pose(sdc_index, fut)
    # Map: lane centre polylines near the ego.
    rx, ry = _arr(roadgraph["x"]).astype(np.float64), _arr(roadgraph["y"]).astype(np.float64)
    rtype, rid, rvalid = _arr(roadgraph["types"]), _arr(roadgraph["ids"]), _arr(roadgraph["valid"]).astype(bool)
    lane_pts = rvalid & np.isin(rtype, _LANE_TYPES)
    lanes, drivable = [], []
    near = []
    for lid in np.unique(rid[lane_pts]):
        m = lane_pts & (rid == lid)
        pts = np.stack([rx[m], ry[m]], -1)
        loc = poses_to_local(np.concatenate([pts, np.zeros((len(pts), 1))], -1)[None], origin[None])[0][:, :2]
        dist = np.linalg.norm(loc, axis=1)
        if len(loc) >= 2 and dist.min() <= config.map_radius:
            near.append((dist.min(), loc[dist <= config.map_radius * 1.2] if np.sum(dist <= config.map_radius * 1.2) >= 2 else loc))
    near.sort(key=lambda t: t[0])
    half_v = sizes.lane_vertices // 2
    for rank, (_, loc) in enumerate(near[: sizes.num_lanes]):
        centre = _resample(loc, half_v)
        lane_poly = _strip(centre, config.lane_width / 2)
        on_route = rank == 0  # the lane nearest to the ego
        lanes.append(LaneSpec(vertices=lane_poly, centerline=_resample(loc, sizes.centerline_points), on_route=on_route))
        if len(drivable) < sizes.num_drivable:
            dcentre = _resample(loc, sizes.drivable_vertices // 2)
            drivable.append(PolygonSpec(_strip(dcentre, config.lane_width / 2 + config.drivable_margin)))
    # Route: given, else the SDC's logged path from 2 s back to the end, extended 50 m.
    if route is None:
        idx = np.arange(max(timestep - 20, 0), n_t)
        idx = idx[valid[sdc_index, idx]]
        path = local_pose(sdc_index, idx)[:, :2]
        end_h = local_pose(sdc_index, idx[-1:])[0, 2]
        path = np.concatenate([path, path[-1:] + 50.0 * np.array([[np.cos(end_h), np.sin(end_h)]])])
    else:
        path = poses_to_local(np.concatenate([route, np.zeros((len(route), 1))], -1)[None], origin[None])[0][:, :2]
    route_pts = _resample(path, sizes.route_points)
    end = expert[-1]
    lateral = end[1]
    command = Command.GO_STRAIGHT if abs(lateral) < 2.0 else (Command.TURN_LEFT if lateral > 0 else Command.TURN_RIGHT)
    return make_scene(
        route=route_pts, ego_velocity=velocity, ego_acceleration=accel, agents=agents, drivable=drivable, lanes=lanes,
        speed_limit=config.speed_limit, command=int(command), expert=expert, history_poses=history_poses,
        history_velocity=history_velocity, history_acceleration=np.zeros((NUM_HISTORY_STEPS, 2)),
        scene_id=scene_id, sizes=sizes,
    )


def scene_from_waymax(state, config: WaymaxConversionConfig = WaymaxConversionConfig(), scene_id: int = 0) -> Scene:
    """Converts one (unbatched) Waymax ``SimulatorState`` at its current ``timestep``.

    Uses ``state.log_trajectory`` (the logged future is the expert and the observation),
    ``state.object_metadata`` and ``state.roadgraph_points``.
    Raises: ImportError with install instructions when Waymax is missing.
    """
    require_waymax()
    traj = state.log_trajectory
    fields = ("x", "y", "z", "vel_x", "vel_y", "yaw", "valid", "length", "width", "height")
    tdict = {f: np.asarray(getattr(traj, f)) for f in fields}
    if tdict["x"].ndim != 2:
        raise ValueError("scene_from_waymax converts one scenario: batch dims are not supported")
    meta = state.object_metadata
    sdc = int(np.argmax(np.asarray(meta.is_sdc)))
    rg = state.roadgraph_points
    rdict = {f: np.asarray(getattr(rg, f)) for f in ("x", "y", "types", "ids", "valid")}
    return scene_from_arrays(tdict, sdc, np.asarray(meta.object_types), rdict, int(np.asarray(state.timestep)), config,
                             scene_id=scene_id)
