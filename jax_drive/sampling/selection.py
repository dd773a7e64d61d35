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

    logits (B, V) float32 (any masking already applied); key: one PRNG key, or (B,) keys
    (one per row, see :func:`categorical_rows`). ``greedy`` and ``use_filter`` are static. Returns token (B,) int32 and the processed log-prob (B,) float32 of the token
    (log-softmax of the temperature-scaled, filtered logits; 0 when greedy).
    """
    if greedy:
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return token, jnp.zeros(token.shape, jnp.float32)
    scaled = processed_logits(logits, temperature, top_k, top_p, use_filter=use_filter)
    token = categorical_rows(key, scaled).astype(jnp.int32)
    return token, gather_logprob(scaled, token)


def categorical_rows(key: jax.Array, logits: jax.Array) -> jax.Array:
    """One draw per row of logits (B, V): all rows from one key (shape ()), or row b from
    ``key[b]`` (a (B,) key array), so a row's draw does not depend on the other rows."""
    if key.ndim == 0:
        return two_level_gumbel_max(key, logits)
    return jax.vmap(lambda k, row: two_level_gumbel_max(k, row[None])[0])(key, logits)


GUMBEL_BLOCK = 256  # vocabulary entries per block of the two-level draw


def two_level_gumbel_max(key: jax.Array, logits: jax.Array) -> jax.Array:
    """Index drawn with probability softmax(logits), by Gumbel-max over blocks then within one.

    logits (B, V) float32 (``NEG_INF`` entries are never drawn); returns (B,) int32. The
    vocabulary is cut into blocks of :data:`GUMBEL_BLOCK`; a block is picked by Gumbel-max
    over the blocks' log-masses (logsumexp), then an entry by Gumbel-max within it:
    P(j) = (m_b / sum m) (p_j / m_b) = p_j. Like ``jax.random.categorical`` (one Gumbel per
    entry) the pick only changes under float rounding of the logits when two perturbed
    scores nearly tie, unlike an inverse-CDF draw, whose running sums move every boundary.
    It needs V / 256 + 256 Gumbels per row instead of V. ``experiments/bench_draw.py``
    compares its time per draw and its stability under logit noise with both.
    """
    rows, vocab = logits.shape
    blocks = -(-vocab // GUMBEL_BLOCK)
    padded = jnp.pad(logits, ((0, 0), (0, blocks * GUMBEL_BLOCK - vocab)), constant_values=NEG_INF)
    padded = padded.reshape(rows, blocks, GUMBEL_BLOCK)
    key_block, key_entry = jax.random.split(key)
    log_mass = jax.nn.logsumexp(padded, axis=-1)  # (B, blocks)
    block = jnp.argmax(log_mass + jax.random.gumbel(key_block, log_mass.shape), axis=-1)
    inner = jnp.take_along_axis(padded, block[:, None, None], axis=1)[:, 0]  # (B, GUMBEL_BLOCK)
    entry = jnp.argmax(inner + jax.random.gumbel(key_entry, inner.shape), axis=-1)
    return (block * GUMBEL_BLOCK + entry).astype(jnp.int32)


def take_token(values: jax.Array, token: jax.Array) -> jax.Array:
    """values (..., V), token (...) int -> values[..., token] (...)."""
    return jnp.take_along_axis(values, token[..., None], axis=-1)[..., 0]


def gather_logprob(logits: jax.Array, token: jax.Array) -> jax.Array:
    """log_softmax(logits)[token]: logits (..., V) float32, token (...) -> (...) float32."""
    return take_token(jax.nn.log_softmax(logits, axis=-1), token)
