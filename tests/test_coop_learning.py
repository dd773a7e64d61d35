"""CoopReflect learning loops: reflection, debrief and correction + RAG end to end on the tiny
random model, the protocol's bookkeeping (solved / reset / done), memories flowing into the
prompts, checkpoints and episode keys."""

import dataclasses

import jax
import numpy as np
import pytest

from jax_drive.coop import learning as L
from jax_drive.coop.memory import Embedder, MemoryBank
from jax_drive.coop.runner import EpisodeResult
from jax_drive.sampling import Completion
from jax_drive.sim.metrics import AgentOutcome

from coop_tiny import tiny_engine, tiny_model

SCENARIOS = ("tv_red_light", "tv_overtake_perception")
QUICK = L.LearningConfig(max_episodes=1, solved_streak=1, max_resets=0, reflection_tokens=8, discussion_tokens=8,
                         max_time=2.0)


class Recording:
    """Wraps an engine and keeps every call's conversations and answers."""

    def __init__(self, engine):
        self.engine, self.calls, self.answers = engine, [], []

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate_chat(self, conversations, params, key):
        self.calls.append([list(c) for c in conversations])
        out = self.engine.generate_chat(conversations, params, key)
        self.answers.append([c.text for c in out])
        return out


class Scripted:
    """Answers decisions with 'go', reflections / summaries with a fixed JSON memory and
    discussion turns with a sentence."""

    def generate_chat(self, conversations, params, key):
        out = []
        for conv in conversations:
            text = conv[-1]["content"]
            if "knowledge" in text and "JSON" in text:
                answer = '{"knowledge": "the truck sees hidden cars", "strategy": "wait for all clear"}'
            elif "debrief" in conv[0]["content"]:
                answer = "I will report cars; you wait."
            else:
                answer = '{"command": "go", "message": ""}'
            out.append(Completion((1,), (2,), answer, (0.0,), "stop"))
        return out


def _user(conv):
    return conv[-1]["content"]


def test_episode_specs_alternate_and_splits_never_share_keys():
    specs = L.episode_specs(SCENARIOS, [0, 1], 3, "eval")
    assert len(specs) == 12 and [s.accident_prone for s in specs[:3]] == [True, False, True]
    keys = {split: {tuple(np.asarray(jax.random.key_data(s.key())).tolist()) for s in
                    L.episode_specs(SCENARIOS, [0, 1], 3, split)} for split in L.SPLITS}
    assert all(len(k) == 6 for k in keys.values())  # per seed and index (the scenario builds from it)
    assert not (keys["eval"] & keys["learn"]) and not (keys["eval"] & keys["distill"])
    with pytest.raises(ValueError):
        L.EpisodeSpec("tv_red_light", 0, 0, "test")


def test_reflection_loop_on_the_tiny_model():
    engine = Recording(tiny_engine())
    bank = MemoryBank()
    lanes = L.lanes_for(SCENARIOS, [0])
    learner = L.Learner("reflection", engine, bank, QUICK, L.AgentConfig(max_new_tokens=6))
    learner.learn(lanes, progress=False)
    assert all(l.done and l.episodes == 1 and not l.history[0]["success"] for l in lanes)  # cut at 2 s: failed
    decisions, reflections = engine.calls[:-1], engine.calls[-1]
    assert len(decisions) == 4 and all(len(c) == 4 for c in decisions)  # 2 lanes x (car + truck), one call each
    assert len(reflections) == 4 and all("Key moments of the episode" in _user(c) for c in reflections)
    assert all("stagnated" in _user(c) for c in reflections)  # the outcome feedback
    assert sorted(bank.agents) == ["tv_overtake_perception/seed0/197", "tv_overtake_perception/seed0/199",
                                   "tv_red_light/seed0/109", "tv_red_light/seed0/117"]
    for mem in bank.agents.values():
        assert mem.version == 1 and mem.versions[0]["source"].startswith("reflection")
        assert 1 <= len(mem.observations) <= QUICK.batch_size


def test_debrief_loop_on_the_tiny_model():
    engine = Recording(tiny_engine())
    bank = MemoryBank()
    lanes = L.lanes_for(SCENARIOS, [0])
    L.Learner("debrief", engine, bank, QUICK, L.AgentConfig(max_new_tokens=6)).learn(lanes, progress=False)
    opening, reply, summary = engine.calls[-3:]
    assert len(engine.calls) == 4 + 3
    assert len(opening) == len(reply) == 2 and len(summary) == 4
    assert all("Propose a joint cooperative strategy" in _user(c) for c in opening)
    assert all("Give your feedback" in _user(c) and "Discussion so far:" in _user(c) for c in reply)
    # deterministic round robin: the lowest vehicle id opens
    assert "Vehicle 109 in scenario 'tv_red_light'" in _user(opening[0])
    assert "Vehicle 117 in scenario 'tv_red_light'" in _user(reply[0])
    for key in ("tv_red_light/seed0/109", "tv_red_light/seed0/117"):
        last = bank.agents[key].versions[-1]
        assert last["source"].startswith("debrief") and [t[0] for t in last["discussion"]] == [109, 117]


