"""LLM driving agents: the JSON action parser on hostile output, prompts, the compact
observation and the batched LanguagePolicy (one engine call per decision for all agents)."""

import json

import numpy as np
import pytest
from hypothesis import given, strategies as st

from jax_drive.coop import agent as A
from jax_drive.coop.learning import EpisodeSpec, run_specs
from jax_drive.sim.state import Cmd

from coop_tiny import CountingEngine, tiny_engine

# ----------------------------------------------------------------------------- parser
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _check(action: A.AgentAction, limit: int = A.MAX_MESSAGE_BYTES):
    assert isinstance(action.command, Cmd) and action.command in A.COMMANDS.values()
    assert isinstance(action.message, str) and "\n" not in action.message
    assert len(action.message.encode("utf-8")) <= limit
    assert set(action.failures) <= set(A.FAILURES)
    if action.failures and action.failures[0] in (A.NO_JSON, A.MALFORMED_JSON, A.UNCLOSED_JSON):
        assert action.command == A.FALLBACK_COMMAND and action.message == ""


@given(st.text(max_size=400))
def test_parser_never_raises_on_arbitrary_text(text):
    _check(A.parse_action(text))


@given(st.dictionaries(st.sampled_from(["command", "message", "other"]), json_values, max_size=3))
def test_parser_never_raises_on_arbitrary_json_objects(obj):
    text = json.dumps(obj)
    action = A.parse_action(text)
    _check(action)
    if not isinstance(obj.get("command"), str):
        assert action.command == A.FALLBACK_COMMAND


@given(st.sampled_from(list(A.COMMANDS)), st.text(max_size=60), st.text(max_size=30), st.text(max_size=30))
def test_parser_reads_a_valid_answer_inside_prose(command, message, before, after):
    before, after = before.replace("{", "("), after.replace("{", "(")
    action = A.parse_action(before + A.format_action(command, message) + after)
    assert action.command == A.COMMANDS[command]
    assert action.message == " ".join(message.split())[:A.MAX_MESSAGE_BYTES] or action.failures


@given(st.sampled_from(list(A.COMMANDS)), st.text(max_size=80))
def test_format_and_parse_round_trip(command, message):
    message = " ".join(message.split())
    for compact in (False, True):
        action = A.parse_action(A.format_action(command, message, compact=compact))
        assert action.command == A.COMMANDS[command] and action.message == message and action.ok


@given(st.binary(max_size=200), st.integers(min_value=1, max_value=64))
def test_parser_on_garbage_bytes_and_tiny_limits(raw, limit):
    _check(A.parse_action(raw.decode("utf-8", errors="replace"), max_message_bytes=limit), limit)


def test_typed_failures_and_fallbacks():
    assert A.parse_action(None).failures == (A.NOT_A_STRING,)
    assert A.parse_action("go left now").failures == (A.NO_JSON,)
    assert A.parse_action('{"command": "go"').failures == (A.UNCLOSED_JSON,)
    assert A.parse_action("{command: go}").failures == (A.MALFORMED_JSON,)
    a = A.parse_action('{"command": "fly", "message": "hi"}')
    assert a.failures == (A.UNKNOWN_COMMAND,) and a.command == A.FALLBACK_COMMAND and a.message == "hi"
    assert A.parse_action('{"message": "hi"}').failures == (A.MISSING_COMMAND,)
    assert A.parse_action('{"command": 3}').failures == (A.UNKNOWN_COMMAND,)
    a = A.parse_action('{"command": "stop", "message": ["a"]}')
    assert a.failures == (A.BAD_MESSAGE,) and a.command == Cmd.STOP and a.message == ""
    assert A.parse_action('{"command": "stop", "message": null}').ok


def test_commands_are_normalised():
    for text in ("Change_Lane-LEFT.", "  change   lane left ", "CHANGE-LANE-LEFT!"):
        assert A.parse_action(json.dumps({"command": text})).command == Cmd.LANE_LEFT
    assert A.parse_action('{"command": "Slow Down"}').command == Cmd.SLOW_DOWN
    assert set(A.COMMANDS) == {"go", "stop", "slow down", "speed up", "change lane left", "change lane right", "keep"}


