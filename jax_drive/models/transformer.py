"""Decoder-only transformer (Llama / SmolLM2 / Qwen2) in flax.nnx with a static KV cache.

Layout: the decoder blocks' weights are stacked along a leading layer axis and the blocks run
under `jax.lax.scan` (one traced block, fast compiles). Weight matrices are stored as
(in, out) kernels, i.e. the transpose of torch's `nn.Linear.weight`.

Shapes: B batch, L new tokens, S cache slots, H hidden, V vocab, Nq / Nk query / KV heads,
D head dim, F intermediate size, NL layers.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jax_drive.models.config import ModelConfig
from jax_drive.models.layers import (
    KVCache,
    LayerCache,
    apply_rope,
    attention,
    attention_head_major,
    cache_attention_mask,
    causal_self_attention,
    fold_lora,
    linear,
    positions_from_mask,
    rms_norm,
    rope_tables,
    write_slots,
)
from kernels import LogprobConfig, token_logprobs

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Hugging Face names of each projection inside a decoder layer (checkpoint import and export).
HF_LAYER_KEYS = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj",
    "gate_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
}
ATTENTION_PROJECTIONS = PROJECTIONS[:4]
MLP_PROJECTIONS = PROJECTIONS[4:]


class LoRAParam(nnx.Param):
    """Trainable low-rank adapter weights; select them with `nnx.state(model, LoRAParam)`."""


# --------------------------------------------------------------------------- decoder block
def project_qkv(config: ModelConfig, layer: dict[str, Any], y: jax.Array):
    """Query / key / value projections of one layer.

    y (B, L, H) -> q (B, L, Nq, D), k, v (B, L, Nk, D). ``layer`` holds either separate
    ``q_proj`` / ``k_proj`` / ``v_proj`` arrays or one fused ``qkv_proj`` (one matmul).
    """
    b, l, _ = y.shape
    c = config
    if "qkv_proj" in layer:
        qd, kd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        qkv = linear(y, layer["qkv_proj"])
        q, k, v = qkv[..., :qd], qkv[..., qd:qd + kd], qkv[..., qd + kd:]
    else:
        q, k, v = (linear(y, layer[name]) for name in ("q_proj", "k_proj", "v_proj"))
    return (q.reshape(b, l, c.num_heads, c.head_dim), k.reshape(b, l, c.num_kv_heads, c.head_dim),
            v.reshape(b, l, c.num_kv_heads, c.head_dim))


def swiglu_mlp(layer: dict[str, Any], y: jax.Array) -> jax.Array:
    """down(silu(gate(y)) * up(y)) for y (..., H); separate ``gate_proj`` / ``up_proj`` or one
    fused ``gate_up_proj`` (gate columns first)."""
    if "gate_up_proj" in layer:
        gate_up = linear(y, layer["gate_up_proj"])
        f = gate_up.shape[-1] // 2
        gate, up = gate_up[..., :f], gate_up[..., f:]
    else:
        gate, up = linear(y, layer["gate_proj"]), linear(y, layer["up_proj"])
    return linear(jax.nn.silu(gate) * up, layer["down_proj"])


def decoder_block(config: ModelConfig, layer: dict[str, Any], h: jax.Array, cos: jax.Array,
                  sin: jax.Array, attend):
    """One pre-norm decoder block: h + attn(norm(h)), then + SwiGLU MLP(norm(h)).

    Args:
      layer: one layer's arrays: ``input_norm``, ``post_attention_norm`` (H,), projections as
        read by :func:`project_qkv` / :func:`swiglu_mlp` and ``o_proj`` (see :func:`linear`).
      h: (B, L, H) residual stream; cos, sin: (B, L, D) rotary tables for the L tokens
        (:func:`rope_tables`, or any other rotary scheme producing the same layout).
      attend: (q (B, L, Nq, D), k, v (B, L, Nk, D), rotary applied) -> (attention output
        (B, L, Nq * D), carry): stores the new keys / values wherever the caller caches them
        and attends; ``carry`` (e.g. the updated cache buffers) is returned unchanged.
    Returns:
      (B, L, H) residual stream after the block, and ``attend``'s carry.
    """
    eps = config.rms_norm_eps
    q, k, v = project_qkv(config, layer, rms_norm(h, layer["input_norm"], eps))
    att, carry = attend(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
    h = h + linear(att, layer["o_proj"])
    h = h + swiglu_mlp(layer, rms_norm(h, layer["post_attention_norm"], eps))
    return h, carry


# --------------------------------------------------------------------------- modules
class StackedLinear(nnx.Module):
    """NL stacked linear maps: kernel (NL, in, out), optional bias (NL, out) and LoRA A/B."""

    def __init__(self, num_layers: int, in_features: int, out_features: int, bias: bool,
                 dtype, rngs: nnx.Rngs, std: float = 0.02):
        init = jax.nn.initializers.normal(std)
        self.kernel = nnx.Param(init(rngs.params(), (num_layers, in_features, out_features),
                                     jnp.float32).astype(dtype))
        self.bias = nnx.Param(jnp.zeros((num_layers, out_features), dtype)) if bias else None
        self.lora_a: LoRAParam | None = nnx.data(None)  # (NL, in, r)
        self.lora_b: LoRAParam | None = nnx.data(None)  # (NL, r, out)
        self.lora_scale: float = 0.0  # alpha / rank
        self.lora_rank: int = 0
        self.lora_alpha: float = 0.0
        self.lora_merged: bool = False

    @property
    def in_features(self) -> int:
        return self.kernel.shape[1]

    @property
    def out_features(self) -> int:
        return self.kernel.shape[2]

    def arrays(self) -> dict[str, Any]:
        """The per-layer-stacked arrays used by the scanned block function."""
        out: dict[str, Any] = {"kernel": self.kernel[...]}
        if self.bias is not None:
            out["bias"] = self.bias[...]
        if self.lora_a is not None and not self.lora_merged:
            out["lora_a"] = self.lora_a[...]
            out["lora_b"] = self.lora_b[...]
            out["lora_scale"] = jnp.full((self.kernel.shape[0],), self.lora_scale, jnp.float32)
        return out


class StackedBlocks(nnx.Module):
    """Blocks whose weights are stacked along the block axis: the named :class:`StackedLinear`
    projections and (N, H) norm scales; subclasses name them in ``projection_names`` and
    ``norm_names``."""

    projection_names: tuple[str, ...] = ()
    norm_names: tuple[str, ...] = ()

    def projections(self) -> dict[str, StackedLinear]:
        return {name: getattr(self, name) for name in self.projection_names}

    def arrays(self) -> dict[str, Any]:
        """Per-block-stacked arrays of all blocks (the forward function's input)."""
        params: dict[str, Any] = {name: p.arrays() for name, p in self.projections().items()}
        params.update({name: getattr(self, name)[...] for name in self.norm_names})
        return params


class DecoderStack(StackedBlocks):
    """All decoder blocks, weights stacked along the layer axis (input of `decoder_blocks`)."""

    projection_names = PROJECTIONS
    norm_names = ("input_norm", "post_attention_norm")

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        c = config
        dt = c.jnp_dtype
        n, h = c.num_layers, c.hidden_size
        qd, kvd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        bias = c.attention_bias
        self.q_proj = StackedLinear(n, h, qd, bias, dt, rngs)
        self.k_proj = StackedLinear(n, h, kvd, bias, dt, rngs)
        self.v_proj = StackedLinear(n, h, kvd, bias, dt, rngs)
        self.o_proj = StackedLinear(n, qd, h, False, dt, rngs)
        self.gate_proj = StackedLinear(n, h, c.intermediate_size, False, dt, rngs)
        self.up_proj = StackedLinear(n, h, c.intermediate_size, False, dt, rngs)
        self.down_proj = StackedLinear(n, c.intermediate_size, h, False, dt, rngs)
        self.input_norm = nnx.Param(jnp.ones((n, h), dt))
        self.post_attention_norm = nnx.Param(jnp.ones((n, h), dt))


def unroll_params(params: dict[str, Any]) -> dict[str, Any]:
    """Stacked parameters (:meth:`CausalLM.arrays`) -> the unrolled layout: the same dict with
    ``layers`` a tuple of NL per-layer dicts, LoRA adapters folded in, q/k/v fused into one
    ``qkv_proj`` and gate/up into one ``gate_up_proj`` (fewer, larger matmuls).

    Why: on the CPU, XLA materialises a copy of every layer's weights when a scanned model
    slices them out of the stacked (NL, ...) arrays, doubling the memory traffic of a decode
    step; separate per-layer buffers avoid it. The copy costs one model's worth of memory.
    """
    st = params["layers"]

    def fused(names):
        out = {"kernel": jnp.concatenate([fold_lora(st[n]) for n in names], axis=-1)}
        if st[names[0]].get("bias") is not None:
            out["bias"] = jnp.concatenate([st[n]["bias"] for n in names], axis=-1)
        return out

    stacked = {
        "input_norm": st["input_norm"],
        "post_attention_norm": st["post_attention_norm"],
        "qkv_proj": fused(("q_proj", "k_proj", "v_proj")),
        "o_proj": {"kernel": fold_lora(st["o_proj"])},
        "gate_up_proj": fused(("gate_proj", "up_proj")),
        "down_proj": {"kernel": fold_lora(st["down_proj"])},
    }
    num_layers = st["input_norm"].shape[0]
    layers = tuple(jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(num_layers))
    return {**params, "layers": layers}


def decoder_blocks(config: ModelConfig, layers, x: jax.Array, cos: jax.Array, sin: jax.Array,
                   attention_mask: jax.Array, cache: KVCache | LayerCache | None,
                   cache_index: jax.Array, empty_cache: bool = False):
    """Runs all decoder blocks (:func:`decoder_block`) over new tokens.

    Args:
      layers: stacked layout (``CausalLM.arrays()["layers"]``, every leaf with a leading NL
        axis; the blocks run under ``lax.scan``, cache a ``KVCache`` or None) or unrolled layout
        (``unroll_params(...)["layers"]``, a tuple of per-layer dicts; a Python loop over the
        layers, cache a ``LayerCache`` or None).
      x: (B, L, H) embeddings; cos, sin: (B, L, D); attention_mask: (B, L) bool.
      cache_index: int32 () or (B,): the new keys / values go to slots [index, index + L) of
        each row, and new token i attends to the real slots < index + i + 1
        (:func:`cache_attention_mask`).
      empty_cache (static): the cache holds no real slot before ``cache_index`` (a prefill).
        The new tokens then only see each other, so attention runs causally over the L new
        keys in query blocks (:func:`causal_self_attention`) instead of over all S slots;
        the keys / values are still written to the cache.
    Returns:
      (B, L, H) residual stream after the last block, updated cache or None.
    """
    l = x.shape[1]
    unrolled = isinstance(layers, (tuple, list))
    if cache is not None and isinstance(cache, LayerCache) != unrolled:
        raise TypeError("stacked layers need a KVCache, unrolled layers a LayerCache")
    new_mask = None
    if cache is None or empty_cache:
        mask = jnp.tril(jnp.ones((l, l), bool))[None] & attention_mask[:, None, :]
    if cache is not None:
        new_mask = write_slots(cache.mask, attention_mask, cache_index, axis=1)
        if not empty_cache:
            mask = cache_attention_mask(new_mask, cache_index, l)
    slot_axis = 2 if unrolled else 1  # head-major (B, Nk, S, D) or (B, S, Nk, D) buffers

    def block(h, layer, ck, cv):
        def attend(q, k, v):
            if ck is None:
                return causal_self_attention(q, k, v, mask), (None, None)
            new_k, new_v = (jnp.swapaxes(t, 1, 2) if unrolled else t for t in (k, v))
            ck2 = write_slots(ck, new_k, cache_index, slot_axis)
            cv2 = write_slots(cv, new_v, cache_index, slot_axis)
            if empty_cache:  # the cache's rounding, without reading the S slots back
                att = causal_self_attention(q, k.astype(ck.dtype).astype(q.dtype),
                                            v.astype(cv.dtype).astype(q.dtype), mask)
            elif unrolled:
                att = attention_head_major(q, ck2.astype(q.dtype), cv2.astype(q.dtype), mask)
            else:
                att = attention(q, ck2.astype(q.dtype), cv2.astype(q.dtype), mask)
            return att, (ck2, cv2)

        return decoder_block(config, layer, h, cos, sin, attend)

    if unrolled:
        ks, vs = [], []
        for i, layer in enumerate(layers):
            x, (ck, cv) = block(x, layer, *((None, None) if cache is None else (cache.k[i], cache.v[i])))
            ks.append(ck)
            vs.append(cv)
        return x, None if cache is None else LayerCache(k=tuple(ks), v=tuple(vs), mask=new_mask)

    def scan_step(h, xs):
        return block(h, *xs)

    if cache is None:
        k = config.frozen_layers
        if k:  # no gradient through the first k blocks: autodiff sees a constant after them
            frozen = jax.tree.map(lambda a: a[:k], layers)
            layers = jax.tree.map(lambda a: a[k:], layers)
            x, _ = jax.lax.scan(scan_step, x, (frozen, None, None))
            x = jax.lax.stop_gradient(x)
        if config.remat_layers:  # inside scan CSE cannot cross steps
            scan_step = jax.checkpoint(scan_step, prevent_cse=False)
        if k < config.num_layers:
            x, _ = jax.lax.scan(scan_step, x, (layers, None, None))
        return x, None
    x, (k_all, v_all) = jax.lax.scan(scan_step, x, (layers, cache.k, cache.v))
    return x, KVCache(k=k_all, v=v_all, mask=new_mask)


@partial(jax.jit, static_argnames=("config", "empty_cache"))
def forward_hidden(params: dict[str, Any], config: ModelConfig, input_ids: jax.Array,
                   positions: jax.Array, attention_mask: jax.Array,
                   cache: KVCache | LayerCache | None, cache_index: jax.Array,
                   empty_cache: bool = False):
    """Pure forward to the final normed hidden states (B, L, H) and the updated cache.

    params: ``CausalLM.arrays()`` or ``unroll_params(...)`` (see :func:`decoder_blocks`).
    Jitted (inlined when called under an outer jit). empty_cache: see :func:`decoder_blocks`.
    """
    x = jnp.take(params["embed"], input_ids.astype(jnp.int32), axis=0)
    cos, sin = rope_tables(config, positions)
    x, cache = decoder_blocks(config, params["layers"], x, cos, sin,
                              attention_mask.astype(bool), cache, cache_index, empty_cache)
    return rms_norm(x, params["final_norm"], config.rms_norm_eps), cache


def packed_prompt_kv(params: dict[str, Any], config: ModelConfig, input_ids: jax.Array,
                     positions: jax.Array, segments: jax.Array, prefix_k: jax.Array | None = None,
                     prefix_v: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Keys and values of prompt pieces packed several to a row (a prefill without padding).

    Each piece (one prompt's tokens) fills consecutive columns of a packed row; its tokens
    attend causally to their own piece and, when given, to C prefix keys that every piece
    follows (a prompt prefix computed once). Equal, up to float rounding, to prefilling each
    piece in its own row.

    Args:
      params: stacked ``CausalLM.arrays()``.
      input_ids, positions, segments: (M, K) int32 packed tokens, their RoPE positions and
        the id of the piece each column belongs to (-1: an unused column).
      prefix_k, prefix_v: (NL, C, Nk, D) cached prefix keys / values, or None.
    Returns:
      k, v: (NL, M, K, Nk, D) in the cache dtype (the config's), rotary applied.
    """
    m, l = input_ids.shape
    dtype = config.jnp_dtype
    same = (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] >= 0)
    mask = same & jnp.tril(jnp.ones((l, l), bool))[None]
    c = 0 if prefix_k is None else prefix_k.shape[1]
    if c:
        mask = jnp.concatenate([jnp.ones((m, l, c), bool), mask], axis=-1)
    x = jnp.take(params["embed"], input_ids.astype(jnp.int32), axis=0)
    cos, sin = rope_tables(config, positions)

    def scan_step(h, xs):
        layer, pk, pv = xs

        def attend(q, k, v):
            k, v = k.astype(dtype), v.astype(dtype)  # the cache's rounding, as a plain prefill
            keys, values = k.astype(q.dtype), v.astype(q.dtype)
            if c:
                keys = jnp.concatenate([jnp.broadcast_to(pk.astype(q.dtype), (m, *pk.shape)), keys], axis=1)
                values = jnp.concatenate([jnp.broadcast_to(pv.astype(q.dtype), (m, *pv.shape)), values], axis=1)
            return causal_self_attention(q, keys, values, mask, prefix=c), (k, v)

        return decoder_block(config, layer, h, cos, sin, attend)

    _, (k_all, v_all) = jax.lax.scan(scan_step, x, (params["layers"], prefix_k, prefix_v))
    return k_all, v_all


# --------------------------------------------------------------------------- LM head
def project_to_vocab(hidden: jax.Array, weight: jax.Array, tied: bool = False) -> jax.Array:
    """hidden (..., H) -> float32 logits (..., V): ``weight`` is the (H, V) head, or the (V, H)
    token embedding when ``tied`` (read as is: no transposed copy)."""
    spec = "...h,vh->...v" if tied else "...h,hv->...v"
    return jnp.einsum(spec, hidden.astype(weight.dtype), weight, preferred_element_type=jnp.float32)


def lm_logits(params: dict[str, Any], hidden: jax.Array) -> jax.Array:
    """The LM head: final hidden states (..., H) -> float32 logits (..., V) (the tied embedding
    when ``params["lm_head"]`` is None)."""
    if params["lm_head"] is None:
        return project_to_vocab(hidden, params["embed"], tied=True)
    return project_to_vocab(hidden, params["lm_head"])


def head_matrix(params: dict[str, Any]) -> jax.Array:
    """(H, V) output projection (the transposed embedding when tied)."""
    return params["embed"].T if params["lm_head"] is None else params["lm_head"]


@partial(jax.jit, static_argnames=("config",))
def forward_logits(params: dict[str, Any], config: ModelConfig, input_ids: jax.Array,
                   positions: jax.Array, attention_mask: jax.Array,
                   cache: KVCache | LayerCache | None, cache_index: jax.Array):
    """Pure forward: (logits (B, L, V) float32, cache or None)."""
    hidden, cache = forward_hidden(params, config, input_ids, positions, attention_mask, cache,
                                   cache_index)
    return lm_logits(params, hidden), cache


@partial(jax.jit, static_argnames=("config", "chunk_size", "temperature"))
def forward_token_logprobs(params: dict[str, Any], config: ModelConfig, input_ids: jax.Array,
                           positions: jax.Array, attention_mask: jax.Array, targets: jax.Array,
                           chunk_size: int, temperature: float = 1.0, allowed=None) -> jax.Array:
    """Pure (B, L) log p(targets) via `head_token_logprobs` (see CausalLM.token_logprobs)."""
    hidden, _ = forward_hidden(params, config, input_ids, positions, attention_mask, None,
                               jnp.int32(0))
    return head_token_logprobs(params, hidden, targets, chunk_size, temperature, allowed)


class CausalLM(nnx.Module):
    """Decoder-only language model.

    `model(input_ids, positions, attention_mask, cache=None, cache_index=0)` returns
    `(logits (B, L, V) float32, cache or None)`; see `__call__`. Implements the sampler's
    model contract, `jax_drive.models.protocol.DecoderLM` (`config`, `__call__`, `prefill`,
    `arrays`; checked in tests/test_sampling_plan.py).
    """

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs | None = None):
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        rngs = nnx.Rngs(0) if rngs is None else rngs
        self.config = config
        dt = config.jnp_dtype
        init = jax.nn.initializers.normal(0.02)
        self.embed = nnx.Param(
            init(rngs.params(), (config.vocab_size, config.hidden_size), jnp.float32).astype(dt)
        )
        self.layers = DecoderStack(config, rngs)
        self.final_norm = nnx.Param(jnp.ones((config.hidden_size,), dt))
        if config.tie_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nnx.Param(  # (H, V)
                init(rngs.params(), (config.hidden_size, config.vocab_size),
                     jnp.float32).astype(dt)
            )

    # ----------------------------------------------------------------- internals
    def _check(self, input_ids, positions, attention_mask, cache, cache_index):
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be (B, L), got shape {input_ids.shape}")
        if positions.shape != input_ids.shape or attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"positions {positions.shape} and attention_mask {attention_mask.shape} must "
                f"match input_ids {input_ids.shape}"
            )
        if cache is not None:
            if cache.k.shape[1] != input_ids.shape[0]:
                raise ValueError(
                    f"cache batch {cache.k.shape[1]} != input batch {input_ids.shape[0]}"
                )
            if isinstance(cache_index, int) and cache_index + input_ids.shape[1] > cache.max_len:
                raise ValueError(
                    f"cache overflow: writing {input_ids.shape[1]} tokens at slot {cache_index} "
                    f"of a cache with {cache.max_len} slots"
                )

    @staticmethod
    def _default_inputs(input_ids, positions, attention_mask, cache, cache_index):
        """(positions, attention_mask) with the defaults of `__call__` filled in."""
        if attention_mask is None:
            attention_mask = jnp.ones(jnp.shape(input_ids), bool)
        if positions is None:
            before = 0
            if cache is not None:
                earlier = jnp.arange(cache.max_len) < jnp.asarray(cache_index, jnp.int32)
                before = jnp.sum(cache.mask & earlier, axis=-1)
            positions = positions_from_mask(attention_mask, before)
        return positions, attention_mask

    def arrays(self) -> dict[str, Any]:
        """All parameters as a dict of arrays (LoRA adapters included unless merged)."""
        return {
            "embed": self.embed[...],
            "layers": self.layers.arrays(),
            "final_norm": self.final_norm[...],
            "lm_head": None if self.lm_head is None else self.lm_head[...],
        }

    def _hidden(self, input_ids, positions, attention_mask, cache, cache_index):
        positions, attention_mask = self._default_inputs(input_ids, positions, attention_mask,
                                                         cache, cache_index)
        self._check(input_ids, positions, attention_mask, cache, cache_index)
        return forward_hidden(self.arrays(), self.config, input_ids, positions,
                              attention_mask, cache, jnp.asarray(cache_index, jnp.int32))

    def head_matrix(self) -> jax.Array:
        """(H, V) output projection (the transposed embedding when tied)."""
        return head_matrix(self.arrays())

    def logits_from_hidden(self, hidden: jax.Array) -> jax.Array:
        """hidden (..., H) -> float32 logits (..., V)."""
        return lm_logits(self.arrays(), hidden)

    # ----------------------------------------------------------------- public API
    def __call__(self, input_ids: jax.Array, positions: jax.Array | None = None,
                 attention_mask: jax.Array | None = None, cache: KVCache | None = None,
                 cache_index: jax.Array | int = 0):
        """Forward pass.

        Args:
          input_ids: (B, L) int32 new tokens.
          positions: (B, L) int32 RoPE positions (see `positions_from_mask`). Default: the
            real tokens are numbered on from the real slots of ``cache`` before
            ``cache_index`` (from 0 without a cache).
          attention_mask: (B, L) bool, True for real tokens (left padding allowed). Default:
            every token is real.
          cache: optional KVCache with S slots; the new keys/values are written at slots
            [cache_index, cache_index + L) and token i attends to real slots
            < cache_index + i + 1. Without a cache attention is causal over the L tokens,
            restricted to real keys.
          cache_index: int32 scalar, the first slot to write.
        Returns:
          logits (B, L, V) float32, and the updated cache (None without a cache).
        """
        positions, attention_mask = self._default_inputs(input_ids, positions, attention_mask,
                                                         cache, cache_index)
        self._check(input_ids, positions, attention_mask, cache, cache_index)
        return forward_logits(self.arrays(), self.config, input_ids, positions, attention_mask,
                              cache, jnp.asarray(cache_index, jnp.int32))

    def prefill(self, input_ids: jax.Array, positions: jax.Array, attention_mask: jax.Array,
                cache: KVCache) -> KVCache:
        """Writes the keys / values of a prompt (B, L) into slots [0, L) of an EMPTY cache
        (every mask slot False) and returns it. Same cache as ``self(..., cache=cache,
        cache_index=0)[1]``, but attention runs causally over the L prompt tokens in query
        blocks rather than over all S cache slots, and no logits are computed."""
        self._check(input_ids, positions, attention_mask, cache, 0)
        _, cache = forward_hidden(self.arrays(), self.config, input_ids, positions, attention_mask,
                                  cache, jnp.int32(0), empty_cache=True)
        return cache

    def hidden_states(self, input_ids, positions=None, attention_mask=None, cache=None,
                      cache_index=0):
        """Same inputs as `__call__`; returns the final normed hidden states (B, L, H)."""
        return self._hidden(input_ids, positions, attention_mask, cache, cache_index)[0]

    def token_logprobs(self, input_ids: jax.Array, positions: jax.Array,
                       attention_mask: jax.Array, targets: jax.Array,
                       chunk_size: int = 256, temperature: float = 1.0, allowed=None) -> jax.Array:
        """log p(targets[b, t] | input_ids[b, :t+1]) as (B, L) float32.

        ``temperature`` (a static float > 0) scores under softmax(logits / temperature), the
        distribution a sampler at that temperature draws from (no top-k/top-p filtering).
        ``allowed`` (``kernels.AllowedTokens``, per position): normalise over the tokens a
        grammar allowed there only (the masked policy of structured generation).

        The B*L hidden states are processed `chunk_size` tokens by one vocabulary chunk at a
        time (`head_token_logprobs`; recomputed in the backward pass), so no (B, L, V) or even
        (chunk_size, V) float32 logits tensor exists.
        Entries at padded positions are computed but meaningless: mask them downstream.
        """
        check_logprob_args(input_ids, targets, chunk_size, temperature)
        self._check(input_ids, positions, attention_mask, None, 0)
        return forward_token_logprobs(self.arrays(), self.config, input_ids, positions,
                                      attention_mask, targets, int(chunk_size), float(temperature), allowed)


def check_logprob_args(input_ids, targets, chunk_size: int, temperature: float) -> None:
    """Raises ValueError for token_logprobs arguments it cannot honour."""
    if targets.shape != input_ids.shape:
        raise ValueError(f"targets {targets.shape} must match input_ids {input_ids.shape}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")


def head_token_logprobs(params: dict[str, Any], hidden: jax.Array, targets: jax.Array,
                        chunk_size: int = 256, temperature: float = 1.0, allowed=None) -> jax.Array:
    """log_softmax(lm_logits(params, hidden) / temperature)[targets], never a (B, L, V) tensor.

    The LM head goes to ``kernels.token_logprobs`` as stored (the (V, H) embedding when tied,
    the (H, V) ``lm_head`` otherwise: no transposed copy): ``chunk_size`` tokens by a
    vocabulary chunk at a time, online logsumexp, a custom VJP that recomputes the blocks.
    The Pallas kernel runs on GPU/TPU, its pure-JAX twin on CPU.

    Args:
      hidden: (B, L, H); targets: (B, L) int; chunk_size: tokens per step; temperature:
        static float > 0; allowed: ``kernels.AllowedTokens`` (per-position allowed tokens) or None.
    Returns:
      (B, L) float32.
    """
    if params["lm_head"] is None:
        head, layout = params["embed"], "vd"
    else:
        head, layout = params["lm_head"], "dv"
    return token_logprobs(hidden, head, targets, temperature=temperature, head_layout=layout,
                          config=LogprobConfig(token_chunk=chunk_size), allowed=allowed)
