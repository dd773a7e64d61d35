"""Helpers of the `jax-drive serve` hardening tests (test_serve_*.py): an engine whose calls
the test holds and releases (ordering without timing), a registry over it, and raw HTTP
requests for what the `openai` client will not send (bad headers, partial bodies, hang-ups)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from urllib.parse import urlsplit

from flax import nnx

from jax_drive.models import CausalLM, ModelConfig
from jax_drive.models.tiny import byte_tokenizer
from jax_drive.sampling import Completion
from jax_drive.serve import PolicyRegistry

KEY = "test-hardening-key"
WAIT_S = 60.0  # how long a test waits for an event before failing (never reached when it works)


class HeldEngine:
    """An engine that answers every row with one token (the row's length) and, while
    ``hold`` is set, blocks each call until the test calls ``release()``; ``entered`` is set
    when a call starts. Records the rows of every call."""

    def __init__(self, hold: bool = False, fail_with: BaseException | None = None):
        self.calls: list[list[list[int]]] = []
        self.entered = threading.Event()
        self._gate = threading.Event()
        if not hold:
            self._gate.set()
        self.fail_with = fail_with

    def release(self) -> None:
        self._gate.set()

    def generate(self, prompts, params, key):
        self.calls.append([list(p) for p in prompts])
        self.entered.set()
        if not self._gate.wait(WAIT_S):
            raise RuntimeError("the test never released the engine")
        if self.fail_with is not None:
            raise self.fail_with
        return [Completion(tuple(p), (len(p) % 256,), chr(len(p) % 256), (-0.5,), "length") for p in prompts]

    def rows(self) -> list[list[int]]:
        return [row for call in self.calls for row in call]


def tiny_registry(engine, name: str = "m", max_loras: int = 2) -> PolicyRegistry:
    """A registry over a tiny random model and the byte tokenizer, every engine ``engine``."""
    model = CausalLM(ModelConfig.tiny("llama", vocab_size=259, tie_embeddings=False), rngs=nnx.Rngs(0))
    return PolicyRegistry(model, byte_tokenizer(), name, max_loras=max_loras, engine_factory=lambda m: engine)


def raw_request(url: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float = WAIT_S) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one HTTP request sent with http.client."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def post_json(url: str, path: str, payload, key: str | None = KEY) -> tuple[int, dict]:
    """(status, decoded JSON body) of a POST with the API key."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    status, _, raw = raw_request(url, "POST", path, body, headers)
    return status, json.loads(raw) if raw else {}


def send_and_hang_up(url: str, path: str, body: bytes, key: str | None = KEY, declared: int | None = None,
                     before_close=None) -> None:
    """Sends a POST (headers, then ``body``, which may be shorter than ``declared``), calls
    ``before_close()`` if given, and closes the connection without reading the answer."""
    parts = urlsplit(url)
    head = (f"POST {path} HTTP/1.1\r\nHost: {parts.hostname}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) if declared is None else declared}\r\n")
    if key is not None:
        head += f"Authorization: Bearer {key}\r\n"
    with socket.create_connection((parts.hostname, parts.port), timeout=WAIT_S) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        if before_close is not None:
            before_close()


def wait_for(condition, what: str, timeout_s: float = WAIT_S) -> None:
    """Polls ``condition()`` until true; fails naming ``what`` after ``timeout_s`` (a guard
    against hangs, not a timing check)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
