"""Grammars on the device: stacked tables and the one home of the token mask.

:func:`stack_grammars` pads compiled grammars to bucketed shapes (powers of two), so a new
grammar of similar size reuses a compiled decode program, and stacks them: row b of a batch
follows grammar ``grammar_id[b]`` (an "anything" grammar for unconstrained rows).

The mask (:func:`allowed_tokens`) is what both the sampler and the trainer apply: in
automaton state ``state`` with ``remaining`` tokens left in the budget (this one included),
token v is allowed iff the grammar allows it in ``state`` AND the state after it can still
reach acceptance within ``remaining - 1`` tokens. Stop ids are allowed exactly in accepting
states (and keep the state). So a constrained answer always ends well-formed: by a stop id
in an accepting state, or by running out of budget in one. The trainer recomputes the states
and budgets from the sampled ids with :func:`replay_states`, so its log-softmax normalises
over exactly the tokens the sampler allowed.

All functions are pure and jit-friendly; ``...`` stands for any leading (batch) shape, G for
grammars, S for (padded) states, C for (padded) token classes, V for the vocabulary.
State -1 means "left the grammar" (only after a token the mask did not allow): nothing is
allowed there and it never accepts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.sampling.grammar.compile import UNREACHABLE, CompiledGrammar
from jax_drive.sampling.grammar.regex import GrammarError

NEG_INF = -1e30  # as jax_drive.sampling.selection: finite, so masked rows never produce nan


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GrammarTables:
    """G compiled grammars, padded to common (S, C) and stacked (see the module docstring).

    Fields:
      next_state: (G, S, C) int32, next state per (grammar, state, class); -1: not allowed.
      token_class: (G, V) int32, each token's class in each grammar.
      accepting: (G, S) bool.
      min_to_accept: (G, S) int32, fewest tokens to acceptance (0 when accepting; a huge
        value on padding states).
      class_size: (G, C) int32, tokens per class (0 on padding classes).
      class_token: (G, C) int32, the smallest token id of each class.
    The start state of every grammar is 0.
    """

    next_state: jax.Array
    token_class: jax.Array
    accepting: jax.Array
    min_to_accept: jax.Array
    class_size: jax.Array
    class_token: jax.Array

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(G, S, C, V)."""
        g, s, c = self.next_state.shape
        return g, s, c, self.token_class.shape[-1]


def bucket(n: int, minimum: int = 1) -> int:
    """The smallest power of two >= max(n, minimum)."""
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


def stack_grammars(grammars: Sequence[CompiledGrammar], *, min_grammars: int = 1, min_states: int = 16,
                   min_classes: int = 16) -> GrammarTables:
    """Pads ``grammars`` to bucketed shapes and stacks them (host -> device arrays).

    Shapes: G = bucket(len(grammars), min_grammars), S = bucket(max states, min_states),
    C = bucket(max classes, min_classes); grammar i is row i (rows past the last grammar are
    padding: nothing allowed). Raises GrammarError when the grammars were compiled for
    different vocabularies.
    """
    if not grammars:
        raise GrammarError("stack_grammars needs at least one compiled grammar")
    vocab = {int(g.token_class.shape[0]) for g in grammars}
    prints = {g.fingerprint for g in grammars if g.grammar.kind != "anything"}
    if len(vocab) != 1 or len(prints) > 1:
        raise GrammarError("grammars compiled for different vocabularies cannot share a batch")
    g_n = bucket(len(grammars), min_grammars)
    s_n = bucket(max(g.num_states for g in grammars), min_states)
    c_n = bucket(max(g.num_classes for g in grammars), min_classes)
    (v_n,) = vocab
    next_state = np.full((g_n, s_n, c_n), -1, np.int32)
    token_class = np.zeros((g_n, v_n), np.int32)
    accepting = np.zeros((g_n, s_n), bool)
    min_to_accept = np.full((g_n, s_n), UNREACHABLE, np.int32)
    class_size = np.zeros((g_n, c_n), np.int32)
    class_token = np.zeros((g_n, c_n), np.int32)
    for i, g in enumerate(grammars):
        s, c = g.next_state.shape
        next_state[i, :s, :c] = g.next_state
        token_class[i] = g.token_class
        accepting[i, :s] = g.accepting
        min_to_accept[i, :s] = g.min_to_accept
        class_size[i, :c] = g.class_size
        class_token[i, :c] = g.class_token
    return GrammarTables(*(jnp.asarray(a) for a in (next_state, token_class, accepting, min_to_accept,
                                                    class_size, class_token)))


def _row(tables: GrammarTables, grammar_id, state):
    """(next states (..., C), valid (...)): the class row of each (grammar, state)."""
    state = jnp.asarray(state, jnp.int32)
    valid = state >= 0
    return tables.next_state[grammar_id, jnp.maximum(state, 0)], valid


def allowed_classes(tables: GrammarTables, grammar_id, state, remaining) -> jax.Array:
    """(..., C) bool: classes allowed in ``state`` with ``remaining`` tokens left (see the module docstring).

    grammar_id, state, remaining: (...) int32 (broadcast together).
    """
    nxt, valid = _row(tables, grammar_id, state)
    cost = tables.min_to_accept[jnp.asarray(grammar_id)[..., None], jnp.maximum(nxt, 0)]
    remaining = jnp.asarray(remaining, jnp.int32)[..., None]
    return (nxt >= 0) & (cost <= remaining - 1) & valid[..., None]


