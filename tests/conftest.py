"""Shared test setup: CPU JAX, deterministic hypothesis profile."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hypothesis import settings  # noqa: E402

settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("ci")

import jax  # noqa: E402

# Persist XLA executables between test processes: compilation dominates this suite on a
# 2-core CPU, and a compiled program is keyed by its exact HLO, so reuse is always exact.
jax.config.update("jax_compilation_cache_dir", os.path.expanduser("~/.cache/jax_drive_xla"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)

# Real servers (llama.cpp's OpenAI-compatible server) as session fixtures: see servers.py.
from servers import llama_cpp_server  # noqa: E402,F401
