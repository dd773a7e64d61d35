"""Summarises MTDrive runs of several training seeds against the issue's three goals.

Each argument is a results JSON written by ``experiments/mtdrive.py`` / ``jax-drive train``
(``--json OUT``, or ``results.json`` in the run directory; a directory stands for its
``results.json``), one training seed each, same preset. For every stage the per-run mean
over the held-out sets is taken, then mean and standard error across the runs. The goals are checked on those means:
format rate >= 0.95 after SFT, PDMS after the last turn above turn 1 (feedback helps),
and RL above SFT (last-turn PDMS).

    python experiments/mtdrive_seeds.py experiments/results/mtdrive_cpu_demo \
        experiments/results/mtdrive_cpu_demo_s1 experiments/results/mtdrive_cpu_demo_s2 \
        --json experiments/results/mtdrive_cpu_demo_seeds.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

KEYS = ("pdms_first", "pdms_final", "format_rate", "turns_mean")


def mean_sem(values: list[float]) -> tuple[float, float]:
    """(mean, standard error with the n - 1 convention; 0 for a single value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def summarise(runs: list[dict]) -> dict:
    """runs: results.json dicts -> {"seeds", "stages": {stage: {key: [mean, sem]}}, "goals"}."""
    if not runs:
        raise ValueError("no runs given")
    presets = {r["preset"]["name"] if isinstance(r["preset"], dict) else r["preset"] for r in runs}
    if len(presets) > 1:
        raise ValueError(f"runs of different presets: {sorted(presets)}")
    seeds = [r["seed"] for r in runs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"a training seed appears twice: {seeds}")
    stages: dict[str, dict] = {}
    for stage in ("untrained", "sft", "rl"):
        present = [r["stages"][stage]["mean"] for r in runs if stage in r.get("stages", {})]
        if len(present) != len(runs):
            continue
        stages[stage] = {k: list(mean_sem([p[k] for p in present])) for k in KEYS}
    goals = {}
    if "sft" in stages:
        goals["format_after_sft_ge_0.95"] = {"value": stages["sft"]["format_rate"][0],
                                             "met": stages["sft"]["format_rate"][0] >= 0.95}
    final = stages.get("rl") or stages.get("sft")
    if final:
        gain = final["pdms_final"][0] - final["pdms_first"][0]
        goals["last_turn_above_first"] = {"gain": gain, "met": gain > 0}
    if "rl" in stages and "sft" in stages:
        gain = stages["rl"]["pdms_final"][0] - stages["sft"]["pdms_final"][0]
        goals["rl_above_sft"] = {"gain": gain, "met": gain > 0}
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
    parser.add_argument("--json", default=None, help="write the summary here")
    args = parser.parse_args(argv)
    runs = []
    for d in args.dirs:
        path = Path(d) / "results.json" if Path(d).is_dir() else Path(d)
        if not path.is_file():
            parser.error(f"{path} not found: run experiments/mtdrive.py --json {path} first")
        runs.append(json.loads(path.read_text()))
    try:
        summary = summarise(runs)
    except ValueError as error:
        parser.error(str(error))
    summary["dirs"] = args.dirs
    print(f"training seeds {summary['seeds']} (mean ± sem across seeds)")
    print(table(summary))
    print(json.dumps(summary["goals"], indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
