"""mtGRPO of the CoLMDriver negotiator (jax_drive.coop.negotiation.rl): episode groups, rounds as
turns with hand-computed rewards and advantages, one actor call per round around a real
engine, and recorded log-probs equal to the trainer's."""

import jax
import numpy as np
import pytest

from jax_drive.coop.negotiation import LLMNegotiator, RoundsConfig
from jax_drive.coop.negotiation.consensus import CONSENSUS_SCORES
from jax_drive.coop.negotiation.policy import NegotiationConfig
from jax_drive.coop.negotiation.rl import (NegotiationRLConfig, ReplyTokens, TrainedActor, group_copies,
                                           negotiation_mtgrpo_train, reply_advantages, rollout_groups,
                                           training_episodes, turn_rewards)
from jax_drive.rl.advantages import AdvantageConfig
from jax_drive.rl.loss import LossConfig
from jax_drive.rl.optim import OptimConfig

TYPES = ("ic_straight_straight", "ic_straight_left")
WEIGHTS = (3.0, 5.0, 2.0)


def test_training_stream_and_groups_share_the_initial_state():
    eps = training_episodes(TYPES, (100, 101), 0, 6)
    assert [(e.type, e.seed, e.k) for e in eps] == [
        (TYPES[0], 100, 0), (TYPES[1], 100, 0), (TYPES[0], 101, 0), (TYPES[1], 101, 0),
        (TYPES[0], 100, 1), (TYPES[1], 100, 1)]
    assert [e.accident_prone for e in eps] == [True] * 4 + [False] * 2
    assert training_episodes(TYPES, (100, 101), 4, 2) == eps[4:]  # the stream resumes where it stopped
    copies = group_copies([eps[0], eps[3]], 3)
    assert [(c.type, c.seed) for c in copies] == [(TYPES[0], 100)] * 3 + [(TYPES[1], 101)] * 3
    data = [np.asarray(jax.random.key_data(c.key)) for c in copies]
    assert all(np.array_equal(data[0], d) for d in data[:3]) and not np.array_equal(data[0], data[3])


def _log():
    rnd = lambda r, q: {"round": r, "quality": q}  # noqa: E731
    return [{"episode": 0, "time": 0.2, "vids": [1, 2], "rounds": [rnd(0, 5.0), rnd(1, 10.0)]},
            {"episode": 1, "time": 0.2, "vids": [1, 2], "rounds": [rnd(0, 0.0)]},
            {"episode": 3, "time": 0.2, "vids": [1, 2], "rounds": [rnd(0, 10.0)]},
            {"episode": 3, "time": 1.0, "vids": [3, 4], "rounds": [rnd(0, 2.0)]}]


def test_turn_rewards_by_hand():
    rewards, mask, index = turn_rewards(_log(), np.asarray([50.0, 100.0, 80.0, 0.0]), 2, WEIGHTS)
    # reward = quality / 10 + DS / 100 on every round of the episode
    np.testing.assert_allclose(rewards.reshape(4, 2), [[1.0, 1.5], [1.0, 0.0], [0.0, 0.0], [1.0, 0.2]], rtol=1e-6)
    assert mask.reshape(4, 2).tolist() == [[True, True], [True, False], [False, False], [True, True]]
    assert rewards.shape == (2, 2, 2)
    assert index[(3, 1.0, (3, 4), 0)] == (3, 1) and index[(0, 0.2, (1, 2), 1)] == (0, 1)
    weighted, _, _ = turn_rewards(_log(), np.asarray([50.0, 100.0, 80.0, 0.0]), 2, WEIGHTS, 2.0, 0.0)
    np.testing.assert_allclose(weighted.reshape(4, 2)[0], [1.0, 2.0], rtol=1e-6)
    with pytest.raises(ValueError, match="groups of 2"):
        turn_rewards(_log(), np.zeros(3), 2, WEIGHTS)


def _reply(episode, t, vids, rnd):
    return ReplyTokens(episode=episode, time=t, vids=vids, round=rnd, member=0, prompt_ids=(1, 2), answer_ids=(3,),
                       logprobs=(-0.5,), finish_reason="stop")


