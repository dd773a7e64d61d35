"""Grammar compiler and device tables over the byte tokenizer and small hand-made vocabularies:
the regex subset, compilation (and its refusals), class compression, the mask, replay, jump-forward
helpers, stacking and the cache."""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grammar_walks import legal_ids, padded_rows, random_walks, walk_texts
from jax_drive.models.tiny import TINY_VOCAB, byte_tokenizer
from jax_drive.sampling.grammar import (
    Grammar,
    GrammarCompiler,
    GrammarError,
    RegexError,
    TokenVocabulary,
    advance,
    allowed_classes,
    allowed_tokens,
    bucket,
    compile_grammar,
    forced_run,
    forced_token,
    mask_logits,
    replay_states,
    stack_grammars,
    token_allowed,
    token_vocabulary,
)
from jax_drive.sampling.grammar import compile as compile_module
from jax_drive.sampling.grammar.regex import normalize, parse, to_regex, without_nul

TOKENIZER = byte_tokenizer()
STOP = TOKENIZER.eos_token_ids
COMPILER = GrammarCompiler(TOKENIZER, vocab_size=TINY_VOCAB)
VOCAB = COMPILER.vocabulary


def python_regex(grammar: Grammar) -> re.Pattern:
    return re.compile(to_regex(parse(grammar.pattern), python=True))


def small_vocab(*tokens: bytes, stops: tuple[int, ...] = ()) -> TokenVocabulary:
    """Ids 0.. for ``tokens``, then one stop id per entry of ``stops`` (their values ignored)."""
    spelled = tuple(tokens) + (None,) * len(stops)
    stop_ids = tuple(range(len(tokens), len(tokens) + len(stops)))
    return TokenVocabulary(spelled, stop_ids, len(spelled), "test-" + repr(spelled))


def encode(text: str) -> list[int]:
    return TOKENIZER.encode(text)


# ------------------------------------------------------------------ the regex subset
@pytest.mark.parametrize("pattern, error", [
    (r"a(?=b)", "look-around"), (r"\bx", "word boundary"), (r"(a", "missing"), ("a)", "unbalanced"),
    (r"(a)\1", "back-references"), ("[a", "unterminated"), ("a{", "repetition"), (r"\p{L}", "Unicode class"),
    ("(?i)a", "inline flags"), ("a^b", "anchor"), ("[[a]]", "nested"), ("*a", "nothing to repeat"),
    ("a{3,1}", "max < min"), (r"\q", "unknown escape"), (r"\x{110000}", "scalar"),
])
def test_regex_outside_the_subset_is_refused_with_the_construct_named(pattern, error):
    with pytest.raises(RegexError, match=error):
        parse(pattern)
    with pytest.raises(GrammarError):  # the same error type at the Grammar boundary
        Grammar.regex(pattern)


def test_normalized_regex_spells_classes_out_and_drops_anchors():
    assert normalize(r"^a\d{2,3}$") == "a[0-9]{2,3}"
    assert normalize(r"[\]a-]x.") == r"[\-\]a]x[^\x{0}\x{a}]"  # '.' never matches NUL or \n
    assert normalize(r"\$") == r"\$" and normalize(r"\\$") == r"\\"
    assert normalize("(?P<n>ab)+?") == "(?:ab)+"


@settings(max_examples=40)
@given(data=st.data(), pattern=st.sampled_from([
    r"[a-c]{2,4}(x|yz)*", r"\d+(\.\d\d)?", r"\w+@\w+\.(com|org)", r"(ab|a)(b|)c?", r"[^\s,]{1,5}(,[^\s,]{1,5})*",
    r"x\x41\u0042[\x43-\x45]", r"(?:0|[1-9][0-9]*)", r"[\]\-^]+",
]))
def test_normalized_regex_matches_the_same_strings(data, pattern):
    """Strings of the original pattern (ASCII, no NUL) fullmatch the normalised one in Python."""
    text = data.draw(st.from_regex(pattern, fullmatch=True, alphabet=st.characters(min_codepoint=1,
                                                                                    max_codepoint=127)))
    rewritten = re.compile(to_regex(without_nul(parse(pattern)), python=True))
    assert rewritten.fullmatch(text), (pattern, text)


