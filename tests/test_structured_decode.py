"""Grammars inside the jitted sampler (tiny random models over the byte tokenizer):

1. every sampled answer (temperature 1, >= 200 draws per grammar, several grammars and an
   unconstrained row in one batch, repeated prompts and a common prefix prefilled once) matches
   its grammar, with and without jump-forward, with LoRA adapters, and over session turns
   (each turn its own automaton) with prompt lookup; raw log-probs are the masked policy's;
2. a grammar that needs k tokens always finishes with max_new_tokens = k; a row the mask
   leaves nothing (min_new_tokens, no stop ids) ends cleanly; a grammar that cannot finish
   is refused;
3. jump-forward equals plain constrained decoding: greedy tokens identical, sampled answers
   from the same distribution (chi-square against the exact masked distribution), fewer
   forward passes;
4. a new grammar of similar size compiles no new decode program.
"""

from __future__ import annotations

import itertools
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jax_drive.models.tiny import TINY_VOCAB, byte_tokenizer, peaked_tiny_model, tiny_policy
from jax_drive.sampling import CompileCounter, JaxEngine, PromptLookup, SamplingParams
from jax_drive.sampling.grammar import Grammar, GrammarError, action_grammar, advance, allowed_tokens
from jax_drive.sampling.grammar.regex import parse, to_regex
from jax_drive.sampling.sampler import compiled_programs

TOKENIZER = byte_tokenizer()
STOP = TOKENIZER.eos_token_ids[0]
GRAMMARS = {
    "choice": Grammar.choice(["yes", "no", "maybe so"]),
    "number": Grammar.regex(r"-?(0|[1-9]\d{0,2})\.\d\d, [a-z]{2,5}!"),
    "action": action_grammar(("go", "stop", "keep"), max_message_chars=6),
}
PREFIX = "You are a driving assistant. Answer in the requested format. Question "
MAX_NEW = 48
DRAWS = 200


def _matches(grammar: Grammar, text: str) -> bool:
    if not re.fullmatch(to_regex(parse(grammar.pattern), python=True), text):
        return False
    if grammar.kind == "json_schema":
        value = json.loads(text)
        return set(value) == {"command", "message"} and len(value["message"]) <= 6
    return True


FORK = Grammar.regex(r"ab(c|d|e)fgh(i|j)kl")  # 2 free tokens, 7 forced letters and the stop id
ROWS = [*GRAMMARS.values(), FORK, None]  # one prompt each (the last row unconstrained)


@pytest.fixture(scope="module")
def model():
    return peaked_tiny_model("llama", scale=2.0, vocab_size=TINY_VOCAB)


def _prompts(count: int) -> list[list[int]]:
    """Distinct prompts with a common prefix (prefilled once); repeated n times (shared)."""
    return [TOKENIZER.encode(PREFIX + str(i)) for i in range(count)]


@pytest.fixture(scope="module")
def draws(model):
    """{"plain" / "jump": (engine, completions)}: DRAWS samples of each prompt of ROWS."""
    out = {}
    for name, jump in (("plain", 0), ("jump", 6)):
        engine = JaxEngine(model, TOKENIZER, jump_forward=jump)
        params = SamplingParams(max_new_tokens=MAX_NEW, n=DRAWS, grammar=ROWS)
        out[name] = engine, engine.generate(_prompts(len(ROWS)), params, jax.random.key(1))
    return out


@pytest.mark.parametrize("name", ["plain", "jump"])
def test_sampled_answers_match_their_grammar(draws, name):
    _, out = draws[name]
    for i, grammar in enumerate(ROWS[:-1]):
        rows = out[i * DRAWS:(i + 1) * DRAWS]
        # a stop id ends the answer, or the budget ends it in an accepting state (long escapes)
        assert all(c.token_ids[-1] == STOP or len(c.token_ids) == MAX_NEW for c in rows)
        assert sum(c.finish_reason == "stop" for c in rows) > DRAWS * 0.9
        bad = [c.text for c in rows if not _matches(grammar, c.text)]
        assert not bad, (grammar.kind, bad[:3])
        assert len({c.text for c in rows}) >= (3 if grammar.kind == "choice" else 6)  # sampled, not one answer
    free = out[-DRAWS:]  # the unconstrained row: free text, rarely one of the grammars' answers
    assert sum(_matches(g, c.text) for c in free for g in ROWS[:-1]) < DRAWS // 2


def _replayed_states(tables, grammar_id: int, ids) -> list[int]:
    states = [0]
    for t in ids[:-1]:
        states.append(int(advance(tables, grammar_id, states[-1], t)))
    return states


