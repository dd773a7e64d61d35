"""Ablation of the advantage estimator (MTDrive Table 3): GRPO with a sequence reward,
mtGRPO intra-group and mtGRPO cross-turn, from the same SFT checkpoint, with the same RL
budget, seeds and held-out evaluation scenes.

    python experiments/ablation_mtgrpo.py --preset cpu-demo --json OUT.json [--out runs/ablation_mtgrpo] [--resume]

For each training seed the SFT stage runs once (or is loaded with ``--sft-from``, e.g. the
run directory of an ``experiments/mtdrive.py`` run of the same preset and seed) and is
evaluated once; then each variant starts from that checkpoint, runs RL curation + RL and is
evaluated on the same held-out scenes (greedy decoding). The JSON holds the budget, every
row (mean and standard error over the held-out evaluation seeds) and the timings; a
markdown table is printed. Every pipeline run lives in a directory under ``--out``;
``--resume`` continues killed ones (finished ones are loaded from their journals).

To avoid recomputing what an ``experiments/mtdrive.py`` run of the same preset and seed
already measured, ``--sft-from RUN_DIR --from-results RESULTS.json`` takes the SFT row and the
row of that run's own advantage variant (same SFT checkpoint, RL config and seed) from its
results file; the JSON records which rows were taken over (``sources``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from jax_drive.names import ADVANTAGE_MODES as VARIANTS
from jax_drive.names import MTDRIVE_PRESETS
from jax_drive.runinfo import add_output_args, command_line, output_dir, require_min, run_main, run_metadata

METRICS = ("pdms_first", "pdms_final", "format_rate", "turns_mean", "final_nc", "final_dac", "final_ttc",
           "final_ep", "final_comfort")


def stage_row(stage: dict) -> dict:
    """One table row from an evaluated stage: mean, sem and PDMS by turn budget."""
    return {"mean": {k: stage["mean"][k] for k in METRICS}, "sem": {k: stage["sem"][k] for k in METRICS},
            "pdms_by_budget": stage["pdms_by_budget"]}


def combine(rows: list[dict]) -> dict:
    """Rows of several training seeds -> the mean over seeds (sem over seeds when > 1, else the
    evaluation-seed sem of the single run)."""
    import numpy as np

    if len(rows) == 1:
        return dict(rows[0], training_seeds=1)
    mean = {k: float(np.mean([r["mean"][k] for r in rows])) for k in METRICS}
    sem = {k: float(np.std([r["mean"][k] for r in rows], ddof=1) / np.sqrt(len(rows))) for k in METRICS}
    budget = np.mean([r["pdms_by_budget"] for r in rows], axis=0).tolist()
    return {"mean": mean, "sem": sem, "pdms_by_budget": budget, "training_seeds": len(rows)}


def markdown_table(table: dict) -> str:
    turns = len(next(iter(table.values()))["pdms_by_budget"])
    head = "| policy | " + " | ".join(f"PDMS@{j + 1}" for j in range(turns)) + " | final PDMS | format | turns |"
    lines = [head, "|" + "---|" * (turns + 4)]
    for name, row in table.items():
        m, s = row["mean"], row["sem"]
        lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in row["pdms_by_budget"]) +
                     f" | {m['pdms_final']:.3f} ± {s['pdms_final']:.3f} | {m['format_rate']:.3f} | {m['turns_mean']:.2f} |")
    return "\n".join(lines)


def write(args, meta: dict, preset, per_seed: dict, runs: list, sources: dict, start: float, complete: bool) -> dict:
    """The summary; written to ``--json`` when given (also after each variant, ``complete``
    False until the last one)."""
    from jax_drive.pipelines.mtdrive.presets import rl_config
    from jax_drive.rl.atomic import atomic_write_json
    from jax_drive.rl.logging import jsonable

    table = {name: combine(rows) for name, rows in per_seed.items() if rows}
    rl = rl_config(preset)
    out = {
        "meta": meta,
        "preset": args.preset,
        "complete": complete,
        "training_seeds": args.seeds,
        "eval": {"seeds": list(preset.eval_seeds), "scenes_per_seed": preset.eval_scenes,
                 "turn_budget": preset.eval_turns, "decoding": "greedy"},
        "budget": {"rl_steps": rl.steps, "prompts_per_step": rl.prompts_per_step, "group_size": rl.rollout.group_size,
                   "max_turns": rl.rollout.max_turns, "learning_rate": rl.optim.learning_rate,
                   "minibatch_size": rl.minibatch_size, "kl_coef": rl.loss.kl_coef,
                   "max_context_tokens": rl.rollout.max_context_tokens, "sft_steps": preset.sft.max_steps,
                   "sft_from": args.sft_from},
        "note": "sem: standard error over the held-out evaluation seeds (one training seed) or over training seeds",
        "sources": sources,
        "table": table,
        "per_training_seed": per_seed,
        "runs": runs,
        "seconds": round(time.perf_counter() - start, 1),
    }
    if args.json:
        atomic_write_json(args.json, jsonable(out))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(MTDRIVE_PRESETS), default="cpu-demo")
    parser.add_argument("--out", default="runs/ablation_mtgrpo", type=output_dir,
                        help="run directories (journals, checkpoints, metrics)")
    parser.add_argument("--resume", action="store_true", help="continue the runs in --out where they stopped")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds")
    parser.add_argument("--sft-from", default=None,
                        help="run directory holding the SFT checkpoint (one training seed only)")
    parser.add_argument("--from-results", default=None,
                        help="results.json of the experiments/mtdrive.py run that wrote --sft-from: reuse its "
                             "SFT row and the row of its advantage variant")
    parser.add_argument("--rl-steps", type=int, default=None, help="override the preset's RL steps")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    add_output_args(parser)
    args = parser.parse_args(argv)
    require_min(1, rl_steps=args.rl_steps)
    if args.sft_from is not None and len(args.seeds) != 1:
        parser.error("--sft-from needs exactly one training seed")
    if args.from_results is not None and args.sft_from is None:
        parser.error("--from-results needs --sft-from (the run directory of that run)")
    if args.from_results is not None and not os.path.isfile(args.from_results):
        parser.error(f"--from-results {args.from_results}: no such file")
    previous = None
    if args.from_results is not None:
        with open(args.from_results) as f:
            previous = json.load(f)
    from jax_drive.pipelines.journal import RunDirError

    try:
        return ablate(args, parser, previous, run_metadata(command=command_line(__file__, argv)))
    except RunDirError as error:
        parser.error(f"{error} (--resume continues it)")


def ablate(args, parser, previous: dict | None, meta: dict) -> int:
    """Runs the SFT row and every variant of every training seed; prints and writes the table."""
    from jax_drive.pipelines.mtdrive import run_mtdrive, sft_checkpoint_dir
    from jax_drive.pipelines.mtdrive.presets import PRESETS, with_seed
    from jax_drive.pipelines.mtdrive.report import public

    sources: dict[str, str] = {}
    start = time.perf_counter()
    per_seed: dict[str, list[dict]] = {"sft": [], **{v: [] for v in args.variants}}
    runs = []
    for seed in args.seeds:
        preset = with_seed(PRESETS[args.preset], seed)
        if args.rl_steps is not None:
            preset = dataclasses.replace(preset, rl=dataclasses.replace(preset.rl, steps=args.rl_steps))
        sft_dir = args.sft_from or os.path.join(args.out, f"sft_s{seed}")
        if previous is not None:
            check = {"preset": args.preset, "seed": seed}
            if any(previous.get(k) != v for k, v in check.items()) or previous["eval"]["seeds"] != list(preset.eval_seeds):
                parser.error(f"{args.from_results} is not a run of {check} on eval seeds {preset.eval_seeds}")
            if previous["budget"]["rl_steps"] != preset.rl.steps:
                parser.error(f"{args.from_results} ran {previous['budget']['rl_steps']} RL steps, not {preset.rl.steps}")
            per_seed["sft"].append(stage_row(previous["stages"]["sft"]))
            sources["sft"] = args.from_results
        elif args.sft_from is None or not os.path.isdir(sft_checkpoint_dir(sft_dir)):
            results = run_mtdrive(preset, sft_dir, skip_rl=True, evaluate=("sft",), resume=args.resume,
                                  progress=not args.no_progress)
        else:  # evaluate the given SFT checkpoint on the same held-out scenes
            results = run_mtdrive(preset, os.path.join(args.out, f"sft_eval_s{seed}"), skip_rl=True,
                                  sft_from=sft_dir, evaluate=("sft",), resume=args.resume,
                                  progress=not args.no_progress)
        if previous is None:
            per_seed["sft"].append(stage_row(results["stages"]["sft"]))
            runs.append({"seed": seed, "variant": "sft", "timings_s": results["timings_s"]})
        reused = previous.get("advantage") if previous is not None else None
        for variant in sorted(args.variants, key=lambda v: v != reused):  # the reused row first
            if previous is not None and previous.get("advantage") == variant and "rl" in previous["stages"]:
                per_seed[variant].append(stage_row(previous["stages"]["rl"]))
                runs.append({"seed": seed, "variant": variant, "timings_s": previous["timings_s"],
                             "rl_history": previous["rl_history"], "rl_curation": previous["rl_curation"]})
                sources[variant] = args.from_results
                continue
            results = run_mtdrive(preset, os.path.join(args.out, f"{variant}_s{seed}"), advantage=variant,
                                  sft_from=sft_dir, evaluate=("rl",), resume=args.resume,
                                  progress=not args.no_progress)
            per_seed[variant].append(stage_row(results["stages"]["rl"]))
            runs.append({"seed": seed, "variant": variant, "timings_s": results["timings_s"],
                         "rl_history": public(results)["rl_history"], "rl_curation": results["rl_curation"]})
            write(args, meta, preset, per_seed, runs, sources, start, complete=False)
            print(f"[ablation] seed {seed} {variant}: final PDMS {results['stages']['rl']['mean']['pdms_final']:.3f}",
                  flush=True)

    out = write(args, meta, preset, per_seed, runs, sources, start, complete=True)
    table = out["table"]
    print(markdown_table(table))
    print((f"wrote {args.json}" if args.json else "done") + f" in {out['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