# ------------------------------------------------------------------ compile
def test_token_vocabulary_of_the_byte_tokenizer():
    assert len(VOCAB.token_bytes) == TOKENIZER.vocab_size and VOCAB.vocab_size == TINY_VOCAB
    assert sorted(VOCAB.token_bytes[i] for i in range(256)) == [bytes([b]) for b in range(256)]
    text = "Ünïcode {\"a\": 1} 🚗"
    assert b"".join(VOCAB.token_bytes[i] for i in encode(text)) == text.encode()
    for idx in range(256, TOKENIZER.vocab_size):  # the ChatML specials: never answer text
        assert VOCAB.token_bytes[idx] is None
    assert VOCAB.stop_ids == STOP
    assert token_vocabulary(TOKENIZER, TINY_VOCAB).fingerprint == VOCAB.fingerprint
    assert token_vocabulary(TOKENIZER, TINY_VOCAB, stop_ids=()).fingerprint != VOCAB.fingerprint


def test_repetition_continues_past_a_complete_match():
    """outlines-core 0.2.14 alone drops 'a' after 'ab' in (ab)+ (the compiler's sentinel restores it)."""
    vocab = small_vocab(b"a", b"b", b"ab", stops=(0,))
    compiled = compile_grammar(Grammar.regex("(ab)+"), vocab)
    rows = [[2, 0, 1, 2, 3], [0, 1, 0, 1, 3], [2, 2, 2, 3]]
    legal = legal_ids(stack_grammars([compiled]), jnp.zeros((3,), jnp.int32), padded_rows(rows, 5, 3),
                      jnp.asarray([5, 5, 4]))
    assert np.asarray(legal)[[0, 1, 2, 2], [4, 4, 3, 3]].all() and np.asarray(legal)[:, :3].all()
    assert compiled.min_tokens == 1 and compiled.max_tokens is None
    assert compiled.num_states == 3  # start, after 'a', after a complete 'ab'


def test_choice_with_a_prefix_option_and_stop_handling():
    compiled = COMPILER.compile(Grammar.choice(["stop", "stopped", "go"]))
    cases = [("stop", 5), ("stopped", 8), ("go", 3), ("sto", 4), ("stopped", 7)]
    rows = [encode(text) + [STOP[0]] for text, _ in cases]
    legal = np.asarray(legal_ids(stack_grammars([compiled]), jnp.zeros((5,), jnp.int32), padded_rows(rows, 8, STOP[0]),
                                 jnp.asarray([b for _, b in cases])))
    ends = [len(r) - 1 for r in rows]
    assert all(legal[i, :ends[i] + 1].all() for i in range(3))
    assert legal[3, :3].all() and not legal[3, 3]  # the stop id outside an accepting state
    assert legal[4, :7].all() and not legal[4, 7]  # no room left for the stop id: the budget counts it
    assert compiled.min_tokens == 2 and compiled.max_tokens == 7


def test_dead_end_is_refused_with_where_it_happens():
    vocab = small_vocab(b"a", b"b", stops=(0,))  # no 'c': after "a", b* loops and never accepts
    with pytest.raises(GrammarError, match="dead end.*after 'a'"):
        compile_grammar(Grammar.regex("ab*c|b"), vocab)
    with pytest.raises(GrammarError, match="dead end"):
        compile_grammar(Grammar.regex("c"), vocab)
    with pytest.raises(GrammarError, match="dead end"):  # NUL is never produced (the compiler's marker)
        COMPILER.compile(Grammar.regex("a\\x00"))


def test_state_cap_and_budget_are_refused():
    with pytest.raises(GrammarError, match="cap"):
        compile_grammar(Grammar.regex("[a-z]{300}"), VOCAB, max_states=100)
    compiled = COMPILER.compile(Grammar.regex("[a-z]{30}"))
    assert compiled.min_tokens == compiled.max_tokens == 30
    with pytest.raises(GrammarError, match="at least 30 tokens"):
        COMPILER.compile(Grammar.regex("[a-z]{30}"), budget=29)
    COMPILER.compile(Grammar.regex("[a-z]{30}"), budget=30)


