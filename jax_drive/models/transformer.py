"""Decoder-only transformer (Llama / SmolLM2 / Qwen2) in flax.nnx with a static KV cache.

Layout: the decoder blocks' weights are stacked along a leading layer axis and the blocks run
under `jax.lax.scan` (one traced block, fast compiles). Weight matrices are stored as
(in, out) kernels, i.e. the transpose of torch's `nn.Linear.weight`.

Shapes: B batch, L new tokens, S cache slots, H hidden, V vocab, Nq / Nk query / KV heads,
D head dim, F intermediate size, NL layers.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from jax_drive.models.config import ModelConfig

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ATTENTION_PROJECTIONS = PROJECTIONS[:4]
MLP_PROJECTIONS = PROJECTIONS[4:]
_NEG = -0.7 * float(jnp.finfo(jnp.float32).max)


class LoRAParam(nnx.Param):
    """Trainable low-rank adapter weights; select them with `nnx.state(model, LoRAParam)`."""


# --------------------------------------------------------------------------- cache
@flax.struct.dataclass
class KVCache:
    """Static key/value cache.

    Attributes:
      k, v: (NL, B, S, Nk, D) cached keys (after RoPE) and values.
      mask: (B, S) bool, True where a slot holds a real (non-pad) key.
    """

    k: jax.Array
    v: jax.Array
    mask: jax.Array

    @property
    def max_len(self) -> int:
        return self.k.shape[2]


def init_cache(config: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache: zeros and an all-False mask. dtype defaults to the config's dtype."""
    if batch <= 0 or max_len <= 0:
        raise ValueError(f"batch and max_len must be positive, got {batch}, {max_len}")
    dtype = config.jnp_dtype if dtype is None else jnp.dtype(dtype)
    shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        mask=jnp.zeros((batch, max_len), bool),
    )


def positions_from_mask(attention_mask: jax.Array, offset: jax.Array | int = 0) -> jax.Array:
    """RoPE positions for a left-padded batch: cumsum(mask) - 1 (+ offset), clipped at 0.

    Args:
      attention_mask: (B, L) bool.
      offset: scalar or (B,) number of real tokens before these ones.
    Returns:
      (B, L) int32.
    """
    pos = jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1
    offset = jnp.asarray(offset, jnp.int32)
    if offset.ndim == 1:
        offset = offset[:, None]
    return jnp.maximum(pos + offset, 0).astype(jnp.int32)


