"""Evaluation API: score proposals or whole planners with the PDM score.

* :func:`evaluate_proposals`: PDM-Closed reference, then ``jax_drive.pdm.score_proposals``.
* :func:`evaluate_planner`: run a named planner over scenes in fixed-size chunks (one
  compilation; the last chunk is padded by repeating scenes and the padding is dropped),
  optionally with a tqdm bar; returns a per-scene :class:`PDMResult` (N,).
* :func:`summarize`: mean of every metric.
* :func:`load_trajectories`: JSONL trajectory files with line-numbered errors.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.pdm import PDMConfig, PDMResult, score_proposals
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


def _slice(scene: Scene, start: int, stop: int, size: int) -> Scene:
    """Scenes [start, stop) padded to ``size`` by repeating the last one."""
    idx = np.minimum(np.arange(start, start + size), stop - 1)
    return jax.tree.map(lambda a: a[idx], scene)


def evaluate_planner(
    name: str,
    scenes: Scene,
    config: PDMConfig = PDMConfig(),
    proposals=None,
    batch_size: int = 64,
    progress: bool = False,
) -> PDMResult:
    """Scores a named planner on scenes with batch dim (N,).

    Args:
      name: one of ``PLANNERS`` (constant_velocity, idm, pdm_closed, expert) or "file"
        (then ``proposals`` (N, 8, 3) must be given).
      scenes: Scene with one batch dim (N,).
      batch_size: scenes per jitted call (the last chunk is padded).
      progress: show a tqdm bar over chunks.
    Returns: PDMResult with fields (N,).
    """
    shape = batch_shape(scenes)
    if len(shape) != 1:
        raise ValueError(f"scenes must have one batch dim (N,), got batch shape {shape}")
    n = shape[0]
    if name == "file":
        if proposals is None:
            raise ValueError("planner 'file' needs proposals (N, 8, 3)")
        proposals = np.asarray(proposals, np.float32)
        if proposals.shape != (n, NUM_OUTPUT_POSES, 3):
            raise ValueError(f"proposals must have shape ({n}, {NUM_OUTPUT_POSES}, 3), got {proposals.shape}")
    elif name not in PLANNERS:
        raise ValueError(f"unknown planner {name!r}; choose from {sorted(PLANNERS) + ['file']}")
    size = max(1, min(batch_size, n))
    chunks = range(math.ceil(n / size))
    if progress:
        from tqdm import tqdm

        chunks = tqdm(chunks, desc=f"scoring {name}", unit="batch")
    outs = []
    for c in chunks:
        start, stop = c * size, min(n, (c + 1) * size)
        sc = _slice(scenes, start, stop, size)
        ref_out = pdm_closed(sc)
        if name == "file":
            idx = np.minimum(np.arange(start, start + size), stop - 1)
            props = jnp.asarray(proposals[idx])
        elif name == "pdm_closed":
            props = ref_out.output
        else:
            props = PLANNERS[name](sc)
        res = score_proposals(sc, props[:, None], ref_out.poses, config)
        outs.append(jax.tree.map(lambda a: np.asarray(a)[: stop - start, 0], res))
    return jax.tree.map(lambda *xs: np.concatenate(xs), *outs)


def summarize(result: PDMResult) -> dict[str, float]:
    """Mean of each metric in :data:`METRICS` over all entries."""
    return {field: float(np.mean(np.asarray(getattr(result, field)))) for field, _ in METRICS}


class TrajectoryFileError(ValueError):
    """A bad trajectory file; the message names the line and the reason."""


def load_trajectories(path: str | Path, num_scenes: int) -> np.ndarray:
    """Reads a JSONL file of ``{"scene": id, "poses": [[x, y, heading] x 8]}`` lines.

    Blank lines are skipped. Every scene id in [0, num_scenes) must appear exactly once.
    Returns: (num_scenes, 8, 3) float32, row i = scene i.
    Raises: TrajectoryFileError naming the line number and the reason.
    """
    path = Path(path)
    if not path.is_file():
        raise TrajectoryFileError(f"{path}: no such file")
    out = np.full((num_scenes, NUM_OUTPUT_POSES, 3), np.nan, np.float32)
    seen: dict[int, int] = {}
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise TrajectoryFileError(f"{where}: invalid JSON ({e.msg})") from None
            if not isinstance(obj, dict) or "scene" not in obj or "poses" not in obj:
                raise TrajectoryFileError(f"{where}: expected an object with keys 'scene' and 'poses'")
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
