"""TalkingVehicles / CoopReflect: the seed's Table 1 methods, the distilled policy and the
Table 3 latency / bytes rows on the batched JAX simulator.

    # the CPU run (embedded SmolLM2; restartable: finished methods are loaded from --run-dir)
    nice -n 10 python experiments/talking_vehicles.py --preset cpu-demo \
        --json experiments/results/talking_vehicles.json
    # one method at a time (each writes <run-dir>/<method>.json)
    python experiments/talking_vehicles.py --preset cpu-demo --method distilled --json OUT
    # the GPU setting: LLM agents served by vLLM (see the preset's server command)
    python experiments/talking_vehicles.py --preset paper --engine openai --json OUT

    # does each LLM row of a results file equal the keep-only fallback, scenario by scenario
    # and seed by seed, on its own episodes? (no model; minutes)
    python experiments/talking_vehicles.py --keep-check experiments/results/talking_vehicles/talking_vehicles.json \
        --json OUT

Writes the JSON (every method's per-scenario CR / SR / TR per seed and mean ± SE over seeds,
latency, bytes per message, parse failures, learning and distillation summaries), a bar plot
(``<json stem>.png``: CR and SR per scenario and method with SE bars) and a storyboard of one
episode with the messages over its frames (``<json stem>_storyboard.png``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import numpy as np

from jax_drive.cli.overrides import add_override_args, preset_with_overrides
from jax_drive.runinfo import (InputError, add_output_args, check_output, command_line, output_dir, run_main,
                               run_metadata, script_environment, write_json)

script_environment(cpu=False)

# The seed's numbers our rows are read against (gpt-4o-mini agents; CR, SR in % per scenario in
# the order overtake (perception), red light, left turn, overtake (negotiation), highway merge,
# highway exit): Table 1 (Comm setting except the first row) and Table 2's distillation row.
SEED_TABLES = {
    "zero_shot_silent": ("Table 1 Zero-shot (Silent)", (93.3, 93.3, 93.3, 89.9, 100.0, 33.3), (0.0, 6.7, 6.7, 7.2, 0.0, 66.1)),
    "zero_shot": ("Table 1 Zero-shot (Comm)", (91.1, 60.0, 85.6, 87.8, 67.2, 53.3), (4.4, 38.9, 14.4, 11.7, 32.8, 46.7)),
    "reflection": ("Table 1 +Reflection (Comm)", (63.3, 37.8, 51.1, 55.6, 20.0, 53.9), (34.4, 47.8, 47.8, 43.3, 80.0, 45.6)),
    "correction_rag": ("Table 1 +Correction+RAG (Comm)", (4.4, 13.3, 43.3, 38.3, 40.0, 49.4),
                       (90.0, 66.7, 38.9, 61.1, 60.0, 43.3)),
    "debrief": ("Table 1 +Debrief (Comm)", (1.1, 0.0, 6.7, 3.3, 6.7, 18.3), (94.4, 93.3, 92.2, 95.6, 93.3, 81.1)),
    "distilled": ("Table 2 Distillation (0.14-0.45 s per decision on an A40, Table 3)", (0.0, 0.0, 0.0, 10.0, 0.0, 3.3),
                  (83.3, 91.1, 96.7, 88.9, 100.0, 96.7)),
}


def seed_reference() -> dict:
    """{method: {source, CR, SR (per scenario), CR_avg, SR_avg}} from :data:`SEED_TABLES`."""
    return {m: {"source": src, "CR": list(cr), "SR": list(sr), "CR_avg": round(float(np.mean(cr)), 2),
                "SR_avg": round(float(np.mean(sr)), 2)} for m, (src, cr, sr) in SEED_TABLES.items()}


def bar_plot(results: dict, scenarios: list[str], path: str) -> None:
    """CR and SR per scenario (and their average) per method, SE over seeds as error bars;
    with held-out variations, a third panel: each method's average SR at nominal and in each."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from jax_drive.pipelines.talking_vehicles import by_variation

    variations = sorted({v for r in results.values() for v in r.get("variations", {})})
    fig = Figure(figsize=(max(10, 1.6 * (len(scenarios) + 1) * max(len(results), 1) / 3),
                          10 if variations else 7))
    FigureCanvasAgg(fig)
    grid = fig.subplots(3 if variations else 2, 1)
    axes = grid[:2]
    axes[0].sharex(axes[1])
    axes[0].tick_params(labelbottom=False)
    labels = [s.replace("tv_", "") for s in scenarios] + ["average"]
    x = np.arange(len(labels))
    width = 0.8 / max(len(results), 1)
    for k, (method, r) in enumerate(results.items()):
        aggs = [r["scenarios"][s]["aggregate"] for s in scenarios] + [r["average"]["aggregate"]]
        for ax, metric in zip(axes, ("CR", "SR")):
            ax.bar(x + (k - (len(results) - 1) / 2) * width, [a[metric]["mean"] for a in aggs], width,
                   yerr=[a[metric]["se"] for a in aggs], capsize=2, label=method)
    for ax, metric in zip(axes, ("CR", "SR")):
        ax.set_ylabel(f"{metric} (%)")
        ax.set_ylim(0, 105)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_title("TalkingVehicles: collision rate (top) and success rate (bottom), mean ± SE over seeds",
                      fontsize=10)
    axes[0].legend(fontsize=7, ncol=min(len(results), 5))
    axes[1].set_xticks(x, labels, rotation=20, ha="right", fontsize=8)
    if variations:
        ax, names = grid[2], ["nominal", *variations]
        x = np.arange(len(results))
        for k, name in enumerate(names):
            blocks = [by_variation(r).get(name) for r in results.values()]
            aggs = [b["average"]["aggregate"]["SR"] if b else {"mean": np.nan, "se": 0.0} for b in blocks]
            ax.bar(x + (k - (len(names) - 1) / 2) * 0.8 / len(names), [a["mean"] for a in aggs],
                   0.8 / len(names), yerr=[a["se"] for a in aggs], capsize=2, label=name)
        ax.set_xticks(x, list(results), rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("average SR (%)")
        ax.set_ylim(0, 105)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, title="episodes", title_fontsize=7)
        ax.set_title("The same episodes in held-out variations (sim.variations)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def keep_check(results_path: str, run_dir: str, progress: bool) -> dict:
    """For each LLM row of a results file: whether its per-seed CR / SR / TR equal, in every
    scenario, what the keep-only fallback scores on the same episodes (the file's preset
    decides them: scenarios, seeds, episodes per method, time cap)."""
    from jax_drive.names import BASELINES
    from jax_drive.pipelines import talking_vehicles as TV
    from jax_drive.pipelines.stages import RunContext
    from jax_drive.pipelines.talking_vehicles.pipeline import keep_fallback

    try:
        with open(results_path, encoding="utf-8") as f:
            saved = json.load(f)
        fields = {k: saved["preset"][k] for k in ("scenarios", "seeds", "eval_episodes", "baseline_eval_episodes",
                                                   "student_eval_episodes", "max_time")}
        preset = dataclasses.replace(TV.PRESETS[saved["preset"]["name"]], **{
            k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
        results = {m: r for m, r in saved["results"].items() if m not in BASELINES}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise InputError(f"--keep-check {results_path}: not a talking_vehicles.py results file ({error})") from None
    ctx = RunContext(preset, run_dir, {}, progress=progress)
    return {m: keep_fallback(m, preset, r, ctx) for m, r in results.items()}


def parse_args(argv):
    from jax_drive.names import TALKING_VEHICLES_METHODS as METHODS
    from jax_drive.names import TALKING_VEHICLES_PRESETS as PRESET_NAMES

    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--preset", default="cpu-demo", choices=PRESET_NAMES)
    parser.add_argument("--engine", choices=("jax", "openai"), default=None,
                        help="LLM agents' engine (default: the preset's)")
    parser.add_argument("--model", default=None, help="LLM agents' model (load_pretrained source or served name)")
    parser.add_argument("--base-url", default=None, help="OpenAI-compatible server (engine openai)")
    add_override_args(parser)
    parser.add_argument("--method", action="append", default=None, choices=METHODS,
                        help="method(s) to run, in order (default: all of them)")
    parser.add_argument("--run-dir", default=None, type=output_dir,
                        help="per-method results, learning checkpoints, distillation data and the student "
                             "(default: runs/talking_vehicles/<preset>)")
    parser.add_argument("--force", action="store_true", help="rerun methods that already have a result")
    parser.add_argument("--keep-check", default=None, metavar="RESULTS_JSON",
                        help="instead of running methods: compare each LLM row of this results file with the "
                             "keep-only fallback on the same episodes")
    add_output_args(parser, json_required=True)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    import glob

    args = parse_args(argv)
    methods = args.method or None
    run_dir = args.run_dir or check_output(os.path.join("runs", "talking_vehicles", args.preset), "--run-dir",
                                           directory=True)
    if methods and len(set(methods)) != len(methods):
        raise InputError("--method names a method twice")
    if methods and "central_memory" in methods and "debrief" not in methods[:methods.index("central_memory")] \
            and not glob.glob(os.path.join(run_dir, "debrief_learning_seed*.json")):
        raise InputError(f"--method central_memory reads the debrief memories: run debrief first (into {run_dir})")
    if args.keep_check:
        check = keep_check(args.keep_check, run_dir, not args.no_progress)
        for m, c in check.items():
            print(f"{m}: equals keep-only in {sum(c['scenarios'].values())} of {len(c['scenarios'])} scenarios")
        write_json(args.json, {"command": command_line(__file__, argv), "results_file": args.keep_check,
                               "keep_fallback": check, "meta": run_metadata(benchmark="talking_vehicles_keep_check")})
        return 0
    from jax_drive.pipelines import talking_vehicles as TV

    changes = {k: v for k, v in (("engine", args.engine), ("model", args.model), ("base_url", args.base_url)) if v}
    try:
        preset = dataclasses.replace(preset_with_overrides(TV.PRESETS[args.preset], args), **changes)
    except ValueError as error:
        raise InputError(str(error)) from None
    if preset.engine == "openai" and not preset.base_url:
        raise InputError("engine openai needs --base-url")
    methods = methods or list(TV.METHODS)
    progress = not args.no_progress
    results = TV.run(preset, methods, run_dir, progress=progress, force=args.force,
                     on_method=lambda m, r: print(f"{m}: done ({r['wall_seconds']:.0f} s)", file=sys.stderr))
    print(TV.table_rows(results, list(preset.scenarios)))
    print()
    print(TV.table3_rows(results))
    if preset.eval_variations:
        print()
        print(TV.variation_rows(results))
    differences = TV.method_differences(results)
    variation_differences = {v: TV.method_differences(results, variation=v) for v in preset.eval_variations}
    for label, found in {"nominal": differences, **variation_differences}.items():
        if found:
            print(f"\n{label}:")
            print(TV.difference_lines(found))
    story_method = next((m for m in ("distilled", "debrief", "zero_shot") if m in results), methods[0])
    payload = {
        "command": command_line(__file__, argv),
        "preset": dataclasses.asdict(preset), "methods": methods,
        "seed_reference": seed_reference(),
        "results": {m: {k: v for k, v in r.items() if k != "storyboard"} for m, r in results.items()},
        "table": TV.table_rows(results, list(preset.scenarios)), "table3": TV.table3_rows(results),
        "variation_table": TV.variation_rows(results), "differences": differences,
        "variation_differences": variation_differences,
        "storyboard": {"method": story_method, **results[story_method].get("storyboard", {})},
        "meta": run_metadata(benchmark="talking_vehicles", run_dir=run_dir),
    }
    write_json(args.json, payload)
    stem = os.path.splitext(args.json)[0]
    bar_plot(results, list(preset.scenarios), stem + ".png")
    if results[story_method].get("storyboard"):
        from jax_drive.coop.render import render_storyboard, story_label

        story = results[story_method]["storyboard"]
        title = f"[{story_method}] {story['episode']}: {story_label(story)}"
        render_storyboard(story, panels=5, columns=5, max_messages=5, title=title).savefig(
            stem + "_storyboard.png", dpi=110)
    print(f"results: {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