def _masked_logprobs(model, prompt, ids, tables, grammar_id):
    """(masked, unmasked) teacher-forced log-probs of ``ids`` after ``prompt`` (the mask the
    sampler applied: replayed states, budget MAX_NEW - t)."""
    seq = jnp.asarray([list(prompt) + list(ids)])
    logits = model(seq)[0][0, len(prompt) - 1:-1]
    states = _replayed_states(tables, grammar_id, ids)
    allowed = allowed_tokens(tables, grammar_id, jnp.asarray(states), MAX_NEW - jnp.arange(len(states)))
    at = (jnp.arange(len(ids)), jnp.asarray(ids))
    return jax.nn.log_softmax(jnp.where(allowed, logits, -1e30))[at], jax.nn.log_softmax(logits)[at]


def test_raw_logprobs_are_the_masked_policy(model, draws):
    """Teacher-forced log-softmax over the allowed tokens reproduces the sampler's raw log-probs
    (forced tokens: 0); the unmasked log-softmax does not."""
    engine, out = draws["jump"]
    grammar = GRAMMARS["action"]
    tables, ids, _ = engine.grammars.tables(ROWS, (STOP,))
    row = ROWS.index(grammar)
    prompt = _prompts(len(ROWS))[row]
    for c in out[row * DRAWS:row * DRAWS + 3]:
        masked, plain = _masked_logprobs(model, prompt, c.token_ids, tables, int(ids[row]))
        np.testing.assert_allclose(c.logprobs, masked, atol=2e-5)
        assert np.abs(np.asarray(plain) - np.asarray(c.logprobs)).max() > 0.1
        assert np.asarray(c.logprobs)[:2].tolist() == [0.0, 0.0]  # '{"' is forced


def test_jump_forward_samples_the_same_distribution_in_fewer_passes(model, draws):
    """FORK's 6 answers: both decoders' counts fit the exact masked distribution (chi-square,
    as for prompt lookup); a shifted distribution is rejected (the check has power)."""
    row = ROWS.index(FORK)
    prompt = _prompts(len(ROWS))[row]
    texts = ["ab" + x + "fgh" + y + "kl" for x, y in itertools.product("cde", "ij")]
    engine = draws["plain"][0]
    tables, ids, _ = engine.grammars.tables(ROWS, (STOP,))
    exact = np.asarray([float(jnp.exp(_masked_logprobs(model, prompt, TOKENIZER.encode(t) + [STOP], tables,
                                                       int(ids[row]))[0].sum())) for t in texts])
    np.testing.assert_allclose(exact.sum(), 1.0, rtol=1e-4)
    exact = exact / exact.sum()
    assert exact.min() > 0.03  # every cell is expected > 6 times: the check has power
    for name in ("plain", "jump"):
        out = draws[name][1][row * DRAWS:(row + 1) * DRAWS]
        counts = np.asarray([sum(c.text == t for c in out) for t in texts])
        assert counts.sum() == DRAWS
        assert stats.chisquare(counts, exact * DRAWS).pvalue > 1e-4
        assert stats.chisquare(counts, np.roll(exact, 1) * DRAWS).pvalue < 1e-4
    (plain, plain_tokens), (jump, _) = (_steps(draws[name][0], prompt) for name in ("plain", "jump"))
    # plain: one pass per token (how many depends on the spelling the model samples); jump-forward:
    # one pass per free choice (x, y, the stop), forced runs ride along with a sample
    assert plain == plain_tokens >= 6 and jump == 3


def _steps(engine, prompt) -> tuple[int, int]:
    """(decode passes, answer tokens) of one sampled FORK answer."""
    session, out = engine.start([prompt], SamplingParams(max_new_tokens=MAX_NEW, grammar=FORK), jax.random.key(1))
    return session.last_decode_steps, len(out[0].token_ids)


def test_greedy_jump_forward_equals_plain_under_lora():
    """A LoRA policy (non-zero adapters): greedy tokens and log-probs identical with and without
    jump-forward, every answer of its grammar."""
    policy, _, _ = tiny_policy(seed=2, lora_rank=2)
    for proj in (policy.layers.q_proj, policy.layers.v_proj):
        proj.lora_b[...] = 0.3 * jax.random.normal(jax.random.key(4), proj.lora_b.shape)
    params = SamplingParams(max_new_tokens=MAX_NEW, temperature=0.0, grammar=ROWS[:4])
    a = JaxEngine(policy, TOKENIZER).generate(_prompts(4), params, jax.random.key(0))
    b = JaxEngine(policy, TOKENIZER, jump_forward=6).generate(_prompts(4), params, jax.random.key(0))
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    for x, y, grammar in zip(a, b, ROWS):
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
        assert _matches(grammar, x.text)


