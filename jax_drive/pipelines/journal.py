"""The on-disk record of a pipeline run, so a killed run continues where it died.

A run directory holds ``run.json`` (the run's identity: pipeline, preset and options that
change results) and, for every finished stage, ``stages/<name>.json`` (the stage's JSON
record) with ``stages/<name>.npz`` (its arrays) written before it. Every file is written
to a temporary name and renamed (``os.replace``), and the marker JSON comes last, so a
stage is finished exactly when its marker exists. Training stages keep their own step
checkpoints (:class:`jax_drive.rl.checkpoint.Checkpointer`); the journal only records that
they finished.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

import jax
import numpy as np

from jax_drive.rl.atomic import atomic_save_npz, atomic_write_json
from jax_drive.rl.faults import pause_point
from jax_drive.rl.logging import jsonable


class RunDirError(Exception):
    """The run directory cannot be used as asked: it holds a run and ``resume`` is off, or
    it holds a different run than the one asked to resume."""


class RunJournal:
    """Finished stages of one run directory (see the module docstring), and the seconds each
    stage took (``timings``; a loaded stage keeps the seconds of the run that did it)."""

    def __init__(self, out_dir: str | os.PathLike, identity: dict[str, Any], resume: bool):
        self.out_dir = os.fspath(out_dir)
        self.resume = resume
        self.stage_dir = os.path.join(self.out_dir, "stages")
        self.timings: dict[str, float] = {}
        self.resumed: list[str] = []  # the stages loaded instead of run
        self._clock = time.perf_counter()
        path = os.path.join(self.out_dir, "run.json")
        identity = json.loads(json.dumps(jsonable(identity), default=str))
        if os.path.exists(path):
            if not resume:
                raise RunDirError(f"{self.out_dir} already holds a run: resume it or choose another directory")
            with open(path) as f:
                stored = json.load(f)
            if stored != identity:
                differ = sorted(k for k in set(stored) | set(identity) if stored.get(k) != identity.get(k))
                raise RunDirError(f"{self.out_dir} holds a different run (differs in {differ}); "
                                  "resume it with the same settings or choose another directory")
        else:
            atomic_write_json(path, identity)
        os.makedirs(self.stage_dir, exist_ok=True)

    def load(self, name: str) -> tuple[dict, dict[str, np.ndarray]] | None:
        """(record, arrays) of a finished stage when resuming; None when it must run."""
        marker = os.path.join(self.stage_dir, f"{name}.json")
        if not (self.resume and os.path.exists(marker)):
            return None
        with open(marker) as f:
            record = json.load(f)
        arrays: dict[str, np.ndarray] = {}
        npz = os.path.join(self.stage_dir, f"{name}.npz")
        if os.path.exists(npz):
            with np.load(npz, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
        return record, arrays

    def save(self, name: str, record: dict[str, Any], arrays: dict[str, np.ndarray] | None = None) -> dict:
        """Marks a stage finished; returns the record as written (JSON types)."""
        if arrays:
            atomic_save_npz(os.path.join(self.stage_dir, f"{name}.npz"), arrays)
        record = jsonable(record)
        pause_point(f"{name}_marker", 0)
        atomic_write_json(os.path.join(self.stage_dir, f"{name}.json"), record)
        return record


    def lap(self, name: str) -> float:
        """Records the seconds since the last lap (or stage) as ``timings[name]``."""
        now = time.perf_counter()
        self.timings[name] = round(now - self._clock, 2)
        self._clock = now
        return self.timings[name]

    def stage(self, name: str, run: Callable[[], tuple[Any, dict, dict | None]],
              restore: Callable[[dict, dict], Any] | None = None) -> tuple[Any, dict]:
        """Loads a finished stage, or runs it and marks it finished.

        Args:
          run: () -> (value, JSON record, arrays or None).
          restore: (record, arrays) -> the value of a loaded stage; None: the value is the
            record (as written, so a loaded and a computed stage give equal values).
        Returns:
          (value, record).
        """
        loaded = self.load(name)
        if loaded is None:
            value, record, arrays = run()
            record = self.save(name, {**record, "seconds": self.lap(name)}, arrays)
            return (record if restore is None else value), record
        record, arrays = loaded
        self.resumed.append(name)
        self.timings[name] = record["seconds"]
        self._clock = time.perf_counter()
        return (record if restore is None else restore(record, arrays)), record


# ----------------------------------------------------------------------------- pytrees <-> arrays
def tree_to_arrays(prefix: str, tree) -> dict[str, np.ndarray]:
    """The leaves of a pytree as named numpy arrays ``prefix + keystr(path)``."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {prefix + jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def tree_from_arrays(prefix: str, arrays: dict[str, np.ndarray], template):
    """Inverse of :func:`tree_to_arrays`; ``template`` has the tree's structure (any shapes)."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    names = [prefix + jax.tree_util.keystr(path) for path, _ in leaves]
    missing = [n for n in names if n not in arrays]
    if missing:
        raise KeyError(f"stored arrays lack {missing[:3]}{'...' if len(missing) > 3 else ''}")
    return jax.tree_util.tree_unflatten(treedef, [arrays[n] for n in names])


def ragged_to_arrays(prefix: str, rows: list[np.ndarray]) -> dict[str, np.ndarray]:
    """A list of 1-D arrays as one flat array and the row lengths."""
    lengths = np.asarray([len(r) for r in rows], np.int64)
    flat = np.concatenate(rows) if rows else np.zeros(0)
    return {f"{prefix}/flat": flat, f"{prefix}/lengths": lengths}


def ragged_from_arrays(prefix: str, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Inverse of :func:`ragged_to_arrays`."""
    ends = np.cumsum(arrays[f"{prefix}/lengths"])
    return np.split(arrays[f"{prefix}/flat"], ends[:-1]) if len(ends) else []
