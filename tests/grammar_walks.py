"""Random walks of grammar automata for the grammar tests: each step draws uniformly among the
tokens the mask allows, exactly as a constrained sampler at temperature 1 on flat logits."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.sampling.grammar import (advance, allowed_classes, allowed_tokens, is_accepting, replay_states,
                                        token_allowed)


@functools.partial(jax.jit, static_argnames=("steps", "by_class"))
def random_walks(tables, grammar_ids, budgets, stop_ids, key, steps: int, by_class: bool = False):
    """Walks B rows for at most ``steps`` tokens.

    Args: grammar_ids (B,), budgets (B,) int32 (each <= steps), stop_ids (K,) int32, key;
      by_class: draw a class (weighted by its allowed tokens, from ``allowed_classes``) and
      then a token inside it, instead of a token from the (B, V) ``allowed_tokens`` mask: the
      same distribution, without V-sized work per step (large vocabularies).
    Returns: ids (B, steps) int32 (-1 after a row ended), states (B, steps) (the state before
    each token), final (B,) the last state, accepted (B,) bool.
    """
    members = jnp.argsort(tables.token_class, axis=-1, stable=True)  # (G, V) token ids by class
    starts = jnp.cumsum(tables.class_size, axis=-1) - tables.class_size  # (G, C)

    def draw(state, remaining, key):
        if not by_class:
            allowed = allowed_tokens(tables, grammar_ids, state, remaining)
            return jax.random.categorical(key, jnp.where(allowed, 0.0, -1e30), axis=-1), jnp.any(allowed, -1)
        ok = allowed_classes(tables, grammar_ids, state, remaining)
        weight = jnp.where(ok, tables.class_size[grammar_ids], 0)
        pick, inside = jax.random.split(key)
        cls = jax.random.categorical(pick, jnp.log(weight.astype(jnp.float32)), axis=-1)
        offset = jnp.floor(jax.random.uniform(inside, cls.shape) * tables.class_size[grammar_ids, cls])
        position = starts[grammar_ids, cls] + offset.astype(jnp.int32)
        return members[grammar_ids, position], jnp.any(ok, -1)

    def step(carry, key):
        state, remaining, done = carry
        token, any_allowed = draw(state, remaining, key)
        live = ~done & any_allowed
        token = jnp.where(live, token, -1)
        after = jnp.where(live, advance(tables, grammar_ids, state, jnp.maximum(token, 0)), state)
        stopped = live & jnp.any(token[:, None] == stop_ids[None, :], axis=-1)
        return (after, remaining - live, done | ~live | stopped), (token, state)

    init = (jnp.zeros_like(grammar_ids), budgets, jnp.zeros(grammar_ids.shape, bool))
    (final, _, _), (ids, states) = jax.lax.scan(step, init, jax.random.split(key, steps))
    return ids.T, states.T, final, is_accepting(tables, grammar_ids, final)


def walk_texts(ids: np.ndarray, token_bytes, stop_ids) -> list[tuple[list[int], str]]:
    """(answer ids without the stop id, decoded text) per row; the text must be valid UTF-8."""
    out = []
    for row in np.asarray(ids):
        answer = [int(t) for t in row if t >= 0 and int(t) not in stop_ids]
        out.append((answer, b"".join(token_bytes[t] for t in answer).decode("utf-8")))
    return out


@jax.jit
def legal_ids(tables, grammar_ids, ids, budgets):
    """(B, L) bool: each id allowed by the mask the sampler would have applied (replayed states)."""
    states, remaining = replay_states(tables, grammar_ids, ids, budgets)
    return token_allowed(tables, grammar_ids[:, None], states, remaining, ids)


def padded_rows(rows: list[list[int]], length: int, pad: int) -> jnp.ndarray:
    """(len(rows), length) int32, each row right-padded with ``pad`` (one shape: one compilation)."""
    assert all(len(r) <= length for r in rows)
    return jnp.asarray([list(r) + [pad] * (length - len(r)) for r in rows], jnp.int32)


@functools.lru_cache(maxsize=1)
def smollm2_formats():
    """(tokenizer, compiler, {name: CompiledGrammar}) for the project's formats over SmolLM2
    (built once per test process: loading the GGUF tokenizer and compiling take seconds)."""
    from jax_drive.coop.agent import COMMANDS
    from jax_drive.coop.negotiation.prompts import MAX_WORDS
    from jax_drive.models.loading import smollm2_gguf_path
    from jax_drive.models.tokenizer import Tokenizer
    from jax_drive.sampling.grammar import (GrammarCompiler, action_grammar, actor_reply_grammar,
                                            consensus_grammar, sum_actions_grammar, trajectory_grammar)

    tokenizer = Tokenizer.from_gguf(smollm2_gguf_path())
    compiler = GrammarCompiler(tokenizer)
    grammars = {"trajectory": trajectory_grammar(), "action": action_grammar(tuple(COMMANDS)),
                "actor": actor_reply_grammar(MAX_WORDS), "sum": sum_actions_grammar(FORMAT_VIDS),
                "consensus": consensus_grammar(), "consensus10": consensus_grammar(FORMAT_SCORES)}
    return tokenizer, compiler, {name: compiler.compile(g) for name, g in grammars.items()}


FORMAT_VIDS = (201, 202, 17)
FORMAT_SCORES = tuple(range(0, 101, 10))