def test_class_compression_is_exact_and_checked(monkeypatch):
    """Columns equal in every state share a class; a hash collision is detected, not used."""
    compiled = COMPILER.compile(Grammar.regex("[a-c]x|[d-f]y|[0-9]+"))
    dense = compiled.next_state[:, compiled.token_class]  # (S, V)
    for state in range(compiled.num_states):
        for cls in range(compiled.num_classes):
            members = np.flatnonzero(compiled.token_class == cls)
            assert (dense[state, members] == dense[state, members[0]]).all()
    assert {tuple(np.flatnonzero(compiled.token_class == c)) for c in range(compiled.num_classes)} >= {
        tuple(sorted(encode("abc"))), tuple(sorted(encode("def"))), tuple(sorted(encode("0123456789")))}
    assert compiled.class_size.sum() == TINY_VOCAB
    assert (compiled.class_token == [np.flatnonzero(compiled.token_class == c)[0]
                                     for c in range(compiled.num_classes)]).all()
    # multiplier 0 keeps only the last state's code: x and y agree in the state after z but
    # not at the start, so their hashes collide; the exact check must notice
    monkeypatch.setattr(compile_module, "_HASH_MULTIPLIERS", (0,))
    with pytest.raises(RuntimeError, match="collided"):
        compile_grammar(Grammar.regex("xq|yr|z[xy]"), VOCAB)


# ------------------------------------------------------------------ the mask, sampled
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "tags": {"type": "array", "items": {"enum": ["x", "yz"]}, "minItems": 1, "maxItems": 3},
    "pos": {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
            "required": ["ok", "n"]}},
    "required": ["name", "tags", "pos"]}
GRAMMARS = [Grammar.regex(r"(ab|a)(b|)c?[0-9]{0,3}|x+y"), Grammar.choice(["left", "right", "le", "straight on"]),
            Grammar.json_schema(SCHEMA), Grammar.json_schema(SCHEMA, separators=(", ", ": ")),
            Grammar.regex(r"[^\n]{2,5}\.")]
COMPILED = [COMPILER.compile(g) for g in GRAMMARS]
TABLES = stack_grammars(COMPILED + [COMPILER.compile(Grammar.anything())])
ROWS = 48
REPLAY = jax.jit(replay_states)


def check_schema_value(value, separators):
    assert set(value) == {"name", "tags", "pos"} and list(value) == ["name", "tags", "pos"]
    assert isinstance(value["name"], str) and len(value["name"]) <= 6
    assert 1 <= len(value["tags"]) <= 3 and set(value["tags"]) <= {"x", "yz"}
    assert isinstance(value["pos"]["ok"], bool) and isinstance(value["pos"]["n"], int)
    return json.dumps(value, separators=separators, ensure_ascii=False)


@settings(max_examples=6)
@given(seed=st.integers(0, 2**31 - 1), tight=st.booleans())
def test_random_walks_end_accepted_within_budget_and_match(seed, tight):
    """Uniform draws among allowed tokens: every row ends accepted within its budget; the text
    fullmatches the regex (JSON: loads, satisfies the schema, uses the separators); replaying
    the ids gives the states the walk saw, and every id was allowed there."""
    rng = np.random.default_rng(seed)
    grammar_ids = rng.integers(0, len(COMPILED), ROWS).astype(np.int32)
    low = np.asarray([COMPILED[g].min_tokens for g in grammar_ids])
    budgets = np.minimum(low + (rng.integers(0, 3, ROWS) if tight else rng.integers(0, 40, ROWS)), 64)
    budgets = budgets.astype(np.int32)
    ids, states, final, accepted = random_walks(TABLES, jnp.asarray(grammar_ids), jnp.asarray(budgets),
                                                jnp.asarray(STOP, jnp.int32), jax.random.key(seed), steps=64)
    assert bool(accepted.all())
    ids = np.asarray(ids)
    lengths = (ids >= 0).sum(1)
    assert (lengths <= budgets).all()
    ids0, grammar_ids, budgets = jnp.maximum(jnp.asarray(ids), 0), jnp.asarray(grammar_ids), jnp.asarray(budgets)
    replayed, _ = REPLAY(TABLES, grammar_ids, ids0, budgets)
    live = ids >= 0
    assert (np.asarray(replayed)[live] == np.asarray(states)[live]).all()
    assert np.asarray(legal_ids(TABLES, grammar_ids, ids0, budgets))[live].all()
    for g, (_, text) in zip(np.asarray(grammar_ids), walk_texts(ids, VOCAB.token_bytes, STOP)):
        grammar = GRAMMARS[g]
        assert python_regex(grammar).fullmatch(text), (grammar.pattern, text)
        if grammar.kind == "json_schema":
            assert check_schema_value(json.loads(text), grammar.separators) == text
        if grammar.kind == "choice":
            assert text in grammar.choices


