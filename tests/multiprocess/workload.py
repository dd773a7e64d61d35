"""What the equivalence tests run in every process of a launched run, and in the pytest
process as the 1-process x 8-device reference: one mtGRPO update on a fixed batch over a
2 x 4 mesh, a batched PDM evaluation and a batch of cooperative episodes. Process 0 writes
the results to OUT_DIR (update.npz, update.json, scores.npz, episodes.json).

    python tests/multiprocess/workload.py OUT_DIR [update|scores|episodes ...]
                                      (joins the run from JAX_DRIVE_*; default: all parts)
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

MESH = (2, 4)
SCORE = dict(name="pdm_closed", num_scenes=16, seed=7, batch_size=8)
EPISODES = dict(scenarios=["tv_red_light"], seeds=[0], episodes=8, max_time=4.0)
LEARNING_RATE = 1e-3  # of the mtGRPO update


def grpo_batch(rows: int = 16, length: int = 32) -> dict:
    """The fixed mtGRPO training batch of tests/multidevice (random tokens, a loss on their later
    part), loaded by path: this file also runs as a script in the launched processes."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "multidevice" / "test_parallel_train.py"
    spec = importlib.util.spec_from_file_location("multidevice_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._grpo_batch(rows, length)


def grpo_step():
    """(params, Adam state, metrics) after mu = 2 epochs x 2 mini-batches of the clipped loss +
    K3 KL on the fixed batch; this process passes only its rows; NumPy values of the whole state."""
    import jax

    from jax_drive import parallel
    from jax_drive.models.tiny import tiny_policy
    from jax_drive.rl.grpo import GRPOConfig, grpo_update
    from jax_drive.rl.loss import LossConfig
    from jax_drive.rl.optim import OptimConfig, copy_tree, make_optimizer, split_model

    mesh_config = parallel.MeshConfig(*MESH)
    config = GRPOConfig(optim=OptimConfig(learning_rate=LEARNING_RATE), loss=LossConfig(kl_coef=0.05), minibatch_size=8,
                        ppo_epochs=2, chunk_size=64, mesh=mesh_config)
    batch = grpo_batch()
    own = jax.tree.map(lambda x: x[parallel.process_block(len(x))], batch)
    model = tiny_policy(seed=0, lora_rank=4)[0]
    mesh = parallel.make_mesh(mesh_config)
    parallel.shard_model(model, mesh)
    graphdef, params, rest = split_model(model, "lora")
    opt_state = parallel.shard_params(make_optimizer(config.optim).init(params), mesh)
    ref = jax.tree.map(lambda x: x + 0.01, copy_tree(params))
    params, opt_state, metrics = grpo_update(graphdef, params, rest, opt_state, ref, own, config, jax.random.key(3))
    return parallel.host_values(params), parallel.host_values(opt_state), metrics


def flat(tree) -> dict[str, np.ndarray]:
    import jax

    return {jax.tree_util.keystr(path): np.asarray(x) for path, x in jax.tree_util.tree_leaves_with_path(tree)}


def scores():
    from jax_drive.distributed.jobs import score_planner

    result = score_planner(SCORE["name"], SCORE["num_scenes"], SCORE["seed"], batch_size=SCORE["batch_size"])
    return {f.name: np.asarray(getattr(result, f.name)) for f in dataclasses.fields(result) if f.name != "violations"}


def episodes() -> list[dict]:
    from jax_drive.distributed.episodes import plan_episodes, result_part
    from jax_drive.distributed.jobs import run_episode_plan

    specs = plan_episodes(EPISODES["scenarios"], EPISODES["seeds"], EPISODES["episodes"],
                          max_time=EPISODES["max_time"])
    return [result_part(r) for r in run_episode_plan(specs, chunk_size=4)]


PARTS = ("update", "scores", "episodes")


def run(out: Path, parts: tuple[str, ...] = PARTS) -> None:
    """The chosen parts (all by default), in every process; process 0 writes their files."""
    from jax_drive.parallel import is_primary

    update = grpo_step() if "update" in parts else None
    score = scores() if "scores" in parts else None
    records = episodes() if "episodes" in parts else None
    if not is_primary():
        return
    out.mkdir(parents=True, exist_ok=True)
    if update is not None:
        params, opt_state, metrics = update
        np.savez(out / "update.npz", **{f"params{k}": v for k, v in flat(params).items()},
                 **{f"opt{k}": v for k, v in flat(opt_state).items()})
        (out / "update.json").write_text(json.dumps(metrics))
    if score is not None:
        np.savez(out / "scores.npz", **score)
    if records is not None:
        (out / "episodes.json").write_text(json.dumps(records))


if __name__ == "__main__":  # workload.py OUT [PART ...]
    from jax_drive.distributed import multihost

    multihost.initialize()
    run(Path(sys.argv[1]), tuple(sys.argv[2:]) or PARTS)
