"""Re-evaluating a finished MTDrive run (``reevaluate``): the preset it rebuilds from the run's
record. What needs a finished run (the policies it loads, the run's evaluation reproduced with
its own number of scenes, larger sets, the front end) is in test_mtdrive_runs.py, beside the
runs it shares."""

import dataclasses
import json

import pytest

from jax_drive.pipelines.mtdrive import run_preset
from jax_drive.pipelines.mtdrive.presets import PRESETS, with_seed

SMOKE = PRESETS["smoke"]


def _write_identity(path, preset, **changes):
    record = json.loads(json.dumps(dataclasses.asdict(preset), default=str))
    record.update(changes)
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_text(json.dumps({"pipeline": "mtdrive", "preset": record}))


def test_run_preset_keeps_budget_changes_and_rebuilds_overridden_fields(tmp_path):
    preset = with_seed(SMOKE, 2)
    budget = dataclasses.asdict(dataclasses.replace(preset.rl, steps=99))
    _write_identity(tmp_path / "budget", preset, rl=budget, sft_recovery=5)
    rebuilt, identity = run_preset(tmp_path / "budget")
    assert rebuilt == preset and identity["preset"]["rl"]["steps"] == 99
    # a run made with --set overrides (free answers): evaluated with the recorded values
    _write_identity(tmp_path / "free", preset, constrain_answers=False, max_new_tokens=24)
    rebuilt, _ = run_preset(tmp_path / "free")
    assert rebuilt == dataclasses.replace(preset, constrain_answers=False, max_new_tokens=24)
    # values today's preset cannot take, fields it lacks
    _write_identity(tmp_path / "refused", preset, max_new_tokens="many")
    with pytest.raises(ValueError, match=r"cannot be rebuilt from today's 'smoke' \(max_new_tokens=many: expected an integer"):
        run_preset(tmp_path / "refused")
    _write_identity(tmp_path / "gone", preset, retired_field=1)
    with pytest.raises(ValueError, match=r"cannot be rebuilt from today's 'smoke' \(retired_field=1: "):
        run_preset(tmp_path / "gone")
    _write_identity(tmp_path / "unknown", preset, name="nope")
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        run_preset(tmp_path / "unknown")
    with pytest.raises(ValueError, match="holds no MTDrive run"):
        run_preset(tmp_path / "empty")
