"""Multi-turn rollout control flow with a scripted engine (a deterministic test double that
returns fixed answers), scored by the real PDM scorer on hand-built scenes."""

import jax
import numpy as np
import pytest

from jax_drive.rollout import FORMAT_FEEDBACK, RolloutConfig, run_rollouts, summarize
from jax_drive.rollout.multiturn import ChatContinuation
from jax_drive.models.tiny import byte_tokenizer
from jax_drive.sampling import Completion, SamplingParams
from jax_drive.scenes import stack_scenes, straight_road_scene
from jax_drive.text import format_trajectory

SPEED = 10.0
GOOD = format_trajectory(np.stack([SPEED * 0.5 * np.arange(1, 9), np.zeros(8), np.zeros(8)], -1))
OFFROAD = format_trajectory(np.stack([SPEED * 0.5 * np.arange(1, 9), 3.0 * np.arange(1, 9), np.full(8, 0.5)], -1))
GARBAGE = "I would drive carefully."

# SCRIPT[scene][turn] = answers for the rows of that scene still running, in row order
SCRIPT = {
    0: [[GOOD, OFFROAD, GARBAGE], [GOOD, GARBAGE], [GOOD]],
    1: [[OFFROAD, GOOD, OFFROAD], [OFFROAD, GOOD], [OFFROAD]],
}


class ScriptedEngine:
    """Deterministic engine double: answers from SCRIPT, keyed by the scene named in the
    prompt and the number of assistant turns already in the context."""

    def __init__(self, tokenizer, script):
        self.tok = tokenizer
        self.script = script
        self.calls = []

    def generate(self, prompts, params, key):
        self.calls.append(len(prompts))
        seen = {}
        out = []
        for ids in prompts:
            text = self.tok.decode(list(ids), skip_special_tokens=False)
            scene = int(text.split("scene ")[1][0])
            turn = text.count("<|im_start|>assistant") - 1
            k = seen.get((scene, turn), 0)
            seen[(scene, turn)] = k + 1
            answer = self.script[scene][turn][k]
            gen = self.tok.encode(answer) + [self.tok.eos_token_ids[0]]
            out.append(Completion(tuple(ids), tuple(gen), answer, tuple([-0.5] * len(gen)), "stop"))
        return out

    def generate_chat(self, conversations, params, key):  # pragma: no cover - protocol only
        raise NotImplementedError


def _reference(num):
    t = 0.1 * np.arange(1, 41)
    ref = np.stack([SPEED * t, np.zeros(40), np.zeros(40)], -1)
    return np.broadcast_to(ref, (num, 40, 3)).astype(np.float32)


@pytest.fixture(scope="module")
def rollout():
    tok = byte_tokenizer()
    scenes = stack_scenes([straight_road_scene(scene_id=i, ego_speed=SPEED) for i in range(2)])
    engine = ScriptedEngine(tok, SCRIPT)
    cfg = RolloutConfig(group_size=3, max_turns=3, sampling=SamplingParams(max_new_tokens=200))
    result = run_rollouts(engine, tok, scenes, jax.random.key(0), cfg, reference=_reference(2),
                          prompts=["plan scene 0", "plan scene 1"])
    return tok, engine, result


def test_turn_structure_and_stop_rules(rollout):
    _, engine, r = rollout
    assert engine.calls == [6, 4, 2]  # rows still running at each turn, one generate call per turn
    np.testing.assert_array_equal(r.num_turns, [[1, 2, 3], [3, 1, 2]])
    np.testing.assert_array_equal(r.turn_mask[..., 0], True)
    assert not r.turn_mask[0, 0, 1] and r.turn_mask[0, 2, 2]
    assert r.stop_reason[0, 0] == "no_violation" and r.stop_reason[0, 2] == "no_violation"
    assert r.stop_reason[1, 0] == "max_turns"


def test_scores_format_and_rewards(rollout):
    _, _, r = rollout
    # good answers: usable, format 1, drivable, high PDMS
    assert r.usable[0, 0, 0] and r.format[0, 0, 0] == 1.0 and r.scores["dac"][0, 0, 0] == 1.0
    assert r.pdms[0, 0, 0] > 0.5
    # off-road: DAC 0 -> PDMS 0 though the format is fine
    assert r.scores["dac"][0, 1, 0] == 0.0 and r.pdms[0, 1, 0] == 0.0 and r.format[0, 1, 0] == 1.0
    # garbage: not usable, format 0, PDMS 0
    assert not r.usable[0, 2, 0] and r.format[0, 2, 0] == 0.0 and r.pdms[0, 2, 0] == 0.0
    np.testing.assert_allclose(r.reward, (0.8 * r.pdms + 0.2 * r.format) * r.turn_mask, atol=1e-6)
    assert r.final_pdms[0, 2] == r.pdms[0, 2, 2] > 0.5
    assert np.all(r.pdms[~r.turn_mask] == 0)
    s = summarize(r)
    assert s["rollouts_per_turn"] == [6, 4, 2]
    assert s["turns_mean"] == pytest.approx(2.0)
    assert 0 < s["format_rate"] < 1


