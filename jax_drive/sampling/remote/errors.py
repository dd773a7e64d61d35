"""Errors of the OpenAI-compatible engine."""

from __future__ import annotations


class OpenAIEngineError(RuntimeError):
    """A request to the OpenAI-compatible server failed or its answer was unusable."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class UnsupportedParameterError(OpenAIEngineError, ValueError):
    """The server cannot honour a sampling parameter or feature that was asked for."""
