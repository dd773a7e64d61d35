"""End to end on a tiny random LoRA policy: rollout -> reward -> advantages -> update.

A random policy never writes a parseable trajectory, so every reward is equal and every
advantage is 0. To get a learning signal, ``ForcingEngine`` (a test double around the real
JaxEngine) replaces every other completion by a fixed good answer; the rest are sampled by
the real engine. mtGRPO must then raise the policy's log-probability of the good answer.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_drive.models import LoRAParam
from jax_drive.rl.advantages import AdvantageConfig
from jax_drive.data.tokens import TokenRow
from jax_drive.rl.batching import pad_rows
from jax_drive.rl.grpo import GRPOConfig, grpo_train
from jax_drive.rl.logging import read_jsonl
from jax_drive.rl.loss import LossConfig
from jax_drive.rl.optim import OptimConfig
from jax_drive.models.tiny import tiny_policy
from jax_drive.rollout import RolloutConfig
from jax_drive.sampling import Completion, JaxEngine, SamplingParams
from jax_drive.scenes import stack_scenes, straight_road_scene
from jax_drive.text import format_trajectory

SPEED = 10.0
GOOD = format_trajectory(np.stack([SPEED * 0.5 * np.arange(1, 9), np.zeros(8), np.zeros(8)], -1))
PROMPTS = ["plan scene 0", "plan scene 1"]


class ForcingEngine:
    """Even positions of each call get GOOD (teacher-forced), odd ones the real sampler's output."""

    def __init__(self, inner, tokenizer):
        self.inner, self.tok = inner, tokenizer

    def generate(self, prompts, params, key):
        sampled = self.inner.generate(prompts, params, key)
        ids = tuple(self.tok.encode(GOOD) + [self.tok.eos_token_ids[0]])
        return [Completion(tuple(p), ids, GOOD, (0.0,) * len(ids), "stop") if i % 2 == 0 else c
                for i, (p, c) in enumerate(zip(prompts, sampled))]

    def generate_chat(self, conversations, params, key):  # pragma: no cover - protocol only
        raise NotImplementedError


def _setup():
    model, _, tok = tiny_policy(seed=0, lora_rank=4)
    scenes = stack_scenes([straight_road_scene(scene_id=i, ego_speed=SPEED) for i in range(2)])
    t = 0.1 * np.arange(1, 41)
    ref = np.broadcast_to(np.stack([SPEED * t, np.zeros(40), np.zeros(40)], -1), (2, 40, 3)).astype(np.float32)
    return model, tok, scenes, ref


def _config(steps, **kw):
    return GRPOConfig(
        rollout=RolloutConfig(group_size=3, max_turns=2, sampling=SamplingParams(max_new_tokens=12),
                              format_feedback="Use the [PT, ...] format."),
        advantage=AdvantageConfig(mode="mtgrpo_cross"),
        loss=LossConfig(kl_coef=0.01),
        optim=OptimConfig(learning_rate=2e-2, trainable="lora", weight_decay=0.0),
        prompts_per_step=2, minibatch_size=3, ppo_epochs=2, steps=steps, bucket_size=256, seed=1, **kw)


def _good_logprob(model, tok, prompt):
    head = tok.encode(tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True))
    ans = tok.encode(GOOD) + [tok.eos_token_ids[0]]
    row = TokenRow(np.asarray(head + ans, np.int32), np.asarray([0] * len(head) + [1] * len(ans), np.float32))
    b = {k: jnp.asarray(v) for k, v in pad_rows([row], len(row) - 1, tok.pad_token_id).items()}
    logp = model.token_logprobs(b["input_ids"], b["positions"], b["attention_mask"], b["targets"])
    return float(jnp.sum(logp * b["loss_mask"]))


def _lora(model):
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, LoRAParam))]


