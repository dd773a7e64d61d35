"""Tests of the OpenAI-compatible engine (jax_drive.sampling.openai_engine and sampling/remote).

Offline part: request builders and answer parsers per server dialect, and the retry /
error policy of ``OpenAIEngine.request`` with an injected transport function.

Live part: a real llama.cpp server (llama-cpp-python, fixture ``llama_cpp_server`` in
servers.py) serving the embedded SmolLM2 GGUF on 127.0.0.1, one test per fault of issue 19
(token-id prompts, ids from token texts, n, distinct seeds per row, neutral sampling
values, processed log-probs, validation errors not retried, unknown model names), and the
multi-turn rollout loop running unchanged on the engine.

vLLM part: runs only when ``JAX_DRIVE_VLLM_URL`` points at a vLLM server
(``JAX_DRIVE_VLLM_MODEL`` picks the model, default the first one listed); skipped with the
reason otherwise.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import urllib.error

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jax_drive.models import Tokenizer
from jax_drive.sampling import Completion, Engine, OpenAIEngine, OpenAIEngineError, SamplingParams

from jax_drive.models.tiny import byte_tokenizer
from jax_drive.sampling.remote.dialects import DIALECTS, check_sampling_params, dialect_from_models
from jax_drive.sampling.remote.errors import UnsupportedParameterError
from jax_drive.sampling.remote.requests import (
    build_chat_request,
    build_completion_request,
    normalize_base_url,
    row_seeds,
    seed_from_key,
)
from jax_drive.sampling.remote.responses import (
    ParseFailure,
    RemoteMetadata,
    TokenPieces,
    parse_completion_choice,
    parse_prompt_logprobs,
    read_completion,
    read_prompt_logprobs,
)
from jax_drive.sampling.remote.transport import urllib_transport

VLLM, LLAMA, JAXD, OPENAI = (DIALECTS[k] for k in ("vllm", "llama.cpp", "jax-drive", "openai"))
# llama.cpp's Q4_1 matmuls quantise activations to 8 bits (and keep an f16 KV cache); our
# model dequantises the same weights to float32. Sampled-token log-probs of 6 chat answers
# x 32 tokens differed by 0.060 on average, 0.30 at most (p99 0.26). A wrong id differs by
# nats (checked below with the ids shifted by one).
LLAMA_CPP_LOGPROB_MEAN_ATOL = 0.15
LLAMA_CPP_LOGPROB_MAX_ATOL = 0.6


# An answer of vLLM's /v1/completions (return_tokens_as_token_ids) for one row.
VLLM_ANSWER = {
    "id": "cmpl-1", "object": "text_completion", "model": "policy",
    "choices": [{"index": 0, "text": " Paris.", "finish_reason": "stop",
                 "logprobs": {"tokens": ["token_id:7042", "token_id:30", "token_id:2"],
                              "token_logprobs": [-0.1, -0.2, -0.3],
                              "top_logprobs": None, "text_offset": [0, 6, 7]}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
}


def llama_answer(tokens, logprobs, text=None, finish="length", prompt_tokens=3):
    """An answer shaped like llama-cpp-python's: tokens are text pieces, no ids."""
    return {
        "id": "cmpl-2", "object": "text_completion", "model": "smollm2",
        "choices": [{"index": 0, "text": "".join(tokens) if text is None else text,
                     "finish_reason": finish,
                     "logprobs": {"tokens": tokens, "token_logprobs": logprobs,
                                  "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs)],
                                  "text_offset": list(range(len(tokens)))}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(tokens),
                  "total_tokens": prompt_tokens + len(tokens)},
    }


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


# ------------------------------------------------------------------------ pure functions
def test_normalize_base_url():
    assert normalize_base_url("http://h:8000") == "http://h:8000/v1"
    assert normalize_base_url("http://h:8000/") == "http://h:8000/v1"
    assert normalize_base_url("https://h/v1/") == "https://h/v1"
    for bad in ("h:8000", "", "ftp://h"):
        with pytest.raises(ValueError, match="base_url"):
            normalize_base_url(bad)


def test_row_seeds_are_distinct_deterministic_and_key_dependent():
    seeds = row_seeds(jax.random.key(0), 512)
    assert len(set(seeds)) == 512 and all(0 <= s < 2**31 for s in seeds)
    assert seeds == row_seeds(jax.random.key(0), 512)
    assert seeds[0] == seed_from_key(jax.random.key(0))
    assert set(seeds).isdisjoint(row_seeds(jax.random.key(1), 4)) or seeds[:4] != row_seeds(
        jax.random.key(1), 4)


def test_dialect_from_models_owned_by():
    def models(owner):
        return {"object": "list", "data": [{"id": "m", "owned_by": owner}]}

    assert dialect_from_models(models("vllm")) is VLLM
    assert dialect_from_models(models("me")) is LLAMA
    assert dialect_from_models(models("jax-drive")) is JAXD
    assert dialect_from_models(models("openai")) is OPENAI and dialect_from_models({}) is OPENAI


def test_requests_always_carry_neutral_sampling_values():
    """Server defaults (llama.cpp: top_k 40, min_p 0.05, repeat penalty 1.1; vLLM:
    generation_config.json) must never filter or penalise the distribution."""
    params = SamplingParams(max_new_tokens=20, temperature=0.7, top_p=0.9)
    body = build_completion_request("a", params, "m", 11, LLAMA)
    assert {k: body[k] for k in ("top_k", "min_p", "repeat_penalty", "presence_penalty",
                                 "frequency_penalty", "mirostat_mode")} == {
        "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
        "frequency_penalty": 0.0, "mirostat_mode": 0}
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["n"], body["seed"]) == (
        20, 0.7, 0.9, 1, 11)
    assert body["logprobs"] == 1 and body["prompt"] == "a" and "stop_token_ids" not in body
    body = build_completion_request([1, 2], params.replace(top_k=5, min_new_tokens=2,
                                                           stop_token_ids=(2,)), "m", 3, VLLM)
    assert body["prompt"] == [1, 2] and body["top_k"] == 5 and body["min_tokens"] == 2
    assert body["min_p"] == 0.0 and body["repetition_penalty"] == 1.0
    assert body["stop_token_ids"] == [2] and body["ignore_eos"] is True
    assert body["return_tokens_as_token_ids"] is True and body["return_token_ids"] is True
    body = build_completion_request([1], params.replace(logprobs_mode="processed"), "m", 3, JAXD)
    assert body["logprobs_mode"] == "processed" and body["repetition_penalty"] == 1.0
    body = build_completion_request("a", params, "m", 3, OPENAI)
    assert "top_k" not in body and body["presence_penalty"] == 0.0
    json.dumps(body)
    with pytest.raises(UnsupportedParameterError, match="text prompts"):
        build_completion_request([1, 2], params, "m", 3, LLAMA)
    chat = build_chat_request([{"role": "user", "content": "hi", "x": 1}], params, "m", 3, LLAMA)
    assert chat["messages"] == [{"role": "user", "content": "hi"}] and chat["logprobs"] is True
    assert chat["top_k"] == 0 and chat["repeat_penalty"] == 1.0


