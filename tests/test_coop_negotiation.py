"""CoLMDriver negotiation: the sum-actions and consensus parsers (hostile output), the
critic's scores and feedback against hand-computed cases, the prompts, and the batching
of engine calls (one actor call per round for every speaker of every group of every
episode) counted around a real JaxEngine on the tiny random model."""

import json
import math

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jax_drive.coop.negotiation import critic as C
from jax_drive.coop.negotiation import prompts as P
from jax_drive.coop.negotiation.negotiate import (GroupTalk, LLMNegotiator, RoundsConfig, clean_message, negotiate,
                                                  shown_messages)
from jax_drive.models.tiny import tiny_policy
from jax_drive.sampling import JaxEngine
from jax_drive.sim.actions import NavIntent, SpeedIntent

from coop_tiny import CountingEngine

CLASSES = ["STOP", "SLOWER", "KEEP", "FASTER"]


# ------------------------------------------------------------------ sum actions
def test_sum_actions_clean_and_wrapped():
    vids = [201, 202]
    clean = '{"201": {"speed": "STOP"}, "202": {"speed": "FASTER"}}'
    for text in (clean, f"Sure! Here it is:\n```json\n{clean}\n```\nDone.", clean.replace("}}", "},}")):
        got = C.parse_sum_actions(text, vids)
        assert got.intents == {201: SpeedIntent.STOP, 202: SpeedIntent.FASTER} and got.ok and got.source == "json"


def test_sum_actions_key_and_value_variants():
    text = '{"Vehicle 201": "slower", "202": {"Speed": " keep "}, "999": {"speed": "STOP"}, "203": {"speed": "FAST"}}'
    got = C.parse_sum_actions(text, [201, 202, 203])
    assert got.intents == {201: SpeedIntent.SLOWER, 202: SpeedIntent.KEEP}
    assert got.missing == (203,) and not got.ok


def test_sum_actions_in_the_seeds_literal_formats():
    """The seed's listing asks for ``{'id': car_id, 'speed': category}`` (Python quotes, one
    object per car) next to a JSON example keyed by id; both are read."""
    vids = [201, 202]
    want = {201: SpeedIntent.STOP, 202: SpeedIntent.FASTER}
    for text in ("{'id': 201, 'speed': 'STOP'}, {'id': 202, 'speed': 'FASTER'}",
                 '[{"id": 201, "speed": "STOP"}, {"id": 202, "speed": "FASTER"}]',
                 "{'201': {'speed': 'STOP'}, '202': {'speed': 'FASTER'}}"):
        got = C.parse_sum_actions(text, vids)
        assert got.intents == want and got.ok, text


def test_sum_actions_falls_back_to_prose_and_reports_failure():
    got = C.parse_sum_actions("201 will STOP and vehicle 202: faster please", [201, 202])
    assert got.intents == {201: SpeedIntent.STOP, 202: SpeedIntent.FASTER} and got.source == "text"
    assert got.error == "no JSON object"
    none = C.parse_sum_actions("no idea", [201, 202])
    assert none.intents == {} and none.missing == (201, 202) and none.source == "none"
    assert C.parse_sum_actions(None, [1]).missing == (1,)
    assert C.parse_sum_actions('{"201": {"speed": "STOP"', [201]).error == "unclosed JSON object"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=400), st.binary(max_size=50), st.integers(), st.none(),
                 st.recursive(st.none() | st.booleans() | st.floats(allow_nan=True) | st.text(max_size=8),
                              lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                              max_leaves=10).map(json.dumps)))
def test_sum_actions_never_raises_on_hostile_output(text):
    vids = [201, 202, 203]
    got = C.parse_sum_actions(text, vids)
    assert set(got.intents) <= set(vids) and set(got.intents).isdisjoint(got.missing)
    assert set(got.intents) | set(got.missing) == set(vids)
    assert all(v in range(4) for v in got.intents.values())
    score, err = C.parse_consensus(text)
    assert (score is None) != (err is None) and (score is None or 0.0 <= score <= 1.0)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.integers(100, 999), st.sampled_from(CLASSES), min_size=1, max_size=6),
       st.text(alphabet="abc xyz.,:\n", max_size=30), st.text(alphabet="abc xyz.,:\n", max_size=30))
