"""Refusals of ``jax-drive serve`` and OpenAI's error layout. Standard library only, so the
limits and the `jax-drive serve` parser can use it without loading the model stack."""

from __future__ import annotations

BAD_REQUEST = 400
FORBIDDEN = 403
NOT_FOUND = 404
REQUEST_TIMEOUT = 408
REQUEST_TOO_LARGE = 413
TOO_MANY_REQUESTS = 429


class InvalidRequest(ValueError):
    """A request the server refuses (HTTP 400 unless ``status`` says otherwise)."""

    def __init__(self, message: str, param: str | None = None, status: int = BAD_REQUEST,
                 code: str | None = None):
        super().__init__(message)
        self.param = param
        self.status = status
        self.code = code


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error layout."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
