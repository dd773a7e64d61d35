"""The TalkingVehicles pipeline, the `jax-drive coop` command, the experiment script and the
batched-vs-per-agent bench on small settings (tiny random model, smoke preset)."""

import dataclasses
import json
import os
import sys

import numpy as np
import pytest

from jax_drive.cli import main as cli_main
from jax_drive.pipelines import talking_vehicles as TV

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))


def _record(scenario, seed, outcomes, messages=0, nbytes=0):
    return {"episode": f"{scenario}/eval/seed{seed}/0", "scenario": scenario, "seed": seed, "index": 0,
            "accident_prone": True, "policy": "p", "end_time": 10.0, "bytes_sent": nbytes, "messages_sent": messages,
            "outcomes": [{"index": k, "vehicle_id": 100 + k, "outcome": o, "time": 5.0} for k, o in enumerate(outcomes)],
            "metrics": {}, "parse_failures": {"no_json": 1}}


def test_summary_averages_scenarios_per_seed_then_across_seeds():
    records = [_record("a", 0, ["success"]), _record("b", 0, ["collision", "success"], 2, 60),
               _record("a", 1, ["success"]), _record("b", 1, ["timeout", "timeout"])]
    out = TV.summarise_records(records)
    assert out["scenarios"]["b"]["aggregate"]["CR"]["mean"] == pytest.approx(25.0)
    per_seed = out["average"]["per_seed"]
    assert [p["SR"] for p in per_seed] == [75.0, 50.0] and [p["CR"] for p in per_seed] == [25.0, 0.0]
    agg = out["average"]["aggregate"]["SR"]
    assert agg["mean"] == pytest.approx(62.5) and agg["se"] == pytest.approx(np.std([75, 50], ddof=1) / np.sqrt(2))
    assert out["bytes_per_message"] == 30.0 and out["parse_failures"] == {"no_json": 4} and out["episodes"] == 4
    assert out["command_mix"] is None  # records that counted no commands (rule-based, older chunks)
    counted = [dict(r, commands={"keep": 3, "stop": 1}) for r in records[:2]] + [dict(records[2], commands={"go": 4})]
    mix = TV.summarise_records(counted + records[3:])["command_mix"]
    assert mix == {"decisions": 12, "commands": {"keep": 6, "go": 4, "stop": 2}, "keep_share": 0.5}


def test_same_outcomes_compares_every_scenario_and_seed():
    common = [_record("a", 0, ["success"]), _record("a", 1, ["success"]), _record("b", 0, ["collision"])]
    a = TV.summarise_records(common + [_record("b", 1, ["success"])])
    b = TV.summarise_records(common + [_record("b", 1, ["timeout"])])
    assert TV.evaluation.same_outcomes(a, a) == {"scenarios": {"a": True, "b": True}, "all": True}
    assert TV.evaluation.same_outcomes(a, b) == {"scenarios": {"a": True, "b": False}, "all": False}
    result = {"x": dict(a, keep_fallback={"all": True}), "y": dict(b, keep_fallback={"all": False})}
    rows = TV.table_rows(result, ["a", "b"]).splitlines()
    assert rows[2].startswith("x =keep") and rows[3].startswith("y ") and "=keep" not in rows[3]


def test_method_differences_pair_rows_over_seeds_and_scenarios():
    """Communication's effect: the same episodes, row minus baseline per seed and scenario;
    the hierarchical interval draws seeds first, so one seed's gain spans 0 to 100."""
    def summary(outcomes):  # {seed: outcome} in both scenarios
        return TV.summarise_records([_record(n, seed, [o]) for n in ("a", "b") for seed, o in outcomes.items()])

    silent, comm = summary({0: "collision", 1: "collision"}), summary({0: "success", 1: "collision"})
    assert TV.evaluation.seed_scenario_matrix(comm, "SR").tolist() == [[100.0, 100.0], [0.0, 0.0]]
    d = TV.method_differences({"zero_shot_silent": silent, "zero_shot": comm, "distilled": comm})
    assert list(d) == ["communication"] and (d["communication"]["row"], d["communication"]["baseline"]) == (
        "zero_shot", "zero_shot_silent")
    sr, cr = d["communication"]["SR"], d["communication"]["CR"]
    assert (sr["mean"], sr["ci95"], sr["training_seeds"], sr["units"]) == (50.0, [0.0, 100.0], 2, 2)
    assert cr["mean"] == -50.0 and "communication (zero_shot - zero_shot_silent): SR +50.0 [+0.0, +100.0]" in \
        TV.difference_lines(d)
    # in a held-out variation the same pairing reads each row's evaluation there; a row not
    # evaluated in it pairs with nothing
    varied = {"zero_shot_silent": dict(comm, variations={"scale1.3": silent}),
              "zero_shot": dict(silent, variations={"scale1.3": comm}), "reflection": comm}
    d = TV.method_differences(varied, variation="scale1.3")
    assert list(d) == ["communication"] and d["communication"]["SR"]["mean"] == 50.0
    assert TV.method_differences(varied)["communication"]["SR"]["mean"] == -50.0


