"""Tests of the OpenAI-compatible engine (jax_drive.sampling.openai_engine).

Offline part: the pure request builders / response parsers on answers shaped like the
OpenAI completions API (plus vLLM's extra fields), and the retry / error logic of
``OpenAIEngine.request`` with an injected transport function. None of this claims a server
works.

Live part (marker ``server``): runs only when ``JAX_DRIVE_VLLM_URL`` points at a reachable
vLLM (or other OpenAI-compatible) server; ``JAX_DRIVE_VLLM_MODEL`` picks the model name
(default: the first one the server lists). Skipped with the reason otherwise.
"""

from __future__ import annotations

import copy
import json
import os

import jax
import pytest

from jax_drive.sampling import Completion, Engine, OpenAIEngine, OpenAIEngineError, SamplingParams
from jax_drive.sampling.openai_engine import (
    build_chat_request,
    build_completion_request,
    normalize_base_url,
    parse_chat_response,
    parse_completion_response,
    seed_from_key,
)

# An answer shaped like the OpenAI /v1/completions reference (legacy logprobs object) with
# vLLM's `return_tokens_as_token_ids` token strings: 2 prompts x n=2, choices out of order.
COMPLETIONS_ANSWER = {
    "id": "cmpl-123",
    "object": "text_completion",
    "created": 1700000000,
    "model": "policy-lora",
    "choices": [
        {"index": 1, "text": " Paris", "finish_reason": "length",
         "logprobs": {"tokens": ["token_id:7042", "token_id:2"],
                      "token_logprobs": [-0.25, -1.5],
                      "top_logprobs": [{"token_id:7042": -0.25}, {"token_id:2": -1.5}],
                      "text_offset": [0, 6]}},
        {"index": 0, "text": " Paris.", "finish_reason": "stop",
         "logprobs": {"tokens": ["token_id:7042", "token_id:30", "token_id:2"],
                      "token_logprobs": [-0.1, -0.2, -0.3],
                      "top_logprobs": None, "text_offset": [0, 6, 7]}},
        {"index": 3, "text": "No", "finish_reason": "length",
         "logprobs": {"tokens": ["token_id:1770"], "token_logprobs": [-2.0],
                      "top_logprobs": None, "text_offset": [0]}},
        {"index": 2, "text": "Yes", "finish_reason": "stop",
         "logprobs": {"tokens": ["token_id:9583"], "token_logprobs": [-0.7],
                      "top_logprobs": None, "text_offset": [0]}},
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17},
}

# /v1/chat/completions answer (OpenAI chat logprobs layout) with vLLM's token_ids fields.
CHAT_ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "policy-lora",
    "prompt_token_ids": [1, 4093, 198],
    "choices": [
        {"index": 0, "finish_reason": "stop",
         "message": {"role": "assistant", "content": "Brake."},
         "token_ids": [39, 1256, 2],
         "logprobs": {"content": [{"token": "Br", "logprob": -0.5, "top_logprobs": []},
                                  {"token": "ake.", "logprob": -0.25, "top_logprobs": []},
                                  {"token": "<|im_end|>", "logprob": -0.125, "top_logprobs": []}]}},
    ],
}


# ------------------------------------------------------------------------ pure functions
def test_normalize_base_url():
    assert normalize_base_url("http://h:8000") == "http://h:8000/v1"
    assert normalize_base_url("http://h:8000/") == "http://h:8000/v1"
    assert normalize_base_url("https://h/v1/") == "https://h/v1"
    for bad in ("h:8000", "", "ftp://h"):
        with pytest.raises(ValueError, match="base_url"):
            normalize_base_url(bad)


