"""Tests of `jax-drive serve` (jax_drive.serve): the request models, the batcher, LoRA
adapters, and the HTTP server driven by the official `openai` client and by
``OpenAIEngine``. A tiny random Llama with a byte-level tokenizer is served in-process by
uvicorn on 127.0.0.1; one test starts the `jax-drive serve` command in a subprocess."""

from __future__ import annotations

import concurrent.futures
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import openai
import pytest
from flax import nnx
from pydantic import ValidationError

from jax_drive.models import CausalLM, ModelConfig
from jax_drive.models.export import export_peft, save_safetensors
from jax_drive.models.lora import apply_lora, lora_projections
from jax_drive.sampling import Completion, JaxEngine, OpenAIEngine, SamplingParams
from jax_drive.sampling.openai_engine import OpenAIEngineError
from jax_drive.models.tiny import byte_tokenizer
from jax_drive.serve import (
    BatcherConfig,
    GenerationJob,
    PolicyRegistry,
    PolicyServer,
    RequestBatcher,
    ServeConfig,
)
from jax_drive.serve.batcher import batch_keys, group_jobs, request_keys
from jax_drive.serve.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    InvalidRequest,
    truncate_at_stop,
)
from jax_drive.serve.launch import free_port, server_process
from servers import inprocess_server

MODEL = "tiny-policy"
KEY = "test-serve-key"  # the in-process server's API key (admin endpoints need one)


def tiny_model(seed: int = 0, scale: float = 6.0) -> CausalLM:
    """A tiny random Llama (V = 259) with weights scaled up so its logits are peaked."""
    model = CausalLM(ModelConfig.tiny("llama", vocab_size=259, tie_embeddings=False),
                     rngs=nnx.Rngs(seed))
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(lambda x: x * scale if x.ndim >= 2 else x, state))


def lora_copy(model: CausalLM, seed: int = 1) -> CausalLM:
    """A copy of ``model`` with a rank-4 LoRA whose B matrices are random (non-zero)."""
    clone = nnx.clone(model)
    apply_lora(clone, rank=4, alpha=8.0, rngs=nnx.Rngs(seed))
    for i, proj in enumerate(lora_projections(clone).values()):
        b = jax.random.normal(jax.random.key(seed * 100 + i), proj.lora_b.shape) * 0.5
        proj.lora_b.set_value(b.astype(jnp.float32))
    return clone


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def base_model():
    return tiny_model()


@pytest.fixture(scope="module")
def served(base_model, tokenizer, tmp_path_factory):
    """(base_url, PolicyServer) of an in-process server on 127.0.0.1 (batch wait 50 ms, the
    default limits, API key KEY, loads allowed from the tests' temporary directories)."""
    registry = PolicyRegistry(base_model, tokenizer, MODEL)
    config = ServeConfig(BatcherConfig(max_batch_rows=16, max_wait_s=0.05), api_key=KEY,
                         allowed_weights_dirs=(str(tmp_path_factory.getbasetemp()),))
    server = PolicyServer(registry, config)
    with inprocess_server(server) as url:
        yield url, server


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key=KEY, max_retries=0, timeout=120)


# ------------------------------------------------------------------------ request models
def test_requests_reject_what_the_policy_cannot_honour():
    ok = CompletionRequest(model="m", prompt=[1, 2], max_tokens=4, top_k=-1, logprobs=1)
    assert ok.prompt_list() == [[1, 2]] and ok.sampling_params(16, (2,)).top_k == 0
    assert CompletionRequest(model="m", prompt=[[1], [2, 3]]).prompt_list() == [[1], [2, 3]]
    assert CompletionRequest(model="m", prompt=["a", "b"]).prompt_list() == ["a", "b"]
    for bad in ({"min_p": 0.1}, {"repetition_penalty": 1.1}, {"presence_penalty": 0.5},
                {"frequency_penalty": 0.2}, {"stream_options": {"include_usage": True}}, {"logprobs": 2}, {"echo": True},
                {"best_of": 3}, {"logit_bias": {"5": 1.0}}, {"unknown_field": 1},
                {"prompt": []}, {"prompt": ""}, {"top_p": 0.0}, {"max_tokens": 0}):
        body = {"model": "m", "prompt": "x", **bad}
        with pytest.raises(ValidationError):
            CompletionRequest(**body)
    with pytest.raises(ValidationError):
        ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], top_logprobs=2)
    with pytest.raises(ValidationError):
        ChatCompletionRequest(model="m", messages=[])
    # neutral values are accepted (OpenAIEngine always sends them)
    CompletionRequest(model="m", prompt="x", min_p=0.0, repetition_penalty=1.0, presence_penalty=0)


