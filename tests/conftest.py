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

# The suite is compile-bound (tiny shapes: ~80 % of a test file's time is XLA:CPU compiling),
# and most of a compilation is LLVM optimising the generated code. Tests compile without LLVM
# optimisation (-O0: ~40 % less compile time; the same operations run slower, and float results
# may differ in the last bits; subprocesses and Ray workers inherit it through the environment). The library is unchanged; to run the suite
# with XLA's default optimisation, set JAX_DRIVE_TEST_FULL_OPT=1.
TEST_XLA_FLAG = "--xla_backend_optimization_level=0"
_xla_flags = os.environ.get("XLA_FLAGS", "")
if os.environ.get("JAX_DRIVE_TEST_FULL_OPT") != "1" and "xla_backend_optimization_level" not in _xla_flags:
    os.environ["XLA_FLAGS"] = f"{_xla_flags} {TEST_XLA_FLAG}".strip()

import gc  # noqa: E402
import shutil  # noqa: E402

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("ci")

import jax  # noqa: E402

from jax_drive.compile_cache import enable_compile_cache  # noqa: E402

# A persistent XLA compilation cache for this run only: a fresh temp dir made by the
# controlling pytest process (inherited by xdist workers, pipeline subprocesses and Ray
# workers through the environment) and deleted when the run ends, so CI starts cold. It
# lets a program compiled by one test file be loaded, not compiled again, by another file
# or worker. JAX_COMPILATION_CACHE_DIR=DIR instead keeps a cache across runs. A size limit
# turns on JAX's file lock, so no process reads an entry mid-write.
RUN_CACHE = None
if not os.environ.get("JAX_COMPILATION_CACHE_DIR") and "PYTEST_XDIST_WORKER" not in os.environ:
    RUN_CACHE = tempfile.mkdtemp(prefix="jax_drive_xla_run_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = RUN_CACHE
XLA_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"]
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))
os.environ.pop("JAX_DRIVE_NO_COMPILE_CACHE", None)  # the run cache is the suite's own, never the user's
enable_compile_cache(XLA_CACHE, min_compile_seconds=1.0)


def pytest_unconfigure(config):
    if RUN_CACHE is not None:
        shutil.rmtree(RUN_CACHE, ignore_errors=True)


# Real servers (llama.cpp's OpenAI-compatible server) as session fixtures: see servers.py.
from servers import llama_cpp_server  # noqa: E402,F401


def _mapping_count() -> int:
    """Memory mappings of this process (a large number where /proc is unavailable)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 1 << 30


def _mapping_limit() -> int:
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return 65530


# A third of the limit: the heaviest test file adds ~20,600 mappings on top.
MAPPING_BUDGET = _mapping_limit() // 3


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Frees every compiled XLA program after a test file once the process holds many.

    Each XLA:CPU executable keeps tens of memory mappings of JIT code until its jit cache
    entry goes, and jit caches live as long as the process. An xdist worker that ran half
    the suite reached Linux's per-process limit (vm.max_map_count, 65,530) and then
    segfaulted inside XLA's compiler or cache loader in whatever test came next. Dropping
    the caches when a file leaves the process above ``MAPPING_BUDGET`` keeps it far below
    the limit, while files that share programs (same functions and shapes) still reuse them.
    """
    yield
    if _mapping_count() > MAPPING_BUDGET:
        jax.clear_caches()
        gc.collect()


MULTIDEVICE = Path(__file__).parent / "multidevice"
MULTIPROCESS = Path(__file__).parent / "multiprocess"


def pytest_ignore_collect(collection_path, config):
    """tests/multidevice and tests/multiprocess need their own process (8 simulated devices,
    set before JAX starts): each is collected only when named on the command line
    (``pytest tests/multidevice``, ``pytest tests/multiprocess``)."""
    for own in (MULTIDEVICE, MULTIPROCESS):
        if collection_path == own:
            named = any(Path(arg.split("::")[0]).resolve().is_relative_to(own) for arg in config.args)
            return None if named else True
    return None
