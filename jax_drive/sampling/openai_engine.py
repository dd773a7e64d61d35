"""``OpenAIEngine``: the ``Engine`` interface over an OpenAI-compatible HTTP server.

Servers differ in what they accept and return, so the engine first learns which *dialect*
it talks to (from ``GET /v1/models``: vLLM's entries are ``owned_by: "vllm"``,
llama-cpp-python's ``"me"``, ``jax-drive serve``'s ``"jax-drive"``; anything else is treated
as a plain OpenAI server) and then:

- sends token-id prompts where the server accepts them (vLLM, jax-drive), otherwise text
  (token-id prompts are decoded with the local tokenizer, special tokens kept);
- sends one request per completion row (prompt x sample), each with its own seed from the
  caller's key: a server that ignores ``n`` (llama.cpp) still yields ``n`` samples, and the
  G rollouts of a group never share a seed (vLLM seeds every prompt of a request alike,
  which would make identical prompts sample identical completions);
- always sends neutral values for the sampling knobs ``SamplingParams`` has no field for
  (``min_p`` 0, repetition penalty 1, presence/frequency penalty 0, mirostat off, and
  ``top_k`` 0 when unset) so server defaults (llama.cpp: top_k 40, min_p 0.05, repeat
  penalty 1.1) or a model's ``generation_config.json`` cannot change the distribution;
- refuses, with ``UnsupportedParameterError``, what the server cannot honour: ``top_k`` /
  ``min_new_tokens`` on a plain OpenAI server, ``stop_token_ids`` other than the model's
  EOS on llama.cpp, and a ``logprobs_mode`` that differs from the server's (vLLM fixes it
  per server with ``--logprobs-mode``: declare it with ``server_logprobs_mode``; llama.cpp
  reports raw log-probs; jax-drive serve takes it per request). ``processed`` on a raw-only
  server is accepted only where the two coincide (temperature 1, no top-k/top-p, no
  minimum length). ``skip_special_tokens`` is honoured by vLLM and jax-drive; llama.cpp's
  text never has special tokens.
- recovers generated token ids when the server reports only token texts (llama.cpp keys
  log-probs by token text): each text is mapped to the vocabulary id that prints it
  (``TokenPieces``: exact when no token ends inside a UTF-8 character, "pieces");
  otherwise the completion text is re-tokenized with the local tokenizer ("retokenized":
  not guaranteed to be the sampled ids, log-probs unavailable). Where ids
  came from and whether the log-probs belong to them is in ``Completion.metadata``
  (a ``RemoteMetadata``).
  With ``require_token_logprobs=True`` (RL training) any completion whose ids or log-probs
  are not exact raises instead.

Failures: HTTP 429 / 502 / 503 / 504 and connection errors (refused, reset, connect
timeout) are retried with exponential backoff; everything else fails at once with the
server's message (400 / 422 validation errors, and llama.cpp's validation errors, which it
answers as HTTP 500). A read timeout is not retried (the server may still be generating).
An unknown model name is an error (llama.cpp would silently serve its default model).

The pure functions (``build_completion_request``, ``parse_completion_choice``, ...) hold the
protocol logic; ``OpenAIEngine`` adds HTTP, concurrency, retries and the checks.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http.client
import json
import math
import re
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import jax

from jax_drive.sampling.engine import (
    Completion,
    Message,
    Prompt,
    validate_conversations,
    validate_prompts,
)
from jax_drive.sampling.params import SamplingParams

# (method, url, body or None, headers, timeout_s) -> (HTTP status, response body bytes)
Transport = Callable[[str, str, "bytes | None", dict, float], "tuple[int, bytes]"]

RETRY_STATUSES = frozenset({429, 502, 503, 504})
_TOKEN_ID_RE = re.compile(r"^token_id:(\d+)$")
_SEED_MODULUS = 2**31 - 1  # prime, so seeds base + i * step are distinct for i < modulus
_SEED_STEP = 0x9E3779B1


class OpenAIEngineError(RuntimeError):
    """A request to the OpenAI-compatible server failed or its answer was unusable."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class UnsupportedParameterError(OpenAIEngineError, ValueError):
    """The server cannot honour a sampling parameter or feature that was asked for."""


