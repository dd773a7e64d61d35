"""The entry-point convention: metadata, atomic JSON, exit codes."""

import argparse
import json

from jax_drive.runinfo import InputError, add_output_args, run_main, run_metadata, write_json


def test_metadata_keys():
    meta = run_metadata(benchmark="x")
    for key in ("date_utc", "git_commit", "platform", "python", "cpu_count", "load_average", "xla_flags"):
        assert key in meta
    assert meta["benchmark"] == "x"


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
