"""``jax-drive scale-out launch --ray``: one Ray actor per process on a real local Ray instance
(several raylet worker processes on this machine, placement ``PACK`` since it is one node).
The launched JAX processes form one runtime and give the 1-process PDM evaluation exactly; a
process that fails is named by the launcher, which exits 1."""

import sys

import numpy as np
import pytest

import workload
from conftest import HERE, ROOT, launch

RAY = ["--ray", "local", "--placement", "PACK", "--cpus-per-host", "1", "--heartbeat-timeout", "120",
       "--env", f"PYTHONPATH={ROOT}"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("one_process")
    workload.run(out, ("scores",))
    return out


def test_ray_launched_processes_score_as_one_process(reference, tmp_path):
    out = tmp_path / "ray"
    run = launch([*RAY, "--processes", "2", "--devices-per-process", "4", "--",
                  sys.executable, str(HERE / "workload.py"), str(out), "scores"], timeout=900)
    assert run.returncode == 0, run.output[-3000:]
    assert "all 2 processes finished" in run.output
    assert sum("Ray node" in line for line in run.lines) == 2  # each process placed by its own actor
    want, got = np.load(reference / "scores.npz"), np.load(out / "scores.npz")
    assert sorted(got.files) == sorted(want.files)
    for key in want.files:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_ray_launch_names_the_failed_process(tmp_path):
    fail_second = "import os, sys; sys.exit(3 if os.environ['JAX_DRIVE_PROCESS_ID'] == '1' else 0)"
    run = launch([*RAY, "--processes", "2", "--grace", "10", "--", sys.executable, "-c", fail_second], timeout=300)
    assert run.returncode == 1, run.output[-3000:]
    first = run.output.split("FAILED")[1].splitlines()[0]
    assert "process 1" in first and "exited with status 3" in first