def test_stop_token_semantics_follow_vllm():
    def stops(**kw):
        return CompletionRequest(model="m", prompt="x", **kw).sampling_params(16, (2,)).stop_token_ids

    assert stops() is None  # the engine's default: the tokenizer's EOS
    assert stops(stop_token_ids=[7]) == (2, 7)  # in addition to EOS
    assert stops(stop_token_ids=[7], ignore_eos=True) == (7,)  # exactly these
    assert stops(ignore_eos=True) == ()  # never stop early
    with pytest.raises(InvalidRequest, match="min_new_tokens"):
        CompletionRequest(model="m", prompt="x", max_tokens=2, min_tokens=3).sampling_params(16, ())


def test_truncate_at_stop_cuts_text_ids_and_logprobs(tokenizer):
    ids = tuple(tokenizer.encode("go left. then"))
    c = Completion((1,), ids, "go left. then", tuple(-0.1 * (i + 1) for i in range(len(ids))), "length")
    decode = tokenizer.decode
    out_ids, lps, text, finish = truncate_at_stop(c, [". ", "zz"], decode)
    assert text == "go left" and finish == "stop"
    assert decode(out_ids) == "go left. " and lps == c.logprobs[: len(out_ids)]
    assert truncate_at_stop(c, ["zz"], decode) == (ids, c.logprobs, c.text, "length")


# ------------------------------------------------------------------------------- batcher
class _RecordingEngine:
    """Returns one fake completion per row, recording the calls; optional delay."""

    def __init__(self, delay_s: float = 0.0):
        self.calls = []
        self.delay_s = delay_s

    def generate(self, prompts, params, key):
        self.calls.append((list(map(list, prompts)), params))
        time.sleep(self.delay_s)
        return [Completion(tuple(p), (len(p),), "x", (-1.0,), "length") for p in prompts]

    def generate_chat(self, conversations, params, key):  # pragma: no cover - protocol only
        raise NotImplementedError


def test_batcher_merges_concurrent_jobs_into_one_engine_call():
    engine = _RecordingEngine()
    batcher = RequestBatcher(lambda name: engine, BatcherConfig(max_batch_rows=8, max_wait_s=0.5)).start()
    try:
        params = SamplingParams(max_new_tokens=3)
        jobs = [GenerationJob("m", [[i + 1] * (i + 1)], params, seed=i) for i in range(4)]
        futures = [batcher.submit(job) for job in jobs]
        results = [f.result(timeout=30) for f in futures]
    finally:
        batcher.stop()
    assert len(engine.calls) == 1 and list(batcher.batch_sizes) == [4]
    for i, result in enumerate(results):  # every request gets its own rows back
        assert [c.prompt_token_ids for c in result] == [tuple([i + 1] * (i + 1))]


def test_batcher_groups_by_settings_and_model_and_respects_the_row_limit():
    engine = _RecordingEngine()
    batcher = RequestBatcher(lambda name: engine, BatcherConfig(max_batch_rows=4, max_wait_s=0.5)).start()
    try:
        a, b = SamplingParams(max_new_tokens=3), SamplingParams(max_new_tokens=5)
        jobs = [GenerationJob("m", [[1]], a), GenerationJob("m", [[2]], b),
                GenerationJob("m", [[3]], a), GenerationJob("m", [[4], [4], [4]], a)]
        futures = [batcher.submit(job) for job in jobs]
        for f in futures:
            f.result(timeout=30)
    finally:
        batcher.stop()
    # first batch: jobs 0-2 (3 rows; job 3 would exceed 4 rows) -> two groups by params
    assert [len(p) for p, _ in engine.calls] == [2, 1, 3]
    assert engine.calls[0] == ([[1], [3]], a) and engine.calls[1] == ([[2]], b)
    groups = group_jobs([GenerationJob("x", [[1]], a), GenerationJob("y", [[1]], a),
                         GenerationJob("x", [[2]], a)])
    assert [[j.prompts for j in g] for g in groups] == [[[[1]], [[2]]], [[[1]]]]