def test_reply_advantages_by_hand_cross_turn():
    config = NegotiationRLConfig(types=TYPES, group_size=2, advantage=AdvantageConfig(mode="mtgrpo_cross"))
    records = [_reply(0, 0.2, (1, 2), 1), _reply(0, 0.2000001, (1, 2), 0), _reply(1, 0.2, (1, 2), 0),
               _reply(3, 0.2, (1, 2), 0), _reply(3, 1.0, (3, 4), 0)]
    adv, _, _ = reply_advantages(records, _log(), np.asarray([50.0, 100.0, 80.0, 0.0]), 2, config)
    # group 0: turns 1.0, 1.5, 1.0 (mean 7/6, unbiased std 0.288675); group 1: 1.0, 0.2
    np.testing.assert_allclose(adv, [1.154701, -0.577350, -0.577350, 0.707107, -0.707107], atol=1e-5)
    with pytest.raises(ValueError, match="no round in the negotiation log"):
        reply_advantages([_reply(2, 0.2, (1, 2), 0)], _log(), np.asarray([50.0, 100.0, 80.0, 0.0]), 2, config)


class CountingEngine:
    """A real engine, its generate_chat calls and rows counted."""

    def __init__(self, engine):
        self.engine, self.calls, self.rows = engine, 0, []
        self.tokenizer, self.model = engine.tokenizer, engine.model

    def generate_chat(self, conversations, params, key):
        self.calls += 1
        self.rows.append(len(conversations))
        return self.engine.generate_chat(conversations, params, key)


@pytest.fixture(scope="module")
def tiny():
    from jax_drive.pipelines.engines import ModelSpec, load_model
    from jax_drive.sampling import JaxEngine

    model, tokenizer = load_model(ModelSpec("tiny"))
    critic_model, critic_tokenizer = load_model(ModelSpec("tiny"))
    critic = LLMNegotiator(JaxEngine(critic_model, critic_tokenizer), constrain_answers=True,
                           consensus_scores=CONSENSUS_SCORES, consensus_tokens=40, actor_tokens=12)
    return model, tokenizer, critic


def _config(**kw):
    base = dict(types=TYPES, group_size=2, groups_per_step=2, steps=1, actor_tokens=12, max_time=4.0,
                negotiation=NegotiationConfig(rounds=RoundsConfig(max_rounds=2)), loss=LossConfig(kl_coef=0.0),
                optim=OptimConfig(learning_rate=1e-3, trainable="full"), minibatch_size=8, checkpoint_every=None)
    return NegotiationRLConfig(**(base | kw))


def test_one_actor_call_per_round_for_every_group_of_every_episode(tiny):
    from jax_drive.sampling import JaxEngine

    model, tokenizer, critic = tiny
    config = _config()
    engine = CountingEngine(JaxEngine(model, tokenizer))
    actor = TrainedActor(engine, critic, config.answer_sampling(), key=jax.random.key(3))
    episodes = training_episodes(TYPES, (100,), 0, 2)
    _, policy = rollout_groups(actor, config, episodes)
    assert policy.log, "the accident-prone episodes must negotiate"
    rounds_per_decision = {}
    for rec in policy.log:  # all groups of all episodes at one decision speak round r in one call
        rounds_per_decision[rec["decision"]] = max(rounds_per_decision.get(rec["decision"], 0), len(rec["rounds"]))
    assert engine.calls == actor.actor_calls == sum(rounds_per_decision.values())
    messages = sum(len(rec["conversation"]) for rec in policy.log)
    assert sum(engine.rows) == len(actor.records) == messages
    assert {r.episode for r in actor.records} <= set(range(4))
    assert all(len(r.answer_ids) == len(r.logprobs) > 0 for r in actor.records)


def test_recorded_log_probs_are_the_trainers_a_step_trains_and_a_run_resumes(tiny, tmp_path):
    from jax_drive.rl.logging import read_jsonl

    model, tokenizer, critic = tiny
    result = negotiation_mtgrpo_train(model, tokenizer, critic, _config(max_rows=24), out_dir=tmp_path,
                                      progress=False)
    record = result.history[0]
    assert record["replies"] > 0 and record["rows_trained"] > 0 and record["optimizer_steps"] > 0
    # the trainer's log pi_old under the reply grammar's masks equals the sampler's, per token
    assert record["logp_mismatch"] < 1e-5
    assert np.isfinite(record["loss"]) and record["grad_norm"] > 0
    # a larger budget continues from the checkpoint: only step 2 runs, on the next episodes
    more = negotiation_mtgrpo_train(model, tokenizer, critic, _config(max_rows=24, steps=2), out_dir=tmp_path,
                                    resume=True, progress=False)
    assert [h["step"] for h in more.history] == [2] and int(more.state.data_position) == 4
    assert [h["step"] for h in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]


