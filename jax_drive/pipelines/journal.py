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
from typing import Any, Callable, Protocol

import numpy as np

from jax_drive.faults import pause_point
from jax_drive.rl.atomic import atomic_save_npz, atomic_write_json
from jax_drive.rl.logging import jsonable

# run() of a stage: () -> (value, JSON record, arrays or None); restore: (record, arrays) -> value
StageRun = Callable[[], tuple[Any, dict, dict | None]]
StageRestore = Callable[[dict, dict], Any]


class Journal(Protocol):
    """What :func:`jax_drive.pipelines.stages.run_stages` needs of a journal."""

    def stage(self, name: str, run: StageRun, restore: StageRestore | None = None) -> tuple[Any, dict]: ...

    def lap(self, name: str) -> float: ...


class RunDirError(Exception):
    """The run directory cannot be used as asked: it holds a run and ``resume`` is off, or
    it holds a different run than the one asked to resume."""


class _Clock:
    """Wall (and process CPU) seconds between laps."""

    def __init__(self):
        self.timings: dict[str, float] = {}
        self.cpu_timings: dict[str, float] = {}
        self._clock, self._cpu_clock = time.perf_counter(), time.process_time()

    def lap(self, name: str) -> float:
        """Records the wall (and CPU) seconds since the last lap (or stage) as
        ``timings[name]`` (and ``cpu_timings[name]``); returns the wall seconds."""
        now, cpu = time.perf_counter(), time.process_time()
        self.timings[name] = round(now - self._clock, 2)
        self.cpu_timings[name] = round(cpu - self._cpu_clock, 2)
        self._clock, self._cpu_clock = now, cpu
        return self.timings[name]


class RunJournal(_Clock):
    """Finished stages of one run directory (see the module docstring), and the seconds each
    stage took (``timings``: wall; ``cpu_timings``: the process's CPU seconds, all threads,
    which a busy shared machine distorts less; a loaded stage keeps those of the run that
    did it)."""

    def __init__(self, out_dir: str | os.PathLike, identity: dict[str, Any], resume: bool):
        super().__init__()
        self.out_dir = os.fspath(out_dir)
        self.resume = resume
        self.stage_dir = os.path.join(self.out_dir, "stages")
        self.resumed: list[str] = []  # the stages loaded instead of run
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

    def stage(self, name: str, run: StageRun, restore: StageRestore | None = None) -> tuple[Any, dict]:
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
            seconds = self.lap(name)
            record = self.save(name, {**record, "seconds": seconds, "cpu_seconds": self.cpu_timings[name]}, arrays)
            return (record if restore is None else value), record
        record, arrays = loaded
        self.resumed.append(name)
        self.timings[name] = record["seconds"]
        if "cpu_seconds" in record:
            self.cpu_timings[name] = record["cpu_seconds"]
        self._clock, self._cpu_clock = time.perf_counter(), time.process_time()
        return (record if restore is None else restore(record, arrays)), record


class Laps(_Clock):
    """A journal that keeps nothing: every stage runs, only its seconds are recorded (for
    stages that keep and check their own results)."""

    def stage(self, name: str, run: StageRun, restore: StageRestore | None = None) -> tuple[Any, dict]:
        value, record, _ = run()
        self.lap(name)
        return (record if restore is None else value), record


class FileJournal(_Clock):
    """A journal that keeps each finished stage's record as ``<out_dir>/<name>.json`` (no
    run identity, no arrays): the layout of pipelines whose results are one JSON file per
    stage, e.g. one per TalkingVehicles method. ``force`` runs every stage again."""

    def __init__(self, out_dir: str | os.PathLike, force: bool = False):
        super().__init__()
        self.out_dir = os.fspath(out_dir)
        self.force = force
        self.resumed: list[str] = []
        os.makedirs(self.out_dir, exist_ok=True)

    def path(self, name: str) -> str:
        return os.path.join(self.out_dir, f"{name}.json")

    def stage(self, name: str, run: StageRun, restore: StageRestore | None = None) -> tuple[Any, dict]:
        path = self.path(name)
        if os.path.exists(path) and not self.force:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
            self.resumed.append(name)
            return (record if restore is None else restore(record, {})), record
        value, record, arrays = run()
        if arrays:
            raise ValueError(f"stage {name!r}: a FileJournal stores no arrays")
        from jax_drive.runinfo import write_json

        write_json(path, record)
        self.lap(name)
        return (record if restore is None else value), record