def test_over_long_messages_are_cut_at_a_utf8_boundary():
    a = A.parse_action(json.dumps({"command": "go", "message": "é" * 200}), max_message_bytes=301)
    assert a.failures == (A.MESSAGE_TOO_LONG,) and a.command == Cmd.GO
    assert a.message == "é" * 150 and len(a.message.encode()) == 300
    ok = A.parse_action(json.dumps({"command": "go", "message": "x" * 300}))
    assert ok.ok and len(ok.message) == 300


# ----------------------------------------------------------------------------- prompts
@pytest.fixture(scope="module")
def overtake_step():
    """The rule-based teacher's records of an accident-prone perception overtake (views
    rebuilt from a short run)."""
    from jax_drive.coop.episodes import EpisodeBatch

    spec = EpisodeSpec("tv_overtake_perception", 0, 0, "learn")
    batch = EpisodeBatch([spec.scenario], [spec.key()], [True])
    obs = batch.observe()
    return batch.decision_batch(obs, [0])


def test_full_prompt_holds_the_papers_parts(overtake_step):
    step = overtake_step
    view = step.views[0]
    car = int(np.flatnonzero(view["vehicle_id"] == 197)[0])
    ctx = A.AgentContext("Trucks hide oncoming cars.", "Wait for the truck's all clear.", (("obs", '{"command": "stop"}'),))
    msgs = [(0.5, 199, "Car oncoming, 29 m.")]
    system, user = A.full_prompt(view, car, msgs, communicate=True, chain_of_thought=True, context=ctx)
    assert system["role"] == "system" and "Vehicle 197" in system["content"] and '"message"' in system["content"]
    text = user["content"]
    for part in ("Task: ", "Knowledge: Trucks hide", "Cooperative strategy: Wait", "A similar past situation",
                 "Observation:\nYou are Vehicle 197", "[0.5 s ago] Vehicle 199: Car oncoming, 29 m.", A.COT_TEXT):
        assert part in text
    system, user = A.full_prompt(view, car, msgs, communicate=False, chain_of_thought=False)
    assert '"message"' not in system["content"] and "Messages" not in user["content"]
    assert "oncoming" not in user["content"] and A.DIRECT_TEXT in user["content"]
    truck = int(np.flatnonzero(view["vehicle_id"] == 199)[0])
    assert "stopped truck that cannot move" in A.full_prompt(view, truck, [], communicate=True,
                                                              chain_of_thought=False)[0]["content"]


def test_compact_observation_is_short_and_keeps_the_latest_message_per_sender(overtake_step):
    view = overtake_step.views[0]
    car = int(np.flatnonzero(view["vehicle_id"] == 197)[0])
    msgs = [(1.5, 199, "All clear."), (0.5, 199, "Car oncoming, 29 m."), (1.0, 198, "Going straight.")]
    text = A.compact_observation(view, car, msgs)
    assert text.startswith("car 7 m/s, go straight, opposite lane on the left.")
    assert "truck" in text and "m ahead stopped" in text
    assert text.endswith("199: Car oncoming, 29 m. 198: Going straight.") and "All clear" not in text
    assert A.compact_prompt(view, car, msgs, communicate=False) == [
        {"role": "user", "content": A.compact_observation(view, car, [])}]


# ----------------------------------------------------------------------------- the batched policy
class Recorder:
    """Wraps a policy; records the number of live agents of every decision batch."""

    def __init__(self, policy):
        self.policy, self.name, self.live = policy, policy.name, []

    def decide(self, batch):
        self.live.append((len(batch.agents), len({int(e) for e in batch.agents[:, 0]})))
        return self.policy.decide(batch)