def test_sum_actions_roundtrip_inside_noise(actions, before, after):
    body = json.dumps({str(v): {"speed": c} for v, c in actions.items()})
    got = C.parse_sum_actions(before + body + after, list(actions))
    assert got.intents == {v: CLASSES.index(c) for v, c in actions.items()}


def test_keep_rule_and_consensus_parser():
    got = C.keep_rule({1: SpeedIntent.KEEP, 2: SpeedIntent.KEEP, 3: SpeedIntent.STOP}, {1: 3.9, 2: 4.0, 3: 0.0})
    assert got == {1: SpeedIntent.FASTER, 2: SpeedIntent.KEEP, 3: SpeedIntent.STOP}
    assert C.parse_consensus("Short analysis: agreed.\nConsensus score: 85") == (0.85, None)
    for marked in ("**Consensus Score**: 70", "Consensus score:** 70", "consensus score = 70", "CONSENSUS SCORE 70"):
        assert C.parse_consensus(marked) == (0.7, None), marked
    assert C.parse_consensus("Consensus score: 250") == (1.0, None)
    assert C.parse_consensus("Consensus score: 2500")[1] == "no consensus score"  # not read as 250
    assert C.parse_consensus("Consensus score: -40")[1] == "no consensus score"
    assert C.parse_consensus("they agree, 90")[1] == "no consensus score"


# -------------------------------------------------------------------- critic
def _lines(speeds, lateral, w=20, dt=0.2):
    """Parallel straight plans along x at the given speeds, ``lateral`` metres apart."""
    t = dt * np.arange(1, w + 1)
    return np.stack([np.stack([v * t, np.full(w, k * lateral)], -1) for k, v in enumerate(speeds)])


def test_safety_and_efficiency_by_hand():
    wp = _lines([8.0, 8.0], 3.2)  # constant 3.2 m apart
    s = C.pairwise_safety(wp)
    assert s[0, 1] == pytest.approx(1 / (1 + math.exp(-2 * (3.2 - 3.0))), rel=1e-5)
    assert C.efficiency_score(wp) == pytest.approx(1.0)
    slow = _lines([2.0, 0.0, 4.0], 10.0)
    assert C.efficiency_score(slow) == pytest.approx((2.0 + 0.0 + 4.0) / 3 / 8, rel=1e-6)
    with pytest.raises(ValueError, match="W >= 2"):
        C.efficiency_score(_lines([8.0], 0.0, w=1))
    with pytest.raises(ValueError):
        C.CriticConfig(efficiency_speed=0.0)


def test_feedback_and_quality_by_hand():
    vids = [201, 202, 203]
    safety = np.array([[1, 0.5, 0.9], [0.5, 1, 0.69], [0.9, 0.69, 1]])
    r = C.score_round(vids, safety, 0.3, 0.6, use_safety_efficiency=True, use_consensus=True)
    assert r.safety == 0.5 and r.pair_safety[(202, 203)] == 0.69
    assert r.feedback == (
        "Safety issue: Vehicle 201 and vehicle 202 may have conflict. Suggest one of them to yield, and another go "
        "pass faster.",
        "Safety issue: Vehicle 202 and vehicle 203 may have conflict. Suggest one of them to yield, and another go "
        "pass faster.",
        "Efficiency issue: The efficiency is not high. Some of the cars can be faster.",
        C.CONSENSUS_FEEDBACK)
    assert r.quality == pytest.approx(3 * 0.6 + 5 * 0.5 + 2 * 0.3)
    # only the parts that take part give feedback; thresholds are strict
    quiet = C.score_round(vids, np.where(safety < 0.7, 0.7, safety), 0.4, 0.8, use_safety_efficiency=True,
                          use_consensus=True)
    assert quiet.feedback == ()
    assert C.score_round(vids, safety, 0.3, None, use_safety_efficiency=False, use_consensus=False).feedback == ()
    assert C.score_round(vids, safety, 0.3, None, use_safety_efficiency=False,
                         use_consensus=False).quality == pytest.approx(5 * 0.5 + 2 * 0.3)