def test_stated_intent_critic_reads_what_the_members_said():
    from jax_drive.coop.negotiation import GroupTalk
    from jax_drive.coop.negotiation.critic import parse_consensus, parse_sum_actions
    from jax_drive.coop.negotiation.teacher import StatedIntentCritic

    def group(texts, edges):
        g = GroupTalk(episode=0, time=0.0, slots=[0, 1, 2], vids=[1, 2, 3], infos=[], default={}, speeds={},
                      edges=edges)
        g.conversation = [(0, v, t) for v, t in zip([1, 2, 3], texts)]
        return g

    critic = StatedIntentCritic()
    settled = group(["I will stop; 2 go faster.", "I will go first and faster.", "hello"], [(1, 2), (2, 3)])
    summed = parse_sum_actions(critic.sum_actions([settled])[0], [1, 2, 3])
    assert summed.intents == {1: 0, 2: 3} and summed.missing == (3,)  # STOP, FASTER; 3 stated nothing
    # pair (1, 2): one side yields; pair (2, 3): nobody does -> 25 + 70 / 2
    assert parse_consensus(critic.consensus([settled])[0])[0] == pytest.approx(0.60)
    everyone = group(["I will stop.", "I will slow down.", "I will stop."], [(1, 2)])
    assert parse_consensus(critic.consensus([everyone])[0])[0] == pytest.approx(0.25)
    assert parse_consensus(critic.consensus([group(["I will stop."] * 3, [])])[0])[0] == pytest.approx(0.90)


def test_config_refuses_what_it_cannot_train():
    with pytest.raises(ValueError, match="types"):
        NegotiationRLConfig()
    with pytest.raises(ValueError, match="must negotiate"):
        NegotiationRLConfig(types=TYPES, negotiation=NegotiationConfig(negotiate=False))
    with pytest.raises(ValueError, match="parallel"):
        NegotiationRLConfig(types=TYPES, negotiation=NegotiationConfig(rounds=RoundsConfig(turns="sequential")))
    with pytest.raises(ValueError, match="temperature"):
        NegotiationRLConfig(types=TYPES, temperature=0.0)


def test_interdrive_rl_stage_trains_evaluates_pairs_and_reuses(tmp_path):
    """The smoke preset's pipeline through the rl stage: data, SFT, one mtGRPO step, evaluation of
    the trained actor paired with arm (5) of the SFT negotiator; a second run reuses it all; a
    changed RL setting is refused rather than resumed from another run's checkpoints."""
    import json
    import os
    import sys

    from jax_drive.runinfo import InputError

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
    import interdrive as script

    work, out = tmp_path / "w", tmp_path / "id.json"
    common = ["--preset", "smoke", "--work-dir", str(work), "--json", str(out), "--no-progress"]
    for stage in ("data", "sft", "rl"):
        assert script.main(common + ["--stage", stage]) == 0
    report = json.loads((tmp_path / "id_rl.json").read_text())
    assert report == json.loads((work / "rl" / "summary.json").read_text())
    assert report["curves"]["0"][0]["step"] == 1 and report["plot"] == str(tmp_path / "id_rl.png") and "meta" in report
    assert os.path.exists(report["plot"]) and len(report["rows"]["mtgrpo_seed0"]) == 2
    assert report["sft"]["seeds"] == 1 and report["mtgrpo"]["seeds"] == 1
    for key in ("ds_diff", "sr_diff"):
        diff = report["mtgrpo_vs_sft"][key]
        assert diff["episodes"] == 2 and diff["ci95"][0] <= diff["mean"] <= diff["ci95"][1]
    start = json.loads((work / "rl" / "start.json").read_text())
    assert {r["tag"] for r in start["rows"]} == {"ic_straight_straight/0/0/nobg", "ic_straight_left/0/0/nobg"}
    seed0 = json.loads((work / "rl" / "seed0" / "eval.json").read_text())
    assert seed0["steps"] == 1 and len(seed0["rows"]) == 2 and seed0["train"]["logp_mismatch"] < 1e-5
    assert {r["tag"] for r in seed0["rows"]} == {"ic_straight_straight/0/0/nobg", "ic_straight_left/0/0/nobg"}
    stamps = [os.path.getmtime(work / "rl" / name) for name in ("start.json", "seed0/eval.json")]
    assert script.main(common + ["--stage", "rl"]) == 0
    # reused, not evaluated or trained again
    assert [os.path.getmtime(work / "rl" / name) for name in ("start.json", "seed0/eval.json")] == stamps
    with pytest.raises(InputError, match="only rl.steps"):
        script.main(common + ["--stage", "rl", "--set", "rl.learning_rate=0.01"])
    with pytest.raises(InputError, match="rl.steps >= 1"):
        script.main(common + ["--stage", "rl", "--set", "rl.steps=0"])