@settings(max_examples=20)
@given(data=st.data(), which=st.integers(0, len(GRAMMARS) - 1))
def test_every_string_of_the_language_is_allowed(data, which):
    """Completeness: strings drawn from the regex, tokenized, are legal at every step with a
    budget of exactly their length, and end in an accepting state where the stop id is allowed."""
    grammar = GRAMMARS[which]
    text = data.draw(st.from_regex(python_regex(grammar), fullmatch=True))
    ids = encode(text)
    if len(ids) >= LONGEST:
        return
    legal = legal_ids(TABLES, jnp.asarray([which]), padded_rows([ids + [STOP[0]]], LONGEST, STOP[0]),
                      jnp.asarray([len(ids) + 1]))
    assert np.asarray(legal)[0, :len(ids) + 1].all(), text


LONGEST = 128


@pytest.mark.parametrize("k_extra", [0, 1])
def test_a_grammar_needing_k_tokens_finishes_with_budget_k(k_extra):
    grammar = Grammar.regex(r"ab(c|d[0-9]+|ef)g(h[0-9]*)?")
    compiled = COMPILER.compile(grammar)
    k = compiled.min_tokens + k_extra
    assert compiled.min_tokens == 4
    tables = stack_grammars([compiled])
    ids, _, _, accepted = random_walks(tables, jnp.zeros((256,), jnp.int32), jnp.full((256,), k, jnp.int32),
                                       jnp.asarray(STOP, jnp.int32), jax.random.key(k), steps=k)
    assert bool(accepted.all())
    texts = {text for _, text in walk_texts(np.asarray(ids), VOCAB.token_bytes, STOP)}
    assert all(python_regex(grammar).fullmatch(t) and len(t) <= k for t in texts)
    five = {"abcg", "abcgh", "abefg"} | {f"abd{d}g" for d in range(10)}
    assert texts == {"abcg"} if k_extra == 0 else (texts <= five and len(texts) > 5)


def test_mask_functions_agree():
    grammar_ids = jnp.asarray([0, 1, 2, 3, 4, 5, 0, 2], jnp.int32)
    states = jnp.asarray([0, 0, 0, 3, 1, 0, 2, -1], jnp.int32)
    remaining = jnp.asarray([9, 9, 40, 40, 3, 1, 0, 9], jnp.int32)
    mask = np.asarray(allowed_tokens(TABLES, grammar_ids, states, remaining))
    classes = np.asarray(allowed_classes(TABLES, grammar_ids, states, remaining))
    token_class = np.asarray(TABLES.token_class)[np.asarray(grammar_ids)]
    assert (mask == np.take_along_axis(classes, token_class, axis=1)).all()
    vocab = np.arange(TINY_VOCAB)
    per_token = token_allowed(TABLES, grammar_ids[:, None], states[:, None], remaining[:, None], vocab[None, :])
    assert (np.asarray(per_token) == mask).all()
    assert mask[5].all()  # the anything grammar: every id, with one token of budget left
    assert not mask[6].any() and not mask[7].any()  # no budget left; a state that left the grammar
    logits = jnp.zeros((8, TINY_VOCAB))
    assert (np.asarray(mask_logits(logits, mask)) < -1e29).sum() == (~mask).sum()


