"""Benchmark: throughput of the PDM scorer and of one trainer step vs the number of devices.

For each device count k (1, 2, 4, ... up to the devices present), runs

* the scorer: ``jax_drive.pdm.score_proposals`` on S scenes x P proposals, the scenes split
  over a ``MeshConfig(data=k)`` mesh (``jax_drive.parallel``);
* the trainer: one SFT step (``make_train_step``: vocab-chunked NLL, global-norm clip, AdamW,
  full fine-tuning) on B rows x L tokens, once data-parallel (``MeshConfig(data=k)``, the
  weights replicated) and once FSDP (``MeshConfig(fsdp=k)``, weights and Adam moments split);

and reports the median time of ``--repeats`` calls after a warm-up call (compilation), the
throughput (proposals/s, tokens/s), the speed-up over k = 1, and the largest difference from
the single-device result (scores: expected exactly 0; loss and parameters after one step:
float32 summation order, ~1e-6).

This is for hosts with several real accelerators (a multi-GPU host, a TPU slice). On a CPU,
``--simulate N`` makes XLA pretend to have N devices that share the host's cores: ratios there
are not device scaling. They mix the cost of the partitioned program and its collectives
(the trainer step got slower) with the use of cores that the one-device program left idle
(each simulated device runs on its own thread, so the scorer got faster on 2 cores); that run
shows the code paths work and agree with one device.

Usage:
  python experiments/bench_mesh.py --json OUT                        # the devices present
  python experiments/bench_mesh.py --simulate 8 --quick --json OUT   # CPU, 8 simulated devices
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from tqdm import tqdm

from jax_drive.runinfo import (InputError, add_output_args, require_min, run_main, run_metadata,
                              script_environment, wall_times, write_results)


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(p, json_required=True)
    p.add_argument("--simulate", type=int, default=0,
                   help="on a CPU: pretend to have this many devices (sets XLA_FLAGS before JAX starts)")
    p.add_argument("--devices", default=None, help="comma-separated device counts (default 1, 2, 4, .. all)")
    p.add_argument("--scenes", type=int, default=64)
    p.add_argument("--proposals", type=int, default=64)
    p.add_argument("--rows", type=int, default=16, help="trainer batch rows (a multiple of every device count)")
    p.add_argument("--length", type=int, default=256, help="trainer tokens per row")
    p.add_argument("--model", default="tiny", help="'tiny' (random, byte vocab) or a load_pretrained name")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    args = p.parse_args(argv)
    if args.quick:
        args.scenes, args.proposals, args.rows, args.length, args.repeats = 16, 8, 8, 64, 2
    require_min(1, scenes=args.scenes, proposals=args.proposals, rows=args.rows, length=args.length,
                repeats=args.repeats)
    require_min(0, simulate=args.simulate)
    if args.devices is not None:
        try:
            args.devices = [int(c) for c in args.devices.split(",")]
        except ValueError:
            raise InputError(f"--devices wants comma-separated integers, got {args.devices!r}") from None
        require_min(1, devices=args.devices)
    return args


def device_counts(asked: list[int] | None, available: int) -> list[int]:
    """1, 2, 4, .. up to ``available`` (or the ``asked`` counts, each <= available)."""
    counts = asked or [2 ** i for i in range(available.bit_length()) if 2 ** i <= available]
    bad = [c for c in counts if c > available]
    if bad:
        raise InputError(f"device counts {bad} not available ({available} devices; on a CPU use --simulate)")
    return counts


def proposals_for(scenes, count: int):
    """(S, count, 8, 3) constant-speed proposals (0.5x .. 1.5x the ego speed, lateral offsets
    -2 .. 2 m) and the (S, 40, 3) reference at the ego speed."""
    import jax.numpy as jnp

    speed = jnp.linalg.norm(scenes.ego.velocity, axis=-1)[:, None, None]  # (S, 1, 1)
    frac = jnp.linspace(0.0, 1.0, count)[None, :, None]
    t8 = 0.5 * jnp.arange(1, 9)
    x = speed * (0.5 + frac) * t8
    y = jnp.broadcast_to((4.0 * frac - 2.0) * t8 / t8[-1], x.shape)
    proposals = jnp.stack([x, y, 0.05 * jnp.arctan2(y, jnp.maximum(x, 1.0))], axis=-1)
    t40 = 0.1 * jnp.arange(1, 41)
    ref_x = speed[:, 0] * t40
    reference = jnp.stack([ref_x, jnp.zeros_like(ref_x), jnp.zeros_like(ref_x)], axis=-1)
    return proposals, reference


def timed(fn, repeats: int) -> tuple[float, object]:
    """(median seconds of ``repeats`` calls after one warm-up call, the warm-up's output)."""
    import jax

    out = jax.block_until_ready(fn())
    return statistics.median(wall_times(lambda: jax.block_until_ready(fn()), repeats)), out


def max_diff(a, b) -> float:
    import jax
    import numpy as np

    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(jax.tree.leaves(jax.device_get(a)), jax.tree.leaves(jax.device_get(b))))


