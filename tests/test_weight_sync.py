"""Weight sync for RL on a remote engine (jax_drive.rl.weight_sync): the trainer pushes its
policy to `jax-drive serve` after every mtGRPO step (LoRA adapters hot-loaded under a new
version name, or full weights reloaded from disk) and the server's log-probs then equal the
trainer's. The end-to-end tests run `jax-drive serve` in a subprocess on a tiny random
model; the others use an in-process server."""

from __future__ import annotations

import os
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from jax_drive.models import load_pretrained
from jax_drive.models.export import save_safetensors
from jax_drive.models.lora import apply_lora
from jax_drive.models.tiny import tiny_policy
from jax_drive.rl.advantages import AdvantageConfig
from jax_drive.rl.grpo import GRPOConfig, grpo_train
from jax_drive.rl.loss import LossConfig
from jax_drive.rl.optim import OptimConfig
from jax_drive.cli.train import main as train_main
from jax_drive.rl.weight_sync import (
    WeightSync,
    WeightSyncConfig,
    connect_trainer,
    served_base_model,
    served_logprob_gap,
    trainer_logprobs,
)
from jax_drive.rollout import RolloutConfig
from jax_drive.sampling import OpenAIEngine, SamplingParams
from jax_drive.sampling.openai_engine import OpenAIEngineError, UnsupportedParameterError
from jax_drive.scenes import stack_scenes, straight_road_scene
from jax_drive.serve import PolicyRegistry, PolicyServer, ServeConfig
from jax_drive.serve.launch import free_port, server_process
from jax_drive.serve.protocol import InvalidRequest
from servers import inprocess_server
# every other completion forced to a good answer, so groups have distinct rewards
from test_rl_e2e import SPEED, ForcingEngine

SERVED = "tiny"
KEY = "test-weight-sync-key"  # the servers' API key: pushing weights needs one
PROBES = [[60, 61, 62, 63], [70, 71]]  # token-id prompts for the log-prob comparison


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The served base: a tiny random Llama with the byte tokenizer, as an HF directory."""
    model, _, tokenizer = tiny_policy(seed=0, lora_rank=None)
    path = tmp_path_factory.mktemp("base")
    save_safetensors(model, path, tokenizer=tokenizer)
    return path


@pytest.fixture(scope="module")
def subprocess_server(checkpoint, tmp_path_factory):
    port = free_port()
    command = [sys.executable, "-m", "jax_drive.cli", "serve", "--model", str(checkpoint),
               "--served-model-name", SERVED, "--port", str(port), "--max-wait-ms", "50",
               "--allowed-weights-dir", str(tmp_path_factory.getbasetemp())]
    # the server reuses the tests' persistent XLA cache (conftest.py); the key from the environment
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_DRIVE_API_KEY=KEY)
    if jax.config.jax_compilation_cache_dir:
        env.update(JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir,
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="1")
    with server_process(command, port, SERVED, "jax-drive-serve-sync", timeout_s=180, env=env,
                        api_key=KEY) as server:
        yield server


def _scenes():
    scenes = stack_scenes([straight_road_scene(scene_id=i, ego_speed=SPEED) for i in range(2)])
    t = 0.1 * np.arange(1, 41)
    ref = np.broadcast_to(np.stack([SPEED * t, np.zeros(40), np.zeros(40)], -1), (2, 40, 3))
    return scenes, ref.astype(np.float32)


def _config(trainable: str, lr: float) -> GRPOConfig:
    return GRPOConfig(
        rollout=RolloutConfig(group_size=2, max_turns=2, sampling=SamplingParams(max_new_tokens=12),
                              format_feedback="Use the [PT, ...] format."),
        advantage=AdvantageConfig(mode="mtgrpo_cross"), loss=LossConfig(kl_coef=0.01),
        optim=OptimConfig(learning_rate=lr, trainable=trainable, weight_decay=0.0),
        prompts_per_step=2, minibatch_size=4, ppo_epochs=1, steps=2, bucket_size=256, seed=1,
        checkpoint_every=None)


def _train_against_server(model, tokenizer, engine, sync_config, trainable, lr):
    """Two mtGRPO steps sampled by the server, pushing after each; returns the sync object,
    per-step served-vs-trainer gaps, and the trainer's log-probs of a fixed completion per step."""
    sync = WeightSync(engine, model, sync_config)
    gaps, fixed = [], []
    completion = list(tokenizer.encode("[PT, (+1.00"))

    def on_step(state, record):
        sync.on_step(state, record)
        gaps.append(served_logprob_gap(sync, model, PROBES, jax.random.key(state.step)))
        fixed.append(trainer_logprobs(model, PROBES[0], completion))

    scenes, ref = _scenes()
    result = grpo_train(model, tokenizer, scenes, _config(trainable, lr), engine=ForcingEngine(sync, tokenizer),
                        references=ref, prompts=["plan scene 0", "plan scene 1"], progress=False,
                        on_step=on_step)
    assert len(result.history) == 2
    return sync, gaps, fixed


