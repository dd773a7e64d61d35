"""Real runs of MTDrive's ``smoke`` preset (tiny random model) and what is checked on them,
in one file so each run is made once and the later ones load the programs the first compiled
(the suite's persistent XLA cache; subprocess runs save every program):

* the front end's uninterrupted ``jax-drive train --preset smoke`` gives the results recorded
  before the redesign (tests/smoke_reference.py). Every run here is in the unconstrained
  setting that reference was recorded in (``--set`` with ``smoke_reference.UNCONSTRAINED``:
  grammars off, 24-token answers, so the untrained model's answers fail and on-policy recovery
  has failures to learn from); the preset's constrained answers run in test_structured_presets.py;
* SIGKILL of a real run inside a training step and inside a checkpoint write, after which
  ``--resume`` must end with the results, metrics and weights of that uninterrupted run
  (the building blocks are tested in test_mtdrive_resume.py);
* re-evaluating a finished run on a larger held-out set (``reevaluate`` and
  ``experiments/mtdrive_reeval.py``): the policies it loads, and that with the run's own
  number of scenes it reproduces the run's evaluation exactly (the rebuilt preset in
  test_mtdrive_reeval.py);
* on-policy format recovery after SFT, resumed and reused by later runs (the data it
  collects is tested in test_mtdrive.py)."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from jax_drive.configs import override
from jax_drive.pipelines.journal import RunDirError
from jax_drive.pipelines.mtdrive import load_policy, make_held_out, reevaluate, rl_checkpoint_dir, run_mtdrive, sft_checkpoint_dir
from jax_drive.pipelines.mtdrive.presets import PRESETS, rl_config, with_seed
from jax_drive.rl.checkpoint import committed_steps, restore_trainable
from jax_drive.rl.logging import read_jsonl
from jax_drive.rl.optim import split_model
from killing import kill_when_paused, run_env
from smoke_reference import UNCONSTRAINED, differences, recorded, reduce_mtdrive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import mtdrive_reeval  # noqa: E402

SMOKE = override(PRESETS["smoke"], UNCONSTRAINED["mtdrive"])
FREE_ANSWERS = [arg for path, value in UNCONSTRAINED["mtdrive"].items()
                for arg in ("--set", f"{path}={json.dumps(value)}")]
QUIET = {"progress": False, "log": lambda msg: None}
# wall-clock and memory figures differ between any two runs; every other metric must not
TIMING_KEYS = {"rollout_seconds", "update_seconds", "rollout_tokens_per_s", "train_tokens_per_s", "peak_rss_gb",
               "tokens_per_s", "step_seconds"}


# ----------------------------------------------------------------------------- killed for real
def _command(out, resume: bool) -> list[str]:
    return [sys.executable, "-m", "jax_drive.cli", "train", "--preset", "smoke", *FREE_ANSWERS, "--out", str(out),
            "--no-progress",
            *(["--resume"] if resume else [])]


def _env(out, pause: str | None = None) -> dict:
    return run_env(out, pause)


def _run_to_end(out, resume: bool = False) -> None:
    proc = subprocess.run(_command(out, resume), env=_env(out), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _kill_at(out, point: str, resume: bool) -> None:
    """Runs until the test hook pauses the run at ``point``, then SIGKILLs it there."""
    kill_when_paused(_command(out, resume), _env(out, point), ROOT, point, out.parent / f"{out.name}_{point}.log")


def _metrics(path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in read_jsonl(path)]


def _adapters(model, trainable: str = "lora") -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(split_model(model, trainable)[1])]


def _final_weights(run_dir, which: str) -> list[np.ndarray]:
    model, _ = load_policy(SMOKE)
    if which == "sft":
        restore_trainable(model, SMOKE.sft.optim, sft_checkpoint_dir(run_dir))
    else:
        restore_trainable(model, rl_config(SMOKE).optim, rl_checkpoint_dir(run_dir))
    return _adapters(model)


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory):
    """The run directory of one uninterrupted ``jax-drive train --preset smoke`` (a subprocess)."""
    out = tmp_path_factory.mktemp("smoke") / "reference"
    _run_to_end(out)
    return out


@pytest.mark.slow
def test_mtdrive_smoke_is_unchanged(uninterrupted_run):
    """MTDrive's ``smoke`` preset, run by the front end, reduces to the values recorded before
    the redesign (the same reduction and tolerances as the other pipelines' comparisons)."""
    with open(uninterrupted_run / "results.json") as f:
        assert differences(reduce_mtdrive(json.load(f)), recorded()["mtdrive"]) == []


@pytest.mark.slow
def test_sigkill_inside_a_checkpoint_write_and_a_training_step_then_resume(uninterrupted_run):
    # beside the reference, so a run without the session's XLA cache shares one with it (see _env)
    reference, killed = uninterrupted_run, uninterrupted_run.parent / "killed"

    # 1. killed inside the write of SFT checkpoint 2: its files are on disk, not committed
    _kill_at(killed, "sft_checkpoint@2", resume=False)
    partial = os.path.join(sft_checkpoint_dir(killed), "2.partial")
    assert os.path.isfile(os.path.join(partial, "meta.json")) and os.listdir(os.path.join(partial, "state"))
    assert committed_steps(sft_checkpoint_dir(killed)) == [1]
    assert sorted(os.listdir(killed / "stages")) == ["eval_untrained.json", "scenes.json", "scenes.npz",
                                                     "sft_data.json", "sft_data.npz"]

    # 2. resumed, then killed inside mtGRPO step 2 (rollouts done, no update yet)
    _kill_at(killed, "grpo_step@2", resume=True)
    assert committed_steps(sft_checkpoint_dir(killed)) == [1, 2]
    assert committed_steps(rl_checkpoint_dir(killed)) == [1]
    assert os.path.exists(killed / "stages" / "rl_curation.json") and not os.path.exists(killed / "stages" / "rl.json")

    # 3. resumed to the end
    _run_to_end(killed, resume=True)
    with open(reference / "results.json") as f:
        want = json.load(f)
    with open(killed / "results.json") as f:
        got = json.load(f)
    assert got["meta"]["command"] == want["meta"]["command"] == "train" and "date_utc" in got["meta"]
    assert got["resumed_stages"] == ["scenes", "eval_untrained", "sft_data", "sft", "eval_sft", "rl_curation"]
    assert want["resumed_stages"] == []
    for key in ("stages", "examples", "data_card", "rl_curation"):
        assert got[key] == want[key], key
    for part in ("sft", "rl"):
        assert _metrics(killed / part / "metrics.jsonl") == _metrics(reference / part / "metrics.jsonl"), part
    assert [r["step"] for r in _metrics(killed / "rl" / "metrics.jsonl")] == [1, 2]
    for part in ("sft", "rl"):
        weights = _final_weights(killed, part)
        for a, b in zip(weights, _final_weights(reference, part)):
            np.testing.assert_array_equal(a, b)
    # the comparison is not vacuous: RL moved the adapters away from the SFT ones
    assert any(not np.array_equal(a, b) for a, b in zip(_final_weights(killed, "rl"), _final_weights(killed, "sft")))



# ----------------------------------------------------------------------------- re-evaluation
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A smoke run (seed 3) evaluated after SFT and after RL, with its results.json."""
    from jax_drive.pipelines.mtdrive.report import write_results

    out = tmp_path_factory.mktemp("mtdrive") / "run"
    results = run_mtdrive(with_seed(SMOKE, 3), out, evaluate=("sft", "rl"), **QUIET)
    write_results(results, out / "results.json")
    return out, json.loads((out / "results.json").read_text())


def test_same_scenes_reproduce_the_runs_evaluation(finished_run, tmp_path, monkeypatch):
    """The tiny random model answers alike before and after training, so the weights each
    evaluation held are checked separately: the run's final SFT and RL adapters, which differ."""
    from jax_drive.pipelines import mtdrive

    held = []

    def recording_restore(model, optim, directory):
        meta = restore_trainable(model, optim, directory)
        held.append((directory, _adapters(model, optim.trainable)))
        return meta

    monkeypatch.setattr(mtdrive.runs, "restore_trainable", recording_restore)
    run, before = finished_run
    results = reevaluate(run, tmp_path / "same", SMOKE.eval_scenes, **QUIET)
    assert json.loads(json.dumps(results["stages"])) == before["stages"]
    assert json.loads(json.dumps(results["examples"])) == before["examples"]
    assert results["eval"] == before["eval"] and results["budget"] == before["budget"]
    steps = {p: c["step"] for p, c in results["reevaluation"]["checkpoints"].items()}
    assert steps == {"sft": SMOKE.sft.max_steps, "rl": SMOKE.rl.steps}

    preset = with_seed(SMOKE, 3)
    expected = []
    for optim, directory in ((preset.sft.optim, mtdrive.sft_checkpoint_dir(run)),
                             (rl_config(preset).optim, mtdrive.rl_checkpoint_dir(run))):
        model, _ = mtdrive.load_policy(preset)
        restore_trainable(model, optim, directory)
        expected.append((directory, _adapters(model, optim.trainable)))
    assert [d for d, _ in held] == [d for d, _ in expected]
    for (_, got), (_, want) in zip(held, expected):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(expected[0][1], expected[1][1]))


