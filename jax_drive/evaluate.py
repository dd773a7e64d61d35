"""Evaluation API: score proposals or whole planners with the PDM score.

* :func:`evaluate_proposals`: PDM-Closed reference, then ``jax_drive.pdm.score_proposals``.
* :func:`evaluate_planner`: run a named planner over scenes in fixed-size chunks (one
  compilation; the last chunk is padded by repeating scenes and the padding is dropped),
  optionally with a tqdm bar; returns a per-scene :class:`PDMResult` (N,).
* :func:`evaluate_scene_file`: the same on a scene file (:mod:`jax_drive.scenes.io`),
  capacity group by capacity group, with the file's own PDM-Closed plans as references.
* :func:`summarize`: mean of every metric (over the valid entries).
* :func:`load_trajectories` (by generated scene id) and :func:`load_token_trajectories`
  (by scene token: JSONL at any spacing, or a NAVSIM submission pickle): trajectory files
  with errors naming the line and the reason.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
from pathlib import Path
from typing import Callable

import jax
import numpy as np

from jax_drive.pdm import PDMConfig, PDMResult, score_proposals
from jax_drive.pdm.polygons import map_budget, merge_budgets
from jax_drive.planners import constant_velocity, idm_planner, pdm_closed
from jax_drive.planners.pdm_closed import PDMClosedConfig
from jax_drive.types import NUM_OUTPUT_POSES, Scene, batch_shape

# Metrics reported by summaries and the CLI, in table order: (field, label).
METRICS = (
    ("nc", "NC"),
    ("dac", "DAC"),
    ("ttc", "TTC"),
    ("ep", "EP"),
    ("comfort", "C"),
    ("pdms", "PDMS"),
    ("ddc", "DDC"),
    ("tlc", "TLC"),
    ("ttc_v2", "TTC (v2)"),
    ("ep_v2", "EP (v2)"),
    ("lk", "LK"),
    ("hc", "HC"),
    ("ec", "EC"),
    ("epdms", "EPDMS"),
)

PLANNERS: dict[str, Callable[[Scene], jax.Array]] = {
    "constant_velocity": constant_velocity,
    "idm": idm_planner,
    "pdm_closed": lambda scene: pdm_closed(scene).output,
    "expert": lambda scene: scene.expert,
}


def evaluate_proposals(
    scene: Scene,
    proposals,
    config: PDMConfig = PDMConfig(),
    pdm_closed_config: PDMClosedConfig = PDMClosedConfig(),
) -> PDMResult:
    """Scores proposals (..., P, 8, 3) against the PDM-Closed reference of each scene (...).

    Returns PDMResult with fields (..., P).
    """
    reference = pdm_closed(scene, pdm_closed_config).poses
    return score_proposals(scene, proposals, reference, config)


def _padded_chunks(n: int, batch_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Rows 0..n-1 in chunks of ``min(batch_size, n)``: (the chunk's rows, those rows padded to
    the chunk size by repeating the last one), so every chunk runs the same compiled program."""
    size = max(1, min(batch_size, n))
    chunks = []
    for start in range(0, n, size):
        chunk = np.arange(start, min(start + size, n))
        chunks.append((chunk, np.concatenate([chunk, np.repeat(chunk[-1:], size - len(chunk))])))
    return chunks


def _rows_per_scene(proposals, config: PDMConfig) -> int:
    """Trajectories scored per scene: the proposals, the PDM-Closed reference and (with the
    penalty filter) the human trajectory: what sizes the map budget."""
    per_scene = 1 if proposals is None or proposals.ndim == 3 else proposals.shape[1]
    return per_scene + 1 + int(config.human_penalty_filter)


def _score_batch(name: str, scenes: Scene, config: PDMConfig, proposals=None, references=None,
                 budget=None, executables=None) -> PDMResult:
    """One jitted batch: the planner's (or the given) proposals (B, 8, 3) or (B, P, 8, 3)
    against PDM-Closed or the given references (B, 40, 3; rows with NaN use PDM-Closed).
    Returns PDMResult (B,) or (B, P); ``budget``: the map budget to use (default: this batch's)."""
    need_pdm_closed = name == "pdm_closed" or references is None or bool(np.isnan(references).any())
    closed = pdm_closed(scenes) if need_pdm_closed else None
    if references is None:
        reference = closed.poses
    else:
        missing = np.isnan(references).any(axis=(-2, -1))
        reference = references if closed is None else np.where(missing[:, None, None], np.asarray(closed.poses),
                                                                references)
    if name == "file":
        props = np.asarray(proposals, np.float32)
    elif name == "pdm_closed":
        props = closed.output
    else:
        props = PLANNERS[name](scenes)
    several = props.ndim == 4
    result = score_proposals(scenes, props if several else props[:, None], reference, config, budget=budget,
                             executables=executables)
    return jax.tree.map(lambda a: np.asarray(a) if several else np.asarray(a)[:, 0], result)


