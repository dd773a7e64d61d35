"""The consensus critic's score read as an expectation, not one sampled number.

The critic answers ``Short analysis: <sentence> Consensus score: <n>`` with ``n`` one of a
few allowed values (:data:`CONSENSUS_SCORES`; the answer is sampled under
``sampling.grammar.consensus_grammar(scores)``). Instead of the number it happened to
write, the score is the expected value under the model's masked distribution over the
allowed values after its own analysis: one forward pass over every group's prompt +
analysis, the next-token log-probs of the values' first tokens, renormalised over them.
That is exactly the distribution a grammar-constrained sampler draws from when each value's
first token (after the shared ``Consensus score:`` text) differs, which
:func:`score_first_tokens` checks; the values' later tokens are then forced (probability 1
under the mask). Values are spelled as the tokenizer spells the whole answer.

Also here: snapping a teacher's score to the allowed values (SFT targets in the critic's
own answer space).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

from jax_drive.sampling.options import candidate_logprobs, option_trie

# The critic's allowed scores: their first digits differ (one next-token decision), and the
# consensus feedback threshold (80) separates 100 from the rest as it separated the
# teacher's 90 / 95 ("agreed", "no conflict") from its 25-72.
CONSENSUS_SCORES = (0, 25, 50, 75, 100)
_SCORE_AT_END = re.compile(r"(consensus\s*score[\s*:=]*)(\d{1,3}(?:\.\d+)?)\s*$", re.IGNORECASE)
_SCORE_ANYWHERE = re.compile(r"(consensus\s*score[\s*:=]*)(\d{1,3})\b", re.IGNORECASE)


def snap_score(score: float, scores: Sequence[int] = CONSENSUS_SCORES) -> int:
    """The allowed value nearest ``score`` (ties to the lower one)."""
    values = sorted(int(s) for s in scores)
    return min(values, key=lambda v: (abs(v - score), v))


def snap_answer(answer: str, scores: Sequence[int] = CONSENSUS_SCORES) -> str:
    """``answer`` with its ``Consensus score: <n>`` rewritten to the nearest allowed value
    (unchanged when it states no score)."""
    return _SCORE_ANYWHERE.sub(lambda m: m.group(1) + str(snap_score(int(m.group(2)), scores)), answer, count=1)


def answer_context(answer: str) -> str | None:
    """The answer up to and including ``Consensus score:`` and the separator after it (the
    text the score's first token follows), or None when it does not end in a score."""
    m = _SCORE_AT_END.search(answer)
    return None if m is None else answer[: m.start(2)]


def score_first_tokens(tokenizer, context: str, scores: Sequence[int]) -> tuple[list[int], list[int]]:
    """(the ids shared by ``context + str(s)`` for every allowed ``s``, each value's first
    own token id). Raises ValueError unless the values part ways at one token after the
    shared ids (the read-out is one next-token decision)."""
    try:
        trie = option_trie(tokenizer, context, [str(int(s)) for s in scores])
    except ValueError:
        trie = None
    if trie is None or len(trie.branches) != 1:
        raise ValueError(f"the allowed consensus scores {tuple(scores)} do not each start with their own token "
                         "after 'Consensus score:' in this tokenizer: choose values whose first digits differ")
    return list(trie.shared), [tail[0] for tail in trie.tails]


@dataclasses.dataclass(frozen=True)
class ScoreReadout:
    """The critic's score of one answer: ``expected`` (0..100) under ``probs`` (one per
    allowed value, summing to 1), or ``expected`` None when the answer ends in no score."""

    expected: float | None
    probs: tuple[float, ...] = ()


def expected_scores(model, tokenizer, prompts: Sequence[Sequence[int]], answers: Sequence[str],
                    scores: Sequence[int] = CONSENSUS_SCORES, bucket: int = 64) -> list[ScoreReadout]:
    """The expected consensus score of each answer: one forward pass over every
    ``prompt ids + answer up to the score``
    (:func:`~jax_drive.sampling.options.candidate_logprobs`), the allowed values' first-token
    log-probs at its end, renormalised over them (the masked distribution).

    Args: prompts: N prompt token id lists (the templated chat prompts); answers: N texts.
    """
    scores = [int(s) for s in scores]
    rows, firsts, where = [], [], []
    for n, (prompt, answer) in enumerate(zip(prompts, answers)):
        context = answer_context(answer) if isinstance(answer, str) else None
        if context is None:
            continue
        shared, first = score_first_tokens(tokenizer, context, scores)
        rows.append(list(prompt) + shared)
        firsts.append(first)
        where.append(n)
    out = [ScoreReadout(None)] * len(answers)
    if not rows:
        return out
    logp = candidate_logprobs(model, rows, firsts, int(getattr(tokenizer, "pad_token_id", None) or 0), bucket)
    probs = np.exp(logp - logp.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    values = np.asarray(scores, np.float64)
    for n, p in zip(where, probs):
        out[n] = ScoreReadout(float(p @ values), tuple(float(x) for x in p))
    return out


def with_score(answer: str, score: float) -> str:
    """``answer`` with its final score replaced by ``score`` written with one decimal."""
    context = answer_context(answer)
    return answer if context is None else f"{context}{score:.1f}"
