"""One decoding request of the sampler and the settings its compiled programs take.

``Request`` holds the engine-resolved settings of a call. It splits into static settings
(``DecodeMode``: greedy vs sampled, filtering on / off, the log-prob mode, prompt lookup; one
compiled program each) and traced ones (``DecodeSettings``: temperature, top-k / top-p values,
stop ids, token budgets, pad id, the loop's step bound, the logits mask's arrays; changing
them never recompiles). Also the PRNG key conventions: one key for a call, or one per row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp

from jax_drive.sampling.constraints import NO_MASK, LogitsMask
from jax_drive.sampling.shapes import SamplerConfig, next_power_of_two
from jax_drive.sampling.speculative import PromptLookup

LOGPROBS_MODES = ("raw", "processed")


@dataclasses.dataclass(frozen=True)
class Request:
    """One decoding request of the sampler, engine defaults resolved.

    Attributes: max_new_tokens, temperature (0 = greedy), top_p, top_k, min_new_tokens,
    logprobs_mode as in ``SamplingParams``; stop_token_ids: the resolved stop ids (default
    none); pad_id: padding id of inputs and outputs (default 0); prompt_lookup: speculative
    decoding settings or None (default: one token per step); logits_mask: the per-row
    constraint on emitted tokens (``constraints.LogitsMask``; default none).
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    min_new_tokens: int = 0
    pad_id: int = 0
    logprobs_mode: str = "raw"
    prompt_lookup: PromptLookup | None = None
    logits_mask: LogitsMask = NO_MASK

    def check(self, vocab: int) -> None:
        """Raises ValueError for settings the sampler cannot honour."""
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed', got {self.logprobs_mode!r}")
        if any(not (0 <= s < vocab) for s in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must lie in [0, {vocab}), got {list(self.stop_token_ids)}")

    @property
    def greedy(self) -> bool:
        return float(self.temperature) == 0.0

    @property
    def draft_len(self) -> int:
        """K drafted tokens per step: prompt lookup's, or the logits mask's longest forced run
        (jump-forward), whichever is larger; 0 (one token per step) without either."""
        lookup = 0 if self.prompt_lookup is None else self.prompt_lookup.num_draft
        return max(lookup, int(getattr(self.logits_mask, "max_forced", 0)))

    def mode(self) -> "DecodeMode":
        return DecodeMode(greedy=self.greedy,
                          use_filter=(not self.greedy) and (self.top_k > 0 or self.top_p < 1.0),
                          processed_logprobs=self.logprobs_mode == "processed",
                          lookup=self.prompt_lookup, draft_len=self.draft_len)

    def settings(self, config: SamplerConfig, never_ids: Sequence[int] = (),
                 until: int | None = None) -> "DecodeSettings":
        """Traced settings; ``never_ids`` (the model's input placeholders, e.g. a VLM's image
        pad id) get zero probability, and so are never sampled nor accepted as drafts.
        ``until``: the loop stops before iteration ``until`` (counted from the call's first
        step; default ``max_new_tokens``, the most a call runs)."""
        stop = list(self.stop_token_ids)
        kpad = max(config.max_stop_ids, next_power_of_two(max(1, len(stop))))
        never = [int(i) for i in never_ids]
        mpad = next_power_of_two(max(1, len(never)))
        return DecodeSettings(
            max_new_tokens=jnp.int32(self.max_new_tokens),
            min_new_tokens=jnp.int32(self.min_new_tokens),
            temperature=jnp.float32(1.0 if self.greedy else self.temperature),
            top_k=jnp.int32(self.top_k),
            top_p=jnp.float32(self.top_p),
            stop_ids=jnp.asarray(stop + [-1] * (kpad - len(stop)), jnp.int32),
            never_ids=jnp.asarray(never + [-1] * (mpad - len(never)), jnp.int32),
            pad_id=jnp.int32(self.pad_id),
            until=jnp.int32(self.max_new_tokens if until is None else until),
            logits_mask=self.logits_mask,
        )


@chex.dataclass
class DecodeSettings:
    """Traced sampling settings (changing them never recompiles): max_new_tokens,
    min_new_tokens, top_k, pad_id, until () int32; temperature, top_p () float32; stop_ids (K,)
    and never_ids (M,) int32 padded with -1 (never_ids: ids that are never sampled); until: the
    loop runs while its step count is below it; logits_mask: a ``constraints.LogitsMask``
    pytree (its arrays traced)."""

    max_new_tokens: jax.Array
    min_new_tokens: jax.Array
    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    stop_ids: jax.Array
    never_ids: jax.Array
    pad_id: jax.Array
    until: jax.Array
    logits_mask: Any = NO_MASK


@dataclasses.dataclass(frozen=True)
class DecodeMode:
    """Static decoding settings (one compiled program each). draft_len: K tokens verified per
    step besides the pending one (0: the plain one-token step); lookup: where drafts come
    from besides the logits mask (prompt lookup, or None)."""

    greedy: bool
    use_filter: bool
    processed_logprobs: bool
    lookup: PromptLookup | None = None
    draft_len: int = 0


def check_token_ids(rows: Sequence[Sequence[int]], vocab: int, what: str = "prompt") -> None:
    """Raises ValueError for an id outside [0, vocab)."""
    for r in rows:
        if r and (min(r) < 0 or max(r) >= vocab):
            raise ValueError(f"{what} token ids must lie in [0, {vocab}), got {min(r)}..{max(r)}")


def row_keys(key: jax.Array, rows: int) -> jax.Array | None:
    """``key`` as one typed PRNG key per row ((rows,) key array), or None for a single key.

    A single key is a typed key of shape () or a raw uint32 key of shape (2,); one key per
    row is a typed (rows,) key array or raw (rows, 2) data.

    Raises:
      ValueError: a key array whose length is not ``rows``.
    """
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    if key.ndim == (0 if typed else 1):
        return None
    keys = key if typed else jax.random.wrap_key_data(key)
    if keys.ndim != 1 or keys.shape[0] != rows:
        raise ValueError(f"one PRNG key per row needs {rows} keys, got key shape {tuple(key.shape)}")
    return keys


def batch_key(key: jax.Array, rows: int, batch: int) -> jax.Array:
    """The key of a loop of ``batch`` rows whose first ``rows`` are real: ``key`` itself when it
    is one key for the call, else the per-row keys with the dummy rows reusing the first one
    (their draws are discarded)."""
    keys = row_keys(key, rows)
    if keys is None:
        return key
    return jnp.concatenate([keys, jnp.broadcast_to(keys[:1], (batch - rows,))])


def split_keys(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(next key, subkey) of one key (shape ()) or of one key per row ((B,): row-wise)."""
    if key.ndim == 0:
        key, sub = jax.random.split(key)
        return key, sub
    pairs = jax.vmap(jax.random.split)(key)  # (B, 2)
    return pairs[:, 0], pairs[:, 1]