def _check_planner(name: str, proposals, n: int):
    if name == "file":
        if proposals is None:
            raise ValueError(f"planner 'file' needs proposals ({n}, 8, 3)")
        proposals = np.asarray(proposals, np.float32)
        if proposals.shape[-2:] != (NUM_OUTPUT_POSES, 3) or proposals.ndim not in (3, 4) or len(proposals) != n:
            raise ValueError(f"proposals must have shape ({n}, {NUM_OUTPUT_POSES}, 3) or ({n}, P, "
                             f"{NUM_OUTPUT_POSES}, 3), got {proposals.shape}")
    elif name not in PLANNERS:
        raise ValueError(f"unknown planner {name!r}; choose from {sorted(PLANNERS) + ['file']}")
    return proposals


def _file_config(config: PDMConfig, proposals) -> PDMConfig:
    """Missing trajectories (NaN rows) score 0 with ``finite`` False instead of raising."""
    if proposals is not None and not np.all(np.isfinite(proposals)):
        return dataclasses.replace(config, check_finite=False)
    return config


def evaluate_planner(name: str, scenes: Scene, config: PDMConfig = PDMConfig(), proposals=None, batch_size: int = 64,
                     progress: bool = False, references=None) -> PDMResult:
    """Scores a named planner on scenes with batch dim (N,).

    Args:
      name: one of ``PLANNERS`` (constant_velocity, idm, pdm_closed, expert) or "file"
        (then ``proposals`` (N, 8, 3) must be given; rows with NaN score 0, ``finite`` False).
      scenes: Scene with one batch dim (N,).
      batch_size: scenes per jitted call (the last chunk is padded).
      progress: show a tqdm bar over chunks.
      references: optional (N, 40, 3) PDM-Closed poses at 0.1 s (rows with NaN, or None:
        computed with :func:`jax_drive.planners.pdm_closed`).
    Returns: PDMResult with fields (N,).
    """
    shape = batch_shape(scenes)
    if len(shape) != 1:
        raise ValueError(f"scenes must have one batch dim (N,), got batch shape {shape}")
    n = shape[0]
    proposals = _check_planner(name, proposals, n)
    config = _file_config(config, proposals)
    chunks = _padded_chunks(n, batch_size)
    if progress:
        from tqdm import tqdm

        chunks = tqdm(chunks, desc=f"scoring {name}", unit="batch")
    outs = []
    # one map budget for every chunk (one compiled program): the whole batch's
    budget = map_budget(scenes, _rows_per_scene(proposals, config))
    for chunk, padded in chunks:
        sc = jax.tree.map(lambda a: a[padded], scenes)
        res = _score_batch(name, sc, config, None if proposals is None else proposals[padded],
                           None if references is None else np.asarray(references, np.float32)[padded], budget)
        outs.append(jax.tree.map(lambda a: a[: len(chunk)], res))
    return jax.tree.map(lambda *xs: np.concatenate(xs), *outs)


