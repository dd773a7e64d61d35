"""A model's masked distribution over a few allowed answers, read in one forward pass.

A grammar that allows only a list of options (the critic's scores, a driver's commands)
makes the sampler choose among the options' tokens wherever two options part ways and
forces every other token. The probability the sampler (at a temperature, no top-k / top-p)
gives an option is then the product, over the points where it parts from the others, of the
model's tempered next-token probability of its token renormalised over the tokens allowed
there. :func:`option_probabilities` reads that distribution with one row per such point (a
trie over the options as the tokenizer spells ``context + option``), not by sampling.

It reads the canonical spelling only: a grammar over bytes also allows an option spelled
with other tokens (``g`` + ``o``), which the sampler rarely picks and this read-out ignores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_drive.models import positions_from_mask
from jax_drive.sampling.shapes import count_bucket, left_pad


@nnx.jit
def next_token_logprobs(model, ids, mask, candidates):
    """log p(candidates[b, k] | ids[b]) at each row's last real token: (B, K) float32.
    ``ids`` / ``mask`` (B, L) left-padded; ``candidates`` (B, K) token ids."""
    hidden = model.hidden_states(ids, positions_from_mask(mask), mask)[:, -1]  # (B, H)
    logits = model.logits_from_hidden(hidden)  # (B, V)
    logp = logits - jnp.max(logits, axis=-1, keepdims=True)
    logp = logp - jnp.log(jnp.sum(jnp.exp(logp), axis=-1, keepdims=True))
    return jnp.take_along_axis(logp, candidates, axis=-1)


def candidate_logprobs(model, rows: Sequence[Sequence[int]], candidates: Sequence[Sequence[int]], pad_id: int = 0,
                       bucket: int = 64) -> np.ndarray:
    """(N, K) log p(candidates[n][k] | rows[n]) in one forward pass: rows left-padded to a
    multiple of ``bucket``, the batch to :func:`count_bucket` rows; K = the longest candidate
    list (a shorter list's extra columns are -inf). float64."""
    if not rows:
        return np.zeros((0, max((len(c) for c in candidates), default=0)))
    size, length = count_bucket(len(rows)), -(-max(len(r) for r in rows) // bucket) * bucket
    ids, mask, _ = left_pad(rows, length, size, pad_id)
    cand = np.zeros((size, max(len(c) for c in candidates)), np.int32)
    for k, c in enumerate(candidates):
        cand[k, : len(c)] = c
    logp = next_token_logprobs(model, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(cand))
    out = np.asarray(logp, np.float64)[: len(rows)]
    for k, c in enumerate(candidates):
        out[k, len(c):] = -np.inf
    return out


@dataclasses.dataclass(frozen=True)
class OptionTrie:
    """The options as token sequences after the ids they share.

    ``shared``: ids of ``context`` + the options' common start; ``tails``: each option's
    remaining ids; ``branches``: (prefix of a tail, the distinct next ids there) for every
    point where options part ways, the root first.
    """

    shared: tuple[int, ...]
    tails: tuple[tuple[int, ...], ...]
    branches: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]


def option_trie(tokenizer, context: str, options: Sequence[str]) -> OptionTrie:
    """Spells ``context + option`` for each option and finds where they part. Raises
    ValueError for fewer than two options, duplicates, or an option that is the start of
    another, as text or as tokens (where it ends would need an end-of-answer decision)."""
    if len(options) < 2 or len(set(options)) != len(options):
        raise ValueError(f"need two or more distinct options, got {list(options)}")
    for a in options:
        for b in options:
            if a != b and b.startswith(a):
                raise ValueError(f"option {a!r} is the start of {b!r}: choose options that part ways before "
                                 "either ends")
    spelled = [list(tokenizer.encode(context + o)) for o in options]
    common = 0
    while all(len(t) > common for t in spelled) and len({t[common] for t in spelled}) == 1:
        common += 1
    tails = [tuple(t[common:]) for t in spelled]
    for a, ta in zip(options, tails):
        for b, tb in zip(options, tails):
            if a != b and tb[: len(ta)] == ta:
                raise ValueError(f"option {a!r} is spelled as the start of {b!r} after {context!r}: "
                                 "choose options that part ways before either ends")
    branches: dict[tuple[int, ...], set[int]] = {}
    for tail in tails:
        for depth in range(len(tail)):
            branches.setdefault(tail[:depth], set()).add(tail[depth])
    forks = tuple((p, tuple(sorted(ids))) for p, ids in sorted(branches.items(), key=lambda kv: (len(kv[0]), kv[0]))
                  if len(ids) > 1)
    return OptionTrie(tuple(spelled[0][:common]), tuple(tails), forks)


def option_probabilities(model, tokenizer, prompts: Sequence[Sequence[int]], context: str, options: Sequence[str],
                         temperature: float = 1.0, bucket: int = 64) -> np.ndarray:
    """(N, len(options)) probability of each option after ``prompt ids + context`` under the
    options-only mask at ``temperature`` (rows sum to 1): one forward pass over every prompt x
    branch point.

    Args: prompts: N prompt token id lists (e.g. templated chat prompts); context: the answer
    text before the option (e.g. ``'{"command": "'``); temperature: > 0, the sampler's;
    bucket: rows are left-padded to a multiple of it (fewer compiled shapes).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    trie = option_trie(tokenizer, context, options)
    if not prompts:
        return np.zeros((0, len(options)))
    rows, cands = [], []
    for prompt in prompts:
        for prefix, ids in trie.branches:
            rows.append(list(prompt) + list(trie.shared) + list(prefix))
            cands.append(ids)
    logp = candidate_logprobs(model, rows, cands, int(getattr(tokenizer, "pad_token_id", None) or 0), bucket)
    probs = np.ones((len(prompts), len(options)))
    for k, (prefix, allowed) in enumerate(trie.branches):
        block = logp[k:: len(trie.branches), : len(allowed)] / temperature  # (N, |allowed|)
        p = np.exp(block - block.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        for j, tail in enumerate(trie.tails):
            if tail[: len(prefix)] == prefix:
                probs[:, j] *= p[:, allowed.index(tail[len(prefix)])]
    return probs
