"""Export NAVSIM metric caches to jax-drive's scene file format (run inside a NAVSIM environment).

    python navsim_export.py --metric-cache $NAVSIM_EXP_ROOT/metric_cache --out scenes.json.gz

This file needs only numpy, shapely (both in every NAVSIM environment) and NAVSIM itself;
it does not import jax or the rest of jax-drive, so it can be copied into a NAVSIM
checkout and run there. The result loads with ``jax_drive.scenes.io.load_scenes`` and
scores with ``jax-drive score --scenes-file scenes.json.gz``. The format is documented in
``jax_drive/scenes/io.py`` (version :data:`FORMAT_VERSION`).

What is read from each ``MetricCache`` (NAVSIM v1.1 and v2.x):
  * ``ego_state``: rear-axle pose, body-frame velocity / acceleration, tyre steering angle;
  * ``past_human_trajectory`` (v2 only): the ego history, resampled at 0.1 s over 1.5 s,
    with each state's yaw rate and yaw acceleration (NAVSIM v2's history comfort reads them);
  * ``observation``: every frame's object boxes (recovered from the box polygons, corners in
    nuPlan's order front-left, rear-left, rear-right, front-right), types from
    ``unique_objects`` (first appearance); a box's velocity is the first appearance's at
    its first frame and the difference of its centres elsewhere (the score reads only the
    first); ``red_light_<lane connector id>`` obstacles (v2) become red traffic lights;
  * ``drivable_area_map``: polygons with their nuPlan layers and holes (multi-polygons are
    split into parts ``id``, ``id#1``, ...); ``route_lane_ids``; ``centerline`` (the
    route); ``trajectory``: PDM-Closed, resampled at 0.1 s; ``human_trajectory`` (v2):
    the expert.
Not in a metric cache, hence not exported: lane centrelines, the speed limit and the
driving command (the loader's defaults apply: no centrelines, 15 m/s, UNKNOWN).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path

import numpy as np

FORMAT_NAME = "jax-drive-scenes"  # must equal jax_drive.scenes.io.FORMAT_NAME (checked by a test)
FORMAT_VERSION = 1
OBS_DT = 0.1
HISTORY_SECONDS = 1.5
HORIZON_STEPS = 40


def _floats(a) -> list:
    return np.asarray(a, np.float64).tolist()


def _rear_axle_pose(ego_state) -> list[float]:
    ra = ego_state.rear_axle
    return [float(ra.x), float(ra.y), float(ra.heading)]


def box_from_corners(corners: np.ndarray) -> dict:
    """x, y, heading, length, width of a rectangle given by its 4 corners (4, 2) in nuPlan's
    order front-left, rear-left, rear-right, front-right."""
    fl, rl, rr, fr = (np.asarray(c, np.float64) for c in corners[:4])
    centre = (fl + rl + rr + fr) / 4.0
    fwd = (fl - rl + fr - rr) / 2.0
    left = (fl - fr + rl - rr) / 2.0
    return {"x": float(centre[0]), "y": float(centre[1]), "heading": math.atan2(fwd[1], fwd[0]),
            "length": float(np.hypot(*fwd)), "width": float(np.hypot(*left))}


def _polygon_parts(geometry) -> list:
    """The simple polygons of a shapely Polygon or MultiPolygon."""
    return list(geometry.geoms) if hasattr(geometry, "geoms") else [geometry]


def map_polygons(drivable_map, route_lane_ids) -> tuple[list[dict], list[str]]:
    """Polygon records and the route lane ids (multi-polygon parts added) of a PDMDrivableMap."""
    route = set(str(r) for r in route_lane_ids)
    out, route_ids = [], list(route)
    for token, layer in zip(drivable_map.tokens, drivable_map.map_types):
        for k, part in enumerate(_polygon_parts(drivable_map[token])):
            ident = str(token) if k == 0 else f"{token}#{k}"
            out.append({"id": ident, "layer": getattr(layer, "name", str(layer)),
                        "exterior": _floats(np.asarray(part.exterior.coords)[:, :2]),
                        "holes": [_floats(np.asarray(r.coords)[:, :2]) for r in part.interiors]})
            if k and str(token) in route:
                route_ids.append(ident)
    return out, route_ids


def observation_frames(observation, red_light_prefix: str | None = None) -> tuple[list[list[dict]], dict]:
    """Per-frame box records of a PDMObservation and red lights {lane id: [bool per frame]}."""
    prefix = (red_light_prefix or getattr(observation, "red_light_token", "red_light")) + "_"
    unique = observation.unique_objects
    num = len(observation._occupancy_maps)  # one map per 0.1 s frame (observation_sample_res = 1)
    centres: dict[str, dict[int, np.ndarray]] = {}
    frames, red = [], {}
    for k in range(num):
        occupancy = observation[k]
        boxes = []
        for token in occupancy.tokens:
            if token.startswith(prefix):
                red.setdefault(token[len(prefix):], np.zeros(num, bool))[k] = True
                continue
            obj = unique[token]
            box = box_from_corners(np.asarray(occupancy[token].exterior.coords)[:4, :2])
            box.update({"token": str(token), "type": obj.tracked_object_type.name.lower(),
                        "height": float(obj.box.height), "z": float(getattr(obj.center, "z", 0.0) or 0.0)})
            centres.setdefault(token, {})[k] = np.asarray([box["x"], box["y"]])
            boxes.append(box)
        frames.append(boxes)
    for k, boxes in enumerate(frames):
        for box in boxes:
            seen = centres[box["token"]]
            first = min(seen)
            if k == first:
                vel = getattr(unique[box["token"]], "velocity", None)
                v = (0.0, 0.0) if vel is None else (float(vel.x), float(vel.y))
            else:
                before = max(j for j in seen if j < k)
                after = min((j for j in seen if j > k), default=k)
                span = (after - before) * OBS_DT
                v = tuple(float(c) for c in (seen[after] - seen[before]) / span)
            box["vx"], box["vy"] = v
    return frames, {lane: flags.tolist() for lane, flags in red.items()}


def _sampled_poses(trajectory, start_us: int, count: int, step_s: float) -> list | None:
    """Rear-axle poses at start + (k + 1) step, k < count, or None if the trajectory is too short."""
    end_us = trajectory.end_time.time_us
    times = [start_us + int(round((k + 1) * step_s * 1e6)) for k in range(count)]
    if times[-1] > end_us:
        return None
    point = type(trajectory.start_time)
    return [_rear_axle_pose(trajectory.get_state_at_time(point(t))) for t in times]


def _history(metric_cache, t0_us: int) -> dict | None:
    past = getattr(metric_cache, "past_human_trajectory", None)
    if past is None:
        return None
    steps = int(round(HISTORY_SECONDS / OBS_DT))
    start = t0_us - int(round(HISTORY_SECONDS * 1e6))
    if past.start_time.time_us > start:
        return None
    point = type(past.start_time)
    states = [past.get_state_at_time(point(start + int(round(k * OBS_DT * 1e6)))) for k in range(steps + 1)]
    dyn = [s.dynamic_car_state for s in states]
    return {"dt": OBS_DT, "poses": [_rear_axle_pose(s) for s in states],
            "velocity": [[d.rear_axle_velocity_2d.x, d.rear_axle_velocity_2d.y] for d in dyn],
            "acceleration": [[d.rear_axle_acceleration_2d.x, d.rear_axle_acceleration_2d.y] for d in dyn],
            "yaw_rate": [float(d.angular_velocity) for d in dyn],
            "yaw_acceleration": [float(d.angular_acceleration) for d in dyn]}


def _expert(metric_cache, origin: list[float]) -> dict | None:
    human = getattr(metric_cache, "human_trajectory", None)
    if human is None:
        return None
    poses = np.asarray(human.poses, np.float64)
    c, s = math.cos(origin[2]), math.sin(origin[2])
    glob = np.stack([origin[0] + c * poses[:, 0] - s * poses[:, 1], origin[1] + s * poses[:, 0] + c * poses[:, 1],
                     poses[:, 2] + origin[2]], -1)
    return {"dt": float(human.trajectory_sampling.interval_length), "poses": _floats(glob)}


def record_from_metric_cache(metric_cache, token: str) -> dict:
    """One scene record (jax-drive-scenes v1) from a NAVSIM MetricCache."""
    ego = metric_cache.ego_state
    dyn = ego.dynamic_car_state
    origin = _rear_axle_pose(ego)
    t0_us = ego.time_point.time_us
    frames, red = observation_frames(metric_cache.observation)
    polygons, route_ids = map_polygons(metric_cache.drivable_area_map, metric_cache.route_lane_ids)
    known = {p["id"] for p in polygons}
    record = {
        "token": str(token),
        "ego": {"pose": origin, "velocity": [dyn.rear_axle_velocity_2d.x, dyn.rear_axle_velocity_2d.y],
                "acceleration": [dyn.rear_axle_acceleration_2d.x, dyn.rear_axle_acceleration_2d.y],
                "steering_angle": float(ego.tire_steering_angle)},
        "observation": {"dt": OBS_DT, "frames": frames},
        "map": {"polygons": polygons, "route_lane_ids": route_ids,
                "route": _floats(np.asarray(metric_cache.centerline.linestring.coords)[:, :2]),
                "traffic_lights": [{"lane_id": lane, "red": flags} for lane, flags in red.items() if lane in known]},
    }
    history = _history(metric_cache, t0_us)
    if history is not None:
        record["ego"]["history"] = history
    expert = _expert(metric_cache, origin)
    if expert is not None:
        record["expert"] = expert
    plan = _sampled_poses(metric_cache.trajectory, t0_us, HORIZON_STEPS, OBS_DT)
    if plan is not None:
        record["pdm_closed"] = {"dt": OBS_DT, "poses": plan}
    return record


def metric_cache_records(cache_dir: str | Path, tokens=None, max_scenes: int | None = None, progress: bool = True):
    """Yields (token, record) for the scenes of a NAVSIM metric cache folder."""
    from navsim.common.dataloader import MetricCacheLoader  # NAVSIM v1.1 and v2.x

    loader = MetricCacheLoader(Path(cache_dir))
    wanted = list(loader.tokens) if tokens is None else [str(t) for t in tokens]
    missing = [t for t in wanted if t not in loader.metric_cache_paths]
    if missing:
        raise KeyError(f"{len(missing)} token(s) not in the metric cache, e.g. {missing[:3]}")
    if max_scenes is not None:
        wanted = wanted[:max_scenes]
    if progress:
        try:
            from tqdm import tqdm

            wanted = tqdm(wanted, desc="export metric cache", unit="scene")
        except ImportError:
            pass
    for token in wanted:
        yield token, record_from_metric_cache(loader.get_from_token(token), token)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--metric-cache", required=True, type=Path, help="NAVSIM metric cache folder (with metadata/)")
    parser.add_argument("--out", required=True, type=Path, help="output scene file (.json or .json.gz)")
    parser.add_argument("--tokens", nargs="+", help="only these scene tokens")
    parser.add_argument("--max-scenes", type=int, help="at most this many scenes")
    args = parser.parse_args(argv)
    try:
        import navsim  # noqa: F401
    except ImportError:
        print("error: this exporter runs inside a NAVSIM environment (navsim and nuplan-devkit importable)",
              file=sys.stderr)
        return 2
    records = [record for _, record in metric_cache_records(args.metric_cache, args.tokens, args.max_scenes)]
    doc = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "scenes": records}
    opener = gzip.open if args.out.suffix == ".gz" else open
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with opener(args.out, "wt", encoding="utf-8") as f:
        json.dump(doc, f, allow_nan=False, separators=(",", ":"))
    print(f"wrote {len(records)} scenes to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