# -------------------------------------------------------------------- prompts
def _member(vid, x, y, heading=0.0, speed=5.0, nav=NavIntent.GO_STRAIGHT):
    return P.MemberInfo(vid=vid, x=x, y=y, heading=heading, speed=speed, nav=int(nav))


def test_direction_heading_and_order():
    ego = _member(1, 0.0, 0.0, heading=math.pi / 2)  # facing north
    assert P.direction_word(ego, _member(2, 0.0, 10.0)) == "front"
    assert P.direction_word(ego, _member(2, -10.0, 0.0)) == "left"
    assert P.direction_word(ego, _member(2, 7.0, -7.0)) == "rear-right"
    assert P.heading_word(ego, _member(2, 0, 0, heading=math.pi / 2 + 0.3)) == "the same way"
    assert P.heading_word(ego, _member(2, 0, 0, heading=math.pi)) == "to your left"
    assert P.heading_word(ego, _member(2, 0, 0, heading=-math.pi / 2)) == "towards you"
    assert P.heading_word(ego, _member(2, 0, 0, heading=0.0)) == "to your right"
    members = [_member(1, 0, 0), _member(2, 100, 0), _member(3, 10, 0)]
    assert P.speaking_order(members) == [2, 0, 1]  # summed distances 100, 190, 110 -> 3, 1, 2


@pytest.mark.parametrize("style", P.STYLES)
def test_actor_prompt_holds_every_part(style):
    ego, other = _member(201, 0, 0, speed=7.94), _member(202, 10, 10, heading=math.pi, nav=NavIntent.TURN_LEFT)
    msgs = P.actor_messages(ego, [other], [(202, "I will stop; 201 go faster.")], ["Efficiency issue: x"], style)
    case = msgs[-1]["content"]
    for part in ("201", "7.9 m/s", "go straight at intersection", "202", "14", "front-left", "towards you",
                 "turn left at intersection", "I will stop; 201 go faster.", "Efficiency issue: x"):
        assert part in case, part
    assert [m["role"] for m in msgs] == ["system", "user"]
    text = msgs[0]["content"] + msgs[1]["content"]
    assert "18 words" in text and "yield" in text.lower()  # the reply form and the traffic rules


def test_compact_prompts_put_the_fixed_instructions_first():
    """Compact prompts of different cases share their system turn (prefilled once per batched
    call); the case is the user turn. Paper-style prompts keep the seed's section order."""
    a, b, c = _member(201, 0, 0), _member(202, 10, 10, nav=NavIntent.TURN_LEFT), _member(203, -5, 20, speed=2.0)
    talk_1, talk_2 = [(201, "I will stop; 202 go faster.")], [(203, "I will go first.")]
    for requests in ([P.actor_messages(a, [b], talk_1, []), P.actor_messages(c, [a, b], talk_2, ["Safety issue: y"])],
                     [P.sum_actions_messages([201, 202], talk_1), P.sum_actions_messages([203, 201], talk_2)],
                     [P.consensus_messages(talk_1), P.consensus_messages(talk_2)]):
        first, second = requests
        assert first[0] == second[0] and first[0]["role"] == "system"
        assert first[1]["content"] != second[1]["content"]
        assert "201" not in first[0]["content"] and "stop; 202" not in first[0]["content"]
    assert "Rules:" in P.actor_messages(a, [b], talk_1, [])[0]["content"]
    assert "JSON only" in P.sum_actions_messages([201, 202], talk_1)[0]["content"]
    assert "Consensus score" in P.consensus_messages(talk_1)[0]["content"]
    paper = P.actor_messages(a, [b], talk_1, [], "paper")
    assert paper[0]["content"] == P.PAPER_SYSTEM and paper[1]["content"].startswith("## Role")