class Unparseable:
    def generate_chat(self, conversations, params, key):
        from jax_drive.sampling.engine import Completion

        return [Completion((), (1,), "I think we should drive carefully", (0.0,), "length") for _ in conversations]


def test_the_keep_only_reference_is_what_an_agent_that_never_parses_scores():
    from jax_drive.coop.agent import AgentConfig, LanguagePolicy
    from jax_drive.pipelines.talking_vehicles.evaluation import eval_specs, fallback_policy, same_outcomes

    preset = dataclasses.replace(TV.PRESETS["smoke"], max_time=3.0)
    specs = eval_specs(preset, "zero_shot")
    garbled = TV.evaluate(lambda: LanguagePolicy(Unparseable(), AgentConfig()), specs, progress=False)
    reference = TV.evaluate(lambda: fallback_policy(True), specs, progress=False)
    assert garbled["parse_failures"] and not reference["latency"]["new_tokens_per_agent"]
    assert same_outcomes(garbled, reference)["all"]
    # every decision was the fallback: all of them count as keep, as many as the agents asked
    assert garbled["command_mix"]["keep_share"] == 1.0
    assert garbled["command_mix"]["decisions"] == garbled["latency"]["agent_decisions"] > 0


def test_episode_counts_and_presets():
    p = TV.PRESETS["cpu-demo"]
    assert (p.episodes_for("zero_shot"), p.episodes_for("rule_based"), p.episodes_for("distilled")) == (2, 10, 4)
    assert TV.PRESETS["paper"].engine == "openai" and "vllm serve" in TV.PRESETS["paper"].server_command
    with pytest.raises(ValueError):
        dataclasses.replace(p, engine="torch")
    assert tuple(TV.PRESETS) == TV.PRESET_NAMES


def test_cli_rejects_bad_input(capsys):
    with pytest.raises(SystemExit) as stop:  # argparse refuses a scenario it does not list
        cli_main(["coop", "--scenario", "nowhere", "--method", "rule_based"])
    assert stop.value.code == 2 and "invalid choice: 'nowhere'" in capsys.readouterr().err
    assert cli_main(["coop", "--scenario", "tv_red_light", "--episodes", "0"]) == 2
    with pytest.raises(SystemExit):
        cli_main(["coop", "--scenario", "tv_red_light", "--method", "telepathy"])


