"""Token selection on float32 logits: temperature, top-k / top-p filtering, greedy or sampled
picks and the log-probabilities the sampler reports. Shapes: any leading dims (...), V vocab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30  # finite "minus infinity" for masking logits (avoids inf - inf = nan)


def filter_logits(logits: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Top-k then top-p (nucleus) filtering; removed entries become ``NEG_INF``.

    logits (..., V) float32 (already temperature-scaled); top_k () int32 (0 = off);
    top_p () float32 in (0, 1] (1 = off). Ties at the threshold are all kept.
    Returns (..., V) float32.
    """
    vocab = logits.shape[-1]
    sorted_desc = -jnp.sort(-logits, axis=-1)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    in_top_k = jnp.arange(vocab) < k
    probs = jax.nn.softmax(jnp.where(in_top_k, sorted_desc, NEG_INF), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = in_top_k & (mass_before < top_p)  # rank 0 is always kept
    n_keep = jnp.maximum(jnp.sum(keep, axis=-1), 1)
    threshold = jnp.take_along_axis(sorted_desc, (n_keep - 1)[..., None], axis=-1)
    return jnp.where(logits >= threshold, logits, NEG_INF)


def processed_logits(logits: jax.Array, temperature: jax.Array, top_k: jax.Array,
                     top_p: jax.Array, *, use_filter: bool) -> jax.Array:
    """(..., V) logits of the distribution tokens are drawn from: temperature-scaled, top-k /
    top-p filtered when ``use_filter`` (static); their log-softmax is the processed log-prob."""
    scaled = logits / temperature
    return filter_logits(scaled, top_k, top_p) if use_filter else scaled


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
    scaled = processed_logits(logits, temperature, top_k, top_p, use_filter=use_filter)
    token = jax.random.categorical(key, scaled, axis=-1).astype(jnp.int32)
    return token, gather_logprob(scaled, token)


def take_token(values: jax.Array, token: jax.Array) -> jax.Array:
    """values (..., V), token (...) int -> values[..., token] (...)."""
    return jnp.take_along_axis(values, token[..., None], axis=-1)[..., 0]


def gather_logprob(logits: jax.Array, token: jax.Array) -> jax.Array:
    """log_softmax(logits)[token]: logits (..., V) float32, token (...) -> (...) float32."""
    return take_token(jax.nn.log_softmax(logits, axis=-1), token)