def allowed_tokens(tables: GrammarTables, grammar_id, state, remaining) -> jax.Array:
    """(..., V) bool: the token mask (tokens legal in ``state`` after which acceptance is still
    reachable within ``remaining - 1`` tokens; stop ids exactly in accepting states).

    grammar_id, state, remaining: (...) int32.
    """
    ok = allowed_classes(tables, grammar_id, state, remaining)
    token_class = tables.token_class[grammar_id]
    token_class = jnp.broadcast_to(token_class, ok.shape[:-1] + token_class.shape[-1:])
    return jnp.take_along_axis(ok, token_class, axis=-1)


def mask_logits(logits: jax.Array, allowed: jax.Array) -> jax.Array:
    """(..., V) logits with the disallowed entries set to ``NEG_INF`` (finite: no nan)."""
    return jnp.where(allowed, logits, NEG_INF)


def advance(tables: GrammarTables, grammar_id, state, token) -> jax.Array:
    """(...) int32: the state after ``token`` ((...) int32); -1 when the token was not legal
    (or the state was already -1). A stop id keeps an accepting state."""
    state = jnp.asarray(state, jnp.int32)
    token_class = tables.token_class[grammar_id, jnp.asarray(token, jnp.int32)]
    nxt = tables.next_state[grammar_id, jnp.maximum(state, 0), token_class]
    return jnp.where(state >= 0, nxt, -1)


def token_allowed(tables: GrammarTables, grammar_id, state, remaining, token) -> jax.Array:
    """(...) bool: whether ``allowed_tokens(...)[..., token]`` holds, without the (..., V) mask
    (e.g. to check a draft token, or that replayed ids were legal)."""
    nxt = advance(tables, grammar_id, state, token)
    cost = tables.min_to_accept[grammar_id, jnp.maximum(nxt, 0)]
    return (nxt >= 0) & (cost <= jnp.asarray(remaining, jnp.int32) - 1)


def is_accepting(tables: GrammarTables, grammar_id, state) -> jax.Array:
    """(...) bool: the answer may end in ``state``."""
    state = jnp.asarray(state, jnp.int32)
    return tables.accepting[grammar_id, jnp.maximum(state, 0)] & (state >= 0)


def forced_token(tables: GrammarTables, grammar_id, state, remaining) -> jax.Array:
    """(...) int32: the only allowed token when exactly one is allowed, else -1 (jump-forward:
    a forced token needs no sampling step). Counts tokens per class, never builds (..., V)."""
    ok = allowed_classes(tables, grammar_id, state, remaining)
    count = jnp.sum(jnp.where(ok, tables.class_size[grammar_id], 0), axis=-1)
    token = tables.class_token[grammar_id, jnp.argmax(ok, axis=-1)]
    return jnp.where(count == 1, token, -1)


def forced_run(tables: GrammarTables, grammar_id, state, remaining, max_len: int):
    """The run of forced tokens from ``state``: (tokens (..., max_len) int32, -1 after the run;
    length (...) int32). ``max_len`` is static. The run ends after a token forced in an
    accepting state (with stop ids, the only token forced there is a stop id)."""
    grammar_id = jnp.asarray(grammar_id, jnp.int32)

    def step(carry, _):
        state, remaining, running = carry
        token = jnp.where(running, forced_token(tables, grammar_id, state, remaining), -1)
        running = (token >= 0) & ~is_accepting(tables, grammar_id, state)
        state = jnp.where(token >= 0, advance(tables, grammar_id, state, jnp.maximum(token, 0)), state)
        return (state, remaining - 1, running), token

    init = (jnp.asarray(state, jnp.int32), jnp.asarray(remaining, jnp.int32),
            jnp.ones(jnp.shape(state), bool))
    _, tokens = jax.lax.scan(step, init, None, length=max_len)
    tokens = jnp.moveaxis(tokens, 0, -1)
    return tokens, jnp.sum(tokens >= 0, axis=-1).astype(jnp.int32)


def replay_states(tables: GrammarTables, grammar_ids, ids, budgets, starts=None):
    """The automaton states and budgets the sampler saw, recomputed from its sampled ids.

    Args:
      grammar_ids: (B,) int32, each row's grammar.
      ids: (B, L) int32, the generated tokens (answer only, from its first token), or a
        training row's targets with ``starts``.
      budgets: (B,) int32, each row's token budget at an answer's first token
        (``max_new_tokens``).
      starts: (B, L) bool, positions where an answer starts (its automaton restarts at state
        0 with the whole budget: each turn of a multi-turn row); None: only position 0.
    Returns:
      states: (B, L) int32, the state before token t (-1 after an illegal token).
      remaining: (B, L) int32, the budget left at t, t's token included.
    The mask the sampler applied at position t is ``allowed_tokens(tables, grammar_ids[:, None],
    states, remaining)`` (positions outside answers are the caller's to ignore).
    """
    grammar_ids = jnp.asarray(grammar_ids, jnp.int32)
    ids = jnp.asarray(ids, jnp.int32)
    budgets = jnp.asarray(budgets, jnp.int32)
    if starts is None:
        starts = jnp.zeros(ids.shape, bool).at[:, 0].set(True)

    def step(carry, inputs):
        state, remaining = carry
        token, start = inputs
        state = jnp.where(start, 0, state)
        remaining = jnp.where(start, budgets, remaining)
        return (advance(tables, grammar_ids, state, token), remaining - 1), (state, remaining)

    init = (jnp.zeros(ids.shape[:1], jnp.int32), budgets)
    _, (states, remaining) = jax.lax.scan(step, init, (ids.T, jnp.asarray(starts, bool).T))
    return states.T, remaining.T