def test_check_sampling_params_refuses_what_the_server_cannot_honour():
    ok = SamplingParams()
    check_sampling_params(ok, LLAMA, "raw", (2,))
    with pytest.raises(UnsupportedParameterError, match="top_k"):
        check_sampling_params(ok.replace(top_k=5), OPENAI, "raw", None)
    with pytest.raises(UnsupportedParameterError, match="min_tokens"):
        check_sampling_params(ok.replace(min_new_tokens=1), OPENAI, "raw", None)
    with pytest.raises(UnsupportedParameterError, match="stop on token ids"):
        check_sampling_params(ok.replace(stop_token_ids=(5,)), LLAMA, "raw", (2,))
    with pytest.raises(UnsupportedParameterError, match="stop on token ids"):
        check_sampling_params(ok.replace(stop_token_ids=()), LLAMA, "raw", (2,))
    check_sampling_params(ok.replace(stop_token_ids=(2,)), LLAMA, "raw", (2,))  # = EOS
    check_sampling_params(ok.replace(stop_token_ids=(5,)), VLLM, "raw", None)
    # processed log-probs: refused on a raw server unless the two coincide
    processed = ok.replace(logprobs_mode="processed", temperature=0.7)
    with pytest.raises(UnsupportedParameterError, match="processed"):
        check_sampling_params(processed, LLAMA, "raw", None)
    with pytest.raises(UnsupportedParameterError, match="processed"):
        check_sampling_params(processed, VLLM, "raw", None)
    check_sampling_params(processed, VLLM, "processed", None)  # --logprobs-mode processed
    check_sampling_params(processed, JAXD, "raw", None)  # per request
    check_sampling_params(processed.replace(temperature=1.0), LLAMA, "raw", None)
    with pytest.raises(UnsupportedParameterError, match="raw"):
        check_sampling_params(ok, VLLM, "processed", None)


def test_parse_vllm_answer_ids_from_token_id_strings_and_field():
    c = parse_completion_choice(VLLM_ANSWER, chat=False, dialect=VLLM, logprobs_mode="raw",
                                prompt_ids=[1, 2, 3], sent_token_ids=True, seed=9)
    assert type(c) is Completion and isinstance(c.metadata, RemoteMetadata)
    assert (c.prompt_token_ids, c.token_ids, c.text, c.logprobs, c.finish_reason) == (
        (1, 2, 3), (7042, 30, 2), " Paris.", (-0.1, -0.2, -0.3), "stop")
    m = c.metadata
    assert (m.token_ids_source, m.logprobs_source, m.stop_token_included, m.seed) == (
        "server", "server", True, 9) and m.exact
    answer = copy.deepcopy(VLLM_ANSWER)
    answer["choices"][0]["token_ids"] = [11, 12, 13]
    answer["choices"][0]["prompt_token_ids"] = [9, 9]
    c = parse_completion_choice(answer, chat=False, dialect=VLLM, logprobs_mode="raw",
                                prompt_ids=None, sent_token_ids=False)
    assert c.token_ids == (11, 12, 13) and c.prompt_token_ids == (9, 9)