@pytest.mark.slow
def test_lora_rl_against_jax_drive_serve_samples_the_trainers_policy(subprocess_server, checkpoint, tmp_path):
    model, _, tokenizer = load_pretrained(str(checkpoint))
    apply_lora(model, rank=4, alpha=8.0, rngs=nnx.Rngs(1))
    engine = OpenAIEngine(subprocess_server.base_url, SERVED, KEY, tokenizer=tokenizer, require_token_logprobs=True)
    sync, gaps, fixed = _train_against_server(
        model, tokenizer, engine, WeightSyncConfig(directory=str(tmp_path / "sync")), "lora", 5e-2)
    # after every step's push, the server samples the trainer's policy
    for gap in gaps:
        assert gap["tokens"] > 0 and gap["max_abs"] < 1e-4, gaps
    # the policy moved between the steps (the check above would see a stale server) ...
    assert np.abs(fixed[1] - fixed[0]).max() > 1e-3
    stale = served_logprob_gap(engine, model, PROBES, jax.random.key(9))  # the base model
    assert stale["max_abs"] > 1e-3, stale
    # ... one versioned adapter per push (initial + 2 steps), only the newest loaded, 2 on disk
    assert [r.model for r in sync.history] == ["policy-v0", "policy-v1", "policy-v2"]
    assert [r.step for r in sync.history] == [None, 1, 2]
    assert engine.list_models() == [SERVED, "policy-v2"]
    assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == ["history.jsonl", "v000001", "v000002"]
    assert len((tmp_path / "sync" / "history.jsonl").read_text().splitlines()) == 3


@pytest.mark.slow
def test_full_fine_tuning_against_jax_drive_serve_reloads_weights(subprocess_server, checkpoint, tmp_path):
    model, _, tokenizer = load_pretrained(str(checkpoint))
    engine = OpenAIEngine(subprocess_server.base_url, SERVED, KEY, tokenizer=tokenizer, require_token_logprobs=True)
    try:
        sync, gaps, fixed = _train_against_server(
            model, tokenizer, engine, WeightSyncConfig(mode="full", directory=str(tmp_path / "sync")),
            "full", 1e-2)
        for gap in gaps:
            assert gap["tokens"] > 0 and gap["max_abs"] < 1e-4, gaps
        assert np.abs(fixed[1] - fixed[0]).max() > 1e-3
        assert [r.model for r in sync.history] == [SERVED] * 3
        health = engine.request("GET", "health", root=True)
        assert health["weights_path"] == sync.history[-1].path
    finally:  # the module's server goes back to the original base weights
        engine.update_weights_from_disk(str(checkpoint))
    base, _, _ = load_pretrained(str(checkpoint))
    assert served_logprob_gap(engine, base, PROBES, jax.random.key(3))["max_abs"] < 1e-4


# ----------------------------------------------------------------- in-process server
@pytest.fixture()
def local_server(checkpoint, tmp_path_factory, monkeypatch):
    """An in-process server with API key KEY, which the trainer's side reads from
    $JAX_DRIVE_API_KEY (set here) when not given."""
    model, _, tokenizer = load_pretrained(str(checkpoint))
    registry = PolicyRegistry(model, tokenizer, SERVED)
    config = ServeConfig(api_key=KEY, allowed_weights_dirs=(str(tmp_path_factory.getbasetemp()),))
    monkeypatch.setenv("JAX_DRIVE_API_KEY", KEY)
    with inprocess_server(PolicyServer(registry, config)) as url:
        yield url, registry, tokenizer


