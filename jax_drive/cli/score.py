"""`jax-drive score`: PDM-score a planner or a trajectory file, on generated scenes or a scene file.

    jax-drive score --planner pdm_closed --scenes 256 --seed 0 --json out.json
    jax-drive score --planner file --file traj.jsonl --scenes 64 --seed 0
    jax-drive score --scenes-file scenes.json.gz [--planner pdm_closed | --trajectories T] \\
        --csv scores.csv --json scores.json --plot failures.png

Generated scenes: trajectory files are JSONL, one ``{"scene": id, "poses": [[x, y, heading]
x 8]}`` per scene (ego rear-axle frame at t0, poses at 0.5 .. 4.0 s); scene ids are the
indices of ``generate_scenes(PRNGKey(seed), N)``.

Scene files (format: ``jax_drive/scenes/io.py``): ``--trajectories`` takes JSONL lines
``{"token": str, "poses": [[x, y, heading], ...], "dt": 0.5}`` (any spacing covering 4 s),
``{"token": str, "proposals": [[[x, y, heading], ...], ...], "dt": 0.5}`` (several per
scene: one row each, with a "proposal" column) or a NAVSIM submission pickle (``.pkl``).
Scenes without a trajectory are invalid rows; a file that matches no scene is refused before
scoring (exit 2), and a run left with no valid row fails (exit 1) instead of reporting means
over nothing. ``--json`` is strict JSON with a ``"meta"`` block; invalid rows are null there,
``"valid"`` counts the others.

``--navsim-version`` picks NAVSIM's rules and CSV columns: ``1.1`` (default: PDMS; columns
no_at_fault_collisions, drivable_area_compliance, ego_progress,
time_to_collision_within_bound, comfort, driving_direction_compliance, score) or ``2``
(NAVSIM v2.2's one-stage EPDMS: log-replay traffic without objects overlapping the ego at
t0, the human penalty filter, history comfort as NAVSIM v2 computes it, EPDMS without a
previous frame over 14 weights; the EPDMS parts, score = EPDMS, two_frame_extended_comfort
empty). The CSV ends with an "average" row over the valid rows, as NAVSIM's run_pdm_score
writes. Compiled programs are kept in the persistent compilation cache
(``jax_drive/compile_cache.py``), and the command prints where the time went (loading,
compiling or loading compiled programs, scoring).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

from jax_drive.runinfo import finite_float, output_file, run_metadata, write_json

# The planners of jax_drive.evaluate.PLANNERS, named here so that building the parser imports
# no JAX (tests/test_cli_convention.py checks the two agree).
PLANNER_NAMES = ("constant_velocity", "expert", "idm", "pdm_closed")
CHOICES = [*PLANNER_NAMES, "file"]

# NAVSIM's CSV columns -> our PDMResult fields, per NAVSIM version.
NAVSIM_COLUMNS = {
    "1.1": (("no_at_fault_collisions", "nc"), ("drivable_area_compliance", "dac"), ("ego_progress", "ep"),
            ("time_to_collision_within_bound", "ttc"), ("comfort", "comfort"),
            ("driving_direction_compliance", "ddc"), ("score", "pdms")),
    "2": (("no_at_fault_collisions", "nc"), ("drivable_area_compliance", "dac"),
          ("driving_direction_compliance", "ddc_v2"), ("traffic_light_compliance", "tlc"), ("ego_progress", "ep_v2"),
          ("time_to_collision_within_bound", "ttc_v2"), ("lane_keeping", "lk"), ("history_comfort", "hc"),
          ("two_frame_extended_comfort", "ec"), ("score", "epdms")),
}
# Metrics in the failure breakdown: (field, label); a scene fails a metric below 1.
FAILURE_METRICS = (("nc", "NC"), ("dac", "DAC"), ("ddc", "DDC"), ("ttc", "TTC"), ("comfort", "C"),
                   ("tlc", "TLC"), ("lk", "LK"), ("hc", "HC"))


def register(subparsers) -> None:
    p = subparsers.add_parser("score", help="PDM-score a planner on generated scenes or a scene file",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--planner", choices=CHOICES, default=None,
                   help="planner to score (default pdm_closed; 'file' with --file / --trajectories)")
    p.add_argument("--file", "--trajectories", dest="file", type=Path,
                   help="trajectory file: JSONL by scene id (generated scenes) or by token / NAVSIM .pkl (--scenes-file)")
    p.add_argument("--scenes-file", type=Path, help="score the scenes of this file instead of generated ones")
    p.add_argument("--scenes", type=int, default=None, help="number of generated scenes (default 64)")
    p.add_argument("--seed", type=int, default=0, help="scene generator seed (default 0)")
    p.add_argument("--hard-fraction", type=finite_float, default=None, help="share of hard scenes (default: generator's 0.3)")
    p.add_argument("--batch-size", type=int, default=64, help="scenes per jitted call (default 64)")
    p.add_argument("--no-simulate", action="store_true", help="score raw poses (skip the LQR/bicycle tracking)")
    p.add_argument("--jerk-matrix", choices=("navsim", "nuplan"), default="navsim",
                   help="tracker velocity-fit regulariser: NAVSIM's (default) or nuPlan's true difference")
    p.add_argument("--json", type=output_file, metavar="OUT", help="write the results to this JSON file")
    p.add_argument("--csv", type=output_file, help="write per-scene scores with NAVSIM's column names (scene files)")
    p.add_argument("--navsim-version", choices=sorted(NAVSIM_COLUMNS), default="1.1",
                   help="NAVSIM's rules and CSV columns: 1.1 (PDMS, default) or 2 (v2.2's EPDMS)")
    p.add_argument("--plot", type=output_file, help="write a per-metric failure breakdown plot (PNG)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run)


def format_table(metrics: dict[str, float]) -> str:
    """Two-column text table of the metrics in ``jax_drive.evaluate.METRICS`` order."""
    from jax_drive.evaluate import METRICS

    lines = [f"{'metric':<10} {'mean':>8}", "-" * 19]
    for field, label in METRICS:
        if field in metrics:
            lines.append(f"{label:<10} {metrics[field]:>8.4f}")
    return "\n".join(lines)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _check(args) -> str | None:
    if args.batch_size < 1:
        return "--batch-size must be >= 1"
    if args.planner == "file" and args.file is None:
        return "--planner file needs --file / --trajectories PATH"
    if args.planner not in (None, "file") and args.file is not None:
        return "--file / --trajectories scores that file: leave out --planner or use --planner file"
    if args.scenes_file is not None:
        if args.scenes is not None or args.hard_fraction is not None:
            return "--scenes-file scores the file's scenes: leave out --scenes and --hard-fraction"
        return None
    if args.csv is not None:
        return "--csv needs --scenes-file (NAVSIM's columns are keyed by scene token)"
    if args.scenes is not None and args.scenes < 1:
        return "--scenes must be >= 1"
    if args.hard_fraction is not None and not 0.0 <= args.hard_fraction <= 1.0:
        return "--hard-fraction must be in [0, 1]"
    return None


def failure_breakdown(result, valid) -> dict[str, dict[str, float]]:
    """Per metric: the share of valid scenes failing it (value < 1), and for NC the shares
    of at-fault collisions with agents (0) and with static objects (0.5)."""
    import numpy as np

    out = {}
    n = max(int(np.sum(valid)), 1)
    for field, label in FAILURE_METRICS:
        values = np.asarray(getattr(result, field))[valid]
        entry = {"failed": float(np.sum(values < 1.0) / n)}
        if field == "nc":
            entry["agent"] = float(np.sum(values == 0.0) / n)
            entry["static"] = float(np.sum(values == 0.5) / n)
        out[label] = entry
    return out


def plot_failures(breakdown: dict, path: Path, title: str) -> None:
    """Bar chart of :func:`failure_breakdown` (shares of scenes failing each metric)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    labels = list(breakdown)
    shares = [100 * breakdown[k]["failed"] for k in labels]
    bars = ax.bar(labels, shares, color="tab:red")
    if "NC" in breakdown:
        ax.bar(["NC"], [100 * breakdown["NC"]["static"]], color="tab:orange", label="NC: static object (0.5)")
    for bar, share in zip(bars, shares):
        ax.annotate(f"{share:.1f}%", (bar.get_x() + bar.get_width() / 2, share), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("scenes failing (%)")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(0, max(shares + [1.0]) * 1.15)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


# Columns NAVSIM leaves empty (NaN) for a frame scored without its previous frame.
WITHOUT_PREVIOUS_FRAME = {"2": ("two_frame_extended_comfort",)}


def write_navsim_csv(path: Path, tokens, result, valid, version: str) -> None:
    """Per-scene rows with NAVSIM's columns, then NAVSIM's "average" row (mean over valid).

    With several proposals per scene (``valid`` (S, P)) each proposal is a row, with a
    "proposal" column after the token."""
    import numpy as np

    columns = NAVSIM_COLUMNS[version]
    empty = WITHOUT_PREVIOUS_FRAME.get(version, ())
    several = np.ndim(valid) == 2
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["token"] + (["proposal"] if several else []) + ["valid"] + [name for name, _ in columns])
        for index in np.ndindex(np.shape(valid)):
            ok = bool(valid[index])
            values = [float(np.asarray(getattr(result, field))[index]) if ok and name not in empty else math.nan
                      for name, field in columns]
            writer.writerow([tokens[index[0]]] + list(index[1:]) + [ok] + values)
        means = [float(np.mean(np.asarray(getattr(result, field))[valid])) if valid.any() and name not in empty
                 else math.nan for name, field in columns]
        writer.writerow(["average"] + ([""] if several else []) + [bool(valid.all())] + means)