def test_more_scenes_per_set_and_a_resumable_journal(finished_run, tmp_path):
    run, before = finished_run
    out = tmp_path / "more"
    results = reevaluate(run, out, SMOKE.eval_scenes + 2, evaluate=("rl",), **QUIET)
    assert set(results["stages"]) == {"rl"} and results["eval"]["scenes_per_seed"] == SMOKE.eval_scenes + 2
    assert [s["scenes"] for s in results["stages"]["rl"]["per_seed"]] == [SMOKE.eval_scenes + 2]
    assert results["reevaluation"]["eval_before"]["scenes_per_seed"] == SMOKE.eval_scenes
    assert results["rl_history"] == before["rl_history"] and results["seed"] == 3
    with pytest.raises(RunDirError, match="already holds a run"):
        reevaluate(run, out, SMOKE.eval_scenes + 2, evaluate=("rl",), **QUIET)
    again = reevaluate(run, out, SMOKE.eval_scenes + 2, evaluate=("rl",), resume=True, **QUIET)
    assert again["resumed_stages"] == ["eval_rl"] and again["stages"] == results["stages"]


def test_bad_requests_are_refused_before_any_work(finished_run, tmp_path):
    run, _ = finished_run
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="eval_scenes must be an integer >= 1"):
            reevaluate(run, tmp_path / "x", bad, **QUIET)
    with pytest.raises(ValueError, match="non-empty subset"):
        reevaluate(run, tmp_path / "x", 2, evaluate=("after_rl",), **QUIET)
    no_rl = tmp_path / "no_rl"
    no_rl.mkdir()
    (no_rl / "run.json").write_text((run / "run.json").read_text())
    (no_rl / "results.json").write_text((run / "results.json").read_text())
    with pytest.raises(FileNotFoundError, match="no RL checkpoint"):
        reevaluate(no_rl, tmp_path / "x", 2, evaluate=("rl",), **QUIET)
    (no_rl / "results.json").unlink()
    with pytest.raises(ValueError, match="no readable results.json"):
        reevaluate(no_rl, tmp_path / "x", 2, **QUIET)
    assert not (tmp_path / "x").exists()