def test_rollout_reward_carries_the_improvement_bonus(rollout):
    """``RolloutConfig.improvement_weight`` reaches the rollout's rewards (same answers, same
    scores; later turns shifted by alpha times their gain)."""
    tok, _, plain = rollout
    scenes = stack_scenes([straight_road_scene(scene_id=i, ego_speed=SPEED) for i in range(2)])
    cfg = RolloutConfig(group_size=3, max_turns=3, sampling=SamplingParams(max_new_tokens=200), improvement_weight=1.0)
    shaped = run_rollouts(ScriptedEngine(tok, SCRIPT), tok, scenes, jax.random.key(0), cfg, reference=_reference(2),
                          prompts=["plan scene 0", "plan scene 1"])
    np.testing.assert_array_equal(shaped.pdms, plain.pdms)
    base = plain.reward
    gain = np.concatenate([np.zeros_like(base[..., :1]), base[..., 1:] - base[..., :-1]], axis=-1)
    np.testing.assert_allclose(shaped.reward, (base + gain) * plain.turn_mask, atol=1e-6)
    assert not np.allclose(shaped.reward, plain.reward)  # the script has turns that change their reward


def test_feedback_messages(rollout):
    _, _, r = rollout
    assert r.turns[0][0].feedback == ""  # good answer: nothing violated, rollout stops
    assert "DAC" in r.turns[1][0].feedback  # off-road: the PDM Agent lists the off-road points
    assert r.turns[2][0].feedback == FORMAT_FEEDBACK
    assert r.turns[3][2].feedback != ""  # last turn still violated, stopped by the budget


def test_tokens_are_the_conversation(rollout):
    tok, _, r = rollout
    cont = ChatContinuation.from_tokenizer(tok)
    for row, turns in enumerate(r.turns):
        scene = row // 3
        messages = [{"role": "user", "content": f"plan scene {scene}"}]
        for j, t in enumerate(turns):
            messages.append({"role": "assistant", "content": t.text})
            if j < len(turns) - 1:
                messages.append({"role": "user", "content": t.feedback})
        rendered = tok.apply_chat_template(messages, add_generation_prompt=False)
        text = tok.decode(r.tokens[row].tolist(), skip_special_tokens=False)
        assert rendered == text + cont.close[len("<|im_end|>"):]
        # generated spans decode to the answers (+ the stop token), nothing else carries a turn id
        for j, t in enumerate(turns):
            span = r.tokens[row][r.turn_ids[row] == j]
            assert tok.decode(span.tolist(), skip_special_tokens=False) == t.text + "<|im_end|>"
            np.testing.assert_allclose(r.sample_logprobs[row][r.turn_ids[row] == j], -0.5)
        assert r.turn_ids[row].max() == len(turns) - 1
        assert np.all(r.sample_logprobs[row][r.turn_ids[row] < 0] == 0)


def test_context_limit_stops_rows():
    tok = byte_tokenizer()
    scenes = stack_scenes([straight_road_scene(scene_id=i, ego_speed=SPEED) for i in range(2)])
    # room for the first answer but not for the feedback + a second answer
    cfg = RolloutConfig(group_size=3, max_turns=3, sampling=SamplingParams(max_new_tokens=200), max_context_tokens=260)
    r = run_rollouts(ScriptedEngine(tok, SCRIPT), tok, scenes, jax.random.key(0), cfg, reference=_reference(2),
                     prompts=["plan scene 0", "plan scene 1"])
    np.testing.assert_array_equal(r.num_turns, 1)
    assert r.stop_reason[0, 1] == "context" and r.stop_reason[0, 0] == "no_violation"
    with pytest.raises(ValueError):
        run_rollouts(ScriptedEngine(tok, SCRIPT), tok, scenes, jax.random.key(0), cfg, reference=_reference(2),
                     prompts=["only one"])


