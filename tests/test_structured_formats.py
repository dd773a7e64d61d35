"""The cooperative answer formats run constrained end to end when their config field is on (a tiny
random model over the byte tokenizer, whose free answers are gibberish):

* TalkingVehicles (``AgentConfig(constrain_answers=True)``): every decision's action JSON parses
  without a failure, within the budget derived from the grammar (its fewest tokens plus the
  message cap plus the stop token);
* CoLMDriver (``LLMNegotiator(constrain_answers=True)``): every actor reply is one ``I will``
  line within the word limit, every sum-actions answer names exactly its group's members (one
  grammar per group in one batched call), every consensus answer carries a score.

The MTDrive trajectory runs constrained end to end in tests/test_structured_train.py (every
answer usable, the trainer under the same masks).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from coop_tiny import tiny_policy
from jax_drive.coop import agent as A
from jax_drive.coop.learning import EpisodeSpec, run_specs
from jax_drive.coop.negotiation import prompts as P
from jax_drive.coop.negotiation.critic import parse_consensus, parse_sum_actions
from jax_drive.coop.negotiation.negotiate import (GroupTalk, LLMNegotiator, RecordingNegotiator, RoundsConfig,
                                                  clean_message, negotiate)
from jax_drive.sampling import JaxEngine
from jax_drive.sampling.grammar.rows import engine_grammar
from jax_drive.sim.actions import NavIntent, SpeedIntent


@pytest.fixture(scope="module")
def engine():
    model, _, tokenizer = tiny_policy(seed=0, lora_rank=None)
    return JaxEngine(model, tokenizer)


def test_talking_vehicles_actions_parse_with_the_derived_budget(engine):
    config = A.AgentConfig(style="compact", constrain_answers=True, max_message_chars=12, temperature=1.0)
    policy = A.LanguagePolicy(engine, config, name="constrained")
    minimum = engine_grammar(engine, config.answer_grammar()).min_tokens
    slack = max(map(len, A.COMMANDS)) - min(map(len, A.COMMANDS))  # the longest command over the shortest
    assert policy.sampling.max_new_tokens == minimum + slack + 12 + 1 and policy.sampling.grammar is not None
    _, transitions = run_specs([EpisodeSpec("tv_red_light", 0, 0, "eval")], policy, record=True, max_time=0.6)
    assert len(transitions) >= 2
    for t in transitions:  # (a character may take several byte tokens: the mask then shortens the message)
        assert t.info["failures"] == [] and t.info["finish_reason"] in ("stop", "length"), t.info["answer"]
        assert A.parse_action(t.info["answer"]).command_text in A.COMMANDS
    with pytest.raises(ValueError, match="answer_prefix and constrain_answers"):
        A.AgentConfig(constrain_answers=True, answer_prefix='{"command": "')


def test_reflection_and_debrief_grammars_accept_prose_only():
    import re

    from jax_drive.coop.learning import parse_memory
    from jax_drive.sampling.grammar import GrammarError, memory_grammar, prose_grammar

    memory, turn = re.compile(memory_grammar(8).pattern), re.compile(prose_grammar(6).pattern)
    good = '{"knowledge": "The truck hides cars.", "strategy": "Slow down; wait for the all-clear."}'
    assert memory.fullmatch(good) and parse_memory(good)[2] is None
    for bad in ('{"knowledge": "", "strategy": "Wait here now."}',  # empty and too short fields
                '{"knowledge": "Two words.", "strategy": "Wait here now."}',
                '{"knowledge": "One two three four five six seven eight nine.", "strategy": "Wait here now."}',
                '{"knowledge": "Say \\"stop\\" now.", "strategy": "Wait here now."}'):  # quotes: not prose
        assert not memory.fullmatch(bad), bad
    assert turn.fullmatch("I go first, then you merge.") and turn.fullmatch("Agreed.")
    assert not any(turn.fullmatch(t) for t in ("No full stop", "Line\nbreak.", "{json}.", "one two three four five six seven."))
    with pytest.raises(GrammarError):
        prose_grammar(0)


def _groups():
    out = []
    for episode, vids in ((0, [201, 202]), (0, [203, 204, 205])):
        infos = [P.MemberInfo(vid=v, x=10.0 * k, y=3.0 * k, heading=0.0, speed=4.0 + k, nav=int(NavIntent.GO_STRAIGHT))
                 for k, v in enumerate(vids)]
        out.append(GroupTalk(episode=episode, time=1.0, slots=list(range(len(vids))), vids=vids, infos=infos,
                             default={v: int(SpeedIntent.KEEP) for v in vids}, speeds={m.vid: m.speed for m in infos},
                             edges=[(vids[0], vids[1])]))
    return out


def _standing_still(groups, intents):  # unsafe and inefficient whatever they say: feedback, consensus asked
    return [np.stack([np.tile([float(k), 0.0], (20, 1)) for k in range(len(g.vids))]) for g in groups]


def test_colmdriver_replies_sum_actions_and_consensus_parse(engine):
    inner = LLMNegotiator(engine, "compact", actor_tokens=24, consensus_tokens=48, temperature=1.0,
                          key=jax.random.key(2), constrain_answers=True, max_words=6, consensus_scores=range(0, 101, 10))
    recorder = RecordingNegotiator(inner)
    groups = _groups()
    negotiate(groups, recorder, _standing_still, RoundsConfig(critic=True, consensus=True, max_rounds=1))
    kinds = {kind: [e for e in recorder.examples if e["kind"] == kind] for kind in ("actor", "sum", "consensus")}
    assert [len(kinds[k]) for k in ("actor", "sum", "consensus")] == [5, 2, 2]
    for example in kinds["actor"]:
        answer = example["messages"][-1]["content"]
        text, cut = clean_message(answer, 6)  # (strips the quotes the grammar allows at the end of a word)
        assert not cut and text.startswith("I will ") and "\n" not in answer, answer
    for example, group in zip(kinds["sum"], groups):
        parsed = parse_sum_actions(example["messages"][-1]["content"], group.vids)
        assert parsed.source == "json" and not parsed.missing and set(parsed.intents) == set(group.vids)
    for example in kinds["consensus"]:
        score, error = parse_consensus(example["messages"][-1]["content"])
        assert error is None and round(score * 100) % 10 == 0
