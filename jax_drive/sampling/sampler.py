"""Jitted KV-cache sampler for ``jax_drive.models.CausalLM``.

Layout of one call (``generate_tokens``):

1. The host left-pads the prompts to a *bucketed* length ``P`` (powers of two by default,
   or a fixed list) and the batch to a bucketed size ``B``; the generation budget is
   bucketed to ``N``. Shapes, hence compiled programs, only change when a bucket changes,
   so a rollout loop with varying prompt lengths reuses one program.
2. ``_prefill`` (jitted): allocates a static KV cache of ``S = P + N`` slots and writes the
   keys/values of the first ``P - 1`` prompt columns (``CausalLM.prefill``: causal attention
   over the prompt in query blocks, not over all S slots; SmolLM2 at B = 8, P = 1408 on the
   2-core CPU: 32 s instead of 62 s). The logits of the prefill are never used, so no
   (B, P, V) LM head is computed.
3. ``_decode_*`` (jitted, loop state donated): a ``lax.while_loop``; step ``t`` feeds one
   token per row (the last prompt token at ``t = 0``, then the previous sample) at cache
   slot ``P - 1 + t``, samples the next token and records its log-prob. The loop stops at
   ``max_new_tokens`` (dynamic, <= N) or when every row has produced a stop token. Rows that
   are done keep running but their outputs are replaced by ``pad_id`` / 0.
   Two step functions, both the model's own forward: ``_decode_unrolled`` (default) runs it
   on the unrolled weight layout (``jax_drive.models.unroll_params``: per-layer buffers, LoRA
   folded in, q/k/v and gate/up fused) with a per-layer ``LayerCache``, which avoids XLA:CPU
   copying every layer's weights out of the stacked arrays on each step (~2x fewer CPU
   cycles per token measured here); ``_decode_generic`` calls ``CausalLM.__call__`` (the
   contract path; any model).

Sampling-only settings (temperature, top-k/p values, stop ids, min/max new tokens, pad id)
are traced values, so changing them never recompiles; greedy vs sampled, filtering on/off and
the log-prob mode are static.

Log-probabilities: ``"raw"`` = log-softmax of the unprocessed float32 logits at the sampled
token (temperature 1, no filtering, no min-token mask): log pi(token | prefix) of the policy.
``"processed"`` = log-softmax after temperature / top-k / top-p (and min-token masking), the
distribution the token was drawn from (0 under greedy decoding).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_drive.models.transformer import (
    LayerCache,
    forward_hidden,
    init_cache,
    lm_logits,
    positions_from_mask,
    unroll_params,
)

NEG_INF = -1e30  # finite "minus infinity" for masking logits (avoids inf - inf = nan)


# ----------------------------------------------------------------------------- config
@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """Shape bucketing of the sampler.

    Attributes:
      prompt_buckets: allowed padded prompt lengths, ascending; ``None`` (default) means
        powers of two >= ``min_prompt_bucket``.
      min_prompt_bucket: smallest power-of-two prompt bucket (default 16).
      gen_buckets: allowed generation budgets, ascending; ``None`` means powers of two
        >= ``min_gen_bucket``.
      min_gen_bucket: smallest power-of-two generation bucket (default 16).
      bucket_batch: pad the batch to a power of two with dummy rows (default True).
      max_stop_ids: size of the (padded) stop-id array is the next power of two >= the
        number of stop ids, at least this many (default 4).
      unroll_layers: decode with per-layer weight buffers and a Python-unrolled layer loop
        (``jax_drive.models.unroll_params``; ~2x faster per token on the CPU, keeps one extra
        copy of the weights, longer compile). False: call ``CausalLM.__call__`` (scanned layers) in the
        loop. Models without ``arrays()`` always use the latter. Default True.
    """

    prompt_buckets: tuple[int, ...] | None = None
    min_prompt_bucket: int = 16
    gen_buckets: tuple[int, ...] | None = None
    min_gen_bucket: int = 16
    bucket_batch: bool = True
    max_stop_ids: int = 4
    unroll_layers: bool = True

    def __post_init__(self) -> None:
        for name in ("prompt_buckets", "gen_buckets"):
            b = getattr(self, name)
            if b is not None:
                b = tuple(int(x) for x in b)
                if not b or any(x < 1 for x in b) or list(b) != sorted(set(b)):
                    raise ValueError(f"{name} must be ascending distinct positive ints, got {b}")
                object.__setattr__(self, name, b)
        if self.min_prompt_bucket < 1 or self.min_gen_bucket < 1 or self.max_stop_ids < 1:
            raise ValueError("minimum bucket sizes must be >= 1")


def next_power_of_two(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


def bucket_size(n: int, buckets: Sequence[int] | None, minimum: int, what: str) -> int:
    """The bucket that holds length ``n``: the smallest entry of ``buckets`` >= n, or the
    next power of two (at least ``minimum``) when ``buckets`` is None.

    Raises:
      ValueError: ``n`` exceeds the largest fixed bucket.
    """
    if buckets is None:
        return max(int(minimum), next_power_of_two(n))
    for b in buckets:
        if b >= n:
            return int(b)
    raise ValueError(f"{what} {n} exceeds the largest bucket {buckets[-1]}")


# ------------------------------------------------------------------------ host helpers
def left_pad(
    prompts: Sequence[Sequence[int]], length: int, batch: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Left-pads token lists into a (batch, length) array.

    Rows beyond ``len(prompts)`` are dummy rows holding one "real" pad token (so no row is
    fully masked).

    Returns:
      ids (batch, length) int32, mask (batch, length) bool (True = real token),
      row_valid (batch,) bool (False for dummy rows).
    """
    ids = np.full((batch, length), pad_id, dtype=np.int32)
    mask = np.zeros((batch, length), dtype=bool)
    for i, p in enumerate(prompts):
        n = len(p)
        if n:
            ids[i, length - n:] = np.asarray(p, dtype=np.int32)
            mask[i, length - n:] = True
    mask[len(prompts):, -1] = True
    row_valid = np.zeros((batch,), dtype=bool)
    row_valid[: len(prompts)] = True
    return ids, mask, row_valid