def test_registry_reloads_weights_and_reapplies_adapters(local_server, checkpoint, tmp_path):
    url, registry, tokenizer = local_server
    from jax_drive.models.export import export_peft

    model, _, _ = load_pretrained(str(checkpoint))
    apply_lora(model, rank=4, alpha=8.0, rngs=nnx.Rngs(3))
    for proj in ("q_proj", "v_proj"):
        p = getattr(model.layers, proj)
        p.lora_b.set_value(jax.random.normal(jax.random.key(4), p.lora_b.shape) * 0.3)
    registry.load_adapter("a", export_peft(model, tmp_path / "adapter"))
    new_base, _, _ = tiny_policy(seed=5, lora_rank=None)
    save_safetensors(new_base, tmp_path / "new")
    engine = OpenAIEngine(url, SERVED, KEY, tokenizer=tokenizer)
    engine.update_weights_from_disk(str(tmp_path / "new"))
    assert served_logprob_gap(engine, new_base, PROBES, jax.random.key(0))["max_abs"] < 1e-4
    # the adapter is applied again, on the new base
    expected = nnx.clone(new_base)
    from jax_drive.models.export import load_peft

    load_peft(expected, tmp_path / "adapter")
    assert served_logprob_gap(engine.with_model("a"), expected, PROBES, jax.random.key(1))["max_abs"] < 1e-4
    # a checkpoint of another shape is refused, and the served weights stay
    other, _, _ = tiny_policy(seed=0, lora_rank=None, num_layers=1)
    save_safetensors(other, tmp_path / "other")
    with pytest.raises(InvalidRequest, match="another model config"):
        registry.load_weights(tmp_path / "other")
    with pytest.raises(InvalidRequest, match="does not exist"):
        registry.load_weights(tmp_path / "missing")
    assert registry.weights_path == str(tmp_path / "new")