def evaluate_scene_file(scene_file, name: str, config: PDMConfig = PDMConfig(), proposals=None, batch_size: int = 64,
                        progress: bool = False, executables=None) -> PDMResult:
    """Scores a planner (or ``proposals`` (S, 8, 3) or (S, P, 8, 3), name "file") on a
    :class:`jax_drive.scenes.io.SceneFile`.

    Scenes are padded to the file's largest bucketed capacities (``SceneFile.largest_sizes``)
    and built in chunks of ``batch_size`` (the last chunk padded); every chunk is scored with
    one map budget (the largest of the chunks', bucketed), so the file compiles one scoring
    program and a similar file reuses it (from the persistent compilation cache too;
    ``executables``, a :class:`jax_drive.compile_cache.ExecutableStore`, keeps the whole
    compiled scoring program, so a warm process does not even trace it). A scene's own PDM-Closed
    plan (``pdm_closed`` in the file) is the EP reference where it has one; the others use
    our PDM-Closed.
    Returns: PDMResult with fields (S,) or (S, P), in file order.
    """
    n = len(scene_file)
    proposals = _check_planner(name, proposals, n)
    config = _file_config(config, proposals)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, desc=f"scoring {name}", unit="scene")
    parts: list[tuple[np.ndarray, PDMResult]] = []
    sizes = scene_file.largest_sizes()
    chunks = [(chunk, padded, scene_file.build(padded, sizes)) for chunk, padded in _padded_chunks(n, batch_size)]
    rows = _rows_per_scene(proposals, config)
    budget = merge_budgets([map_budget(scenes, rows) for _, _, scenes in chunks])
    for chunk, padded, scenes in chunks:
        res = _score_batch(name, scenes, config, None if proposals is None else proposals[padded],
                           scene_file.references[padded], budget, executables)
        parts.append((chunk, jax.tree.map(lambda a: a[: len(chunk)], res)))
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()
    return jax.tree.map(lambda *xs: np.concatenate(xs), *[r for _, r in parts])


def summarize(result: PDMResult, valid=None) -> dict[str, float]:
    """Mean of each metric in :data:`METRICS` over all entries (or those where ``valid``;
    NaN when none is)."""
    keep = slice(None) if valid is None else np.asarray(valid, bool)
    out = {}
    for field, _ in METRICS:
        values = np.asarray(getattr(result, field))[keep]
        out[field] = float(np.mean(values)) if values.size else math.nan
    return out


class TrajectoryFileError(ValueError):
    """A bad trajectory file; the message names the line and the reason."""


def _jsonl_objects(path: Path, key: str, payload: tuple[str, ...] = ("poses",)):
    """Yields ("file:line", line number, object) for the non-blank lines of a JSONL file
    whose objects have ``key`` and one of ``payload`` (default "poses")."""
    if not path.is_file():
        raise TrajectoryFileError(f"{path}: no such file")
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise TrajectoryFileError(f"{where}: invalid JSON ({e.msg})") from None
            if not isinstance(obj, dict) or key not in obj or sum(k in obj for k in payload) != 1:
                wanted = " and ".join([repr(key), " / ".join(map(repr, payload))])
                raise TrajectoryFileError(f"{where}: expected an object with keys {wanted}")
            yield where, lineno, obj


def load_trajectories(path: str | Path, num_scenes: int) -> np.ndarray:
    """Reads a JSONL file of ``{"scene": id, "poses": [[x, y, heading] x 8]}`` lines.

    Blank lines are skipped. Every scene id in [0, num_scenes) must appear exactly once.
    Returns: (num_scenes, 8, 3) float32, row i = scene i.
    Raises: TrajectoryFileError naming the line number and the reason.
    """
    path = Path(path)
    out = np.full((num_scenes, NUM_OUTPUT_POSES, 3), np.nan, np.float32)
    seen: dict[int, int] = {}
    for where, lineno, obj in _jsonl_objects(path, "scene"):
        sid = obj["scene"]
        if isinstance(sid, bool) or not isinstance(sid, int):
            raise TrajectoryFileError(f"{where}: 'scene' must be an integer, got {sid!r}")
        if not 0 <= sid < num_scenes:
            raise TrajectoryFileError(f"{where}: scene {sid} out of range [0, {num_scenes})")
        if sid in seen:
            raise TrajectoryFileError(f"{where}: duplicate scene {sid} (first on line {seen[sid]})")
        poses = obj["poses"]
        ok = (
            isinstance(poses, list)
            and len(poses) == NUM_OUTPUT_POSES
            and all(isinstance(p, list) and len(p) == 3 for p in poses)
        )
        if not ok:
            raise TrajectoryFileError(f"{where}: 'poses' must be a list of {NUM_OUTPUT_POSES} [x, y, heading] triples")
        try:
            arr = np.asarray(poses, np.float64)
        except (TypeError, ValueError):
            raise TrajectoryFileError(f"{where}: 'poses' must contain numbers only") from None
        if arr.dtype.kind not in "fiu" or not np.all(np.isfinite(arr)):
            raise TrajectoryFileError(f"{where}: 'poses' must contain finite numbers only")
        seen[sid] = lineno
        out[sid] = arr
    missing = [i for i in range(num_scenes) if i not in seen]
    if missing:
        head = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise TrajectoryFileError(f"{path}: no trajectory for {len(missing)} scene(s): {head}")
    return out