def test_parse_llama_cpp_answer_maps_token_texts_to_ids(tok):
    pieces = TokenPieces(tok)
    ids = tok.encode("go left")
    texts = [tok.decode([i]) for i in ids]
    answer = llama_answer(texts, [-0.5] * len(ids), prompt_tokens=4)
    c = parse_completion_choice(answer, chat=False, dialect=LLAMA, logprobs_mode="raw",
                                prompt_ids=[1, 2, 3, 4], sent_token_ids=False, tokenizer=tok,
                                pieces=pieces)
    assert c.token_ids == tuple(ids) and c.logprobs == (-0.5,) * len(ids)
    assert c.metadata.token_ids_source == "pieces" and c.metadata.exact
    assert c.metadata.prompt_tokens_match is True and not c.metadata.stop_token_included
    # the server tokenized the prompt into another number of tokens: not exact
    c = parse_completion_choice(answer, chat=False, dialect=LLAMA, logprobs_mode="raw",
                                prompt_ids=[1, 2], sent_token_ids=False, tokenizer=tok, pieces=pieces)
    assert c.metadata.prompt_tokens_match is False and not c.metadata.exact


def test_parse_llama_cpp_ambiguous_pieces_fall_back_to_retokenizing(tok):
    """'é' is two byte tokens; each prints as '' (invalid UTF-8 dropped), so the pieces
    cannot name the ids: they are re-tokenized from the text and flagged inexact."""
    pieces = TokenPieces(tok)
    assert pieces.id_for("a") == tok.encode("a")[0] and pieces.id_for("") is None
    assert pieces.ids_for_pieces(["a", "b"], "ab") == tok.encode("ab")
    assert pieces.ids_for_pieces(["a", ""], "aé") is None
    answer = llama_answer(["", ""], [-1.0, -2.0], text="é")
    c = parse_completion_choice(answer, chat=False, dialect=LLAMA, logprobs_mode="raw",
                                prompt_ids=None, sent_token_ids=False, tokenizer=tok, pieces=pieces)
    assert c.token_ids == tuple(tok.encode("é")) and all(math.isnan(x) for x in c.logprobs)
    assert c.metadata.token_ids_source == "retokenized" and c.metadata.logprobs_source == "none"
    assert not c.metadata.exact
    # a plain server without logprobs and no tokenizer: nothing to align
    bare = {"choices": [{"index": 0, "text": "hi", "finish_reason": "stop", "logprobs": None}]}
    c = parse_completion_choice(bare, chat=False, dialect=OPENAI, logprobs_mode="raw",
                                prompt_ids=None, sent_token_ids=False)
    assert c.token_ids == () and c.metadata.token_ids_source == "none"


@pytest.mark.parametrize("mutate, match", [
    (lambda a: a["choices"].append(dict(a["choices"][0])), "expected 1 choice"),
    (lambda a: a.update(choices=None), "expected 1 choice"),
    (lambda a: a["choices"][0].update(finish_reason="abort"), "finish_reason"),
    (lambda a: a["choices"][0]["logprobs"]["token_logprobs"].append(-1.0), "log-probs"),
    (lambda a: a["choices"][0]["logprobs"]["token_logprobs"].__setitem__(0, "x"), "not a number"),
    (lambda a: a.clear() or a.update(error={"message": "boom"}), "boom"),
])
def test_parse_rejects_malformed_answers(mutate, match):
    answer = copy.deepcopy(VLLM_ANSWER)
    mutate(answer)
    with pytest.raises(OpenAIEngineError, match=match):
        parse_completion_choice(answer, chat=False, dialect=VLLM, logprobs_mode="raw",
                                prompt_ids=None, sent_token_ids=False)
    # the reader below the engine's boundary returns the same problem as a value
    failure = read_completion(answer, chat=False, dialect=VLLM, logprobs_mode="raw", prompt_ids=None,
                              sent_token_ids=False)
    assert isinstance(failure, ParseFailure) and failure.where == "completions"
    assert re.search(match, str(failure))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
_PATHS = [("choices",), ("choices", 0), ("choices", 0, "text"), ("choices", 0, "finish_reason"),
          ("choices", 0, "logprobs"), ("choices", 0, "logprobs", "tokens"),
          ("choices", 0, "logprobs", "tokens", 0), ("choices", 0, "logprobs", "token_logprobs"),
          ("choices", 0, "logprobs", "token_logprobs", 1), ("choices", 0, "token_ids"),
          ("choices", 0, "prompt_token_ids"), ("choices", 0, "message"), ("choices", 0, "prompt_logprobs"),
          ("usage",), ("usage", "completion_tokens"), ("usage", "prompt_tokens"), ("error",)]


def _set_path(answer, path, value):
    for part in path[:-1]:
        answer = answer[part]
    answer[path[-1]] = value


@settings(max_examples=300)
@given(value=_JSON, path=st.sampled_from(_PATHS), whole=st.booleans(), chat=st.booleans(),
       dialect=st.sampled_from(sorted(DIALECTS)), prompt_ids=st.sampled_from([None, (1, 2, 3)]))
