"""The same grammars in server dialects: GBNF checked by llama.cpp's own grammar engine (parse,
then token by token over the SmolLM2 vocabulary both sides share), the request fields of each
dialect, and live constrained requests against the llama.cpp server the suite runs."""

from __future__ import annotations

import ctypes
import json
import re
import urllib.request

import jax
import jax.numpy as jnp
import llama_cpp
import numpy as np
import pytest
from outlines_core import json_schema as outlines_schema

from grammar_walks import random_walks, smollm2_formats, walk_texts
from jax_drive.coop.agent import COMMANDS
from jax_drive.coop.negotiation.critic import parse_sum_actions
from jax_drive.coop.negotiation.prompts import MAX_WORDS
from jax_drive.models.loading import smollm2_gguf_path
from jax_drive.sampling.grammar import (
    Grammar,
    GrammarError,
    action_grammar,
    actor_reply_grammar,
    consensus_grammar,
    openai_response_format,
    request_fields,
    stack_grammars,
    sum_actions_grammar,
    to_gbnf,
    trajectory_grammar,
    vllm_structured_outputs,
)
from jax_drive.sampling.grammar.regex import parse, to_regex

FORMATS = {"trajectory": trajectory_grammar(), "action": action_grammar(tuple(COMMANDS)),
           "actor": actor_reply_grammar(MAX_WORDS), "sum": sum_actions_grammar([201, 202]),
           "consensus": consensus_grammar()}
SCHEMA_REGEXES = [getattr(outlines_schema, n) for n in ("STRING", "NUMBER", "INTEGER", "DATE", "DATE_TIME", "TIME",
                                                         "UUID", "URI", "EMAIL", "BOOLEAN", "NULL")]
EDGE_CASES = [Grammar.choice(["", "a"]), Grammar.regex("x{0}y"), Grammar.regex("é[\\x{1F600}-\\x{1F64F}]\\^-\\]"),
              Grammar.regex('[\\x00"\\\\]'), Grammar.regex("a|\\x00"), Grammar.regex("[^\\n]*\\t\\r")]


@pytest.fixture(scope="module")
def llama_vocab():
    """llama.cpp's view of the SmolLM2 GGUF (vocabulary only, no weights)."""
    llm = llama_cpp.Llama(model_path=str(smollm2_gguf_path()), vocab_only=True, verbose=False)
    return llm, llm._model.vocab


class LlamaGrammar:
    """llama.cpp's grammar sampler over the GGUF vocabulary: token-by-token legality."""

    def __init__(self, vocab, gbnf: str):
        llama_cpp.LlamaGrammar.from_string(gbnf)  # the Python API's entry point (it only stores the text)
        self.sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        self.eos = llama_cpp.llama_vocab_eos(vocab)

    def allows(self, token: int) -> bool:
        data = (llama_cpp.llama_token_data * 1)()
        data[0].id, data[0].logit, data[0].p = token, 0.0, 0.0
        candidates = llama_cpp.llama_token_data_array(data=data, size=1, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self.sampler, ctypes.byref(candidates))
        return data[0].logit != float("-inf")

    def accepts(self, ids) -> bool:
        """Every id allowed in turn and the end (EOS) allowed after them."""
        for token in ids:
            if not self.allows(token):
                return False
            llama_cpp.llama_sampler_accept(self.sampler, token)  # only legal tokens: llama.cpp aborts otherwise
        return self.allows(self.eos)

    def close(self):
        llama_cpp.llama_sampler_free(self.sampler)


@pytest.mark.parametrize("grammar", list(FORMATS.values()) + [Grammar.regex(r) for r in SCHEMA_REGEXES] + EDGE_CASES,
                         ids=lambda g: g.kind + ":" + g.source[:24])
def test_gbnf_parses_in_llama_cpp(llama_vocab, grammar):
    _, vocab = llama_vocab
    gbnf = to_gbnf(grammar.pattern)
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    assert sampler, gbnf
    llama_cpp.llama_sampler_free(sampler)


def test_a_broken_gbnf_is_refused_by_the_check(llama_vocab):
    """The parse check above can fail: llama.cpp returns no sampler for a malformed grammar."""
    _, vocab = llama_vocab
    assert not llama_cpp.llama_sampler_init_grammar(vocab, b'root ::= "ab', b"root")