def _resampled(poses, dt: float, where: str) -> np.ndarray:
    """Ego-frame poses (..., K, 3) at dt -> the 8 output poses (..., 8, 3) at 0.5 .. 4.0 s
    (NAVSIM's interpolation: the t0 pose in front, x, y linear, heading unwrapped)."""
    from jax_drive.scenes.io import resample_poses

    arr = np.asarray(poses, np.float64)
    if arr.ndim < 2 or arr.shape[-1] != 3 or arr.shape[-2] < 1:
        raise TrajectoryFileError(f"{where}: poses must be a list of [x, y, heading] triples, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise TrajectoryFileError(f"{where}: poses must contain finite numbers only")
    if not (math.isfinite(dt) and dt > 0):
        raise TrajectoryFileError(f"{where}: dt must be a positive number, got {dt}")
    horizon = NUM_OUTPUT_POSES * 0.5
    if arr.shape[-2] * dt < horizon - 1e-9:
        raise TrajectoryFileError(f"{where}: {arr.shape[-2]} poses at {dt} s cover {arr.shape[-2] * dt:g} s, "
                                  f"need {horizon:g} s")
    return resample_poses(arr, dt, (np.arange(NUM_OUTPUT_POSES) + 1) * 0.5).astype(np.float32)


class _SubmissionUnpickler(pickle.Unpickler):
    """Reads NAVSIM submission pickles without NAVSIM: its Trajectory and nuPlan's
    TrajectorySampling become plain attribute holders; anything else outside numpy's array
    reconstruction and a few builtins is refused (pickles can run code)."""

    class _Holder:
        def __setstate__(self, state):
            self.__dict__.update(state if isinstance(state, dict) else state[1] or {})

    _ALLOWED = {
        ("navsim.common.dataclasses", "Trajectory"), ("nuplan.planning.simulation.trajectory.trajectory_sampling",
                                                      "TrajectorySampling"),
    }

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return self._Holder
        if module in ("numpy.core.multiarray", "numpy._core.multiarray") and name in ("_reconstruct", "scalar"):
            return getattr(np.core.multiarray if module == "numpy.core.multiarray" else np._core.multiarray, name)
        if module == "numpy" and name in ("ndarray", "dtype"):
            return getattr(np, name)
        if module == "numpy.dtypes":
            return getattr(np.dtypes, name)
        if module in ("copyreg", "builtins") and name in ("__newobj__", "_reconstructor", "object", "dict", "list"):
            import builtins
            import copyreg

            return getattr(copyreg if module == "copyreg" else builtins, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a submission pickle")


def _submission_predictions(path: Path) -> tuple[dict, str]:
    try:
        with path.open("rb") as f:
            data = _SubmissionUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as e:
        raise TrajectoryFileError(f"{path}: not a readable NAVSIM submission pickle ({e})") from None
    for key in ("predictions", "first_stage_predictions"):
        if isinstance(data, dict) and isinstance(data.get(key), list) and data[key] \
                and all(isinstance(p, dict) for p in data[key]):
            merged: dict = {}
            for part in data[key]:
                merged.update(part)
            return merged, key
    raise TrajectoryFileError(f"{path}: expected a NAVSIM submission dict with 'predictions' "
                              "(v1.x) or 'first_stage_predictions' (v2.x), a list of {token: Trajectory}")


def load_token_trajectories(path: str | Path, tokens) -> np.ndarray:
    """Trajectories by scene token for a scene file, in ``tokens`` order.

    Accepts JSONL lines ``{"token": str, "poses": [[x, y, heading], ...], "dt": 0.5}``
    (ego rear-axle frame at t0; any spacing covering 4 s, resampled to 8 poses at 0.5 s;
    ``dt`` defaults to 0.5) or a NAVSIM submission pickle (``.pkl``: v1.x "predictions",
    v2.x "first_stage_predictions").
    Returns: (S, 8, 3) float32; rows of tokens without a trajectory are NaN (they score as
    invalid). Raises TrajectoryFileError naming the line (or token) and the reason, also
    for tokens that are not in ``tokens``.
    """
    path = Path(path)
    if not path.is_file():
        raise TrajectoryFileError(f"{path}: no such file")
    index = {t: i for i, t in enumerate(tokens)}
    out = np.full((len(index), NUM_OUTPUT_POSES, 3), np.nan, np.float32)
    if path.suffix == ".pkl":
        predictions, key = _submission_predictions(path)
        for token, traj in predictions.items():
            where = f"{path}: {key}[{token!r}]"
            if token not in index:
                raise TrajectoryFileError(f"{where}: token not in the scene file")
            sampling = getattr(traj, "trajectory_sampling", None)
            dt = float(getattr(sampling, "interval_length", 0.5)) if sampling is not None else 0.5
            out[index[token]] = _resampled(getattr(traj, "poses", None), dt, where)
        return out
    for i, trajectories in _token_lines(path, index, several=False):
        out[i] = trajectories[0]
    return out


def _checked_trajectory(poses, dt: float, where: str) -> np.ndarray:
    """One trajectory of a line (a list of [x, y, heading]) resampled to (8, 3) float32."""
    try:
        arr = np.asarray(poses)
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.dtype.kind not in "fiu":
        raise TrajectoryFileError(f"{where}: 'poses' must be a list of [x, y, heading] numbers")
    return _resampled(arr, dt, where)


def _resampled_together(listed: list, dt: float, where: str) -> list[np.ndarray] | None:
    """Trajectories of one line resampled in one call when they form a (P, K, 3) number
    array and are all valid; None otherwise (the caller then checks them one by one)."""
    try:
        arr = np.asarray(listed)
    except (TypeError, ValueError):
        return None
    if arr.ndim != 3 or arr.dtype.kind not in "fiu":
        return None
    try:
        return list(_resampled(arr, dt, where))
    except TrajectoryFileError:
        return None


def _token_lines(path: Path, index: dict, several: bool):
    """Yields (scene index, [(8, 3) float32 trajectories]) per JSONL line of a token file;
    with ``several`` a line may carry "proposals" (a list of trajectories) instead of "poses"."""
    seen: dict[str, int] = {}
    key = "poses"
    for where, lineno, obj in _jsonl_objects(path, "token", ("poses", "proposals") if several else ("poses",)):
        token = obj["token"]
        if not isinstance(token, str):
            raise TrajectoryFileError(f"{where}: 'token' must be a string, got {token!r}")
        if token not in index:
            raise TrajectoryFileError(f"{where}: token {token!r} is not in the scene file")
        if token in seen:
            raise TrajectoryFileError(f"{where}: duplicate token {token!r} (first on line {seen[token]})")
        dt = obj.get("dt", 0.5)
        if isinstance(dt, bool) or not isinstance(dt, (int, float)):
            raise TrajectoryFileError(f"{where}: 'dt' must be a number")
        key = "poses" if "poses" in obj else "proposals"
        if key == "proposals" and (not isinstance(obj[key], list) or not obj[key]):
            raise TrajectoryFileError(f"{where}: 'proposals' must be a non-empty list of trajectories")
        listed = [obj["poses"]] if key == "poses" else obj["proposals"]
        trajectories = _resampled_together(listed, float(dt), where)
        if trajectories is None:  # one by one, so that the error names the bad trajectory
            trajectories = [_checked_trajectory(poses, float(dt), where if key == "poses" else f"{where}: proposal {k}")
                            for k, poses in enumerate(listed)]
        seen[token] = lineno
        yield index[token], trajectories


def load_token_proposals(path: str | Path, tokens) -> np.ndarray:
    """Several trajectories per scene token: (S, P, 8, 3) float32, P the most any token has.

    JSONL lines ``{"token": str, "proposals": [[[x, y, heading], ...], ...], "dt": 0.5}``
    (trajectories at any spacing covering 4 s) or ``{"token", "poses", "dt"}`` (one, as
    :func:`load_token_trajectories` reads); a NAVSIM submission pickle gives one per token.
    Rows a token lacks are NaN (invalid). Raises TrajectoryFileError naming the line (or
    token) and the reason.
    """
    path = Path(path)
    if path.suffix == ".pkl":
        return load_token_trajectories(path, tokens)[:, None]
    if not path.is_file():
        raise TrajectoryFileError(f"{path}: no such file")
    index = {t: i for i, t in enumerate(tokens)}
    rows = dict(_token_lines(path, index, several=True))
    width = max((len(r) for r in rows.values()), default=1)
    out = np.full((len(index), width, NUM_OUTPUT_POSES, 3), np.nan, np.float32)
    for i, trajectories in rows.items():
        out[i, : len(trajectories)] = np.stack(trajectories)
    return out