def test_batcher_hands_engine_errors_to_every_job_of_the_batch():
    class Failing(_RecordingEngine):
        def generate(self, prompts, params, key):
            raise ValueError("prompt too long")

    batcher = RequestBatcher(lambda name: Failing(), BatcherConfig(max_wait_s=0.2)).start()
    try:
        futures = [batcher.submit(GenerationJob("m", [[1]], SamplingParams())) for _ in range(2)]
        for f in futures:
            with pytest.raises(ValueError, match="too long"):
                f.result(timeout=30)
    finally:
        batcher.stop()
    with pytest.raises(RuntimeError, match="not running"):
        batcher.submit(GenerationJob("m", [[1]], SamplingParams()))


def test_batch_keys_give_each_row_its_requests_key_whatever_the_company():
    rng = np.random.default_rng(0)
    data = jax.random.key_data
    params = SamplingParams()
    alone = batch_keys([GenerationJob("m", [[1]] * 2, params, seed=5)], rng)
    assert alone.shape == (2,) and (data(alone) == data(request_keys(5, 2))).all()
    mixed = batch_keys([GenerationJob("m", [[1]], params, seed=6), GenerationJob("m", [[1]] * 2, params, seed=5),
                        GenerationJob("m", [[2]], params)], rng)
    assert mixed.shape == (4,) and (data(mixed[1:3]) == data(alone)).all()
    assert (data(mixed[0]) == data(request_keys(6, 1)[0])).all()
    assert len({tuple(np.asarray(data(k)).tolist()) for k in mixed}) == 4  # distinct rows


# ----------------------------------------------------------------------------- registry
def test_registry_loads_replaces_and_unloads_peft_adapters(base_model, tokenizer, tmp_path):
    registry = PolicyRegistry(base_model, tokenizer, MODEL, max_loras=1)
    export_peft(lora_copy(base_model, 1), tmp_path / "a1")
    export_peft(lora_copy(base_model, 2), tmp_path / "a2")
    registry.load_adapter("step", tmp_path / "a1")
    assert registry.names() == [MODEL, "step"]
    with pytest.raises(InvalidRequest, match="already been loaded"):
        registry.load_adapter("step", tmp_path / "a2")
    with pytest.raises(InvalidRequest, match="max_loras"):
        registry.load_adapter("other", tmp_path / "a2")
    first = registry.engine("step")
    registry.load_adapter("step", tmp_path / "a2", load_inplace=True)
    assert registry.engine("step") is not first and registry.adapters() == {"step": str(tmp_path / "a2")}
    with pytest.raises(InvalidRequest, match="does not exist"):
        registry.load_adapter("x", tmp_path / "missing")
    with pytest.raises(InvalidRequest, match="base model"):
        registry.load_adapter(MODEL, tmp_path / "a1")
    registry.unload_adapter("step")
    with pytest.raises(InvalidRequest) as info:
        registry.engine("step")
    assert info.value.status == 404
    # the base model is untouched by the adapters' clones
    assert all(getattr(base_model.layers, n).lora_a is None for n in ("q_proj", "v_proj"))


# ------------------------------------------------------------- HTTP: the openai client
def test_models_endpoint(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].owned_by == "jax-drive"


def test_completions_match_the_in_process_engine(client, base_model, tokenizer):
    """A seeded request samples exactly what JaxEngine samples with its row keys
    (``request_keys(seed, rows)``) on the same rows: the server adds no change to the
    distribution."""
    answer = client.completions.create(model=MODEL, prompt="turn left", max_tokens=6, n=3,
                                       logprobs=1, seed=11, temperature=1.0)
    assert len(answer.choices) == 3 and answer.usage.completion_tokens > 0
    ids = tokenizer.encode("turn left")
    reference = JaxEngine(base_model, tokenizer).generate(
        [ids] * 3, SamplingParams(max_new_tokens=6), request_keys(11, 3))
    for choice, ref in zip(answer.choices, reference):
        extra = choice.model_extra
        assert tuple(extra["token_ids"]) == ref.token_ids and extra["prompt_token_ids"] == ids
        np.testing.assert_allclose(choice.logprobs.token_logprobs, ref.logprobs, atol=1e-6)
        assert choice.text == ref.text and choice.finish_reason == ref.finish_reason
    again = client.completions.create(model=MODEL, prompt="turn left", max_tokens=6, n=3,
                                      logprobs=1, seed=11)
    assert [c.text for c in again.choices] == [c.text for c in answer.choices]


