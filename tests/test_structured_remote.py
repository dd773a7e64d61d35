"""Grammars on remote servers through ``OpenAIEngine``:

1. each dialect's request carries the grammar in its own form (vLLM / jax-drive serve
   ``structured_outputs``, llama.cpp GBNF on completions and chat, natively JSON schemas as
   ``json`` / ``response_format``), one grammar per prompt; what a dialect cannot express is
   refused before anything is sent;
2. live, against the llama.cpp server the suite starts: every constrained answer (JSON action,
   sum-actions, consensus score; completions with a local template and chat without one)
   parses with the project's parser, and its token ids replay legally under the local
   automaton (the trainer's masked log-probs are recomputed from them).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

from jax_drive.coop.agent import COMMANDS, parse_action
from jax_drive.coop.negotiation.critic import parse_consensus, parse_sum_actions
from jax_drive.models.tokenizer import Tokenizer
from jax_drive.sampling import OpenAIEngine, SamplingParams
from jax_drive.sampling.grammar import (Grammar, action_grammar, consensus_grammar, replay_states,
                                        sum_actions_grammar, to_gbnf, token_allowed)
from jax_drive.sampling.grammar.rows import RowGrammars
from jax_drive.sampling.remote.errors import UnsupportedParameterError

ACTION = action_grammar(tuple(COMMANDS), max_message_chars=40)
SUM = sum_actions_grammar([201, 202])
CONSENSUS = consensus_grammar(range(0, 101, 10), max_analysis_chars=60)  # bounded: servers have no budget mask


class _Recorder:
    """A transport that records each body and answers with one generated token (vLLM layout)."""

    def __init__(self):
        self.bodies = []

    def __call__(self, method, url, body, headers, timeout_s):
        self.bodies.append((url, json.loads(body)))
        text = {"text": "x", "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.5]},
                "finish_reason": "stop", "token_ids": [5], "prompt_token_ids": [1]}
        if url.endswith("chat/completions"):
            text = {"message": {"content": "x"}, "finish_reason": "stop", "token_ids": [5],
                    "logprobs": {"content": [{"token": "token_id:5", "logprob": -0.5}]}}
        return 200, json.dumps({"choices": [{"index": 0, **text}]}).encode()


def _engine(server: str, **kw):
    transport = _Recorder()
    return OpenAIEngine("http://h:1", "m", server=server, transport=transport, check_model=False, **kw), transport


def test_each_dialect_gets_the_grammar_in_its_form():
    params = SamplingParams(max_new_tokens=8, grammar=[ACTION, None])
    engine, sent = _engine("vllm")
    engine.generate([[1, 2], [3]], params, jax.random.key(0))
    assert sent.bodies[0][1]["structured_outputs"] == {"regex": ACTION.pattern}
    assert "structured_outputs" not in sent.bodies[1][1]  # the unconstrained prompt
    engine, sent = _engine("jax-drive")
    engine.generate_chat([[{"role": "user", "content": "go?"}]], params.replace(grammar=SUM), jax.random.key(0))
    assert sent.bodies[0][1]["structured_outputs"] == {"regex": SUM.pattern}
    native, sent = _engine("vllm", grammar_mode="native")
    native.generate([[1]], params.replace(grammar=ACTION), jax.random.key(0))
    native.generate([[1]], params.replace(grammar=Grammar.choice(["a", "b"])), jax.random.key(0))
    assert [b["structured_outputs"] for _, b in sent.bodies] == [{"json": ACTION.schema}, {"choice": ["a", "b"]}]


def test_llama_cpp_gets_gbnf_and_openai_only_native_json_schemas():
    params = SamplingParams(max_new_tokens=8, grammar=CONSENSUS)
    llama, sent = _engine("llama.cpp")
    with pytest.raises(UnsupportedParameterError, match="text prompts only"):  # (no tokenizer) ...
        llama.generate([[1]], params, jax.random.key(0))
    llama.generate_chat([[{"role": "user", "content": "score?"}]], params, jax.random.key(0))
    assert sent.bodies[-1][1]["grammar"] == to_gbnf(CONSENSUS.pattern)
    chat_json, sent = _engine("llama.cpp", grammar_mode="native")
    chat_json.generate_chat([[{"role": "user", "content": "speeds?"}]], params.replace(grammar=SUM),
                            jax.random.key(0))
    assert sent.bodies[-1][1]["response_format"] == {"type": "json_object", "schema": SUM.schema}
    openai, sent = _engine("openai")
    with pytest.raises(UnsupportedParameterError, match="openai server cannot take this json_schema"):
        openai.generate_chat([[{"role": "user", "content": "?"}]], params.replace(grammar=SUM), jax.random.key(0))
    openai, sent = _engine("openai", grammar_mode="native")
    with pytest.raises(UnsupportedParameterError, match="cannot take this regex grammar"):
        openai.generate_chat([[{"role": "user", "content": "?"}]], params, jax.random.key(0))
    assert not sent.bodies  # refused before sending
    openai.generate_chat([[{"role": "user", "content": "?"}]], params.replace(grammar=SUM), jax.random.key(0))
    assert sent.bodies[0][1]["response_format"]["json_schema"]["schema"] == SUM.schema
    with pytest.raises(ValueError, match="grammar_mode"):
        OpenAIEngine("http://h:1", "m", grammar_mode="loose")


# ------------------------------------------------------------ live: llama.cpp's server
@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from jax_drive.models.loading import smollm2_gguf_path

    return Tokenizer.from_gguf(smollm2_gguf_path())


def _replays_legally(tokenizer, grammar, completions, budget: int) -> bool:
    """The completions' ids are legal under the local (exact) automaton, as the trainer replays them."""
    tables, ids, _ = RowGrammars(tokenizer, tokenizer.vocab_size).tables([grammar], tokenizer.eos_token_ids)
    for c in completions:
        tokens = jnp.asarray([list(c.token_ids)], jnp.int32)
        states, remaining = replay_states(tables, ids[:1], tokens, jnp.asarray([budget]))
        if not bool(token_allowed(tables, int(ids[0]), states, remaining, tokens).all()):
            return False
    return True


