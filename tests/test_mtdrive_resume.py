"""A pipeline that survives being killed, its building blocks: the run journal, atomic
checkpoints, metrics truncation, the front end's exit codes and flags. SIGKILL of a real
``jax-drive train`` process and ``--resume`` to the end are in test_mtdrive_runs.py."""

import json
import os

import jax
import numpy as np
import pytest

from jax_drive.cli.train import main as train_main
from jax_drive.data.arrays import ragged_from_arrays, ragged_to_arrays, tree_from_arrays, tree_to_arrays
from jax_drive.pipelines.journal import RunDirError, RunJournal
from jax_drive.rl.checkpoint import Checkpointer, RunState, committed_steps, restore_trainable
from jax_drive.rl.logging import MetricsLogger, read_jsonl
from jax_drive.rl.optim import OptimConfig, make_optimizer, split_model
from jax_drive.models.tiny import tiny_policy
from jax_drive.scenes import stack_scenes, straight_road_scene


# ----------------------------------------------------------------------------- building blocks
def test_journal_refuses_a_used_directory_and_a_different_run(tmp_path):
    RunJournal(tmp_path, {"preset": {"seed": 0}}, resume=False)
    with pytest.raises(RunDirError, match="already holds a run"):
        RunJournal(tmp_path, {"preset": {"seed": 0}}, resume=False)
    with pytest.raises(RunDirError, match=r"differs in \['preset'\]"):
        RunJournal(tmp_path, {"preset": {"seed": 1}}, resume=True)
    journal = RunJournal(tmp_path, {"preset": {"seed": 0}}, resume=True)
    assert journal.load("scenes") is None
    written = journal.save("scenes", {"n": np.int64(3), "x": np.float32(0.5)}, {"a": np.arange(4)})
    assert written == {"n": 3, "x": 0.5}
    record, arrays = journal.load("scenes")
    assert record == written
    np.testing.assert_array_equal(arrays["a"], np.arange(4))
    # a fresh (non-resumed) journal never loads a stage
    assert RunJournal(tmp_path / "other", {}, resume=False).load("scenes") is None