def test_session_turns_with_prompt_lookup(model):
    """Turn 1 with one grammar per row, turn 2 (kept caches, prompt lookup, jump-forward) with
    another: each turn's answers match that turn's grammar."""
    engine = JaxEngine(model, TOKENIZER, prompt_lookup=PromptLookup(num_draft=3, max_ngram=2), jump_forward=3)
    first = [GRAMMARS["choice"], GRAMMARS["number"]]
    session, turn1 = engine.start(_prompts(2), SamplingParams(max_new_tokens=MAX_NEW, n=4, grammar=first),
                                  jax.random.key(5))
    assert all(_matches(first[i // 4], c.text) for i, c in enumerate(turn1))
    second = [GRAMMARS["number"], GRAMMARS["action"]] * 4
    appended = [TOKENIZER.encode(" Again: ") + list(c.token_ids[-3:]) for c in turn1]
    turn2 = session.extend(appended, SamplingParams(max_new_tokens=MAX_NEW, grammar=second), jax.random.key(6))
    bad = [(g.kind, c.text) for g, c in zip(second, turn2) if not _matches(g, c.text)]
    assert not bad, bad[:3]


@pytest.mark.parametrize("extra", [0, 2])
def test_a_grammar_needing_k_tokens_finishes_with_budget_k(model, extra):
    grammar = Grammar.regex(r"[a-z]{3}( [a-z]{2,4})*;")
    engine = JaxEngine(model, TOKENIZER)
    k = engine.grammars.compile(grammar, (STOP,)).min_tokens + extra
    assert k - extra == 4
    out = engine.generate([PREFIX], SamplingParams(max_new_tokens=k, n=DRAWS, grammar=grammar), jax.random.key(7))
    answers = [TOKENIZER.decode([t for t in c.token_ids if t != STOP]) for c in out]
    assert all(_matches(grammar, a) for a in answers)
    if extra:
        assert any(c.finish_reason == "stop" for c in out)
    with pytest.raises(GrammarError, match="needs at least 4 tokens"):
        engine.generate([PREFIX], SamplingParams(max_new_tokens=3, grammar=grammar), jax.random.key(7))


def test_rows_the_mask_empties_end_cleanly(model):
    """min_new_tokens holds the stop id back: after 'abc' nothing is allowed, the row ends
    there ('stop', no stop id); without stop ids a complete answer ends the same way."""
    grammar = Grammar.choice(["ab", "abc"])
    engine = JaxEngine(model, TOKENIZER, jump_forward=2)
    held = engine.generate([PREFIX], SamplingParams(max_new_tokens=8, min_new_tokens=6, n=16, grammar=grammar),
                           jax.random.key(8))
    assert {c.text for c in held} == {"abc"} and all(c.finish_reason == "stop" for c in held)
    assert all(STOP not in c.token_ids for c in held)
    free = engine.generate([PREFIX], SamplingParams(max_new_tokens=8, stop_token_ids=(), n=16, grammar=grammar),
                           jax.random.key(9))
    assert {c.text for c in free} == {"abc"}  # 'ab' can continue: only 'abc' is complete and final


def test_a_new_grammar_of_similar_size_compiles_no_new_decode_program(model):
    engine = JaxEngine(model, TOKENIZER)
    params = SamplingParams(max_new_tokens=MAX_NEW, n=4, grammar=Grammar.regex(r"[a-f]{2,6} (x|yz)"))
    engine.generate([PREFIX], params, jax.random.key(0))
    with CompileCounter() as compiles:
        out = engine.generate([PREFIX], params.replace(grammar=Grammar.regex(r"[0-7]{1,5}, (a|bc)!")),
                              jax.random.key(0))
    assert compiled_programs(compiles) == {"prefill": 0, "decode": 0}
    assert all(re.fullmatch(r"[0-7]{1,5}, (a|bc)!", c.text) for c in out)


def test_bad_grammar_settings_are_refused():
    with pytest.raises(TypeError, match="grammar must be a Grammar"):
        SamplingParams(grammar="[a-z]+")
    with pytest.raises(ValueError, match="2 entries for 3 prompts"):
        SamplingParams(grammar=[None, None]).row_grammars(3)
    with pytest.raises(ValueError, match="jump_forward"):
        JaxEngine(peaked_tiny_model(vocab_size=TINY_VOCAB), TOKENIZER, jump_forward=-1)
    with pytest.raises(ValueError, match="tokenizer"):
        JaxEngine(peaked_tiny_model(vocab_size=TINY_VOCAB)).generate(
            [[1, 2]], SamplingParams(grammar=GRAMMARS["choice"]), jax.random.key(0))


def test_model_without_arrays_uses_the_generic_loop(model):
    """The generic decode path (model.__call__, stacked cache) masks the same way."""
    from jax_drive.sampling import SamplerConfig

    engine = JaxEngine(model, TOKENIZER, SamplerConfig(unroll_layers=False), jump_forward=4)
    out = engine.generate(_prompts(1), SamplingParams(max_new_tokens=MAX_NEW, n=8, grammar=GRAMMARS["number"]),
                          jax.random.key(2))
    assert all(_matches(GRAMMARS["number"], c.text) for c in out)
