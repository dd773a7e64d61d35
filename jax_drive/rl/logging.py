"""Per-step training metrics: JSONL + TensorBoard event files, peak RSS, throughput.

``MetricsLogger(out_dir)`` appends one JSON object per step to ``<out_dir>/metrics.jsonl``
and writes every numeric value as a TensorBoard scalar (tensorboardX) under
``<out_dir>/tb``. Values may be Python numbers, numpy or JAX scalars; lists (e.g. mean PDMS
per turn) are written as ``name/0``, ``name/1``, ... scalars and kept as lists in JSONL.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from typing import Any, Mapping

import numpy as np


def peak_rss_gb() -> float:
    """Peak resident set size of this process in GiB (getrusage; Linux reports KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1.0 if sys.platform == "darwin" else 1024.0
    return float(peak) * scale / 2**30


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, bool)) or value is None:
        return value
    arr = np.asarray(value)
    if arr.ndim == 0:
        x = arr.item()
        if isinstance(x, float) and not math.isfinite(x):
            return None if math.isnan(x) else (1e300 if x > 0 else -1e300)
        return x
    return [_plain(v) for v in arr.tolist()]


class MetricsLogger:
    """JSONL + TensorBoard writer. Use as a context manager or call close()."""

    def __init__(self, out_dir: str | os.PathLike | None, tensorboard: bool = True, append: bool = False):
        self.out_dir = None if out_dir is None else os.fspath(out_dir)
        self._file = None
        self._tb = None
        self.history: list[dict] = []
        if self.out_dir is not None:
            os.makedirs(self.out_dir, exist_ok=True)
            self._file = open(os.path.join(self.out_dir, "metrics.jsonl"), "a" if append else "w")
            if tensorboard:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(os.path.join(self.out_dir, "tb"))

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict:
        record = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
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


class Throughput:
    """tokens/s over a timed block: ``with t: ...; t.rate(tokens)``."""

    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start

    def rate(self, tokens: float) -> float:
        return float(tokens) / max(self.seconds, 1e-9)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
