"""Ablation of the advantage estimator (MTDrive Table 3): GRPO with a sequence reward,
mtGRPO intra-group and mtGRPO cross-turn, from the same SFT checkpoint, with the same RL
budget, seeds and held-out evaluation scenes; and the multi-turn vs single-turn claim: the
arm ``single_turn`` trains with one turn per rollout (GRPO, the same steps, prompts and
group size) and is read at a turn budget of 1.

    python experiments/ablation_mtgrpo.py --preset tiny --seeds 0 1 2 3 4 --json OUT.json [--out runs/ablation_mtgrpo] [--resume]

For each training seed the SFT stage runs once and is evaluated once; or every seed's RL
starts from the one SFT checkpoint ``--sft-from RUN_DIR`` names (e.g. an
``experiments/mtdrive.py --skip-rl`` run of the same preset), evaluated once, and the seeds
vary RL only (curation, sampling). Then each arm starts from that checkpoint, runs RL
curation + RL and is evaluated on the same held-out scenes (greedy decoding). The JSON holds
the budget, every row (mean and standard error over the held-out evaluation seeds) and the
timings; a markdown table is printed. ``paired`` holds each arm's final PDMS minus GRPO's (and minus
SFT's), paired per held-out scene and training seed, with a 95 % hierarchical percentile
bootstrap interval (training seeds, then scenes: :func:`jax_drive.stats.paired_bootstrap`),
and ``multi_vs_single_turn`` the multi-turn policy (mtGRPO cross, last turn) minus the
single-turn one (turn 1); the plot ``<json stem>.png`` shows the rows and the differences.
Every pipeline run lives in a directory under ``--out``; ``--resume`` continues killed ones
(finished ones are loaded from their journals).

To avoid recomputing what an ``experiments/mtdrive.py`` run of the same preset and (one)
seed already measured, ``--sft-from RUN_DIR --from-results RESULTS.json`` takes the SFT row
and the row of that run's own advantage variant (same SFT checkpoint, RL config and seed) from its
results file; the JSON records which rows were taken over (``sources``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from jax_drive.names import ADVANTAGE_MODES, MTDRIVE_PRESETS
from jax_drive.runinfo import add_output_args, command_line, output_dir, require_min, run_main, run_metadata

VARIANTS = (*ADVANTAGE_MODES, "single_turn")  # single_turn: GRPO on one-turn rollouts

METRICS = ("pdms_first", "pdms_final", "format_rate", "turns_mean", "final_nc", "final_dac", "final_ttc",
           "final_ep", "final_comfort")


def stage_row(stage: dict) -> dict:
    """One table row from an evaluated stage: mean, sem, PDMS by turn budget and the per-scene
    PDMS of the first and last answers (every held-out set, in order)."""
    scenes = {k: [v for s in stage["per_seed"] for v in s.get(k, [])] for k in ("scene_pdms_first", "scene_pdms_final")}
    return {"mean": {k: stage["mean"][k] for k in METRICS}, "sem": {k: stage["sem"][k] for k in METRICS},
            "pdms_by_budget": stage["pdms_by_budget"], **scenes}


def judged_by(name: str) -> str:
    """The PDMS an arm is judged by: 'pdms_final' (its last answer), or 'pdms_first' for
    ``single_turn`` (the policy that was trained to answer once)."""
    return "pdms_first" if name == "single_turn" else "pdms_final"


def arm_scores(name: str, rows: list[dict]) -> list[list[float]]:
    """(training seeds, scenes) PDMS the arm is judged by (:func:`judged_by`)."""
    return [r["scene_" + judged_by(name)] for r in rows]


def paired(per_seed: dict[str, list[dict]]) -> dict:
    """Each arm minus GRPO and minus SFT, and multi-turn (mtGRPO cross) minus single-turn,
    paired per scene and training seed (rows without per-scene scores are left out)."""
    from jax_drive.stats import paired_bootstrap

    scores = {name: arm_scores(name, rows) for name, rows in per_seed.items()
              if rows and all(len(r) for r in arm_scores(name, rows))}
    out: dict = {}
    pairs = [(a, b) for b in ("grpo", "sft") for a in scores if a not in (b, "sft")]
    pairs += [("mtgrpo_cross", "single_turn")]
    for a, b in pairs:
        if a in scores and b in scores and len(scores[a]) == len(scores[b]):
            diffs = [[x - y for x, y in zip(u, v)] for u, v in zip(scores[a], scores[b])]
            name = "multi_vs_single_turn" if (a, b) == ("mtgrpo_cross", "single_turn") else f"{a}_vs_{b}"
            out[name] = paired_bootstrap(diffs, resample_seeds=True)
    return out


def plot(out: dict, path: str) -> None:
    """Left: final PDMS per arm (turn 1 for single_turn) with its standard error over training
    seeds. Right: the paired differences against GRPO and multi- vs single-turn, with their
    95 % intervals."""
    from matplotlib.figure import Figure

    table = out["table"]
    names = list(table)
    key = {n: judged_by(n) for n in names}
    fig = Figure(figsize=(11, 3.8))
    bars, forest = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    bars.bar(names, [table[n]["mean"][key[n]] for n in names], yerr=[table[n]["sem"][key[n]] for n in names],
             capsize=4, color="#4c78a8")
    bars.set_ylabel("held-out PDMS (mean ± sem)")
    bars.set_title(f"MTDrive Table 3 arms ({out['preset']}, {len(out['training_seeds'])} training seeds)")
    bars.grid(axis="y", alpha=0.3)
    shown = [(n, c) for n, c in out.get("paired", {}).items() if n.endswith("_vs_grpo") or n == "multi_vs_single_turn"]
    for i, (name, cmp) in enumerate(shown):
        lo, hi = cmp["ci95"]
        forest.errorbar(cmp["mean"], i, xerr=[[cmp["mean"] - lo], [hi - cmp["mean"]]], fmt="o", capsize=4,
                        color="#e45756")
    forest.axvline(0.0, color="grey", lw=1)
    forest.set_yticks(range(len(shown)), [n for n, _ in shown], fontsize=8)
    forest.set_xlabel("paired PDMS difference (95 % interval)")
    forest.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


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
        "paired": paired(per_seed),
        "per_training_seed": per_seed,
        "runs": runs,
        "seconds": round(time.perf_counter() - start, 1),
    }
    if args.json:
        atomic_write_json(args.json, jsonable(out))
        if complete:
            plot(out, os.path.splitext(args.json)[0] + ".png")
    return out


def single_turn(preset):
    """The preset with one-turn RL rollouts (its evaluation keeps the preset's turn budget)."""
    rollout = dataclasses.replace(preset.rl.rollout, max_turns=1)
    return dataclasses.replace(preset, rl=dataclasses.replace(preset.rl, rollout=rollout))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(MTDRIVE_PRESETS), default="cpu-demo")
    parser.add_argument("--out", default="runs/ablation_mtgrpo", type=output_dir,
                        help="run directories (journals, checkpoints, metrics)")
    parser.add_argument("--resume", action="store_true", help="continue the runs in --out where they stopped")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds")
    parser.add_argument("--sft-from", default=None,
                        help="run directory holding the SFT checkpoint every training seed's RL starts from "
                             "(then the seeds vary RL only, and the SFT row is evaluated once)")
    parser.add_argument("--from-results", default=None,
                        help="results.json of the experiments/mtdrive.py run that wrote --sft-from: reuse its "
                             "SFT row and the row of its advantage variant")
    parser.add_argument("--rl-steps", type=int, default=None, help="override the preset's RL steps")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                        help="arms to run (default all: the three advantage estimators and single_turn)")
    add_output_args(parser)
    args = parser.parse_args(argv)
    require_min(1, rl_steps=args.rl_steps)
    if args.from_results is not None and len(args.seeds) != 1:
        parser.error("--from-results needs exactly one training seed")
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
    shared_sft = None  # the evaluation of --sft-from's checkpoint, shared by every seed
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
        elif shared_sft is None:  # evaluate the given SFT checkpoint once (greedy: the same for every seed)
            results = shared_sft = run_mtdrive(preset, os.path.join(args.out, f"sft_eval_s{seed}"), skip_rl=True,
                                               sft_from=sft_dir, evaluate=("sft",), resume=args.resume,
                                               progress=not args.no_progress)
        else:
            results = shared_sft
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
            arm, advantage = preset, variant
            if variant == "single_turn":
                arm, advantage = single_turn(preset), "grpo"
            results = run_mtdrive(arm, os.path.join(args.out, f"{variant}_s{seed}"), advantage=advantage,
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