def test_readers_never_raise_on_any_server_output(tok, value, path, whole, chat, dialect, prompt_ids):
    """Any JSON value as the whole answer, or in place of one field of a valid answer: the
    readers return a Completion (or prompt log-probs) or a ParseFailure, never raise."""
    answer = copy.deepcopy(VLLM_ANSWER)
    if whole:
        answer = value
    else:
        _set_path(answer, path, value)
    result = read_completion(answer, chat=chat, dialect=DIALECTS[dialect], logprobs_mode="raw",
                             prompt_ids=prompt_ids, sent_token_ids=False, tokenizer=tok, pieces=None)
    assert isinstance(result, (Completion, ParseFailure))
    scores = read_prompt_logprobs(answer, [1, 5, 9])
    assert isinstance(scores, ParseFailure) or (isinstance(scores, list) and len(scores) == 2)
    assert dialect_from_models(answer) in DIALECTS.values()


def test_parse_chat_answer():
    answer = {"prompt_token_ids": [1, 4093, 198], "choices": [{
        "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Brake."},
        "token_ids": [39, 1256, 2],
        "logprobs": {"content": [{"token": "Br", "logprob": -0.5}, {"token": "ake.", "logprob": -0.25},
                                 {"token": "<|im_end|>", "logprob": -0.125}]}}]}
    c = parse_completion_choice(answer, chat=True, dialect=VLLM, logprobs_mode="raw",
                                prompt_ids=None, sent_token_ids=False)
    assert (c.prompt_token_ids, c.token_ids, c.text, c.logprobs) == (
        (1, 4093, 198), (39, 1256, 2), "Brake.", (-0.5, -0.25, -0.125))


def test_parse_prompt_logprobs():
    answer = {"choices": [{"index": 0, "text": "x", "finish_reason": "length",
                           "prompt_logprobs": [None, {"5": {"logprob": -1.5, "rank": 2}},
                                               {"9": {"logprob": -0.5, "rank": 1},
                                                "7": {"logprob": -2.0, "rank": 2}}]}]}
    assert parse_prompt_logprobs(answer, [1, 5, 9]) == [-1.5, -0.5]
    with pytest.raises(OpenAIEngineError, match="no prompt log-prob"):
        parse_prompt_logprobs(answer, [1, 5, 8])
    with pytest.raises(OpenAIEngineError, match="wrong length"):
        parse_prompt_logprobs(answer, [1, 5])


# ------------------------------------------------------------- client logic (no server)
class _ScriptedTransport:
    """Returns scripted (status, body) answers or raises scripted errors, recording every
    request. Tests our retry / error handling only."""

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


def _engine(script, server="vllm", **kw):
    transport = _ScriptedTransport(script)
    kw.setdefault("backoff_s", 0.0)
    kw.setdefault("check_model", False)
    return OpenAIEngine("http://server:8000", "policy", api_key="k", transport=transport,
                        server=server, **kw), transport


def _vllm_row(token_id: int) -> dict:
    answer = copy.deepcopy(VLLM_ANSWER)
    answer["choices"][0]["logprobs"]["tokens"] = [f"token_id:{token_id}"]
    answer["choices"][0]["logprobs"]["token_logprobs"] = [-1.0]
    answer["choices"][0]["text"] = str(token_id)
    return answer


def test_generate_sends_one_request_per_row_with_distinct_seeds():
    """vLLM seeds every prompt of a request alike: the G rows of a group must go out as
    separate requests with their own seeds, or they sample identical completions."""
    engine, transport = _engine([(200, _vllm_row(i)) for i in range(6)], max_concurrency=1,
                                timeout_s=7.0)
    assert isinstance(engine, Engine)
    out = engine.generate([[1, 2, 3]] * 3, SamplingParams(max_new_tokens=4, n=2), jax.random.key(0))
    assert len(out) == 6 and len(transport.calls) == 6
    bodies = [call[2] for call in transport.calls]
    assert all(b["n"] == 1 and b["prompt"] == [1, 2, 3] for b in bodies)
    assert [b["seed"] for b in bodies] == row_seeds(jax.random.key(0), 6)
    assert len({b["seed"] for b in bodies}) == 6
    assert [c.metadata.seed for c in out] == [b["seed"] for b in bodies]
    assert [c.token_ids for c in out] == [(i,) for i in range(6)]  # prompt-major order
    method, url, _, headers, timeout = transport.calls[0]
    assert (method, url, timeout) == ("POST", "http://server:8000/v1/completions", 7.0)
    assert headers["Authorization"] == "Bearer k"


def test_generate_keeps_row_order_under_concurrency():
    class Echo:
        calls = 0

        def __call__(self, method, url, body, headers, timeout_s):
            seed = json.loads(body)["seed"]
            return 200, json.dumps(_vllm_row(seed % 1000)).encode()

    engine = OpenAIEngine("http://s:1", "policy", server="vllm", check_model=False,
                          transport=Echo(), max_concurrency=4)
    out = engine.generate([[1], [2], [3]], SamplingParams(n=3), jax.random.key(2))
    assert [c.token_ids[0] for c in out] == [s % 1000 for s in row_seeds(jax.random.key(2), 9)]


