"""Real HTTP servers as pytest fixtures: llama.cpp's OpenAI-compatible server
(llama-cpp-python) serving the embedded SmolLM2 GGUF on 127.0.0.1, started in its own
process group and stopped at the end (SIGTERM to the group, then SIGKILL).

Imported by conftest.py, so the fixtures are visible to every test module.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

from jax_drive.serve.launch import (  # noqa: F401 - re-exported for the tests
    LLAMA_CPP_MODEL_NAME,
    RunningServer,
    free_port,
    llama_cpp_command,
    server_process,
)


@pytest.fixture(scope="session")
def llama_cpp_server() -> Iterator[RunningServer]:
    """llama.cpp's OpenAI-compatible server (llama-cpp-python, installed by `make test`)
    serving the embedded SmolLM2-135M-Instruct GGUF on 127.0.0.1, one thread."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        pytest.fail("llama-cpp-python[server] is not installed: run `make install` "
                    "(requirements-test.txt pins it; see the Makefile for the build flags)")
    from jax_drive.models.loading import smollm2_gguf_path

    port = free_port()
    command = llama_cpp_command(str(smollm2_gguf_path()), port)
    with server_process(command, port, LLAMA_CPP_MODEL_NAME, "llama-cpp-server") as server:
        yield server



@contextlib.contextmanager
def inprocess_server(server) -> Iterator[str]:
    """Serves a ``jax_drive.serve.PolicyServer`` with uvicorn on 127.0.0.1 in a thread;
    yields its root URL."""
    import uvicorn

    from jax_drive.serve import create_app

    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(create_app(server), host="127.0.0.1", port=port,
                                       log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        uv.should_exit = True
        thread.join(timeout=30)
