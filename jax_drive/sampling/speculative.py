"""Prompt-lookup speculative decoding: draft tokens by n-gram lookup in a row's own context,
verify them in one forward pass.

Drafting (:func:`lookup_drafts`): the last n tokens of the context (n from ``max_ngram`` down
to ``min_ngram``) are searched for earlier in the context; the earlier match followed by the
most context tokens (up to K), the most recent among those, proposes the tokens that followed
it. MTDrive's refinement turns repeat most of the previous answer's trajectory numbers, which
such a lookup finds.

Verification (:func:`accept_drafts`), for logits at the K + 1 positions (the pending token
and the K drafts): greedy decoding accepts the longest prefix of drafts equal to the argmax
and emits the argmax after it, so the output is exactly greedy decoding. Sampling uses the
speculative sampling rule for a deterministic draft (Leviathan et al. 2023, Chen et al. 2023):
draft d at a position whose (processed) distribution is p is accepted with probability
min(1, p(d) / q(d)) = p(d); on the first rejection the token is drawn from the residual
max(0, p - q), i.e. p without d, renormalised; after K acceptances a bonus token is drawn from
p. Each emitted token is then distributed exactly as p (P(d) = p(d); P(x != d) =
(1 - p(d)) p(x) / (1 - p(d))), so the output distribution equals plain sampling.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jax_drive.sampling.selection import NEG_INF, categorical_rows, processed_logits, take_token


@dataclasses.dataclass(frozen=True)
class PromptLookup:
    """Settings of prompt-lookup speculative decoding.

    Attributes:
      num_draft: K, tokens drafted per step; every step then runs the model on K + 1 tokens
        per row (default 4).
      max_ngram: longest context suffix looked up (default 3).
      min_ngram: shortest suffix looked up (default 1).
    """

    num_draft: int = 4
    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        if self.num_draft < 1:
            raise ValueError(f"num_draft must be >= 1, got {self.num_draft}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")


def lookup_drafts(history: jax.Array, length: jax.Array, lookup: PromptLookup):
    """Drafts by n-gram lookup.

    Args:
      history: (B, T) int32, row b's context in columns [0, length[b]) (the last one is the
        pending token, whose successor is drafted first).
      length: (B,) int32.
      lookup: static settings.
    Returns:
      drafts (B, K) int32 (0 where none) and num_valid (B,) int32: drafts[b, :num_valid[b]]
      followed an earlier occurrence of the longest matching suffix: of those followed by
      the most tokens (at most K), the most recent.
    """
    b, t = history.shape
    k = lookup.num_draft
    start = jnp.full((b,), -1, jnp.int32)
    found = jnp.zeros((b,), bool)
    for n in range(min(lookup.max_ngram, t - 1), lookup.min_ngram - 1, -1):
        suffix_cols = jnp.clip(length[:, None] - n + jnp.arange(n), 0, t - 1)
        suffix = jnp.take_along_axis(history, suffix_cols, axis=1)  # (B, n)
        windows = t - n  # window j covers [j, j + n); its successor is at j + n
        match = jnp.ones((b, windows), bool)
        for i in range(n):
            match &= history[:, i:i + windows] == suffix[:, i:i + 1]
        j = jnp.arange(windows)
        # an earlier window whose successor lies inside the context (excludes the suffix itself)
        match &= (j + n < length[:, None]) & (length[:, None] > n)
        following = jnp.minimum(length[:, None] - (j + n), k)  # drafts it would give
        best = jnp.max(jnp.where(match, following * windows + j, -1), axis=1)
        take = ~found & (best >= 0)
        start = jnp.where(take, best % windows + n, start)
        found |= take
    cols = start[:, None] + jnp.arange(k)
    valid = found[:, None] & (cols < length[:, None])
    drafts = jnp.where(valid, jnp.take_along_axis(history, jnp.clip(cols, 0, t - 1), axis=1), 0)
    return drafts.astype(jnp.int32), jnp.sum(valid, axis=1).astype(jnp.int32)


def accept_drafts(logits: jax.Array, drafts: jax.Array, num_valid: jax.Array, key: jax.Array,
                  temperature: jax.Array, top_k: jax.Array, top_p: jax.Array, *, greedy: bool,
                  use_filter: bool):
    """Verifies drafts against the model's distributions at K + 1 positions.

    Args:
      logits: (B, K + 1, V) float32 (any masking applied); position i scores the token after
        the pending token and drafts[:, :i].
      drafts: (B, K) int32; num_valid: (B,) int32 (drafts beyond it are never accepted).
      key: PRNG key (unused when greedy); temperature, top_k, top_p: traced settings.
    Returns:
      tokens (B, K + 1) int32, accepted (B,) int32 and processed log-probs (B, K + 1) float32
      (0 when greedy): row b emits tokens[b, :accepted[b] + 1], the accepted drafts then the
      corrected (or bonus) token.
    """
    k = drafts.shape[1]
    in_draft = jnp.arange(k) < num_valid[:, None]
    if greedy:
        target = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # (B, K + 1)
        ok = (drafts == target[:, :k]) & in_draft
        accepted = jnp.sum(jnp.cumprod(ok, axis=1), axis=1).astype(jnp.int32)
        return target, accepted, jnp.zeros(target.shape, jnp.float32)
    scaled = processed_logits(logits, temperature, top_k, top_p, use_filter=use_filter)
    logp = jax.nn.log_softmax(scaled, axis=-1)
    key_accept, key_final = jax.random.split(key)
    p_draft = jnp.exp(take_token(logp[:, :k], drafts))  # (B, K)
    ok = (jax.random.uniform(key_accept, p_draft.shape) < p_draft) & in_draft
    accepted = jnp.sum(jnp.cumprod(ok, axis=1), axis=1).astype(jnp.int32)
    at = accepted[:, None]
    final_scaled = jnp.take_along_axis(scaled, at[..., None], axis=1)[:, 0]  # (B, V)
    padded = jnp.concatenate([drafts, jnp.zeros_like(drafts[:, :1])], axis=1)  # (B, K + 1)
    rejected = jnp.take_along_axis(padded, at, axis=1)  # (B, 1)
    rejected_here = (accepted < num_valid)[:, None] & (jnp.arange(scaled.shape[-1]) == rejected)
    final = categorical_rows(key_final, jnp.where(rejected_here, NEG_INF, final_scaled))
    tokens = jnp.where(jnp.arange(k + 1) == at, final[:, None].astype(jnp.int32), padded)
    return tokens, accepted, take_token(logp, tokens)
