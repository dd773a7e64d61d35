"""Scene files: a documented, versioned JSON format in global coordinates, and its loader.

Users' scenes (NAVSIM / nuPlan logs, or anything else) are written in this format, e.g. by
``jax_drive/adapters/navsim_export.py`` inside a NAVSIM environment, and read with
:func:`load_scenes`, which converts them in float64 to the ego frame and pads them to
capacities read off the data.

Format ``jax-drive-scenes``, version 1: one JSON document (gzip-compressed when the file
name ends in ``.gz``; NaN and Infinity are not allowed)::

    {"format": "jax-drive-scenes", "version": 1, "scenes": [SCENE, ...]}

SCENE (global frame: metres, e.g. UTM; radians from +x towards +y; seconds)::

    {"token": "unique scene id",
     "ego": {"pose": [x, y, heading],            # rear axle at t0
             "velocity": [vx, vy],               # rear axle, body frame, m/s
             "acceleration": [ax, ay],           # body frame, m/s^2
             "steering_angle": 0.0,              # optional, rad (default 0)
             "history": {"dt": 0.1,              # optional: logged past states, oldest first,
                         "poses": [[x, y, heading], ...],     # the last one at t0 (= pose),
                         "velocity": [[vx, vy], ...],         # covering at least 1.5 s;
                         "acceleration": [[ax, ay], ...],     # body frames;
                         "yaw_rate": [w, ...],                # optional, rad/s, and
                         "yaw_acceleration": [dw, ...]}},     # optional, rad/s^2 per state
     "observation": {"dt": 0.1,                   # 0.1 (41 or 51 frames) or 0.5 (9 or 11 frames)
                     "frames": [[BOX, ...], ...]},  # frame k at t0 + k dt, up to 4 or 5 s
     "map": {"polygons": [POLYGON, ...],
             "route_lane_ids": ["id", ...],      # the lanes / lane connectors of the route
             "route": [[x, y], ...],             # dense route centreline, driving direction
             "traffic_lights": [{"lane_id": "id", "red": true | [bool per frame]}],  # optional
             "speed_limit": 15.0},               # optional, m/s (default 15)
     "command": "GO STRAIGHT",                   # optional: TURN LEFT, GO STRAIGHT, TURN RIGHT,
                                                 # UNKNOWN (default)
     "expert": {"dt": 0.5, "poses": [[x, y, heading], ...]},      # optional human future
     "pdm_closed": {"dt": 0.1, "poses": [[x, y, heading], ...]}}  # optional PDM-Closed plan

BOX: ``{"token": "track id", "type": "vehicle", "x", "y", "heading", "length", "width",
"height", "vx", "vy", "z"}`` (velocity global, m/s, default 0; z default 0); types are
nuPlan's tracked object types: vehicle, pedestrian, bicycle, traffic_cone, barrier,
czone_sign, generic_object.

POLYGON: ``{"id": "map object id", "layer": "LANE", "exterior": [[x, y], ...],
"holes": [[[x, y], ...], ...], "centerline": [[x, y], ...]}`` with nuPlan's semantic map
layer names. As in NAVSIM's PDM scorer: ROADBLOCK, DRIVABLE_AREA (as a roadblock),
INTERSECTION and CARPARK_AREA are drivable (DAC); LANE and LANE_CONNECTOR are lanes
(multiple-lanes, on-route and red-light tests; ``centerline`` optional); every other layer
(ROADBLOCK_CONNECTOR, CROSSWALK, WALKWAYS, STOP_LINE, ...) is not used by the score and is
dropped (counted in ``SceneFile.dropped_layers``). Rings may repeat their first vertex.

Semantics kept from NAVSIM: an object's type and box size come from its first appearance
(NAVSIM's metric cache builds every interpolated box with the first box's size; later
differences are listed in ``SceneFile.notes``); a 0.5 s observation is interpolated to
0.1 s per track between its first and last annotation (x, y, heading unwrapped, velocity),
and an object annotated once stands in every frame; red lights of a 0.5 s observation hold
until the next annotation. Expert and PDM-Closed trajectories at any spacing covering 4 s
are resampled like NAVSIM's interpolated trajectories (the t0 pose in front; x, y linear,
heading on the unwrapped sequence) to 8 poses at 0.5 s and 40 poses at 0.1 s.
Without a history, one consistent with the t0 speed and acceleration (driving straight)
stands in, marked ``history_valid`` False (NAVSIM v2's history comfort is then 1) and noted;
without per-state yaw rates / accelerations, finite differences of the history headings;
without an expert (NAVSIM's synthetic scenes), constant velocity stands in, marked
``expert_valid`` False (NAVSIM v2's human penalty filter then does not apply).

Errors raise :class:`SceneFileError` naming the file, the scene (index and token) and the
field, e.g. ``scenes.json: scenes[3] (token 'a1b2'): observation.frames[12][0].length: must
be > 0, got -1.0``.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jax_drive.scenes.builders import SceneSizes, SceneSpec, stack_scenes
from jax_drive.scenes.parse import (  # noqa: F401  (re-exported: the reader's names)
    DRIVABLE_LAYERS,
    DROPPED_LAYERS,
    LANE_LAYERS,
    ParsedScene,
    SceneFileError,
    parse_scene,
    resample_poses,
)
from jax_drive.scenes.records import LAYER_OF_KIND, scene_record  # noqa: F401  (the writer)
from jax_drive.types import NUM_SCORE_STEPS, Scene

FORMAT_NAME = "jax-drive-scenes"
FORMAT_VERSION = 1

# ---------------------------------------------------------------------------------------
# reading and writing the document


def read_scene_file(path: str | Path) -> list[dict]:
    """The scene records of a file, after checking its format name and version."""
    path = Path(path)
    if not path.is_file():
        raise SceneFileError(f"{path}: no such file")

    def reject(constant):
        raise SceneFileError(f"{path}: {constant} is not allowed (the format is strict JSON)")

    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            doc = json.load(f, parse_constant=reject)
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise SceneFileError(f"{path}: cannot read ({e})") from None
    except json.JSONDecodeError as e:
        raise SceneFileError(f"{path}: invalid JSON at line {e.lineno} column {e.colno} ({e.msg})") from None
    if not isinstance(doc, dict):
        raise SceneFileError(f"{path}: expected a JSON object with 'format', 'version' and 'scenes'")
    if doc.get("format") != FORMAT_NAME:
        raise SceneFileError(f"{path}: format: expected {FORMAT_NAME!r}, got {doc.get('format')!r}")
    if doc.get("version") != FORMAT_VERSION:
        raise SceneFileError(f"{path}: version: this reader knows version {FORMAT_VERSION}, got {doc.get('version')!r}")
    scenes = doc.get("scenes")
    if not isinstance(scenes, list) or not scenes:
        raise SceneFileError(f"{path}: scenes: expected a non-empty list of scene objects")
    return scenes


def write_scene_file(path: str | Path, records: Sequence[dict]) -> Path:
    """Writes scene records as a version-1 document (gzip when the name ends in .gz)."""
    path = Path(path)
    doc = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "scenes": list(records)}
    opener = gzip.open if path.suffix == ".gz" else open
    path.parent.mkdir(parents=True, exist_ok=True)
    with opener(path, "wt", encoding="utf-8") as f:
        json.dump(doc, f, allow_nan=False, separators=(",", ":"))
    return path


# ---------------------------------------------------------------------------------------
# a whole file


def _bucket(n: int, minimum: int) -> int:
    return max(minimum, 1 << max(n - 1, 0).bit_length())


def bucket_sizes(needed: SceneSizes) -> SceneSizes:
    """Capacities for scenes that need ``needed``: each size rounded up to a power of two
    (with small minimums), so that similar scenes share one compilation."""
    mins = SceneSizes(num_agents=8, num_drivable=4, drivable_vertices=8, num_lanes=4, lane_vertices=8,
                      centerline_points=8, route_points=16)
    return SceneSizes(**{f.name: _bucket(getattr(needed, f.name), getattr(mins, f.name))
                         for f in dataclasses.fields(SceneSizes)})


def _max_sizes(sizes: Sequence[SceneSizes]) -> SceneSizes:
    return SceneSizes(**{f.name: max(getattr(s, f.name) for s in sizes) for f in dataclasses.fields(SceneSizes)})


@dataclasses.dataclass(frozen=True)
class SceneFile:
    """Scenes read from a file, in the ego frame, not yet padded.

    tokens: (S,) scene tokens; origins: (S, 3) float64 global t0 poses; needed: per scene,
    the smallest sizes that hold it (computed once, when parsing); references:
    (S, 40, 3) float32 PDM-Closed poses at 0.1 s (NaN where a scene has none, see
    ``has_reference``); notes: per scene, what was assumed; dropped_layers: polygons of
    layers the score does not use, counted per layer over the file.
    """

    tokens: tuple[str, ...]
    origins: np.ndarray
    specs: tuple[SceneSpec, ...]
    needed: tuple[SceneSizes, ...]
    references: np.ndarray
    has_reference: np.ndarray
    notes: tuple[tuple[str, ...], ...]
    dropped_layers: dict
    source: str = "<records>"

    def __len__(self) -> int:
        return len(self.tokens)

    def sizes(self) -> list[SceneSizes]:
        """Each scene's bucketed capacities (see :func:`bucket_sizes`)."""
        return [bucket_sizes(s) for s in self.needed]

    def groups(self) -> list[tuple[np.ndarray, SceneSizes]]:
        """(scene indices, capacities) per capacity bucket, in order of first appearance:
        score each group as one batch, so a few large scenes do not pad all the others."""
        order: dict[SceneSizes, list[int]] = {}
        for i, s in enumerate(self.sizes()):
            order.setdefault(s, []).append(i)
        return [(np.asarray(idx), s) for s, idx in order.items()]

    def largest_sizes(self) -> SceneSizes:
        """The largest bucketed capacities of the file: padding every scene to them gives one
        shape (one compiled program) for the whole file, and similar files the same one."""
        return _max_sizes(self.sizes())

    def build(self, indices: Sequence[int] | None = None, sizes: SceneSizes | None = None) -> Scene:
        """Scenes ``indices`` (default all) padded to ``sizes`` (default the largest of
        their buckets), stacked: a Scene with batch dim (len(indices),) and numpy leaves
        (built on the host; moved to the device by the first jitted call); scene_id = index."""
        indices = range(len(self)) if indices is None else [int(i) for i in indices]
        if sizes is None:
            every = self.sizes()
            sizes = _max_sizes([every[i] for i in indices])
        built = []
        for i in indices:
            try:
                built.append(self.specs[i].build(scene_id=i, sizes=sizes, host=True))
            except ValueError as e:
                raise SceneFileError(f"{self.source}: scenes[{i}] (token {self.tokens[i]!r}): {e}") from None
        return stack_scenes(built)

    def subset(self, indices: Sequence[int]) -> "SceneFile":
        """The scenes ``indices`` as their own SceneFile."""
        idx = [int(i) for i in indices]
        return dataclasses.replace(self, tokens=tuple(self.tokens[i] for i in idx), origins=self.origins[idx],
                                   specs=tuple(self.specs[i] for i in idx), needed=tuple(self.needed[i] for i in idx),
                                   references=self.references[idx],
                                   has_reference=self.has_reference[idx], notes=tuple(self.notes[i] for i in idx))


