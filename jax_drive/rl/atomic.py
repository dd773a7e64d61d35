"""Atomic file writes: readers (and a resumed run) see the old file or the new one, never a
torn one. Each writes a temporary file in the target's directory, fsyncs it and renames it
over the target with ``os.replace``."""

from __future__ import annotations

import io
import json
import os
import tempfile
from typing import Any

import numpy as np


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path`` via a temporary file in the same directory and
    ``os.replace``: readers see the old file or the new one, never a torn one."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """``atomic_write_bytes`` of ``obj`` as indented JSON (obj must be JSON-serialisable)."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())


def atomic_save_npz(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez`` of named arrays, committed atomically like :func:`atomic_write_bytes`."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write_bytes(path, buffer.getvalue())