# --------------------------------------------------------------------------- math helpers
def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """HF-style RMSNorm: normalise in float32, cast back, then scale. x (..., H)."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight * xf.astype(x.dtype)


def rope_inv_freq(config: ModelConfig) -> jax.Array:
    """(D/2,) float32 inverse frequencies, with llama3 scaling when configured."""
    d = config.head_dim
    inv = 1.0 / (config.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    if config.rope_type == "llama3":
        old = config.rope_original_max_position_embeddings
        low_wavelen = old / config.rope_low_freq_factor
        high_wavelen = old / config.rope_high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = jnp.where(wavelen > low_wavelen, inv / config.rope_factor, inv)
        smooth = (old / wavelen - config.rope_low_freq_factor) / (
            config.rope_high_freq_factor - config.rope_low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / config.rope_factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = jnp.where(medium, smoothed, scaled)
    return inv


def rope_tables(config: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos, sin tables (B, L, D) float32 for positions (B, L) (non-interleaved halves)."""
    angles = positions.astype(jnp.float32)[..., None] * rope_inv_freq(config)
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates x (B, L, N, D) by cos/sin (B, L, D) with the rotate-half convention."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos = cos[:, :, None, :].astype(x.dtype)
    sin = sin[:, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query softmax attention.

    Args:
      q: (B, L, Nq, D); k, v: (B, S, Nk, D); mask: (B, L, S) bool (True = may attend).
    Returns:
      (B, L, Nq * D) in v's dtype. Rows with no allowed key give a finite (uniform) mix.
    """
    b, l, nq, d = q.shape
    nk = k.shape[2]
    q = q.reshape(b, l, nk, nq // nk, d)
    scores = jnp.einsum("blkgd,bskd->bkgls", q, k, preferred_element_type=jnp.float32)
    scores = scores * (d**-0.5)
    scores = jnp.where(mask[:, None, None], scores, _NEG)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgls,bskd->blkgd", probs, v)
    return out.reshape(b, l, nq * d)


def attention_head_major(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """:func:`attention` with keys / values stored head-major, the decode cache's layout.

    Args: q (B, L, Nq, D); k, v (B, Nk, S, D); mask (B, L, S) bool.
    Returns: (B, L, Nq * D) in v's dtype. Reading k / v in this layout needs no transpose
    of the whole cache (XLA:CPU copied every layer's (B, S, Nk, D) cache on every step).
    """
    b, l, nq, d = q.shape
    nk = k.shape[1]
    g = nq // nk
    # Rows (l, g) of one kv head side by side: plain (L G, D) x (S, D)^T products per (b, k);
    # free reshapes when L = 1 (decode).
    q = jnp.swapaxes(q.reshape(b, l, nk, g, d), 1, 2).reshape(b, nk, l * g, d)
    scores = jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32) * (d**-0.5)
    rows_mask = jnp.broadcast_to(mask[:, None, :, None, :], (b, 1, l, g, mask.shape[-1])).reshape(b, 1, l * g, -1)
    probs = jax.nn.softmax(jnp.where(rows_mask, scores, _NEG), axis=-1).astype(v.dtype)
    out = jnp.einsum("bkqs,bksd->bkqd", probs, v).reshape(b, nk, l, g, d)
    return jnp.swapaxes(out, 1, 2).reshape(b, l, nq * d)


ATTENTION_BLOCK = 128  # query rows per block of causal self-attention without a cache


def causal_self_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                          block: int = ATTENTION_BLOCK) -> jax.Array:
    """:func:`attention` for a causal sequence attending to itself (no cache), in query blocks.

    Query rows [s, e) can only attend to keys [0, e), so each block's scores are (e, not L)
    wide: about half the score work of the full (L, L) product, and the (B, Nq, block, e)
    intermediates stay small (fwd + bwd of one SmolLM2 layer at B=2, L=1024 on one core:
    415 ms instead of 872 ms). Blocks are a static Python loop (shapes differ per block).

    Args: q (B, L, Nq, D); k, v (B, L, Nk, D); mask (B, L, L) bool, causal.
    Returns: (B, L, Nq * D). Equal to :func:`attention` on every row with an allowed key;
      a row with none (left padding) gets a uniform mix over its block's key range instead.
    """
    l = q.shape[1]
    if l <= block:
        return attention(q, k, v, mask)
    outs = []
    for start in range(0, l, block):
        end = min(start + block, l)
        outs.append(attention(q[:, start:end], k[:, :end], v[:, :end], mask[:, start:end, :end]))
    return jnp.concatenate(outs, axis=1)


def linear(x: jax.Array, p: dict[str, Any]) -> jax.Array:
    """x (..., in) @ kernel (in, out) [+ bias] [+ LoRA (x @ A) @ B * scale]."""
    y = x @ p["kernel"]
    if p.get("bias") is not None:
        y = y + p["bias"]
    if p.get("lora_a") is not None:
        a = p["lora_a"].astype(x.dtype)
        b = p["lora_b"].astype(x.dtype)
        y = y + ((x @ a) @ b) * jnp.asarray(p["lora_scale"], x.dtype)
    return y


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


class DecoderStack(nnx.Module):
    """All decoder blocks, weights stacked along the layer axis."""

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

    def projections(self) -> dict[str, StackedLinear]:
        return {name: getattr(self, name) for name in PROJECTIONS}

    def arrays(self) -> dict[str, Any]:
        """Per-layer-stacked arrays of all blocks (input of `decoder_blocks`)."""
        params: dict[str, Any] = {name: p.arrays() for name, p in self.projections().items()}
        params["input_norm"] = self.input_norm[...]
        params["post_attention_norm"] = self.post_attention_norm[...]
        return params


def decoder_blocks(config: ModelConfig, params: dict[str, Any], x: jax.Array, cos: jax.Array,
                   sin: jax.Array, attention_mask: jax.Array, cache: KVCache | None,
                   cache_index: jax.Array, empty_cache: bool = False):
    """Runs the scanned decoder blocks.

    Args:
      params: `DecoderStack.arrays()` (every leaf has the leading NL axis).
      x: (B, L, H) embeddings; cos, sin: (B, L, D); attention_mask: (B, L) bool.
      cache: KVCache or None; cache_index: int32 scalar.
      empty_cache (static): the cache holds no real slot before ``cache_index`` (a prefill).
        The new tokens then only see each other, so attention runs causally over the L new
        keys in query blocks (:func:`causal_self_attention`) instead of over all S slots;
        the keys / values are still written to the cache.
    Returns:
      (B, L, H) residual stream after the last block, updated cache or None.
    """
    b, l, _ = x.shape
    c = config
    if cache is None or empty_cache:
        causal = jnp.tril(jnp.ones((l, l), bool))
        mask = causal[None] & attention_mask[:, None, :]
        new_mask = None if cache is None else jax.lax.dynamic_update_slice(
            cache.mask, attention_mask, (0, cache_index))
    else:
        new_mask = jax.lax.dynamic_update_slice(cache.mask, attention_mask, (0, cache_index))
        slots = jnp.arange(cache.max_len)
        limit = cache_index + jnp.arange(l) + 1  # (L,)
        mask = (slots[None, :] < limit[:, None])[None] & new_mask[:, None, :]

    def block(h, xs):
        lp, ck, cv = xs
        y = rms_norm(h, lp["input_norm"], c.rms_norm_eps)
        q = linear(y, lp["q_proj"]).reshape(b, l, c.num_heads, c.head_dim)
        k = linear(y, lp["k_proj"]).reshape(b, l, c.num_kv_heads, c.head_dim)
        v = linear(y, lp["v_proj"]).reshape(b, l, c.num_kv_heads, c.head_dim)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        if ck is not None:
            ck = jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype), (0, cache_index, 0, 0))
            cv = jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype), (0, cache_index, 0, 0))
            if empty_cache:
                att = causal_self_attention(q, k.astype(ck.dtype).astype(q.dtype),
                                            v.astype(cv.dtype).astype(q.dtype), mask)
            else:
                att = attention(q, ck.astype(q.dtype), cv.astype(q.dtype), mask)
        else:
            att = causal_self_attention(q, k, v, mask)
        h = h + linear(att, lp["o_proj"])
        y = rms_norm(h, lp["post_attention_norm"], c.rms_norm_eps)
        y = jax.nn.silu(linear(y, lp["gate_proj"])) * linear(y, lp["up_proj"])
        h = h + linear(y, lp["down_proj"])
        return h, (ck, cv)

    if cache is None:
        if c.remat_layers:
            block = jax.checkpoint(block, prevent_cse=False)  # inside scan CSE cannot cross steps
        x, _ = jax.lax.scan(block, x, (params, None, None))
        return x, None
    x, (k_all, v_all) = jax.lax.scan(block, x, (params, cache.k, cache.v))
    return x, KVCache(k=k_all, v=v_all, mask=new_mask)


@partial(jax.jit, static_argnames=("config", "empty_cache"))
def forward_hidden(params: dict[str, Any], config: ModelConfig, input_ids: jax.Array,
                   positions: jax.Array, attention_mask: jax.Array, cache: KVCache | None,
                   cache_index: jax.Array, empty_cache: bool = False):
    """Pure forward to the final normed hidden states (B, L, H) and the updated cache.

    params: `CausalLM.arrays()`. Jitted (inlined when called under an outer jit).
    empty_cache: see :func:`decoder_blocks`.
    """
    x = jnp.take(params["embed"], input_ids.astype(jnp.int32), axis=0)
    cos, sin = rope_tables(config, positions)
    x, cache = decoder_blocks(config, params["layers"], x, cos, sin,
                              attention_mask.astype(bool), cache, cache_index, empty_cache)
    return rms_norm(x, params["final_norm"], config.rms_norm_eps), cache


def _head(params: dict[str, Any]) -> jax.Array:
    return params["embed"].T if params["lm_head"] is None else params["lm_head"]


@partial(jax.jit, static_argnames=("config",))
def forward_logits(params: dict[str, Any], config: ModelConfig, input_ids: jax.Array,
                   positions: jax.Array, attention_mask: jax.Array, cache: KVCache | None,
                   cache_index: jax.Array):
    """Pure forward: (logits (B, L, V) float32, cache or None)."""
    hidden, cache = forward_hidden(params, config, input_ids, positions, attention_mask, cache,
                                   cache_index)
    head = _head(params)
    logits = jnp.einsum("blh,hv->blv", hidden.astype(head.dtype), head,
                        preferred_element_type=jnp.float32)
    return logits, cache


@partial(jax.jit, static_argnames=("config", "chunk_size", "temperature"))
def forward_token_logprobs(params: dict[str, Any], config: ModelConfig, input_ids: jax.Array,
                           positions: jax.Array, attention_mask: jax.Array, targets: jax.Array,
                           chunk_size: int, temperature: float = 1.0) -> jax.Array:
    """Pure (B, L) log p(targets) via `chunked_token_logprobs` (see CausalLM.token_logprobs)."""
    hidden, _ = forward_hidden(params, config, input_ids, positions, attention_mask, None,
                               jnp.int32(0))
    return chunked_token_logprobs(hidden, targets, _head(params), chunk_size, temperature)


class CausalLM(nnx.Module):
    """Decoder-only language model.

    `model(input_ids, positions, attention_mask, cache=None, cache_index=0)` returns
    `(logits (B, L, V) float32, cache or None)`; see `__call__`.
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

    def arrays(self) -> dict[str, Any]:
        """All parameters as a dict of arrays (LoRA adapters included unless merged)."""
        return {
            "embed": self.embed[...],
            "layers": self.layers.arrays(),
            "final_norm": self.final_norm[...],
            "lm_head": None if self.lm_head is None else self.lm_head[...],
        }

    def _hidden(self, input_ids, positions, attention_mask, cache, cache_index):
        self._check(input_ids, positions, attention_mask, cache, cache_index)
        return forward_hidden(self.arrays(), self.config, input_ids, positions,
                              attention_mask, cache, jnp.asarray(cache_index, jnp.int32))

    def head_matrix(self) -> jax.Array:
        """(H, V) output projection (the transposed embedding when tied)."""
        return self.embed[...].T if self.lm_head is None else self.lm_head[...]

    def logits_from_hidden(self, hidden: jax.Array) -> jax.Array:
        """hidden (..., H) -> float32 logits (..., V)."""
        w = self.head_matrix()
        return jnp.einsum("...h,hv->...v", hidden.astype(w.dtype), w,
                          preferred_element_type=jnp.float32)

    # ----------------------------------------------------------------- public API
    def __call__(self, input_ids: jax.Array, positions: jax.Array, attention_mask: jax.Array,
                 cache: KVCache | None = None, cache_index: jax.Array | int = 0):
        """Forward pass.

        Args:
          input_ids: (B, L) int32 new tokens.
          positions: (B, L) int32 RoPE positions (see `positions_from_mask`).
          attention_mask: (B, L) bool, True for real tokens (left padding allowed).
          cache: optional KVCache with S slots; the new keys/values are written at slots
            [cache_index, cache_index + L) and token i attends to real slots
            < cache_index + i + 1. Without a cache attention is causal over the L tokens,
            restricted to real keys.
          cache_index: int32 scalar, the first slot to write.
        Returns:
          logits (B, L, V) float32, and the updated cache (None without a cache).
        """
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

    def hidden_states(self, input_ids, positions, attention_mask, cache=None, cache_index=0):
        """Same inputs as `__call__`; returns the final normed hidden states (B, L, H)."""
        return self._hidden(input_ids, positions, attention_mask, cache, cache_index)[0]

    def token_logprobs(self, input_ids: jax.Array, positions: jax.Array,
                       attention_mask: jax.Array, targets: jax.Array,
                       chunk_size: int = 256, temperature: float = 1.0) -> jax.Array:
        """log p(targets[b, t] | input_ids[b, :t+1]) as (B, L) float32.

        ``temperature`` (a static float > 0) scores under softmax(logits / temperature), the
        distribution a sampler at that temperature draws from (no top-k/top-p filtering).

        The B*L hidden states are processed `chunk_size` tokens at a time (rematerialised in
        the backward pass), so at most a (chunk_size, V) float32 logits block exists at once.
        Entries at padded positions are computed but meaningless: mask them downstream.
        """
        if targets.shape != input_ids.shape:
            raise ValueError(f"targets {targets.shape} must match input_ids {input_ids.shape}")
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        self._check(input_ids, positions, attention_mask, None, 0)
        return forward_token_logprobs(self.arrays(), self.config, input_ids, positions,
                                      attention_mask, targets, int(chunk_size), float(temperature))


def chunked_token_logprobs(hidden: jax.Array, targets: jax.Array, head: jax.Array,
                           chunk_size: int = 256, temperature: float = 1.0) -> jax.Array:
    """log_softmax(hidden @ head / temperature)[targets] without a full (B, L, V) float32 tensor.

    Args:
      hidden: (B, L, H); targets: (B, L) int; head: (H, V); temperature: static float > 0.
    Returns:
      (B, L) float32.
    """
    b, l, h = hidden.shape
    n = b * l
    c = min(chunk_size, n)
    pad = (-n) % c
    flat_h = jnp.pad(hidden.reshape(n, h), ((0, pad), (0, 0)))
    flat_t = jnp.pad(targets.reshape(n).astype(jnp.int32), (0, pad))

    @jax.checkpoint
    def one(args):
        hc, tc = args  # (c, H), (c,)
        logits = jnp.einsum("ch,hv->cv", hc.astype(head.dtype), head,
                            preferred_element_type=jnp.float32)
        if temperature != 1.0:
            logits = logits / temperature
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, tc[:, None], axis=-1)[:, 0]
        return picked - lse

    out = jax.lax.map(one, (flat_h.reshape(-1, c, h), flat_t.reshape(-1, c)))
    return out.reshape(-1)[:n].reshape(b, l)