def test_build_completion_request_fields():
    params = SamplingParams(max_new_tokens=20, temperature=0.7, top_p=0.9, top_k=50, n=4,
                            stop_token_ids=(2,), min_new_tokens=3)
    body = build_completion_request(["a", "b"], params, "policy-lora", seed=11)
    assert body["model"] == "policy-lora" and body["prompt"] == ["a", "b"]
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["n"]) == (20, 0.7, 0.9, 4)
    assert body["logprobs"] == 1 and body["seed"] == 11
    assert body["top_k"] == 50 and body["min_tokens"] == 3
    assert body["stop_token_ids"] == [2] and body["ignore_eos"] is True
    assert body["return_tokens_as_token_ids"] is True and body["return_token_ids"] is True
    json.dumps(body)  # serialisable

    body = build_completion_request([[1, 2], (3,)], SamplingParams(), "m", vllm_extensions=False)
    assert body["prompt"] == [[1, 2], [3]]
    for key in ("top_k", "min_tokens", "stop_token_ids", "ignore_eos", "return_token_ids", "seed"):
        assert key not in body
    body = build_completion_request(["x"], SamplingParams(), "m")
    assert "top_k" not in body and "stop_token_ids" not in body  # server defaults (model EOS)

    with pytest.raises(ValueError):
        build_completion_request([], SamplingParams(), "m")
    with pytest.raises(TypeError):
        build_completion_request("abc", SamplingParams(), "m")


def test_build_chat_request():
    msgs = [{"role": "user", "content": "hi", "extra": 1}]
    body = build_chat_request(msgs, SamplingParams(temperature=0.0, n=2), "m", seed=3)
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["logprobs"] is True and body["n"] == 2 and body["temperature"] == 0.0


def test_parse_completion_response_orders_and_aligns():
    out = parse_completion_response(COMPLETIONS_ANSWER, num_prompts=2, n=2,
                                    prompt_token_ids=[[1, 2, 3], [4, 5]])
    assert [c.text for c in out] == [" Paris.", " Paris", "Yes", "No"]  # by index
    assert out[0] == Completion((1, 2, 3), (7042, 30, 2), " Paris.", (-0.1, -0.2, -0.3), "stop")
    assert out[1].finish_reason == "length" and out[1].token_ids == (7042, 2)
    assert out[2].prompt_token_ids == (4, 5) and out[3].prompt_token_ids == (4, 5)
    assert out[3].logprobs == (-2.0,)


def test_parse_completion_response_vllm_token_ids_field_and_missing_ids():
    answer = copy.deepcopy(COMPLETIONS_ANSWER)
    answer["choices"] = answer["choices"][1:2]
    answer["choices"][0]["token_ids"] = [11, 12, 13]
    answer["choices"][0]["prompt_token_ids"] = [9, 9]
    (c,) = parse_completion_response(answer, 1, 1)
    assert c.token_ids == (11, 12, 13) and c.prompt_token_ids == (9, 9)
    # a plain OpenAI server: token strings are text pieces, no ids -> empty, aligned fields
    answer = copy.deepcopy(COMPLETIONS_ANSWER)
    answer["choices"] = answer["choices"][1:2]
    answer["choices"][0]["logprobs"]["tokens"] = [" Paris", "."]
    answer["choices"][0]["logprobs"]["token_logprobs"] = [-0.1, -0.2]
    (c,) = parse_completion_response(answer, 1, 1)
    assert c.token_ids == () and c.logprobs == () and c.text == " Paris."


@pytest.mark.parametrize("mutate, match", [
    (lambda a: a["choices"].pop(), "expected 4 choices"),
    (lambda a: a.update(choices=None), "expected 4 choices"),
    (lambda a: a["choices"][0].update(finish_reason="abort"), "finish_reason"),
    (lambda a: a["choices"][0]["logprobs"]["token_logprobs"].append(-1.0), "log-probs"),
    (lambda a: a.clear() or a.update(error={"message": "boom"}), "boom"),
])
def test_parse_completion_response_rejects_malformed(mutate, match):
    answer = copy.deepcopy(COMPLETIONS_ANSWER)
    mutate(answer)
    with pytest.raises(OpenAIEngineError, match=match):
        parse_completion_response(answer, 2, 2)


def test_parse_chat_response():
    (c,) = parse_chat_response(CHAT_ANSWER, n=1)
    assert c == Completion((1, 4093, 198), (39, 1256, 2), "Brake.", (-0.5, -0.25, -0.125), "stop")


