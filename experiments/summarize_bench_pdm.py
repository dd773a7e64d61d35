"""Summary of repeated PDM-scorer benchmark runs: goal tally, CPU steal vs slowdown, plot.

Reads ``bench_pdm.py`` JSONs (by default ``experiments/results/bench_pdm_idle_run*.json``)
and, per run, takes the speedup over the reference at every batch >= 1,024 (the issue's goal
is >= 100x at each). Runs are grouped by how they were measured:

- ``unscreened``: no steal screening, the scorer at the time of the run;
- ``screened, chunk 0``: blocks with > 5 % CPU steal re-timed, scorer unchunked;
- ``screened, chunk 512``: the same with ``PDMConfig.chunk_size = 512`` (the default now).

Steal vs slowdown: every timed block at a batch >= 1,024 that recorded its steal share
(kept or not) is compared with the fastest low-steal (<= 2 %) block of the same batch and
scorer version; the Pearson correlation of steal share and slowdown is reported.

Usage:
  python experiments/summarize_bench_pdm.py [RUN.json ...] [--json OUT] [--plot OUT.png]
"""

from __future__ import annotations

import argparse
import glob
import json
import re
from pathlib import Path

import numpy as np

GOAL = 100.0
BIG = 1024
LOW_STEAL = 0.02


def run_number(path: str) -> int:
    """Run index from a ``..._run<N>.json`` name (-1 if there is none)."""
    match = re.search(r"run(\d+)\.json$", path)
    return int(match.group(1)) if match else -1


def version(result: dict) -> str:
    """How a run was measured (see the module docstring)."""
    if not any("attempts" in row for row in result["per_batch"]):
        return "unscreened"
    return f"screened, chunk {result.get('pdm_chunk_size', 0)}"


def run_summary(path: str, result: dict) -> dict:
    """Speedups at batches >= 1,024 of one run, first attempts too where screened."""
    big = [row for row in result["per_batch"] if row["batch"] >= BIG]
    speedup = {row["batch"]: row["speedup"] for row in big}
    first = {row["batch"]: row.get("speedup_first_attempt", row["speedup"]) for row in big}
    return {
        "run": run_number(path),
        "file": Path(path).name,
        "date_utc": result.get("date_utc"),
        "version": version(result),
        "speedup": speedup,
        "speedup_first_attempt": first,
        "min_speedup": min(speedup.values()),
        "met": min(speedup.values()) >= GOAL,
        "met_first_attempt": min(first.values()) >= GOAL,
        "time_4096_s": result.get("time_4096_s"),
        "max_abs_pdms_diff": result.get("max_abs_pdms_diff"),
    }


def steal_blocks(result: dict) -> list[tuple[int, float, float]]:
    """(batch, steal share, seconds) of every timed JAX block at batch >= 1,024 with a steal
    reading."""
    blocks = []
    for row in result["per_batch"]:
        if row["batch"] < BIG:
            continue
        for attempt in row.get("attempts", [row]):
            share = attempt.get("cpu_steal_share")
            if share is not None:
                blocks.append((row["batch"], share, attempt["jax_s"]))
    return blocks


def steal_vs_slowdown(results: list[dict]) -> dict:
    """Slowdown of each block over the fastest low-steal block of its (version, batch)."""
    by_key: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for result in results:
        for batch, share, seconds in steal_blocks(result):
            by_key.setdefault((version(result), batch), []).append((share, seconds))
    points = []
    for blocks in by_key.values():
        clean = [s for share, s in blocks if share <= LOW_STEAL]
        if clean:
            points += [(share, s / min(clean)) for share, s in blocks]
    if len(points) < 3:
        return {"blocks": len(points), "pearson_r": None, "points": points}
    share, slowdown = np.array(points).T
    return {"blocks": len(points), "pearson_r": float(np.corrcoef(share, slowdown)[0, 1]),
            "points": [[float(a), float(b)] for a, b in points]}


def tally(runs: list[dict]) -> dict:
    """Runs meeting the goal, per version."""
    out = {}
    for run in runs:
        entry = out.setdefault(run["version"], {"runs": 0, "met": 0, "met_first_attempt": 0,
                                                "min_speedup": float("inf")})
        entry["runs"] += 1
        entry["met"] += run["met"]
        entry["met_first_attempt"] += run["met_first_attempt"]
        entry["min_speedup"] = min(run["min_speedup"], entry["min_speedup"])
    return out


def plot(runs: list[dict], steal: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = {}
    markers = {1024: "o", 2048: "s", 4096: "^"}
    for run in runs:
        colour = colours.setdefault(run["version"], f"C{len(colours)}")
        for batch, speedup in run["speedup"].items():
            left.scatter(run["run"], speedup, color=colour, marker=markers.get(batch, "x"))
    left.axhline(GOAL, color="k", lw=1, ls="--")
    left.text(left.get_xlim()[0], GOAL * 1.02, " goal 100x", va="bottom")
    for name, colour in colours.items():
        left.scatter([], [], color=colour, label=name)
    for batch, marker in markers.items():
        left.scatter([], [], color="gray", marker=marker, label=f"{batch} proposals")
    left.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    left.set(xlabel="run", ylabel="speedup over the reference", title="JAX PDM scorer vs reference, batches >= 1,024")
    left.legend(fontsize=8)
    if steal["points"]:
        share, slowdown = np.array(steal["points"]).T
        right.scatter(100 * share, slowdown, s=12)
    r = steal["pearson_r"]
    right.set(xlabel="CPU stolen by the hypervisor during the block (%)",
              ylabel="block time / fastest low-steal block",
              title=f"steal vs slowdown ({steal['blocks']} blocks, r = {r:.2f})" if r is not None else "steal vs slowdown")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", help="bench_pdm JSONs (default: the idle runs in experiments/results)")
    parser.add_argument("--json", default="experiments/results/bench_pdm_runs_summary.json")
    parser.add_argument("--plot", default="experiments/results/bench_pdm_runs.png")
    args = parser.parse_args(argv)
    paths = args.runs or sorted(glob.glob("experiments/results/bench_pdm_idle_run*.json"), key=run_number)
    if not paths:
        parser.error("no benchmark JSONs found")
    results = [json.loads(Path(p).read_text()) for p in paths]
    runs = [run_summary(p, r) for p, r in zip(paths, results)]
    steal = steal_vs_slowdown(results)
    summary = {"goal": f">= {GOAL:.0f}x at every batch >= {BIG}", "tally": tally(runs),
               "steal_vs_slowdown": steal, "runs": runs}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    if args.plot:
        plot(runs, steal, args.plot)
    for run in runs:
        cells = " / ".join(f"{s:.0f}x" for s in run["speedup"].values())
        print(f"run {run['run']:>3}  {run['version']:<20} {cells:<22} {'met' if run['met'] else 'MISSED'}")
    for name, entry in summary["tally"].items():
        print(f"{name}: met in {entry['met']} of {entry['runs']} runs (min {entry['min_speedup']:.0f}x)")
    if steal["pearson_r"] is not None:
        print(f"steal vs slowdown over {steal['blocks']} blocks: r = {steal['pearson_r']:.2f}")
    print(f"wrote {args.json}" + (f" and {args.plot}" if args.plot else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
