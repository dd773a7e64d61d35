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
