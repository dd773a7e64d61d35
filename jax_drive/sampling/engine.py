"""The engine interface: one ``generate`` for every back end.

An engine turns prompts (text or token ids) into ``Completion`` records. Two engines
implement it: ``JaxEngine`` (our jitted KV-cache sampler on a local ``CausalLM``) and
``OpenAIEngine`` (an OpenAI-compatible HTTP server such as vLLM). Rollout code depends
only on this protocol.

Engines that can keep state between the turns of a conversation also implement
``SessionEngine`` (``start`` -> a session whose ``extend`` continues each row from its kept
KV cache) and set ``supports_sessions = True``; ask with :func:`supports_sessions` and fall
back to ``generate`` on whole contexts otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal, Protocol, Union, runtime_checkable

import jax

from jax_drive.sampling.params import SamplingParams

FinishReason = Literal["stop", "length"]
Prompt = Union[str, Sequence[int]]
Message = dict  # {"role": str, "content": str}


@dataclasses.dataclass(frozen=True)
class Completion:
    """One generated continuation.

    Attributes:
      prompt_token_ids: the prompt as token ids (empty when a remote server did not
        report them and no local tokenizer was given).
      token_ids: generated ids; a stop token, when one ended the completion, is the last id.
      text: ``token_ids`` decoded (special tokens skipped unless asked otherwise).
      logprobs: one float per entry of ``token_ids`` (see ``SamplingParams.logprobs_mode``).
      finish_reason: ``"stop"`` (a stop token was produced) or ``"length"``
        (``max_new_tokens`` reached).
    """

    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...]
    finish_reason: FinishReason

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"logprobs ({len(self.logprobs)}) and token_ids ({len(self.token_ids)}) differ in length"
            )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def cumulative_logprob(self) -> float:
        return float(sum(self.logprobs))


@runtime_checkable
class Engine(Protocol):
    """Anything that can complete prompts.

    ``generate`` returns ``len(prompts) * params.n`` completions ordered prompt-major
    (prompt 0 sample 0..n-1, then prompt 1, ...). ``key`` is a JAX PRNG key; engines
    are deterministic given the key (a remote server only as far as it honours seeds).
    """

    def generate(
        self, prompts: Sequence[Prompt], params: SamplingParams, key: jax.Array
    ) -> list[Completion]: ...

    def generate_chat(
        self, conversations: Sequence[Sequence[Message]], params: SamplingParams, key: jax.Array
    ) -> list[Completion]: ...


@runtime_checkable
class SessionEngine(Protocol):
    """An engine that keeps each row's state between turns (``JaxEngine``).

    ``start(prompts, params, key) -> (session, completions)``: the completions of
    ``generate(prompts, params, key)``, and a session with one row per completion;
    ``session.extend(appended, params, key) -> [Completion | None]`` appends token ids to
    every row (None drops a row) and generates the next turn of the others.
    """

    supports_sessions: bool

    def start(self, prompts: Sequence[Prompt], params: SamplingParams, key: jax.Array): ...


def supports_sessions(engine) -> bool:
    """True when ``engine`` keeps state between turns (has ``start`` and says so)."""
    return bool(getattr(engine, "supports_sessions", False)) and callable(getattr(engine, "start", None))


def validate_prompts(prompts: Sequence[Prompt]) -> list[Prompt]:
    """Check a prompt batch at the boundary; returns it as a list.

    Raises:
      TypeError / ValueError with a clear message for an empty batch, mixed kinds,
      empty prompts or non-integer token ids.
    """
    if isinstance(prompts, (str, bytes)):
        raise TypeError("prompts must be a list of prompts, not a single string")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts is empty")
    kinds = {isinstance(p, str) for p in prompts}
    if len(kinds) != 1:
        raise TypeError("prompts mixes strings and token-id lists")
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if not p:
                raise ValueError(f"prompt {i} is an empty string")
        else:
            ids = list(p)
            if not ids:
                raise ValueError(f"prompt {i} has no tokens")
            if not all(isinstance(t, int) or (hasattr(t, "__index__") and not isinstance(t, float)) for t in ids):
                raise TypeError(f"prompt {i} must hold integer token ids")
    return prompts


def validate_conversations(conversations: Sequence[Sequence[Message]]) -> list[list[Message]]:
    """Check a batch of chat conversations (lists of {"role", "content"} dicts)."""
    conversations = [list(c) for c in conversations]
    if not conversations:
        raise ValueError("conversations is empty")
    for i, conv in enumerate(conversations):
        if not conv:
            raise ValueError(f"conversation {i} has no messages")
        for m in conv:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise TypeError(f"conversation {i}: every message needs 'role' and 'content', got {m!r}")
    return conversations
