"""`jax-drive score`: PDM-score a planner on generated scenes.

    jax-drive score --planner pdm_closed --scenes 256 --seed 0 --json out.json
    jax-drive score --planner file --file traj.jsonl --scenes 64 --seed 0

Trajectory files are JSONL, one ``{"scene": id, "poses": [[x, y, heading] x 8]}`` per
scene (ego rear-axle frame at t0, poses at 0.5 .. 4.0 s); scene ids are the indices of
``generate_scenes(PRNGKey(seed), N)``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from jax_drive.evaluate import METRICS, PLANNERS

CHOICES = sorted(PLANNERS) + ["file"]


def register(subparsers) -> None:
    p = subparsers.add_parser("score", help="PDM-score a planner on generated scenes", description=__doc__)
    p.add_argument("--planner", choices=CHOICES, default="pdm_closed", help="planner to score (default pdm_closed)")
    p.add_argument("--file", type=Path, help="JSONL trajectory file (with --planner file)")
    p.add_argument("--scenes", type=int, default=64, help="number of generated scenes (default 64)")
    p.add_argument("--seed", type=int, default=0, help="scene generator seed (default 0)")
    p.add_argument("--hard-fraction", type=float, default=None, help="share of hard scenes (default: generator's 0.3)")
    p.add_argument("--batch-size", type=int, default=64, help="scenes per jitted call (default 64)")
    p.add_argument("--no-simulate", action="store_true", help="score raw poses (skip the LQR/bicycle tracking)")
    p.add_argument("--json", type=Path, help="write the results to this JSON file")
    p.set_defaults(func=run)


def format_table(metrics: dict[str, float]) -> str:
    """Two-column text table of the metrics in :data:`METRICS` order."""
    lines = [f"{'metric':<10} {'mean':>8}", "-" * 19]
    for field, label in METRICS:
        if field in metrics:
            lines.append(f"{label:<10} {metrics[field]:>8.4f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.scenes < 1:
        print("error: --scenes must be >= 1", file=sys.stderr)
        return 2
    if args.batch_size < 1:
        print("error: --batch-size must be >= 1", file=sys.stderr)
        return 2
    if args.planner == "file" and args.file is None:
        print("error: --planner file needs --file PATH", file=sys.stderr)
        return 2
    if args.planner != "file" and args.file is not None:
        print("error: --file is only used with --planner file", file=sys.stderr)
        return 2
    if args.hard_fraction is not None and not 0.0 <= args.hard_fraction <= 1.0:
        print("error: --hard-fraction must be in [0, 1]", file=sys.stderr)
        return 2

    import dataclasses

    import jax
    import numpy as np

    from jax_drive.evaluate import TrajectoryFileError, evaluate_planner, load_trajectories, summarize
    from jax_drive.pdm import PDMConfig
    from jax_drive.scenes.generator import GeneratorConfig, generate_scenes

    proposals = None
    if args.planner == "file":
        try:
            proposals = load_trajectories(args.file, args.scenes)
        except TrajectoryFileError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    gen_cfg = GeneratorConfig()
    if args.hard_fraction is not None:
        gen_cfg = dataclasses.replace(gen_cfg, hard_fraction=args.hard_fraction)
    t0 = time.perf_counter()
    scenes = generate_scenes(jax.random.PRNGKey(args.seed), args.scenes, gen_cfg)
    pdm_cfg = PDMConfig(simulate=not args.no_simulate)
    result = evaluate_planner(
        args.planner, scenes, pdm_cfg, proposals=proposals, batch_size=args.batch_size,
        progress=args.scenes > args.batch_size,
    )
    elapsed = time.perf_counter() - t0
    metrics = summarize(result)
    print(f"planner {args.planner}: {args.scenes} scenes, seed {args.seed}, {elapsed:.1f} s")
    print(format_table(metrics))
    if args.json is not None:
        payload = {
            "planner": args.planner,
            "file": str(args.file) if args.file else None,
            "scenes": args.scenes,
            "seed": args.seed,
            "hard_fraction": gen_cfg.hard_fraction,
            "simulate": not args.no_simulate,
            "seconds": elapsed,
            "metrics": metrics,
            "per_scene": {field: np.asarray(getattr(result, field)).round(6).tolist() for field, _ in METRICS},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=1))
        print(f"wrote {args.json}")
    return 0
