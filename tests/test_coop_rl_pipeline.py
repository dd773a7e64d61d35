"""The coop-RL pipeline (``jax-drive coop-rl --preset smoke``, a random tiny model): a run
SIGKILLed inside a training step continues with ``--resume`` to the results, metrics and
weights of an uninterrupted run; the run directory refuses a second run and a resume with
another preset; the summary's paired difference on hand-made rows; the distilled start (the
teacher's answers in the grammar's own strings, trained once, then the start and
``distilled`` rows)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from jax_drive.cli import main as cli_main
from jax_drive.pipelines import coop_rl as P
from jax_drive.rl.checkpoint import committed_steps
from jax_drive.rl.logging import read_jsonl
from killing import kill_when_paused, run_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING_KEYS = {"rollout_seconds", "update_seconds", "decisions_per_s", "peak_rss_gb", "step_seconds"}


def _args(out, resume: bool = False, *extra: str) -> list[str]:
    return ["coop-rl", "--preset", "smoke", "--out", str(out), "--no-progress", *(["--resume"] if resume else []),
            *extra]


def _command(out, resume: bool = False, *extra: str) -> list[str]:
    return [sys.executable, "-m", "jax_drive.cli", *_args(out, resume, *extra)]


def _env(out, pause: str | None = None) -> dict:
    return run_env(out, pause)


def _run(out, resume: bool = False, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(_command(out, resume, *extra), env=_env(out), cwd=ROOT, capture_output=True, text=True,
                          timeout=900)


def _metrics(path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in read_jsonl(path)]


def _weights(run_dir, seed: int = 0) -> list[np.ndarray]:
    from jax_drive.rl.checkpoint import restore_trainable

    preset = P.PRESETS["smoke"]
    model, _ = P.load_policy_model(preset)
    restore_trainable(model, preset.train.optim, os.path.join(run_dir, f"seed{seed}", "checkpoints"))
    from jax_drive.rl.optim import split_model

    return [np.asarray(x) for x in jax.tree.leaves(split_model(model, preset.train.optim.trainable)[1])]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("coop_rl") / "reference"
    proc = _run(out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_sigkill_inside_a_training_step_then_resume_gives_the_uninterrupted_run(reference):
    killed = reference.parent / "killed"
    kill_when_paused(_command(killed), _env(killed, "coop_grpo_step@2"), ROOT, "coop_grpo_step@2",
                     reference.parent / "killed.log")
    assert committed_steps(os.path.join(killed, "seed0", "checkpoints")) == [1]
    assert not os.path.exists(killed / "results.json")
    finished = sorted(os.listdir(killed / "eval"))
    assert finished == ["rule_based.json", "start.json"]  # evaluated before training: read back on resume

    proc = _run(killed, resume=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    want, got = (json.loads((d / "results.json").read_text()) for d in (reference, killed))
    for key in ("summary", "grpo_vs_start", "rows", "preset"):
        assert got[key] == want[key], key
    assert _metrics(killed / "seed0" / "metrics.jsonl") == _metrics(reference / "seed0" / "metrics.jsonl")
    records = _metrics(reference / "seed0" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["parse_failures"] == 0 and r["decisions"] > 0 for r in records)  # constrained answers parse
    for a, b in zip(_weights(killed), _weights(reference)):
        np.testing.assert_array_equal(a, b)
    # not vacuous: training moved the weights away from the start policy's
    start, _ = P.load_policy_model(P.PRESETS["smoke"])
    from jax_drive.rl.optim import split_model

    initial = [np.asarray(x) for x in jax.tree.leaves(split_model(start, "full")[1])]
    assert any(not np.array_equal(a, b) for a, b in zip(_weights(reference), initial))
    assert (reference / "curves.png").stat().st_size > 0 and (reference / "storyboard.png").stat().st_size > 0
    assert got["storyboard"] == want["storyboard"] and got["storyboard"]["policy"] == "grpo"


def _cli(capsys, out, resume: bool = False, *extra: str) -> tuple[int, str, str]:
    """``jax-drive coop-rl`` in this process (the refusals below need no fresh process): its
    exit code, stdout and stderr."""
    capsys.readouterr()
    code = cli_main(_args(out, resume, *extra))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_run_directory_refuses_a_second_run_and_another_preset_on_resume(reference, capsys):
    code, _, err = _cli(capsys, reference)
    assert code == 2 and "already holds a run: --resume continues it" in err
    code, _, err = _cli(capsys, reference, True, "--set", "train.steps=3")
    assert code == 2 and "another preset (fields differ: train)" in err
    code, _, err = _cli(capsys, reference, True, "--only-seed", "7")
    assert code == 2 and "--only-seed 7: not one of the preset's training seeds [0]" in err
    # one seed of a finished run: read back, no summary written
    before = (reference / "results.json").stat().st_mtime_ns
    code, out, err = _cli(capsys, reference, True, "--only-seed", "0")
    assert code == 0 and "training seed 0 trained and evaluated" in out, err[-2000:]
    assert (reference / "results.json").stat().st_mtime_ns == before
    code, _, err = _cli(capsys, reference.parent / "bad", False, "--set", "train.group_size=1")
    assert code == 2 and "group_size" in err


def test_a_resume_that_adds_a_held_out_variation_only_adds_its_evaluations(reference, capsys):
    import shutil

    run = reference.parent / "varied"
    shutil.copytree(reference, run)
    before = json.loads((run / "results.json").read_text())
    code, out, err = _cli(capsys, run, True, "--set", 'eval_variations=["scale1.3"]')
    assert code == 0, err[-2000:]
    after = json.loads((run / "results.json").read_text())
    for key in ("summary", "grpo_vs_start", "messages_dropped_vs_grpo", "rows", "curves"):
        assert after[key] == before[key], key  # the nominal results are read back, not recomputed
    assert json.loads((run / "preset.json").read_text())["eval_variations"] == ["scale1.3"]
    assert sorted(p for p in os.listdir(run / "eval") if "@" in p) == [
        "grpo_messages_dropped_seed0@scale1.3.json", "grpo_seed0@scale1.3.json", "rule_based@scale1.3.json",
        "start@scale1.3.json"]
    varied = after["variations"]["scale1.3"]
    assert set(varied["summary"]) == {"rule_based", "start", "zero_shot", "grpo", "grpo_messages_dropped"}
    assert varied["role"] == "held-out variation" and varied["summary"]["zero_shot"]["same_as"] == "start"
    tags = [r["tag"] for r in varied["rows"]["start"]["0"]]
    assert tags == [r["tag"] + "/scale1.3" for r in after["rows"]["start"]["0"]]  # the same episodes, scaled
    assert varied["grpo_vs_start"]["sr_diff"]["episodes"] == len(tags) and "method (scale1.3: held-out" in out
    # a zero-shot model added on resume: its evaluations only, in every evaluated world
    code, out, err = _cli(capsys, run, True, "--set", 'eval_variations=["scale1.3"]', "--set", "zero_shot_model=tiny")
    assert code == 0, err[-2000:]
    zero = json.loads((run / "results.json").read_text())
    assert (run / "eval" / "zero_shot.json").exists() and (run / "eval" / "zero_shot@scale1.3.json").exists()
    for block in (zero, zero["variations"]["scale1.3"]):
        assert "same_as" not in block["summary"]["zero_shot"] and block["summary"]["zero_shot"]["seeds"] == 1
    assert zero["rows"]["start"] == before["rows"]["start"] and list(zero["not_run"]) == ["distilled"]
    code, _, err = _cli(capsys, run, True, "--set", 'eval_variations=["nominal"]')
    assert code == 2 and "eval_variations must be distinct names among" in err
    # a run recorded before a field existed ran with its default: accepted; another value is not
    recorded = json.loads((run / "preset.json").read_text())
    del recorded["distill_episodes"]
    (run / "preset.json").write_text(json.dumps(recorded))
    code, _, err = _cli(capsys, run, True, "--set", 'eval_variations=["scale1.3"]')
    assert code == 0, err[-2000:]
    code, _, err = _cli(capsys, run, True, "--set", 'eval_variations=["scale1.3"]', "--set", "distill_episodes=2")
    assert code == 2 and "another preset (fields differ: distill_episodes)" in err


def test_the_training_worlds_evaluation_is_named_so_and_other_scaled_worlds_held_out():
    import dataclasses

    smoke = P.PRESETS["smoke"]
    preset = dataclasses.replace(smoke, train=dataclasses.replace(smoke.train, variation="scale1.5"),
                                 eval_variations=("scale1.3", "scale1.5"))
    assert P.variation_role(preset, "scale1.5") == "training world, held-out episodes"
    assert P.variation_role(preset, "scale1.3") == "held-out variation"
    assert P.variation_role(smoke, "scale1.5") == "held-out variation"  # smoke trains on nominal episodes


def test_paired_difference_and_summary_on_hand_made_rows():
    start = [{"tag": t, "sr": s, "cr": c} for t, s, c in (("a", 0.0, 100.0), ("b", 50.0, 0.0), ("c", 100.0, 0.0))]
    trained = {0: [{"tag": "c", "sr": 100.0, "cr": 0.0}, {"tag": "a", "sr": 100.0, "cr": 0.0},
                   {"tag": "b", "sr": 50.0, "cr": 50.0}],
               1: [{"tag": "a", "sr": 50.0, "cr": 0.0}, {"tag": "b", "sr": 100.0, "cr": 0.0},
                   {"tag": "c", "sr": 100.0, "cr": 0.0}]}
    sr = P.paired_difference(trained, start, "sr")
    # per episode over seeds: a +75, b +25, c 0 -> mean 33.3; the bootstrap stays inside [0, 75]
    assert sr["mean"] == pytest.approx(100.0 / 3.0) and sr["episodes"] == 3 and sr["training_seeds"] == 2
    assert 0.0 <= sr["ci95"][0] <= sr["mean"] <= sr["ci95"][1] <= 75.0
    cr = P.paired_difference(trained, start, "cr")
    assert cr["mean"] == pytest.approx((-100.0 + 25.0 + 0.0) / 3.0)
    # a per-seed reference pairs each seed with its own rows: seed 0 - seed 1 and back
    swapped = P.paired_difference(trained, {0: trained[1], 1: trained[0]}, "sr")
    assert swapped["mean"] == pytest.approx(0.0) and swapped["ci95"] == pytest.approx([0.0, 0.0])
    summary = P.method_summary(trained)  # per-seed means 83.3 and 83.3: sem 0
    assert summary["sr"] == {"mean": pytest.approx(250.0 / 3.0), "sem": 0.0} and summary["seeds"] == 2
    assert summary["cr"]["mean"] == pytest.approx(25.0 / 3.0) and summary["cr"]["sem"] == pytest.approx(50.0 / 6.0)


def test_teacher_answers_are_rewritten_as_the_action_grammar_writes_them():
    from jax_drive.coop.agent import COMMANDS
    from jax_drive.coop.distill import DistillSample
    from jax_drive.sampling.grammar import action_grammar
    from jax_drive.sampling.grammar.regex import parse, to_regex

    def sample(answer):
        return DistillSample("car 7 m/s, go straight.", answer, "tv_red_light", "tv_red_light/distill/seed0/0", "t")

    compact = [sample('{"command":"slow down","message":"Pedestrian crossing ahead, stop"}'),
               sample('{"command":"keep"}'), sample('{"command":"go","message":"say \\"hi\\""}')]
    got = [s.answer for s in P.grammar_answers(compact, 16)]
    assert got == ['{"command": "slow down", "message": "Pedestrian cross"}', '{"command": "keep", "message": ""}',
                   '{"command": "go", "message": "say \\"hi\\""}']
    pattern = to_regex(parse(action_grammar(tuple(COMMANDS), 16).pattern), python=True)
    assert all(re.fullmatch(pattern, a) for a in got)  # the very strings the trained policy may write
    assert not re.fullmatch(pattern, compact[0].answer)  # the student's compact form is not one of them


def test_distilled_start_stage_trains_once_and_becomes_the_start_and_distilled_rows(tmp_path):
    import dataclasses

    from flax import nnx

    from jax_drive.coop.distill import load_samples
    from jax_drive.rl.sft import SFTConfig

    base = P.PRESETS["smoke"]
    preset = dataclasses.replace(
        base, distill_episodes=1, distill_seeds=(0,), distill_epsilons=(0.0,),
        student=dataclasses.replace(base.student, sft=SFTConfig(optim=base.train.optim, batch_size=4, max_steps=2,
                                                                bucket_size=32, max_length=256)))
    info = P.distill_start(preset, str(tmp_path), progress=False)
    samples = load_samples(tmp_path / "start" / "data.jsonl")
    assert samples and info["data"]["samples"] == len(samples) and [r["step"] for r in info["sft"]] == [1, 2]
    assert all(s.episode.split("/")[1] == "distill" and s.answer.startswith('{"command": "') for s in samples)
    weights = tmp_path / "start" / "model" / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert P.distill_start(preset, str(tmp_path), progress=False) == info and weights.stat().st_mtime_ns == stamp
    model, _ = P.load_policy_model(preset, P.start_source(preset, str(tmp_path)))
    random, _ = P.load_policy_model(base)
    params = [jax.tree.leaves(nnx.state(m, nnx.Param)) for m in (model, random)]
    assert any(not np.array_equal(a, b) for a, b in zip(*params))  # the start policy is the fine-tuned model, not the random one

    rows = [{"tag": "a", "seed": 0, "sr": 100.0, "cr": 0.0}, {"tag": "b", "seed": 0, "sr": 0.0, "cr": 100.0}]
    one = {"rule_based": {0: rows}, "start": {0: rows}, "grpo": {0: rows}, "grpo_messages_dropped": {0: rows}}
    summary = P.summarise(dataclasses.replace(preset, eval_seeds=(0,)), one, {}, info)
    assert summary["summary"]["distilled"] == summary["summary"]["start"] | {"same_as": "start"}
    assert "distilled" not in summary["not_run"] and summary["distillation"] == info
    assert "distilled" in P.summarise(dataclasses.replace(base, eval_seeds=(0,)), one, {})["not_run"]
    # a saved student passed as the model (the TalkingVehicles one) is the distilled row too
    given = P.summarise(dataclasses.replace(base, eval_seeds=(0,), model=str(tmp_path / "start" / "model")), one, {})
    assert given["summary"]["distilled"] == given["summary"]["start"] | {"same_as": "start"}
    assert list(given["not_run"]) == ["zero_shot"] and str(tmp_path) in given["not_run"]["zero_shot"]
    # ... whose base model's zero-shot answers, when evaluated, are a row of their own
    zero = [{"tag": "a", "seed": 0, "sr": 0.0, "cr": 0.0}, {"tag": "b", "seed": 0, "sr": 0.0, "cr": 100.0}]
    with_zero = P.summarise(dataclasses.replace(base, eval_seeds=(0,), model=str(tmp_path / "start" / "model"),
                                                zero_shot_model="tiny"), one | {"zero_shot": {0: zero}}, {})
    assert with_zero["summary"]["zero_shot"]["sr"]["mean"] == 0.0 and with_zero["summary"]["zero_shot"]["seeds"] == 1
    assert with_zero["summary"]["zero_shot"]["cr"]["mean"] == 50.0 and with_zero["not_run"] == {}
    # a start that is not distilled is the zero-shot policy itself
    plain = P.summarise(dataclasses.replace(base, eval_seeds=(0,)), one, {})
    assert plain["summary"]["zero_shot"] == plain["summary"]["start"] | {"same_as": "start"}