def test_completions_token_prompts_stop_strings_and_ids_format(client, tokenizer):
    ids = tokenizer.encode("abc")
    plain = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, seed=3,
                                      temperature=0.0, logprobs=1)
    text = plain.choices[0].text
    assert len(plain.choices[0].model_extra["token_ids"]) == 12 and len(text) >= 3
    stop = text[2:4]
    cut = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, seed=3,
                                    temperature=0.0, logprobs=1, stop=[stop])
    choice = cut.choices[0]
    assert choice.finish_reason == "stop" and choice.text == text[: text.index(stop)]
    assert len(choice.logprobs.token_logprobs) == len(choice.model_extra["token_ids"]) < 12
    as_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0.0,
                                       logprobs=1, extra_body={"return_tokens_as_token_ids": True})
    tokens = as_ids.choices[0].logprobs.tokens
    assert tokens == [f"token_id:{i}" for i in as_ids.choices[0].model_extra["token_ids"]]


def test_chat_completions_with_logprobs(client, base_model, tokenizer):
    messages = [{"role": "user", "content": "Light is red."}]
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5,
                                            logprobs=True, seed=4, n=2)
    assert len(answer.choices) == 2
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    assert answer.model_extra["prompt_token_ids"] == prompt
    ref = JaxEngine(base_model, tokenizer).generate([prompt] * 2, SamplingParams(max_new_tokens=5),
                                                    request_keys(4, 2))
    for choice, r in zip(answer.choices, ref):
        assert choice.message.role == "assistant" and choice.message.content == r.text
        np.testing.assert_allclose([c.logprob for c in choice.logprobs.content], r.logprobs, atol=1e-6)


def test_openai_client_errors(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="min_p"):
        client.completions.create(model=MODEL, prompt="x", extra_body={"min_p": 0.05})
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=MODEL, prompt=[5] * 500, max_tokens=100)
    with pytest.raises(openai.BadRequestError, match="token ids"):
        client.completions.create(model=MODEL, prompt=[100000], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="stream_options"):
        client.completions.create(model=MODEL, prompt="x", extra_body={"stream_options": {"include_usage": True}})


def sizes_since(batcher, before: int) -> list[int]:
    """Rows of the engine calls made after the batcher had made ``before``."""
    new = batcher.engine_calls - before
    return list(batcher.batch_sizes)[-new:] if new else []


def test_concurrent_http_requests_share_one_sampler_call(served, client):
    _, server = served
    before = server.batcher.engine_calls

    def ask(i):
        return client.completions.create(model=MODEL, prompt=[i + 3, 7], max_tokens=4, seed=i)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, range(4)))
    assert all(len(a.choices) == 1 for a in answers)
    sizes = sizes_since(server.batcher, before)
    assert sum(sizes) == 4 and max(sizes) >= 2, sizes  # at least two requests were merged


def test_seeded_requests_follow_their_own_seed_when_batched(served, client, base_model, tokenizer):
    """Concurrent seeded requests (different prompts, lengths and n) merged into one sampler
    call each sample exactly what their seed gives in process."""
    _, server = served
    before = server.batcher.engine_calls
    asks = [([4, 9, 2], 2, 21), ([7, 7, 1, 3, 5], 1, 22), ([30, 31], 1, 23), ([4, 9, 2], 1, 24)]

    def ask(item):
        prompt, n, seed = item
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, n=n, seed=seed,
                                         logprobs=1, temperature=1.0)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, asks))
    assert max(sizes_since(server.batcher, before)) >= 2  # some requests shared a call
    local = JaxEngine(base_model, tokenizer)
    for (prompt, n, seed), answer in zip(asks, answers):
        ref = local.generate([prompt], SamplingParams(max_new_tokens=6, n=n), request_keys(seed, n))
        for choice, r in zip(answer.choices, ref):
            assert tuple(choice.model_extra["token_ids"]) == r.token_ids
            np.testing.assert_allclose(choice.logprobs.token_logprobs, r.logprobs, atol=1e-5)