def test_front_end_writes_results_the_seed_summary_reads(finished_run, tmp_path, capsys):
    import mtdrive_seeds

    run, _ = finished_run
    more = SMOKE.eval_scenes + 2  # as above: no new shapes to compile
    assert mtdrive_reeval.main([str(run), "--eval-scenes", str(more), "--evaluate", "sft", "rl", "--out-root",
                                str(tmp_path), "--no-progress"]) == 0
    written = tmp_path / run.name / "results.json"
    assert json.loads(written.read_text())["eval"]["scenes_per_seed"] == more
    assert mtdrive_seeds.main([str(tmp_path / run.name)]) == 0
    assert "training seeds [3]" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        mtdrive_reeval.main([str(tmp_path / "missing"), "--eval-scenes", "5"])
    assert exit_info.value.code == 2
    assert "holds no MTDrive run" in capsys.readouterr().err


def test_held_out_sets_grow_by_appending_scenes():
    """A larger set starts with the smaller set's scenes (what makes the first rows comparable)."""
    # the sizes the re-evaluations above used: their programs are compiled already
    small = make_held_out(SMOKE)
    large = make_held_out(dataclasses.replace(SMOKE, eval_scenes=SMOKE.eval_scenes + 2))
    for (s_scenes, s_refs), (l_scenes, l_refs) in zip(small, large):
        np.testing.assert_array_equal(s_refs, l_refs[:SMOKE.eval_scenes])
        for a, b in zip(jax.tree.leaves(s_scenes), jax.tree.leaves(l_scenes)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[:SMOKE.eval_scenes])


