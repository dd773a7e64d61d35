"""The decode loop's carry: everything a step reads and writes, per row, on the device.

A prefill (``cache.prefill_state``) or a session turn (``session.Session.extend``) builds it;
``decode.decode`` runs the loop on it, in one call or in chunks (the state after a chunk is
the next chunk's input); ``outputs.SamplerOutput.from_state`` reads the results.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp


@chex.dataclass
class DecodeState:
    """Carry of the decode loop (B rows, W output columns).

    cache: the model's KVCache (generic path) or a LayerCache (unrolled path); token (B,)
    int32: the pending token, fed at the next step; position (B,) int32: its RoPE position;
    index () or (B,) int32: the cache slot it is written to (per row once rows advance
    differently); step () int32: loop iterations so far; done (B,) bool: the row emits nothing
    more (a stop token, its budget, a dummy row, or dropped by the caller); tokens (B, W) int32
    and logprobs (B, W) float32: outputs (pad / 0 after a stop); lengths (B,) int32: generated
    tokens per row (stop token included); stopped (B,) bool: a stop token was produced; key:
    PRNG key, or (B,) keys (one per row); history (B, T) int32 and history_len (B,) int32: each
    row's context with its outputs (prompt lookup only, else None); constraint: the logits
    mask's per-row state (``constraints.LogitsMask``; None without one or before the first step).
    """

    cache: Any
    token: jax.Array
    position: jax.Array
    index: jax.Array
    step: jax.Array
    done: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    stopped: jax.Array
    key: jax.Array
    history: jax.Array | None = None
    history_len: jax.Array | None = None
    constraint: Any = None


def new_decode_state(cache, token, position, index, row_valid, key, width: int,
                     history=None, history_len=None) -> DecodeState:
    """A loop state before the first step: nothing generated, dummy rows done."""
    batch = token.shape[0]
    return DecodeState(
        cache=cache, token=token, position=position, index=index,
        step=jnp.zeros((), jnp.int32), done=~row_valid,
        tokens=jnp.zeros((batch, width), jnp.int32),
        logprobs=jnp.zeros((batch, width), jnp.float32),
        lengths=jnp.zeros((batch,), jnp.int32), stopped=jnp.zeros((batch,), bool), key=key,
        history=history, history_len=history_len,
    )


def output_width(gen_len: int, draft_len: int) -> int:
    """Output columns W of a loop with a generation bucket N and K drafts per step: N, plus
    K + 1 for the tokens a speculative step may write past the budget before it is cut."""
    return gen_len + (draft_len + 1 if draft_len else 0)
