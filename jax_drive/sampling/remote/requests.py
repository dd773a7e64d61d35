"""Request building per server dialect: the JSON bodies ``OpenAIEngine`` sends, and seeds.

Every body asks for one completion row (``n`` = 1, its own seed) and carries neutral values
for the sampling knobs ``SamplingParams`` has no field for (``ServerDialect.neutral``), so
server defaults (llama.cpp: top_k 40, min_p 0.05, repeat penalty 1.1) or a model's
``generation_config.json`` cannot change the distribution.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax

from jax_drive.sampling.engine import Message, Prompt
from jax_drive.sampling.grammar.dialects import request_fields
from jax_drive.sampling.grammar.regex import GrammarError
from jax_drive.sampling.grammar.spec import Grammar
from jax_drive.sampling.params import SamplingParams
from jax_drive.sampling.remote.dialects import ServerDialect
from jax_drive.sampling.remote.errors import UnsupportedParameterError

_SEED_MODULUS = 2**31 - 1  # prime, so seeds base + i * step are distinct for i < modulus
_SEED_STEP = 0x9E3779B1


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


def sampling_fields(params: SamplingParams, seed: int | None, dialect: ServerDialect) -> dict:
    """The sampling part of a completions or chat body, in ``dialect``'s fields."""
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


def grammar_fields(grammar: Grammar | None, dialect: ServerDialect, endpoint: str, exact: bool = True) -> dict:
    """The fields that make ``dialect``'s server constrain an answer to ``grammar`` ({} for
    none; ``grammar.dialects.request_fields``). exact: the server's language must be the
    local automaton's (training recomputes log-probs under it); False allows a dialect's
    native JSON / choice forms.

    Raises UnsupportedParameterError naming what the dialect cannot express."""
    if grammar is None:
        return {}
    try:
        return request_fields(grammar, dialect.name, endpoint, exact=exact)
    except GrammarError as error:
        hint = " (OpenAIEngine(grammar_mode='native') sends JSON schemas natively)" if exact else ""
        raise UnsupportedParameterError(f"the {dialect.name} server cannot take this {grammar.kind} "
                                        f"grammar on /{endpoint}: {error}{hint}") from None


def build_completion_request(prompt: Prompt, params: SamplingParams, model: str, seed: int | None,
                             dialect: ServerDialect, grammar: Grammar | None = None, exact: bool = True) -> dict:
    """JSON body of a POST /v1/completions for one completion row of one prompt.

    ``prompt`` is text or token ids; ids are only valid for dialects that accept them.
    ``grammar``: the row's grammar (:func:`grammar_fields`).
    """
    if isinstance(prompt, str):
        prompt_field: Any = prompt
    else:
        if not dialect.token_id_prompts:
            raise UnsupportedParameterError(f"the {dialect.name} server takes text prompts only")
        prompt_field = [int(t) for t in prompt]
    head = {"prompt": prompt_field, "logprobs": 1, "echo": False}
    return _row_body(head, "completions", params, model, seed, dialect, grammar, exact)


def build_chat_request(messages: Sequence[Message], params: SamplingParams, model: str, seed: int | None,
                       dialect: ServerDialect, grammar: Grammar | None = None, exact: bool = True) -> dict:
    """JSON body of a POST /v1/chat/completions for one completion row of a conversation
    (``grammar``: the row's grammar, :func:`grammar_fields`)."""
    head = {"messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "logprobs": True, "top_logprobs": 1}
    return _row_body(head, "chat", params, model, seed, dialect, grammar, exact)


def _row_body(head: dict, endpoint: str, params: SamplingParams, model: str, seed: int | None,
              dialect: ServerDialect, grammar: Grammar | None, exact: bool) -> dict:
    """The model, then ``endpoint``'s own fields (``head``), then the row's sampling and
    grammar fields: one request body."""
    return {"model": model, **head, **sampling_fields(params, seed, dialect),
            **grammar_fields(grammar, dialect, endpoint, exact)}


def build_prompt_logprobs_request(prompt: Sequence[int], model: str) -> dict:
    """JSON body of a vLLM POST /v1/completions that scores a token-id prompt (one greedy
    token generated, the prompt's log-probs keyed by token id)."""
    return {"model": model, "prompt": [int(t) for t in prompt], "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": 0, "return_tokens_as_token_ids": True}