@pytest.mark.parametrize("style", ["compact", "full"])
def test_one_engine_call_per_decision_for_every_agent_of_every_episode(style):
    engine = CountingEngine(tiny_engine())
    config = A.AgentConfig(style=style, max_new_tokens=6)
    policy = A.LanguagePolicy(engine, config, name="tiny")
    recorder = Recorder(policy)
    specs = [EpisodeSpec(s, 0, k, "eval") for s in ("tv_overtake_perception", "tv_red_light") for k in range(2)]
    results, transitions = run_specs(specs, recorder, record=True, max_time=1.6)
    assert len(engine.calls) == len(recorder.live) == 4  # decisions at t = 0, 0.5, 1.0, 1.5
    assert engine.calls == [n for n, _ in recorder.live]  # every live agent, one call
    assert all(episodes == 4 for _, episodes in recorder.live)  # across every episode
    assert [c.agents for c in policy.calls] == engine.calls
    # replay records carry the policy's record of each decision
    info = transitions[0].info
    assert {"prompt", "answer", "command", "message", "failures", "prompt_tokens", "new_tokens", "batch_seconds",
            "agent_seconds", "student_observation"} <= set(info)
    assert info["new_tokens"] >= 1 and info["batch_seconds"] > 0
    # a random model answers garbage: typed failures are counted per episode and the
    # agents fall back to KEEP
    counted = sum(sum(c.values()) for c in policy.failures.values())
    fallbacks = sum(1 for t in transitions if t.info["failures"] or t.info["finish_reason"] == "length")
    assert counted >= fallbacks > 0
    assert all(t.command == "keep" for t in transitions if t.info["failures"] and t.info["failures"][0] in
               (A.NO_JSON, A.MALFORMED_JSON, A.UNCLOSED_JSON))


def test_silent_agents_send_nothing_and_stopped_ones_are_not_asked():
    engine = CountingEngine(tiny_engine())
    policy = A.LanguagePolicy(engine, A.AgentConfig(style="compact", communicate=False, max_new_tokens=4))
    specs = [EpisodeSpec("tv_red_light", 0, 0, "eval")]
    results, transitions = run_specs(specs, policy, record=True, max_time=1.1)
    assert engine.calls == [1, 1, 1]  # only the car: the stopped truck only talks
    assert results[0].messages_sent == 0


def test_language_policy_drives_like_its_answers():
    """A scripted engine that always answers like the rule-based teacher would: commands map
    to the simulator and messages reach the bus."""

    class Scripted:
        def generate_chat(self, conversations, params, key):
            from jax_drive.sampling import Completion

            return [Completion((1,), (2,), '{"command": "stop", "message": "Holding."}', (0.0,), "stop")
                    for _ in conversations]

    policy = A.LanguagePolicy(Scripted(), A.AgentConfig())
    results, transitions = run_specs([EpisodeSpec("tv_red_light", 0, 0, "eval")], policy, record=True, max_time=2.1)
    assert results[0].messages_sent > 0 and all(t.command in ("stop", "keep") for t in transitions)
    assert any(text == "Holding." for _, _, text in results[0].message_log)
    assert not any(policy.failures.get(0, {}).values())


class CountingTextEngine:
    """Wraps a real engine; records every generate call (templated text prompts)."""

    def __init__(self, engine):
        self.engine, self.tokenizer, self.prompts = engine, engine.tokenizer, []

    def generate(self, prompts, params, key):
        self.prompts.append(list(prompts))
        return self.engine.generate(prompts, params, key)

    def generate_chat(self, conversations, params, key):
        raise AssertionError("with an answer prefix the policy calls generate")


def test_answer_prefix_is_forced_once_per_decision_and_parsed_with_the_answer():
    engine = CountingTextEngine(tiny_engine())
    prefix = '{"command": "'
    policy = A.LanguagePolicy(engine, A.AgentConfig(style="compact", max_new_tokens=4, answer_prefix=prefix))
    specs = [EpisodeSpec("tv_red_light", 0, k, "eval") for k in range(2)]
    _, transitions = run_specs(specs, policy, record=True, max_time=1.1)
    assert [len(p) for p in engine.prompts] == [c.agents for c in policy.calls] == [4, 4, 4]  # one call per decision
    assert all(p.endswith(prefix) for call in engine.prompts for p in call)
    assert all(t.info["answer"].startswith(prefix) for t in transitions)
    # the random model never closes the object: a typed failure, not a crash, and the fallback
    assert all(t.info["failures"] and t.command == "keep" for t in transitions)


def test_answer_prefix_needs_a_local_chat_template():
    class Remote:
        tokenizer = None

    with pytest.raises(ValueError, match="answer_prefix"):
        A.LanguagePolicy(Remote(), A.AgentConfig(answer_prefix='{"command": "'))
