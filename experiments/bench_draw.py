"""Micro-benchmark: drawing one token per row from (B, V) logits, three ways, in one run.

* ``categorical``: ``jax.random.categorical`` (one Gumbel per vocabulary entry), the
  sampler's previous draw;
* ``two_level``: :func:`jax_drive.sampling.selection.two_level_gumbel_max` (Gumbel-max
  over 256-entry blocks by log-mass, then within the block), the sampler's draw;
* ``inverse_cdf``: one uniform per row against the running sum of the probabilities (the
  cheapest exact draw; tried and not adopted, see below).

Reported per method: milliseconds per draw (jitted, median of ``--repeats`` after a warm-up)
at each batch size of ``--batches``, and the fraction of draws that change, with the same
key, when every logit is perturbed by relative noise ``--noise`` (what float rounding does
between two equivalent computations, e.g. a shared-prefix prefill and a plain one).

    python experiments/bench_draw.py --json OUT
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from jax_drive.runinfo import (add_output_args, command_line, finite_float, require_min, run_main, run_metadata,
                               write_json)


def inverse_cdf(key, logits):
    """Peer: index of the first running probability sum above one uniform per row."""
    import jax
    import jax.numpy as jnp

    cdf = jnp.cumsum(jax.nn.softmax(logits, axis=-1), axis=-1)
    u = jax.random.uniform(key, (logits.shape[0], 1))
    return jnp.minimum(jnp.sum(cdf <= u, axis=-1), logits.shape[-1] - 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49_152, help="V (SmolLM2's vocabulary)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32, 64])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--noise", type=finite_float, default=1e-5, help="relative logit noise of the robustness check")
    parser.add_argument("--noise-rows", type=int, default=4096)
    add_output_args(parser, json_required=True, progress=False)
    args = parser.parse_args(argv)
    require_min(1, vocab=args.vocab, batches=args.batches, repeats=args.repeats, noise_rows=args.noise_rows)
    require_min(0, noise=args.noise)

    import jax
    import numpy as np

    from jax_drive.sampling.selection import two_level_gumbel_max

    methods = {"categorical": lambda k, x: jax.random.categorical(k, x, axis=-1),
               "two_level": two_level_gumbel_max, "inverse_cdf": inverse_cdf}
    rng = np.random.default_rng(0)
    report = {"benchmark": "bench_draw", "vocab": args.vocab, "noise": args.noise,
              "timing": "jitted, median ms per draw of all rows after one warm-up call", "ms_per_draw": {},
              "changed_draws_under_noise": {}}
    for batch in args.batches:
        logits = jax.numpy.asarray(rng.normal(0, 3, (batch, args.vocab)), jax.numpy.float32)
        row = {}
        for name, fn in methods.items():
            f = jax.jit(fn)
            f(jax.random.key(0), logits).block_until_ready()
            times = []
            for r in range(args.repeats):
                start = time.perf_counter()
                f(jax.random.key(r), logits).block_until_ready()
                times.append(time.perf_counter() - start)
            row[name] = round(1e3 * statistics.median(times), 3)
        report["ms_per_draw"][str(batch)] = row
        print(f"B = {batch}: " + ", ".join(f"{k} {v} ms" for k, v in row.items()), file=sys.stderr)
    logits = rng.normal(0, 3, (args.noise_rows, 2048)).astype(np.float32)
    noisy = (logits * (1 + args.noise * rng.normal(size=logits.shape))).astype(np.float32)
    for name, fn in methods.items():
        f = jax.jit(fn)
        a, b = (np.asarray(f(jax.random.key(5), jax.numpy.asarray(x))) for x in (logits, noisy))
        report["changed_draws_under_noise"][name] = float((a != b).mean())
    print("changed draws under noise: " + str(report["changed_draws_under_noise"]), file=sys.stderr)
    report["meta"] = run_metadata(command=command_line(__file__, argv))
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
