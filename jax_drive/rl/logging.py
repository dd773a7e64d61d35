"""Per-step training metrics: JSONL + TensorBoard event files, peak RSS.

``MetricsLogger(out_dir)`` appends one JSON object per step to ``<out_dir>/metrics.jsonl``
and writes every numeric value as a TensorBoard scalar (tensorboardX) under
``<out_dir>/tb``. Values may be Python numbers, numpy or JAX scalars; lists (e.g. mean PDMS
per turn) are written as ``name/0``, ``name/1``, ... scalars and kept as lists in JSONL.
A resumed run (``resume_from=step``) keeps the records up to its checkpoint's step and
drops later ones (logged by the killed run after its last checkpoint), so the file never
holds a step twice.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
from typing import Any, Mapping

import numpy as np

from jax_drive.rl.atomic import atomic_write_bytes


def peak_rss_gb() -> float:
    """Peak resident set size of this process in GiB (getrusage; Linux reports KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1.0 if sys.platform == "darwin" else 1024.0
    return float(peak) * scale / 2**30


def jsonable(value: Any) -> Any:
    """``value`` with numpy / JAX scalars and arrays turned into Python numbers and lists
    (non-finite floats: NaN -> None, +-inf -> +-1e300), so ``json.dumps`` takes it."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, bool)) or value is None:
        return value
    arr = np.asarray(value)
    if arr.ndim == 0:
        x = arr.item()
        if isinstance(x, float) and not math.isfinite(x):
            return None if math.isnan(x) else (1e300 if x > 0 else -1e300)
        return x
    return [jsonable(v) for v in arr.tolist()]


class MetricsLogger:
    """JSONL + TensorBoard writer. Use as a context manager or call close()."""

    def __init__(self, out_dir: str | os.PathLike | None, tensorboard: bool = True, resume_from: int | None = None):
        """``resume_from``: the step a resumed run continues after (its records up to that
        step are kept); None starts a new file."""
        self.out_dir = None if out_dir is None else os.fspath(out_dir)
        self._file = None
        self._tb = None
        self.history: list[dict] = []
        if self.out_dir is not None:
            os.makedirs(self.out_dir, exist_ok=True)
            path = os.path.join(self.out_dir, "metrics.jsonl")
            if resume_from is not None:
                _keep_records_until(path, resume_from)
            self._file = open(path, "a" if resume_from is not None else "w")
            if tensorboard:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(os.path.join(self.out_dir, "tb"))

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict:
        record = {"step": int(step), **{k: jsonable(v) for k, v in metrics.items()}}
        self.history.append(record)
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        if self._tb is not None:
            for name, value in record.items():
                if name == "step":
                    continue
                self._scalar(name, value, step)
            self._tb.flush()
        return record

    def _scalar(self, name: str, value: Any, step: int) -> None:
        if isinstance(value, bool):
            value = float(value)
        if isinstance(value, (int, float)):
            self._tb.add_scalar(name, float(value), step)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                if isinstance(v, (int, float)) and v is not None:
                    self._tb.add_scalar(f"{name}/{i}", float(v), step)
        elif isinstance(value, dict):
            for k, v in value.items():
                self._scalar(f"{name}/{k}", v, step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of a JSONL file (one JSON object per non-blank line)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _keep_records_until(path: str, step: int) -> None:
    """Rewrites ``path`` (atomically) with its records of step <= ``step``; a torn last line
    (a run killed while writing it) ends the kept part."""
    if not os.path.exists(path):
        return
    kept = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break
            if record.get("step", 0) <= step:
                kept.append(line if line.endswith("\n") else line + "\n")
    atomic_write_bytes(path, "".join(kept).encode())
