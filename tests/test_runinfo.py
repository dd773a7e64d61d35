"""The entry-point convention: metadata, atomic JSON, exit codes."""

import argparse
import json
import os
from pathlib import Path

import pytest

from jax_drive.runinfo import (InputError, add_output_args, command_line, require_min, run_main, run_metadata,
                               script_environment, write_json)


def test_metadata_keys():
    meta = run_metadata(benchmark="x")
    for key in ("date_utc", "git_commit", "platform", "python", "cpu_count", "cpu_affinity", "load_average",
                "xla_flags"):
        assert key in meta
    assert meta["benchmark"] == "x"


def test_git_commit_marks_uncommitted_changes(tmp_path, monkeypatch):
    import subprocess

    from jax_drive import runinfo

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "f.txt").write_text("a")
    git("add", "f.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    monkeypatch.setattr(runinfo, "_REPO_ROOT", str(tmp_path))
    clean = runinfo._git_commit()
    assert clean and "+" not in clean
    (tmp_path / "f.txt").write_text("b")
    assert runinfo._git_commit() == clean + "+dirty"


def test_write_json_is_atomic_and_serialises_arrays(tmp_path):
    import numpy as np

    path = write_json(tmp_path / "a" / "b.json", {"x": np.arange(3), "y": (1, 2)})
    assert json.loads(open(path).read()) == {"x": [0, 1, 2], "y": [1, 2]}
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["b.json"]  # no temp file left


def test_exit_codes(capsys):
    def bad(argv):
        raise InputError("--scenes must be >= 1")

    assert run_main(bad) == 2
    assert "error: --scenes must be >= 1" in capsys.readouterr().err
    assert run_main(lambda argv: None) == 0


def test_output_args():
    parser = argparse.ArgumentParser()
    add_output_args(parser)
    args = parser.parse_args([])
    assert args.json is None and args.no_progress is False
    quiet = argparse.ArgumentParser()
    add_output_args(quiet, json_required=True, progress=False)  # a command without progress bars
    assert quiet.parse_args(["--json", "x.json"]).json == "x.json"
    assert not hasattr(quiet.parse_args(["--json", "x.json"]), "no_progress")
    with pytest.raises(SystemExit):
        quiet.parse_args([])


def test_require_min_names_the_flag():
    require_min(1, batch=1, max_time=None, batches=[1, 2])  # None is unset; lists are checked item by item
    with pytest.raises(InputError, match="--max-new-tokens must be >= 1, got 0"):
        require_min(1, batch=3, max_new_tokens=0)
    with pytest.raises(InputError, match="--batches must be >= 1, got -2"):
        require_min(1, batches=[4, -2])
    with pytest.raises(InputError, match="--max-wait-ms must be >= 0, got -0.5"):
        require_min(0, max_wait_ms=-0.5)


def test_command_line_is_relative_to_the_checkout(tmp_path):
    import jax_drive

    script = Path(jax_drive.__file__).parents[1] / "experiments" / "bench_x.py"
    assert command_line(str(script), ["--json", "a b.json"]) == "python experiments/bench_x.py --json 'a b.json'"


def test_script_environment_keeps_what_is_set(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    script_environment()
    assert os.environ["JAX_PLATFORMS"] == "cuda" and os.environ["HF_HUB_OFFLINE"] == "1"
    monkeypatch.delenv("JAX_PLATFORMS")
    script_environment(cpu=False)
    assert "JAX_PLATFORMS" not in os.environ
    script_environment()
    assert os.environ["JAX_PLATFORMS"] == "cpu"