# -------------------------------------------------------------------- token selection
def filter_logits(logits: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Top-k then top-p (nucleus) filtering; removed entries become ``NEG_INF``.

    logits (B, V) float32 (already temperature-scaled); top_k () int32 (0 = off);
    top_p () float32 in (0, 1] (1 = off). Ties at the threshold are all kept.
    Returns (B, V) float32.
    """
    vocab = logits.shape[-1]
    sorted_desc = -jnp.sort(-logits, axis=-1)  # (B, V)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    rank = jnp.arange(vocab)
    in_top_k = rank[None, :] < k
    probs = jax.nn.softmax(jnp.where(in_top_k, sorted_desc, NEG_INF), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = in_top_k & (mass_before < top_p)  # rank 0 is always kept
    n_keep = jnp.maximum(jnp.sum(keep, axis=-1), 1)  # (B,)
    threshold = jnp.take_along_axis(sorted_desc, (n_keep - 1)[:, None], axis=-1)  # (B, 1)
    return jnp.where(logits >= threshold, logits, NEG_INF)


def select_tokens(
    logits: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    *,
    greedy: bool,
    use_filter: bool,
) -> tuple[jax.Array, jax.Array]:
    """Picks one token per row.

    logits (B, V) float32 (any masking already applied). ``greedy`` and ``use_filter`` are
    static. Returns token (B,) int32 and the processed log-prob (B,) float32 of the token
    (log-softmax of the temperature-scaled, filtered logits; 0 when greedy).
    """
    if greedy:
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return token, jnp.zeros(token.shape, jnp.float32)
    scaled = logits / temperature
    if use_filter:
        scaled = filter_logits(scaled, top_k, top_p)
    token = jax.random.categorical(key, scaled, axis=-1).astype(jnp.int32)
    logp = jax.nn.log_softmax(scaled, axis=-1)
    return token, jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]


def gather_logprob(logits: jax.Array, token: jax.Array) -> jax.Array:
    """log_softmax(logits)[token]: logits (B, V) float32, token (B,) -> (B,) float32."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]


# ----------------------------------------------------------------------- decode weights
@jax.jit
def _unroll(arrays: dict) -> dict:
    return unroll_params(arrays)


def unrolled_weights(model) -> dict | None:
    """``unroll_params(model.arrays())`` (a new copy of the weights), or None when the model
    does not expose ``arrays()`` in the CausalLM layout (it then decodes through ``__call__``)."""
    arrays_fn = getattr(model, "arrays", None)
    arrays = arrays_fn() if arrays_fn is not None else None
    if not isinstance(arrays, dict) or "layers" not in arrays or "embed" not in arrays:
        return None
    return _unroll(arrays)


class DecodeWeightCache:
    """The unrolled decode copy of one model's weights, kept while its arrays are unchanged.

    Keyed by the identity of the model's parameter arrays: the cache holds those arrays, so an
    id cannot be reused while the entry lives, and an in-place update (a trainer step assigns
    new arrays) makes the next ``get`` rebuild the copy. Owned by an engine (one entry).
    """

    def __init__(self) -> None:
        self._entry: tuple | None = None  # (leaf ids, leaves, weights)

    def get(self, model) -> dict | None:
        """The cached (or rebuilt) ``unrolled_weights(model)``."""
        arrays_fn = getattr(model, "arrays", None)
        if arrays_fn is None:
            return None
        leaves = jax.tree.leaves(arrays_fn())
        ids = tuple(id(x) for x in leaves)
        if self._entry is not None and self._entry[0] == ids:
            return self._entry[2]
        weights = unrolled_weights(model)
        self._entry = None if weights is None else (ids, leaves, weights)
        return weights

    def clear(self) -> None:
        """Drops the copy (frees its memory)."""
        self._entry = None


# --------------------------------------------------------------------- jitted programs
@chex.dataclass
class DecodeState:
    """Carry of the decode loop (B rows, N = generation bucket).

    cache: the model's KVCache (generic path) or a LayerCache (unrolled path); token (B,)
    int32: token fed at the next step; position (B,) int32: its RoPE position; step ()
    int32: tokens generated so far; done (B,) bool; tokens (B, N) int32 and logprobs (B, N)
    float32: outputs (pad / 0 after a stop); lengths (B,) int32: generated tokens per row
    (stop token included); stopped (B,) bool: a stop token was produced; key: PRNG key.
    """

    cache: Any
    token: jax.Array
    position: jax.Array
    step: jax.Array
    done: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    stopped: jax.Array
    key: jax.Array


@functools.partial(jax.jit, static_argnums=(0, 6, 7))
def _prefill(graphdef, state, ids, mask, row_valid, key, gen_bucket: int, per_layer: bool) -> DecodeState:
    """ids/mask (B, P) left-padded, row_valid (B,) bool (False = dummy row, done from the
    start) -> decode state with the first P - 1 prompt columns cached (stacked KVCache, or
    a LayerCache when ``per_layer``)."""
    model = nnx.merge(graphdef, state)
    config = model.config
    batch, plen = ids.shape
    cache = init_cache(config, batch, plen + gen_bucket, config.jnp_dtype)
    positions = positions_from_mask(mask)
    if plen > 1:
        if hasattr(model, "prefill"):  # blocked causal attention over the prompt only
            cache = model.prefill(ids[:, :-1], positions[:, :-1], mask[:, :-1], cache)
        else:
            _, cache = model(
                ids[:, :-1], positions[:, :-1], mask[:, :-1], cache=cache, cache_index=jnp.int32(0)
            )
    if per_layer:
        cache = LayerCache.from_stacked(cache)
    return DecodeState(
        cache=cache,
        token=ids[:, -1],
        position=positions[:, -1],
        step=jnp.zeros((), jnp.int32),
        done=~row_valid,
        tokens=jnp.zeros((batch, gen_bucket), jnp.int32),
        logprobs=jnp.zeros((batch, gen_bucket), jnp.float32),
        lengths=jnp.zeros((batch,), jnp.int32),
        stopped=jnp.zeros((batch,), bool),
        key=key,
    )


def _decode_loop(step_fn, vocab, loop, cache_start, max_new_tokens, min_new_tokens,
                 temperature, top_k, top_p, stop_ids, pad_id, greedy, use_filter,
                 processed_logprobs) -> DecodeState:
    """The ``lax.while_loop`` shared by both decode paths.

    step_fn(cache, token (B,), position (B,), cache_index) -> (logits (B, V), cache).
    """
    is_stop_vocab = jnp.zeros((vocab,), bool).at[jnp.where(stop_ids >= 0, stop_ids, vocab)].set(
        True, mode="drop"
    )

    def cond(s: DecodeState):
        return (s.step < max_new_tokens) & ~jnp.all(s.done)

    def body(s: DecodeState) -> DecodeState:
        logits, cache = step_fn(s.cache, s.token, s.position, cache_start + s.step)
        logits = logits.astype(jnp.float32)  # (B, V)
        key, sub = jax.random.split(s.key)
        masked = jnp.where((s.step < min_new_tokens) & is_stop_vocab[None, :], NEG_INF, logits)
        token, processed = select_tokens(
            masked, sub, temperature, top_k, top_p, greedy=greedy, use_filter=use_filter
        )
        logprob = processed if processed_logprobs else gather_logprob(logits, token)
        token = jnp.where(s.done, pad_id, token)
        logprob = jnp.where(s.done, 0.0, logprob)
        hit_stop = ~s.done & jnp.any(token[:, None] == stop_ids[None, :], axis=-1)
        return DecodeState(
            cache=cache,
            token=token,
            position=s.position + 1,
            step=s.step + 1,
            done=s.done | hit_stop,
            tokens=jax.lax.dynamic_update_slice(s.tokens, token[:, None], (0, s.step)),
            logprobs=jax.lax.dynamic_update_slice(s.logprobs, logprob[:, None], (0, s.step)),
            lengths=s.lengths + (~s.done).astype(jnp.int32),
            stopped=s.stopped | hit_stop,
            key=key,
        )

    return jax.lax.while_loop(cond, body, loop)


_STATIC = ("greedy", "use_filter", "processed_logprobs")


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=_STATIC, donate_argnums=(2,))
def _decode_generic(graphdef, state, loop: DecodeState, *scalars, greedy, use_filter,
                    processed_logprobs) -> DecodeState:
    """Decode loop calling ``CausalLM.__call__`` (stacked KVCache). Scalars: cache_start,
    max_new_tokens, min_new_tokens () int32; temperature () f32; top_k () int32; top_p () f32;
    stop_ids (K,) int32 padded with -1; pad_id () int32."""
    model = nnx.merge(graphdef, state)
    ones = jnp.ones((loop.token.shape[0], 1), bool)

    def step_fn(cache, token, position, index):
        logits, cache = model(token[:, None], position[:, None], ones, cache=cache, cache_index=index)
        return logits[:, 0], cache

    return _decode_loop(step_fn, model.config.vocab_size, loop, *scalars, greedy, use_filter,
                        processed_logprobs)


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=_STATIC, donate_argnums=(2,))
def _decode_unrolled(config, weights: dict, loop: DecodeState, *scalars, greedy, use_filter,
                     processed_logprobs) -> DecodeState:
    """Decode loop over the unrolled weights (``unroll_params``) and a ``LayerCache``."""
    ones = jnp.ones((loop.token.shape[0], 1), bool)

    def step_fn(cache, token, position, index):
        hidden, cache = forward_hidden(weights, config, token[:, None], position[:, None], ones,
                                       cache, index)
        return lm_logits(weights, hidden[:, 0]), cache

    return _decode_loop(step_fn, config.vocab_size, loop, *scalars, greedy, use_filter,
                        processed_logprobs)


