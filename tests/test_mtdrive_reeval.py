"""Re-evaluating a finished MTDrive run on a larger held-out set (``reevaluate`` and
``experiments/mtdrive_reeval.py``): the rebuilt preset, the policies it loads, and that with
the run's own number of scenes it reproduces the run's evaluation exactly."""

import dataclasses
import json
import os
import sys

import jax
import numpy as np
import pytest

from jax_drive.pipelines.journal import RunDirError
from jax_drive.pipelines.mtdrive import make_held_out, reevaluate, run_mtdrive, run_preset
from jax_drive.pipelines.mtdrive.presets import PRESETS, with_seed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import mtdrive_reeval  # noqa: E402

SMOKE = PRESETS["smoke"]
QUIET = {"progress": False, "log": lambda msg: None}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A smoke run (seed 3) evaluated after SFT and after RL, with its results.json."""
    from jax_drive.pipelines.mtdrive.report import write_results

    out = tmp_path_factory.mktemp("mtdrive") / "run"
    results = run_mtdrive(with_seed(SMOKE, 3), out, evaluate=("sft", "rl"), **QUIET)
    write_results(results, out / "results.json")
    return out, json.loads((out / "results.json").read_text())


def _write_identity(path, preset, **changes):
    record = json.loads(json.dumps(dataclasses.asdict(preset), default=str))
    record.update(changes)
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_text(json.dumps({"pipeline": "mtdrive", "preset": record}))


def test_held_out_sets_grow_by_appending_scenes():
    """A larger set starts with the smaller set's scenes (what makes the first rows comparable)."""
    small = make_held_out(dataclasses.replace(SMOKE, eval_scenes=2))
    large = make_held_out(dataclasses.replace(SMOKE, eval_scenes=5))
    for (s_scenes, s_refs), (l_scenes, l_refs) in zip(small, large):
        np.testing.assert_array_equal(s_refs, l_refs[:2])
        for a, b in zip(jax.tree.leaves(s_scenes), jax.tree.leaves(l_scenes)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[:2])


def test_run_preset_keeps_budget_changes_and_refuses_other_ones(tmp_path):
    preset = with_seed(SMOKE, 2)
    budget = dataclasses.asdict(dataclasses.replace(preset.rl, steps=99))
    _write_identity(tmp_path / "budget", preset, rl=budget, sft_recovery=5)
    rebuilt, identity = run_preset(tmp_path / "budget")
    assert rebuilt == preset and identity["preset"]["rl"]["steps"] == 99
    _write_identity(tmp_path / "changed", preset, max_new_tokens=7)
    with pytest.raises(ValueError, match=r"differs from today's 'smoke' in \['max_new_tokens'\]"):
        run_preset(tmp_path / "changed")
    _write_identity(tmp_path / "unknown", preset, name="nope")
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        run_preset(tmp_path / "unknown")
    with pytest.raises(ValueError, match="holds no MTDrive run"):
        run_preset(tmp_path / "empty")


def test_same_scenes_reproduce_the_runs_evaluation(finished_run, tmp_path, monkeypatch):
    """The tiny random model answers alike before and after training, so the weights each
    evaluation held are checked separately: the run's final SFT and RL adapters, which differ."""
    from jax_drive.pipelines import mtdrive
    from jax_drive.pipelines.mtdrive.presets import rl_config
    from jax_drive.rl.checkpoint import restore_trainable
    from jax_drive.rl.optim import split_model

    def adapters(model, trainable):
        return [np.asarray(x) for x in jax.tree.leaves(split_model(model, trainable)[1])]

    held = []

    def recording_restore(model, optim, directory):
        meta = restore_trainable(model, optim, directory)
        held.append((directory, adapters(model, optim.trainable)))
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
        expected.append((directory, adapters(model, optim.trainable)))
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
    assert mtdrive_reeval.main([str(run), "--eval-scenes", "5", "--evaluate", "sft", "rl", "--out-root",
                                str(tmp_path), "--no-progress"]) == 0
    written = tmp_path / run.name / "results.json"
    assert json.loads(written.read_text())["eval"]["scenes_per_seed"] == 5
    assert mtdrive_seeds.main([str(tmp_path / run.name)]) == 0
    assert "training seeds [3]" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        mtdrive_reeval.main([str(tmp_path / "missing"), "--eval-scenes", "5"])
    assert exit_info.value.code == 2
    assert "holds no MTDrive run" in capsys.readouterr().err