# ------------------------------------------------------------------------------ dialects
@dataclasses.dataclass(frozen=True)
class ServerDialect:
    """What one kind of OpenAI-compatible server accepts and returns.

    Attributes:
      name: 'vllm', 'llama.cpp', 'jax-drive' or 'openai' (any other server).
      token_id_prompts: ``prompt`` may be a list of token ids.
      returns_token_ids: answers carry the generated ids (vLLM's ``return_token_ids`` /
        ``return_tokens_as_token_ids``, jax-drive's ``token_ids``).
      logprobs_per_request: the ``logprobs_mode`` field selects raw / processed per request.
      stop_token_ids: ``stop_token_ids`` + ``ignore_eos`` are honoured.
      min_tokens: ``min_tokens`` is honoured.
      top_k: ``top_k`` is honoured.
      vllm_fields: send vLLM's ``return_token_ids`` and ``return_tokens_as_token_ids``.
      skip_special_tokens: ``skip_special_tokens`` is honoured (else the text is the
        server's; llama.cpp never prints special tokens).
      neutral: fields sent on every request so server defaults cannot filter or penalise.
      lora_endpoints: ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` may exist.
      prompt_logprobs: the completions endpoint accepts ``prompt_logprobs``.
      stop_token_in_output: a stop token that ended a completion is part of its ids.
    """

    name: str
    token_id_prompts: bool
    returns_token_ids: bool
    logprobs_per_request: bool
    stop_token_ids: bool
    min_tokens: bool
    top_k: bool
    vllm_fields: bool
    skip_special_tokens: bool
    neutral: Mapping[str, Any]
    lora_endpoints: bool
    prompt_logprobs: bool
    stop_token_in_output: bool


_PENALTIES_OFF = {"presence_penalty": 0.0, "frequency_penalty": 0.0}
DIALECTS: dict[str, ServerDialect] = {
    "vllm": ServerDialect(
        "vllm", True, True, False, True, True, True, True, True,
        {"min_p": 0.0, "repetition_penalty": 1.0, **_PENALTIES_OFF}, True, True, True,
    ),
    "jax-drive": ServerDialect(
        "jax-drive", True, True, True, True, True, True, False, True,
        {"min_p": 0.0, "repetition_penalty": 1.0, **_PENALTIES_OFF}, True, False, True,
    ),
    # llama-cpp-python's server: text prompts only, log-probs keyed by token text, raw
    # log-probs, EOS never part of the output, n ignored, unknown fields ignored silently.
    "llama.cpp": ServerDialect(
        "llama.cpp", False, False, False, False, True, True, False, False,
        {"min_p": 0.0, "repeat_penalty": 1.0, "mirostat_mode": 0, **_PENALTIES_OFF},
        False, False, False,
    ),
    "openai": ServerDialect(
        "openai", False, False, False, False, False, False, False, False, dict(_PENALTIES_OFF),
        False, False, False,
    ),
}
_OWNED_BY = {"vllm": "vllm", "me": "llama.cpp", "jax-drive": "jax-drive"}


def dialect_from_models(answer: Any) -> ServerDialect:
    """The dialect of a server from its ``GET /v1/models`` answer (``owned_by`` field)."""
    owners = set()
    for entry in (answer or {}).get("data") or []:
        if isinstance(entry, dict):
            owners.add(entry.get("owned_by"))
    for owner in owners:
        if owner in _OWNED_BY:
            return DIALECTS[_OWNED_BY[owner]]
    return DIALECTS["openai"]


# ------------------------------------------------------------------------- completions
@dataclasses.dataclass(frozen=True)
class RemoteMetadata:
    """Where a remote completion's ids and log-probs came from.

    Attributes:
      server: dialect name.
      token_ids_source: 'server' (reported by the server), 'pieces' (each returned token
        text mapped to its unique vocabulary id: exact), 'retokenized' (the text encoded
        with the local tokenizer: possibly not the sampled ids) or 'none' (no tokenizer).
      logprobs_source: 'server' (the sampled tokens' log-probs, aligned with the ids) or
        'none' (unavailable: ``logprobs`` holds NaN).
      logprobs_mode: 'raw' / 'processed' as the server computed them, None if unavailable.
      stop_token_included: a stop token that ended the completion is the last id (False
        on llama.cpp, which never returns it).
      prompt_tokens_match: the server saw the prompt as our token ids (True), saw a
        different count of tokens (False), or we cannot tell (None).
      seed: the seed sent with the request.
    """

    server: str
    token_ids_source: Literal["server", "pieces", "retokenized", "none"]
    logprobs_source: Literal["server", "none"]
    logprobs_mode: str | None
    stop_token_included: bool
    prompt_tokens_match: bool | None
    seed: int | None

    @property
    def exact(self) -> bool:
        """Ids are the sampled ids and log-probs are theirs: usable for training."""
        return (
            self.token_ids_source in ("server", "pieces")
            and self.logprobs_source == "server"
            and self.prompt_tokens_match is not False
        )


# ------------------------------------------------------------------ protocol (pure)
def normalize_base_url(base_url: str) -> str:
    """'http://host:8000', 'http://host:8000/' or 'http://host:8000/v1' -> 'http://host:8000/v1'."""
    if not isinstance(base_url, str) or not re.match(r"^https?://[^/]+", base_url):
        raise ValueError(f"base_url must look like http://host:port, got {base_url!r}")
    url = base_url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def seed_from_key(key: jax.Array) -> int:
    """A non-negative 31-bit integer seed derived from a JAX PRNG key."""
    return int(jax.random.randint(key, (), 0, _SEED_MODULUS))


