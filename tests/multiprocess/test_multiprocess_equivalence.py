"""2 processes x 4 devices give the 1-process x 8-device results: an mtGRPO update on a fixed
batch (metrics and Adam moments within rtol 1e-5, atol 1e-7; parameters within rtol 1e-5 and
1 % of one Adam step), a batched PDM evaluation and a batch of cooperative episodes (exactly). The reference is this pytest
process running the same code (tests/multiprocess/workload.py) with no runtime started."""

import json
import sys

import numpy as np
import pytest

import workload
from conftest import HERE, launch

RTOL, ATOL = 1e-5, 1e-7
# Adam moves an element by about lr * m / sqrt(v): where the gradient is near zero that ratio
# turns the all-reduce's float rounding into a visible change (once 4e-6, 0.4 % of one step at
# lr 1e-3). A wrong reduction would move parameters by whole steps, so 1 % of one still catches it.
PARAM_ATOL = 1e-2 * workload.LEARNING_RATE


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("one_process")
    workload.run(out)
    return out


@pytest.fixture(scope="session")
def two_processes(tmp_path_factory):
    out = tmp_path_factory.mktemp("two_processes")
    # a patient heartbeat: on a loaded shared host a busy process can miss 30 s of heartbeats
    run = launch(["--processes", "2", "--devices-per-process", "4", "--heartbeat-timeout", "120", "--",
                  sys.executable, str(HERE / "workload.py"),
                  str(out)], timeout=1500)
    assert run.returncode == 0, run.output[-3000:]
    return out


def test_grpo_update_in_two_processes_equals_one(reference, two_processes):
    want, got = (json.loads((d / "update.json").read_text()) for d in (reference, two_processes))
    assert got["optimizer_steps"] == want["optimizer_steps"] == 4
    for name in ("loss", "pg_loss", "kl", "grad_norm", "clip_frac", "ratio_mean", "logp_mismatch"):
        np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)
    want, got = (np.load(d / "update.npz") for d in (reference, two_processes))
    assert sorted(got.files) == sorted(want.files) and any(k.startswith("opt") for k in want.files)
    for key in want.files:
        atol = PARAM_ATOL if key.startswith("params") else ATOL
        np.testing.assert_allclose(got[key], want[key], rtol=RTOL, atol=atol, err_msg=key)
    # the update moved the adapters (B starts at zero)
    assert any(np.abs(want[k]).max() > 0 for k in want.files if k.startswith("params") and "lora_b" in k)


def test_pdm_evaluation_in_two_processes_equals_one_exactly(reference, two_processes):
    want, got = (np.load(d / "scores.npz") for d in (reference, two_processes))
    assert want["pdms"].shape == (workload.SCORE["num_scenes"],)
    for key in want.files:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    pdms = want["pdms"]
    assert np.isfinite(pdms).all() and pdms.max() > 0 and len(np.unique(pdms)) > 1


def test_episodes_in_two_processes_equal_one_exactly(reference, two_processes):
    want, got = (json.loads((d / "episodes.json").read_text()) for d in (reference, two_processes))
    assert len(want) == workload.EPISODES["episodes"]
    assert got == want
    assert len({r["episode_id"] for r in want}) == len(want)
