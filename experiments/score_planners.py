"""Score the rule-based planners side by side on generated scenes.

    python experiments/score_planners.py --scenes 128 --seed 0 --json experiments/results/score_planners.json

For each planner (constant_velocity, idm, pdm_closed, expert) reports the mean PDMS / EPDMS
and their parts, split into normal and hard scenes, plus wall time (the first call of each
planner includes compilation; ``--repeat`` times a second, warm pass).
"""

from __future__ import annotations

import argparse
import sys
import time

from jax_drive.runinfo import (add_output_args, command_line, finite_float, require_min, require_range, run_main,
                               run_metadata, script_environment, write_json)

PLANNERS = ("constant_velocity", "idm", "pdm_closed", "expert")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenes", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hard-fraction", type=finite_float, default=0.3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeat", action="store_true", help="time a second (warm) pass of each planner")
    add_output_args(ap)
    args = ap.parse_args(argv)
    require_min(1, scenes=args.scenes, batch_size=args.batch_size)
    require_range(0.0, 1.0, hard_fraction=args.hard_fraction)
    script_environment()
    import jax
    import numpy as np

    from jax_drive.evaluate import METRICS, evaluate_planner, summarize
    from jax_drive.scenes.generator import GeneratorConfig, generate_scenes, scene_labels

    meta = run_metadata(command=command_line(__file__, argv))
    cfg = GeneratorConfig(hard_fraction=args.hard_fraction)
    key = jax.random.PRNGKey(args.seed)
    t0 = time.perf_counter()
    scenes = jax.block_until_ready(generate_scenes(key, args.scenes, cfg))
    gen_s = time.perf_counter() - t0
    _, hard = scene_labels(key, args.scenes, cfg)
    hard = np.asarray(hard) >= 0
    results = {}
    for name in PLANNERS:
        t0 = time.perf_counter()
        res = evaluate_planner(name, scenes, batch_size=args.batch_size, progress=not args.no_progress)
        cold = time.perf_counter() - t0
        warm = None
        if args.repeat:
            t0 = time.perf_counter()
            res = evaluate_planner(name, scenes, batch_size=args.batch_size, progress=False)
            warm = time.perf_counter() - t0
        entry = {"all": summarize(res), "seconds_cold": cold, "seconds_warm": warm}
        for label, mask in (("normal", ~hard), ("hard", hard)):
            if mask.any():
                entry[label] = summarize(jax.tree.map(lambda a: np.asarray(a)[mask], res))
        results[name] = entry
    header = f"{'planner':<18}" + "".join(f"{lab:>9}" for _, lab in METRICS[:6]) + f"{'EPDMS':>9}{'hardPDMS':>10}{'time s':>9}"
    print(f"{args.scenes} scenes (seed {args.seed}, {hard.mean():.0%} hard), generated in {gen_s:.1f} s")
    print(header)
    for name, e in results.items():
        row = "".join(f"{e['all'][f]:>9.3f}" for f, _ in METRICS[:6])
        hard_pdms = e.get("hard", {}).get("pdms", float("nan"))
        t = e["seconds_warm"] if e["seconds_warm"] is not None else e["seconds_cold"]
        print(f"{name:<18}{row}{e['all']['epdms']:>9.3f}{hard_pdms:>10.3f}{t:>9.1f}")
    if args.json:
        write_json(args.json, {
            "meta": meta, "scenes": args.scenes, "seed": args.seed, "hard_fraction": args.hard_fraction,
            "hard_share": float(hard.mean()), "generate_seconds": gen_s, "device": str(jax.devices()[0]),
            "planners": results,
        })
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
