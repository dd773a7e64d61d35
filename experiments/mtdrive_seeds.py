"""Summarises MTDrive runs of several training seeds against the issue's three goals.

Each argument is a results JSON written by ``experiments/mtdrive.py`` / ``jax-drive train``
(``--json OUT``, or ``results.json`` in the run directory; a directory stands for its
``results.json``), one training seed each, same preset. For every stage the per-run mean
over the held-out sets is taken, then mean and standard error across the runs. The goals are checked on those means:
format rate >= 0.95 after SFT; PDMS after the last turn above turn 1 by more than the standard
error of that gain (paired across training seeds; for a single run across its held-out
sets); RL above SFT (last-turn PDMS) by more than the combined standard error (root sum of
squares of the two stages' sems; for a single run its sems across held-out sets).

    python experiments/mtdrive_seeds.py experiments/results/mtdrive_cpu_demo/s{0,1,2} \
        --json experiments/results/mtdrive_cpu_demo/summary.json

RL studies that start from the same SFT checkpoints may evaluate only the RL policy
(``--evaluate rl``) and take the SFT row from an earlier study with ``--sft-baseline RUN ...``:
a run without an SFT stage borrows it from the baseline run of its training seed, which
must have loaded the same SFT policy (``data_card``) and evaluated it the same way (eval
card, caption, context limit). Greedy evaluation is deterministic, so the borrowed row is
the row the run would have computed; the summary names where each borrowed row came from.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from jax_drive.runinfo import add_output_args, command_line, run_main, run_metadata, write_json

KEYS = ("pdms_first", "pdms_final", "format_rate", "turns_mean")


def _resolved_paths(card):
    """A data card with its checkpoint paths resolved against the working directory (runs
    record them as given: relative to where they started, or absolute)."""
    if not isinstance(card, dict):
        return card
    return {k: os.path.abspath(v) if k in ("sft_from", "sft_checkpoint") and isinstance(v, str) else v
            for k, v in card.items()}


# What must match for an SFT evaluation to stand for another run's: the SFT policy, how it was
# evaluated, and what its prompts looked like (field path, how to compare it).
_SAME_SFT_EVAL = ((("data_card",), _resolved_paths), (("eval",), None), (("budget", "caption"), None),
                  (("budget", "max_context_tokens"), None), (("model",), None))


def _field(run: dict, path: tuple[str, ...], normalise=None):
    for key in path:
        run = run.get(key) if isinstance(run, dict) else None
    return run if normalise is None else normalise(run)


def borrow_sft(runs: list[dict], baselines: list[dict], names: list[str]) -> list[dict]:
    """Runs without an SFT stage get the one of the baseline (same training seed, same SFT
    policy and evaluation; ValueError otherwise); copies, the inputs are not changed.
    ``names[i]`` labels ``baselines[i]`` in the borrowed run's ``sft_stage_from``."""
    by_seed: dict[int, tuple[dict, str]] = {}
    for base, name in zip(baselines, names):
        if "sft" not in base.get("stages", {}):
            raise ValueError(f"baseline {name} has no SFT evaluation")
        if base["seed"] in by_seed:
            raise ValueError(f"two baselines of training seed {base['seed']}")
        by_seed[base["seed"]] = (base, name)
    out = []
    for run in runs:
        if "sft" in run.get("stages", {}) or not baselines:
            out.append(run)
            continue
        if run["seed"] not in by_seed:
            raise ValueError(f"no baseline of training seed {run['seed']} to take the SFT evaluation from")
        base, name = by_seed[run["seed"]]
        for path, normalise in _SAME_SFT_EVAL:
            mine, theirs = _field(run, path, normalise), _field(base, path, normalise)
            if mine != theirs:
                raise ValueError(f"seed {run['seed']}: baseline {name} differs in {'.'.join(path)} "
                                 f"({theirs!r} vs {mine!r}); its SFT row does not apply")
        out.append({**run, "stages": {**run["stages"], "sft": base["stages"]["sft"]}, "sft_stage_from": name})
    return out


def summarise(runs: list[dict]) -> dict:
    """runs: results.json dicts -> {"seeds", "stages": {stage: {key: [mean, sem]}}, "goals"}."""
    from jax_drive.pipelines.mtdrive.report import quality_goals
    from jax_drive.stats import mean_sem

    if not runs:
        raise ValueError("no runs given")
    presets = {r["preset"]["name"] if isinstance(r["preset"], dict) else r["preset"] for r in runs}
    if len(presets) > 1:
        raise ValueError(f"runs of different presets: {sorted(presets)}")
    cards = {json.dumps(r.get("eval"), sort_keys=True) for r in runs}
    if len(cards) > 1:  # e.g. a run re-evaluated on more scenes (mtdrive_reeval.py) beside one that was not
        raise ValueError(f"runs evaluated on different held-out sets or settings: {sorted(cards)}")
    seeds = [r["seed"] for r in runs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"a training seed appears twice: {seeds}")
    stages: dict[str, dict] = {}
    for stage in ("untrained", "sft", "rl"):
        present = [r["stages"][stage]["mean"] for r in runs if stage in r.get("stages", {})]
        if len(present) != len(runs):
            continue
        stages[stage] = {k: list(mean_sem([p[k] for p in present]).values()) for k in KEYS}
    goals = quality_goals(runs)
    return {"seeds": [r["seed"] for r in runs], "stages": stages, "goals": goals}


def table(summary: dict) -> str:
    lines = ["| stage | PDMS turn 1 | PDMS last turn | format rate | turns |", "|---|---|---|---|---|"]
    for stage, row in summary["stages"].items():
        cells = " | ".join(f"{row[k][0]:.3f} ± {row[k][1]:.3f}" for k in KEYS)
        lines.append(f"| {stage} | {cells} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", help="results JSON files or run directories (one per training seed)")
    add_output_args(parser, progress=False)
    parser.add_argument("--sft-baseline", nargs="+", default=[], metavar="RUN",
                        help="runs (one per training seed) whose SFT evaluation stands in for runs evaluated "
                             "after RL only (same SFT policy and evaluation, checked)")
    args = parser.parse_args(argv)

    def load(dirs: list[str]) -> list[dict]:
        runs = []
        for d in dirs:
            path = Path(d) / "results.json" if Path(d).is_dir() else Path(d)
            if not path.is_file():
                parser.error(f"{path} not found: run experiments/mtdrive.py --json {path} first")
            runs.append(json.loads(path.read_text()))
        return runs

    try:
        runs = borrow_sft(load(args.dirs), load(args.sft_baseline), args.sft_baseline)
        summary = summarise(runs)
    except ValueError as error:
        parser.error(str(error))
    summary = {"meta": run_metadata(command=command_line(__file__, argv)), **summary, "dirs": args.dirs}
    borrowed = {str(r["seed"]): r["sft_stage_from"] for r in runs if "sft_stage_from" in r}
    if borrowed:
        summary["sft_stage_from"] = borrowed
    print(f"training seeds {summary['seeds']} (mean ± sem across seeds)")
    print(table(summary))
    print(json.dumps(summary["goals"], indent=2))
    if args.json:
        write_json(args.json, summary)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