def test_seed_from_key_is_deterministic_and_key_dependent():
    a = seed_from_key(jax.random.key(0))
    assert a == seed_from_key(jax.random.key(0)) and 0 <= a < 2**31
    assert a != seed_from_key(jax.random.key(1))


# ------------------------------------------------------------- client logic (no server)
class _ScriptedTransport:
    """Returns a scripted sequence of (status, body) answers or raises scripted errors,
    recording every request. Tests our retry / error handling only."""

    def __init__(self, script):
        self.script = list(script)
        self.calls = []

    def __call__(self, method, url, body, headers, timeout_s):
        self.calls.append((method, url, None if body is None else json.loads(body), headers,
                           timeout_s))
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        status, payload = item
        return status, payload if isinstance(payload, bytes) else json.dumps(payload).encode()


def _engine(script, **kw):
    transport = _ScriptedTransport(script)
    kw.setdefault("backoff_s", 0.0)
    return OpenAIEngine("http://server:8000", "policy-lora", api_key="k", transport=transport,
                        **kw), transport


def test_generate_builds_one_request_and_parses():
    engine, transport = _engine([(200, COMPLETIONS_ANSWER)], timeout_s=7.0)
    assert isinstance(engine, Engine)
    params = SamplingParams(max_new_tokens=8, n=2)
    out = engine.generate([[1, 2, 3], [4, 5]], params, jax.random.key(0))
    assert len(out) == 4 and out[0].prompt_token_ids == (1, 2, 3)
    ((method, url, body, headers, timeout),) = transport.calls
    assert (method, url, timeout) == ("POST", "http://server:8000/v1/completions", 7.0)
    assert headers["Authorization"] == "Bearer k"
    assert body["prompt"] == [[1, 2, 3], [4, 5]] and body["model"] == "policy-lora"
    assert body["seed"] == seed_from_key(jax.random.fold_in(jax.random.key(0), 0))


def test_generate_splits_into_requests_in_order():
    one = copy.deepcopy(COMPLETIONS_ANSWER)
    one["choices"] = [dict(one["choices"][1], index=0)]
    two = copy.deepcopy(COMPLETIONS_ANSWER)
    two["choices"] = [dict(two["choices"][2], index=0)]
    engine, transport = _engine([(200, one), (200, two)], max_prompts_per_request=1,
                                max_concurrency=1)
    out = engine.generate(["p0", "p1"], SamplingParams(), jax.random.key(0))
    assert [c.text for c in out] == [" Paris.", "No"]
    assert [c[2]["prompt"] for c in transport.calls] == [["p0"], ["p1"]]
    assert transport.calls[0][2]["seed"] != transport.calls[1][2]["seed"]


def test_retries_transient_failures_then_succeeds():
    engine, transport = _engine([
        ConnectionRefusedError("refused"),
        (503, {"error": {"message": "overloaded"}}),
        (200, {"object": "list", "data": [{"id": "base"}, {"id": "policy-lora"}]}),
    ])
    assert engine.list_models() == ["base", "policy-lora"]
    assert len(transport.calls) == 3 and transport.calls[0][0] == "GET"


def test_non_retryable_status_raises_with_server_message():
    engine, transport = _engine([(400, {"error": {"message": "max_tokens is too large"}})])
    with pytest.raises(OpenAIEngineError, match="max_tokens is too large") as info:
        engine.generate(["p"], SamplingParams(), jax.random.key(0))
    assert info.value.status == 400 and len(transport.calls) == 1


def test_retries_exhausted_raise_clear_error():
    engine, transport = _engine([TimeoutError("timed out")] * 3, max_retries=2)
    with pytest.raises(OpenAIEngineError, match="after 3 attempts.*timed out"):
        engine.generate(["p"], SamplingParams(), jax.random.key(0))
    assert len(transport.calls) == 3


def test_non_json_answer_raises():
    engine, _ = _engine([(200, b"<html>proxy</html>")])
    with pytest.raises(OpenAIEngineError, match="not JSON"):
        engine.generate(["p"], SamplingParams(), jax.random.key(0))