@pytest.mark.slow
def test_mtgrpo_learns_and_resumes(tmp_path):
    model_a, tok, scenes, ref = _setup()
    lora0 = _lora(model_a)
    base0 = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model_a, nnx.Param)) if x.ndim and x.size > 4096]
    before = _good_logprob(model_a, tok, PROMPTS[0])
    straight = grpo_train(model_a, tok, scenes, _config(2), engine=ForcingEngine(JaxEngine(model_a, tok), tok),
                          references=ref, prompts=PROMPTS, out_dir=tmp_path / "a", progress=False)
    h = straight.history
    assert [r["step"] for r in h] == [1, 2]
    first = h[0]
    # forced good answers are usable and clean; sampled ones are not -> both reward levels present
    assert 0.0 < first["format_rate"] < 1.0 and first["pdms_per_turn"][0] > 0.0
    assert first["advantage_abs_mean"] > 0.1
    assert first["optimizer_steps"] == 4  # 6 rows / mini-batch 3 x 2 epochs
    assert first["grad_norm"] > 0 and np.isfinite(first["loss"])
    assert h[1]["kl"] > 0  # the policy drifted from the reference (the initial policy)
    for key in ("clip_frac", "turns_mean", "train_tokens_per_s", "peak_rss_gb", "pdms_by_budget", "logp_mismatch"):
        assert key in first
    # LoRA adapters moved, frozen base weights did not
    assert max(np.abs(a - b).max() for a, b in zip(lora0, _lora(model_a))) > 1e-4
    base1 = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model_a, nnx.Param)) if x.ndim and x.size > 4096]
    assert all(np.array_equal(a, b) for a, b in zip(base0, base1))
    # the rewarded answer became more likely
    assert _good_logprob(model_a, tok, PROMPTS[0]) > before + 1.0
    assert len(read_jsonl(tmp_path / "a" / "metrics.jsonl")) == 2

    # killed after step 1, restarted from scratch with resume=True: same metrics and weights
    model_b, _, _, _ = _setup()
    grpo_train(model_b, tok, scenes, _config(1), engine=ForcingEngine(JaxEngine(model_b, tok), tok),
               references=ref, prompts=PROMPTS, out_dir=tmp_path / "b", progress=False)
    model_c, _, _, _ = _setup()
    grpo_train(model_c, tok, scenes, _config(2), engine=ForcingEngine(JaxEngine(model_c, tok), tok),
               references=ref, prompts=PROMPTS, out_dir=tmp_path / "b", resume=True, progress=False)
    b = read_jsonl(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2]
    for key in ("loss", "kl", "reward_mean", "grad_norm", "generated_tokens"):
        np.testing.assert_allclose([r[key] for r in b], [r[key] for r in h], rtol=1e-4, atol=1e-6)
    for x, y in zip(_lora(model_a), _lora(model_c)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


def test_sampler_logprobs_at_temperature_must_match_the_trainer():
    """recompute_old_logprobs=False below T = 1 needs 'processed' sampler log-probs without
    filters, else pi_old would be a different distribution from the trainer's."""
    def config(**sampling):
        rollout = RolloutConfig(sampling=SamplingParams(max_new_tokens=8, **sampling))
        return GRPOConfig(rollout=rollout, recompute_old_logprobs=False)

    with pytest.raises(ValueError, match="processed"):
        config(temperature=0.7)
    with pytest.raises(ValueError, match="processed"):
        config(temperature=0.7, logprobs_mode="processed", top_k=20)
    assert config(temperature=0.7, logprobs_mode="processed").logprob_temperature == 0.7
    assert config(temperature=1.0).logprob_temperature == 1.0
    assert config(temperature=0.0).logprob_temperature == 1.0  # greedy rollouts: plain log pi


def test_degenerate_groups_are_dropped_and_an_empty_step_skips_the_update():
    """A random policy never writes a parseable answer: every group has equal rewards, so with
    drop_degenerate_groups the step skips the update and leaves the adapters untouched; with
    forced good answers both groups carry signal and are kept."""
    model, tok, scenes, ref = _setup()
    lora0 = _lora(model)
    calls = []
    out = grpo_train(model, tok, scenes, _config(1, drop_degenerate_groups=True), references=ref,
                     prompts=PROMPTS, progress=False, on_step=lambda state, record: calls.append((state.step, record)))
    rec = out.history[0]
    assert calls == [(1, rec)]  # the per-step hook (e.g. weight sync to a remote engine) saw the step
    assert rec["skipped_update"] == 1.0 and rec["groups_kept"] == 0 and rec["optimizer_steps"] == 0
    assert rec["format_rate"] == 0.0
    assert all(np.array_equal(a, b) for a, b in zip(lora0, _lora(model)))
    assert out.state.step == 1  # the step still counts (data position and PRNG advance)

    forced = grpo_train(model, tok, scenes, _config(1, drop_degenerate_groups=True), references=ref,
                        engine=ForcingEngine(JaxEngine(model, tok), tok), prompts=PROMPTS, progress=False)
    rec = forced.history[0]
    assert rec["skipped_update"] == 0.0 and rec["groups_kept"] == 2 and rec["optimizer_steps"] == 4
    assert max(np.abs(a - b).max() for a, b in zip(lora0, _lora(model))) > 1e-4


@pytest.mark.slow
def test_a_nan_loss_stops_grpo_at_its_step_after_keeping_the_last_finite_checkpoint(tmp_path):
    """A frozen base weight goes bad: the trained adapters stay finite, the loss and gradients
    do not. The run stops at step 1 naming the quantity; the initial adapters are the kept
    checkpoint. With skip_nonfinite the update is dropped and the adapters never change."""
    import os

    from jax_drive.rl.checkpoint import committed_steps
    from jax_drive.rl.loop import NonFiniteError

    model, tok, scenes, ref = _setup()
    engine = ForcingEngine(JaxEngine(model, tok), tok)  # finite rollouts from the forced half
    model.layers.q_proj.kernel.set_value(jnp.full_like(model.layers.q_proj.kernel[...], jnp.nan))
    lora0 = _lora(model)
    with pytest.raises(NonFiniteError, match=r"grpo step 1: (loss|grad_norm|kl) is nan .*checkpoint 0"):
        grpo_train(model, tok, scenes, _config(2, checkpoint_every=1), references=ref, engine=engine,
                   prompts=PROMPTS, progress=False, out_dir=str(tmp_path / "stop"))
    assert committed_steps(os.path.join(tmp_path, "stop", "checkpoints")) == [0]
    assert all(np.array_equal(a, b) for a, b in zip(lora0, _lora(model)))

    base = _config(2)
    skip = dataclasses.replace(base, optim=dataclasses.replace(base.optim, skip_nonfinite=True))
    out = grpo_train(model, tok, scenes, skip, references=ref, engine=engine, prompts=PROMPTS, progress=False)
    assert out.state.step == 2 and [r["skipped_nonfinite"] for r in out.history] == [1.0, 1.0]
    assert all(np.array_equal(a, b) for a, b in zip(lora0, _lora(model)))