def test_constrained_debrief_writes_prose_memories_on_the_tiny_model():
    """Under the post-episode grammars even the random model's reflections and summaries
    are structured memories (never 'unstructured' or empty) and its debrief turns plain prose."""
    import re

    from jax_drive.sampling.grammar.formats import words_regex

    config = L.LearningConfig(max_episodes=1, solved_streak=1, max_resets=0, reflection_tokens=64,
                              discussion_tokens=24, constrain_answers=True, memory_words=3, discussion_words=3,
                              max_time=2.0)
    bank = MemoryBank()
    lanes = L.lanes_for(SCENARIOS, [0])
    engine = Recording(tiny_engine())
    learner = L.Learner("debrief", engine, bank, config, L.AgentConfig(max_new_tokens=6))
    learner.learn(lanes, progress=False)
    memory_field, turn = re.compile(words_regex(3, 3)), re.compile(words_regex(3))
    assert len(bank.agents) == 4 and [c["kind"] for c in learner.llm_calls] == ["debrief", "debrief", "summary"]
    for mem in bank.agents.values():
        assert mem.versions[-1]["source"] == "debrief"  # parsed: no "(unstructured)" / "(empty)"
        assert memory_field.fullmatch(mem.knowledge) and memory_field.fullmatch(mem.strategy)
        assert all(turn.fullmatch(text) for _, text in mem.versions[-1]["discussion"])


def test_silent_agents_answer_the_command_alone_under_the_grammar():
    from jax_drive.coop.agent import parse_action

    talk = L.AgentConfig(constrain_answers=True, max_message_chars=16)
    silent = dataclasses.replace(talk, communicate=False)
    assert '"message"' in talk.answer_grammar().pattern and '"message"' not in silent.answer_grammar().pattern
    engine = tiny_engine()
    assert silent.answer_budget(engine) == talk.answer_budget(engine) - 16 - len(', "message": ""')
    action = parse_action('{"command": "stop"}')  # what the silent grammar writes
    assert action.command_text == "stop" and not action.failures


def test_correction_rag_stores_corrections_and_retrieves_them():
    model, tokenizer = tiny_model()
    engine = Recording(tiny_engine())
    bank = MemoryBank()
    lanes = L.lanes_for(SCENARIOS[:1], [0])
    config = L.LearningConfig(max_episodes=2, solved_streak=5, max_resets=0, discussion_tokens=6, max_time=2.0)
    learner = L.Learner("correction_rag", engine, bank, config, L.AgentConfig(max_new_tokens=6),
                        embedder=Embedder(model, tokenizer, max_tokens=96))
    learner.learn(lanes, progress=False, max_rounds=1)
    assert [len(s) for s in bank.corrections.values()] == [config.batch_size, config.batch_size]
    assert all("Which command and message should you have chosen" in _user(c) for c in engine.calls[-1])
    learner.learn(lanes, progress=False)  # second episode: the stored corrections are shown
    assert any("A similar past situation" in _user(c) and "Good answer: {" in _user(c) for c in engine.calls[5])


def test_constrained_corrections_are_drivers_answers_on_the_tiny_model():
    """Under the post-episode grammars a correction is sized like a talking driver's answer (not
    by the discussion budget, here below the grammar's fewest tokens), so every one parses."""
    from jax_drive.coop.agent import parse_action

    model, tokenizer = tiny_model()
    engine = Recording(tiny_engine())
    agent = L.AgentConfig(max_new_tokens=6, max_message_chars=8)
    config = L.LearningConfig(max_episodes=1, solved_streak=5, max_resets=0, discussion_tokens=6,
                              constrain_answers=True, max_time=2.0)
    learner = L.Learner("correction_rag", engine, MemoryBank(), config, agent,
                        embedder=Embedder(model, tokenizer, max_tokens=96))
    talking = dataclasses.replace(agent, constrain_answers=True)
    assert learner.correct.max_new_tokens == talking.answer_budget(engine) > config.discussion_tokens
    assert learner.correct.grammar.pattern == talking.answer_grammar().pattern
    learner.learn(L.lanes_for(SCENARIOS[:1], [0]), progress=False, max_rounds=1)
    corrections = [a for call, answers in zip(engine.calls, engine.answers)
                   if "Which command and message should you have chosen" in _user(call[0]) for a in answers]
    assert len(corrections) == config.batch_size * 2
    assert all(not parse_action(text).failures for text in corrections)
    # the other methods never size a correction, so a served engine (no local tokenizer) still works
    assert L.Learner("reflection", Scripted(), MemoryBank(), config, L.AgentConfig()).correct is None


