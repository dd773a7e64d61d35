"""The negotiating driving loop in the simulator: the rule-based teacher resolves an
accident-prone crossing that the intention planner alone crashes in; a language model
behind a real engine is called once per round for the groups of every episode."""

import jax
import numpy as np
import pytest

from jax_drive.coop.negotiation import (
    CONTROL_5HZ,
    LLMNegotiator,
    NegotiatingPolicy,
    NegotiationConfig,
    RecordingNegotiator,
    RoundsConfig,
    RuleTeacher,
    TeacherConfig,
)
from jax_drive.coop.negotiation.critic import parse_sum_actions
from jax_drive.coop.runner import run_episodes
from jax_drive.sampling import JaxEngine
from jax_drive.sim.actions import SpeedIntent
from jax_drive.sim.state import Cmd
from coop_tiny import CountingEngine, tiny_policy

KEY = jax.random.fold_in(jax.random.key(0), 0)


def _run(policy, name="ic_straight_straight", n=1, max_time=None):
    return run_episodes([name] * n, [KEY] * n, accident_prone=[True] * n, policy=policy, cfg=CONTROL_5HZ,
                        max_time=max_time, record=False)[0]


def test_teacher_negotiation_avoids_the_crash_the_planner_alone_has():
    alone = _run(NegotiatingPolicy(None, NegotiationConfig(negotiate=False)))[0]
    assert any(o.outcome == "collision" for o in alone.outcomes)
    policy = NegotiatingPolicy(RuleTeacher(), NegotiationConfig())
    talked = _run(policy)[0]
    assert [o.outcome for o in talked.outcomes] == ["success", "success"] and talked.metrics["DS"] == 100.0
    first = policy.log[0]
    assert first["vids"] and len(first["rounds"]) >= 1 and first["edges"]
    # one of the two yields, the other goes faster
    assert sorted(first["intents"].values()) in (["FASTER", "SLOWER"], ["FASTER", "STOP"])
    assert talked.messages_sent == len(first["conversation"]) + sum(len(r["conversation"]) for r in policy.log[1:])
    assert any("202" in text or "201" in text for _, _, text in talked.message_log)


def test_teacher_answers_parse_and_corrupted_rounds_are_criticised():
    rec = RecordingNegotiator(RuleTeacher(TeacherConfig(corrupt_prob=1.0, seed=3)))
    policy = NegotiatingPolicy(rec, NegotiationConfig())
    _run(policy, max_time=12.0)
    kinds = {e["kind"] for e in rec.examples}
    assert kinds == {"actor", "sum", "consensus"}
    for e in rec.examples:
        assert e["messages"][-1]["role"] == "assistant" and e["messages"][-2]["role"] == "user"
        if e["kind"] == "sum":
            vids = [int(v) for v in e["messages"][-2]["content"].split(" said")[0].split()[1:] if v.strip(",").isdigit()
                    for v in [v.strip(",")]]
            assert parse_sum_actions(e["messages"][-1]["content"], vids).ok
    # the recording marks exactly the first-round actor answers as deliberately wrong
    actor = [e for e in rec.examples if e["kind"] == "actor"]
    assert {e["round"] == 0 for e in actor} == {True, False}
    assert all(e["wrong"] == (e["round"] == 0) for e in actor)
    first = policy.log[0]["rounds"]
    # every first round is deliberately wrong: low consensus and feedback; a later round fixes it
    assert first[0]["consensus"] < 0.8 and first[0]["feedback"]
    assert len(first) >= 2 and first[-1]["consensus"] >= 0.8


def test_llm_round_is_one_engine_call_for_both_episodes():
    model, _, tokenizer = tiny_policy(seed=0, lora_rank=None)
    engine = CountingEngine(JaxEngine(model, tokenizer))
    neg = LLMNegotiator(engine, "compact", actor_tokens=6, sum_tokens_per_member=2, consensus_tokens=6)
    policy = NegotiatingPolicy(neg, NegotiationConfig(rounds=RoundsConfig(critic=False, consensus=False)))
    results = _run(policy, name="ic_straight_straight", n=2, max_time=6.0)
    assert len(results) == 2
    assert policy.log, "the accident-prone crossing must form a conflict group"
    # both (identical) episodes negotiate at the same decisions; each negotiation is one actor
    # call with every speaker of both episodes, then one sum-actions call
    decisions = sorted({rec["decision"] for rec in policy.log})
    per_decision = [[r for r in policy.log if r["decision"] == d] for d in decisions]
    assert all(sorted(r["episode"] for r in recs) == [0, 1] for recs in per_decision)
    expected = []
    for recs in per_decision:
        expected += [sum(len(r["vids"]) for r in recs), len(recs)]
    assert engine.calls == expected
    assert neg.usage.calls == {"actor": len(decisions), "sum": len(decisions), "consensus": 0}


def test_held_outcome_overrides_the_planner_and_commands_waypoints():
    from jax_drive.coop.episodes import EpisodeBatch

    policy = NegotiatingPolicy(RuleTeacher(), NegotiationConfig())
    batch = EpisodeBatch(["ic_straight_straight"], [KEY], [True], cfg=CONTROL_5HZ)
    for _ in range(60):
        obs = batch.observe()
        step = batch.decision_batch(obs, np.array([0]))
        out = policy.decide(step)
        batch.advance(out, np.array([0]))
        if policy.log:
            break
    assert policy.log, "no negotiation within 12 s"
    live = np.flatnonzero(step.views[0]["role"] == 0)
    assert (out.command[0, live] == Cmd.WAYPOINTS).all() and out.waypoints.shape[-2:] == (20, 2)
    held = {int(step.views[0]["vehicle_id"][s]): int(policy.held[0, s]) for s in live}
    rec = policy.log[-1]
    for vid, name in rec["intents"].items():
        assert SpeedIntent[name] == held[int(vid)] or held[int(vid)] < SpeedIntent[name]  # capped, never raised
    assert np.asarray(policy.state.holding(np.float32(step.time)))[0, live].all()


@pytest.mark.parametrize("turns", ["sequential"])
def test_sequential_turns_in_the_loop(turns):
    policy = NegotiatingPolicy(RuleTeacher(), NegotiationConfig(rounds=RoundsConfig(turns=turns)))
    res = _run(policy)[0]
    assert res.metrics["DS"] == 100.0 and policy.log
