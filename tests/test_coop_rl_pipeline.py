"""The coop-RL pipeline (``jax-drive coop-rl --preset smoke``, a random tiny model): a run
SIGKILLed inside a training step continues with ``--resume`` to the results, metrics and
weights of an uninterrupted run; the run directory refuses a second run and a resume with
another preset; the summary's paired difference on hand-made rows."""

from __future__ import annotations

import json
import os
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