def test_gbnf_accepts_exactly_what_the_automaton_samples(llama_vocab):
    """Sampled answers of the local automaton (its ids) are legal token by token in llama.cpp's
    GBNF engine and complete there; on one-character changes of them (a control character in
    place of one, the last one dropped or doubled) GBNF and Python's re agree."""
    llm, vocab = llama_vocab
    tokenizer, compiler, by_name = smollm2_formats()
    sample = "Here is {\"a\": 1} — naïve 🚗"
    assert llm.tokenize(sample.encode(), add_bos=False, special=False) == tokenizer.encode(sample)
    names = ["trajectory", "action", "actor", "sum", "consensus"]
    compiled = [by_name[n] for n in names]
    grammars = [c.grammar for c in compiled]
    rows = [g for g in range(len(names)) for _ in range(3)]
    budgets = jnp.asarray([compiled[g].min_tokens + 20 for g in rows], jnp.int32)
    ids, _, _, accepted = random_walks(stack_grammars(compiled), jnp.asarray(rows, jnp.int32), budgets,
                                       jnp.asarray(tokenizer.eos_token_ids, jnp.int32), jax.random.key(3),
                                       steps=int(budgets.max()), by_class=True)
    assert bool(accepted.all())
    rng = np.random.default_rng(0)
    walks = walk_texts(np.asarray(ids), compiler.vocabulary.token_bytes, tokenizer.eos_token_ids)
    for g, (answer, text) in zip(rows, walks):
        gbnf = to_gbnf(grammars[g].pattern)
        grammar = LlamaGrammar(vocab, gbnf)
        assert grammar.accepts(answer), (names[g], text)
        grammar.close()
        pattern = re.compile(to_regex(parse(grammars[g].pattern), python=True))
        at = int(rng.integers(0, len(text)))
        for changed in (text[:at] + "\x07" + text[at + 1:], text[:-1], text + text[-1]):
            grammar = LlamaGrammar(vocab, gbnf)  # the same verdict as Python's re on the same regex
            assert grammar.accepts(tokenizer.encode(changed)) == bool(pattern.fullmatch(changed)), (names[g], changed)
            grammar.close()


def test_request_fields_per_dialect():
    schema = FORMATS["sum"].schema
    choice = Grammar.choice(["yes", "no"])
    assert request_fields(FORMATS["sum"], "vllm") == {"structured_outputs": {"regex": FORMATS["sum"].pattern}}
    assert request_fields(FORMATS["sum"], "vllm", exact=False) == {"structured_outputs": {"json": schema}}
    assert request_fields(choice, "jax-drive", "chat", exact=False) == {"structured_outputs": {"choice": ["yes", "no"]}}
    assert vllm_structured_outputs(Grammar.anything()) == {} and request_fields(Grammar.anything(), "llama.cpp") == {}
    assert request_fields(choice, "llama.cpp") == {"grammar": 'root ::= ("yes" | "no")\n'}
    assert request_fields(FORMATS["sum"], "llama.cpp", "chat", exact=False) == {
        "response_format": {"type": "json_object", "schema": schema}}
    assert request_fields(FORMATS["sum"], "llama.cpp", "chat")["grammar"] == to_gbnf(FORMATS["sum"].pattern)
    assert request_fields(FORMATS["sum"], "openai", "chat", exact=False) == {"response_format": {
        "type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}}
    assert openai_response_format(FORMATS["sum"], "sum")["json_schema"]["name"] == "sum"
    with pytest.raises(GrammarError, match="openai dialect"):
        request_fields(FORMATS["sum"], "openai")
    with pytest.raises(GrammarError, match="openai dialect"):
        request_fields(choice, "openai", exact=False)
    with pytest.raises(GrammarError, match="no grammar dialect"):
        request_fields(choice, "tgi")
    with pytest.raises(GrammarError, match="endpoint"):
        request_fields(choice, "vllm", "embeddings")
    with pytest.raises(GrammarError, match="json_schema grammar"):
        openai_response_format(choice)
    with pytest.raises(GrammarError, match="repetition counts above 2000"):
        to_gbnf("a{2001}")


# ------------------------------------------------------------------ live: llama.cpp's server
def _post(server, path: str, body: dict) -> dict:
    request = urllib.request.Request(server.base_url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def test_live_constrained_completion_matches_the_regex(llama_cpp_server):
    grammar = FORMATS["sum"]
    body = {"model": llama_cpp_server.model, "prompt": "Vehicles 201 and 202 negotiated. Speeds as JSON:",
            "max_tokens": 120, "temperature": 1.0, "seed": 7, **request_fields(grammar, "llama.cpp")}
    text = _post(llama_cpp_server, "/v1/completions", body)["choices"][0]["text"]
    assert re.fullmatch(to_regex(parse(grammar.pattern), python=True), text), text
    assert parse_sum_actions(text, [201, 202]).ok


def test_live_chat_json_object_schema_parses(llama_cpp_server):
    grammar = FORMATS["sum"]
    body = {"model": llama_cpp_server.model, "max_tokens": 120, "temperature": 0.0,
            "messages": [{"role": "user", "content": "Vehicle 201 stops, 202 goes faster. JSON speeds?"}],
            **request_fields(grammar, "llama.cpp", "chat", exact=False)}
    text = _post(llama_cpp_server, "/v1/chat/completions", body)["choices"][0]["message"]["content"]
    value = json.loads(text)
    assert set(value) == {"201", "202"} and parse_sum_actions(text, [201, 202]).ok, text