def row_seeds(key: jax.Array, count: int) -> list[int]:
    """``count`` distinct 31-bit seeds from one key: base + i * step modulo a prime.

    Distinct by construction (step is not a multiple of the prime modulus), so no two
    rows of a call, e.g. the G rollouts of one group, ever share a seed.
    """
    base = seed_from_key(key)
    return [(base + i * _SEED_STEP) % _SEED_MODULUS for i in range(count)]


def logprobs_equivalent(params: SamplingParams) -> bool:
    """Processed log-probs equal raw ones: temperature 1, no top-k/top-p, no minimum length."""
    return (
        params.temperature == 1.0
        and params.top_k == 0
        and params.top_p == 1.0
        and params.min_new_tokens == 0
    )


def check_sampling_params(
    params: SamplingParams,
    dialect: ServerDialect,
    server_logprobs_mode: str,
    eos_token_ids: Sequence[int] | None,
) -> None:
    """Raises ``UnsupportedParameterError`` for what ``dialect`` cannot honour.

    Args:
      params: the request's sampling settings.
      dialect: the server's dialect.
      server_logprobs_mode: the log-prob mode of a server that fixes it ('raw' /
        'processed'); ignored by dialects with per-request modes.
      eos_token_ids: the local tokenizer's EOS ids (None: unknown).
    """
    name = dialect.name
    if params.top_k > 0 and not dialect.top_k:
        raise UnsupportedParameterError(f"the {name} server has no top_k (asked top_k={params.top_k})")
    if params.min_new_tokens > 0 and not dialect.min_tokens:
        raise UnsupportedParameterError(
            f"the {name} server has no min_tokens (asked min_new_tokens={params.min_new_tokens})"
        )
    if params.stop_token_ids is not None and not dialect.stop_token_ids:
        same_as_eos = eos_token_ids is not None and set(params.stop_token_ids) == set(eos_token_ids)
        if not same_as_eos:
            raise UnsupportedParameterError(
                f"the {name} server cannot stop on token ids {params.stop_token_ids}: it stops "
                "on the model's end-of-generation tokens only (use stop_token_ids=None)"
            )
    if not dialect.logprobs_per_request and params.logprobs_mode != server_logprobs_mode:
        if not (params.logprobs_mode == "processed" and logprobs_equivalent(params)):
            raise UnsupportedParameterError(
                f"logprobs_mode={params.logprobs_mode!r} but the {name} server reports "
                f"{server_logprobs_mode!r} log-probs (vLLM: --logprobs-mode; declare it with "
                "OpenAIEngine(server_logprobs_mode=...)); processed and raw coincide only at "
                "temperature 1 without top-k/top-p/min_new_tokens"
            )


def _sampling_fields(params: SamplingParams, seed: int | None, dialect: ServerDialect) -> dict:
    body: dict[str, Any] = dict(dialect.neutral)
    body.update(
        max_tokens=params.max_new_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        n=1,
    )
    if seed is not None:
        body["seed"] = int(seed)
    if dialect.top_k:
        body["top_k"] = params.top_k
    if dialect.min_tokens:
        body["min_tokens"] = params.min_new_tokens
    if dialect.stop_token_ids and params.stop_token_ids is not None:
        # exactly these ids stop generation (the model's own EOS only if listed)
        body["stop_token_ids"] = list(params.stop_token_ids)
        body["ignore_eos"] = True
    if dialect.logprobs_per_request:
        body["logprobs_mode"] = params.logprobs_mode
    if dialect.skip_special_tokens:
        body["skip_special_tokens"] = params.skip_special_tokens
    if dialect.vllm_fields:
        body["return_tokens_as_token_ids"] = True
        body["return_token_ids"] = True
    return body


def build_completion_request(
    prompt: Prompt,
    params: SamplingParams,
    model: str,
    seed: int | None,
    dialect: ServerDialect,
) -> dict:
    """JSON body of a POST /v1/completions for one completion row of one prompt.

    ``prompt`` is text or token ids; ids are only valid for dialects that accept them.
    """
    if isinstance(prompt, str):
        prompt_field: Any = prompt
    else:
        if not dialect.token_id_prompts:
            raise UnsupportedParameterError(f"the {dialect.name} server takes text prompts only")
        prompt_field = [int(t) for t in prompt]
    body = {"model": model, "prompt": prompt_field, "logprobs": 1, "echo": False}
    body.update(_sampling_fields(params, seed, dialect))
    return body


def build_chat_request(
    messages: Sequence[Message],
    params: SamplingParams,
    model: str,
    seed: int | None,
    dialect: ServerDialect,
) -> dict:
    """JSON body of a POST /v1/chat/completions for one completion row of a conversation."""
    body = {
        "model": model,
        "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
        "logprobs": True,
        "top_logprobs": 1,
    }
    body.update(_sampling_fields(params, seed, dialect))
    return body