def test_unversioned_sync_reloads_one_name_and_prunes_exports(local_server, checkpoint, tmp_path):
    url, registry, tokenizer = local_server
    model, _, _ = load_pretrained(str(checkpoint))
    apply_lora(model, rank=2, alpha=4.0, rngs=nnx.Rngs(0))
    engine = OpenAIEngine(url, SERVED, KEY, tokenizer=tokenizer)
    sync = WeightSync(engine, model, WeightSyncConfig(directory=str(tmp_path / "a"), versioned=False, keep=1,
                                                      verify_tolerance=1e-4))
    for step in range(3):
        p = model.layers.q_proj
        p.lora_b.set_value(jax.random.normal(jax.random.key(step), p.lora_b.shape) * 0.5)
        sync.on_step(type("State", (), {"step": step + 1})())
        record = sync.history[-1]
        assert record.model == "policy" and record.step == step + 1 and record.logprob_gap < 1e-4
        assert served_logprob_gap(sync, model, PROBES, jax.random.key(step))["max_abs"] < 1e-4
    assert list(registry.adapters()) == ["policy"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["history.jsonl", "v000002"]
    # a trainer on other base weights than the server's is noticed by the probe
    other, _, _ = tiny_policy(seed=7, lora_rank=2)
    mismatched = WeightSync(engine, other, WeightSyncConfig(directory=str(tmp_path / "b"), adapter_name="o",
                                                             verify_tolerance=1e-4))
    with pytest.warns(RuntimeWarning, match="base weights"):
        mismatched.push()
    assert mismatched.history[-1].logprob_gap > 1e-3


def test_full_sync_needs_a_server_that_reloads_weights(tmp_path):
    engine = OpenAIEngine("http://127.0.0.1:9", "m", server="llama.cpp", check_model=False)
    model, _, _ = tiny_policy(lora_rank=None)
    sync = WeightSync(engine, model, WeightSyncConfig(mode="full", directory=str(tmp_path)))
    with pytest.raises(UnsupportedParameterError, match="jax-drive serve"):
        sync.push()
    with pytest.raises(ValueError, match="mode"):
        WeightSyncConfig(mode="delta")
    with pytest.raises(TypeError, match="OpenAIEngine"):
        WeightSync(object(), model)


def test_connect_trainer_finds_the_base_and_picks_the_mode(local_server, checkpoint, tmp_path):
    url, registry, tokenizer = local_server
    model, _, _ = load_pretrained(str(checkpoint))
    apply_lora(model, rank=2, alpha=4.0, rngs=nnx.Rngs(0))
    sync = connect_trainer(url, model, tokenizer, "lora", str(tmp_path))
    assert sync.base.model == SERVED and sync.base.require_token_logprobs and sync.config.mode == "lora"
    record = sync.push(step=0)
    assert record.model == "policy-v0" and record.logprob_gap is not None and record.logprob_gap < 1e-4
    sync.push(step=1)
    # a restarted trainer (a resumed run) starts at v0 again and drops what the last one left
    again = connect_trainer(url, model, tokenizer, "lora", str(tmp_path / "again"))
    assert again.engine().model == "policy-v0" and sync.base.list_models() == [SERVED, "policy-v0"]
    assert connect_trainer(url, model, tokenizer, "full", str(tmp_path), served_model=SERVED).config.mode == "full"


def test_train_cli_checks_the_engine_server_before_training(local_server, tmp_path, capsys):
    url, _, _ = local_server
    assert served_base_model(url) == SERVED and served_base_model(url, SERVED) == SERVED
    with pytest.raises(OpenAIEngineError, match="does not serve 'nope'"):
        served_base_model(url, "nope")
    out = tmp_path / "run"
    common = ["--preset", "smoke", "--out", str(out), "--no-progress"]
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert train_main([*common, "--engine-url", nobody]) == 2
    assert train_main([*common, "--engine-url", url, "--engine-model", "nope"]) == 2
    assert train_main([*common, "--engine-model", SERVED]) == 2
    assert train_main([*common, "--engine-url", url, "--skip-rl"]) == 2
    assert train_main(["--preset", "smoke-vlm", "--out", str(out), "--engine-url", url]) == 2
    err = capsys.readouterr().err
    assert "remote rollouts are text only" in err
    assert f"--engine-url {nobody}:" in err and "does not serve 'nope'" in err
    assert "give --engine-url" in err and "--skip-rl skips RL" in err
    assert not out.exists()  # refused before the run started (no SFT spent on a dead server)


# ------------------------------------------------------------- llama.cpp (real server)
@pytest.mark.server
def test_weight_sync_against_llama_cpp_is_refused_with_the_reason(llama_cpp_server, tmp_path):
    """llama.cpp's server has neither runtime LoRA loading nor a weight reload endpoint: a
    trainer pointed at it fails at its first push, saying why, instead of training on a
    policy the server never sees."""
    engine = OpenAIEngine(llama_cpp_server.base_url, llama_cpp_server.model)
    model, _, _ = tiny_policy(lora_rank=2)
    with pytest.raises(UnsupportedParameterError, match="runtime LoRA loading needs a vLLM .* llama.cpp"):
        WeightSync(engine, model, WeightSyncConfig(directory=str(tmp_path / "lora"))).engine()
    with pytest.raises(UnsupportedParameterError, match="needs jax-drive serve.* llama.cpp"):
        WeightSync(engine, model, WeightSyncConfig(mode="full", directory=str(tmp_path / "full"))).push()
    assert engine.list_models() == [llama_cpp_server.model]  # nothing changed on the server


# ---------------------------------------------------------------------- vLLM only
@pytest.mark.server
def test_lora_sync_against_vllm(tmp_path):
    """Needs JAX_DRIVE_VLLM_URL: a vLLM server of HuggingFaceTB/SmolLM2-135M-Instruct started
    with --enable-lora (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) on this machine's file system.
    Its weights are bf16, the trainer's float32: the gap tolerance is bf16's, not 1e-4."""
    from test_engine_openai import _vllm_engine

    served = _vllm_engine()  # skips (with the reason) before the model is loaded
    model, _, tokenizer = load_pretrained("smollm2-135m-instruct")
    engine = OpenAIEngine(served.base_url, served.model, served.api_key, tokenizer=tokenizer,
                          require_token_logprobs=True)
    apply_lora(model, rank=8, alpha=16.0, rngs=nnx.Rngs(0))
    probes = [list(tokenizer.encode("The light ahead turns red. What do you do?"))]
    sync = WeightSync(engine, model, WeightSyncConfig(directory=str(tmp_path)))
    for step in range(2):
        p = model.layers.q_proj
        p.lora_b.set_value(jax.random.normal(jax.random.key(step), p.lora_b.shape) * 0.05)
        sync.push(step)
        assert served_logprob_gap(sync, model, probes, jax.random.key(step))["max_abs"] < 5e-2
    assert "policy-v1" in engine.list_models() and "policy-v0" not in engine.list_models()
    engine.unload_lora_adapter("policy-v1")