def load_scenes(source: str | Path | Sequence[dict]) -> SceneFile:
    """Reads a scene file (or a list of records) into a :class:`SceneFile`.

    Raises: SceneFileError naming the file, the scene and the field of the first problem.
    """
    if isinstance(source, (str, Path)):
        name, records = str(source), read_scene_file(source)
    else:
        name, records = "<records>", list(source)
        if not records:
            raise SceneFileError(f"{name}: no scenes")
    parsed, tokens = [], {}
    for i, record in enumerate(records):
        p = parse_scene(record, i, name)
        if p.token in tokens:
            raise SceneFileError(f"{name}: scenes[{i}]: token: {p.token!r} already used by scenes[{tokens[p.token]}]")
        tokens[p.token] = i
        parsed.append(p)
    refs = np.full((len(parsed), NUM_SCORE_STEPS - 1, 3), np.nan, np.float32)
    for i, p in enumerate(parsed):
        if p.reference is not None:
            refs[i] = p.reference
    dropped: dict[str, int] = {}
    for p in parsed:
        for layer, count in p.dropped_layers.items():
            dropped[layer] = dropped.get(layer, 0) + count
    return SceneFile(tokens=tuple(p.token for p in parsed), origins=np.stack([p.origin for p in parsed]),
                     specs=tuple(p.spec for p in parsed), needed=tuple(p.sizes for p in parsed), references=refs,
                     has_reference=np.asarray([p.reference is not None for p in parsed]),
                     notes=tuple(p.notes for p in parsed), dropped_layers=dropped, source=name)