# ---------------------------------------------------------------- token-text mapping
def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level BPE: the printable character standing for each byte value."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenPieces:
    """Maps the per-token texts a server reports back to vocabulary ids.

    llama.cpp prints each generated token as its bytes decoded as UTF-8 with invalid bytes
    dropped (special tokens as ''). A token whose bytes are valid UTF-8 by themselves prints
    exactly its text, and byte-level BPE gives every byte string one id, so such a "whole"
    piece names one id. When the pieces put together equal the completion text, no token
    ended inside a UTF-8 character (that would drop bytes from the pieces which the text
    keeps), so every piece is a whole token. The one case this cannot see: bytes that never
    form valid UTF-8, which the text drops as well.

    Built once from the local tokenizer (byte-level BPE: each token's exact bytes; other
    tokenizers: their own one-token decode).
    """

    def __init__(self, tokenizer):
        specials: set[int] = set()
        added = getattr(getattr(tokenizer, "backend", None), "get_added_tokens_decoder", None)
        if added is not None:
            specials = {int(i) for i, tok in added().items() if getattr(tok, "special", False)}
        decoder = _byte_decoder()
        whole: dict[str, int | None] = {}
        for idx in range(int(tokenizer.vocab_size)):
            text = None if idx in specials else self._whole_text(tokenizer, idx, decoder)
            if text:
                whole[text] = None if text in whole else idx  # None: two ids print alike
        self._whole = whole

    @staticmethod
    def _whole_text(tokenizer, idx: int, decoder: dict[str, int]) -> str | None:
        """The token's text when its bytes are valid UTF-8 by themselves, else None."""
        token = tokenizer.id_to_token(idx)
        if token is None:
            return None
        if all(c in decoder for c in token):
            try:
                return bytes(decoder[c] for c in token).decode("utf-8")
            except UnicodeDecodeError:
                return None
        text = tokenizer.decode([idx], skip_special_tokens=False)
        return None if "\ufffd" in text else text

    def id_for(self, piece: str) -> int | None:
        """The id of a whole token printed as ``piece`` (None: none or ambiguous)."""
        return self._whole.get(piece)

    def ids_for_pieces(self, pieces: Sequence[str], text: str) -> list[int] | None:
        """Ids of a completion's token texts, or None when they cannot be named exactly."""
        if "".join(pieces) != text:
            return None
        ids = [self.id_for(piece) for piece in pieces]
        return None if any(i is None for i in ids) else ids  # type: ignore[return-value]


def _finish_reason(value: Any, where: str) -> str:
    if value in ("stop", "length"):
        return value
    raise OpenAIEngineError(f"{where}: unexpected finish_reason {value!r}")


def _single_choice(answer: Any, where: str) -> dict:
    if not isinstance(answer, dict):
        raise OpenAIEngineError(f"{where}: answer is not a JSON object")
    if "error" in answer and "choices" not in answer:
        raise OpenAIEngineError(f"{where}: server error: {answer['error']}")
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        got = len(choices) if isinstance(choices, list) else type(choices).__name__
        raise OpenAIEngineError(f"{where}: expected 1 choice, got {got}")
    return choices[0]


def _as_logprob(value: Any, where: str) -> float:
    if value is None:
        return float("nan")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise OpenAIEngineError(f"{where}: log-prob {value!r} is not a number") from None


def _token_id(token: Any) -> int | None:
    if isinstance(token, str):
        m = _TOKEN_ID_RE.match(token)
        if m:
            return int(m.group(1))
    return None


def _recover_ids(
    choice: dict,
    tokens: Sequence[Any],
    logprobs: Sequence[float],
    text: str,
    tokenizer,
    pieces: TokenPieces | None,
    completion_tokens: int | None,
    where: str,
) -> tuple[tuple[int, ...], tuple[float, ...], str, str]:
    """(ids, logprobs, token_ids_source, logprobs_source) for one choice."""
    server_ids = choice.get("token_ids")
    if server_ids is None and tokens:
        parsed = [_token_id(t) for t in tokens]
        if all(i is not None for i in parsed):
            server_ids = parsed
    if server_ids is not None:
        try:
            ids = tuple(int(i) for i in server_ids)
        except (TypeError, ValueError):
            raise OpenAIEngineError(f"{where}: malformed token_ids") from None
        if logprobs and len(logprobs) != len(ids):
            raise OpenAIEngineError(f"{where}: {len(ids)} token ids but {len(logprobs)} log-probs")
        if logprobs:
            return ids, tuple(logprobs), "server", "server"
        return ids, tuple(float("nan") for _ in ids), "server", "none"
    if tokens and len(tokens) != len(logprobs):
        raise OpenAIEngineError(f"{where}: {len(tokens)} tokens but {len(logprobs)} log-probs")
    complete = completion_tokens is None or completion_tokens == len(tokens)
    if tokens and complete and pieces is not None and all(isinstance(t, str) for t in tokens):
        ids = pieces.ids_for_pieces(tokens, text)
        if ids is not None:
            return tuple(ids), tuple(logprobs), "pieces", "server"
    if tokenizer is None:
        return (), (), "none", "none"
    ids = tuple(int(i) for i in tokenizer.encode(text)) if text else ()
    return ids, tuple(float("nan") for _ in ids), "retokenized", "none"


