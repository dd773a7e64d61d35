"""The project's answer formats as grammars over the GGUF-embedded SmolLM2 tokenizer: every
sampled answer parses with the project's own parser, every answer the project writes is
allowed, and a budget of exactly the fewest tokens always finishes."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grammar_walks import (FORMAT_SCORES, FORMAT_VIDS, legal_ids, padded_rows, random_walks, smollm2_formats,
                           walk_texts)
from jax_drive.coop.agent import COMMANDS, format_action, parse_action
from jax_drive.coop.negotiation.critic import parse_consensus, parse_sum_actions
from jax_drive.coop.negotiation.negotiate import clean_message
from jax_drive.coop.negotiation.prompts import MAX_WORDS
from jax_drive.coop.negotiation.teacher import KEEP, PASS, YIELD_SLOW, YIELD_STOP
from jax_drive.sampling.grammar import stack_grammars
from jax_drive.sampling.grammar.formats import codec_number_regex, int_range_regex
from jax_drive.text.codec import ANSWER_PREFIX, format_number, format_trajectory, parse_trajectory
from jax_drive.text.format_score import FormatConfig, check_answer

VIDS, SCORES = FORMAT_VIDS, FORMAT_SCORES


@pytest.fixture(scope="module")
def smollm2():
    """(tokenizer, compiler, compiled formats by name, stacked tables in the same order)."""
    tokenizer, compiler, compiled = smollm2_formats()
    return tokenizer, compiler, compiled, stack_grammars(list(compiled.values()))


def test_smollm2_token_bytes_match_the_tokenizer(smollm2):
    tokenizer, compiler, _, _ = smollm2
    spelled = compiler.vocabulary.token_bytes
    specials = [i for i, t in enumerate(spelled) if t is None]
    assert specials == list(range(17)) and tokenizer.eos_token_ids == (2,)  # <|endoftext|> .. <empty_output>
    checked = 0
    for idx, token in enumerate(spelled):
        if token is None:
            continue
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:  # a piece of a multi-byte character
            continue
        assert tokenizer.backend.decode([idx], skip_special_tokens=False) == text, idx
        checked += 1
    assert checked > 48_000
    sample = 'Here is {"command": "go"} — naïve 🚗 (+1.25, -0.03)'
    assert b"".join(spelled[i] for i in tokenizer.encode(sample)) == sample.encode()


def test_codec_numbers_are_exactly_what_format_number_writes_in_range():
    import re

    for bound in (150.0, FormatConfig().max_abs_heading, 0.5, 1.0):
        pattern = re.compile(codec_number_regex(bound))
        cents = int(np.floor(round(bound * 100, 6)))
        for c in range(-cents - 150, cents + 151):
            text = format_number(c / 100)
            assert bool(pattern.fullmatch(text)) == (abs(c) <= cents), (bound, text)
        for text in ("+0.01", "-0.00", "+0.0", "1.00", "+01.00", "0.00", "+1.5"):  # never written by the codec
            assert not pattern.fullmatch(text)
    for lo, hi in ((0, 100), (1, 149), (7, 7), (95, 1234)):
        pattern = re.compile(int_range_regex(lo, hi))
        assert [n for n in range(0, 1300) if pattern.fullmatch(str(n))] == list(range(lo, min(hi, 1299) + 1))
        assert not pattern.fullmatch("0" + str(max(lo, 1)))


def test_sampled_answers_parse_with_the_project_parsers(smollm2):
    """Uniform draws among allowed tokens, half the rows with a budget of exactly the fewest
    tokens, the rest a little more: every answer ends accepted and the project's parser takes it."""
    tokenizer, compiler, compiled, tables = smollm2
    names = list(compiled)
    per, rows = 6, []
    for g, name in enumerate(names):
        low = compiled[name].min_tokens
        rows += [(g, low)] * (per // 2) + [(g, low + extra) for extra in (7, 19, 31)][: per - per // 2]
    grammar_ids = jnp.asarray([g for g, _ in rows], jnp.int32)
    budgets = jnp.asarray([b for _, b in rows], jnp.int32)
    stop = tokenizer.eos_token_ids
    ids, _, _, accepted = random_walks(tables, grammar_ids, budgets, jnp.asarray(stop, jnp.int32),
                                       jax.random.key(0), steps=int(budgets.max()), by_class=True)
    assert bool(accepted.all())
    for (g, budget), (answer, text) in zip(rows, walk_texts(np.asarray(ids), compiler.vocabulary.token_bytes, stop)):
        name = names[g]
        assert len(answer) <= budget
        if name == "trajectory":
            parsed = parse_trajectory(text)
            assert parsed.ok and np.isfinite(parsed.poses).all() and text.startswith(ANSWER_PREFIX), text
            assert check_answer(text).format == 1.0 and format_trajectory(parsed.poses) == text
        elif name == "action":
            action = parse_action(text)
            assert action.ok and action.command_text in COMMANDS, text
            value = json.loads(text)
            assert list(value) == ["command", "message"] and len(value["message"]) <= 80
        elif name == "actor":
            assert text.startswith("I will ") and clean_message(text, MAX_WORDS) == (text, False), text
        elif name == "sum":
            parsed = parse_sum_actions(text, VIDS)
            assert parsed.ok and parsed.source == "json" and not parsed.missing, text
        else:
            score, error = parse_consensus(text)
            assert error is None and text.startswith("Short analysis: "), text
            assert round(score * 100) in (SCORES if name == "consensus10" else range(101))


def test_answers_the_project_writes_are_allowed(smollm2):
    """Completeness on the tokenizer's own spelling of the project's answers."""
    tokenizer, _, compiled, tables = smollm2
    rng = np.random.default_rng(0)
    points = rng.uniform(-1, 1, (6, 8, 3)) * [60.0, 8.0, 3.0]
    points[0, :2] = 0.0  # the codec's 0.0 and the +0.0x boundary
    points[1, 0] = [149.99, -150.0, 3.19]
    examples = [("trajectory", format_trajectory(p)) for p in points]
    examples += [("action", format_action(cmd, msg)) for cmd, msg in
                 [("go", ""), ("change lane left", "I yield to car 3, go ahead."), ("keep", 'say "hi"\\n ok'),
                  ("stop", "x" * 80)]]
    examples += [("actor", m.format(j=202, y=17, o=202, req="slow down"))
                 for m in YIELD_STOP + YIELD_SLOW + PASS + KEEP]
    examples += [("sum", json.dumps({str(v): {"speed": s} for v, s in zip(VIDS, ("STOP", "FASTER", "KEEP"))}))]
    examples += [("consensus", "Short analysis: Both agree that vehicle A yields.\nConsensus score: 85"),
                 ("consensus10", "Short analysis: They disagree. Consensus score: 30")]
    names = list(compiled)
    rows = [tokenizer.encode(text) + list(tokenizer.eos_token_ids) for _, text in examples]
    grammar_ids = jnp.asarray([names.index(name) for name, _ in examples])
    legal = np.asarray(legal_ids(tables, grammar_ids, padded_rows(rows, 256, tokenizer.eos_token_ids[0]),
                                 jnp.asarray([len(r) for r in rows])))
    for (name, text), row, ok in zip(examples, rows, legal):
        assert ok[:len(row)].all(), (name, text, tokenizer.decode(row[: int(np.argmin(ok)) + 1]))


def test_format_sizes_and_budgets(smollm2):
    """What the presets read: the fewest and most tokens, and compressed tables far below the
    dense [states, V] table."""
    _, _, compiled, _ = smollm2
    vocab = compiled["action"].token_class.shape[0]
    for name, c in compiled.items():
        assert c.num_classes < 300 and c.num_states < 1000, name
        assert c.next_state.size * 50 < c.num_states * vocab, name  # >= 50x smaller than dense
    assert compiled["trajectory"].min_tokens > 24 * 3  # at least three tokens per number
    assert compiled["trajectory"].max_tokens is not None and compiled["action"].max_tokens is not None
    assert compiled["actor"].max_tokens is None  # word length left to the budget
    assert compiled["action"].min_tokens <= 12  # '{"command": "go", "message": ""}'