@pytest.mark.slow
def test_real_engine_tiny_random_model():
    """Through the real JaxEngine: a random policy writes garbage, gets the format feedback,
    uses every turn; the trainer's log-probs of the sampled tokens match the sampler's."""
    import jax.numpy as jnp

    from jax_drive.rl.advantages import AdvantageConfig, compute_advantages
    from jax_drive.rl.grpo import build_train_batch
    from jax_drive.models.tiny import tiny_policy
    from jax_drive.sampling import JaxEngine

    model, _, tok = tiny_policy(seed=0, lora_rank=4)  # same policy and shapes as test_rl_e2e (shared compiles)
    scenes = stack_scenes([straight_road_scene(scene_id=i, ego_speed=SPEED) for i in range(2)])
    cfg = RolloutConfig(group_size=3, max_turns=2, sampling=SamplingParams(max_new_tokens=12),
                        format_feedback="Use the [PT, ...] format.")
    r = run_rollouts(JaxEngine(model, tok), tok, scenes, jax.random.key(3), cfg, reference=_reference(2),
                     prompts=["plan scene 0", "plan scene 1"])
    assert r.pdms.shape == (2, 3, 2)
    np.testing.assert_array_equal(r.num_turns, 2)
    assert np.all(r.format == 0) and np.all(r.pdms == 0) and np.all(r.stop_reason == "max_turns")
    assert all(t.feedback == cfg.format_feedback for turns in r.turns for t in turns)
    assert r.num_generated_tokens > 0
    adv = compute_advantages(r.reward, r.turn_mask, AdvantageConfig())
    assert np.all(np.asarray(adv) == 0)  # equal rewards: no signal
    batch = build_train_batch(r, adv, tok.pad_token_id, bucket_size=64)
    logp = model.token_logprobs(*(jnp.asarray(batch[k]) for k in ("input_ids", "positions", "attention_mask", "targets")))
    m = batch["loss_mask"] > 0
    assert m.sum() == r.num_generated_tokens
    np.testing.assert_allclose(np.asarray(logp)[m], batch["old_logp"][m], atol=2e-4)
    # turn ids in the batch follow the targets
    assert set(np.unique(batch["turn_id"][m]).tolist()) == {0.0, 1.0}


def test_evaluate_multiturn_and_concat(rollout):
    from jax_drive.rollout import concat_results, evaluate_multiturn, select_scenes

    tok, _, r = rollout
    both = concat_results([r, r])
    assert both.pdms.shape == (4, 3, 3) and len(both.tokens) == 12
    assert summarize(both)["pdms_final"] == pytest.approx(summarize(r)["pdms_final"])
    scenes = stack_scenes([straight_road_scene(scene_id=i, ego_speed=SPEED) for i in range(2)])
    cfg = RolloutConfig(group_size=3, max_turns=3, sampling=SamplingParams(max_new_tokens=200))
    summary, res = evaluate_multiturn(ScriptedEngine(tok, SCRIPT), tok, scenes, cfg, references=_reference(2),
                                      prompts=["plan scene 0", "plan scene 1"], progress=False)
    np.testing.assert_array_equal(res.num_turns, r.num_turns)
    # select_scenes inverts concat_results: the second copy's scene 1 is r's scene 1.
    part = select_scenes(both, [3])
    np.testing.assert_array_equal(part.pdms, r.pdms[1:2])
    np.testing.assert_array_equal(part.stop_reason, r.stop_reason[1:2])
    assert [t.tolist() for t in part.tokens] == [t.tolist() for t in r.tokens[3:6]]
    assert part.turns == r.turns[3:6]
    assert summary["pdms_by_budget"][-1] == pytest.approx(summary["pdms_final"])
    assert summary["pdms_by_budget"][0] == pytest.approx(summary["pdms_first"])


def test_result_is_a_pytree_with_derived_fields(rollout):
    """Every leaf leads with (S, G); derived fields follow the turn mask; turn logs read the arrays."""
    _, _, r = rollout
    assert all(leaf.shape[:2] == (2, 3) for leaf in jax.tree.leaves(r))
    np.testing.assert_array_equal(r.num_turns, r.turn_mask.sum(-1))
    np.testing.assert_array_equal(r.final_pdms, r.pdms[np.arange(2)[:, None], np.arange(3)[None], r.num_turns - 1])
    log = r.turn_log(0, 2)
    assert [t["usable"] for t in log] == [False, False, True] and log[0]["text"] == GARBAGE
    assert log[2]["pdms"] == pytest.approx(float(r.pdms[0, 2, 2])) and log[0]["feedback"] == FORMAT_FEEDBACK


def test_train_batch_puts_each_turns_advantage_on_its_tokens(rollout):
    from jax_drive.rl.grpo import build_train_batch

    tok, _, r = rollout
    adv = np.random.default_rng(0).normal(size=r.pdms.shape).astype(np.float32)
    batch = build_train_batch(r, adv, tok.pad_token_id, bucket_size=64, multiple_of=4)
    assert batch["input_ids"].shape[0] == 8  # 6 rows padded to a multiple of 4
    for row, tid in enumerate(r.turn_ids):
        s, g = divmod(row, 3)
        targets = tid[1:]  # the batch is shifted: position t predicts token t + 1
        n = len(targets)
        np.testing.assert_array_equal(batch["turn_id"][row, :n], np.where(targets >= 0, targets, -1))
        want = np.where(targets >= 0, adv[s, g, np.clip(targets, 0, None)], 0.0)
        np.testing.assert_array_equal(batch["advantages"][row, :n], want)
        assert np.all(batch["advantages"][row, n:] == 0) and np.all(batch["turn_id"][row, n:] == -1)
    assert np.all(batch["advantages"][6:] == 0) and np.all(batch["turn_id"][6:] == -1)