def test_retries_only_connection_errors_and_429_502_503_504():
    models = {"object": "list", "data": [{"id": "policy", "owned_by": "vllm"}]}
    engine, transport = _engine([
        urllib.error.URLError(ConnectionRefusedError("refused")),
        ConnectionResetError("reset"),
        (429, {"error": {"message": "slow down"}}),
        (502, b"bad gateway"), (503, {"error": {"message": "overloaded"}}), (504, b""),
        (200, models),
    ], max_retries=6)
    assert engine.list_models() == ["policy"]
    assert len(transport.calls) == 7 and transport.calls[0][0] == "GET"


@pytest.mark.parametrize("answer, match", [
    ((400, {"error": {"message": "max_tokens is too large"}}), "rejected the request as invalid.*max_tokens"),
    ((422, {"detail": [{"msg": "field required"}]}), "rejected the request as invalid"),
    # llama-cpp-python answers pydantic validation errors with HTTP 500
    ((500, {"error": {"message": "1 validation error for CreateCompletionRequest\nprompt"}}),
     "rejected the request as invalid"),
    ((500, {"error": {"message": "CUDA out of memory"}}), "failed: HTTP 500"),
    ((404, {"error": {"message": "not found"}}), "HTTP 404"),
])
def test_other_failures_raise_at_once_with_the_server_message(answer, match):
    engine, transport = _engine([answer, answer])
    with pytest.raises(OpenAIEngineError, match=match) as info:
        engine.generate(["p"], SamplingParams(), jax.random.key(0))
    assert info.value.status == answer[0] and len(transport.calls) == 1


def test_read_timeouts_are_not_retried_connection_failures_exhaust_retries():
    engine, transport = _engine([TimeoutError("timed out")] * 3, max_retries=2)
    with pytest.raises(OpenAIEngineError, match="no answer within"):
        engine.generate(["p"], SamplingParams(), jax.random.key(0))
    assert len(transport.calls) == 1
    engine, transport = _engine([urllib.error.URLError("refused")] * 3, max_retries=2)
    with pytest.raises(OpenAIEngineError, match="after 3 attempts.*refused"):
        engine.generate(["p"], SamplingParams(), jax.random.key(0))
    assert len(transport.calls) == 3


def test_non_json_answer_raises():
    engine, _ = _engine([(200, b"<html>proxy</html>")])
    with pytest.raises(OpenAIEngineError, match="not JSON"):
        engine.generate(["p"], SamplingParams(), jax.random.key(0))


def test_unknown_model_name_is_an_error():
    models = {"object": "list", "data": [{"id": "base", "owned_by": "me"}]}
    engine, transport = _engine([(200, models), (200, models)], server="auto", check_model=True)
    with pytest.raises(OpenAIEngineError, match="'policy' is not served.*base"):
        engine.generate(["p"], SamplingParams(), jax.random.key(0))
    assert engine.dialect is LLAMA and len(transport.calls) == 2  # listed, refreshed once


def test_require_token_logprobs_refuses_inexact_completions(tok):
    answer = llama_answer(["", ""], [-1.0, -2.0], text="é")
    engine, _ = _engine([(200, answer)], server="llama.cpp", tokenizer=tok,
                        require_token_logprobs=True)
    with pytest.raises(OpenAIEngineError, match="lack exact token ids"):
        engine.generate(["p"], SamplingParams(), jax.random.key(0))
    with pytest.raises(UnsupportedParameterError, match="needs the local tokenizer"):
        _engine([], server="llama.cpp", require_token_logprobs=True)[0].generate(
            ["p"], SamplingParams(), jax.random.key(0))
    with pytest.raises(UnsupportedParameterError, match="pass a tokenizer"):
        _engine([], server="llama.cpp")[0].generate([[1, 2]], SamplingParams(), jax.random.key(0))


