"""The pieces every decoder forward path shares: key-value caches and their slot writes,
RMSNorm, rotary tables, attention (cached, head-major and block-causal), linear layers with
a LoRA update.

Shapes: B batch, L new tokens, S cache slots, H hidden, Nq / Nk query / KV heads, D head dim,
NL layers.
"""

from __future__ import annotations

import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from jax_drive.models.config import ModelConfig

_NEG = -0.7 * float(jnp.finfo(jnp.float32).max)


# --------------------------------------------------------------------------- caches
@flax.struct.dataclass
class KVCache:
    """Static key/value cache, layers stacked (the layout of the scanned forward).

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


@flax.struct.dataclass
class LayerCache:
    """Key/value cache with one head-major buffer per layer (the layout of the unrolled forward).

    Attributes:
      k, v: tuples of NL arrays (B, Nk, S, D); mask: (B, S) bool (slot holds a real key).

    Separate buffers let each layer's slots be updated in place inside a decode loop, and the
    head-major layout is the one the attention products read, so XLA:CPU does not transpose
    every layer's whole cache on every step (with (B, S, Nk, D) a SmolLM2 decode step at
    B = 8, S = 1664 took ~2x longer).
    """

    k: tuple
    v: tuple
    mask: jax.Array

    @property
    def max_len(self) -> int:
        return self.mask.shape[1]

    @classmethod
    def from_stacked(cls, cache: KVCache) -> "LayerCache":
        """The same keys / values split per layer and made head-major."""
        n = cache.k.shape[0]
        return cls(k=tuple(jnp.swapaxes(cache.k[i], 1, 2) for i in range(n)),
                   v=tuple(jnp.swapaxes(cache.v[i], 1, 2) for i in range(n)), mask=cache.mask)

    def select_rows(self, rows: jax.Array) -> "LayerCache":
        """The cache of batch rows ``rows`` ((B',) int32, repeats allowed), in that order."""
        return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), self)

    def resize(self, slots: int) -> "LayerCache":
        """The first ``slots`` slots (static), padded with empty (masked) slots if longer."""
        def fit(x, axis):
            if slots <= x.shape[axis]:
                return jax.lax.slice_in_dim(x, 0, slots, axis=axis)
            pad = [(0, 0)] * x.ndim
            pad[axis] = (0, slots - x.shape[axis])
            return jnp.pad(x, pad)

        return LayerCache(k=tuple(fit(x, 2) for x in self.k), v=tuple(fit(x, 2) for x in self.v),
                          mask=fit(self.mask, 1))


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


def write_slots(buffer: jax.Array, values: jax.Array, index: jax.Array, axis: int) -> jax.Array:
    """buffer with ``values`` written at slots [index, index + L) of ``axis``.

    Args:
      buffer: (B, ...) array whose ``axis`` (> 0) holds S slots.
      values: like buffer with L instead of S along ``axis``.
      index: int32 () first slot for every row, or (B,) one first slot per row.
    """
    values = values.astype(buffer.dtype)
    index = jnp.asarray(index, jnp.int32)
    if index.ndim == 0:
        starts = [jnp.int32(0)] * buffer.ndim
        starts[axis] = index
        return jax.lax.dynamic_update_slice(buffer, values, starts)

    def row(buf, val, i):
        starts = [jnp.int32(0)] * buf.ndim
        starts[axis - 1] = i
        return jax.lax.dynamic_update_slice(buf, val, starts)

    return jax.vmap(row)(buffer, values, index)


def cache_attention_mask(cache_mask: jax.Array, index: jax.Array, length: int) -> jax.Array:
    """(B, L, S) bool: new token i (written at slot index + i) may attend to the real slots
    before and at its own, i.e. slots < index + i + 1 whose ``cache_mask`` is True.

    cache_mask: (B, S) bool, already holding the new tokens; index: () or (B,) int32.
    Slots at or after a row's index + L are never attended, whatever they hold.
    """
    slots = jnp.arange(cache_mask.shape[1])
    limit = jnp.asarray(index, jnp.int32)[..., None] + jnp.arange(length) + 1  # (L,) or (B, L)
    return (slots < limit[..., None]) & cache_mask[:, None, :]


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
                          block: int = ATTENTION_BLOCK, prefix: int = 0) -> jax.Array:
    """:func:`attention` for a causal sequence attending to itself (no cache), in query blocks.

    Query rows [s, e) can only attend to keys [0, prefix + e), so each block's scores are
    (prefix + e, not prefix + L) wide: about half the score work of the full (L, L) product,
    and the (B, Nq, block, prefix + e) intermediates stay small (fwd + bwd of one SmolLM2 layer at
    B=2, L=1024 on one core: 415 ms instead of 872 ms). Blocks are a static Python loop
    (shapes differ per block).

    Args: q (B, L, Nq, D); k, v (B, prefix + L, Nk, D): ``prefix`` keys every query may
      see (a cached prompt prefix), then the L keys of the queries themselves;
      mask (B, L, prefix + L) bool, causal over the last L keys.
    Returns: (B, L, Nq * D). Equal to :func:`attention` on every row with an allowed key;
      a row with none (left padding) gets a uniform mix over its block's key range instead.
    """
    l = q.shape[1]
    if l <= block:
        return attention(q, k, v, mask)
    outs = []
    for start in range(0, l, block):
        end = prefix + min(start + block, l)
        outs.append(attention(q[:, start:end - prefix], k[:, :end], v[:, :end], mask[:, start:end - prefix, :end]))
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


def low_rank_update(lora_a: jax.Array, lora_b: jax.Array, scale: jax.Array | float) -> jax.Array:
    """float32 LoRA update A @ B * scale: A (..., in, r), B (..., r, out), scale () or (...,)."""
    delta = jnp.einsum("...ir,...ro->...io", lora_a.astype(jnp.float32), lora_b.astype(jnp.float32))
    return delta * jnp.asarray(scale, jnp.float32)[..., None, None]


def fold_lora(p: dict[str, Any]) -> jax.Array:
    """The kernel of projection arrays ``p`` (see :func:`linear`) with its adapter folded in."""
    kernel = p["kernel"]
    if p.get("lora_a") is None:
        return kernel
    return (kernel.astype(jnp.float32) + low_rank_update(p["lora_a"], p["lora_b"], p["lora_scale"])
            ).astype(kernel.dtype)