def parse_completion_choice(
    answer: Any,
    *,
    chat: bool,
    dialect: ServerDialect,
    logprobs_mode: str | None,
    prompt_ids: Sequence[int] | None,
    sent_token_ids: bool,
    tokenizer=None,
    pieces: TokenPieces | None = None,
    seed: int | None = None,
) -> Completion:
    """The completion in a one-choice answer of /v1/completions (``chat=False``) or
    /v1/chat/completions (``chat=True``).

    Args:
      answer: decoded JSON body.
      dialect: the server's dialect.
      logprobs_mode: the mode the server computed log-probs in.
      prompt_ids: our token ids of the prompt (None: unknown locally).
      sent_token_ids: the prompt went out as token ids (so the server saw exactly them).
      tokenizer, pieces: local tokenizer and its ``TokenPieces`` to recover ids.
      seed: the request's seed (recorded in the metadata).
    Raises:
      OpenAIEngineError: not one choice, malformed fields, unknown finish reason.
    """
    where = "chat/completions" if chat else "completions"
    choice = _single_choice(answer, where)
    lp = choice.get("logprobs") or {}
    if not isinstance(lp, dict):
        raise OpenAIEngineError(f"{where}: logprobs is not an object")
    if chat:
        content = lp.get("content") or []
        if not all(isinstance(c, dict) for c in content):
            raise OpenAIEngineError(f"{where}: malformed logprobs.content")
        tokens = [c.get("token") for c in content]
        raw_lps = [c.get("logprob") for c in content]
        text = str((choice.get("message") or {}).get("content") or "")
    else:
        tokens = list(lp.get("tokens") or [])
        raw_lps = list(lp.get("token_logprobs") or [])
        text = str(choice.get("text") or "")
    logprobs = [_as_logprob(x, where) for x in raw_lps]
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    completion_tokens = usage.get("completion_tokens")
    ids, lps, ids_source, lp_source = _recover_ids(
        choice, tokens, logprobs, text, tokenizer, pieces,
        int(completion_tokens) if isinstance(completion_tokens, int) else None, where,
    )
    if lp_source == "server" and any(math.isnan(x) for x in lps):
        lp_source = "none"
    server_prompt = choice.get("prompt_token_ids") or answer.get("prompt_token_ids")
    if prompt_ids is not None:
        pids = tuple(int(t) for t in prompt_ids)
        if sent_token_ids:
            match: bool | None = True
        elif server_prompt is not None:
            match = tuple(int(t) for t in server_prompt) == pids
        elif isinstance(usage.get("prompt_tokens"), int):
            match = usage["prompt_tokens"] == len(pids)
        else:
            match = None
    else:
        pids = tuple(int(t) for t in (server_prompt or ()))
        match = None
    finish = _finish_reason(choice.get("finish_reason"), where)
    metadata = RemoteMetadata(
        server=dialect.name,
        token_ids_source=ids_source,
        logprobs_source=lp_source,
        logprobs_mode=logprobs_mode if lp_source == "server" else None,
        stop_token_included=dialect.stop_token_in_output and finish == "stop" and bool(ids),
        prompt_tokens_match=match,
        seed=seed,
    )
    return Completion(pids, ids, text, lps, finish, metadata)


def parse_prompt_logprobs(answer: Any, prompt_ids: Sequence[int]) -> list[float]:
    """Log-probs of prompt tokens 1.. from a vLLM answer with ``prompt_logprobs``
    (entries keyed by token id, the first one None): len(prompt_ids) - 1 floats."""
    choice = _single_choice(answer, "completions")
    entries = choice.get("prompt_logprobs") or answer.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(prompt_ids):
        raise OpenAIEngineError("completions: prompt_logprobs missing or of the wrong length")
    out = []
    for token, entry in zip(list(prompt_ids)[1:], entries[1:]):
        if not isinstance(entry, dict):
            raise OpenAIEngineError("completions: malformed prompt_logprobs entry")
        value = entry.get(str(int(token)), entry.get(f"token_id:{int(token)}"))
        if isinstance(value, dict):
            value = value.get("logprob")
        if value is None:
            raise OpenAIEngineError(f"completions: no prompt log-prob for token {token}")
        out.append(float(value))
    return out


# ---------------------------------------------------------------------------- transport
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


def _error_message(body: bytes) -> str:
    try:
        data = json.loads(body)
        err = data.get("error", data.get("detail", data)) if isinstance(data, dict) else data
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    except (ValueError, UnicodeDecodeError):
        return body[:500].decode("utf-8", "replace")


def _is_validation_500(message: str) -> bool:
    """llama-cpp-python answers request-validation failures as HTTP 500."""
    return "validation error" in message.lower()


