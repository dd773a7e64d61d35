"""Per-request limits of ``jax-drive serve`` and the answers that enforce them. Standard library
only (the `jax-drive serve` parser reads the defaults from here).

Each limit is a ``jax-drive serve`` flag; ``None`` turns it off. The defaults bound what one
request can cost the single batching thread and the host's memory while leaving room for
every request our own clients send (``OpenAIEngine``: one row per request):

==================  ==========  ==========================================================
limit               default     answer when exceeded
==================  ==========  ==========================================================
max_body_bytes      1 MiB       413 before the body is parsed (nginx's default body cap)
max_request_rows    128         400: prompts x n per request (OpenAI's own cap on ``n``)
max_prompt_tokens   65,536      400: prompt tokens x n (``usage.prompt_tokens``) per request
max_tokens          2,048       400: the ``max_tokens`` a request may ask for
request_timeout_s   600 s       408: wall time from arrival to answer (llama.cpp's --timeout)
==================  ==========  ==========================================================

The bound on queued rows (429 with ``Retry-After``; default ``DEFAULT_MAX_QUEUED_ROWS``)
belongs to the batcher (``BatcherConfig.max_queued_rows``).
"""

from __future__ import annotations

import dataclasses
import math

from jax_drive.serve.errors import REQUEST_TIMEOUT, REQUEST_TOO_LARGE, InvalidRequest

DEFAULT_MAX_QUEUED_ROWS = 256  # 8 batches of the default 32 rows waiting at most


@dataclasses.dataclass(frozen=True)
class ServeLimits:
    """What one request may ask for (None: no limit). See the module docstring.

    Attributes:
      max_body_bytes: request body size in bytes.
      max_request_rows: completion rows per request (prompts x n).
      max_prompt_tokens: prompt tokens per request, each prompt counted n times.
      max_tokens: largest ``max_tokens`` / ``max_completion_tokens`` of a request.
      request_timeout_s: seconds from a request's arrival to its answer.
    """

    max_body_bytes: int | None = 1 << 20
    max_request_rows: int | None = 128
    max_prompt_tokens: int | None = 65_536
    max_tokens: int | None = 2048
    request_timeout_s: float | None = 600.0

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{field.name} must be a finite number > 0 or None, got {value!r}")

    def check_settings(self, max_queued_rows: int | None, default_max_tokens: int) -> None:
        """Raises ValueError (naming the `jax-drive serve` flags) when the server's other
        settings contradict these limits: a request within them could never be queued, or a
        request without ``max_tokens`` would be refused."""
        rows = self.max_request_rows
        if max_queued_rows is not None and (rows is None or rows > max_queued_rows):
            raise ValueError(f"--max-request-rows ({rows or 'off'}) must be <= --max-queued-rows "
                             f"({max_queued_rows}): a larger request could never be queued")
        if self.max_tokens is not None and default_max_tokens > self.max_tokens:
            raise ValueError(f"--default-max-tokens ({default_max_tokens}) must be <= "
                             f"--max-tokens-limit ({self.max_tokens})")

    @classmethod
    def off(cls) -> "ServeLimits":
        """No limit at all (the server's behaviour before limits existed)."""
        return cls(**{f.name: None for f in dataclasses.fields(cls)})

    # ------------------------------------------------------------------- checks
    def check_body(self, size: int) -> None:
        """413 when a body of ``size`` bytes (so far, or announced) exceeds the limit."""
        if self.max_body_bytes is not None and size > self.max_body_bytes:
            raise InvalidRequest(
                f"the request body exceeds this server's limit of {self.max_body_bytes} bytes "
                "(--max-body-bytes)", status=REQUEST_TOO_LARGE, code="request_too_large")

    def check_rows(self, prompts: int, n: int) -> None:
        """400 when prompts x n exceeds ``max_request_rows``."""
        rows = prompts * n
        if self.max_request_rows is not None and rows > self.max_request_rows:
            raise InvalidRequest(
                f"this request asks for {rows} completions ({prompts} prompt(s) x n={n}); this "
                f"server allows at most {self.max_request_rows} per request (--max-request-rows)",
                "n" if prompts == 1 else "prompt", code="too_many_rows")

    def check_max_tokens(self, max_tokens: int) -> None:
        """400 when a request asks for more than ``max_tokens`` new tokens."""
        if self.max_tokens is not None and max_tokens > self.max_tokens:
            raise InvalidRequest(
                f"max_tokens is {max_tokens}; this server allows at most {self.max_tokens} "
                "(--max-tokens-limit)", "max_tokens", code="max_tokens_too_large")

    def check_prompt_tokens(self, tokens: int) -> None:
        """400 when the prompt tokens counted so far (x n) exceed ``max_prompt_tokens``
        (called while encoding, so a huge prompt list stops early)."""
        if self.max_prompt_tokens is not None and tokens > self.max_prompt_tokens:
            raise InvalidRequest(
                f"this request's prompts hold more than {self.max_prompt_tokens} tokens (each "
                "prompt counted n times; --max-prompt-tokens)", "prompt", code="too_many_prompt_tokens")


def timeout_error(seconds: float) -> InvalidRequest:
    """408: the request was not answered within ``request_timeout_s``."""
    return InvalidRequest(
        f"the request was not answered within this server's limit of {seconds:g} s "
        "(--request-timeout); send fewer rows or tokens, or retry later",
        status=REQUEST_TIMEOUT, code="request_timeout")
