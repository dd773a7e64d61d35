"""Writing scene-file records (format: :mod:`jax_drive.scenes.io`) from our own Scenes.

:func:`scene_record` places one ego-frame Scene at a global t0 pose and writes every field
the reader understands: per-frame boxes, map layers with holes and centrelines, per-frame
red lights, the logged history with per-state dynamics, the human trajectory and an
optional PDM-Closed plan. A scene without a logged history (``history_valid`` False) or
without a logged human trajectory (``expert_valid`` False) is written without that field,
so it reads back the same way.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from jax_drive.scenes.builders import polygon_rings
from jax_drive.types import AGENT_TYPE_NAMES, COMMAND_TEXT, OBS_DT, OUTPUT_DT, AgentType, Command, PolygonType, Scene

LAYER_OF_KIND = {int(PolygonType.ROADBLOCK): "ROADBLOCK", int(PolygonType.INTERSECTION): "INTERSECTION",
                 int(PolygonType.CARPARK): "CARPARK_AREA"}


def wrap_angles(a):
    """Angles wrapped to [-pi, pi) (float64 numpy)."""
    return (np.asarray(a) + np.pi) % (2.0 * np.pi) - np.pi


def _global_points(xy: np.ndarray, origin: np.ndarray) -> np.ndarray:
    c, s = math.cos(origin[2]), math.sin(origin[2])
    return np.stack([origin[0] + c * xy[..., 0] - s * xy[..., 1], origin[1] + s * xy[..., 0] + c * xy[..., 1]], -1)


def _global_poses(p: np.ndarray, origin: np.ndarray) -> np.ndarray:
    return np.concatenate([_global_points(p[..., :2], origin), wrap_angles(p[..., 2:3] + origin[2])], -1)


def _lst(a) -> list:
    return np.asarray(a, np.float64).tolist()


def _frames(ag, origin: np.ndarray) -> list[list[dict]]:
    c, s = math.cos(origin[2]), math.sin(origin[2])
    frames = []
    for k in range(ag.valid.shape[1]):
        boxes = []
        for n in np.flatnonzero(ag.valid[:, k]):
            x, y = _global_points(np.asarray([ag.x[n, k], ag.y[n, k]], np.float64), origin)
            vx, vy = float(ag.vx[n, k]), float(ag.vy[n, k])
            boxes.append({"token": f"object-{n}", "type": AGENT_TYPE_NAMES[AgentType(int(ag.agent_type[n]))],
                          "x": float(x), "y": float(y),
                          "heading": float(wrap_angles(float(ag.heading[n, k]) + origin[2])),
                          "length": float(ag.length[n]), "width": float(ag.width[n]), "height": float(ag.height[n]),
                          "vx": c * vx - s * vy, "vy": s * vx + c * vy, "z": float(ag.z[n, k])})
        frames.append(boxes)
    return frames


def _map(sc, origin: np.ndarray) -> dict:
    polygons, lights, route_ids = [], [], []
    drv = sc.map.drivable
    for i in np.flatnonzero(drv.valid):
        exterior, holes = polygon_rings(np.asarray(drv.vertices[i], np.float64))
        polygons.append({"id": f"drivable-{i}", "layer": LAYER_OF_KIND[int(drv.kind[i])],
                         "exterior": _lst(_global_points(exterior, origin)),
                         "holes": [_lst(_global_points(h, origin)) for h in holes]})
    lanes = sc.map.lanes
    for i in np.flatnonzero(lanes.valid):
        exterior, holes = polygon_rings(np.asarray(lanes.vertices[i], np.float64))
        entry = {"id": f"lane-{i}", "layer": "LANE_CONNECTOR" if int(lanes.kind[i]) == 1 else "LANE",
                 "exterior": _lst(_global_points(exterior, origin)),
                 "holes": [_lst(_global_points(h, origin)) for h in holes]}
        ok = sc.map.lane_centerline_valid[i]
        if ok.sum() >= 2:
            entry["centerline"] = _lst(_global_points(np.asarray(sc.map.lane_centerlines[i][ok], np.float64), origin))
        polygons.append(entry)
        if lanes.on_route[i]:
            route_ids.append(f"lane-{i}")
        if sc.map.red_light[i].any():
            lights.append({"lane_id": f"lane-{i}", "red": [bool(v) for v in sc.map.red_light[i]]})
    return {"polygons": polygons, "route_lane_ids": route_ids,
            "route": _lst(_global_points(np.asarray(sc.route.points[sc.route.valid], np.float64), origin)),
            "traffic_lights": lights, "speed_limit": float(sc.map.speed_limit)}


def scene_record(scene: Scene, origin, token: str, reference=None) -> dict:
    """A version-1 record of one ego-frame Scene placed with its t0 rear axle at ``origin``
    (global [x, y, heading], float64); ``reference``: optional (40, 3) PDM-Closed poses."""
    sc = jax.tree.map(np.asarray, scene)
    if np.shape(sc.command) != ():
        raise ValueError(f"scene_record takes one scene (no batch dims), got batch shape {np.shape(sc.command)}")
    origin = np.asarray(origin, np.float64)
    ego = sc.ego
    ego_rec = {"pose": _lst(origin), "velocity": _lst(ego.velocity), "acceleration": _lst(ego.acceleration),
               "steering_angle": float(ego.steering_angle)}
    if bool(ego.history_valid):
        ego_rec["history"] = {"dt": OBS_DT, "poses": _lst(_global_poses(np.asarray(ego.history_poses, np.float64),
                                                                        origin)),
                              "velocity": _lst(ego.history_velocity), "acceleration": _lst(ego.history_acceleration),
                              "yaw_rate": _lst(ego.history_yaw_rate), "yaw_acceleration": _lst(ego.history_yaw_accel)}
    record = {"token": token, "ego": ego_rec, "observation": {"dt": OBS_DT, "frames": _frames(sc.agents, origin)},
              "map": _map(sc, origin), "command": COMMAND_TEXT[Command(int(sc.command))]}
    if bool(sc.expert_valid):
        record["expert"] = {"dt": OUTPUT_DT, "poses": _lst(_global_poses(np.asarray(sc.expert, np.float64), origin))}
    if reference is not None:
        record["pdm_closed"] = {"dt": OBS_DT, "poses": _lst(_global_poses(np.asarray(reference, np.float64), origin))}
    return record