def test_lora_management_and_feature_detection():
    engine, transport = _engine([(200, b"Success: loaded"), (200, b""),
                                 (400, {"error": {"message": "The lora adapter 'a' has already been loaded"}}),
                                 (200, b""), (200, b"ok"), (404, {"detail": "Not Found"})])
    engine.load_lora_adapter("a", "/ckpt/a")  # vLLM answers plain text
    engine.unload_lora_adapter("a")
    engine.load_lora_adapter("a", "/ckpt/b", replace=True)  # old vLLM: no load_inplace
    bodies = [(c[1].rsplit("/", 1)[1], c[2]) for c in transport.calls]
    assert bodies[0] == ("load_lora_adapter", {"lora_name": "a", "lora_path": "/ckpt/a"})
    assert bodies[2] == ("load_lora_adapter", {"lora_name": "a", "lora_path": "/ckpt/b",
                                               "load_inplace": True})
    assert bodies[3:5] == [("unload_lora_adapter", {"lora_name": "a"}),
                           ("load_lora_adapter", {"lora_name": "a", "lora_path": "/ckpt/b"})]
    with pytest.raises(UnsupportedParameterError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING"):
        engine.load_lora_adapter("a", "/x")
    assert engine.with_model("a").model == "a" and engine.model == "policy"
    llama, _ = _engine([], server="llama.cpp")
    for call in (lambda: llama.load_lora_adapter("a", "/x"), lambda: llama.prompt_logprobs([[1, 2]])):
        with pytest.raises(UnsupportedParameterError, match="vLLM"):
            call()


def test_generate_chat_without_tokenizer_uses_chat_endpoint():
    answer = {"choices": [{"index": 0, "finish_reason": "stop", "token_ids": [5, 2],
                           "message": {"role": "assistant", "content": "Brake."},
                           "logprobs": {"content": [{"token": "token_id:5", "logprob": -0.5},
                                                    {"token": "token_id:2", "logprob": -0.1}]}}]}
    engine, transport = _engine([(200, answer)])
    (c,) = engine.generate_chat([[{"role": "user", "content": "Light is red."}]],
                                SamplingParams(temperature=0.0), jax.random.key(0))
    assert c.text == "Brake." and c.token_ids == (5, 2)
    assert transport.calls[0][1].endswith("/v1/chat/completions")


def test_constructor_validates():
    with pytest.raises(ValueError, match="model"):
        OpenAIEngine("http://h:1", "")
    with pytest.raises(ValueError, match="base_url"):
        OpenAIEngine("h:1", "m")
    with pytest.raises(ValueError):
        OpenAIEngine("http://h:1", "m", timeout_s=0)
    with pytest.raises(ValueError, match="server"):
        OpenAIEngine("http://h:1", "m", server="tgi")
    with pytest.raises(ValueError, match="server_logprobs_mode"):
        OpenAIEngine("http://h:1", "m", server_logprobs_mode="raw_logprobs")


# ------------------------------------------------------------ live: llama.cpp's server
@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from jax_drive.models.loading import smollm2_gguf_path

    return Tokenizer.from_gguf(smollm2_gguf_path())


@pytest.fixture(scope="module")
def llama(llama_cpp_server, smollm2_tokenizer):
    return OpenAIEngine(llama_cpp_server.base_url, llama_cpp_server.model,
                        tokenizer=smollm2_tokenizer, timeout_s=300, max_concurrency=2)


class _Counting:
    """urllib transport that counts requests (to check what was retried)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        return urllib_transport(*args)


def test_live_dialect_and_models(llama, llama_cpp_server):
    assert llama.dialect is LLAMA
    assert llama.list_models() == [llama_cpp_server.model]


def test_live_generate_text_prompts(llama):
    """n > 1 although llama.cpp ignores n; ids and log-probs recovered from token texts."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0, n=2)
    out = llama.generate(["The capital of France is", "1, 2, 3,"], params, jax.random.key(0))
    assert len(out) == 4
    for c in out:
        assert c.finish_reason in ("stop", "length") and 0 < len(c.token_ids) <= 12
        assert len(c.logprobs) == len(c.token_ids) and all(lp <= 0.0 for lp in c.logprobs)
        assert c.metadata.server == "llama.cpp" and c.metadata.prompt_tokens_match is True
        if c.metadata.token_ids_source == "pieces":
            assert c.metadata.exact and llama.tokenizer.decode(list(c.token_ids)) == c.text


def test_live_greedy_token_prompts_and_stop_ids(llama, smollm2_tokenizer):
    """Token-id prompts go out as text (the server rejects ids) and sample what the text
    prompt samples; stop_token_ids other than EOS are refused, not dropped."""
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    first = llama.generate(["The capital of France is"], greedy, jax.random.key(0))[0]
    assert len(first.token_ids) == 8 or first.finish_reason == "stop"
    again = llama.generate([list(first.prompt_token_ids)], greedy, jax.random.key(1))[0]
    assert again.token_ids == first.token_ids and again.metadata.prompt_tokens_match is True
    for stop in ((first.token_ids[2],), ()):
        with pytest.raises(UnsupportedParameterError, match="stop on token ids"):
            llama.generate(["x"], greedy.replace(stop_token_ids=stop), jax.random.key(0))
    eos = llama.generate(["x"], greedy.replace(stop_token_ids=smollm2_tokenizer.eos_token_ids),
                         jax.random.key(0))
    assert len(eos) == 1


def test_live_seed_determinism(llama):
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    a = llama.generate(["Once upon a time"], params, jax.random.key(5))
    b = llama.generate(["Once upon a time"], params, jax.random.key(5))
    assert a[0].token_ids == b[0].token_ids and a[0].metadata.seed == b[0].metadata.seed


def test_live_rows_of_a_group_get_distinct_seeds(llama):
    """Four rows of one prompt (a GRPO group) are four samples, not one sample four
    times: llama.cpp, like vLLM, repeats itself when given the same seed (checked)."""
    prompt = "Write a random word:"
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    out = llama.generate([prompt] * 4, params, jax.random.key(3))
    assert len({c.metadata.seed for c in out}) == 4
    assert len({c.token_ids for c in out}) > 1
    same_seed = build_completion_request(prompt, params, llama.model, out[0].metadata.seed, LLAMA)
    twice = [llama.request("POST", "completions", same_seed)["choices"][0]["text"] for _ in range(2)]
    assert twice[0] == twice[1] == out[0].text


def test_live_neutral_sampling_values_keep_greedy_on_the_raw_argmax(llama):
    """With our neutral values, greedy decoding picks the raw argmax at every step (the
    sampled log-prob is the largest reported). Left to its defaults (repeat penalty 1.1,
    top-k 40, min-p 0.05) the server picks a lower-ranked token on this repetitive prompt."""
    prompt = "yes yes yes yes yes yes yes yes yes yes yes yes yes yes yes yes"
    body = build_completion_request(prompt, SamplingParams(max_new_tokens=16, temperature=0.0),
                                    llama.model, 0, LLAMA)

    def steps(answer):
        lp = answer["choices"][0]["logprobs"]
        return [(s, max(top.values())) for s, top in zip(lp["token_logprobs"], lp["top_logprobs"])]

    ours = steps(llama.request("POST", "completions", body))
    assert ours and all(abs(s - best) < 1e-6 for s, best in ours)
    defaults = {k: v for k, v in body.items()
                if k not in ("top_k", "min_p", "repeat_penalty", "mirostat_mode",
                             "presence_penalty", "frequency_penalty")}
    theirs = steps(llama.request("POST", "completions", defaults))
    assert any(best - s > 1e-3 for s, best in theirs), theirs


def test_live_processed_logprobs_honoured_or_refused(llama):
    prompt = ["The road ahead is"]
    with pytest.raises(UnsupportedParameterError, match="processed"):
        llama.generate(prompt, SamplingParams(max_new_tokens=4, temperature=0.7,
                                              logprobs_mode="processed"), jax.random.key(0))
    params = SamplingParams(max_new_tokens=4, temperature=1.0)
    raw = llama.generate(prompt, params, jax.random.key(0))[0]
    processed = llama.generate(prompt, params.replace(logprobs_mode="processed"), jax.random.key(0))[0]
    assert processed.metadata.logprobs_mode == "processed" and raw.metadata.logprobs_mode == "raw"
    assert processed.token_ids == raw.token_ids and processed.logprobs == raw.logprobs


def test_live_ids_and_logprobs_match_our_model(llama, smollm2_tokenizer):
    """The ids recovered from llama.cpp's token texts are the sampled ones: our SmolLM2
    (same GGUF, dequantised to float32) gives them the log-probs llama.cpp reported, up to
    llama.cpp's quantised arithmetic."""
    import jax.numpy as jnp

    from jax_drive.models import load_pretrained

    engine = OpenAIEngine(llama.base_url, llama.model, tokenizer=smollm2_tokenizer,
                          require_token_logprobs=True)
    messages = [{"role": "user", "content": "Name three colours."}]
    c = engine.generate_chat([messages], SamplingParams(max_new_tokens=24, temperature=1.0),
                             jax.random.key(1))[0]
    assert c.metadata.exact and c.metadata.token_ids_source == "pieces" and len(c.token_ids) > 4
    model, _, _ = load_pretrained("smollm2-135m-instruct")
    seq = list(c.prompt_token_ids) + list(c.token_ids)
    ids = jnp.asarray([seq[:-1]], jnp.int32)
    logits, _ = model(ids, jnp.arange(ids.shape[1], dtype=jnp.int32)[None], jnp.ones(ids.shape, bool))
    logp = jax.nn.log_softmax(logits[0].astype(jnp.float32), axis=-1)
    rows = jnp.arange(len(c.prompt_token_ids) - 1, len(seq) - 1)
    ours = np.asarray(logp[rows, jnp.asarray(c.token_ids)])
    diff = np.abs(ours - np.asarray(c.logprobs))
    assert diff.mean() < LLAMA_CPP_LOGPROB_MEAN_ATOL and diff.max() < LLAMA_CPP_LOGPROB_MAX_ATOL, (
        ours, c.logprobs)
    shifted = np.asarray(logp[rows, jnp.roll(jnp.asarray(c.token_ids), 1)])
    assert np.abs(shifted - np.asarray(c.logprobs)).mean() > 1.0  # the check can fail


def test_live_validation_errors_are_not_retried(llama_cpp_server):
    """llama.cpp answers a token-id prompt with a validation error as HTTP 500."""
    counting = _Counting()
    engine = OpenAIEngine(llama_cpp_server.base_url, llama_cpp_server.model, transport=counting,
                          max_retries=3, backoff_s=0.0)
    with pytest.raises(OpenAIEngineError, match="rejected the request as invalid") as info:
        engine.request("POST", "completions", {"model": engine.model, "prompt": [1, 2, 3],
                                               "max_tokens": 2})
    assert info.value.status == 500 and counting.calls == 1


def test_live_timeouts_and_connection_errors(llama_cpp_server):
    counting = _Counting()
    slow = OpenAIEngine(llama_cpp_server.base_url, llama_cpp_server.model, server="llama.cpp",
                        transport=counting, timeout_s=0.001, check_model=False)
    with pytest.raises(OpenAIEngineError, match="no answer within"):
        slow.generate(["Tell me a long story"], SamplingParams(max_new_tokens=64), jax.random.key(0))
    assert counting.calls == 1
    from jax_drive.serve.launch import free_port

    counting = _Counting()
    closed = OpenAIEngine(f"http://127.0.0.1:{free_port()}", "m", transport=counting,
                          max_retries=2, backoff_s=0.01)
    with pytest.raises(OpenAIEngineError, match="after 3 attempts"):
        closed.list_models()
    assert counting.calls == 3


def test_live_unknown_model_name_is_an_error(llama_cpp_server):
    engine = OpenAIEngine(llama_cpp_server.base_url, "no-such-model")
    with pytest.raises(OpenAIEngineError, match="not served"):
        engine.generate(["hi"], SamplingParams(max_new_tokens=2), jax.random.key(0))


def test_live_chat_endpoint_without_tokenizer(llama_cpp_server):
    engine = OpenAIEngine(llama_cpp_server.base_url, llama_cpp_server.model)
    out = engine.generate_chat([[{"role": "user", "content": "Say hi."}]],
                               SamplingParams(max_new_tokens=6, n=2), jax.random.key(0))
    assert len(out) == 2 and all(c.text for c in out)
    assert all(c.metadata.token_ids_source == "none" and c.token_ids == () for c in out)


def test_live_multiturn_rollout_runs_unchanged_on_the_server(llama, smollm2_tokenizer):
    """jax_drive.rollout's loop (token-id prompts, n = 1 rows, feedback turns) on llama.cpp."""
    from jax_drive.rollout import RolloutConfig, run_rollouts
    from jax_drive.scenes import stack_scenes, straight_road_scene

    scenes = stack_scenes([straight_road_scene(scene_id=0, ego_speed=8.0)])
    t = 0.1 * np.arange(1, 41)
    reference = np.stack([8.0 * t, np.zeros(40), np.zeros(40)], -1)[None].astype(np.float32)
    config = RolloutConfig(group_size=2, max_turns=2, sampling=SamplingParams(max_new_tokens=24))
    result = run_rollouts(llama, smollm2_tokenizer, scenes, jax.random.key(0), config,
                          reference=reference)
    assert result.turn_mask[0, :, 0].all() and result.num_generated_tokens > 0
    for r in range(2):
        generated = result.turn_ids[r] >= 0
        assert generated.any() and len(result.tokens[r]) == len(result.sample_logprobs[r])
        first_turn = result.tokens[r][result.turn_ids[r] == 0]
        assert smollm2_tokenizer.decode(list(first_turn)).strip()[:5] in result.turns[r][0].text


# ----------------------------------------------------------------- live: vLLM only
def _vllm_engine(**kw) -> OpenAIEngine:
    url = os.environ.get("JAX_DRIVE_VLLM_URL")
    if not url:
        pytest.skip("vLLM-only feature: set JAX_DRIVE_VLLM_URL=http://host:port of a vLLM server")
    key = os.environ.get("JAX_DRIVE_VLLM_API_KEY")
    probe = OpenAIEngine(url, "probe", key, timeout_s=5.0, max_retries=0)
    try:
        models = probe.list_models()
    except (OpenAIEngineError, ValueError) as error:
        pytest.skip(f"vLLM server at JAX_DRIVE_VLLM_URL={url} is not reachable: {error}")
    if probe.dialect is not VLLM:
        pytest.skip(f"the server at {url} is {probe.dialect.name}, not vLLM")
    model = os.environ.get("JAX_DRIVE_VLLM_MODEL") or models[0]
    return OpenAIEngine(url, model, key, **kw)


@pytest.mark.server
def test_vllm_token_ids_stop_ids_and_distinct_group_seeds():
    engine = _vllm_engine()
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=())
    first = engine.generate([[1, 2, 3, 4]], greedy, jax.random.key(0))[0]
    assert first.metadata.token_ids_source == "server" and len(first.token_ids) == 8
    stop = first.token_ids[2]
    cut = engine.generate([[1, 2, 3, 4]], greedy.replace(stop_token_ids=(stop,)), jax.random.key(0))[0]
    assert cut.finish_reason == "stop" and cut.token_ids == first.token_ids[: first.token_ids.index(stop) + 1]
    group = engine.generate([[1, 2, 3, 4]] * 4, SamplingParams(max_new_tokens=12), jax.random.key(1))
    assert len({c.token_ids for c in group}) > 1


@pytest.mark.server
def test_vllm_prompt_logprobs_and_return_tokens_as_ids():
    engine = _vllm_engine()
    out = engine.generate([[1, 2, 3, 4]], SamplingParams(max_new_tokens=4), jax.random.key(0))[0]
    full = list(out.prompt_token_ids) + list(out.token_ids)
    scored = engine.prompt_logprobs([full])[0]
    np.testing.assert_allclose(scored[-len(out.token_ids):], out.logprobs, atol=2e-2)


@pytest.mark.server
def test_vllm_lora_load_inplace():
    path = os.environ.get("JAX_DRIVE_VLLM_LORA_PATH")
    engine = _vllm_engine()
    if not path:
        pytest.skip("set JAX_DRIVE_VLLM_LORA_PATH to a PEFT adapter directory the vLLM server can read")
    engine.load_lora_adapter("jax-drive-test", path, replace=True)
    engine.load_lora_adapter("jax-drive-test", path, replace=True)  # same name again
    assert "jax-drive-test" in engine.list_models()
    engine.unload_lora_adapter("jax-drive-test")
