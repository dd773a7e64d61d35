"""Benchmark: episodes per second of N Ray scenario workers against one, and against the
in-process batched runner, on the JAX simulator; and the per-episode overhead Ray adds.

Peers, all on the same episodes (``--scenario``, ``--episodes`` episodes of seed 1000+, the
rule-based policy, alternating accident-prone and safe), timed after warm-up (compilation
and process start are reported apart, never in the rates):
  * ``inproc_batch``: :func:`jax_drive.coop.runner.run_episodes` on all episodes in one batch
    (the fastest this machine does them; what a single process with the batched core gets).
  * ``inproc_chunks``: the worker's code without Ray (:class:`ScenarioWorker` in this
    process) on chunks of ``--chunk-size``: the same work one Ray worker does.
  * ``ray_w{W}``: a :class:`ScenarioPool` of W workers (local Ray, one process each) on the
    same chunks, results written to a fresh :class:`ResultStore`.
  * ``ray_null_w1``: one worker with a backend that does no simulation: the cost of a
    scheduled chunk (Ray call, record, atomic store write, journal) alone.
Overhead per episode = (ray_w1 wall - inproc_chunks wall) / episodes.

On a 2-core machine more than 2 workers oversubscribe the cores (each JAX process also
runs its own XLA threads): the curve says what that costs; it does not show cluster
scaling. Canonical run (quiet machine):

    python experiments/bench_ray.py --episodes 32 --workers 1,2,4 --json OUT.json

Quick check: ``--episodes 4 --workers 1,2``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from jax_drive.names import SCENARIOS
from jax_drive.runinfo import InputError, add_output_args, output_dir, require_min, run_main, run_metadata, write_json


class NullBackend:
    """A backend that simulates nothing: measures the pool's own cost per chunk."""

    name = "null"

    def describe(self):
        return {"backend": self.name}

    def make(self):
        return self

    def run(self, specs, progress=None):
        from jax_drive.coop.runner import EpisodeResult

        return [EpisodeResult(scenario=s.scenario, accident_prone=s.accident_prone, background=s.background,
                              policy="null", outcomes=[], end_time=0.0, bytes_sent=0, messages_sent=0,
                              metrics={"n": 0}) for s in specs]

    def close(self):
        pass


def _rate(n: int, wall: float) -> float:
    return n / wall if wall > 0 else float("nan")


def bench_inprocess(specs, chunks, backend) -> dict:
    from jax_drive.distributed.worker import ScenarioWorker

    worker = ScenarioWorker(backend)
    t0 = time.perf_counter()
    worker.runner.run(specs)  # warm-up: compile the whole-batch shapes
    worker.run(chunks[0])  # and the chunk shapes
    warmup = time.perf_counter() - t0
    t0 = time.perf_counter()
    worker.runner.run(specs)
    batch_wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    records = [r for chunk in chunks for r in worker.run(chunk)]
    chunk_wall = time.perf_counter() - t0
    n = len(specs)
    return {"warmup_s": warmup,
            "inproc_batch": {"wall_s": batch_wall, "episodes_per_s": _rate(n, batch_wall)},
            "inproc_chunks": {"wall_s": chunk_wall, "episodes_per_s": _rate(n, chunk_wall)},
            "records": {r["episode_id"]: r for r in records}}


