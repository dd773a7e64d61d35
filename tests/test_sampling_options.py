"""The masked distribution over a few options (sampling.options) against full logits, one
option and one branch point at a time, on the tiny random model."""

import jax.numpy as jnp
import numpy as np
import pytest

from jax_drive.sampling.options import option_probabilities, option_trie

from coop_tiny import tiny_model

COMMANDS = ("go", "stop", "slow down", "speed up", "change lane left", "change lane right", "keep")


def _reference(model, tok, prompt: list[int], context: str, options, temperature: float = 1.0) -> np.ndarray:
    """Each option's probability by walking its own spelling: at every token, the full
    next-token softmax at ``temperature`` renormalised over the tokens that some option sharing
    the walked prefix takes there (forced tokens have probability 1)."""
    spelled = [tok.encode(context + o) for o in options]
    out = []
    for mine in spelled:
        p, depth = 1.0, 0
        while depth < len(mine):
            allowed = sorted({s[depth] for s in spelled if len(s) > depth and s[:depth] == mine[:depth]})
            if len(allowed) > 1:
                logits = np.asarray(model(jnp.asarray([prompt + mine[:depth]]))[0][0, -1], np.float64) / temperature
                q = np.exp(logits[allowed] - logits[allowed].max())
                p *= q[allowed.index(mine[depth])] / q.sum()
            depth += 1
        out.append(p)
    return np.asarray(out)


def test_option_probabilities_equal_the_walk_over_full_logits():
    model, tok = tiny_model()
    prompts = [tok.encode("You drive Vehicle 3."), tok.encode("A longer prompt: the truck ahead has stopped, go?")]
    context = '{"command": "'
    got = option_probabilities(model, tok, prompts, context, COMMANDS)
    assert got.shape == (2, len(COMMANDS))
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-9)
    for prompt, row in zip(prompts, got):
        np.testing.assert_allclose(row, _reference(model, tok, list(prompt), context, COMMANDS), atol=1e-4)
    cold = option_probabilities(model, tok, prompts[:1], context, COMMANDS, temperature=0.2)
    np.testing.assert_allclose(cold[0], _reference(model, tok, list(prompts[0]), context, COMMANDS, 0.2), atol=1e-4)
    assert option_probabilities(model, tok, [], context, COMMANDS).shape == (0, len(COMMANDS))
    with pytest.raises(ValueError, match="temperature"):
        option_probabilities(model, tok, prompts, context, COMMANDS, temperature=0.0)


def test_the_trie_forks_where_options_part_ways():
    _, tok = tiny_model()  # bytes: one token per character
    trie = option_trie(tok, ">", ("slow down", "speed up", "stop"))
    assert list(trie.shared) == tok.encode(">s")
    assert [(tok.decode(list(prefix)), tok.decode(list(ids))) for prefix, ids in trie.branches] == [("", "lpt")]
    for tight in (("go", "good"), ("go", "go on")):  # a start as text: an end-of-answer decision
        with pytest.raises(ValueError, match="start of"):
            option_trie(tok, ">", tight)
    with pytest.raises(ValueError, match="two or more"):
        option_trie(tok, ">", ("go", "go"))