def test_cli_runs_one_scenario_and_prints_the_table(tmp_path, capsys):
    out = tmp_path / "out.json"
    code = cli_main(["coop", "--preset", "cpu-demo", "--scenario", "tv_red_light", "--method", "rule_based",
                     "--episodes", "2", "--run-dir", str(tmp_path / "run"), "--json", str(out), "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "red_light" in printed and "100.0" in printed and "bytes/msg" in printed
    result = json.loads(out.read_text())["result"]
    assert result["scenarios"]["tv_red_light"]["aggregate"]["SR"]["mean"] == 100.0 and result["episodes"] == 2


class NoEngines(TV.Engines):
    def agent(self):
        raise AssertionError("a saved result or chunk must not run the model again")


def test_llm_method_chunks_resume_without_running_again(tmp_path):
    preset = dataclasses.replace(TV.PRESETS["smoke"], scenarios=("tv_red_light",), max_time=1.1)
    run = str(tmp_path)
    first = TV.run_method(preset, "zero_shot", run, progress=False)
    (key,) = first["chunk_keys"]
    assert os.path.exists(os.path.join(run, f"zero_shot_eval_seed0_{key}.json"))
    lat = first["latency"]
    assert lat["calls"] == 3 and lat["agents_per_call_mean"] == 4.0  # 2 episodes x (car + truck), 3 decisions
    assert first["command_mix"]["decisions"] == 12 and "keep %" in TV.table3_rows({"zero_shot": first})
    assert first["latency"]["agent_seconds_median"] > 0 and first["parse_failures"]
    assert set(first["keep_fallback"]["scenarios"]) == {"tv_red_light"} and "SR" in first["keep_fallback"]["average"]
    again = TV.run_method(preset, "zero_shot", run, engines=NoEngines(preset), progress=False)
    assert again["average"] == first["average"]
    os.remove(os.path.join(run, "zero_shot.json"))  # only the chunk is left: evaluation resumes from it
    resumed = TV.run_method(preset, "zero_shot", run, engines=NoEngines(preset), progress=False)
    assert resumed["average"] == first["average"] and resumed["latency"] == first["latency"]


def _save_student(path, seed):
    """A tiny random 'student' saved as the distillation saves one (merged weights + its tokenizer)."""
    from coop_tiny import tiny_model

    from jax_drive.coop.distill import compact_chat_tokenizer
    from jax_drive.models.export import save_safetensors

    model, tokenizer = tiny_model(seed)
    save_safetensors(model, path, tokenizer=compact_chat_tokenizer(tokenizer))


def _chunks(run, label):
    return sorted(f for f in os.listdir(run) if f.startswith(f"{label}_eval_seed"))


def test_a_retrained_student_is_evaluated_again_and_the_same_one_is_not(tmp_path, monkeypatch):
    """Chunks are keyed by the policy's identity: the student's files (retrained: evaluated
    again, its old chunk left alone), the episodes and the time cap."""
    preset = dataclasses.replace(TV.PRESETS["smoke"], scenarios=("tv_red_light",), max_time=1.1)
    run, student = str(tmp_path / "run"), str(tmp_path / "student")
    _save_student(student, seed=0)
    preset = dataclasses.replace(preset, student_path=student)
    first = TV.run_method(preset, "distilled", run, progress=False)
    assert len(_chunks(run, "distilled")) == 1
    evaluated = []  # the student's evaluations (not the keep-only reference's)
    real = TV.evaluation.evaluate_chunk
    monkeypatch.setattr(TV.evaluation, "evaluate_chunk",
                        lambda *a, **k: (k["label"] == "distilled" and evaluated.append(1)) or real(*a, **k))
    again = TV.run_method(preset, "distilled", run, progress=False, force=True)  # same student: chunk reused
    assert not evaluated and again["chunk_keys"] == first["chunk_keys"] and again["average"] == first["average"]
    _save_student(student, seed=1)  # retrained in place: same path, other weights
    retrained = TV.run_method(preset, "distilled", run, progress=False, force=True)
    assert evaluated == [1] and retrained["chunk_keys"] != first["chunk_keys"]
    assert len(_chunks(run, "distilled")) == 2 and retrained["policy_identity"] != first["policy_identity"]
    shorter = TV.run_method(dataclasses.replace(preset, max_time=0.7), "distilled", run, progress=False, force=True)
    assert evaluated == [1, 1] and shorter["chunk_keys"] != retrained["chunk_keys"]


def test_policy_identities_name_what_decides_the_policy(tmp_path):
    from jax_drive.pipelines.talking_vehicles import identity as ID
    from jax_drive.pipelines.talking_vehicles.methods import METHODS

    preset = TV.PRESETS["smoke"]
    ids = {m: METHODS[m](m, preset, None, str(tmp_path), False).identity for m in ("rule_based", "silent", "zero_shot")}
    assert ids["rule_based"] != ids["silent"] and ids["zero_shot"]["model"] == "tiny"
    quiet = METHODS["zero_shot_silent"]("zero_shot_silent", preset, None, str(tmp_path), False).identity
    assert ID.digest(quiet) != ID.digest(ids["zero_shot"])  # communicate differs
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "a.bin").write_bytes(b"12")
    before = ID.files_digest([str(tmp_path / "w")])
    (tmp_path / "w" / "a.bin").write_bytes(b"13")
    assert ID.files_digest([str(tmp_path / "w")]) != before
    assert ID.model_identity(str(tmp_path / "w")) == {"model_files": ID.files_digest([str(tmp_path / "w")])}


def test_distillation_with_a_dagger_round_builds_every_stage_once(tmp_path, monkeypatch):
    from jax_drive.coop import distill as D

    preset = dataclasses.replace(TV.PRESETS["smoke"], scenarios=("tv_red_light",), distill_episodes=1,
                                 dagger_rounds=1, dagger_episodes=2, max_time=2.0)
    run = str(tmp_path)
    path, info = TV.distill_method(preset, run, progress=False)
    assert path == os.path.join(run, "dagger1", "student", "model") and os.path.exists(os.path.join(path, "config.json"))
    teacher = D.load_samples(os.path.join(run, "distill_data.jsonl"))
    labelled = D.load_samples(os.path.join(run, "dagger1", "data.jsonl"))
    assert {s.episode for s in labelled} == {"tv_red_light/distill/seed0/1", "tv_red_light/distill/seed0/2"}
    assert not {s.episode for s in labelled} & {s.episode for s in teacher}  # new episodes
    (round1,) = info["dagger"]
    assert round1["episodes"] == 2 and round1["aggregated_samples"] == len(teacher) + len(labelled)
    assert round1["train_steps"] == preset.student.sft.max_steps and info["train_steps"] == preset.student.sft.max_steps
    assert not [f for f in os.listdir(run) + os.listdir(os.path.join(run, "dagger1")) if f.endswith(".tmp")]

    def refuse(*args, **kwargs):
        raise AssertionError("a finished stage must be reused, not run again")

    monkeypatch.setattr(D, "train_student", refuse)
    monkeypatch.setattr(D, "collect_student", refuse)
    monkeypatch.setattr(D, "collect_teacher", refuse)
    again, info2 = TV.distill_method(preset, run, progress=False)
    assert again == path and info2["dagger"] == info["dagger"]
    with pytest.raises(ValueError, match="dagger"):
        dataclasses.replace(preset, dagger_rounds=-1)


def test_experiment_script_writes_json_table_and_plots(tmp_path):
    import talking_vehicles as script

    out = tmp_path / "tv.json"
    code = script.main(["--preset", "smoke", "--method", "rule_based", "--method", "silent", "--run-dir",
                        str(tmp_path / "run"), "--json", str(out), "--no-progress"])
    assert code == 0
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"rule_based", "silent"} and "meta" in data and "CR" in data["table"]
    assert data["seed_reference"]["debrief"]["SR_avg"] == pytest.approx(91.65, abs=0.01)
    assert (tmp_path / "tv.png").stat().st_size > 0 and (tmp_path / "tv_storyboard.png").stat().st_size > 0
    assert data["storyboard"]["method"] == "rule_based" and data["storyboard"]["messages"]