def run(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem:
        return _fail(problem)
    planner = args.planner or ("file" if args.file is not None else "pdm_closed")

    import dataclasses

    import numpy as np

    from jax_drive.evaluate import (
        METRICS,
        TrajectoryFileError,
        evaluate_planner,
        evaluate_scene_file,
        load_token_proposals,
        load_trajectories,
        summarize,
    )
    from jax_drive.pdm import PDMConfig
    from jax_drive.runinfo import CompileClock

    from jax_drive.compile_cache import ExecutableStore

    clock, executables = CompileClock(), ExecutableStore()
    pdm_cfg = PDMConfig(navsim_version=args.navsim_version, simulate=not args.no_simulate,
                        jerk_matrix=args.jerk_matrix)
    t0 = time.perf_counter()
    payload: dict = {"planner": planner, "file": str(args.file) if args.file else None,
                     "simulate": not args.no_simulate, "jerk_matrix": args.jerk_matrix,
                     "navsim_version": args.navsim_version}
    if args.scenes_file is not None:
        from jax_drive.scenes.io import SceneFileError, load_scenes

        try:
            scenes = load_scenes(args.scenes_file)
            proposals = load_token_proposals(args.file, scenes.tokens) if planner == "file" else None
        except (SceneFileError, TrajectoryFileError) as e:
            return _fail(str(e))
        if proposals is not None and not np.isfinite(proposals).all(axis=(-2, -1)).any():
            return _fail(f"--trajectories {args.file}: no trajectory for any of the {len(scenes.tokens)} scenes of "
                         f"{args.scenes_file}: nothing to score")
        if proposals is not None and proposals.shape[1] == 1:
            proposals = proposals[:, 0]
        load_s, load_compile_s = time.perf_counter() - t0, clock.seconds
        result = evaluate_scene_file(scenes, planner, pdm_cfg, proposals=proposals, batch_size=args.batch_size,
                                     progress=not args.no_progress, executables=executables)
        tokens = list(scenes.tokens)
        valid = np.asarray(result.finite, bool)
        if proposals is not None and (~valid).any():
            what = "scenes have" if valid.ndim == 1 else "proposal rows have"
            print(f"warning: {int((~valid).sum())} of {valid.size} {what} no trajectory in {args.file}: "
                  "invalid rows", file=sys.stderr)
        desc = f"{len(tokens)} scenes from {args.scenes_file}"
        if valid.ndim == 2:
            desc += f", {valid.shape[1]} proposals each"
        payload.update({"scenes_file": str(args.scenes_file), "scenes": len(tokens),
                        "with_pdm_closed_in_file": int(scenes.has_reference.sum()),
                        "dropped_map_layers": scenes.dropped_layers})
    else:
        from jax_drive.scenes.generator import GeneratorConfig, generate_scenes

        import jax

        num = 64 if args.scenes is None else args.scenes
        proposals = None
        if planner == "file":
            try:
                proposals = load_trajectories(args.file, num)
            except TrajectoryFileError as e:
                return _fail(str(e))
        gen_cfg = GeneratorConfig()
        if args.hard_fraction is not None:
            gen_cfg = dataclasses.replace(gen_cfg, hard_fraction=args.hard_fraction)
        generated = generate_scenes(jax.random.PRNGKey(args.seed), num, gen_cfg)
        load_s, load_compile_s = time.perf_counter() - t0, clock.seconds  # generating compiles too
        result = evaluate_planner(planner, generated, pdm_cfg, proposals=proposals, batch_size=args.batch_size,
                                  progress=not args.no_progress and num > args.batch_size)
        tokens = [str(i) for i in range(num)]
        valid = np.ones(num, bool)
        desc = f"{num} scenes, seed {args.seed}"
        payload.update({"scenes": num, "seed": args.seed, "hard_fraction": gen_cfg.hard_fraction})
    elapsed = time.perf_counter() - t0
    # programs JAX compiled or loaded, plus whole executables loaded from the executable store
    compile_s = clock.seconds + (0.0 if executables.misses else executables.seconds)
    timing = {"load_s": load_s - load_compile_s, "compile_s": compile_s,
              "score_s": max(elapsed - load_s - (compile_s - load_compile_s), 0.0),
              "programs_compiled": clock.compiled, "programs_from_cache": clock.cache_hits + executables.hits,
              "total_s": elapsed}
    if not valid.any():  # a mean over no rows is no score (and its plot would read as 0 % failing)
        print(f"error: no valid row among the {valid.size} scored: nothing to report", file=sys.stderr)
        return 1
    metrics = summarize(result, valid)
    breakdown = failure_breakdown(result, valid)
    print(f"planner {planner}: {desc}, {int(valid.sum())} valid, {elapsed:.1f} s")
    print(f"time: load {timing['load_s']:.2f} s, compile {timing['compile_s']:.2f} s "
          f"({timing['programs_compiled']} programs compiled, {timing['programs_from_cache']} loaded from the "
          f"compilation cache), score {timing['score_s']:.2f} s")
    print(format_table(metrics))
    if args.csv is not None:
        write_navsim_csv(Path(args.csv), tokens, result, valid, args.navsim_version)
        print(f"wrote {args.csv}")
    if args.plot is not None:
        plot_failures(breakdown, Path(args.plot), f"{planner}: {desc}")
        print(f"wrote {args.plot}")
    if args.json is not None:
        payload.update({
            "seconds": elapsed, "timing": timing, "valid": int(valid.sum()), "metrics": metrics,
            "failures": breakdown, "tokens": tokens if args.scenes_file is not None else None,
            "per_scene": {field: np.where(valid, np.round(np.asarray(getattr(result, field), np.float64), 6),
                                          None).tolist()
                          for field, _ in METRICS} | {"valid": valid.tolist()},
        })
        write_json(args.json, {"meta": run_metadata(command="score"), **payload})
        print(f"wrote {args.json}")
    return 0