def test_scene_and_ragged_round_trips():
    scenes = stack_scenes([straight_road_scene(scene_id=i, ego_speed=5.0 + i) for i in range(2)])
    arrays = tree_to_arrays("train", scenes)
    back = tree_from_arrays("train", arrays, straight_road_scene())
    for a, b in zip(jax.tree.leaves(scenes), jax.tree.leaves(back)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(KeyError):
        tree_from_arrays("held_out0", arrays, straight_road_scene())
    rows = [np.arange(3, dtype=np.int32), np.zeros(0, np.int32), np.arange(5, dtype=np.int32)]
    again = ragged_from_arrays("ids", ragged_to_arrays("ids", rows))
    assert [r.tolist() for r in again] == [r.tolist() for r in rows] and again[0].dtype == np.int32


def test_checkpointer_ignores_and_removes_a_partial_save(tmp_path):
    model, _, _ = tiny_policy(0, lora_rank=4)
    optim = OptimConfig(learning_rate=1e-3)
    _, params, _ = split_model(model, "lora")
    state = RunState(params=params, opt_state=make_optimizer(optim).init(params), rng=jax.random.key(1), step=1)
    ckpt = Checkpointer(tmp_path, max_to_keep=2)
    for step in (1, 2, 3):
        ckpt.save(RunState(params=params, opt_state=state.opt_state, rng=state.rng, step=step, data_position=step))
    ckpt.close()
    assert committed_steps(tmp_path) == [2, 3]  # max_to_keep
    os.makedirs(tmp_path / "4.partial" / "state")  # what a run killed inside a save leaves
    assert Checkpointer(tmp_path).latest_step() == 3
    assert not os.path.exists(tmp_path / "4.partial")
    assert restore_trainable(model, optim, tmp_path)["data_position"] == 3
    with pytest.raises(FileNotFoundError):
        restore_trainable(model, optim, tmp_path / "missing")


def test_resumed_metrics_drop_records_after_the_checkpoint(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in (1, 2, 3):
            logger.log(step, {"loss": float(step)})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "lo')  # torn by a kill
    with MetricsLogger(tmp_path, tensorboard=False, resume_from=2) as logger:
        logger.log(3, {"loss": 30.0})
    assert [(r["step"], r["loss"]) for r in read_jsonl(tmp_path / "metrics.jsonl")] == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_front_end_exit_codes(tmp_path, capsys):
    assert train_main(["--preset", "nope"]) == 2
    assert train_main(["--preset", "smoke", "--advantage", "ppo"]) == 2
    assert train_main(["--preset", "smoke", "--evaluate", "after_rl"]) == 2
    assert train_main(["--preset", "smoke", "--sft-from", str(tmp_path / "none")]) == 2
    assert train_main(["--preset", "smoke", "--set", "sft.max_steps=-1"]) == 2
    assert train_main(["--preset", "smoke", "--set", "sft_max_tokens=1"]) == 2
    assert train_main(["--preset", "smoke", "--set", "sft_recovery=-1"]) == 2
    assert train_main(["--preset", "smoke", "--set", "sft_onpolicy_steps=0"]) == 2
    assert train_main(["--preset", "smoke", "--set", "rl.steps=-1"]) == 2
    assert train_main(["--preset", "smoke", "--set", "rl.prompts_per_step=0"]) == 2
    assert train_main(["--preset", "smoke", "--set", "rl.optim.learning_rate=0"]) == 2
    assert train_main(["--preset", "smoke", "--set", "rl.loss.kl_coef=-0.01"]) == 2
    assert train_main(["--preset", "smoke", "--set", "curation_scenes=0"]) == 2
    assert train_main(["--preset", "smoke", "--set", "curation_easy_ratio=nan"]) == 2
    assert train_main(["--preset", "smoke", "--set", "rl.rollout.improvement_weight=-1"]) == 2
    RunJournal(tmp_path / "run", {"other": True}, resume=False)
    assert train_main(["--preset", "smoke", "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    assert train_main(["--preset", "smoke", "--out", str(tmp_path / "run"), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "sft_recovery must be >= 0" in err and "sft_onpolicy_steps >= 1" in err
    assert "invalid choice: 'nope'" in err and "sft_max_tokens must be >= 2" in err and "--set rl.steps=-1: steps must be >= 0" in err
    assert "prompts_per_step" in err and "learning_rate must be > 0" in err and "curation_scenes must be >= 1" in err
    assert "kl_coef must be >= 0" in err and "curation_easy_ratio must be >= 0, got nan" in err
    assert "improvement_weight must be >= 0, got -1.0" in err
    assert "already holds a run" in err and "holds a different run" in err


def test_budget_flags_reach_the_preset_and_its_card():
    import argparse

    from jax_drive.cli.overrides import preset_with_overrides
    from jax_drive.cli.train import add_arguments
    from jax_drive.pipelines.mtdrive.presets import PRESETS, rl_config
    from jax_drive.pipelines.mtdrive.report import budget_card

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sets = ["sft.max_steps=7", "rl.steps=5", "rl.prompts_per_step=3", "rl.optim.learning_rate=2e-4",
            "curation_scenes=9", "sft_recovery=12", "sft_onpolicy_scenes=64", "sft_onpolicy_steps=8",
            "rl.loss.kl_coef=0.02", "curation_easy_ratio=0", "rl.rollout.improvement_weight=1.5", "sft_max_tokens=999"]
    args = parser.parse_args([a for s in sets for a in ("--set", s)])
    preset = preset_with_overrides(PRESETS["cpu-demo"], args)
    card = budget_card(preset, rl_config(preset))
    assert (card["sft_steps"], card["rl_steps"], card["rl_prompts_per_step"]) == (7, 5, 3)
    assert (card["rl_lr"], card["curation_scenes"], card["sft_recovery"]) == (2e-4, 9, 12)
    assert (card["sft_onpolicy_scenes"], card["sft_onpolicy_steps"], card["sft_max_tokens"]) == (64, 8, 999)
    assert card["kl_coef"] == 0.02 and preset.rl.loss.uses_reference
    assert card["curation_easy_ratio"] == 0.0 and PRESETS["cpu-demo"].curation_easy_ratio == 1.0
    assert card["rl_improvement_weight"] == 1.5 and PRESETS["cpu-demo"].rl.rollout.improvement_weight == 0.0
    assert rl_config(preset).rollout.improvement_weight == 1.5  # survives the prompt / caption merge
    assert preset.rl.rollout.group_size == PRESETS["cpu-demo"].rl.rollout.group_size  # only the bonus changed
    assert preset.rl.loss.clip_eps == PRESETS["cpu-demo"].rl.loss.clip_eps  # only the KL weight changed
    assert preset.rl.optim.trainable == PRESETS["cpu-demo"].rl.optim.trainable  # only the rate changed
    untouched = preset_with_overrides(PRESETS["cpu-demo"], parser.parse_args([]))
    assert untouched == PRESETS["cpu-demo"]
    # every field the flags change is a budget field (re-evaluation rebuilds the rest from the name)
    import dataclasses

    from jax_drive.pipelines.mtdrive.presets import BUDGET_FIELDS

    changed = {f.name for f in dataclasses.fields(preset)
               if getattr(preset, f.name) != getattr(PRESETS["cpu-demo"], f.name)}
    assert changed == set(BUDGET_FIELDS)


def test_curation_uses_the_presets_easy_ratio(monkeypatch):
    """curate() hands the preset's ``curation_easy_ratio`` to the RL builder and maps the
    records it keeps back to indices into the candidate pool."""
    import dataclasses

    import jax
    import numpy as np

    from jax_drive.data import sft as sft_data
    from jax_drive.pipelines.mtdrive.pipeline import curate_scenes
    from jax_drive.pipelines.mtdrive.presets import PRESETS
    from jax_drive.scenes.generator import generate_scenes

    seen = {}

    def fake_build_rl(candidates, predictor, key, config):
        seen["config"], seen["pool"] = config, len(np.asarray(candidates.scene_id))
        ids = np.asarray(candidates.scene_id)
        return [{"scene_id": int(ids[1])}, {"scene_id": int(ids[3])}], {"category_counts": {}}

    monkeypatch.setattr(sft_data, "build_rl", fake_build_rl)
    preset = dataclasses.replace(PRESETS["cpu-demo"], curation_scenes=6, curation_easy_ratio=0.25)
    train = generate_scenes(jax.random.key(0), 8)
    index, _ = curate_scenes(preset, train, engine=None, key=jax.random.key(1))
    assert seen["config"].easy_ratio == 0.25 and seen["pool"] == 6
    assert index.tolist() == [1, 3]


def test_sft_from_accepts_a_run_whose_sft_policy_is_an_onpolicy_continuation(tmp_path, capsys):
    """A run started with --sft-from holds only sft_onpolicy/checkpoints; the front end must
    accept it as an SFT source (the check passes, so the next, bad flag is what fails)."""
    step = tmp_path / "run" / "sft_onpolicy" / "checkpoints" / "3"
    step.mkdir(parents=True)
    (step / "meta.json").write_text("{}")
    assert train_main(["--preset", "smoke", "--sft-from", str(tmp_path / "run"), "--set", "sft.max_steps=-1"]) == 2
    err = capsys.readouterr().err
    assert "no SFT checkpoint" not in err and "steps must be >= 0" in err


def test_sft_from_follows_a_run_that_trained_no_sft_of_its_own(tmp_path, capsys):
    """A run that loaded its SFT policy from another (run.json's sft_from) and collected
    nothing on-policy holds no checkpoint: its SFT policy is its source's, so --sft-from
    of it resolves there (a cycle of such runs ends at the first run, not in a loop)."""
    from jax_drive.pipelines.mtdrive import final_sft_dir, sft_checkpoint_dir

    step = tmp_path / "first" / "sft" / "checkpoints" / "96"
    step.mkdir(parents=True)
    (step / "meta.json").write_text("{}")
    for name, source in (("second", "first"), ("third", "second")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"sft_from": str(tmp_path / source)}))
    assert final_sft_dir(tmp_path / "third") == sft_checkpoint_dir(tmp_path / "first")
    assert train_main(["--preset", "smoke", "--sft-from", str(tmp_path / "third"), "--set", "sft.max_steps=-1"]) == 2
    err = capsys.readouterr().err
    assert "no SFT checkpoint" not in err and "steps must be >= 0" in err

    for name, source in (("a", "b"), ("b", "a")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"sft_from": str(tmp_path / source)}))
    assert final_sft_dir(tmp_path / "a") == sft_checkpoint_dir(tmp_path / "a")
    assert train_main(["--preset", "smoke", "--sft-from", str(tmp_path / "a")]) == 2
    assert "no SFT checkpoint" in capsys.readouterr().err
