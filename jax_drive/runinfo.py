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
import contextlib
import contextvars
import datetime as dt
import json
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any


class InputError(ValueError):
    """Bad input at a boundary (a file, a flag, a request): reported, exit code 2."""


def add_output_args(parser: argparse.ArgumentParser, *, json_required: bool = False, progress: bool = True) -> None:
    """Adds ``--json OUT`` and, for commands that show progress bars, ``--no-progress``."""
    parser.add_argument("--json", required=json_required, default=None, metavar="OUT", type=output_file,
                        help="write the results to this JSON file" + ("" if json_required else " (default: none)"))
    if progress:
        parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def require_min(minimum: float, **flags: Any) -> None:
    """Raises :class:`InputError` for the first flag below ``minimum`` or not a finite number
    (None means unset and passes).

    Keywords name the flags (``max_new_tokens`` -> ``--max-new-tokens``); a list checks each item.
    """
    for flag, item in _flag_values(flags):
        if not math.isfinite(item) or item < minimum:
            raise InputError(f"{flag} must be >= {minimum}, got {item}")


def require_range(low: float, high: float, **flags: Any) -> None:
    """Like :func:`require_min`, for flags that must lie in [low, high]."""
    for flag, item in _flag_values(flags):
        if not (math.isfinite(item) and low <= item <= high):
            raise InputError(f"{flag} must be in [{low}, {high}], got {item}")


def _flag_values(flags: dict[str, Any]):
    """(``--flag-name``, value) for every set value; list values give one pair per item."""
    for name, value in flags.items():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None:
                yield f"--{name.replace('_', '-')}", item


def finite_float(text: str) -> float:
    """``type=`` of float flags: refuses ``nan`` and ``inf``, which ``float`` accepts (argparse
    then exits 2 with a message naming the flag)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def output_problem(path: str | os.PathLike, *, directory: bool = False) -> str | None:
    """Why ``path`` cannot be written as an output file (or, with ``directory``, an output
    directory), or None when it can.

    Missing parent directories are allowed (writers create them) when the nearest existing
    ancestor is a directory this process can create files in; that is tried by creating and
    removing an empty file there, so read-only file systems, ``/proc`` and permissions all count.
    Creates nothing that stays.
    """
    target = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if os.path.isdir(target) and not directory:
        return f"{path} is a directory, not a file"
    if os.path.exists(target) and not os.path.isdir(target):
        if directory:
            return f"{path} is a file, not a directory"
        if not os.access(target, os.W_OK):
            return f"{path} is not writable"
    folder = target if directory else os.path.dirname(target)
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        return f"{path}: {folder} is a file, not a directory"
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".jax-drive-write-check-")
    except OSError as error:
        return f"{path}: cannot create files in {folder} ({error.strerror or error})"
    os.close(fd)
    os.remove(probe)
    return None


def check_output(path: str | os.PathLike, flag: str, *, directory: bool = False) -> str:
    """Returns ``path`` as given; raises :class:`InputError` naming ``flag`` when
    :func:`output_problem` finds a reason it cannot be written."""
    problem = output_problem(path, directory=directory)
    if problem:
        raise InputError(f"{flag} {problem}")
    return os.fspath(path)


def make_parent(path: str | os.PathLike) -> str:
    """Creates the missing parent directories of an output file; returns ``path`` as a string."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return path


def output_file(text: str) -> str:
    """``type=`` of output-file flags: :func:`output_problem` checked while parsing."""
    problem = output_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def output_dir(text: str) -> str:
    """``type=`` of output-directory flags: :func:`output_problem` checked while parsing."""
    problem = output_problem(text, directory=True)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


SIGTERM_EXIT_CODE = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM


@contextlib.contextmanager
def sigterm_exits():
    """Within the block, SIGTERM raises ``SystemExit(143)`` in the main thread, so ``finally``
    blocks and atexit handlers clean up (Ray's core installs a handler that aborts instead,
    leaving its helper processes behind). A library that turns the exception into another
    on its way out (Ray's ``check_status`` makes it ``SystemExit(1)``) cannot hide it: the
    block still ends with ``SystemExit(143)``. The previous handler is restored afterwards."""
    received = []

    def stop(signum, frame):
        received.append(signum)
        raise SystemExit(SIGTERM_EXIT_CODE)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        if received:
            raise SystemExit(SIGTERM_EXIT_CODE)


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


# The command line of the entry point now running (set by :func:`invoked`), which
# :func:`run_metadata` records: a results file then says exactly how it was made.
_INVOCATION: contextvars.ContextVar[str | None] = contextvars.ContextVar("invocation", default=None)


@contextlib.contextmanager
def invoked(prog: str, argv: list[str] | None = None):
    """Within the block, :func:`run_metadata` records ``prog`` and ``argv`` (default
    ``sys.argv[1:]``) as ``invocation``; a script's path (``*.py``) is written as
    :func:`command_line` writes it."""
    args = sys.argv[1:] if argv is None else list(argv)
    text = command_line(prog, args) if prog.endswith(".py") else shlex.join([prog, *args])
    token = _INVOCATION.set(text)
    try:
        yield text
    finally:
        _INVOCATION.reset(token)


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
    ``invocation`` (the full command line, inside :func:`invoked`: every ``jax-drive``
    command), plus ``extra``.
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
    if _INVOCATION.get() is not None:
        meta["invocation"] = _INVOCATION.get()
    meta.update(extra)
    return meta


def write_json(path: str | os.PathLike, payload: Any) -> str:
    """Writes strict JSON atomically (a temp file beside ``path``, then ``os.replace``); returns the path.

    NaN and infinities are not JSON: they are written as null and, when ``payload`` is a
    mapping, their paths (``$.metrics.nc``) are listed under ``"non_finite"``, so a null
    that means "not a number" is told apart from one that means "not measured". Results
    should carry their own validity or count fields; this is the net under them.
    """
    path = make_parent(path)
    nulled: list[str] = []
    payload = _finite_or_null(payload, "$", nulled)
    if nulled and isinstance(payload, dict):
        payload["non_finite"] = nulled
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2, default=_json_default, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def write_results(path: str | os.PathLike, payload: Any, shown: Any, indent: int = 2) -> int:
    """A benchmark's ending: ``payload`` written to ``path`` (:func:`write_json`), ``shown``
    (the figures a reader looks at first) printed as indented JSON; returns exit status 0."""
    write_json(path, payload)
    print(json.dumps(shown, indent=indent))
    return 0


def _finite_or_null(value: Any, where: str, nulled: list[str]) -> Any:
    """``value`` as JSON types with every non-finite float replaced by None (its path appended to ``nulled``)."""
    if isinstance(value, dict):
        return {key: _finite_or_null(item, f"{where}.{key}", nulled) for key, item in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_finite_or_null(item, f"{where}[{i}]", nulled) for i, item in enumerate(value)]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # numpy / JAX arrays and scalars
        return _finite_or_null(value.tolist(), where, nulled)
    if isinstance(value, float) and not math.isfinite(value):
        nulled.append(where)
        return None
    return value


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


def wall_times(fn: Callable[[], Any], repeats: int) -> list[float]:
    """Wall seconds of each of ``repeats`` calls of ``fn()`` (warm it up first: every call is timed)."""
    import time

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def parse_and_run(add_arguments: Callable[[argparse.ArgumentParser], None], run: Callable[[argparse.Namespace], int],
                  argv: list[str] | None = None, prog: str | None = None, description: str | None = None) -> int:
    """A command's flags (``add_arguments``) parsed from ``argv`` and ``run`` on them under
    :func:`run_main` (for scripts that wrap a ``jax-drive`` command); argparse's usage errors
    (2) and ``--help`` (0) come back as return codes like the rest."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:
        return int(stop.code or 0)
    with invoked(parser.prog, argv):
        return run_main(lambda _: run(args))


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