# ------------------------------------------------------------------------------ engine
class OpenAIEngine:
    """Generates with an OpenAI-compatible server (vLLM, llama.cpp, jax-drive serve, ...).

    Args:
      base_url: server root, e.g. 'http://localhost:8000' ('/v1' is appended if missing).
      model: served model name, or a LoRA adapter name; must be listed by /v1/models.
      api_key: sent as 'Authorization: Bearer ...' when given.
      tokenizer: local tokenizer of the served model. Needed for token-id prompts on
        text-only servers, to recover generated ids from text, for prompt ids of text
        prompts, and for ``generate_chat`` to template locally (then /v1/completions: the
        same prompt tokens as ``JaxEngine``). Without it ``generate_chat`` uses
        /v1/chat/completions.
      server: 'auto' (default: from /v1/models), 'vllm', 'llama.cpp', 'jax-drive', 'openai'.
      server_logprobs_mode: log-prob mode of a server that fixes it per process: vLLM's
        default ``--logprobs-mode raw_logprobs`` is 'raw' (default), ``processed_logprobs``
        is 'processed'. Requests asking another mode are refused.
      require_token_logprobs: every completion must carry the exact sampled ids and their
        log-probs (training): otherwise ``OpenAIEngineError``. Default False (metadata
        says what each completion has).
      timeout_s: per-request timeout (default 120 s).
      max_retries: retries after the first attempt for connection errors and HTTP
        429/502/503/504 (default 3), with exponential backoff ``backoff_s * 2**attempt``.
      max_concurrency: requests in flight at once (default 8); vLLM batches them,
        llama.cpp serves them one at a time.
      check_model: raise when ``model`` is not listed by the server (default True).
      transport: the HTTP function (default ``urllib_transport``).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        tokenizer=None,
        server: str = "auto",
        server_logprobs_mode: str = "raw",
        require_token_logprobs: bool = False,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_concurrency: int = 8,
        check_model: bool = True,
        transport: Transport | None = None,
    ):
        if not model or not isinstance(model, str):
            raise ValueError("model must be a non-empty string (served model or LoRA name)")
        if timeout_s <= 0 or max_retries < 0 or backoff_s < 0:
            raise ValueError("timeout_s must be > 0, max_retries and backoff_s >= 0")
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        if server != "auto" and server not in DIALECTS:
            raise ValueError(f"server must be 'auto' or one of {sorted(DIALECTS)}, got {server!r}")
        if server_logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"server_logprobs_mode must be 'raw' or 'processed', got {server_logprobs_mode!r}")
        self.base_url = normalize_base_url(base_url)
        self.model = model
        self.api_key = api_key
        self.tokenizer = tokenizer
        self.server = server
        self.server_logprobs_mode = server_logprobs_mode
        self.require_token_logprobs = bool(require_token_logprobs)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_concurrency = int(max_concurrency)
        self.check_model = bool(check_model)
        self.transport = transport or urllib_transport
        self._dialect: ServerDialect | None = None if server == "auto" else DIALECTS[server]
        self._models: list[str] | None = None
        self._pieces: TokenPieces | None = None

    # --------------------------------------------------------------------- HTTP
    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def request(self, method: str, path: str, payload: dict | None = None,
                expect_json: bool = True, root: bool = False) -> Any:
        """Sends one JSON request with retries; returns the decoded JSON answer (the text
        of a 2xx answer when ``expect_json`` is False: vLLM's LoRA endpoints answer text).
        ``path`` is under ``/v1``, or under the server root with ``root=True``.

        Raises:
          OpenAIEngineError: a non-retryable status (with the server's message), a read
            timeout, retries exhausted, or a non-JSON body.
        """
        base = self.base_url[: -len("/v1")] if root else self.base_url
        url = f"{base}/{path.lstrip('/')}"
        body = None if payload is None else json.dumps(payload).encode("utf-8")
        last = ""
        status: int | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                status, raw = self.transport(method, url, body, self._headers(), self.timeout_s)
            except (urllib.error.URLError, ConnectionError, http.client.HTTPException) as error:
                status, last = None, f"{type(error).__name__}: {error}"  # connection: retry
                continue
            except TimeoutError as error:
                raise OpenAIEngineError(
                    f"{method} {url}: no answer within {self.timeout_s:g} s ({error}); not "
                    "retried, the server may still be working on it: raise timeout_s"
                ) from None
            if 200 <= status < 300:
                if not expect_json:
                    return raw.decode("utf-8", "replace")
                try:
                    return json.loads(raw) if raw else {}
                except ValueError:
                    raise OpenAIEngineError(
                        f"{method} {url}: answer is not JSON: {raw[:200]!r}", status
                    ) from None
            message = _error_message(raw)
            last = f"HTTP {status}: {message}"
            if status not in RETRY_STATUSES:
                if status in (400, 422) or (status == 500 and _is_validation_500(message)):
                    raise OpenAIEngineError(
                        f"{method} {url}: the server rejected the request as invalid ({last})", status
                    )
                raise OpenAIEngineError(f"{method} {url} failed: {last}", status)
        raise OpenAIEngineError(
            f"{method} {url} failed after {self.max_retries + 1} attempts: {last}", status
        )

    # ------------------------------------------------------------ capabilities
    def _fetch_models(self) -> Any:
        return self.request("GET", "models")

    def list_models(self) -> list[str]:
        """Names the server serves (base models and loaded LoRA adapters)."""
        data = self._fetch_models()
        try:
            names = [str(m["id"]) for m in data["data"]]
        except (KeyError, TypeError):
            raise OpenAIEngineError(f"GET models: malformed answer {str(data)[:200]}") from None
        if self._dialect is None:
            self._dialect = dialect_from_models(data)
        self._models = names
        return names

    @property
    def dialect(self) -> ServerDialect:
        """The server's dialect (probed with GET /v1/models on first use when 'auto')."""
        if self._dialect is None:
            self.list_models()
        assert self._dialect is not None
        return self._dialect

    def _require_model(self) -> None:
        if not self.check_model:
            return
        if self._models is None or self.model not in self._models:
            self.list_models()  # refresh once: an adapter may have been loaded since
        if self.model not in (self._models or []):
            raise OpenAIEngineError(
                f"model {self.model!r} is not served at {self.base_url} (served: {self._models})"
            )

    def _require_feature(self, available: bool, feature: str) -> None:
        if not available:
            raise UnsupportedParameterError(
                f"{feature} needs a vLLM (or jax-drive serve) server; this is {self.dialect.name}"
            )

    def _token_pieces(self) -> TokenPieces | None:
        if self.tokenizer is None:
            return None
        if self._pieces is None:
            self._pieces = TokenPieces(self.tokenizer)
        return self._pieces

    def _eos_ids(self) -> tuple[int, ...] | None:
        if self.tokenizer is None:
            return None
        return tuple(int(i) for i in getattr(self.tokenizer, "eos_token_ids", ()) or ())

    # ---------------------------------------------------------------- utilities
    def load_lora_adapter(self, name: str, path: str, replace: bool = False) -> None:
        """Loads a PEFT LoRA adapter directory (visible to the server) under ``name``.

        ``replace=True`` swaps the weights of an adapter already loaded under that name
        (vLLM's ``load_inplace``; servers without it: unload, then load). vLLM needs
        ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``.
        """
        self._require_feature(self.dialect.lora_endpoints, "runtime LoRA loading")
        body = {"lora_name": name, "lora_path": str(path)}
        if replace:
            body["load_inplace"] = True
        try:
            self.request("POST", "load_lora_adapter", body, expect_json=False)
        except OpenAIEngineError as error:
            if error.status == 404:
                raise UnsupportedParameterError(
                    f"{self.base_url} has no /load_lora_adapter (vLLM: set "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora)", 404
                ) from None
            if not (replace and error.status == 400 and "already" in str(error).lower()):
                raise
            self.unload_lora_adapter(name)  # a server without load_inplace
            self.request("POST", "load_lora_adapter", {"lora_name": name, "lora_path": str(path)},
                         expect_json=False)
        self._models = None

    def unload_lora_adapter(self, name: str) -> None:
        self._require_feature(self.dialect.lora_endpoints, "runtime LoRA loading")
        self.request("POST", "unload_lora_adapter", {"lora_name": name}, expect_json=False)
        self._models = None

    def update_weights_from_disk(self, path: str) -> None:
        """Has the server reload its base model's weights from an HF directory it can read
        (config.json + safetensors, e.g. ``jax_drive.models.export.save_safetensors``):
        ``POST /update_weights_from_disk`` (SGLang's endpoint; ``jax-drive serve`` only here:
        vLLM updates full weights over NCCL, not from disk over HTTP)."""
        if self.dialect.name != "jax-drive":
            raise UnsupportedParameterError(
                f"reloading full weights needs jax-drive serve (POST /update_weights_from_disk); "
                f"this is {self.dialect.name}")
        self.request("POST", "update_weights_from_disk", {"model_path": str(path)}, root=True)

    def with_model(self, model: str) -> "OpenAIEngine":
        """The same server and settings, another model / adapter name."""
        clone = object.__new__(OpenAIEngine)
        clone.__dict__.update(self.__dict__)
        clone.model = model
        return clone

    def prompt_logprobs(self, prompts: Sequence[Sequence[int]]) -> list[list[float]]:
        """log pi(token_i | tokens_<i) for i >= 1 of each token-id prompt (vLLM only)."""
        self._require_feature(self.dialect.prompt_logprobs, "prompt_logprobs")
        self._require_model()
        prompts = [[int(t) for t in p] for p in validate_prompts(prompts)]

        def run(prompt):
            body = {"model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                    "prompt_logprobs": 0, "return_tokens_as_token_ids": True}
            return parse_prompt_logprobs(self.request("POST", "completions", body), prompt)

        return self._map(run, prompts)

    # --------------------------------------------------------------- interface
    def _prepare(self, params: SamplingParams) -> ServerDialect:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        dialect = self.dialect
        check_sampling_params(params, dialect, self.server_logprobs_mode, self._eos_ids())
        if self.require_token_logprobs and not dialect.returns_token_ids and self.tokenizer is None:
            raise UnsupportedParameterError(
                f"require_token_logprobs on a {dialect.name} server needs the local tokenizer "
                "to map the returned token texts to ids"
            )
        self._require_model()
        return dialect

    def _logprobs_mode(self, params: SamplingParams, dialect: ServerDialect) -> str:
        if dialect.logprobs_per_request or logprobs_equivalent(params):
            return params.logprobs_mode
        return self.server_logprobs_mode

    def _checked(self, completions: list[Completion]) -> list[Completion]:
        mismatched = [c for c in completions if c.metadata.prompt_tokens_match is False]
        if self.require_token_logprobs:
            bad = [c.metadata for c in completions if not c.metadata.exact]
            if bad:
                m = bad[0]
                raise OpenAIEngineError(
                    f"{len(bad)} of {len(completions)} completions lack exact token ids / "
                    f"log-probs (e.g. ids from {m.token_ids_source!r}, log-probs from "
                    f"{m.logprobs_source!r}, prompt tokens match: {m.prompt_tokens_match}); "
                    "training needs them (require_token_logprobs=True)"
                )
        elif mismatched:
            warnings.warn(
                f"{len(mismatched)} prompts were tokenized differently by the server than by "
                "the local tokenizer (Completion.metadata.prompt_tokens_match is False)",
                RuntimeWarning, stacklevel=3,
            )
        return completions

    def generate(
        self, prompts: Sequence[Prompt], params: SamplingParams, key: jax.Array
    ) -> list[Completion]:
        """Completes each prompt ``params.n`` times via /v1/completions; see ``Engine``.

        One request per completion row, each with its own seed (``row_seeds``).
        """
        prompts = validate_prompts(prompts)
        dialect = self._prepare(params)
        tokens_in = not isinstance(prompts[0], str)
        local_ids: list[list[int] | None]
        if tokens_in:
            local_ids = [[int(t) for t in p] for p in prompts]
        elif self.tokenizer is not None:
            local_ids = [list(self.tokenizer.encode(p)) for p in prompts]
        else:
            local_ids = [None] * len(prompts)
        send_ids = tokens_in and dialect.token_id_prompts
        if tokens_in and not send_ids:
            if self.tokenizer is None:
                raise UnsupportedParameterError(
                    f"the {dialect.name} server takes text prompts only: pass a tokenizer to "
                    "decode token-id prompts"
                )
            wire: list[Prompt] = [
                self.tokenizer.decode(ids, skip_special_tokens=False) for ids in local_ids
            ]
        else:
            wire = list(prompts)
        pieces = None if dialect.returns_token_ids else self._token_pieces()
        rows = [p for p in range(len(prompts)) for _ in range(params.n)]
        seeds = row_seeds(key, len(rows))
        mode = self._logprobs_mode(params, dialect)

        def run(i: int) -> Completion:
            p = rows[i]
            body = build_completion_request(wire[p], params, self.model, seeds[i], dialect)
            answer = self.request("POST", "completions", body)
            return parse_completion_choice(
                answer, chat=False, dialect=dialect, logprobs_mode=mode,
                prompt_ids=local_ids[p], sent_token_ids=send_ids, tokenizer=self.tokenizer,
                pieces=pieces, seed=seeds[i],
            )

        return self._checked(self._map(run, range(len(rows))))

    def generate_chat(
        self, conversations: Sequence[Sequence[Message]], params: SamplingParams, key: jax.Array
    ) -> list[Completion]:
        """Chat completions; see the class docstring for local vs server-side templating."""
        conversations = validate_conversations(conversations)
        if self.tokenizer is not None:
            prompts = [
                self.tokenizer.apply_chat_template(c, add_generation_prompt=True)
                for c in conversations
            ]
            return self.generate(prompts, params, key)
        dialect = self._prepare(params)
        rows = [c for c in range(len(conversations)) for _ in range(params.n)]
        seeds = row_seeds(key, len(rows))
        mode = self._logprobs_mode(params, dialect)

        def run(i: int) -> Completion:
            body = build_chat_request(conversations[rows[i]], params, self.model, seeds[i], dialect)
            return parse_completion_choice(
                self.request("POST", "chat/completions", body), chat=True, dialect=dialect,
                logprobs_mode=mode, prompt_ids=None, sent_token_ids=False, seed=seeds[i],
            )

        return self._checked(self._map(run, range(len(rows))))

    def _map(self, fn, items) -> list:
        items = list(items)
        if len(items) == 1 or self.max_concurrency == 1:
            return [fn(item) for item in items]
        with concurrent.futures.ThreadPoolExecutor(min(self.max_concurrency, len(items))) as pool:
            return list(pool.map(fn, items))