# ---------------------------------------------------------- HTTP: OpenAIEngine + LoRA
def test_openai_engine_against_serve(served, base_model, tokenizer):
    url, _ = served
    # each row is its own seeded request, replayable in process from its seed
    engine = OpenAIEngine(url, MODEL, KEY, tokenizer=tokenizer, require_token_logprobs=True,
                          max_concurrency=1)
    assert engine.dialect.name == "jax-drive"
    params = SamplingParams(max_new_tokens=5, temperature=0.8, top_k=20, n=2,
                            logprobs_mode="processed")
    out = engine.generate([[3, 4, 5], [6, 7]], params, jax.random.key(0))
    assert len(out) == 4 and [c.prompt_token_ids for c in out] == [(3, 4, 5)] * 2 + [(6, 7)] * 2
    local = JaxEngine(base_model, tokenizer)
    for c in out:  # each row was its own seeded request: replay it in process
        assert c.metadata.exact and c.metadata.logprobs_mode == "processed"
        ref = local.generate([list(c.prompt_token_ids)], params.replace(n=1),
                             request_keys(c.metadata.seed, 1))[0]
        assert c.token_ids == ref.token_ids
        np.testing.assert_allclose(c.logprobs, ref.logprobs, atol=1e-6)
    assert len({c.metadata.seed for c in out}) == 4
    with pytest.raises(OpenAIEngineError, match="not served"):
        engine.with_model("missing").generate([[1]], SamplingParams(max_new_tokens=2), jax.random.key(0))


def test_lora_adapters_pushed_over_http_are_sampled(served, base_model, tokenizer, tmp_path):
    url, _ = served
    engine = OpenAIEngine(url, MODEL, KEY, tokenizer=tokenizer, max_concurrency=1)
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    key = jax.random.key(7)
    prompt = [[10, 11, 12]]
    try:
        for step, seed in enumerate((1, 2)):  # a trainer pushing its adapter after each step
            policy = lora_copy(base_model, seed)
            path = export_peft(policy, tmp_path / f"step{step}")
            engine.load_lora_adapter("policy", str(path), replace=True)
            served_c = engine.with_model("policy").generate(prompt, params, key)[0]
            local = JaxEngine(policy, tokenizer).generate(
                prompt, params, request_keys(served_c.metadata.seed, 1))[0]
            assert served_c.token_ids == local.token_ids
            np.testing.assert_allclose(served_c.logprobs, local.logprobs, atol=1e-5)
        assert "policy" in engine.list_models()
        base = engine.generate(prompt, params, key)[0]
        assert base.logprobs != served_c.logprobs  # the adapter changes the policy
        with pytest.raises(OpenAIEngineError, match="already been loaded"):
            engine.load_lora_adapter("policy", str(path))
    finally:
        engine.unload_lora_adapter("policy")
    assert "policy" not in engine.list_models()
    with pytest.raises(OpenAIEngineError) as info:
        engine.unload_lora_adapter("policy")
    assert info.value.status == 404


# ----------------------------------------------------------------- the CLI command
def test_jax_drive_serve_command_serves_a_checkpoint(base_model, tokenizer, tmp_path):
    save_safetensors(base_model, tmp_path / "ckpt", tokenizer=tokenizer)
    port = free_port()
    command = [sys.executable, "-m", "jax_drive.cli", "serve", "--model", str(tmp_path / "ckpt"),
               "--served-model-name", "ckpt", "--port", str(port), "--max-wait-ms", "1"]
    with server_process(command, port, "ckpt", "jax-drive-serve", timeout_s=120) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["ckpt"]
        answer = client.completions.create(model="ckpt", prompt="hi", max_tokens=3, seed=0)
        assert answer.usage.completion_tokens == len(answer.choices[0].model_extra["token_ids"])