def test_lora_adapter_management_requests():
    engine, transport = _engine([(200, b""), (200, b"")])
    engine.load_lora_adapter("step10", "/ckpt/step10")
    engine.unload_lora_adapter("step10")
    assert [(c[1].rsplit("/", 1)[1], c[2]) for c in transport.calls] == [
        ("load_lora_adapter", {"lora_name": "step10", "lora_path": "/ckpt/step10"}),
        ("unload_lora_adapter", {"lora_name": "step10"}),
    ]
    assert engine.with_model("step10").model == "step10" and engine.model == "policy-lora"


def test_generate_chat_without_tokenizer_uses_chat_endpoint():
    engine, transport = _engine([(200, CHAT_ANSWER)])
    (c,) = engine.generate_chat([[{"role": "user", "content": "Light is red."}]],
                                SamplingParams(temperature=0.0), jax.random.key(0))
    assert c.text == "Brake." and transport.calls[0][1].endswith("/v1/chat/completions")


def test_constructor_validates():
    with pytest.raises(ValueError, match="model"):
        OpenAIEngine("http://h:1", "")
    with pytest.raises(ValueError, match="base_url"):
        OpenAIEngine("h:1", "m")
    with pytest.raises(ValueError):
        OpenAIEngine("http://h:1", "m", timeout_s=0)


# ----------------------------------------------------------------- live server (vLLM)
def _live_engine() -> OpenAIEngine:
    url = os.environ.get("JAX_DRIVE_VLLM_URL")
    if not url:
        pytest.skip("set JAX_DRIVE_VLLM_URL=http://host:port of a vLLM / OpenAI-compatible server")
    probe = OpenAIEngine(url, "probe", os.environ.get("JAX_DRIVE_VLLM_API_KEY"), timeout_s=5.0,
                         max_retries=0)
    try:
        models = probe.list_models()
    except (OpenAIEngineError, ValueError) as error:
        pytest.skip(f"server at JAX_DRIVE_VLLM_URL={url} is not reachable: {error}")
    model = os.environ.get("JAX_DRIVE_VLLM_MODEL") or (models[0] if models else None)
    if model is None:
        pytest.skip(f"server at {url} lists no models")
    return OpenAIEngine(url, model, os.environ.get("JAX_DRIVE_VLLM_API_KEY"))


@pytest.mark.server
def test_live_generate_text_prompts():
    engine = _live_engine()
    params = SamplingParams(max_new_tokens=16, temperature=1.0, n=2)
    out = engine.generate(["The capital of France is", "1, 2, 3,"], params, jax.random.key(0))
    assert len(out) == 4
    for c in out:
        assert c.finish_reason in ("stop", "length") and 0 < len(c.token_ids) <= 16
        assert len(c.logprobs) == len(c.token_ids) and all(lp <= 0.0 for lp in c.logprobs)
        assert c.text


@pytest.mark.server
def test_live_greedy_token_prompts_and_stop_ids():
    engine = _live_engine()
    first = engine.generate(["The capital of France is"], SamplingParams(
        max_new_tokens=8, temperature=0.0, stop_token_ids=()), jax.random.key(0))[0]
    assert first.finish_reason == "length" and len(first.token_ids) == 8
    if first.prompt_token_ids:  # vLLM >= 0.10.2 returns them
        again = engine.generate([list(first.prompt_token_ids)], SamplingParams(
            max_new_tokens=8, temperature=0.0, stop_token_ids=()), jax.random.key(1))[0]
        assert again.token_ids == first.token_ids
    stop = first.token_ids[2]
    cut = engine.generate(["The capital of France is"], SamplingParams(
        max_new_tokens=8, temperature=0.0, stop_token_ids=(stop,)), jax.random.key(0))[0]
    assert cut.finish_reason == "stop"
    assert cut.token_ids == first.token_ids[: first.token_ids.index(stop) + 1]


@pytest.mark.server
def test_live_seed_determinism():
    engine = _live_engine()
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    a = engine.generate(["Once upon a time"], params, jax.random.key(5))
    b = engine.generate(["Once upon a time"], params, jax.random.key(5))
    assert a[0].token_ids == b[0].token_ids
