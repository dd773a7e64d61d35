"""`jax-drive train`: the MTDrive pipeline (SFT -> RL curation -> mtGRPO -> evaluation)."""

from __future__ import annotations

import os


def register(subparsers) -> None:
    from jax_drive.mtdrive import PRESETS

    parser = subparsers.add_parser("train", help="SFT + mtGRPO on generated scenes (MTDrive)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu-demo")
    parser.add_argument("--out", default="runs/mtdrive", help="output directory (results.json, metrics, checkpoints)")
    parser.add_argument("--advantage", choices=["grpo", "mtgrpo_intra", "mtgrpo_cross"], default=None,
                        help="advantage estimator (default: the preset's, mtgrpo_cross)")
    parser.add_argument("--skip-rl", action="store_true", help="stop after SFT and its evaluation")
    parser.add_argument("--seed", type=int, default=None, help="training seed (default: the preset's)")
    parser.add_argument("--sft-from", default=None, help="reuse the SFT checkpoint of an earlier run directory")
    parser.set_defaults(func=run)


def run(args) -> int:
    from jax_drive.mtdrive import PRESETS, results_table, run_mtdrive, with_seed, write_results

    preset = PRESETS[args.preset] if args.seed is None else with_seed(PRESETS[args.preset], args.seed)
    results = run_mtdrive(preset, args.out, advantage=args.advantage, skip_rl=args.skip_rl, sft_from=args.sft_from)
    write_results(results, os.path.join(args.out, "results.json"))
    print(results_table(results))
    return 0