def load_model(name: str):
    if name == "tiny":
        from jax_drive.models.tiny import tiny_policy

        return tiny_policy(seed=0, lora_rank=None)[0]
    from jax_drive.models import load_pretrained

    return load_pretrained(name)


def train_batch(rows: int, length: int, vocab: int) -> dict:
    """B rows of ``length + 1`` random tokens, the second half carrying loss."""
    import numpy as np

    from jax_drive.data.tokens import TokenRow
    from jax_drive.rl.batching import pad_rows

    rng = np.random.default_rng(0)
    weight = np.zeros(length + 1, np.float32)
    weight[length // 2:] = 1.0
    token_rows = [TokenRow(rng.integers(0, vocab, length + 1).astype(np.int32), weight) for _ in range(rows)]
    return pad_rows(token_rows, length, pad_id=0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.simulate:  # before JAX starts its backend
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={args.simulate}"
                                   " --xla_cpu_collective_call_terminate_timeout_seconds=600").strip()
    script_environment(cpu=bool(args.simulate))
    import jax  # heavy imports only after the arguments are checked

    from jax_drive import parallel
    from jax_drive.parallel import MeshConfig
    from jax_drive.pdm import score_proposals
    from jax_drive.rl.optim import OptimConfig, make_optimizer, make_train_step, split_model
    from jax_drive.rl.sft import sft_loss_fn
    from jax_drive.scenes import generate_scenes

    counts = device_counts(args.devices, jax.device_count())
    if any(args.rows % c for c in counts):
        raise InputError(f"--rows {args.rows} must be a multiple of every device count {counts}")
    meta = run_metadata(benchmark="bench_mesh", simulated_devices=args.simulate or None)
    scenes = generate_scenes(jax.random.key(7), args.scenes)
    proposals, reference = proposals_for(scenes, args.proposals)
    model = load_model(args.model)
    batch = train_batch(args.rows, args.length, int(model.config.vocab_size))
    optim = OptimConfig(learning_rate=1e-4, trainable="full")
    graphdef, params0, rest0 = split_model(model, optim.trainable)
    params0, rest0 = jax.device_get((params0, rest0))  # host copies: each run places its own
    tx = make_optimizer(optim)

    def trainer(mesh_config):
        mesh = parallel.make_mesh(mesh_config)
        step = make_train_step(graphdef, sft_loss_fn(256), tx, mesh)
        params, rest = (parallel.shard_params(t, mesh) if mesh is not None else jax.device_put(t)
                        for t in (params0, rest0))
        opt_state = parallel.shard_params(tx.init(params), mesh)
        placed = parallel.shard_batch(batch, mesh) if mesh is not None else jax.device_put(batch)
        return lambda: step(params, rest, opt_state, placed)

    records, base = [], {}
    jobs = [(k, part) for k in counts for part in ("scorer", "train_data", "train_fsdp")]
    for k, part in tqdm(jobs, desc="bench_mesh", disable=args.no_progress):
        if part == "scorer":
            mesh = parallel.make_mesh(MeshConfig(data=k))
            seconds, out = timed(lambda: score_proposals(scenes, proposals, reference, mesh=mesh), args.repeats)
            rate, unit = args.scenes * args.proposals / seconds, "proposals_per_s"
        else:
            mesh_config = MeshConfig(data=k) if part == "train_data" else MeshConfig(fsdp=k)
            seconds, (params, _, loss, _) = timed(trainer(mesh_config), args.repeats)
            out = (loss, params)
            rate, unit = args.rows * args.length / seconds, "tokens_per_s"
        if k == 1 and part != "train_fsdp":
            base[part] = (rate, out)
        ref_rate, ref_out = base["scorer" if part == "scorer" else "train_data"]
        record = {"part": part, "devices": k, "seconds": seconds, unit: rate, "speedup_vs_1": rate / ref_rate,
                  "max_abs_diff_vs_1": max_diff(out, ref_out)}
        if part != "scorer":
            record["loss_abs_diff_vs_1"] = max_diff(out[0], ref_out[0])
        records.append(record)
        tqdm.write(json.dumps(record), file=sys.stderr)
    result = {
        "meta": meta,
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "note": ("simulated CPU devices share the host's cores: the ratios are not device scaling; this run "
                 "checks that the sharded paths agree with one device") if args.simulate else "",
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "no_progress")},
        "results": records,
    }
    return write_results(args.json, result, records, indent=1)


if __name__ == "__main__":
    sys.exit(run_main(main))
