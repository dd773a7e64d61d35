"""Grammars in the decode loop: :class:`GrammarMask`, the sampler's ``LogitsMask`` over stacked
grammar tables (``sampling.constraints`` describes the hooks).

Per row b of the loop the mask knows its grammar ``grammar_id[b]`` (the "anything" grammar for
unconstrained and dummy rows); the loop carries each row's automaton state (``DecodeState.
constraint``, state 0 before the first generated token of a call or of a session turn) and
hands every hook the row's remaining budget (``max_new_tokens`` minus the tokens generated,
the current one included). Before temperature, top-k / top-p and the raw log-probs, the logits
are masked to :func:`~.tables.allowed_tokens`: tokens the grammar allows after which acceptance
is still reachable within the budget. Nothing leaves the device per token.

Jump-forward (``max_forced > 0``): where the automaton allows exactly one token, ``propose``
offers the forced run (:func:`~.tables.forced_run`, at most ``max_forced`` tokens) as the
drafts of the speculative step. Under the mask a forced token is the only finite logit, so it
has probability 1 and the verification accepts it: a run of forced tokens and the sampled token
after it cost one forward pass, and the emitted tokens (and their log-probs, 0 for a forced
token) are exactly those of plain constrained decoding. Prompt-lookup drafts (when there is
no forced run) are cut before the first token the mask refuses.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_drive.sampling.grammar.tables import (
    NEG_INF,
    GrammarTables,
    advance,
    allowed_tokens,
    forced_run,
    token_allowed,
)


def draft_states(tables: GrammarTables, grammar_id, state, drafts) -> jax.Array:
    """(B, L) int32: the state at each of L positions, position i after ``drafts[:, :i]``
    (drafts (B, L - 1) int32, state and grammar_id (B,))."""
    states = [jnp.asarray(state, jnp.int32)]
    for i in range(drafts.shape[1]):  # L - 1 <= the draft length: small and static
        states.append(advance(tables, grammar_id, states[-1], drafts[:, i]))
    return jnp.stack(states, axis=1)


def legal_prefix(tables: GrammarTables, grammar_id, state, drafts, remaining) -> jax.Array:
    """(B,) int32: how many leading drafts (B, K) the mask allows in turn from ``state`` with
    ``remaining`` (B,) tokens left at the first one."""
    states = draft_states(tables, grammar_id, state, drafts[:, :-1])
    offsets = jnp.arange(drafts.shape[1], dtype=jnp.int32)
    ok = token_allowed(tables, grammar_id[:, None], states, remaining[:, None] - offsets, drafts)
    return jnp.sum(jnp.cumprod(ok, axis=1), axis=1).astype(jnp.int32)


@jax.tree_util.register_pytree_node_class
class GrammarMask:
    """A :class:`~jax_drive.sampling.constraints.LogitsMask` from grammar automata.

    Args:
      tables: the stacked grammars (``stack_grammars``), traced: a new grammar of the same
        bucketed shapes reuses the compiled decode program.
      grammar_id: (B,) int32, each loop row's grammar (dummy rows: any valid index).
      max_forced: jump-forward's longest forced run per step (static; 0: no jump-forward).
    The state is (B,) int32, each row's automaton state.
    """

    def __init__(self, tables: GrammarTables, grammar_id, max_forced: int = 0):
        self.tables = tables
        self.grammar_id = jnp.asarray(grammar_id, jnp.int32)
        self.max_forced = int(max_forced)

    def init_state(self, rows: int) -> jax.Array:
        if rows != self.grammar_id.shape[0]:
            raise ValueError(f"the grammar mask has {self.grammar_id.shape[0]} rows, the loop {rows}")
        return jnp.zeros((rows,), jnp.int32)

    def mask_logits(self, state, logits, drafts, remaining):
        states = draft_states(self.tables, self.grammar_id, state, drafts)
        allowed = allowed_tokens(self.tables, self.grammar_id[:, None], states, remaining)
        return jnp.where(allowed, logits, NEG_INF)

    def advance(self, state, tokens, count):
        for i in range(tokens.shape[1]):
            state = jnp.where(i < count, advance(self.tables, self.grammar_id, state, tokens[:, i]), state)
        return state

    def propose(self, state, drafts, num_valid, remaining):
        if drafts.shape[1]:
            num_valid = jnp.minimum(num_valid, legal_prefix(self.tables, self.grammar_id, state, drafts, remaining))
        if not self.max_forced:
            return drafts, num_valid
        k = drafts.shape[1]
        forced, length = forced_run(self.tables, self.grammar_id, state, remaining, min(self.max_forced, k))
        forced = jnp.pad(jnp.maximum(forced, 0), ((0, 0), (0, k - forced.shape[1])))
        use = length > 0
        return jnp.where(use[:, None], forced, drafts), jnp.where(use, length, num_valid)

    def tree_flatten(self):
        return (self.tables, self.grammar_id), self.max_forced

    @classmethod
    def tree_unflatten(cls, max_forced, children) -> "GrammarMask":
        mask = object.__new__(cls)
        mask.tables, mask.grammar_id = children
        mask.max_forced = max_forced
        return mask

    def __repr__(self) -> str:
        g, s, c, v = self.tables.shape
        return f"GrammarMask(grammars={g}, states={s}, classes={c}, rows={self.grammar_id.shape[0]}, " \
               f"max_forced={self.max_forced})"