def test_live_constrained_answers_parse(llama_cpp_server, smollm2_tokenizer):
    engine = OpenAIEngine(llama_cpp_server.base_url, llama_cpp_server.model, tokenizer=smollm2_tokenizer,
                          timeout_s=300, max_concurrency=2)
    prompts = ["You drive vehicle 201. Decide your command as JSON:",
               "Vehicles 201 and 202 negotiated. Their speeds as JSON:",
               "Rate the consensus of the two drivers."]
    params = SamplingParams(max_new_tokens=64, temperature=1.0, grammar=[ACTION, SUM, CONSENSUS])
    out = engine.generate(prompts, params, jax.random.key(3))
    assert all(c.finish_reason == "stop" for c in out), [c.text for c in out]
    action, speeds, consensus = out
    assert not parse_action(action.text).failures, action.text
    parsed = parse_sum_actions(speeds.text, [201, 202])
    assert parsed.source == "json" and not parsed.missing, speeds.text
    assert parse_consensus(consensus.text)[1] is None, consensus.text
    for grammar, completion in zip((ACTION, SUM, CONSENSUS), out):
        assert _replays_legally(smollm2_tokenizer, grammar, [completion], 64)
    chat = OpenAIEngine(llama_cpp_server.base_url, llama_cpp_server.model, timeout_s=300)  # no local template
    answer = chat.generate_chat([[{"role": "user", "content": "Vehicle 201 stops, 202 speeds up. JSON?"}]],
                                SamplingParams(max_new_tokens=48, temperature=0.0, grammar=SUM), jax.random.key(0))
    assert parse_sum_actions(answer[0].text, [201, 202]).source == "json", answer[0].text
