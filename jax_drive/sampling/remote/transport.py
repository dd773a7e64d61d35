"""HTTP transport with retries for the OpenAI-compatible engine.

HTTP 429 / 502 / 503 / 504 and connection errors (refused, reset, connect timeout) are
retried with exponential backoff; everything else fails at once with the server's message
(400 / 422 validation errors, and llama.cpp's validation errors, which it answers as HTTP
500). A read timeout is not retried (the server may still be generating).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from jax_drive.sampling.remote.errors import OpenAIEngineError

# (method, url, body or None, headers, timeout_s) -> (HTTP status, response body bytes)
Transport = Callable[[str, str, "bytes | None", dict, float], "tuple[int, bytes]"]

RETRY_STATUSES = frozenset({429, 502, 503, 504})


def urllib_transport(
    method: str, url: str, body: bytes | None, headers: dict, timeout_s: float
) -> tuple[int, bytes]:
    """Sends one HTTP request with the standard library; returns (status, body).

    HTTP error statuses are returned, not raised; network failures raise OSError
    (``urllib.error.URLError`` for connection failures, ``TimeoutError`` for a read
    timeout) or ``http.client.HTTPException``.
    """
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read() or b""


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """timeout_s: per attempt; max_retries: attempts after the first for retryable failures;
    backoff_s: the wait before retry i is ``backoff_s * 2 ** (i - 1)``."""

    timeout_s: float = 120.0
    max_retries: int = 3
    backoff_s: float = 0.5

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.max_retries < 0 or self.backoff_s < 0:
            raise ValueError("timeout_s must be > 0, max_retries and backoff_s >= 0")


def error_message(body: bytes) -> str:
    """The message of an error answer (OpenAI's ``error.message``, FastAPI's ``detail``, or
    the start of the body)."""
    try:
        data = json.loads(body)
        err = data.get("error", data.get("detail", data)) if isinstance(data, dict) else data
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    except (ValueError, UnicodeDecodeError):
        return body[:500].decode("utf-8", "replace")


def is_validation_500(message: str) -> bool:
    """llama-cpp-python answers request-validation failures as HTTP 500."""
    return "validation error" in message.lower()


def send(transport: Transport, method: str, url: str, payload: dict | None, headers: dict,
         policy: RetryPolicy, expect_json: bool = True) -> Any:
    """Sends one JSON request with retries; returns the decoded JSON answer (the text of a
    2xx answer when ``expect_json`` is False).

    Raises:
      OpenAIEngineError: a non-retryable status (with the server's message), a read
        timeout, retries exhausted, or a non-JSON body.
    """
    body = None if payload is None else json.dumps(payload).encode("utf-8")
    last = ""
    status: int | None = None
    for attempt in range(policy.max_retries + 1):
        if attempt:
            time.sleep(policy.backoff_s * 2 ** (attempt - 1))
        try:
            status, raw = transport(method, url, body, headers, policy.timeout_s)
        except (urllib.error.URLError, ConnectionError, http.client.HTTPException) as error:
            status, last = None, f"{type(error).__name__}: {error}"  # connection: retry
            continue
        except TimeoutError as error:
            raise OpenAIEngineError(
                f"{method} {url}: no answer within {policy.timeout_s:g} s ({error}); not "
                "retried, the server may still be working on it: raise timeout_s"
            ) from None
        if 200 <= status < 300:
            return _decoded(raw, method, url, status, expect_json)
        message = error_message(raw)
        last = f"HTTP {status}: {message}"
        if status not in RETRY_STATUSES:
            if status in (400, 422) or (status == 500 and is_validation_500(message)):
                raise OpenAIEngineError(
                    f"{method} {url}: the server rejected the request as invalid ({last})", status
                )
            raise OpenAIEngineError(f"{method} {url} failed: {last}", status)
    raise OpenAIEngineError(
        f"{method} {url} failed after {policy.max_retries + 1} attempts: {last}", status
    )


def _decoded(raw: bytes, method: str, url: str, status: int, expect_json: bool) -> Any:
    if not expect_json:
        return raw.decode("utf-8", "replace")
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        raise OpenAIEngineError(f"{method} {url}: answer is not JSON: {raw[:200]!r}", status) from None
