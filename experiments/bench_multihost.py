"""Benchmark: one SFT step and a batched PDM evaluation in 1 process x 2 devices vs 2 processes
x 1 device (JAX's multi-controller runtime, gloo collectives between the processes).

Both layouts run the same program over a 2-device data-parallel mesh; each is started by
``jax_drive.distributed.launch.launch_local`` running this script with ``--worker``. Every
process measures, for

* the SFT step (``make_train_step``: vocab-chunked NLL, global-norm clip, AdamW, full
  fine-tuning, B rows x L tokens): the median step time over the global mesh and the median
  time of the same step on this process's rows alone on one of its devices (no collective);
  ``overhead_share = 1 - local / global`` is the part of the step spent on the gradient
  all-reduce, synchronisation and waiting for the peer;
* the PDM evaluation (``jax_drive.distributed.jobs.score_planner``, PDM-Closed on S generated
  scenes, one chunk per device): the median time of the whole evaluation and of gathering a
  result of the same size from every process (``gather_objects``); ``overhead_share`` is the
  gather's share.

Correctness: the loss and the parameters after one step (max |difference| between the
layouts; float32 summation order of the all-reduce) and the PDM scores (expected identical).
This host has 2 cores: the times are not a speed comparison, only the overhead shares and the
agreement are the result.

Usage:
  python experiments/bench_multihost.py --json OUT [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from jax_drive.runinfo import add_output_args, require_min, run_main, run_metadata, script_environment, write_results

LAYOUTS = (("1x2", 1, 2), ("2x1", 2, 1))  # (name, processes, devices per process)


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(p, json_required=True, progress=False)
    p.add_argument("--rows", type=int, default=8, help="SFT batch rows (even)")
    p.add_argument("--length", type=int, default=128, help="SFT tokens per row")
    p.add_argument("--scenes", type=int, default=32, help="PDM evaluation scenes")
    p.add_argument("--batch-size", type=int, default=8, help="scenes per chunk (one chunk per device)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    p.add_argument("--worker", default=None, metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.length, args.scenes, args.repeats = 4, 64, 16, 2
    require_min(1, rows=args.rows, length=args.length, scenes=args.scenes, batch_size=args.batch_size,
                repeats=args.repeats)
    if args.rows % 2:
        from jax_drive.runinfo import InputError

        raise InputError(f"--rows {args.rows} must be even (split over 2 devices)")
    return args


def median_seconds(fn, repeats: int):
    """(median seconds of ``repeats`` calls after a warm-up call, the warm-up's output); every
    process lines up at a barrier before each call so one's compile time is not the other's wait."""
    import jax

    from jax_drive.parallel import barrier

    barrier("bench-warmup")
    out = jax.block_until_ready(fn())
    times = []
    for i in range(repeats):
        barrier(f"bench-{i}")
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def worker(args) -> int:
    """One process of a layout: measures, and process 0 writes ``DIR/result.json`` and ``DIR/state.npz``."""
    from jax_drive.distributed import multihost

    runtime = multihost.initialize()
    import jax
    import numpy as np
    from bench_mesh import load_model, train_batch  # sibling script (experiments/ is on sys.path when run)

    from jax_drive import parallel
    from jax_drive.distributed.jobs import score_planner
    from jax_drive.rl.optim import OptimConfig, make_optimizer, make_train_step, split_model
    from jax_drive.rl.sft import sft_loss_fn

    mesh = parallel.make_mesh(parallel.MeshConfig(data=-1))
    model = load_model("tiny")
    optim = OptimConfig(learning_rate=1e-4, trainable="full")
    graphdef, params0, rest0 = split_model(model, optim.trainable)
    params0, rest0 = jax.device_get((params0, rest0))
    tx = make_optimizer(optim)
    batch = train_batch(args.rows, args.length, int(model.config.vocab_size))
    own = jax.tree.map(lambda x: x[parallel.process_block(args.rows)], batch)  # this process's rows

    step = make_train_step(graphdef, sft_loss_fn(256), tx, mesh)
    params, rest = (parallel.shard_params(t, mesh) for t in (params0, rest0))
    opt_state = parallel.shard_params(tx.init(params), mesh)
    placed = parallel.shard_batch(own, mesh)
    global_s, (new_params, _, loss, _) = median_seconds(lambda: step(params, rest, opt_state, placed), args.repeats)
    new_params = parallel.host_values(new_params)

    # the same step on one device's rows, on one device of this process, with no collective
    device = jax.local_devices()[0]
    one = make_train_step(graphdef, sft_loss_fn(256), tx, None)
    per_device = jax.tree.map(lambda x: x[: args.rows // 2], own)
    local_params, local_rest = jax.device_put((params0, rest0), device)
    local_opt, local_batch = jax.device_put((tx.init(local_params), per_device), device)
    local_s, _ = median_seconds(lambda: one(local_params, local_rest, local_opt, local_batch), args.repeats)

    score_s, scores = median_seconds(lambda: score_planner("pdm_closed", args.scenes, 7, batch_size=args.batch_size),
                                     args.repeats)
    fields = pdm_fields(scores)
    share = {k: v[parallel.process_block(args.scenes)] for k, v in fields.items()}  # a payload the size of this process's results
    gather_s, _ = median_seconds(lambda: parallel.gather_objects(share), args.repeats)

    if runtime.primary:
        out = Path(args.worker)
        out.mkdir(parents=True, exist_ok=True)
        flat = {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(new_params)}
        np.savez(out / "state.npz", **flat)
        np.savez(out / "scores.npz", **fields)
        record = {
            "processes": runtime.num_processes, "devices": runtime.global_devices,
            "sft": {"loss": float(loss), "step_seconds": global_s, "local_step_seconds": local_s,
                    "overhead_share": max(0.0, 1.0 - local_s / global_s)},
            "pdm": {"evaluation_seconds": score_s, "gather_seconds": gather_s,
                    "overhead_share": min(1.0, gather_s / score_s), "pdms_mean": float(np.mean(scores.pdms))},
        }
        (out / "result.json").write_text(json.dumps(record))
    return 0


def pdm_fields(result) -> dict:
    """The (S,) fields of a PDMResult as NumPy (the violation records left out)."""
    import dataclasses

    import numpy as np

    return {f.name: np.asarray(getattr(result, f.name)) for f in dataclasses.fields(result) if f.name != "violations"}


def compare(dirs: dict[str, Path]) -> dict:
    """Agreement of the 2x1 layout with the 1x2 one."""
    import numpy as np

    results = {name: json.loads((d / "result.json").read_text()) for name, d in dirs.items()}
    (a, da), (b, db) = dirs.items()
    sa, sb = np.load(da / "state.npz"), np.load(db / "state.npz")
    qa, qb = np.load(da / "scores.npz"), np.load(db / "scores.npz")
    return {
        "layouts": results,
        "correctness": {
            "sft_loss_abs_diff": abs(results[a]["sft"]["loss"] - results[b]["sft"]["loss"]),
            "sft_params_max_abs_diff": max(float(np.max(np.abs(sa[k] - sb[k]))) for k in sa.files),
            "pdm_fields_compared": sorted(qa.files),
            "pdm_scores_identical": all(np.array_equal(qa[k], qb[k], equal_nan=True) for k in qa.files),
            "pdm_max_abs_diff": max(float(np.nanmax(np.abs(qa[k].astype(np.float64) - qb[k])) if qa[k].size else 0.0)
                                    for k in qa.files),
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    script_environment(cpu=True)
    from jax_drive.distributed.launch import launch_local

    meta = run_metadata(benchmark="bench_multihost")
    options = ["--rows", str(args.rows), "--length", str(args.length), "--scenes", str(args.scenes),
               "--batch-size", str(args.batch_size), "--repeats", str(args.repeats)]
    dirs = {}
    with tempfile.TemporaryDirectory(prefix="bench_multihost_") as tmp:
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                            os.environ.get("PYTHONPATH")]))}
        for name, processes, devices in LAYOUTS:
            dirs[name] = Path(tmp) / name
            command = [sys.executable, str(Path(__file__).resolve()), *options, "--worker", str(dirs[name]),
                       "--json", str(Path(tmp) / f"{name}.unused.json")]
            report = launch_local(command, processes, devices_per_process=devices, env=env, out=sys.stderr)
            if report.returncode:
                print(report.summary(), file=sys.stderr)
                return 1
        result = {"meta": meta, "config": {k: v for k, v in vars(args).items() if k not in ("json", "worker")},
                  "note": ("2 CPU cores shared by the processes: times are not a speed comparison; the overhead "
                           "shares and the agreement between the layouts are the result"),
                  **compare(dirs)}
    return write_results(args.json, result, result["correctness"], indent=1)


if __name__ == "__main__":
    sys.exit(run_main(main))
