"""Reading one scene-file record (format: :mod:`jax_drive.scenes.io`) into an ego-frame
:class:`ParsedScene`: every field checked, errors naming the file, the scene and the field.

Well-formed boxes, rings and number lists are checked in bulk (numpy); at the first doubt the
per-field checks run and raise the precise :class:`SceneFileError`.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from itertools import chain
from typing import Any

import numpy as np

from jax_drive.scenes.builders import (
    AgentTrack,
    LaneSpec,
    PolygonSpec,
    SceneSizes,
    SceneSpec,
    history_from_motion,
    spec_sizes,
)
from jax_drive.scenes.records import wrap_angles
from jax_drive.types import (
    AGENT_TYPE_NAMES,
    COMMAND_TEXT,
    NUM_HISTORY_STEPS,
    NUM_OBS_STEPS,
    NUM_OUTPUT_POSES,
    NUM_SCORE_STEPS,
    OBS_DT,
    OUTPUT_DT,
    PolygonType,
)

# nuPlan semantic map layers -> what the PDM score uses them for (NAVSIM's PDM scorer).
DRIVABLE_LAYERS = {
    "ROADBLOCK": PolygonType.ROADBLOCK,
    "DRIVABLE_AREA": PolygonType.ROADBLOCK,
    "INTERSECTION": PolygonType.INTERSECTION,
    "CARPARK_AREA": PolygonType.CARPARK,
}
LANE_LAYERS = {"LANE": 0, "LANE_CONNECTOR": 1}
DROPPED_LAYERS = frozenset({
    "ROADBLOCK_CONNECTOR", "CROSSWALK", "WALKWAYS", "STOP_LINE", "TURN_STOP", "YIELD", "TRAFFIC_LIGHT",
    "STOP_SIGN", "PUDO", "EXTENDED_PUDO", "SPEED_BUMP", "BASELINE_PATHS", "BOUNDARIES", "LANE_GROUP_CONNECTOR",
})
TYPE_OF_NAME = {name: int(kind) for kind, name in AGENT_TYPE_NAMES.items()}
COMMAND_OF_TEXT = {text: int(c) for c, text in COMMAND_TEXT.items()}

# Observation lengths accepted: NAVSIM v1 observes 0 .. 5 s, v2 0 .. 4 s.
OBSERVATION_FRAMES = {0.1: (NUM_OBS_STEPS, 41), 0.5: (11, 9)}
HISTORY_SECONDS = (NUM_HISTORY_STEPS - 1) * OBS_DT
HORIZON_SECONDS = NUM_OUTPUT_POSES * OUTPUT_DT
DEFAULT_SPEED_LIMIT = 15.0
HISTORY_POSE_TOLERANCE = 1e-3  # m / rad: the last history pose must be the t0 pose


class SceneFileError(ValueError):
    """A bad scene file or record; the message names the file, the scene and the field."""


# ---------------------------------------------------------------------------------------
# field checks


class _Where:
    """Error context: file, scene index and token; ``fail(field, reason)`` raises."""

    def __init__(self, source: str, index: int, token: Any = None):
        self.source, self.index, self.token = source, index, token

    def fail(self, field: str, reason: str):
        token = "" if self.token is None else f" (token {self.token!r})"
        raise SceneFileError(f"{self.source}: scenes[{self.index}]{token}: {field}: {reason}")


def _get(obj: Any, key: str, field: str, where: _Where, default=dataclasses.MISSING):
    if not isinstance(obj, dict):
        where.fail(field, f"expected an object, got {type(obj).__name__}")
    if key not in obj:
        if default is dataclasses.MISSING:
            where.fail(f"{field}.{key}" if field else key, "missing")
        return default
    return obj[key]


def _number(value: Any, field: str, where: _Where, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        where.fail(field, f"expected a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        where.fail(field, f"must be finite, got {value}")
    if positive and value <= 0:
        where.fail(field, f"must be > 0, got {value}")
    return value


def _array(value: Any, field: str, where: _Where, width: int, min_rows: int = 1) -> np.ndarray:
    """(K, width) finite float64 from a list of number lists (width 0: a flat (K,) list)."""
    if isinstance(value, list) and len(value) >= min_rows:  # well-formed input, checked in bulk
        rows_ok = not width or (set(map(type, value)) == {list} and set(map(len, value)) == {width})
        if rows_ok and set(map(type, chain.from_iterable(value) if width else value)) <= {int, float}:
            arr = np.asarray(value, np.float64)
            if np.isfinite(arr).all():
                return arr
    if not isinstance(value, list):
        where.fail(field, f"expected a list, got {type(value).__name__}")
    rows = value if width else [value]
    for k, row in enumerate(rows):
        if width and (not isinstance(row, list) or len(row) != width):
            where.fail(f"{field}[{k}]", f"expected a list of {width} numbers")
        for j, item in enumerate(row):
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                where.fail(f"{field}[{k}]" if width else f"{field}[{j}]", "expected numbers only")
    arr = np.asarray(value, np.float64)
    if not np.all(np.isfinite(arr)):
        where.fail(field, "must contain finite numbers only")
    if len(arr) < min_rows:
        where.fail(field, f"needs at least {min_rows} entries, got {len(arr)}")
    return arr


def _string(value: Any, field: str, where: _Where) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        where.fail(field, f"expected a string id, got {type(value).__name__}")
    value = str(value)
    if not value:
        where.fail(field, "must not be empty")
    return value


def _dt(value: Any, field: str, where: _Where, allowed=None) -> float:
    dt = _number(value, field, where, positive=True)
    if allowed is not None:
        match = [a for a in allowed if abs(dt - a) < 1e-9]
        if not match:
            where.fail(field, f"must be one of {sorted(allowed)}, got {dt}")
        dt = match[0]
    return dt


# ---------------------------------------------------------------------------------------
# frames


class _Frame:
    """The t0 ego pose: global <-> ego-frame conversion in float64."""

    def __init__(self, pose: np.ndarray):
        self.x, self.y, self.h = (float(v) for v in pose)
        self.c, self.s = math.cos(self.h), math.sin(self.h)

    def points(self, xy: np.ndarray) -> np.ndarray:
        dx, dy = xy[..., 0] - self.x, xy[..., 1] - self.y
        return np.stack([self.c * dx + self.s * dy, -self.s * dx + self.c * dy], -1)

    def poses(self, p: np.ndarray) -> np.ndarray:
        return np.concatenate([self.points(p[..., :2]), wrap_angles(p[..., 2:3] - self.h)], -1)

    def vectors(self, v: np.ndarray) -> np.ndarray:
        return np.stack([self.c * v[..., 0] + self.s * v[..., 1], -self.s * v[..., 0] + self.c * v[..., 1]], -1)


def interp_rows(x: np.ndarray, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """``np.interp(x, xp, row)`` for every row of fp (..., K) at once, with np.interp's own
    arithmetic (slope times offset from the left knot), so the values are the same bits.

    x: (T,) query points from xp[0] on (beyond xp[-1]: the last value, as np.interp);
    xp: (K,) increasing knots. Returns (..., T).
    """
    j = np.clip(np.searchsorted(xp, x, side="right") - 1, 0, len(xp) - 2)
    left, right = fp[..., j], fp[..., j + 1]
    out = (right - left) / (xp[j + 1] - xp[j]) * (x - xp[j]) + left
    return np.where(x >= xp[-1], fp[..., -1:], out)


def resample_poses(poses: np.ndarray, dt: float, times: np.ndarray) -> np.ndarray:
    """Ego-frame poses (..., K, 3) at dt, 2 dt, .. after t0 -> poses (..., T, 3) at ``times``
    (T,) in (0, K dt], with the t0 pose (0, 0, 0) in front: x, y linear, heading linear on the
    unwrapped sequence."""
    poses = np.asarray(poses, np.float64)
    knots = np.concatenate([np.zeros(poses.shape[:-2] + (1, 3)), poses], -2)
    knot_t = np.arange(knots.shape[-2]) * dt
    columns = np.stack([knots[..., 0], knots[..., 1], np.unwrap(knots[..., 2], axis=-1)], -2)  # (..., 3, K+1)
    out = np.swapaxes(interp_rows(np.asarray(times, np.float64), knot_t, columns), -1, -2)
    out[..., 2] = wrap_angles(out[..., 2])
    return out


def _trajectory(obj: Any, field: str, where: _Where, frame: _Frame, times: np.ndarray) -> np.ndarray:
    dt = _dt(_get(obj, "dt", field, where), f"{field}.dt", where)
    poses = _array(_get(obj, "poses", field, where), f"{field}.poses", where, 3)
    if len(poses) * dt < times[-1] - 1e-9:
        where.fail(f"{field}.poses", f"{len(poses)} poses at {dt} s cover {len(poses) * dt:g} s, "
                                     f"need {times[-1]:g} s")
    return resample_poses(frame.poses(poses), dt, times)


# ---------------------------------------------------------------------------------------
# one scene


@dataclasses.dataclass(frozen=True)
class ParsedScene:
    """One record in the ego frame (float64): the spec to build, the smallest sizes that
    hold it, its global t0 pose, the PDM-Closed reference (40, 3) at 0.1 s or None, and
    notes on what was assumed."""

    token: str
    origin: np.ndarray
    spec: SceneSpec
    sizes: SceneSizes
    reference: np.ndarray | None
    notes: tuple[str, ...]
    dropped_layers: dict


def _history(ego: dict, frame: _Frame, where: _Where, velocity, acceleration, notes: list):
    hist = _get(ego, "history", "ego", where, None)
    if hist is None:
        notes.append("no history: derived from the t0 speed and acceleration (straight); history comfort is 1")
        return history_from_motion(float(np.hypot(*velocity)), float(acceleration[0])) + (None, None, False)
    dt = _dt(_get(hist, "dt", "ego.history", where), "ego.history.dt", where)
    poses = _array(_get(hist, "poses", "ego.history", where), "ego.history.poses", where, 3, 2)
    vel = _array(_get(hist, "velocity", "ego.history", where), "ego.history.velocity", where, 2, 2)
    acc = _array(_get(hist, "acceleration", "ego.history", where), "ego.history.acceleration", where, 2, 2)
    yaw = [None if _get(hist, key, "ego.history", where, None) is None
           else _array(hist[key], f"ego.history.{key}", where, 0, 2) for key in ("yaw_rate", "yaw_acceleration")]
    lengths = [len(a) for a in [poses, vel, acc] + [y for y in yaw if y is not None]]
    if len(set(lengths)) > 1:
        where.fail("ego.history", f"poses, velocity, acceleration (and yaw_rate / yaw_acceleration) differ in "
                                  f"length ({', '.join(map(str, lengths))})")
    if yaw[0] is None:
        notes.append("history without yaw_rate: finite differences of the history headings")
    if (len(poses) - 1) * dt < HISTORY_SECONDS - 1e-9:
        where.fail("ego.history.poses", f"{len(poses)} states at {dt} s cover {(len(poses) - 1) * dt:g} s, "
                                        f"need {HISTORY_SECONDS:g} s")
    local = frame.poses(poses)
    if np.any(np.abs(local[-1]) > HISTORY_POSE_TOLERANCE):
        where.fail("ego.history.poses", "the last pose must be the t0 pose ego.pose")
    t = (np.arange(len(poses)) - (len(poses) - 1)) * dt
    query = (np.arange(NUM_HISTORY_STEPS) - (NUM_HISTORY_STEPS - 1)) * OBS_DT
    heading = np.unwrap(local[:, 2])
    interp = lambda a: np.stack([np.interp(query, t, a[:, j]) for j in range(a.shape[1])], -1)  # noqa: E731
    out = interp(np.concatenate([local[:, :2], heading[:, None]], -1))
    out[:, 2] = wrap_angles(out[:, 2])
    out[-1] = 0.0
    yaw = [None if y is None else interp(y[:, None])[:, 0] for y in yaw]
    return out, interp(vel), interp(acc), yaw[0], yaw[1], True


BOX_OPTIONAL = ("vx", "vy", "z")  # default 0


def _checked_boxes(frames: list, where: _Where) -> tuple[list, list, list, np.ndarray]:
    """Every box of every frame, each field checked (the error names the box and field):
    (tokens, frame indices, object types, (B, 9) x y h l w h vx vy z)."""
    tokens, ks, kinds, rows = [], [], [], []
    for k, boxes in enumerate(frames):
        if not isinstance(boxes, list):
            where.fail(f"observation.frames[{k}]", "expected a list of boxes")
        tokens_here = set()
        for j, box in enumerate(boxes):
            f = f"observation.frames[{k}][{j}]"
            token = _string(_get(box, "token", f, where), f"{f}.token", where)
            if token in tokens_here:
                where.fail(f"{f}.token", f"track {token!r} appears twice in frame {k}")
            tokens_here.add(token)
            kind = _get(box, "type", f, where)
            if not isinstance(kind, str) or kind.lower() not in TYPE_OF_NAME:
                where.fail(f"{f}.type", f"unknown object type {kind!r}; expected one of {sorted(TYPE_OF_NAME)}")
            values = [_number(_get(box, key, f, where), f"{f}.{key}", where) for key in ("x", "y", "heading")]
            values += [_number(_get(box, key, f, where), f"{f}.{key}", where, positive=True)
                       for key in ("length", "width", "height")]
            values += [_number(_get(box, key, f, where, 0.0), f"{f}.{key}", where) for key in BOX_OPTIONAL]
            tokens.append(token)
            ks.append(k)
            kinds.append(TYPE_OF_NAME[kind.lower()])
            rows.append(values)
    return tokens, ks, kinds, np.asarray(rows, np.float64).reshape(-1, 9)


_BOX_FIELDS = ("x", "y", "heading", "length", "width", "height") + BOX_OPTIONAL
_ALL_BOX_VALUES = operator.itemgetter("token", "type", *_BOX_FIELDS)


def _box_values(box: dict) -> tuple:
    """(token, type, x, y, heading, length, width, height, vx, vy, z) of one box."""
    try:
        return _ALL_BOX_VALUES(box)
    except KeyError:  # optional fields absent: their default
        return (box["token"], box["type"], *(box[k] for k in _BOX_FIELDS[:6]),
                *(box.get(k, 0.0) for k in BOX_OPTIONAL))


def _fast_boxes(frames: list) -> tuple[list, list, list, np.ndarray] | None:
    """:func:`_checked_boxes` for well-formed frames, checked in bulk; None at the first
    doubt (the caller then runs the per-field checks, which name the problem)."""
    try:
        try:
            rows = [_ALL_BOX_VALUES(b) for boxes in frames for b in boxes]
        except KeyError:  # some box lacks an optional field
            rows = [_box_values(b) for boxes in frames for b in boxes]
        ks = [k for k, boxes in enumerate(frames) for _ in boxes]
    except (KeyError, TypeError, AttributeError):
        return None
    if not rows:
        return [], [], [], np.zeros((0, 9))
    tokens, kinds, *columns = zip(*rows)
    if not (set(map(type, tokens)) == {str} and all(tokens) and set(map(type, kinds)) == {str}
            and set(map(type, chain.from_iterable(columns))) <= {int, float}):
        return None
    kind_of = {kind: TYPE_OF_NAME.get(kind.lower()) for kind in set(kinds)}
    if None in kind_of.values() or len(set(zip(ks, tokens))) != len(tokens):
        return None
    arr = np.asarray(columns, np.float64).T
    if not (np.isfinite(arr).all() and (arr[:, 3:6] > 0).all()):
        return None
    return list(tokens), ks, [kind_of[kind] for kind in kinds], arr


def _tracks(obs: Any, frame: _Frame, where: _Where, notes: list) -> tuple[list[AgentTrack], int, float]:
    """Objects as 51-frame tracks; returns (tracks, observed frames, observation dt)."""
    dt = _dt(_get(obs, "dt", "observation", where), "observation.dt", where, OBSERVATION_FRAMES)
    frames = _get(obs, "frames", "observation", where)
    if not isinstance(frames, list) or len(frames) not in OBSERVATION_FRAMES[dt]:
        got = len(frames) if isinstance(frames, list) else type(frames).__name__
        where.fail("observation.frames", f"expected {' or '.join(map(str, OBSERVATION_FRAMES[dt]))} frames "
                                         f"at {dt} s (t0 .. 5 s or 4 s), got {got}")
    boxes = _fast_boxes(frames) or _checked_boxes(frames, where)
    tokens, ks, kinds, values = boxes
    ks = np.asarray(ks, np.int64)
    # every box in the ego frame at once: x y heading vx vy
    local = np.concatenate([frame.points(values[:, :2]), wrap_angles(values[:, 2:3] - frame.h),
                            frame.vectors(values[:, 6:8])], -1)
    track_of: dict[str, int] = {}  # token -> track, numbered in order of first appearance
    track = np.fromiter((track_of.setdefault(t, len(track_of)) for t in tokens), np.int64, len(tokens))
    num = len(track_of)
    _, first = np.unique(track, return_index=True)  # (A,) each track's first box
    kind = np.asarray(kinds, np.int64)
    size_change = np.zeros(num)
    np.maximum.at(size_change, track, np.abs(values[:, 3:6] - values[first[track], 3:6]).max(-1, initial=0.0))
    type_changes = np.zeros(num, bool)
    type_changes[track[kind != kind[first[track]]]] = True
    for token, a in track_of.items():
        if type_changes[a]:
            notes.append(f"object {token!r}: type changes; its first type is used (NAVSIM)")
        if size_change[a] > 1e-6:
            notes.append(f"object {token!r}: box size changes by up to {size_change[a]:.3g} m; "
                         "its first size is used (NAVSIM)")
    valid = np.zeros((num, NUM_OBS_STEPS), bool)
    out = np.zeros((num, NUM_OBS_STEPS, 5))
    if dt == OBS_DT:  # frames are observation steps: every box lands in its own slot at once
        valid[track, ks] = True
        out[track, ks] = local
    else:
        times = np.arange(NUM_OBS_STEPS) * OBS_DT
        for a in range(num):
            idx = np.flatnonzero(track == a)
            if len(idx) == 1:  # annotated once: stands in every frame (NAVSIM)
                valid[a] = True
                out[a] = local[idx[0]]
                continue
            t = ks[idx] * dt
            inside = (times >= t[0] - 1e-9) & (times <= t[-1] + 1e-9)
            valid[a, inside] = True
            cols = local[idx].copy()
            cols[:, 2] = np.unwrap(cols[:, 2])
            out[a, inside] = np.stack([np.interp(times[inside], t, cols[:, j]) for j in range(5)], -1)
            out[a, :, 2] = wrap_angles(out[a, :, 2])
    head = values[first]
    tracks = [AgentTrack(x=out[a, :, 0], y=out[a, :, 1], heading=out[a, :, 2], vx=out[a, :, 3], vy=out[a, :, 4],
                         length=float(head[a, 3]), width=float(head[a, 4]), height=float(head[a, 5]),
                         agent_type=int(kind[first[a]]), valid=valid[a], z=float(head[a, 8]))
              for a in range(num)]
    return tracks, len(frames), dt


def _red_frames(value: Any, field: str, where: _Where, num_frames: int, dt: float) -> np.ndarray:
    """(51,) red flags from a bool or a per-frame list (0.5 s states hold for 0.5 s)."""
    if isinstance(value, bool):
        return np.full(NUM_OBS_STEPS, value)
    if not isinstance(value, list) or len(value) != num_frames or not all(isinstance(v, bool) for v in value):
        where.fail(field, f"expected true/false or a list of {num_frames} booleans (one per observation frame)")
    per = np.asarray(value, bool)
    idx = np.minimum((np.arange(NUM_OBS_STEPS) * OBS_DT / dt + 1e-9).astype(int), num_frames - 1)
    red = per[idx]
    red[int(round((num_frames - 1) * dt / OBS_DT)) + 1:] = False  # past the observation: unknown
    return red


def _map(mp: Any, frame: _Frame, where: _Where, num_frames: int, dt: float, notes: list):
    polygons = _get(mp, "polygons", "map", where)
    if not isinstance(polygons, list):
        where.fail("map.polygons", "expected a list of polygons")
    drivable, lanes, lane_index, dropped = [], [], {}, {}
    for i, poly in enumerate(polygons):
        f = f"map.polygons[{i}]"
        layer = _get(poly, "layer", f, where)
        if not isinstance(layer, str):
            where.fail(f"{f}.layer", "expected a nuPlan layer name")
        if layer in DROPPED_LAYERS:
            dropped[layer] = dropped.get(layer, 0) + 1
            continue
        if layer not in DRIVABLE_LAYERS and layer not in LANE_LAYERS:
            where.fail(f"{f}.layer", f"unknown layer {layer!r}; known: "
                                     f"{sorted(DRIVABLE_LAYERS) + sorted(LANE_LAYERS) + sorted(DROPPED_LAYERS)}")
        ident = _string(_get(poly, "id", f, where), f"{f}.id", where)
        exterior = frame.points(_array(_get(poly, "exterior", f, where), f"{f}.exterior", where, 2, 3))
        holes_raw = _get(poly, "holes", f, where, [])
        if not isinstance(holes_raw, list):
            where.fail(f"{f}.holes", "expected a list of rings")
        holes = [frame.points(_array(h, f"{f}.holes[{k}]", where, 2, 3)) for k, h in enumerate(holes_raw)]
        if layer in DRIVABLE_LAYERS:
            drivable.append((f, PolygonSpec(exterior, int(DRIVABLE_LAYERS[layer]), holes)))
            continue
        if ident in lane_index:
            where.fail(f"{f}.id", f"lane id {ident!r} used twice")
        centre = _get(poly, "centerline", f, where, None)
        centre = None if centre is None else frame.points(_array(centre, f"{f}.centerline", where, 2, 2))
        lane_index[ident] = len(lanes)
        lanes.append((f, LaneSpec(exterior, centre, kind=LANE_LAYERS[layer], holes=holes)))
    route_ids = _get(mp, "route_lane_ids", "map", where)
    if not isinstance(route_ids, list):
        where.fail("map.route_lane_ids", "expected a list of lane ids")
    for k, rid in enumerate(route_ids):
        rid = _string(rid, f"map.route_lane_ids[{k}]", where)
        if rid in lane_index:
            lanes[lane_index[rid]][1].on_route = True
    if route_ids and not any(lane.on_route for _, lane in lanes):
        notes.append("none of map.route_lane_ids is a lane in map.polygons: every step counts as oncoming")
    lights = _get(mp, "traffic_lights", "map", where, [])
    if not isinstance(lights, list):
        where.fail("map.traffic_lights", "expected a list of {lane_id, red} objects")
    for k, light in enumerate(lights):
        f = f"map.traffic_lights[{k}]"
        lid = _string(_get(light, "lane_id", f, where), f"{f}.lane_id", where)
        if lid not in lane_index:
            where.fail(f"{f}.lane_id", f"{lid!r} is not a LANE / LANE_CONNECTOR id in map.polygons")
        lanes[lane_index[lid]][1].red_light = _red_frames(_get(light, "red", f, where), f"{f}.red", where,
                                                          num_frames, dt)
    route = frame.points(_array(_get(mp, "route", "map", where), "map.route", where, 2, 2))
    speed = _get(mp, "speed_limit", "map", where, None)
    speed = DEFAULT_SPEED_LIMIT if speed is None else _number(speed, "map.speed_limit", where, positive=True)
    return drivable, lanes, route, speed, dropped


def parse_scene(record: Any, index: int = 0, source: str = "<records>") -> ParsedScene:
    """Checks one record and converts it (float64) to an ego-frame :class:`ParsedScene`."""
    where = _Where(source, index)
    if not isinstance(record, dict):
        where.fail("scene", f"expected an object, got {type(record).__name__}")
    where.token = _string(_get(record, "token", "", where), "token", where)
    notes: list[str] = []
    ego = _get(record, "ego", "", where)
    origin = _array(_get(ego, "pose", "ego", where), "ego.pose", where, 0, 3)
    if origin.shape != (3,):
        where.fail("ego.pose", f"expected [x, y, heading], got {len(origin)} numbers")
    frame = _Frame(origin)
    velocity = _array(_get(ego, "velocity", "ego", where), "ego.velocity", where, 0, 2)
    acceleration = _array(_get(ego, "acceleration", "ego", where), "ego.acceleration", where, 0, 2)
    for name, arr in (("ego.velocity", velocity), ("ego.acceleration", acceleration)):
        if arr.shape != (2,):
            where.fail(name, f"expected 2 numbers, got {len(arr)}")
    steering = _number(_get(ego, "steering_angle", "ego", where, 0.0), "ego.steering_angle", where)
    history = _history(ego, frame, where, velocity, acceleration, notes)
    tracks, num_frames, dt = _tracks(_get(record, "observation", "", where), frame, where, notes)
    drivable, lanes, route, speed, dropped = _map(_get(record, "map", "", where), frame, where, num_frames, dt, notes)
    command = _get(record, "command", "", where, "UNKNOWN")
    if not isinstance(command, str) or command not in COMMAND_OF_TEXT:
        where.fail("command", f"expected one of {sorted(COMMAND_OF_TEXT)}, got {command!r}")
    out_times = (np.arange(NUM_OUTPUT_POSES) + 1) * OUTPUT_DT
    expert = _get(record, "expert", "", where, None)
    if expert is None:
        notes.append("no expert trajectory: constant velocity")
    else:
        expert = _trajectory(expert, "expert", where, frame, out_times)
    reference = _get(record, "pdm_closed", "", where, None)
    if reference is not None:
        reference = _trajectory(reference, "pdm_closed", where, frame, (np.arange(NUM_SCORE_STEPS - 1) + 1) * OBS_DT)
    spec = SceneSpec(route=route, ego_velocity=tuple(velocity), ego_acceleration=tuple(acceleration),
                     ego_steering=steering, agents=tracks, drivable=[p for _, p in drivable],
                     lanes=[lane for _, lane in lanes], speed_limit=speed, command=COMMAND_OF_TEXT[command],
                     expert=expert, history_poses=history[0], history_velocity=history[1],
                     history_acceleration=history[2], history_yaw_rate=history[3], history_yaw_accel=history[4],
                     history_valid=history[5], expert_valid=expert is not None)
    try:  # the rings' checks (at least 3 vertices, non-zero area, holes), named as in the record
        sizes = spec_sizes(spec)
    except ValueError as e:
        _raise_spec_error(where, e, drivable, lanes)
    return ParsedScene(token=where.token, origin=origin, spec=spec, sizes=sizes, reference=reference,
                       notes=tuple(notes), dropped_layers=dropped)


def _raise_spec_error(where: _Where, error: ValueError, drivable, lanes):
    """Maps a builder error ("drivable[3]: ...") back to the record's polygon field."""
    message = str(error)
    for prefix, items in (("drivable", drivable), ("lanes", lanes)):
        for i, (field, _) in enumerate(items):
            tag = f"{prefix}[{i}]"
            if message.startswith(tag):
                rest = message[len(tag):].lstrip(".").lstrip(":").strip()
                part = rest.split(":")[0] if rest.startswith("holes") else "exterior"
                where.fail(f"{field}.{part}", rest.split(":", 1)[-1].strip())
    where.fail("scene", message)