def test_clean_message_cuts_to_18_words():
    text, cut = clean_message('"I will stop now and wait here for a long while; ' + "go " * 30 + '"\nsecond line', 18)
    assert len(text.split()) == 18 and cut and not text.startswith('"')
    assert clean_message(None, 18) == ("", False)


# ------------------------------------------------------------- stated speeds
def test_stated_speed_reads_every_teacher_phrasing_and_variants():
    from jax_drive.coop.negotiation import teacher as T

    for phrases, name in ((T.YIELD_STOP, "STOP"), (T.YIELD_SLOW, "SLOWER"), (T.PASS, "FASTER"), (T.KEEP, "KEEP")):
        for phrase in phrases:
            assert T.stated_speed(phrase.format(j="202", y="202", req="stop", o="202")) == name, phrase
    cases = {"I will slow down and yield; 2 go faster.": "SLOWER",  # the first cue decides
             "i WILL be stopping for 3": "STOP", "I will keep going": "KEEP", "I will be going first": "FASTER",
             "Sure. I will wait, 4 goes first.": "STOP",
             "202 go faster.": None, "I will gobble": None, "I will": None, "": None, None: None, 12: None}
    for text, name in cases.items():
        assert T.stated_speed(text) == name, text


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_stated_speed_never_raises(text):
    from jax_drive.coop.negotiation import teacher as T

    assert T.stated_speed(text) in (None, "STOP", "SLOWER", "KEEP", "FASTER")
    assert T.stated_speed("I will " + text) in (None, "STOP", "SLOWER", "KEEP", "FASTER")


def test_teacher_keeps_a_safety_fix_when_only_efficiency_is_criticised_next(monkeypatch):
    """Round 0: 1 slows for 2, the critic flags the pair; round 1: 1 stops (safe); round 2,
    after efficiency feedback alone, 1 must not go back to the criticised SLOWER, while the
    member that kept its speed goes faster."""
    from jax_drive.coop.negotiation import teacher as T

    teacher = T.RuleTeacher()
    rules_plan = {1: (int(SpeedIntent.SLOWER), [2]), 2: (int(SpeedIntent.FASTER), []), 3: (int(SpeedIntent.KEEP), [])}
    monkeypatch.setattr(teacher, "resolve", lambda g, flagged=(): dict(rules_plan))
    vids = [1, 2, 3]
    infos = [_member(v, 10.0 * k, 0.0) for k, v in enumerate(vids)]
    g = GroupTalk(episode=0, time=0.0, slots=[0, 1, 2], vids=vids, infos=infos,
                  default={v: int(SpeedIntent.KEEP) for v in vids}, speeds={v: 5.0 for v in vids})
    stated = lambda: [T.stated_speed(t) for t in teacher.speak([(g, k, None) for k in range(3)])]  # noqa: E731
    said = [stated()]
    for pair_safety, line in (({"1-2": 0.01, "1-3": 1.0, "2-3": 1.0}, "Safety issue: vehicle 1 and vehicle 2"),
                              ({"1-2": 1.0, "1-3": 1.0, "2-3": 1.0}, "Efficiency issue: some cars can be faster")):
        g.rounds.append({"pair_safety": pair_safety})
        g.feedback = [line]
        said.append(stated())
    assert said == [["SLOWER", "FASTER", "KEEP"], ["STOP", "FASTER", "KEEP"], ["STOP", "FASTER", "FASTER"]]


# -------------------------------------------------------- batched engine calls
@pytest.fixture(scope="module")
def tiny_engine():
    model, _, tokenizer = tiny_policy(seed=0, lora_rank=None)
    return JaxEngine(model, tokenizer)