# ----------------------------------------------------------------------------- on-policy recovery
def test_onpolicy_recovery_continues_sft_on_the_policys_own_failures(tmp_path):
    """``sft_onpolicy_scenes``: the SFT policy (the tiny random model: every answer unusable)
    answers fresh scenes; each failure gives an expert row and a recovery row, as many SFT
    rows are replayed, SFT continues for ``sft_onpolicy_steps`` steps, and the continued
    adapters become the run's SFT policy (``final_sft_dir`` / ``load_sft``). A resumed run
    loads both stages from the journal."""
    from jax_drive.pipelines.mtdrive import final_sft_dir, load_sft, onpolicy_checkpoint_dir

    preset = dataclasses.replace(SMOKE, sft_onpolicy_scenes=3, sft_onpolicy_steps=3)
    out = tmp_path / "run"
    result = run_mtdrive(preset, out, skip_rl=True, evaluate=(), progress=False, log=lambda msg: None)
    card = result["sft_onpolicy"]["card"]
    assert (card["scenes"], card["unusable"]) == (3, 3) and len(card["scene_ids"]) == 3
    kept = sum(v for k, v in card["kept"].items() if k != "max_tokens")
    assert kept == 6 and card["replay"] == 6  # one replayed SFT row per on-policy row
    assert [r["step"] for r in result["sft_onpolicy"]["history"]] == [1, 2, 3]
    assert result["budget"]["sft_onpolicy_scenes"] == 3
    assert final_sft_dir(out) == onpolicy_checkpoint_dir(out)

    continued, _ = load_policy(preset)
    assert load_sft(continued, preset, out)["step"] == 3  # the SFT stage itself ran 2 steps
    before, _ = load_policy(preset)
    restore_trainable(before, preset.sft.optim, sft_checkpoint_dir(out))
    assert any(not np.array_equal(a, b) for a, b in zip(_adapters(before), _adapters(continued)))

    again = run_mtdrive(preset, out, skip_rl=True, evaluate=(), resume=True, progress=False, log=lambda msg: None)
    assert {"onpolicy_data", "sft_onpolicy"} <= set(again["resumed_stages"])
    assert again["sft_onpolicy"] == result["sft_onpolicy"]

    # a later run that reuses this one's SFT policy gets the continued adapters, and can
    # continue them once more on its own collection (the replay rows are rebuilt)
    reuse = run_mtdrive(preset, tmp_path / "reuse", sft_from=out, skip_rl=True, evaluate=(), progress=False,
                        log=lambda msg: None)
    assert reuse["data_card"]["sft_steps"] == 3 and reuse["sft_onpolicy"]["card"]["replay"] == 6
    assert reuse["data_card"]["sft_checkpoint"] == onpolicy_checkpoint_dir(out)
    assert final_sft_dir(tmp_path / "reuse") == onpolicy_checkpoint_dir(tmp_path / "reuse")
    # one more link: "reuse" trained no SFT stage itself, so the SFT loss curve comes from "run"
    third = run_mtdrive(dataclasses.replace(preset, sft_onpolicy_scenes=0), tmp_path / "third",
                        sft_from=tmp_path / "reuse", skip_rl=True, evaluate=(), progress=False, log=lambda msg: None)
    assert third["data_card"]["sft_checkpoint"] == onpolicy_checkpoint_dir(tmp_path / "reuse")
    assert third["sft_history"] == result["sft_history"] and len(result["sft_history"]) == 2
