"""Multi-turn generation that keeps each row's KV cache on the device between turns.

``JaxEngine.start(prompts, params, key)`` runs the first turn and returns a :class:`Session`
with its completions; ``session.extend(appended, params, key)`` appends token ids to each
continuing row (e.g. the end-of-turn marker, a user message and the next generation header)
and generates the next turn, prefilling **only the appended tokens** into the kept cache,
optionally with prompt-lookup speculative decoding. The results equal generating from the
whole context from scratch (the cache holds the same keys and values; tested).

Cache bookkeeping, per row: its context (every token so far) minus the last one is cached in
slots before ``slot``; the last token (the *pending* token) is fed, at ``slot``, by the next
step. Slots at or after ``slot`` may hold stale entries; attention never reads a slot at or
after the one being written (``jax_drive.models.cache_attention_mask``), and they are
overwritten before the row reaches them. Left-padding holes of the first turn stay masked.
Rows are kept in the device batches (groups) of the first turn; dropped rows leave their
group at the next ``extend``.

Memory: a group holds B x S cache slots per layer (2 x Nk x D values each; SmolLM2 in float32:
46 KB per slot and row), for every live row, between turns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from jax_drive.models.layers import LayerCache
from jax_drive.sampling.cache import continue_state
from jax_drive.sampling.decode import decode
from jax_drive.sampling.outputs import SamplerOutput
from jax_drive.sampling.plan import plan_continuation
from jax_drive.sampling.request import Request, check_token_ids, row_keys


@dataclasses.dataclass
class SessionGroup:
    """Rows decoded in one device batch.

    rows: session row ids of the batch's first ``len(rows)`` rows (the rest are dummies);
    cache: their LayerCache; slot: (len(rows),) int, each row's pending-token slot.
    """

    rows: list[int]
    cache: LayerCache
    slot: np.ndarray


class Session:
    """The rows of a multi-turn generation, their contexts and their device caches.

    Created by ``JaxEngine.start``. Rows are numbered like the first turn's completions
    (prompt-major, ``params.n`` per prompt).

    Attributes:
      contexts: per row, every token id so far (prompt, generated, appended), or None once
        the row was dropped.
      last_decode_steps: decode-loop iterations (forward passes) of the last turn, summed
        over the groups (fewer than the tokens generated when drafts were accepted).
    """

    def __init__(self, engine, contexts: list[list[int]], groups: list[SessionGroup],
                 weights: dict, decode_steps: int = 0, position_shift: Sequence[int] | None = None):
        self._engine = engine
        self.contexts: list[list[int] | None] = contexts
        self._groups = groups
        self._weights = weights  # the caches hold keys / values of these weights
        self.last_decode_steps = decode_steps
        # per row, RoPE position of context token i minus i: 0 for text; negative after an
        # image (its t / h / w positions span fewer values than its tokens, M-RoPE)
        self._position_shift = [0] * len(contexts) if position_shift is None else [int(x) for x in position_shift]

    @property
    def num_rows(self) -> int:
        return len(self.contexts)

    @property
    def live_rows(self) -> list[int]:
        """Ids of the rows that can still be extended."""
        return [r for r, c in enumerate(self.contexts) if c is not None]

    def close(self) -> None:
        """Drops every row and frees the caches."""
        self.contexts = [None] * self.num_rows
        self._groups = []

    def extend(self, appended: Sequence[Sequence[int] | None], params, key: jax.Array):
        """Appends token ids to rows and generates their next turn.

        Args:
          appended: one entry per session row (``num_rows`` entries): the token ids that
            follow the row's context (may be empty), or None to drop the row for good.
          params: ``SamplingParams`` (``n`` must be 1; stop ids default to the tokenizer's; a
            grammar per row when ``grammar`` is a sequence: each turn's answer starts its
            own automaton).
          key: PRNG key (group g samples with ``fold_in(key, g)`` when there are several).
        Returns:
          ``num_rows`` entries: a ``Completion`` (its ``prompt_token_ids`` are the whole
          context before the turn) or None for dropped rows.
        Raises:
          ValueError: wrong length, an id outside the vocabulary, tokens for a dropped row,
            a context beyond the model's positions, or ``params.n != 1``.
          RuntimeError: the model's weights changed since ``start`` (the kept caches belong to
            the old weights; start a new session).
        """
        if len(appended) != self.num_rows:
            raise ValueError(f"appended has {len(appended)} entries for {self.num_rows} rows")
        if params.n != 1:
            raise ValueError("extend samples one continuation per row (params.n must be 1)")
        if row_keys(key, self.num_rows) is not None:
            raise ValueError("extend takes one PRNG key (rows of a group split it), not one per row")
        engine = self._engine
        model = engine.model
        vocab = model.config.vocab_size
        for r, extra in enumerate(appended):
            if extra is not None and self.contexts[r] is None:
                raise ValueError(f"row {r} was dropped; it cannot be extended")
        new_rows = {r: [int(t) for t in extra] for r, extra in enumerate(appended) if extra is not None}
        check_token_ids(new_rows.values(), vocab, "appended")
        request = engine.request(params, prompt_lookup=engine.prompt_lookup)
        for r, extra in new_rows.items():
            if len(self.contexts[r]) + len(extra) + request.max_new_tokens > model.config.max_position_embeddings:
                raise ValueError(f"row {r}: context + max_new_tokens exceeds max_position_embeddings")
        weights = engine.decode_weights.get(model)
        if weights is not self._weights:
            raise RuntimeError("the model's weights changed since the session started; start a new session")
        for r in range(self.num_rows):
            if r not in new_rows:
                self.contexts[r] = None
        grammars = params.row_grammars(self.num_rows)
        groups = [g for g in self._groups if any(r in new_rows for r in g.rows)]
        completions: list = [None] * self.num_rows
        self.last_decode_steps = 0
        for gi, group in enumerate(groups):
            group_key = jax.random.fold_in(key, gi) if len(groups) > 1 else key
            completions_g, groups[gi], steps = self._extend_group(group, new_rows, request, weights, group_key,
                                                                  grammars)
            self.last_decode_steps += steps
            for r, c in completions_g:
                completions[r] = c
        self._groups = groups
        return completions

    def _extend_group(self, group: SessionGroup, new_rows: dict, request: Request, weights, key, grammars):
        engine = self._engine
        keep = [i for i, r in enumerate(group.rows) if r in new_rows]
        rows = [group.rows[i] for i in keep]
        request = engine.constrained(request, [grammars[r] for r in rows], engine.sampler_config.batch_size(len(rows)))
        plan = plan_continuation([self.contexts[r] for r in rows], [new_rows[r] for r in rows], keep,
                                 group.slot[keep], [self._position_shift[r] for r in rows], request,
                                 engine.sampler_config)
        for r in rows:
            self.contexts[r] = self.contexts[r] + new_rows[r]
        loop = continue_state(engine.model.config, weights, group.cache, plan, key)
        out = decode(engine.model, weights, loop, request, engine.sampler_config)
        output = SamplerOutput.from_state(out, len(rows), request)
        completions = []
        for i, r in enumerate(rows):
            completions.append((r, engine.completion(self.contexts[r], output, i, request)))
            ids, _ = output.row(i)
            self.contexts[r] = self.contexts[r] + ids
        group = SessionGroup(rows=rows, cache=out.cache, slot=plan.start[:len(rows)] + output.lengths)
        return completions, group, output.steps