def test_every_method_is_also_evaluated_in_the_held_out_variations(tmp_path, capsys):
    """eval_variations: the same episodes in a scaled world, as their own chunks (resumable),
    with the keep-only check, in the result, the printed table and the plot; the silent LLM
    agent answers under the grammar without a message."""
    import talking_vehicles as script

    out, run = tmp_path / "tv.json", tmp_path / "run"
    args = ["--preset", "smoke", "--method", "rule_based", "--method", "zero_shot_silent", "--set", "max_time=1.1",
            "--set", 'scenarios=["tv_red_light"]', "--set", 'eval_variations=["scale1.3"]', "--run-dir", str(run),
            "--json", str(out), "--no-progress"]
    assert script.main(args) == 0
    data = json.loads(out.read_text())
    for method in ("rule_based", "zero_shot_silent"):
        nominal, varied = data["results"][method], data["results"][method]["variations"]["scale1.3"]
        assert varied["episodes"] == nominal["episodes"] and varied["chunk_keys"] != nominal["chunk_keys"]
        (chunk,) = _chunks(run, f"{method}@scale1.3")
        episodes = json.loads((run / chunk).read_text())["records"]
        assert all(r["episode"].endswith("/scale1.3") for r in episodes)
    llm = data["results"]["zero_shot_silent"]
    assert "all" in llm["variations"]["scale1.3"]["keep_fallback"]
    assert not llm["parse_failures"] and llm["bytes_per_message"] == 0.0 and llm["command_mix"]["decisions"] > 0
    assert "scale1.3" in data["variation_table"] and "scale1.3" in capsys.readouterr().out
    assert (tmp_path / "tv.png").stat().st_size > 0
    with pytest.raises(ValueError, match="eval_variations"):
        dataclasses.replace(TV.PRESETS["smoke"], eval_variations=("nominal",))


def test_keep_check_compares_a_results_file_with_the_keep_only_fallback(tmp_path):
    import talking_vehicles as script

    from jax_drive.runinfo import InputError

    results = tmp_path / "tv.json"
    assert script.main(["--preset", "smoke", "--method", "zero_shot", "--set", "max_time=1.1", "--set",
                        "scenarios=[\"tv_red_light\"]", "--run-dir", str(tmp_path / "run"), "--json", str(results),
                        "--no-progress"]) == 0
    out = tmp_path / "check.json"
    assert script.main(["--keep-check", str(results), "--run-dir", str(tmp_path / "check"), "--json", str(out),
                        "--no-progress"]) == 0
    check = json.loads(out.read_text())["keep_fallback"]["zero_shot"]
    saved = json.loads(results.read_text())["results"]["zero_shot"]["keep_fallback"]
    assert check == saved and set(check["scenarios"]) == {"tv_red_light"}
    with pytest.raises(InputError, match="--keep-check"):
        script.main(["--keep-check", str(tmp_path / "check"), "--json", str(tmp_path / "x.json")])


def test_bench_runs_both_paths_at_tiny_size(tmp_path):
    import bench_coop

    out = tmp_path / "bench.json"
    assert bench_coop.main(["--model", "tiny", "--episodes", "2", "--decisions", "2", "--max-new-tokens", "4",
                            "--json", str(out), "--no-progress"]) == 0
    data = json.loads(out.read_text())
    assert data["batched"]["agent_decisions"] == data["per_agent"]["agent_decisions"] == 8
    assert data["batched"]["decisions"] == 2 and data["speedup"] > 0
    assert bench_coop.run_main(bench_coop.main, ["--episodes", "0", "--json", str(tmp_path / "bad.json")]) == 2
    assert not (tmp_path / "bad.json").exists()
