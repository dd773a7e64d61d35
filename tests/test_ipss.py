"""MTDrive's IPSS / IPTC in our trainer (jax_drive.rl.streaming): log-probs of finished rows
computed while the others generate, with each group's prompt computed once, must equal the
plain path (one padded batch after the rollout) to 1e-5, and a GRPO step with them must make
the same update."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_drive.models.lora import lora_projections
from jax_drive.models.tiny import byte_tokenizer, tiny_policy
from jax_drive.rl.grpo import GRPOConfig, _compiled, batch_logprobs, build_train_batch, grpo_train
from jax_drive.rl.loss import LossConfig
from jax_drive.rl.optim import OptimConfig, split_model
from jax_drive.rl.streaming import RowLogprobs, StreamConfig, prompt_length, rows_to_batch
from jax_drive.rollout import RolloutConfig, run_rollouts
from jax_drive.sampling import JaxEngine, SamplingParams
from jax_drive.scenes import stack_scenes, straight_road_scene
from test_rl_e2e import ForcingEngine, _config, _setup
from test_rollout import SCRIPT, SPEED, ScriptedEngine, _reference

G = 3


@pytest.fixture(scope="module")
def scripted():
    """A scripted 2-scene x G 3 rollout (rows stop after 1, 2 or 3 turns) and the reports
    of the on_finished hook."""
    tok = byte_tokenizer()
    scenes = stack_scenes([straight_road_scene(scene_id=i, ego_speed=SPEED) for i in range(2)])
    reports = []
    cfg = RolloutConfig(group_size=G, max_turns=3, sampling=SamplingParams(max_new_tokens=200))
    result = run_rollouts(ScriptedEngine(tok, SCRIPT), tok, scenes, jax.random.key(0), cfg, reference=_reference(2),
                          prompts=["plan scene 0", "plan scene 1"],
                          on_finished=lambda rows, ts: reports.append((rows, ts)))
    return tok, scenes, result, reports


@pytest.fixture(scope="module")
def policies():
    """A tiny LoRA policy (random B: adapters change the outputs) and a reference state."""
    model, _, _ = tiny_policy(seed=3, lora_rank=4)
    for i, proj in enumerate(lora_projections(model).values()):
        proj.lora_b.set_value(jax.random.normal(jax.random.key(i), proj.lora_b.shape) * 0.3)
    graphdef, params, rest = split_model(model, "lora")
    ref = jax.tree.map(lambda x: x * 0.5, params)
    return graphdef, params, rest, ref


def test_the_hook_reports_each_row_once_when_it_stops(scripted):
    _, _, result, reports = scripted
    rows = [r for batch, _ in reports for r in batch]
    assert sorted(rows) == list(range(2 * G))
    turns = result.num_turns.reshape(-1)
    # reported after the turn the row stopped in, in turn order, with its final transcript
    assert [sorted(batch) for batch, _ in reports] == [
        sorted(np.flatnonzero(turns == j + 1).tolist()) for j in range(3) if (turns == j + 1).any()]
    for batch, transcripts in reports:
        for r, t in zip(batch, transcripts):
            final = result.rows[r]
            assert np.array_equal(t.tokens, final.tokens) and np.array_equal(t.turn_ids, final.turn_ids)


def test_rows_that_cannot_start_are_reported_before_the_first_turn():
    tok = byte_tokenizer()
    scenes = stack_scenes([straight_road_scene(scene_id=0, ego_speed=SPEED)])
    reports = []
    cfg = RolloutConfig(group_size=2, max_turns=2, sampling=SamplingParams(max_new_tokens=200), max_context_tokens=50)
    engine = ScriptedEngine(tok, SCRIPT)
    run_rollouts(engine, tok, scenes, jax.random.key(0), cfg, reference=_reference(1), prompts=["plan scene 0"],
                 on_finished=lambda rows, ts: reports.append(rows))
    assert reports == [[0, 1]] and engine.calls == []


def _plain(policies, result, temperature=1.0):
    """The default path: one padded batch, trainer log-probs under each policy."""
    graphdef, params, rest, ref = policies
    adv = np.zeros(result.pdms.shape, np.float32)
    batch = build_train_batch(result, adv, 0, bucket_size=64)
    _, logp_fn = _compiled(graphdef, LossConfig(), 256, OptimConfig(), temperature)
    arrays = {k: jnp.asarray(v) for k, v in batch.items()}
    return batch, {name: np.asarray(batch_logprobs(logp_fn, p, rest, arrays, 8))
                   for name, p in (("old_logp", params), ("ref_logp", ref))}, logp_fn


@pytest.mark.parametrize("background,share_prefix", [(True, True), (True, False), (False, True)],
                         ids=["ipss+iptc", "ipss", "iptc"])
def test_streamed_and_shared_logprobs_equal_the_plain_batch(scripted, policies, background, share_prefix):
    _, _, result, reports = scripted
    graphdef, params, rest, ref = policies
    batch, plain, logp_fn = _plain(policies, result, temperature=0.7)
    rows = RowLogprobs(graphdef, rest, {"old_logp": params, "ref_logp": ref},
                       StreamConfig(background=background, share_prefix=share_prefix, group_size=G, bucket_size=64,
                                    chunk_size=256, temperature=0.7), logp_fn)
    for batch_rows, transcripts in reports:  # as the hook hands them over
        rows.submit(batch_rows, transcripts)
    values = rows.results()
    rows.close()
    mask = batch["loss_mask"] > 0
    assert mask.sum() > 50
    shape = batch["input_ids"].shape
    for name in ("old_logp", "ref_logp"):
        got = rows_to_batch([values[name][r] for r in range(2 * G)], shape[1], shape[0])
        np.testing.assert_allclose(got[mask], plain[name][mask], atol=1e-5)
        # every position after the prompt (feedback tokens included) is scored alike
        for r, t in enumerate(result.rows):
            p = prompt_length(t.turn_ids)
            np.testing.assert_allclose(values[name][r][p:], plain[name][r, p - 1:len(t.tokens) - 1], atol=1e-5)
    assert np.abs(plain["old_logp"][mask] - plain["ref_logp"][mask]).max() > 1e-2  # two distinct policies


def test_group_prefix_is_computed_once_per_group_and_released(scripted, policies):
    _, _, result, reports = scripted
    graphdef, params, rest, _ = policies
    _, _, logp_fn = _plain(policies, result)
    rows = RowLogprobs(graphdef, rest, {"old_logp": params}, StreamConfig(group_size=G, bucket_size=64), logp_fn)
    calls = []
    inner = rows._prefix_fn
    rows._prefix_fn = lambda p, r, b: calls.append(b["ids"].shape) or inner(p, r, b)
    for batch_rows, transcripts in reports:  # chunk by chunk, in the worker thread
        rows.submit(batch_rows, transcripts)
    rows.results()
    rows.close()
    assert len(reports) == 3 and len(calls) == 1 and calls[0][0] == 2  # both groups' prompts, once
    assert rows._prefixes == {}  # every group finished: its caches were dropped


@pytest.mark.slow
def test_a_grpo_step_with_ipss_and_iptc_makes_the_plain_update():
    finals, records = [], []
    for stream, share in ((False, False), (True, True), (False, True)):
        model, tok, scenes, ref = _setup()
        cfg = _config(1, stream_logprobs=stream, share_prompt_prefix=share, checkpoint_every=None)
        start = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
        result = grpo_train(model, tok, scenes, cfg, engine=ForcingEngine(JaxEngine(model, tok), tok), references=ref,
                            prompts=["plan scene 0", "plan scene 1"], progress=False)
        finals.append([np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))])
        records.append(result.history[-1])
    plain = np.concatenate([(a - b).ravel() for a, b in zip(finals[0], start)])
    assert np.abs(plain).max() > 1e-3  # the update is not empty
    for other, record in zip(finals[1:], records[1:]):
        update = np.concatenate([(a - b).ravel() for a, b in zip(other, start)])
        # the same update up to the log-probs' float rounding (Adam rescales tiny gradients)
        assert np.linalg.norm(update - plain) <= 1e-4 * np.linalg.norm(plain)  # measured: 1.6e-5
        for key in ("loss", "kl", "pg_loss", "logp_mismatch", "ratio_mean"):
            assert record[key] == pytest.approx(records[0][key], abs=1e-5), key


def test_streaming_refuses_prompts_with_images():
    from jax_drive.text.prompts import PromptConfig

    rollout = RolloutConfig(prompt=PromptConfig(perception="image"))
    for flags in ({"stream_logprobs": True}, {"share_prompt_prefix": True}):
        with pytest.raises(ValueError, match="text rows only"):
            GRPOConfig(rollout=rollout, **flags)
    assert not GRPOConfig(rollout=rollout).stream_logprobs  # the plain pass takes images
