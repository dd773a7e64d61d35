"""Diagnostic: the matrix products of SmolLM2-135M in XLA:CPU (JAX) vs torch on this CPU.

The sampler and training-step benchmarks compare whole programs; this one isolates the
kernel both sides spend most of their time in, so that a gap there is visible as such. For
each (M, K, N) shape of the model (decode at batch 1 and 8, prefill / training at 256 and
512 tokens; q/k/v, o, gate/up, down and the LM head), it times ``x @ w`` jitted in JAX and
``x @ w`` in torch, in float32 and bfloat16, on the same inputs.

Usage:
  python experiments/diagnostics/bench_matmul.py [--threads N] [--repeats R] --json OUT

``--threads`` sets torch's intra-op threads; pin the whole process (``taskset -c 0``) to
give XLA the same number of cores. XLA:CPU's library back ends are compared by running it
again under ``XLA_FLAGS`` (recorded in the JSON), e.g.
``XLA_FLAGS=--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY``,
``--xla_cpu_experimental_onednn_fusion_type=dot`` or ``--xla_cpu_experimental_ynn_fusion_type=dot``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import timeit

import numpy as np
from tqdm import tqdm

from jax_drive.runinfo import add_output_args, require_min, run_main, run_metadata, script_environment, write_json

script_environment()

HIDDEN, QKV, INTER, VOCAB = 576, 960, 1536, 49152  # SmolLM2-135M: 9 q heads + 3 kv heads of 64
NUM_LAYERS = 30
PROJECTIONS = {"qkv": (HIDDEN, QKV), "o": (HIDDEN, HIDDEN), "gate_up": (HIDDEN, 2 * INTER),
               "down": (INTER, HIDDEN), "lm_head": (HIDDEN, VOCAB)}
ROWS = {"decode_b1": 1, "decode_b8": 8, "tokens_256": 256, "tokens_512": 512}


def median_seconds(fn, repeats: int) -> float:
    """Median wall seconds of one ``fn()`` over ``repeats`` calls after one warm-up call (JAX compiles there)."""
    fn()
    return statistics.median(timeit.repeat(fn, number=1, repeat=repeats))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch intra-op threads")
    parser.add_argument("--repeats", type=int, default=20)
    add_output_args(parser, json_required=True)
    args = parser.parse_args(argv)
    require_min(1, threads=args.threads, repeats=args.repeats)
    import jax
    import jax.numpy as jnp
    import torch

    torch.set_num_threads(args.threads)
    # XLA:CPU's library back ends (oneDNN, XNNPACK, YNNPACK) are opt-in flags: meta's xla_flags records them.
    meta = run_metadata(benchmark="bench_matmul", threads=args.threads, torch_version=torch.__version__)
    rng = np.random.default_rng(0)
    rows = []
    cases = [(r, p, d) for r in ROWS for p in PROJECTIONS for d in ("float32", "bfloat16")]
    for row_name, proj, dtype in tqdm(cases, desc="shapes", unit="shape", disable=args.no_progress):
        m = ROWS[row_name]
        k, n = PROJECTIONS[proj]
        if proj == "lm_head" and m > 8:
            continue  # training never forms these logits in one product; prefill skips them
        x = rng.standard_normal((m, k), np.float32)
        w = rng.standard_normal((k, n), np.float32) / np.sqrt(k)
        jdt, tdt = (jnp.float32, torch.float32) if dtype == "float32" else (jnp.bfloat16, torch.bfloat16)
        jx, jw = jnp.asarray(x, jdt), jnp.asarray(w, jdt)
        jmm = jax.jit(jnp.matmul)
        tx, tw = torch.from_numpy(x).to(tdt), torch.from_numpy(w).to(tdt)
        j_s = median_seconds(lambda: jmm(jx, jw).block_until_ready(), args.repeats)
        with torch.inference_mode():
            t_s = median_seconds(lambda: tx @ tw, args.repeats)
        flops = 2.0 * m * k * n
        rows.append({"rows": row_name, "m": m, "k": k, "n": n, "projection": proj, "dtype": dtype,
                     "jax_ms": j_s * 1e3, "torch_ms": t_s * 1e3, "jax_gflops": flops / j_s / 1e9,
                     "torch_gflops": flops / t_s / 1e9, "torch_over_jax_speed": j_s / t_s})

    def geo_mean(sel):
        vals = [r["torch_over_jax_speed"] for r in rows if sel(r)]
        return float(np.exp(np.mean(np.log(vals)))) if vals else None

    summary = {f"torch_over_jax_{d}_{kind}": geo_mean(lambda r, d=d, kind=kind: r["dtype"] == d and (
        r["m"] <= 8) == (kind == "decode")) for d in ("float32", "bfloat16") for kind in ("decode", "tokens")}
    # One decode step's products: 30 layers x (qkv, o, gate_up, down) + the LM head.
    for row_name in ("decode_b1", "decode_b8"):
        for dtype in ("float32", "bfloat16"):
            sel = {r["projection"]: r for r in rows if r["rows"] == row_name and r["dtype"] == dtype}
            for side in ("jax", "torch"):
                layer = sum(sel[p][f"{side}_ms"] for p in ("qkv", "o", "gate_up", "down"))
                summary[f"{side}_decode_step_matmul_ms_{row_name}_{dtype}"] = (
                    NUM_LAYERS * layer + sel["lm_head"][f"{side}_ms"])
    out = {
        "meta": meta,
        "timing": f"median of {args.repeats} calls after one warm-up (JAX compilation excluded)",
        "summary_note": "geometric mean over shapes of jax_time / torch_time (> 1: torch faster)",
        **summary,
        "per_shape": rows,
    }
    write_json(args.json, out)
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