def test_learnt_memory_reaches_the_decision_prompts():
    bank = MemoryBank()
    lanes = L.lanes_for(SCENARIOS[:1], [0])
    engine = Recording(Scripted())
    learner = L.Learner("debrief", engine, bank, QUICK, L.AgentConfig())
    learner.learn(lanes, progress=False)
    assert bank.agents["tv_red_light/seed0/109"].strategy == "wait for all clear"
    specs = L.episode_specs(SCENARIOS[:1], [0], 1, "eval")
    learner.context.specs = specs
    L.run_specs(specs, learner.policy, max_time=0.6)
    prompt = _user(engine.calls[-1][0])
    assert "Knowledge: the truck sees hidden cars" in prompt and "Cooperative strategy: wait for all clear" in prompt


def _result(success: bool) -> EpisodeResult:
    outcome = AgentOutcome(index=0, vehicle_id=1, outcome="success" if success else "collision", time=1.0,
                           collided_with=None if success else 2)
    return EpisodeResult("tv_red_light", True, False, "x", [outcome], 1.0, 0, 0, {})


@pytest.mark.parametrize("pattern, solved, resets, episodes", [
    ([True, True], True, 0, 2),  # two in a row: solved
    ([False, True, True, True], True, 1, 4),  # a trial holds 2 episodes: [F, T] is reset, then [T, T]
    ([False, False, True, False, True, True], True, 2, 6),  # resets after every 2 unsolved episodes
    ([False] * 8, False, 3, 8),  # 1 + 3 trials of 2 episodes, then the last trial is kept
])
def test_protocol_bookkeeping(pattern, solved, resets, episodes):
    bank = MemoryBank()
    bank.agent("tv_red_light/seed0/109").update("K", "S", episode=0, source="test")
    learner = L.Learner("reflection", Scripted(), bank, L.LearningConfig(max_episodes=2, solved_streak=2, max_resets=3))
    lane = L.Lane("tv_red_light", 0)
    for ok in pattern:
        assert not lane.done
        learner._bookkeeping(lane, _result(ok), {})
    assert (lane.solved, lane.resets, lane.episodes, lane.done) == (solved, resets, episodes, True)
    assert [h["trial"] for h in lane.history][-1] == resets
    if resets:
        assert bank.agents["tv_red_light/seed0/109"].versions[-1]["source"] == "reset" or solved


def test_parse_memory_never_raises():
    assert L.parse_memory('{"knowledge": "k", "strategy": "s"}') == ("k", "s", None)
    assert L.parse_memory('x {"strategy": ["a", 1]} y') == ("", '["a", 1]', None)
    assert L.parse_memory("just   prose\nhere") == ("", "just prose here", "unstructured")
    assert L.parse_memory("") == ("", "", "empty")
    assert L.parse_memory(None) == ("", "", "empty")
    assert L.parse_memory("z" * 900, max_chars=10) == ("", "z" * 10, "unstructured")


def test_checkpoint_round_trip_and_resume(tmp_path):
    bank = MemoryBank()
    lanes = L.lanes_for(SCENARIOS[:1], [0])
    config = L.LearningConfig(max_episodes=2, solved_streak=5, max_resets=0, max_time=1.0)
    learner = L.Learner("reflection", Scripted(), bank, config, L.AgentConfig())
    path = tmp_path / "state.json"
    learner.learn(lanes, progress=False, max_rounds=1, log=lambda r, ls: L.save_state(path, ls, bank))
    lanes2, bank2, _ = L.load_state(path)
    assert [l.to_json() for l in lanes2] == [l.to_json() for l in lanes] and bank2.to_json() == bank.to_json()
    assert lanes2[0].episodes == 1 and not lanes2[0].done
    L.Learner("reflection", Scripted(), bank2, config, L.AgentConfig()).learn(lanes2, progress=False)
    assert lanes2[0].episodes == 2 and lanes2[0].done
    assert [h["accident_prone"] for h in lanes2[0].history] == [True, False]