def compiled_program_counts() -> dict[str, int]:
    """Executables JAX holds for the sampler's prefill and decode programs (its own compile
    caches, read only): a new entry per new shape bucket or static setting."""
    return {"prefill": _prefill._cache_size(),
            "decode": _decode_unrolled._cache_size() + _decode_generic._cache_size()}


# ------------------------------------------------------------------------- public API
@dataclasses.dataclass(frozen=True)
class SamplerOutput:
    """Host-side result of ``generate_tokens`` (R = number of prompts, N = max_new_tokens).

    tokens (R, N) int32 (``pad_id`` after a stop / past the end), logprobs (R, N) float32
    (0 past the end), lengths (R,) int32 generated tokens (stop token included),
    stopped (R,) bool (a stop token ended the row).
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    stopped: np.ndarray

    def row(self, i: int) -> tuple[list[int], list[float]]:
        n = int(self.lengths[i])
        return self.tokens[i, :n].tolist(), self.logprobs[i, :n].tolist()


def generate_tokens(
    model,
    prompts: Sequence[Sequence[int]],
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop_token_ids: Sequence[int] = (),
    min_new_tokens: int = 0,
    pad_id: int = 0,
    logprobs_mode: str = "raw",
    config: SamplerConfig = SamplerConfig(),
    graph_and_state: tuple[Any, Any] | None = None,
    weights: dict | None = None,
) -> SamplerOutput:
    """Samples continuations of token-id prompts with the jitted KV-cache sampler.

    Args:
      model: a ``jax_drive.models.CausalLM`` (nnx module with a ``config``).
      prompts: R non-empty token-id lists (any lengths; left-padded here).
      key: PRNG key; equal keys and inputs give equal outputs.
      max_new_tokens, temperature, top_p, top_k, stop_token_ids, min_new_tokens,
      logprobs_mode: see ``SamplingParams`` (temperature 0 = greedy).
      pad_id: token id used for padding (inputs and outputs).
      config: shape bucketing.
      graph_and_state: ``nnx.split(model)`` when the caller already has it.
      weights: the model's unrolled decode weights when the caller keeps them
        (``DecodeWeightCache``); built here when None and ``config.unroll_layers``.

    Returns:
      SamplerOutput with (R, max_new_tokens) arrays.
    """
    prompts = [list(map(int, p)) for p in prompts]
    if not prompts:
        raise ValueError("no prompts")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if logprobs_mode not in ("raw", "processed"):
        raise ValueError(f"logprobs_mode must be 'raw' or 'processed', got {logprobs_mode!r}")
    mcfg = model.config
    vocab = mcfg.vocab_size
    for p in prompts:
        if min(p) < 0 or max(p) >= vocab:
            raise ValueError(f"prompt token ids must lie in [0, {vocab}), got {min(p)}..{max(p)}")
    stop_ids = [int(s) for s in stop_token_ids]
    if any(not (0 <= s < vocab) for s in stop_ids):
        raise ValueError(f"stop_token_ids must lie in [0, {vocab}), got {stop_ids}")
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > mcfg.max_position_embeddings:
        raise ValueError(
            f"prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds the model's "
            f"max_position_embeddings ({mcfg.max_position_embeddings})"
        )

    plen = bucket_size(longest, config.prompt_buckets, config.min_prompt_bucket, "prompt length")
    nbucket = bucket_size(max_new_tokens, config.gen_buckets, config.min_gen_bucket, "max_new_tokens")
    rows = len(prompts)
    batch = next_power_of_two(rows) if config.bucket_batch else rows
    ids, mask, row_valid = left_pad(prompts, plen, batch, pad_id)
    kpad = max(config.max_stop_ids, next_power_of_two(max(1, len(stop_ids))))
    stop_arr = np.full((kpad,), -1, np.int32)
    stop_arr[: len(stop_ids)] = stop_ids

    graphdef, state = graph_and_state if graph_and_state is not None else nnx.split(model)
    if config.unroll_layers and weights is None:
        weights = unrolled_weights(model)
    elif not config.unroll_layers:
        weights = None
    greedy = float(temperature) == 0.0
    loop = _prefill(
        graphdef, state, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(row_valid), key,
        nbucket, weights is not None,
    )
    scalars = (
        jnp.int32(plen - 1),
        jnp.int32(max_new_tokens),
        jnp.int32(min_new_tokens),
        jnp.float32(1.0 if greedy else temperature),
        jnp.int32(top_k),
        jnp.float32(top_p),
        jnp.asarray(stop_arr),
        jnp.int32(pad_id),
    )
    statics = dict(
        greedy=greedy,
        use_filter=(not greedy) and (top_k > 0 or top_p < 1.0),
        processed_logprobs=logprobs_mode == "processed",
    )
    if weights is not None:
        out = _decode_unrolled(mcfg, weights, loop, *scalars, **statics)
    else:
        out = _decode_generic(graphdef, state, loop, *scalars, **statics)
    tokens, logprobs, lengths, stopped = jax.device_get(
        (out.tokens, out.logprobs, out.lengths, out.stopped)
    )
    tokens = np.asarray(tokens)[:rows, :max_new_tokens].copy()
    logprobs = np.asarray(logprobs)[:rows, :max_new_tokens].copy()
    lengths = np.asarray(lengths)[:rows]
    # Columns never reached (early exit of the whole batch) hold zeros: make them pads.
    past = np.arange(max_new_tokens)[None, :] >= lengths[:, None]
    tokens[past] = pad_id
    logprobs[past] = 0.0
    return SamplerOutput(
        tokens=tokens, logprobs=logprobs, lengths=lengths, stopped=np.asarray(stopped)[:rows]
    )
