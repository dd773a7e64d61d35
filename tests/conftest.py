"""Shared test setup: CPU JAX, deterministic hypothesis profile."""

import os
import tempfile
import uuid
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# matplotlib writes a font cache under ~/.config or ~/.cache unless told otherwise
os.environ.setdefault("MPLCONFIGDIR", os.path.join(tempfile.gettempdir(), "jax_drive_mpl"))
# a local Ray cluster turns on token auth and saves a new token in ~/.ray unless one is given
os.environ.setdefault("RAY_AUTH_TOKEN", uuid.uuid4().hex)

import gc  # noqa: E402

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("ci")

import jax  # noqa: E402

# No persistent XLA compilation cache by default (a cold CI run gains nothing from it).
# JAX_COMPILATION_CACHE_DIR=DIR opts in (it is carried to subprocesses and Ray workers);
# a size limit then turns on JAX's file lock, so no process reads an entry mid-write.
XLA_CACHE = os.environ.get("JAX_COMPILATION_CACHE_DIR") or None
if XLA_CACHE:
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))
    jax.config.update("jax_compilation_cache_dir", XLA_CACHE)
    jax.config.update("jax_compilation_cache_max_size", int(os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"]))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)

# Real servers (llama.cpp's OpenAI-compatible server) as session fixtures: see servers.py.
from servers import llama_cpp_server  # noqa: E402,F401


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Frees every compiled XLA program after each test file.

    Each XLA:CPU executable keeps tens of memory mappings of JIT code until its jit cache
    entry goes, and jit caches live as long as the process. An xdist worker that runs half
    the suite reached Linux's per-process limit (vm.max_map_count, 65,530) and then
    segfaulted inside XLA's compiler or cache loader in whatever test came next; dropping the
    caches per file keeps a worker near the count of one file's programs.
    """
    yield
    jax.clear_caches()
    gc.collect()


MULTIDEVICE = Path(__file__).parent / "multidevice"


def pytest_ignore_collect(collection_path, config):
    """tests/multidevice needs its own process (8 simulated devices, set before JAX starts):
    it is collected only when named on the command line (``pytest tests/multidevice``)."""
    if collection_path != MULTIDEVICE:
        return None
    named = any(Path(arg.split("::")[0]).resolve().is_relative_to(MULTIDEVICE) for arg in config.args)
    return None if named else True