def _groups():
    """Three groups in two episodes: sizes 2, 3 (episode 0) and 2 (episode 1)."""
    out = []
    for episode, vids in ((0, [201, 202]), (0, [203, 204, 205]), (1, [201, 202])):
        infos = [_member(v, 10.0 * k, 3.0 * k, speed=4.0 + k) for k, v in enumerate(vids)]
        out.append(GroupTalk(episode=episode, time=1.0, slots=list(range(len(vids))), vids=vids, infos=infos,
                             default={v: int(SpeedIntent.KEEP) for v in vids},
                             speeds={m.vid: m.speed for m in infos}, edges=[(vids[0], vids[1])]))
    return out


def _waypoints_for(groups, intents):
    # everyone stands still 1 m apart: unsafe and inefficient whatever they say -> feedback
    return [np.stack([np.tile([float(k), 0.0], (20, 1)) for k in range(len(g.vids))]) for g in groups]


def test_one_actor_call_per_round_for_all_speakers_across_episodes(tiny_engine):
    engine = CountingEngine(tiny_engine)
    neg = LLMNegotiator(engine, "compact", actor_tokens=8, sum_tokens_per_member=2, consensus_tokens=8)
    groups = _groups()
    negotiate(groups, neg, _waypoints_for, RoundsConfig(critic=True, consensus=True, max_rounds=2))
    # per round: actors (all 7 members), sum actions (3 groups), consensus (3 groups); feedback keeps all going
    assert engine.calls == [7, 3, 3, 7, 3, 3]
    assert neg.usage.calls == {"actor": 2, "sum": 2, "consensus": 2}
    assert all(len(g.rounds) == 2 and g.feedback for g in groups)
    assert [len(g.conversation) for g in groups] == [4, 6, 4]
    for g in groups:  # messages of a round are appended in speaking order
        assert [v for r, v, _ in g.conversation if r == 0] == g.vids
        # the tiny model's output is gibberish: members fall back to their default intention
        assert set(g.intents.values()) <= set(range(4))


def test_sequential_turns_and_rounds_without_critic(tiny_engine):
    engine = CountingEngine(tiny_engine)
    neg = LLMNegotiator(engine, "compact", actor_tokens=8, sum_tokens_per_member=2)
    negotiate(_groups(), neg, _waypoints_for, RoundsConfig(critic=False, consensus=False, rounds_without_critic=1,
                                                           turns="sequential"))
    assert engine.calls == [3, 3, 1, 3]  # speaking positions 0, 1, 2 across groups, then one sum call


def test_compact_prompts_show_the_latest_message_of_each_member():
    talk = [(0, 1, "a0"), (0, 2, "b0"), (0, 3, "c0"), (1, 1, "a1")]
    # sequential turns: member 2 of round 1 sees round 0's later speakers and round 1's earlier one
    assert shown_messages(talk, 3, "compact") == [(2, "b0"), (3, "c0"), (1, "a1")]
    # parallel turns: everyone of round 1 sees exactly round 0
    assert shown_messages(talk[:3], 3, "compact") == [(1, "a0"), (2, "b0"), (3, "c0")]
    assert shown_messages(talk, 3, "paper") == [(v, t) for _, v, t in talk]
    assert shown_messages([], 3, "compact") == []


def test_a_group_without_feedback_stops(tiny_engine):
    class Fixed:
        name = "fixed"

        def speak(self, requests):
            return ["I will stop; go faster."] * len(requests)

        def sum_actions(self, groups):
            return [json.dumps({str(v): {"speed": "FASTER"} for v in g.vids}) for g in groups]

        def consensus(self, groups):
            return ["Consensus score: 90"] * len(groups)

    def apart(groups, intents):
        return [_lines([8.0] * len(g.vids), 20.0) for g in groups]

    groups = _groups()
    negotiate(groups, Fixed(), apart, RoundsConfig(critic=True, consensus=True, max_rounds=3))
    assert all(len(g.rounds) == 1 and g.done and g.feedback == [] for g in groups)
    assert all(set(g.intents.values()) == {int(SpeedIntent.FASTER)} for g in groups)
    assert groups[0].rounds[0]["quality"] == pytest.approx(3 * 0.9 + 5 * 1.0 + 2 * 1.0, rel=1e-4)


