"""The entry-point convention: metadata, atomic JSON, exit codes."""

import argparse
import json
import os
from pathlib import Path

import pytest

from jax_drive.runinfo import (InputError, add_output_args, check_output, command_line, finite_float, invoked,
                               output_problem, parse_and_run, require_min, require_range, run_main, run_metadata,
                               script_environment, wall_times, write_json, write_results)


def test_metadata_keys():
    meta = run_metadata(benchmark="x")
    for key in ("date_utc", "git_commit", "platform", "python", "cpu_count", "cpu_affinity", "load_average",
                "xla_flags"):
        assert key in meta
    assert meta["benchmark"] == "x"


def test_metadata_records_the_whole_command_line_inside_invoked():
    assert "invocation" not in run_metadata()
    with invoked("jax-drive", ["coop-rl", "--set", "start=a b"]) as text:
        assert run_metadata()["invocation"] == text == "jax-drive coop-rl --set 'start=a b'"
    assert "invocation" not in run_metadata()  # only while the command runs
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "coop_rl.py")
    with invoked(script, ["--preset", "smoke"]):
        assert run_metadata()["invocation"] == "python experiments/coop_rl.py --preset smoke"
    seen = []
    parse_and_run(lambda p: p.add_argument("--n"), lambda a: seen.append(run_metadata()["invocation"]) or 0,
                  ["--n", "3"], prog="demo")
    assert seen == ["demo --n 3"]


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


def test_write_results_writes_the_payload_and_prints_what_is_shown(tmp_path, capsys):
    assert write_results(tmp_path / "r.json", {"meta": {"a": 1}, "speedup": 2.5}, {"speedup": 2.5}, indent=1) == 0
    assert json.loads((tmp_path / "r.json").read_text()) == {"meta": {"a": 1}, "speedup": 2.5}
    assert capsys.readouterr().out == json.dumps({"speedup": 2.5}, indent=1) + "\n"


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
    for bad in (float("nan"), float("inf"), float("-inf")):  # NaN compares False with everything
        with pytest.raises(InputError, match="--max-time must be >= 0"):
            require_min(0, max_time=bad)
    require_range(0, 1, hard_fraction=0.0, other=None)
    for bad in (1.5, float("nan"), float("inf")):
        with pytest.raises(InputError, match=r"--hard-fraction must be in \[0, 1\]"):
            require_range(0, 1, hard_fraction=bad)


def test_finite_float_refuses_nan_and_inf_naming_the_flag(capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=finite_float)
    assert parser.parse_args(["--lr", "1e-4"]).lr == 1e-4
    for text in ("nan", "NaN", "inf", "-inf", "1e400", "x"):
        with pytest.raises(SystemExit) as stop:
            parser.parse_args([f"--lr={text}"])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert "argument --lr:" in err and repr(text) in err


def test_output_problem_finds_every_kind_of_unwritable_path(tmp_path):
    (tmp_path / "file.txt").write_text("x")
    assert output_problem(tmp_path / "new" / "deeper" / "out.json") is None  # parents are created when written
    assert output_problem(tmp_path / "file.txt") is None  # an existing file is overwritten
    assert output_problem(tmp_path / "run", directory=True) is None
    assert output_problem(tmp_path, directory=True) is None
    assert "is a directory, not a file" in output_problem(tmp_path)
    assert "is a file, not a directory" in output_problem(tmp_path / "file.txt", directory=True)
    assert f"{tmp_path / 'file.txt'} is a file, not a directory" in output_problem(tmp_path / "file.txt" / "x.json")
    assert "cannot create files in /proc" in output_problem("/proc/x.json")
    assert "cannot create files in /proc" in output_problem("/proc/new/run", directory=True)
    assert "cannot create files in /sys (Permission denied)" in output_problem("/sys/x.json")  # even for root
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]  # the checks leave nothing behind
    with pytest.raises(InputError, match="^--plot /proc/x.png: cannot create files in /proc"):
        check_output("/proc/x.png", "--plot")


def test_write_json_is_strict_and_lists_what_it_nulled(tmp_path):
    import numpy as np

    payload = {"metrics": {"nc": float("nan"), "ep": 0.5}, "curve": np.array([1.0, np.inf, -np.inf]),
               "count": np.int64(3), "meta": {"ok": True}}
    path = write_json(tmp_path / "r.json", payload)

    def no_constants(name):
        raise AssertionError(f"{name} in strict JSON")

    data = json.loads(open(path).read(), parse_constant=no_constants)
    assert data["metrics"] == {"nc": None, "ep": 0.5} and data["curve"] == [1.0, None, None] and data["count"] == 3
    assert data["non_finite"] == ["$.metrics.nc", "$.curve[1]", "$.curve[2]"]
    assert "non_finite" not in json.loads(open(write_json(tmp_path / "ok.json", {"x": 1.0})).read())
    assert payload["metrics"]["nc"] != payload["metrics"]["nc"]  # the caller's payload is not changed


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


def test_wall_times_times_every_call_once():
    calls = []
    times = wall_times(lambda: calls.append(1), 4)
    assert len(calls) == 4 and len(times) == 4
    assert all(isinstance(t, float) for t in times)
