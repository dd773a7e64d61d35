"""Structured answers from ``jax-drive serve`` with the official ``openai`` client (a tiny random
Llama over the byte tokenizer, served in-process): OpenAI's ``response_format`` json_schema on
chat, vLLM's ``structured_outputs`` (regex, json, choice) on completions and chat, the masked
log-probs (forced tokens 0), and a 400 naming the problem for every kind of bad grammar input
(invalid regex / schema, unsupported features, an unbounded JSON value, both fields, no way to
finish within max_tokens, too large, compile time over the limit); structured answers stream too."""

from __future__ import annotations

import json
import re
import time

import jax
import openai
import pytest
from flax import nnx

from jax_drive.models import CausalLM, ModelConfig
from jax_drive.models.tiny import byte_tokenizer
from jax_drive.serve import PolicyRegistry, PolicyServer, ServeConfig
from jax_drive.serve.protocol import InvalidRequest
from servers import inprocess_server

MODEL = "tiny-structured"
SCHEMA = {"type": "object", "properties": {"command": {"type": "string", "enum": ["go", "stop"]},
                                           "speed": {"type": "integer", "maxDigits": 2}},
          "required": ["command", "speed"], "additionalProperties": False}


def _registry() -> PolicyRegistry:
    model = CausalLM(ModelConfig.tiny("llama", vocab_size=259, tie_embeddings=False), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    model = nnx.merge(graphdef, jax.tree.map(lambda x: x * 3.0 if x.ndim >= 2 else x, state))
    return PolicyRegistry(model, byte_tokenizer(), MODEL)


@pytest.fixture(scope="module")
def client():
    server = PolicyServer(_registry(), ServeConfig(api_key="k"))
    with inprocess_server(server) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=120)


def test_chat_response_format_json_schema(client):
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Command?"}], max_tokens=48, n=4, seed=1,
        logprobs=True, response_format={"type": "json_schema", "json_schema": {"name": "action", "schema": SCHEMA}})
    for choice in answer.choices:
        value = json.loads(choice.message.content)
        assert value["command"] in ("go", "stop") and -99 <= value["speed"] <= 99
        assert choice.message.content.startswith('{"command": "')  # json.dumps' separators
        logprobs = [t.logprob for t in choice.logprobs.content]
        assert logprobs[:3] == [0.0, 0.0, 0.0]  # forced: the masked policy's log-probs
        assert min(logprobs) < 0.0


def test_structured_outputs_on_completions_and_chat(client):
    regex = r"(left|right) in [1-9]\d? m"
    texts = [c.text for c in client.completions.create(
        model=MODEL, prompt="Turn where?", max_tokens=48, n=4, seed=2,
        extra_body={"structured_outputs": {"regex": regex}}).choices]
    assert all(re.fullmatch(regex, t) for t in texts), texts
    choice = client.completions.create(model=MODEL, prompt="Yes or no?", max_tokens=48, n=4, seed=3,
                                       extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert {c.text for c in choice.choices} <= {"yes", "no"}
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Command?"}],
                                          max_tokens=48, n=4, extra_body={"structured_outputs": {"json": SCHEMA}})
    assert set(json.loads(chat.choices[0].message.content)) == {"command", "speed"}


def _streamed(stream, field: str) -> dict[int, str]:
    texts: dict[int, str] = {}
    for chunk in stream:
        for choice in chunk.choices:
            piece = choice.text if field == "text" else choice.delta.content
            texts[choice.index] = texts.get(choice.index, "") + (piece or "")
    return texts


def test_structured_answers_stream_and_add_up_to_the_whole_answer(client):
    """stream=true with a grammar: the chunks of each choice add up to the same seeded
    request's whole answer, which the grammar accepts."""
    chat = dict(model=MODEL, messages=[{"role": "user", "content": "Command?"}], max_tokens=48, n=2, seed=5,
                response_format={"type": "json_schema", "json_schema": {"name": "action", "schema": SCHEMA}})
    whole = [c.message.content for c in client.chat.completions.create(**chat).choices]
    streamed = _streamed(client.chat.completions.create(**chat, stream=True), "delta")
    assert [streamed[i] for i in range(2)] == whole
    assert all(json.loads(text)["command"] in ("go", "stop") for text in whole)
    regex = r"(left|right) in [1-9]\d? m"
    plain = dict(model=MODEL, prompt="Turn where?", max_tokens=48, n=2, seed=6,
                 extra_body={"structured_outputs": {"regex": regex}})
    whole = [c.text for c in client.completions.create(**plain).choices]
    streamed = _streamed(client.completions.create(**plain, stream=True), "text")
    assert [streamed[i] for i in range(2)] == whole and all(re.fullmatch(regex, t) for t in whole), whole


@pytest.mark.parametrize("extra, message", [
    ({"structured_outputs": {"regex": "a(?=b)"}}, "look-around"),
    ({"structured_outputs": {"json": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}},
     "structured_outputs"),
    ({"structured_outputs": {"grammar": "root ::= \"a\""}}, "not supported"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"v": {"type": "integer", "maximum": 3}}}}}}, "'maximum' at $.properties.v"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "exactly one"),
    ({"structured_outputs": {"json_object": True}}, "unbounded"),
    ({"response_format": {"type": "json_object"}}, "unbounded"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
      "structured_outputs": {"regex": "a"}}, "not both"),
    ({"structured_outputs": {"regex": "[a-z]{30}"}}, "needs at least 30 tokens"),
    ({"structured_outputs": {"regex": "([a-z]{100}){300}"}}, "too large"),
])
def test_bad_grammar_input_is_a_400_naming_the_problem(client, extra, message):
    with pytest.raises(openai.BadRequestError, match=re.escape(message)):
        client.completions.create(model=MODEL, prompt="x", max_tokens=16, extra_body=extra)


def test_compile_time_over_the_limit_is_a_400(monkeypatch):
    # A compile that sleeps (releasing the GIL) outlasts the limit for certain; a real compile on
    # the byte tokenizer can finish inside one GIL switch interval and beat any small limit.
    registry = _registry()
    grammars = registry.engine(MODEL).grammars
    real_compile = grammars.compile

    def slow_compile(*args, **kwargs):
        time.sleep(1.0)
        return real_compile(*args, **kwargs)

    monkeypatch.setattr(grammars, "compile", slow_compile)
    server = PolicyServer(registry, ServeConfig(grammar_compile_s=0.05))
    server.start()
    try:
        body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 64,
                           "structured_outputs": {"regex": r"[a-z]{1,40}( [a-z]{1,9}){0,5}"}}).encode()
        with pytest.raises(InvalidRequest, match="longer than this server's limit") as error:
            server.prepare_completion(body)
        assert error.value.status == 400 and error.value.code == "grammar_timeout"
    finally:
        server.stop()
