"""KV-cache building: the prefill programs that turn a planned call into a loop state.

Four paths fill a cache before the decode loop:

- **left-padded** (:func:`sampler_prefill`, no common prefix, no packing): the model's own
  ``prefill`` writes the first P - 1 prompt columns of every prefill row, attending causally
  over the prompt in query blocks rather than over all S slots, and without an LM head;
- **shared prefix** (``common > 0``, :func:`prefix_cache`): the C columns every row shares
  are prefilled once in a one-row batch and copied into every row's first slots; the rest
  attends to them through the cache. Rows that repeat a prompt (``source``) take a copy of
  its cache row;
- **packed** (:func:`packed_cache`): the rows' own parts are prefilled several to a row
  without padding and their keys / values placed at the slots of the left-padded layout;
- **session continuation** (:func:`continue_rows`): rows of a kept cache, resized, with a
  turn's appended tokens written at each row's own slot.

The cache layout is the left-padded one on every path, so the decode program is the
bucket's whichever path filled it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_drive.models.protocol import DecoderLM
from jax_drive.models.transformer import (
    KVCache,
    LayerCache,
    forward_hidden,
    init_cache,
    packed_prompt_kv,
    positions_from_mask,
)
from jax_drive.parallel import replicate, shard_batch
from jax_drive.sampling.packing import PackedPrompts
from jax_drive.sampling.plan import ContinuationPlan, PrefillPlan
from jax_drive.sampling.state import DecodeState, new_decode_state


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("slots", "width", "per_layer", "common"))
def sampler_prefill(graphdef, state, ids, mask, source, row_valid, key, history, history_len, *,
                    slots: int, width: int, per_layer: bool, positions=None, vision=None,
                    common: int = 0, packed: PackedPrompts | None = None) -> DecodeState:
    """Caches the first P - 1 prompt columns and returns the loop state before step 0.

    ids/mask (U, P) prompts as planned (``plan.PrefillPlan``); source (B,) int32: the prompt
    row of each of the B loop rows (shared prefill), or None when U == B and row b is prompt b;
    row_valid (B,) bool (False = dummy row, done from the start); history / history_len: see
    DecodeState. slots: cache length S; width: output columns; per_layer: a LayerCache (else
    KVCache). positions, vision: a prompt batch with images brings its (3, U, P) M-RoPE
    positions and its vision inputs (``VisionLM.multimodal_inputs``); decoding goes on from
    the last column's position (a text token: its three positions are equal).
    common: the first ``common`` columns are the same real tokens in every row (text models).
    packed: the prompt columns common .. P - 2 of every row packed without padding (seen from
    the B loop rows; text models).
    """
    model = nnx.merge(graphdef, state)
    config = model.config
    plen = ids.shape[1]
    if positions is None:
        positions = positions_from_mask(mask)
    images = {} if vision is None else {"vision": vision}
    head = prefix_cache(model, ids, positions, mask, common) if common else None
    if packed is not None:  # already the loop's rows
        cache = packed_cache(model, packed, head, slots, plen)
    else:
        cache = init_cache(config, ids.shape[0], slots, config.jnp_dtype)
        if common:  # the prefix in every row's first slots, the rest attending over the cache
            cache = cache.replace(k=cache.k.at[:, :, :common].set(head.k), v=cache.v.at[:, :, :common].set(head.v),
                                  mask=cache.mask.at[:, :common].set(True))
            _, cache = forward_hidden(model.arrays(), config, ids[:, common:-1], positions[:, common:-1],
                                      mask[:, common:-1], cache, jnp.int32(common))
        elif plen > 1:  # blocked causal attention over the prompt only
            cache = model.prefill(ids[:, :-1], positions[..., :-1], mask[:, :-1], cache, **images)
    positions = positions[0] if positions.ndim == 3 else positions  # (U, P): last column's onwards
    if source is not None:  # broadcast the shared prompts' rows
        if packed is None:
            cache = cache.replace(k=jnp.take(cache.k, source, axis=1), v=jnp.take(cache.v, source, axis=1),
                                  mask=jnp.take(cache.mask, source, axis=0))
        ids, positions = jnp.take(ids, source, axis=0), jnp.take(positions, source, axis=0)
    if per_layer:
        cache = LayerCache.from_stacked(cache)
    index = jnp.int32(plen - 1)
    if history is not None:  # rows advance differently: one cache slot per row
        index = jnp.full(row_valid.shape, plen - 1, jnp.int32)
    return new_decode_state(cache, ids[:, -1], positions[:, -1], index, row_valid, key, width,
                            history, history_len)


def prefill(model: DecoderLM, plan: PrefillPlan, key: jax.Array, graph_and_state, *, per_layer: bool,
            mesh=None, positions=None, vision=None) -> DecodeState:
    """Runs :func:`sampler_prefill` for ``plan``: the rows split over ``mesh``'s devices (None:
    one device), the weights and ``key`` (one for the call, or (B,) one per loop row) on every
    device. positions, vision: a VLM's inputs for the plan's prefill rows."""
    graphdef, state = graph_and_state if graph_and_state is not None else nnx.split(model)
    ids, mask, source, row_valid, history, history_len = (
        None if x is None else shard_batch(x, mesh) if mesh is not None else jnp.asarray(x)
        for x in (plan.ids, plan.mask, plan.source, plan.row_valid, plan.history, plan.history_len))
    packed = None if plan.packed is None else jax.tree.map(jnp.asarray, plan.packed)
    return sampler_prefill(graphdef, replicate(state, mesh), ids, mask, source, row_valid, replicate(key, mesh),
                           history, history_len, slots=plan.slots, width=plan.width, per_layer=per_layer,
                           positions=positions, vision=vision, common=plan.common, packed=packed)


def prefix_cache(model: DecoderLM, ids, positions, mask, common: int) -> KVCache:
    """The cache (NL, 1, C, Nk, D) of the first ``common`` columns (the same in every row),
    prefilled in a one-row batch."""
    return model.prefill(ids[:1, :common], positions[:1, :common], mask[:1, :common],
                         init_cache(model.config, 1, common, model.config.jnp_dtype))


def packed_cache(model: DecoderLM, packed: PackedPrompts, head: KVCache | None, slots: int, plen: int) -> KVCache:
    """The cache (NL, B, S, Nk, D) after prefilling columns [0, P - 1) of B rows: the common
    prefix ``head`` (C slots, or None) in every row's first slots, then each row's own part
    from the packed prefill at its left-padded slots ``packed.slot_token`` (B, P - 1 - C)."""
    prefix_k, prefix_v = (None, None) if head is None else (head.k[:, 0], head.v[:, 0])
    k, v = packed_prompt_kv(model.arrays(), model.config, packed.ids, packed.positions, packed.segments,
                            prefix_k, prefix_v)
    real = packed.slot_token >= 0
    rows, common = real.shape[0], plen - 1 - real.shape[1]

    def layout(x, prefix):  # packed (NL, M, K, Nk, D) -> (NL, B, S, Nk, D)
        flat = x.reshape(x.shape[0], -1, *x.shape[3:])
        parts = [jnp.where(real[None, :, :, None, None], jnp.take(flat, jnp.maximum(packed.slot_token, 0), axis=1), 0),
                 jnp.zeros((x.shape[0], rows, slots - plen + 1, *x.shape[3:]), x.dtype)]
        if prefix is not None:
            parts.insert(0, jnp.broadcast_to(prefix[:, None], (x.shape[0], rows, *prefix.shape[1:])))
        return jnp.concatenate(parts, axis=2)

    mask = jnp.concatenate([jnp.ones((rows, common), bool), real, jnp.zeros((rows, slots - plen + 1), bool)], 1)
    return KVCache(k=layout(k, prefix_k), v=layout(v, prefix_v), mask=mask)


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("slots",))
def continue_rows(config, weights: dict, cache: LayerCache, take, chunk, chunk_len, index,
                  position, *, slots: int) -> LayerCache:
    """Rows ``take`` (B,) of ``cache`` resized to ``slots`` slots, with ``chunk`` (B, A)
    (right-padded, ``chunk_len`` (B,) real tokens, the first at RoPE ``position`` (B,)) written
    at each row's slot ``index`` (B,)."""
    cache = cache.select_rows(take).resize(slots)
    if chunk.shape[1]:
        offsets = jnp.arange(chunk.shape[1])
        _, cache = forward_hidden(weights, config, chunk, position[:, None] + offsets,
                                  offsets < chunk_len[:, None], cache, index)
    return cache


def continue_state(config, weights: dict, cache: LayerCache, plan: ContinuationPlan, key: jax.Array) -> DecodeState:
    """The loop state of a session turn: the kept ``cache`` (unrolled ``weights``' model,
    ``config`` its ModelConfig) continued as ``plan`` says, before the turn's first step."""
    cache = continue_rows(config, weights, cache, jnp.asarray(plan.take), jnp.asarray(plan.chunk),
                          jnp.asarray(plan.chunk_len), jnp.asarray(plan.slot, jnp.int32),
                          jnp.asarray(plan.position, jnp.int32), slots=plan.slots)
    history, history_len = (None, None) if plan.history is None else (jnp.asarray(plan.history),
                                                                      jnp.asarray(plan.history_len))
    return new_decode_state(cache, jnp.asarray(plan.pending), jnp.asarray(plan.position + plan.chunk_len, jnp.int32),
                            jnp.asarray(plan.start, jnp.int32), jnp.asarray(np.arange(plan.batch) < plan.rows),
                            key, plan.width, history, history_len)
