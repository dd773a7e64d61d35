"""SFT across processes, a process killed mid-run, and --resume with another process count.

One SFT run of 4 steps on a 2 x 4 mesh (``jax-drive scale-out job sft``, a checkpoint every
step) three ways:
  * the reference: this pytest process, 1 process x 8 devices;
  * 2 processes x 4 devices, launched by ``jax-drive scale-out launch``; both pause at step 3
    (the step computed, not yet recorded or checkpointed: ``JAX_DRIVE_PAUSE_AT``) and process 1
    is SIGKILLed there. Process 0 must end on its own (the runtime's heartbeat timeout), and the
    launcher must exit 1 naming process 1;
  * ``--resume`` in 4 processes x 2 devices: restores checkpoint 2 (written by the 2 processes)
    and runs steps 3 and 4.
The losses of all four steps and the Adam moments of checkpoints 2 (restored here, in one
process) and 4 equal the reference's within rtol 1e-5, atol 1e-7; the parameters within rtol
1e-5, atol 1e-6 (0.1% of one step at lr 1e-3). Both runs compute every device's rows alike
(one 2 x 4 mesh), but the gradient sums across devices run in another order (XLA's in-process
all-reduce here, gloo's across processes), and Adam divides a near-zero gradient by its own
RMS, so that rounding moves its weight by more than float32 eps (as tests/multidevice explains;
measured: 1.7e-7 after 2 steps).
"""

import json
import signal
import sys

import jax
import numpy as np
import pytest

from conftest import launch, Launch

from jax_drive.cli import main as cli_main
from jax_drive.models.tiny import tiny_policy
from jax_drive.parallel import MeshConfig, make_mesh, shard_model, shard_params
from jax_drive.rl.checkpoint import Checkpointer, RunState, committed_steps
from jax_drive.rl.logging import read_jsonl
from jax_drive.rl.optim import OptimConfig, make_optimizer, split_model

RTOL, ATOL = 1e-5, 1e-7
PARAMS_ATOL = 1e-6
STEPS = 4


def _data(path):
    """24 conversations of one length (one compiled step shape)."""
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghij klmnopqrstuvwxyz"))
    with open(path, "w") as f:
        for _ in range(24):
            question, answer = ("".join(rng.choice(letters, n)) for n in (40, 24))
            f.write(json.dumps({"messages": [{"role": "user", "content": question},
                                             {"role": "assistant", "content": answer}]}) + "\n")
    return path


def _job(data, out, *extra) -> list[str]:
    return ["scale-out", "job", "sft", "--data", str(data), "--out", str(out), "--steps", str(STEPS), "--mesh", "2,4",
            "--batch-size", "8", "--bucket-size", "32", "--no-progress", *extra]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    data = _data(root / "chat.jsonl")
    assert cli_main(_job(data, root / "reference")) == 0
    return data, root


def _restore(directory, step):
    """Checkpoint ``step`` restored in this process into the 2 x 4 mesh (parameters, Adam state)."""
    model = tiny_policy(seed=0, lora_rank=4)[0]
    mesh = make_mesh(MeshConfig(2, 4))
    shard_model(model, mesh)
    _, params, _ = split_model(model, "lora")
    template = RunState(params=params, opt_state=shard_params(make_optimizer(OptimConfig()).init(params), mesh),
                        rng=jax.random.key(0))
    ckpt = Checkpointer(directory)
    try:
        state, meta = ckpt.restore(template, step)
    finally:
        ckpt.close()
    return state, meta


def _assert_states_equal(actual, expected):
    for part, atol in (("params", PARAMS_ATOL), ("opt_state", ATOL)):
        pairs = zip(jax.tree_util.tree_leaves_with_path(jax.device_get(getattr(expected, part))),
                    jax.tree.leaves(jax.device_get(getattr(actual, part))))
        for (path, e), a in pairs:
            np.testing.assert_allclose(a, e, rtol=RTOL, atol=atol, err_msg=part + jax.tree_util.keystr(path))


def test_killed_process_ends_the_run_and_resume_in_other_process_count_continues(runs):
    data, root = runs
    out = root / "multi"
    job = [sys.executable, "-m", "jax_drive.cli", *_job(data, out)]
    run = Launch(["--processes", "2", "--devices-per-process", "4", "--", *job], JAX_DRIVE_PAUSE_AT="sft_step@3")
    run.wait_for("[1] jax-drive: paused at sft_step@3", timeout=900)
    pid = int(run.wait_for("jax-drive launch: process 1 of 2 pid", timeout=1).split(" pid ")[1].split()[0])
    import os

    os.kill(pid, signal.SIGKILL)
    assert run.wait(timeout=120) == 1  # the survivor fails on its own: no hang
    assert f"process 1 (pid {pid} on localhost) was killed by SIGKILL first" in run.output
    # process 0 says which process stopped answering
    assert any(line.startswith("[0]") and "unhealthy" in line for line in run.lines), run.output[-3000:]
    assert "process 0" in run.output.split("FAILED")[1]
    checkpoints = out / "checkpoints"
    assert committed_steps(checkpoints) == [1, 2]

    # written by 2 processes, restored here in 1
    restored, meta = _restore(checkpoints, 2)
    assert meta["step"] == 2 and meta["data_position"] == 2
    _assert_states_equal(restored, _restore(root / "reference" / "checkpoints", 2)[0])

    resumed = launch(["--processes", "4", "--devices-per-process", "2", "--", *job, "--resume"], timeout=900)
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert "all 4 processes finished" in resumed.output
    assert committed_steps(checkpoints) == [2, 3, 4]
    _assert_states_equal(_restore(checkpoints, 4)[0], _restore(root / "reference" / "checkpoints", 4)[0])

    got, want = read_jsonl(out / "metrics.jsonl"), read_jsonl(root / "reference" / "metrics.jsonl")
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, STEPS + 1))
    np.testing.assert_allclose([r["loss"] for r in got], [r["loss"] for r in want], rtol=RTOL, atol=ATOL)
    assert got[-1]["loss"] < got[0]["loss"]
