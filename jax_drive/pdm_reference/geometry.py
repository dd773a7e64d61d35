"""Scene access and ego geometry of the reference PDM scorer: Scene pytrees to float64 numpy,
the scene's shapely polygons and object boxes per frame (:class:`_SceneGeometry`), the ego's
corners and the map areas it touches (numpy + shapely; no JAX)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import shapely

from jax_drive.pdm_reference.config import ReferenceConfig
from jax_drive.pdm_reference.simulation import HEADING, X, Y

# Agent classes that are "agents" (moving types) in nuPlan: vehicle, pedestrian, bicycle.
_MOVING_TYPES = (0, 1, 2)
_INTERSECTION_KIND = 1


# --------------------------------------------------------------------------------------
# Scene access
# --------------------------------------------------------------------------------------


def scene_to_numpy(scene: Any, index: Any = None) -> Any:
    """Copies a (possibly batched) Scene pytree to float64/host numpy, optionally indexing the
    leading batch dims with ``index`` (an int or tuple)."""
    import jax  # only for the pytree map; the reference itself is pure numpy

    def leaf(x):
        arr = np.asarray(x)
        if index is not None:
            arr = arr[index]
        if arr.dtype.kind == "f":
            arr = arr.astype(np.float64)
        return arr

    return jax.tree_util.tree_map(leaf, scene)


def _split_rings(padded: np.ndarray) -> tuple[np.ndarray, list]:
    """Exterior and hole rings of one padded polygon (V, 2).

    Layout (the scene model's): exterior ring, then per hole [exterior[0], hole ring,
    hole[0]], padding = exterior[0]. A ring ends where its first vertex comes back.
    """
    start = padded[0]
    back = [j for j in range(1, len(padded)) if np.array_equal(padded[j], start)]
    if not back:
        return padded, []
    exterior, holes, j = padded[: back[0]], [], back[0]
    while j + 1 < len(padded) and np.array_equal(padded[j], start) and not np.array_equal(padded[j + 1], start):
        h0 = padded[j + 1]
        k = j + 2
        while k < len(padded) and not np.array_equal(padded[k], h0):
            k += 1
        holes.append(padded[j + 1: k])
        j = k + 1
    return exterior, holes


def _polygons(vertices: np.ndarray, valid: np.ndarray) -> list:
    """List of (index, shapely Polygon) for valid padded polygons (P, V, 2), holes included."""
    out = []
    for i in np.flatnonzero(valid):
        exterior, holes = _split_rings(vertices[i])
        poly = shapely.Polygon(exterior, holes)
        if not poly.is_valid:
            poly = shapely.make_valid(poly)
        out.append((int(i), poly))
    return out


class _SceneGeometry:
    """Shapely geometry of one scene, built once and shared by both trajectories."""

    def __init__(self, scene: Any, cfg: ReferenceConfig):
        m = scene.map
        drivable = _polygons(np.asarray(m.drivable.vertices), np.asarray(m.drivable.valid))
        self.drivable = [p for _, p in drivable]
        kinds = np.asarray(m.drivable.kind)
        self.intersections = [p for i, p in drivable if int(kinds[i]) == _INTERSECTION_KIND]
        lanes = _polygons(np.asarray(m.lanes.vertices), np.asarray(m.lanes.valid))
        on_route = np.asarray(m.lanes.on_route)
        self.lanes = [p for _, p in lanes]
        self.route_lanes = [p for i, p in lanes if bool(on_route[i])]
        lane_kind = np.asarray(m.lanes.kind)
        red = np.asarray(m.red_light).astype(bool)
        # On-route lane connectors with their red-light flags per observation step.
        self.red_connectors = [
            (p, red[i]) for i, p in lanes if bool(on_route[i]) and int(lane_kind[i]) == 1 and red[i].any()
        ]
        for poly in self.drivable + self.lanes:
            shapely.prepare(poly)

        route_valid = np.asarray(scene.route.valid).astype(bool)
        pts = np.asarray(scene.route.points, dtype=np.float64)[route_valid]
        if pts.shape[0] < 2:
            raise ValueError("the route needs at least 2 valid points")
        self.centerline = shapely.LineString(pts)

        ag = scene.agents
        self.valid = np.asarray(ag.valid).astype(bool)  # (N, T)
        n, t = self.valid.shape
        self.num_agents, self.num_frames = n, t
        self.agent_type = np.asarray(ag.agent_type).astype(np.int64)
        self.ax = np.asarray(ag.x, np.float64)
        self.ay = np.asarray(ag.y, np.float64)
        heading = np.asarray(ag.heading, np.float64)
        length = np.asarray(ag.length, np.float64)
        width = np.asarray(ag.width, np.float64)
        vx = np.asarray(ag.vx, np.float64)
        vy = np.asarray(ag.vy, np.float64)
        # First appearance: class and speed used for classification.
        self.first_step = np.where(self.valid.any(-1), self.valid.argmax(-1), -1)
        self.first_speed = np.array(
            [
                math.hypot(vx[i, s], vy[i, s]) if s >= 0 else 0.0
                for i, s in enumerate(self.first_step)
            ]
        )
        self.is_moving_type = np.isin(self.agent_type, _MOVING_TYPES)
        self.is_stopped_track = (~self.is_moving_type) | (self.first_speed <= cfg.collision_stopped_speed)
        # Boxes per frame: corners FL, RL, RR, FR.
        hl, hw = length[:, None] / 2.0, width[:, None] / 2.0
        c, s = np.cos(heading), np.sin(heading)
        local = [(1, 1), (-1, 1), (-1, -1), (1, -1)]
        corners = np.zeros((n, t, 4, 2))
        for k, (sl, sw) in enumerate(local):
            lx, ly = sl * hl, sw * hw
            corners[:, :, k, 0] = self.ax + c * lx - s * ly
            corners[:, :, k, 1] = self.ay + s * lx + c * ly
        self.boxes = np.empty((n, t), dtype=object)
        if n:
            self.boxes[:] = shapely.polygons(corners)

    def objects_at(self, frame: int) -> np.ndarray:
        """Indices of the objects present at an observation frame."""
        return np.flatnonzero(self.valid[:, frame])


# --------------------------------------------------------------------------------------
# Ego geometry and areas
# --------------------------------------------------------------------------------------


def ego_coords(states: np.ndarray, cfg: ReferenceConfig) -> np.ndarray:
    """(T, 5, 2) corners FL, RL, RR, FR and centre of the ego box from (T, 11) states."""
    h = states[:, HEADING]
    c, s = np.cos(h), np.sin(h)
    cx = states[:, X] + cfg.rear_axle_to_center * c
    cy = states[:, Y] + cfg.rear_axle_to_center * s
    hl, hw = cfg.length / 2.0, cfg.width / 2.0
    out = np.zeros((states.shape[0], 5, 2))
    for k, (lon, lat) in enumerate([(hl, hw), (-hl, hw), (-hl, -hw), (hl, -hw)]):
        out[:, k, 0] = cx + c * lon - s * lat
        out[:, k, 1] = cy + s * lon + c * lat
    out[:, 4, 0], out[:, 4, 1] = cx, cy
    return out


def _contains(polys: list, pts: np.ndarray) -> np.ndarray:
    """(len(polys), K) strict containment of points (K, 2)."""
    if not polys:
        return np.zeros((0, pts.shape[0]), dtype=bool)
    return np.stack([shapely.contains_xy(p, pts[:, 0], pts[:, 1]) for p in polys])


def ego_areas(coords: np.ndarray, geo: _SceneGeometry) -> dict:
    """Per-step masks (T,) multiple_lanes, non_drivable, oncoming from (T, 5, 2) coords."""
    t = coords.shape[0]
    corners = coords[:, :4].reshape(-1, 2)
    lanes_in = _contains(geo.lanes, corners).reshape(len(geo.lanes), t, 4)
    count = lanes_in.sum(-1)  # (L, T)
    multiple = ((count > 0).sum(0) > 1) & np.all(count != 4, axis=0)
    driv_in = _contains(geo.drivable, corners).reshape(len(geo.drivable), t, 4)
    non_drivable = driv_in.any(0).sum(-1) < 4
    centre_in = _contains(geo.route_lanes, coords[:, 4])
    oncoming = centre_in.sum(0) == 0
    return {"multiple_lanes": multiple, "non_drivable": non_drivable, "oncoming": oncoming}


def relative_angle(ego_pose: np.ndarray, point: np.ndarray) -> float:
    """Angle (rad, [0, pi]) between the ego heading and the ego -> point direction; NaN when
    the point coincides with the ego rear axle."""
    vec = np.asarray(point, np.float64) - ego_pose[:2]
    norm = math.hypot(vec[0], vec[1])
    if norm == 0.0:
        return float("nan")
    dot = (math.cos(ego_pose[2]) * vec[0] + math.sin(ego_pose[2]) * vec[1]) / norm
    return math.acos(min(1.0, max(-1.0, dot)))
