"""The one home of JAX's persistent compilation cache for jax-drive's entry points.

Compiled XLA programs are written to disk and loaded by later processes, so a second
``jax-drive score`` (or experiment, or pipeline) skips compilation. Used by the CLI
(``jax_drive.cli.main``), by :func:`jax_drive.runinfo.run_main` (the experiments), by the
pipelines' entry functions, by the Ray workers (``distributed/backends.py``) and by the test
suite (``tests/conftest.py``, with a per-run temporary directory).

Where: ``JAX_COMPILATION_CACHE_DIR`` (or a directory already set in ``jax.config``) wins;
otherwise ``$XDG_CACHE_HOME/jax_drive/xla`` or ``~/.cache/jax_drive/xla``. A directory
inside the jax-drive checkout is refused (the cache is never written into the source tree).
Opt out with ``JAX_DRIVE_NO_COMPILE_CACHE=1``.

Concurrency: JAX locks cache files only when the cache has a size limit, so a limit is
always set (``JAX_COMPILATION_CACHE_MAX_SIZE`` or ``max_size_bytes``): concurrent processes
then never load an entry another one is still writing, and the least recently used entries
are evicted above the limit.

Only the standard library is imported at module level; JAX is imported when enabling.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

OPT_OUT_ENV = "JAX_DRIVE_NO_COMPILE_CACHE"
DEFAULT_MAX_SIZE = 4 << 30  # bytes
# Programs that compile faster than this are not worth a disk round trip.
DEFAULT_MIN_COMPILE_SECONDS = 0.2
_CHECKOUT = Path(__file__).resolve().parent.parent


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/jax_drive/xla`` (``~/.cache`` when XDG_CACHE_HOME is unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "jax_drive" / "xla"


def opted_out() -> bool:
    """True when ``JAX_DRIVE_NO_COMPILE_CACHE`` is set to a true value (1, true, yes)."""
    return os.environ.get(OPT_OUT_ENV, "").strip().lower() in ("1", "true", "yes")


def _inside_checkout(path: Path) -> bool:
    try:
        return path.resolve().is_relative_to(_CHECKOUT)
    except OSError:
        return False


def enable_compile_cache(directory: str | os.PathLike | None = None, *,
                         min_compile_seconds: float | None = None,
                         max_size_bytes: int | None = None) -> str | None:
    """Turns on JAX's persistent compilation cache; returns its directory, or None when off.

    Args:
      directory: the cache directory; default: ``JAX_COMPILATION_CACHE_DIR`` / the directory
        already configured / :func:`default_cache_dir`.
      min_compile_seconds: cache only programs that took at least this long to compile
        (default: ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` or 0.2 s).
      max_size_bytes: cache size limit (default: ``JAX_COMPILATION_CACHE_MAX_SIZE``, a limit
        already configured, or 4 GiB).
    Off (returns None, JAX untouched) when opted out (:data:`OPT_OUT_ENV`) or when the
    directory would lie inside the jax-drive checkout.

    Before JAX is imported this only sets the ``JAX_*`` environment variables JAX reads at
    import (no import cost for commands that never use JAX; subprocesses inherit them);
    afterwards it also updates ``jax.config``.
    """
    if opted_out():
        return None
    jax = sys.modules.get("jax")
    if directory is None:
        configured = jax.config.jax_compilation_cache_dir if jax is not None else None
        directory = os.environ.get("JAX_COMPILATION_CACHE_DIR") or configured or default_cache_dir()
    path = Path(directory).expanduser()
    if _inside_checkout(path):
        return None
    if min_compile_seconds is None:
        env = os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")
        min_compile_seconds = float(env) if env else DEFAULT_MIN_COMPILE_SECONDS
    if max_size_bytes is None:
        env = os.environ.get("JAX_COMPILATION_CACHE_MAX_SIZE")
        current = jax.config.jax_compilation_cache_max_size if jax is not None else -1
        max_size_bytes = int(env) if env else (current if current > 0 else DEFAULT_MAX_SIZE)
    settings = {"jax_compilation_cache_dir": str(path),
                "jax_persistent_cache_min_compile_time_secs": float(min_compile_seconds),
                "jax_compilation_cache_max_size": int(max_size_bytes)}
    for name, value in settings.items():
        os.environ[name.upper()] = str(value)
        if jax is not None:
            jax.config.update(name, value)
    return str(path)


def _source_fingerprint() -> str:
    """A hash of every jax_drive source file (a stored executable is only reused by the code
    that compiled it)."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted((_CHECKOUT / "jax_drive").rglob("*.py")):
        digest.update(str(path.relative_to(_CHECKOUT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


class ExecutableStore:
    """Whole compiled executables on disk, keyed by everything that decides them, so a warm
    process skips tracing, lowering and compiling (JAX's persistent cache alone still traces
    and lowers every program to find its key, which for the PDM scorer costs about as much as
    scoring a file).

    Lives beside the persistent cache (``<cache dir>/jax_drive_executables``); off (plain
    ``jit`` calls) when the persistent cache is off. The key hashes the program's name, its
    static arguments, the shapes / dtypes / tree of its arguments, the JAX and jaxlib versions,
    the backend and devices, ``XLA_FLAGS`` and the jax_drive sources. Files are written
    atomically (a temp file, then ``os.replace``), so concurrent processes never read half a
    file; at most ``max_files`` are kept (least recently used go first). Loaded executables
    are kept in this object for its lifetime.
    """

    def __init__(self, directory: str | os.PathLike | None = None, max_files: int = 64):
        if directory is None and not opted_out():
            jax = sys.modules.get("jax")
            configured = jax.config.jax_compilation_cache_dir if jax is not None else None
            directory = configured or os.environ.get("JAX_COMPILATION_CACHE_DIR")
        self.directory = None if directory is None or opted_out() else Path(directory) / "jax_drive_executables"
        self.max_files = max_files
        self.loaded: dict[str, object] = {}
        self.hits = 0
        self.misses = 0
        self.seconds = 0.0
        self._fingerprint: str | None = None

    def key(self, name: str, args: tuple, static: dict) -> str:
        import hashlib

        import jax
        import jaxlib

        if self._fingerprint is None:
            self._fingerprint = _source_fingerprint()
        leaves, tree = jax.tree_util.tree_flatten(args)
        parts = [name, repr(sorted(static.items())), str(tree),
                 repr([(tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x).__name__))) for x in leaves]),
                 jax.__version__, jaxlib.__version__, jax.default_backend(),
                 repr([d.device_kind for d in jax.devices()]),
                 os.environ.get("XLA_FLAGS", ""), repr(jax.config.jax_enable_x64), self._fingerprint]
        return f"{name}-{hashlib.sha256(chr(0).join(parts).encode()).hexdigest()[:32]}"

    def get(self, name: str, jitted, args: tuple, static: dict):
        """A callable for ``jitted(*args, **static)`` taking ``args`` only: loaded from the
        store, or compiled (through JAX's persistent cache) and stored."""
        if self.directory is None:
            return lambda *a: jitted(*a, **static)
        import pickle
        import time

        from jax.experimental.serialize_executable import deserialize_and_load, serialize

        key = self.key(name, args, static)
        if key in self.loaded:
            return self.loaded[key]
        start = time.perf_counter()
        path = self.directory / f"{key}.bin"
        compiled = None
        if path.is_file():
            try:
                payload, in_tree, out_tree = pickle.loads(path.read_bytes())
                compiled = deserialize_and_load(payload, in_tree, out_tree)
                os.utime(path)
                self.hits += 1
            except Exception:  # a stale or damaged entry: compile afresh
                compiled = None
        if compiled is None:
            import jax

            # Compiled here, not loaded from JAX's cache: an XLA:CPU executable that JAX
            # loaded from its cache serialises without its kernels and fails once reloaded.
            enabled = jax.config.jax_enable_compilation_cache
            jax.config.update("jax_enable_compilation_cache", False)
            try:
                compiled = jitted.lower(*args, **static).compile()
            finally:
                jax.config.update("jax_enable_compilation_cache", enabled)
            self.misses += 1
            try:
                data = pickle.dumps(serialize(compiled))
            except Exception:  # not every executable serialises: it is then compiled each time
                data = None
            if data is not None:
                self._store(path, data)
        self.seconds += time.perf_counter() - start
        self.loaded[key] = compiled
        return compiled

    def _store(self, path: Path, data: bytes) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            files = sorted(path.parent.glob("*.bin"), key=lambda p: p.stat().st_mtime)
            for old in files[: max(len(files) - self.max_files, 0)]:
                old.unlink(missing_ok=True)
        except OSError:  # a read-only or full cache directory only costs the next start
            pass
