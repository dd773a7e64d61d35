"""One convention for every entry point (the `jax-drive` commands and `experiments/` scripts).

- ``--json OUT`` writes the results file; nothing is written into the tracked
  ``experiments/results/`` unless the user names a path there.
- ``--no-progress`` hides progress bars (they are on by default).
- Exit codes: 0 success, 2 bad usage or bad input (:class:`InputError`, argparse's own
  errors), 1 a failure while running.
- Every results file carries :func:`run_metadata` under the key ``"meta"``.

Only the standard library is imported at module level, so any layer may use this module and
building a parser stays cheap.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable
from typing import Any


class InputError(ValueError):
    """Bad input at a boundary (a file, a flag, a request): reported, exit code 2."""


def add_output_args(parser: argparse.ArgumentParser, *, json_required: bool = False, progress: bool = True) -> None:
    """Adds ``--json OUT`` and, for commands that show progress bars, ``--no-progress``."""
    parser.add_argument("--json", required=json_required, default=None, metavar="OUT",
                        help="write the results to this JSON file" + ("" if json_required else " (default: none)"))
    if progress:
        parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def require_min(minimum: float, **flags: Any) -> None:
    """Raises :class:`InputError` for the first flag below ``minimum`` (None means unset and passes).

    Keywords name the flags (``max_new_tokens`` -> ``--max-new-tokens``); a list checks each item.
    """
    for name, value in flags.items():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None and item < minimum:
                raise InputError(f"--{name.replace('_', '-')} must be >= {minimum}, got {item}")


def script_environment(*, cpu: bool = True) -> None:
    """Environment defaults for the ``experiments/`` scripts, set before JAX or transformers is imported.

    Nothing is fetched from a model hub (``HF_HUB_OFFLINE``), the tokenizers' thread pool does not
    compete with the timed code and, with ``cpu``, JAX runs on the CPU unless ``JAX_PLATFORMS``
    names a platform. Values already in the environment win.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if cpu:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")


_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command_line(script: str, argv: list[str] | None = None) -> str:
    """How to rerun a script: ``python <script relative to the checkout> <args>`` (args: sys.argv[1:] when None)."""
    args = sys.argv[1:] if argv is None else list(argv)
    return shlex.join(["python", os.path.relpath(os.path.abspath(script), _REPO_ROOT), *args])


def _git_commit() -> str | None:
    """Short HEAD commit, with ``+dirty`` when tracked files differ from it (the results then
    came from uncommitted code; untracked files are not counted), ``+unknown`` when git could
    not tell."""
    def git(*args):
        return subprocess.run(["git", "-C", _REPO_ROOT, *args], capture_output=True, text=True, timeout=5,
                              check=False)

    try:
        commit = git("rev-parse", "--short", "HEAD").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not commit:
        return None
    try:
        dirty = git("diff", "--quiet", "HEAD").returncode == 1
    except (OSError, subprocess.SubprocessError):
        return commit + "+unknown"  # the commit is known, the state of the files is not
    return commit + "+dirty" if dirty else commit


def run_metadata(**extra: Any) -> dict[str, Any]:
    """What a results file needs to be read later: when, where, which code and JAX devices.

    Keys: ``date_utc``, ``git_commit`` (``+dirty`` after uncommitted changes), ``platform``, ``python``, ``cpu_count``, ``cpu_affinity``
    (the cores this process may use, e.g. under ``taskset``), ``load_average`` ([1, 5, 15] min), ``xla_flags``, ``jax_version``, ``jax_devices``
    (the last two only when JAX is already imported, so asking never starts a backend),
    plus ``extra``.
    """
    meta: dict[str, Any] = {
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    jax = sys.modules.get("jax")
    if jax is not None:
        meta["jax_version"] = jax.__version__
        meta["jax_devices"] = [str(d) for d in jax.devices()]
    meta.update(extra)
    return meta


def write_json(path: str | os.PathLike, payload: Any) -> str:
    """Writes JSON atomically (a temp file beside ``path``, then ``os.replace``); returns the path."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2, default=_json_default)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # numpy / jax arrays and scalars
        return obj.tolist()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


class CompileClock:
    """Sums the seconds JAX reports for tracing, lowering and compiling (``jax.monitoring``),
    so a benchmark can say how much of a timed region was compilation; counts the programs
    (``programs``) and how many of them came from the persistent cache (``cache_hits``)."""

    def __init__(self):
        import jax

        self.seconds = 0.0
        self.programs = 0
        self.cache_hits = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)
        jax.monitoring.register_event_listener(self._on_count)

    def _on_event(self, event: str, duration: float, **_) -> None:
        if event.startswith("/jax/core/compile/"):
            self.seconds += duration
        if event == "/jax/core/compile/backend_compile_duration":
            self.programs += 1

    def _on_count(self, event: str, **_) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            self.cache_hits += 1

    @property
    def compiled(self) -> int:
        """Programs compiled (not loaded from the persistent cache)."""
        return self.programs - self.cache_hits


def run_main(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Runs an entry point with the exit-code convention: :class:`InputError` -> message + 2.

    Compiled programs persist across runs (:func:`jax_drive.compile_cache.enable_compile_cache`)."""
    from jax_drive.compile_cache import enable_compile_cache

    enable_compile_cache()
    try:
        return int(main(argv) or 0)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