def bench_pool(backend, workers: int, specs, warm_specs, chunk_size: int, show_progress: bool) -> dict:
    from jax_drive.distributed.pool import PoolConfig, ScenarioPool
    from jax_drive.distributed.store import ResultStore

    config = PoolConfig(num_workers=workers, chunk_size=chunk_size, cpus_per_worker=1.0)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        pool = ScenarioPool(backend, config)
        try:
            pool.start()
            start = time.perf_counter() - t0
            t0 = time.perf_counter()
            if warm_specs:
                pool.run(warm_specs, ResultStore(os.path.join(tmp, "warm")), show_progress=False)
            warm = time.perf_counter() - t0
            store = ResultStore(os.path.join(tmp, "timed"))
            t0 = time.perf_counter()
            summary = pool.run(specs, store, show_progress=show_progress)
            wall = time.perf_counter() - t0
            records = {r["episode_id"]: r for r in store.records()}
            nodes = sorted({s.info.get("node_id") for s in pool.slots})
        finally:
            pool.shutdown()
    if not summary.complete:
        raise RuntimeError(f"pool run incomplete: {summary.to_json()}")
    return {"workers": workers, "start_s": start, "warmup_s": warm, "wall_s": wall,
            "episodes_per_s": _rate(len(specs), wall), "nodes": len(nodes), "records": records}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="tv_red_light", choices=SCENARIOS)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
    parser.add_argument("--chunk-size", type=int, default=4)
    parser.add_argument("--xla-cache", default=None, metavar="DIR", type=output_dir,
                        help="persistent XLA cache for the workers (default: a temporary one)")
    add_output_args(parser, json_required=True)
    args = parser.parse_args(argv)
    try:
        counts = sorted({int(w) for w in args.workers.split(",") if w.strip()})
    except ValueError:
        raise InputError(f"--workers wants comma-separated integers, got {args.workers!r}") from None
    if not counts:
        raise InputError("--workers names no worker count")
    require_min(1, workers=counts, episodes=args.episodes, chunk_size=args.chunk_size)

    import jax

    from jax_drive.distributed.backends import JaxBackend
    from jax_drive.distributed.episodes import chunk_specs, plan_episodes, result_part
    from jax_drive.distributed.pool import init_ray

    specs = plan_episodes([args.scenario], [1000], args.episodes)
    warm = plan_episodes([args.scenario], [2000], args.chunk_size * max(counts))
    chunks = chunk_specs(specs, args.chunk_size)
    # Ray first: starting it forks, which is unsafe once JAX runs threads in this process
    resources = init_ray(num_cpus=max(max(counts), os.cpu_count() or 1))
    with tempfile.TemporaryDirectory() as cache:
        backend = JaxBackend(xla_cache_dir=args.xla_cache or cache)
        print(f"in-process: {args.episodes} episodes of {args.scenario}", file=sys.stderr)
        inproc = bench_inprocess(specs, chunks, backend)
        pools = {}
        for w in counts:
            print(f"ray: {w} worker(s)", file=sys.stderr)
            pools[f"ray_w{w}"] = bench_pool(backend, w, specs, warm, args.chunk_size, not args.no_progress)
        null = bench_pool(NullBackend(), 1, specs, warm[:args.chunk_size], args.chunk_size, False)
    import ray

    ray.shutdown()
    reference = {i: result_part(r) for i, r in inproc.pop("records").items()}
    identical = all({i: result_part(r) for i, r in p.pop("records").items()} == reference for p in pools.values())
    null.pop("records")
    base = pools[f"ray_w{counts[0]}"]["episodes_per_s"] if counts[0] == 1 else None
    for p in pools.values():
        p["speedup_vs_1_worker"] = p["episodes_per_s"] / base if base else None
        p["vs_inproc_batch"] = p["episodes_per_s"] / inproc["inproc_batch"]["episodes_per_s"]
    overhead = None
    if "ray_w1" in pools:
        overhead = (pools["ray_w1"]["wall_s"] - inproc["inproc_chunks"]["wall_s"]) / args.episodes
    out = {
        "meta": run_metadata(benchmark="bench_ray", scenario=args.scenario, episodes=args.episodes,
                             chunk_size=args.chunk_size, workers=counts, ray_resources=resources,
                             jax_backend=jax.default_backend()),
        "inproc_warmup_s": inproc["warmup_s"],
        "inproc_batch": inproc["inproc_batch"],
        "inproc_chunks": inproc["inproc_chunks"],
        **pools,
        "ray_null_w1": {**null, "per_chunk_s": null["wall_s"] / len(chunks),
                        "per_episode_s": null["wall_s"] / args.episodes},
        "ray_overhead_per_episode_s": overhead,
        "results_identical_to_inproc": identical,
    }
    print(f"{'peer':16s}{'episodes/s':>12s}{'wall s':>10s}{'speedup':>10s}")
    for name in ("inproc_batch", "inproc_chunks", *pools):
        row = out[name]
        speed = row.get("speedup_vs_1_worker")
        print(f"{name:16s}{row['episodes_per_s']:12.2f}{row['wall_s']:10.2f}{'' if speed is None else f'{speed:10.2f}'}")
    print(f"null backend, 1 worker: {1e3 * out['ray_null_w1']['per_chunk_s']:.1f} ms per chunk of {args.chunk_size}")
    if overhead is not None:
        print(f"Ray overhead per episode (1 worker vs in-process chunks): {1e3 * overhead:.1f} ms")
    print(f"results identical to in-process: {identical}")
    write_json(args.json, out)
    print(f"results: {args.json}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(run_main(main))
