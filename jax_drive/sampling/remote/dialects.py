"""Server dialects as data: what each kind of OpenAI-compatible server accepts and returns.

The engine learns the dialect from ``GET /v1/models`` (vLLM's entries are ``owned_by:
"vllm"``, llama-cpp-python's ``"me"``, ``jax-drive serve``'s ``"jax-drive"``; anything else is a
plain OpenAI server) and refuses, before sending anything, what the server cannot honour.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from jax_drive.sampling.params import SamplingParams
from jax_drive.sampling.remote.errors import UnsupportedParameterError


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
_VLLM_NEUTRAL = {"min_p": 0.0, "repetition_penalty": 1.0, **_PENALTIES_OFF}
DIALECTS: dict[str, ServerDialect] = {
    "vllm": ServerDialect(
        name="vllm", token_id_prompts=True, returns_token_ids=True, logprobs_per_request=False,
        stop_token_ids=True, min_tokens=True, top_k=True, vllm_fields=True, skip_special_tokens=True,
        neutral=_VLLM_NEUTRAL, lora_endpoints=True, prompt_logprobs=True, stop_token_in_output=True,
    ),
    "jax-drive": ServerDialect(
        name="jax-drive", token_id_prompts=True, returns_token_ids=True, logprobs_per_request=True,
        stop_token_ids=True, min_tokens=True, top_k=True, vllm_fields=False, skip_special_tokens=True,
        neutral=_VLLM_NEUTRAL, lora_endpoints=True, prompt_logprobs=False, stop_token_in_output=True,
    ),
    # llama-cpp-python's server: text prompts only, log-probs keyed by token text, raw
    # log-probs, EOS never part of the output, n ignored, unknown fields ignored silently.
    "llama.cpp": ServerDialect(
        name="llama.cpp", token_id_prompts=False, returns_token_ids=False, logprobs_per_request=False,
        stop_token_ids=False, min_tokens=True, top_k=True, vllm_fields=False, skip_special_tokens=False,
        neutral={"min_p": 0.0, "repeat_penalty": 1.0, "mirostat_mode": 0, **_PENALTIES_OFF},
        lora_endpoints=False, prompt_logprobs=False, stop_token_in_output=False,
    ),
    "openai": ServerDialect(
        name="openai", token_id_prompts=False, returns_token_ids=False, logprobs_per_request=False,
        stop_token_ids=False, min_tokens=False, top_k=False, vllm_fields=False, skip_special_tokens=False,
        neutral=dict(_PENALTIES_OFF), lora_endpoints=False, prompt_logprobs=False, stop_token_in_output=False,
    ),
}
_OWNED_BY = {"vllm": "vllm", "me": "llama.cpp", "jax-drive": "jax-drive"}


def dialect_from_models(answer: Any) -> ServerDialect:
    """The dialect of a server from its ``GET /v1/models`` answer (``owned_by`` field); a
    plain OpenAI server for anything unrecognised, a malformed answer included."""
    entries = answer.get("data") if isinstance(answer, dict) else None
    owners = {entry.get("owned_by") for entry in (entries if isinstance(entries, list) else [])
              if isinstance(entry, dict) and isinstance(entry.get("owned_by"), str)}
    for owner in owners:
        if owner in _OWNED_BY:
            return DIALECTS[_OWNED_BY[owner]]
    return DIALECTS["openai"]


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
