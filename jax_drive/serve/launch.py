"""Start and stop OpenAI-compatible servers as subprocesses (loopback, own process group):
llama.cpp's server from llama-cpp-python, or ``jax-drive serve``. Used by the tests'
fixtures and ``experiments/bench_serve.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence

LLAMA_CPP_MODEL_NAME = "smollm2-135m-instruct"
STARTUP_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class RunningServer:
    """A started server: its root URL (no /v1), the served model name and its log file."""

    base_url: str
    model: str
    log_path: str
    pid: int


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _log_tail(path: str, chars: int = 3000) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - chars))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"


def wait_until_ready(process: subprocess.Popen, url: str, timeout_s: float, log_path: str,
                     api_key: str | None = None) -> None:
    """Polls GET url (with ``api_key`` as a bearer token when given) until it answers 200;
    fails if the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"server exited with code {process.returncode} before answering {url}:\n"
                f"{_log_tail(log_path)}"
            )
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2.0) as answer:
                if answer.status == 200:
                    json.loads(answer.read())
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"server did not answer {url} within {timeout_s:.0f} s:\n{_log_tail(log_path)}")


def stop_process_group(process: subprocess.Popen) -> None:
    """SIGTERM to the process group, SIGKILL if it is still alive after STOP_TIMEOUT_S."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_TIMEOUT_S)


@contextlib.contextmanager
def server_process(
    command: Sequence[str], port: int, model: str, name: str,
    timeout_s: float = STARTUP_TIMEOUT_S, env: dict | None = None, api_key: str | None = None,
) -> Iterator[RunningServer]:
    """Runs ``command`` (which must serve http://127.0.0.1:port/v1/models, with ``api_key``
    when given) while in the block."""
    log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)
    process = subprocess.Popen(
        list(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, env=env,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(process, base_url + "/v1/models", timeout_s, log.name, api_key)
        yield RunningServer(base_url, model, log.name, process.pid)
    finally:
        stop_process_group(process)
        log.close()


def llama_cpp_command(gguf_path: str, port: int, threads: int = 1) -> list[str]:
    """llama-cpp-python's server on loopback serving ``gguf_path`` as LLAMA_CPP_MODEL_NAME."""
    return [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(gguf_path),
        "--model_alias", LLAMA_CPP_MODEL_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", "2048",
        "--n_threads", str(threads),
        "--n_threads_batch", str(threads),
        "--logits_all", "True",
        "--interrupt_requests", "False",
        "--verbose", "False",
    ]
