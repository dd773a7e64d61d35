"""Distillation: the language teacher decides exactly like the rule-based baseline, its
messages are natural language, data come only from successful non-evaluation episodes, and
the student trains through the SFT trainer, saves, loads and drives."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from jax_drive.coop import distill as D
from jax_drive.coop.agent import AgentConfig, LanguagePolicy
from jax_drive.coop.baselines import RuleBasedPolicy, SilentPolicy
from jax_drive.coop.learning import EpisodeSpec, episode_specs, run_specs
from jax_drive.data.tokens import tokenize_chat
from jax_drive.rl.optim import OptimConfig
from jax_drive.rl.sft import SFTConfig
from jax_drive.sim import scenarios as S

from coop_tiny import byte_tokenizer, tiny_model


@pytest.fixture(scope="module")
def teacher_run():
    specs = episode_specs(S.TALKING_VEHICLES, [5], 2, "distill")
    results, transitions = run_specs(specs, D.LanguageRuleTeacher(), record=True)
    return specs, results, transitions


def test_teacher_decides_exactly_like_the_rule_based_baseline(teacher_run):
    specs, results, _ = teacher_run
    baseline, _ = run_specs(specs, RuleBasedPolicy())
    assert [(r.end_time, [o.outcome for o in r.outcomes]) for r in results] == \
        [(r.end_time, [o.outcome for o in r.outcomes]) for r in baseline]
    assert all(D.episode_success(r) for r in results)


def test_teacher_talks_in_natural_language(teacher_run):
    specs, results, _ = teacher_run
    overtake = results[specs.index(EpisodeSpec("tv_overtake_perception", 5, 0, "distill"))]
    said = [(vid, text) for _, vid, text in overtake.message_log]
    assert any(vid == 199 and text.startswith("Car oncoming, ") and text.endswith(" m.") for vid, text in said)
    assert (199, "All clear.") in said and (197, "Yielding, slowing down.") in said
    red = results[specs.index(EpisodeSpec("tv_red_light", 5, 0, "distill"))]
    assert any(vid == 117 and "crossing from my" in text for _, vid, text in red.message_log)
    # sparse: far fewer messages than agent decisions, each short
    assert overtake.messages_sent < overtake.end_time / 0.5 and overtake.bytes_sent / overtake.messages_sent < 40


def test_samples_come_only_from_successful_episodes(teacher_run):
    specs, results, transitions = teacher_run
    samples = D.samples_from_episodes(specs, results, transitions, "teacher")
    assert {s.episode for s in samples} == {s.tag for s in specs}
    failed = list(results)
    bad = dataclasses.replace(results[0].outcomes[0], outcome="collision")
    failed[0] = dataclasses.replace(results[0], outcomes=[bad] + results[0].outcomes[1:])
    kept = D.samples_from_episodes(specs, failed, transitions, "teacher")
    assert specs[0].tag not in {s.episode for s in kept} and len(kept) < len(samples)
    for s in samples[:50]:
        answer = json.loads(s.answer)
        assert answer["command"] in ("go", "stop", "slow down", "speed up", "change lane left", "change lane right",
                                     "keep")
        assert s.answer.startswith('{"command":"') and '", "' not in s.answer  # compact JSON


def test_teacher_labels_the_states_a_student_visits(teacher_run):
    specs, teacher_results, transitions = teacher_run
    # the silent baseline as the "student": it crashes where the cooperative teacher does not
    samples, results = D.collect_student(SilentPolicy(), specs)
    assert not all(D.episode_success(r) for r in results)
    assert {s.episode for s in samples} == {s.tag for s in specs}  # failed episodes are kept too
    # the labels are the teacher's: at the first decision both runs see the same worlds
    teacher = {(s.episode, s.vehicle_id): s for s in
               D.samples_from_episodes(specs, teacher_results, transitions, "teacher") if s.step == 0}
    first = {(s.episode, s.vehicle_id): s for s in samples if s.step == 0}
    assert first.keys() == teacher.keys()
    assert all((first[k].observation, first[k].answer) == (teacher[k].observation, teacher[k].answer) for k in first)
    # where the student drove something else, the sample says so, and selection keeps it
    marked = [s for s in samples if s.executed]
    assert marked and all(s.executed != json.loads(s.answer)["command"] for s in marked)
    assert not any(s.executed for s in D.samples_from_episodes(specs, teacher_results, transitions, "teacher"))
    kept = D.select_informative(samples, keep_fraction=0.0)
    assert set(marked) <= set(kept) and len(kept) < len(samples)
    with pytest.raises(ValueError, match="evaluation episodes"):
        D.collect_student(SilentPolicy(), [dataclasses.replace(specs[0], split="eval")])


def test_distillation_data_never_contains_evaluation_episodes(teacher_run):
    specs, results, transitions = teacher_run
    eval_specs = episode_specs(S.TALKING_VEHICLES, [5], 30, "eval")
    with pytest.raises(ValueError, match="evaluation episodes"):
        D.collect_teacher(eval_specs[:1])
    with pytest.raises(ValueError, match="evaluation episodes"):
        D.samples_from_episodes([dataclasses.replace(s, split="eval") for s in specs], results, transitions, "x")
    samples = D.samples_from_episodes(specs, results, transitions, "teacher")
    D.check_disjoint(samples, eval_specs)  # passes
    leaked = samples[:3] + [dataclasses.replace(samples[0], episode=eval_specs[0].tag)]
    with pytest.raises(ValueError, match="evaluation episodes"):
        D.check_disjoint(leaked, eval_specs)
    # and the worlds differ: no distillation episode starts like an evaluation episode
    def start(spec):
        sc = S.build(spec.scenario, spec.key(), accident_prone=spec.accident_prone)
        return np.round(np.concatenate([np.asarray(sc.x), np.asarray(sc.y), np.asarray(sc.speed)]), 3).tobytes()
    assert not {start(s) for s in specs} & {start(s) for s in eval_specs if s.index < 4}


def _sample(episode, step, command, message=""):
    return D.DistillSample(f"obs {episode} {step}", D.format_action(command, message, compact=True), "s",
                           episode, "t", 1, step)


def test_select_informative_and_dedupe():
    run = [_sample("e", k, "go") for k in range(10)] + [_sample("e", 10, "stop")] + \
          [_sample("e", k, "stop") for k in range(11, 30)] + [_sample("e", 30, "go", "Going straight.")]
    kept = D.select_informative(run, window=2, keep_fraction=0.0)
    assert [s.step for s in kept] == [8, 9, 10, 11, 28, 29, 30]  # around both changes, and the message
    assert len(D.select_informative(run, keep_fraction=1.0)) == len(run)
    dup = [_sample("e", 1, "go")] * 5 + [_sample("f", 1, "go")]
    assert len(D.dedupe(dup, 2)) == 3  # two of the five identical pairs, and the different one
    summary = D.data_summary(run)
    assert summary["by_command"] == {"go": 11, "stop": 20} and summary["samples"] == 31


def test_balance_commands_repeats_rare_commands_up_to_their_share():
    data = [_sample("e", k, "go") for k in range(90)] + [_sample("e", 90 + k, "stop") for k in range(7)] + \
           [_sample("f", k, "change lane left") for k in range(3)]
    out = D.balance_commands(data, 0.1)  # target 10 of 100: stop x2 (14), lane change x4 (12), go untouched
    counts = D.data_summary(out)["by_command"]
    assert counts == {"go": 90, "stop": 14, "change lane left": 12}
    assert out[:100] == data  # originals first, in order
    assert D.balance_commands(data, 0.0) == data and D.balance_commands([], 0.2) == []
    with pytest.raises(ValueError, match="min_share"):
        D.balance_commands(data, 1.0)
    with pytest.raises(ValueError, match="min_command_share"):
        D.StudentConfig(min_command_share=-0.1)


def test_compact_template_trains_only_the_answer():
    tok = D.compact_chat_tokenizer(byte_tokenizer())
    chat = _sample("e", 1, "stop", "Holding.").chat()["messages"]
    assert tok.apply_chat_template(chat[:1], add_generation_prompt=True) == "obs e 1\n"
    row = tokenize_chat(tok, chat)
    trained = tok.decode([i for i, w in zip(row.ids, row.weight) if w > 0], skip_special_tokens=False)
    assert trained == '{"command":"stop","message":"Holding."}<|im_end|>'


def test_student_trains_saves_loads_and_drives(tmp_path, teacher_run):
    specs, results, transitions = teacher_run
    samples = D.select_informative(D.samples_from_episodes(specs, results, transitions, "teacher"), keep_fraction=0.0)
    model, tokenizer = tiny_model()
    config = D.StudentConfig(sft=SFTConfig(optim=OptimConfig(learning_rate=1e-3, trainable="full"), batch_size=4,
                                           max_steps=2, bucket_size=64, max_length=512))
    before = np.asarray(model.embed[...]).copy()
    _, chat_tok, history = D.train_student(model, tokenizer, samples[:16], config, str(tmp_path), progress=False)
    assert len(history) == 2 and not np.allclose(before, np.asarray(model.embed[...]))
    from jax_drive.models import load_pretrained
    from jax_drive.pipelines.engines import EngineSpec, make_engine
    from jax_drive.pipelines.talking_vehicles.presets import PROMPT_BUCKETS

    loaded, _, loaded_tok = load_pretrained(tmp_path / "model")
    assert loaded_tok.chat_template == D.COMPACT_TEMPLATE
    np.testing.assert_allclose(np.asarray(loaded.embed[...]), np.asarray(model.embed[...]), atol=1e-6)
    policy = LanguagePolicy(make_engine(EngineSpec(prompt_buckets=PROMPT_BUCKETS, min_gen_bucket=8, max_batch=64),
                                                loaded, loaded_tok), AgentConfig(style="compact", max_new_tokens=4),
                            key=jax.random.key(1))
    run_specs([EpisodeSpec("tv_red_light", 0, 0, "eval")], policy, max_time=0.6)
    assert [c.agents for c in policy.calls] == [2, 2]