def test_forced_tokens_follow_the_literal_parts():
    compiled = COMPILER.compile(Grammar.json_schema({"type": "object", "properties": {
        "command": {"enum": ["go", "stop"]}}, "required": ["command"]}))
    tables = stack_grammars([compiled])
    tokens, length = forced_run(tables, jnp.zeros((1,), jnp.int32), jnp.zeros((1,), jnp.int32),
                                jnp.asarray([20]), 16)
    assert TOKENIZER.decode(np.asarray(tokens)[0, :int(length[0])].tolist()) == '{"command":"'
    state = jnp.zeros((), jnp.int32)
    for token in encode('{"command":"s'):
        state = advance(tables, 0, state, token)
    tokens, length = forced_run(tables, 0, state, 20, 8)
    assert np.asarray(tokens)[:int(length)].tolist() == encode('top"}') + [STOP[0]]
    assert int(forced_token(tables, 0, jnp.zeros((), jnp.int32), 20)) == encode("{")[0]
    choice = stack_grammars([COMPILER.compile(Grammar.choice(["ab", "ac"]))])
    assert int(forced_token(choice, 0, 0, 5)) == encode("a")[0]
    assert int(forced_token(choice, 0, advance(choice, 0, 0, encode("a")[0]), 5)) == -1
    tight = stack_grammars([COMPILER.compile(Grammar.regex("a(bcd|e)"))])
    after_a = advance(tight, 0, 0, encode("a")[0])
    assert int(forced_token(tight, 0, after_a, 3)) == -1  # b or e
    assert int(forced_token(tight, 0, after_a, 2)) == encode("e")[0]  # the budget leaves only e


# ------------------------------------------------------------------ stacking and the cache
def test_stacked_tables_are_bucketed_and_rows_are_independent():
    g, s, c, v = TABLES.shape
    assert (g, v) == (bucket(len(COMPILED) + 1), TINY_VOCAB)
    assert s == bucket(max(x.num_states for x in COMPILED), 16)
    assert c == bucket(max(x.num_classes for x in COMPILED), 16)
    assert bucket(17) == 32 and bucket(16) == 16 and bucket(3, 16) == 16
    alone = stack_grammars([COMPILED[2]], min_states=s, min_classes=c)
    for state in range(COMPILED[2].num_states):
        together = allowed_tokens(TABLES, 2, state, 30)
        assert (np.asarray(together) == np.asarray(allowed_tokens(alone, 0, state, 30))).all()
    padding = allowed_tokens(TABLES, g - 1, 0, 30)  # rows past the last grammar allow nothing
    assert not np.asarray(padding).any()
    other = GrammarCompiler(byte_tokenizer(), vocab_size=TINY_VOCAB + 64)
    with pytest.raises(GrammarError, match="different vocabularies"):
        stack_grammars([COMPILED[0], other.compile(GRAMMARS[0])])


def test_the_compiler_caches_by_language_and_tokenizer():
    compiler = GrammarCompiler(TOKENIZER, vocab_size=TINY_VOCAB, cache_size=2)
    first = compiler.compile(Grammar.regex("(a|b)c"))
    assert compiler.compile(Grammar.regex("(?:a|b)c")) is first  # the same normalised language
    compiler.compile(Grammar.regex("x"))
    compiler.compile(Grammar.regex("y"))
    assert compiler.compile(Grammar.regex("(a|b)c")) is not first  # evicted (cache of 2)
    assert first.fingerprint == VOCAB.fingerprint
    assert not np.array_equal(GrammarCompiler(TOKENIZER, vocab_size=TINY_VOCAB, stop_ids=())
                              .compile(Grammar.regex("(a|b)c")).next_state, first.next_state)


def test_bad_grammar_input_is_refused_at_the_boundary():
    with pytest.raises(GrammarError, match="not valid JSON"):
        Grammar.json_schema("{bad")
    with pytest.raises(GrammarError, match="separators"):
        Grammar.json_schema({"type": "string"}, separators=(";", ":"))
    with pytest.raises(GrammarError, match="choices"):
        Grammar.choice([])
    with pytest.raises(GrammarError, match="kind"):
        Grammar("grammar", "", "")
    with pytest.raises(GrammarError, match="byte-level"):
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import models

        class Plain:
            backend = HFTokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
            eos_token_ids = (1,)

        token_vocabulary(Plain())


def test_scalar_and_batched_arguments_broadcast():
    states = jnp.asarray([0, 1, 2], jnp.int32)
    batched = allowed_tokens(TABLES, jnp.zeros((3,), jnp.int32), states, jnp.full((3,), 9))
    assert (np.asarray(allowed_tokens(TABLES, 0, states, 9)) == np.asarray(batched)).all()
    forced = forced_token(TABLES, 2, jnp.asarray([0, 0]), jnp.asarray([60, 60]))
    assert np.asarray(forced).tolist() == [encode("{")[0]] * 2