def test_cut_replies_are_counted_in_the_record():
    class Wordy:
        name = "wordy"

        def speak(self, requests):  # the first speaker of each group talks too long
            return [" ".join(["slow"] * 25) if k == 0 else "I will stop." for _, k, _ in requests]

        def sum_actions(self, groups):
            return ["{}"] * len(groups)

        def consensus(self, groups):
            return ["Consensus score: 10"] * len(groups)

    groups = _groups()
    negotiate(groups, Wordy(), _waypoints_for, RoundsConfig(critic=True, consensus=True, max_rounds=2))
    assert [g.record()["messages_cut"] for g in groups] == [2, 2, 2]  # one per round
    assert all(len(t.split()) == P.MAX_WORDS for g in groups for _, v, t in g.conversation if v == g.vids[0])


def test_expected_consensus_scores_and_their_distribution_are_recorded_per_round(tiny_engine):
    scores = (0, 25, 50, 75, 100)
    neg = LLMNegotiator(tiny_engine, "compact", actor_tokens=8, consensus_tokens=40, constrain_answers=True,
                        consensus_scores=scores, consensus_readout="expected")
    groups = _groups()
    negotiate(groups, neg, _waypoints_for, RoundsConfig(critic=True, consensus=True, max_rounds=1))
    for g, readout in zip(groups, neg.last_readouts):
        (r,) = g.rounds
        assert len(r["consensus_probs"]) == 5 and sum(r["consensus_probs"]) == pytest.approx(1.0, abs=1e-3)
        assert r["consensus"] == pytest.approx(round(readout.expected, 1) / 100)
        assert r["consensus"] == pytest.approx(sum(p * s for p, s in zip(readout.probs, scores)) / 100, abs=1e-3)


def test_a_separate_critic_engine_answers_every_consensus_request_and_gives_the_readout(tiny_engine):
    from jax_drive.coop.negotiation.consensus import expected_scores
    from jax_drive.coop.negotiation.negotiate import consensus_request

    scores = (0, 25, 50, 75, 100)

    class Counted(CountingEngine):  # the expected read-out needs the engine's model and tokenizer
        def __init__(self, engine):
            super().__init__(engine)
            self.model, self.tokenizer = engine.model, engine.tokenizer

    model, _, tokenizer = tiny_policy(seed=1, lora_rank=None)  # another model than the actor's
    actor, critic = Counted(tiny_engine), Counted(JaxEngine(model, tokenizer))
    neg = LLMNegotiator(actor, "compact", actor_tokens=8, consensus_tokens=40, constrain_answers=True,
                        consensus_scores=scores, consensus_readout="expected", critic_engine=critic)
    groups = _groups()
    negotiate(groups, neg, _waypoints_for, RoundsConfig(critic=True, consensus=True, max_rounds=1))
    assert actor.calls == [7, 3] and critic.calls == [3]  # actors and sum actions; the consensus requests
    assert neg.usage.calls == {"actor": 1, "sum": 1, "consensus": 1}
    prompts = [tokenizer.apply_chat_template(m, add_generation_prompt=True) for m in
               [consensus_request(g, "compact") for g in groups]]
    ids = [tokenizer.encode(p) for p in prompts]
    again = expected_scores(model, tokenizer, ids, neg.last_sampled, scores)
    assert [r.expected for r in again] == pytest.approx([r.expected for r in neg.last_readouts], abs=1e-4)
    actors = expected_scores(tiny_engine.model, tiny_engine.tokenizer, ids, neg.last_sampled, scores)
    assert max(abs(a.expected - r.expected) for a, r in zip(actors, again)) > 1e-3  # the models do differ
    with pytest.raises(ValueError, match="local model"):
        LLMNegotiator(tiny_engine, constrain_answers=True, consensus_scores=scores, consensus_readout="expected",
                      critic_engine=object())
