"""Benchmark: the batched JAX PDM scorer vs the numpy/shapely reference, in three regimes.

* single scene (``--batches``): 1 .. 4,096 proposals of one busy scene, one
  ``jax_drive.pdm.score_proposals`` call per batch;
* many scenes (``--scenes S --proposals P``, default 256 x 8, MTDrive's regime): one call
  scoring S generated scenes with P proposals each;
* whole process (``--whole-scenes S --proposals P``, default 300 x 8): a scene file and a
  trajectory file of P proposals per scene are written to a temporary folder, then timed as
  a user runs them, each as its own process: ``jax-drive score --scenes-file F
  --trajectories T`` cold (an empty compilation cache), again warm (the cache the cold run
  filled), and the numpy reference's whole process on the same files (the same loader, then
  one proposal at a time); the CLI's own load / compile / score split is recorded too.

JAX figures are the median of ``--repeats`` calls after compilation (the first call is
recorded separately); the map budget is read off the concrete scenes inside each call, as
users call it. The reference (``jax_drive.pdm_reference``) scores one proposal at a time
with the scene geometry and the PDM-Closed reference trajectory shared per scene, like
NAVSIM's batch scoring. It is timed on a subset (single scene: the first
``--reference-subset`` proposals; many scenes: the first ``--reference-scenes`` scenes,
including each scene's setup) in rounds spread over the run (median round used) and
extrapolated; both scorers' PDMS are compared on that subset.

Steal screening: on a shared VM the hypervisor can give our cores to other guests (``st``
in vmstat). Each timed block records the share of CPU time stolen during it; a block above
``--max-steal`` is timed again, up to ``--steal-retries`` more times, and the attempt with
the least steal is kept (all attempts are in the JSON; ``--max-steal 1`` turns it off).

Usage:
  python experiments/bench_pdm.py --scenes 256 --proposals 8 --whole-scenes 300 [--json OUT]
  python experiments/bench_pdm.py --only multi --scenes 8 --proposals 2 --repeats 2   # tiny check
  python experiments/bench_pdm.py --only whole --whole-scenes 4 --proposals 2         # tiny check
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# One BLAS thread (set before numpy loads OpenBLAS): the reference multiplies tiny matrices,
# where BLAS threads only add overhead, and after each round OpenBLAS's idle threads keep
# spinning on the cores XLA's thread pool then needs (measured: the JAX call 0.116 s after
# a 16-scene reference round with the default threads, 0.093 s with one).
for _blas in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_blas, "1")

import numpy as np  # noqa: E402

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from cpu_steal import cpu_times, screened, steal_share  # noqa: E402  (sibling script)
from tqdm import tqdm  # noqa: E402

from jax_drive.runinfo import (command_line, finite_float, output_file, run_main, run_metadata,  # noqa: E402
                               write_json)

T8 = np.arange(1, 9) * 0.5
T40 = np.arange(1, 41) * 0.1
DEFAULT_BATCHES = (1, 4, 16, 64, 256, 1024, 2048, 4096)


def make_proposals(expert: np.ndarray, velocity: np.ndarray, count: int, seed: int = 0) -> np.ndarray:
    """(count, 8, 3) proposals: the expert, constant velocity, then random speed scalings,
    lateral drifts and noise (a spread of good and bad)."""
    rng = np.random.default_rng(seed)
    speed = float(np.hypot(*velocity))
    out = np.zeros((count, 8, 3))
    for i in range(count):
        if i == 0:
            out[i] = expert
            continue
        if i == 1:
            out[i] = np.stack([speed * T8, np.zeros(8), np.zeros(8)], -1)
            continue
        p = expert.copy()
        p[:, :2] *= rng.uniform(0.3, 1.8)
        lateral = rng.normal(0.0, 2.0) * (T8 / 4.0) ** 2
        h = p[:, 2]
        p[:, 0] -= np.sin(h) * lateral
        p[:, 1] += np.cos(h) * lateral
        p[:, 2] += np.arctan2(np.gradient(lateral), np.maximum(np.gradient(p[:, 0]), 0.5))
        p[:, :2] += rng.normal(0.0, 0.15, size=(8, 2))
        out[i] = p
    return out


def expert_reference(expert: np.ndarray) -> np.ndarray:
    """(40, 3) stand-in for the PDM-Closed reference: the expert resampled every 0.1 s."""
    knots_t = np.concatenate([[0.0], T8])
    knots = np.concatenate([np.zeros((1, 3)), expert], 0)
    return np.stack(
        [np.interp(T40, knots_t, knots[:, 0]), np.interp(T40, knots_t, knots[:, 1]),
         np.interp(T40, knots_t, np.unwrap(knots[:, 2]))], -1,
    )


def time_jax(fn, repeats: int) -> dict:
    """One timed block of ``repeats`` (>= 1) calls of an already compiled ``fn()``: median /
    min / max seconds, the CPU steal share over the block, and the last call's PDMS."""
    import jax

    times = []
    before = cpu_times()
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return {"jax_s": statistics.median(times), "jax_min_s": min(times), "jax_max_s": max(times),
            "cpu_steal_share": steal_share(before, cpu_times()), "pdms": np.asarray(out.pdms, np.float64)}


def timed_jax(fn, args) -> tuple[dict, float]:
    """(kept attempt without its PDMS, its PDMS, first-call seconds) for a zero-argument ``fn``."""
    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    kept, attempts = screened(lambda: time_jax(fn, args.repeats), args.max_steal, args.steal_retries)
    row = {"jax_first_call_s": first,
           **{k: kept[k] for k in ("jax_s", "jax_min_s", "jax_max_s", "cpu_steal_share")},
           "attempts": [{k: a[k] for k in ("jax_s", "jax_min_s", "jax_max_s", "cpu_steal_share")}
                        for a in attempts]}
    return row, kept["pdms"]


class ReferenceRounds:
    """Rounds of reference timing spread over a run; each round is steal-screened."""

    def __init__(self, time_round, args):
        self.time_round, self.args = time_round, args
        self.kept, self.attempts = [], []

    def run(self, desc: str) -> None:
        kept, attempts = screened(lambda: self.time_round(desc), self.args.max_steal, self.args.steal_retries)
        self.kept.append(kept)
        self.attempts.append(attempts)

    def median(self, key: str, first_attempts: bool = False) -> float:
        rounds = [a[0] for a in self.attempts] if first_attempts else self.kept
        return statistics.median(r[key] for r in rounds)

    def summary(self, key: str) -> dict:
        return {"rounds": [r[key] for r in self.kept], "rounds_cpu_steal_share": [r["cpu_steal_share"] for r in self.kept],
                "rounds_attempts": [[{k: a[k] for k in (key, "cpu_steal_share")} for a in att] for att in self.attempts]}


def single_scene(args, config, pdm) -> dict:
    """1 .. max(batches) proposals of one busy generated scene."""
    import jax
    import jax.numpy as jnp

    from jax_drive.pdm_reference import ReferenceScorer, scene_to_numpy
    from jax_drive.scenes import generate_scenes

    scenes = generate_scenes(jax.random.PRNGKey(7), 8)
    idx = int(np.argmax(np.asarray(scenes.agents.valid).any(-1).sum(-1)))  # the busiest of a few
    scene = jax.tree_util.tree_map(lambda a: a[idx], scenes)
    scene_np = scene_to_numpy(scene)
    expert = np.asarray(scene_np.expert, np.float64)
    batches = sorted(args.batches)
    proposals_all = make_proposals(expert, np.asarray(scene_np.ego.velocity, np.float64), max(batches))
    reference = expert_reference(expert)
    subset = min(args.reference_subset, max(batches))

    scorer = ReferenceScorer(scene_np, config)
    t0 = time.perf_counter()
    scorer.score(proposals_all[0], reference)  # builds the reference trajectory once
    setup_s = time.perf_counter() - t0

    def time_round(desc: str) -> dict:
        times, pdms = [], []
        before = cpu_times()
        for i in tqdm(range(subset), desc=desc, unit="proposal", leave=False):
            t0 = time.perf_counter()
            pdms.append(scorer.score(proposals_all[i], reference)["pdms"])
            times.append(time.perf_counter() - t0)
        return {"s_per_proposal": float(np.mean(times)), "cpu_steal_share": steal_share(before, cpu_times()),
                "pdms": pdms}

    rounds = ReferenceRounds(time_round, args)
    rounds.run("single scene: reference round 1")
    rows, largest_pdms = [], None
    ref_j = jnp.asarray(reference, jnp.float32)
    for b in tqdm(batches, desc="single scene: jax batches", unit="batch"):
        props = jnp.asarray(proposals_all[:b], jnp.float32)
        row, pdms = timed_jax(lambda: pdm.score_proposals(scene, props, ref_j, config), args)
        rows.append({"batch": b, **row, "jax_proposals_per_s": b / row["jax_s"]})
        if b == batches[-1]:
            largest_pdms = pdms
        if b >= 1024:
            rounds.run(f"single scene: reference round {len(rounds.kept) + 1}")

    per_proposal = rounds.median("s_per_proposal")
    per_proposal_first = rounds.median("s_per_proposal", first_attempts=True)
    for row in rows:
        row["reference_s"] = setup_s + row["batch"] * per_proposal
        row["reference_extrapolated"] = row["batch"] > subset
        row["speedup"] = row["reference_s"] / row["jax_s"]
        row["speedup_first_attempt"] = (setup_s + row["batch"] * per_proposal_first) / row["attempts"][0]["jax_s"]
    diff = np.abs(np.asarray(rounds.kept[-1]["pdms"]) - largest_pdms[:subset])
    last = rows[-1]
    return {
        "scene": f"generate_scenes(PRNGKey(7), 8)[{idx}]",
        "num_agents_valid": int(np.asarray(scene_np.agents.valid).any(-1).sum()),
        "jax_proposals_per_s": last["jax_proposals_per_s"],
        "reference_proposals_per_s": 1.0 / per_proposal,
        "reference_s_per_proposal": per_proposal,
        "reference_setup_s": setup_s,
        "reference": rounds.summary("s_per_proposal"),
        "reference_timed_on_proposals": subset,
        "speedup": last["speedup"],
        "speedup_first_attempts": {r["batch"]: r["speedup_first_attempt"] for r in rows},
        "min_speedup_at_1024_plus": min((r["speedup"] for r in rows if r["batch"] >= 1024), default=None),
        "time_4096_s": next((r["jax_s"] for r in rows if r["batch"] == 4096), None),
        "max_abs_pdms_diff": float(diff.max()),
        "max_abs_pdms_diff_on": f"first {subset} proposals of batch {last['batch']}",
        "per_batch": rows,
    }


def many_scenes(args, config, pdm) -> dict:
    """S generated scenes x P proposals in one call (MTDrive's regime)."""
    import jax
    import jax.numpy as jnp

    from jax_drive.pdm_reference import ReferenceScorer, scene_to_numpy
    from jax_drive.scenes import generate_scenes

    s_count, p_count = args.scenes, args.proposals
    scenes = generate_scenes(jax.random.PRNGKey(args.seed), s_count)
    scenes_np = scene_to_numpy(scenes)
    expert = np.asarray(scenes_np.expert, np.float64)
    velocity = np.asarray(scenes_np.ego.velocity, np.float64)
    proposals = np.stack([make_proposals(expert[s], velocity[s], p_count, seed=args.seed + s)
                          for s in range(s_count)])
    reference = np.stack([expert_reference(e) for e in expert])
    subset = min(args.reference_scenes, s_count)
    pick = lambda tree, s: jax.tree_util.tree_map(lambda a: a[s], tree)  # noqa: E731

    def time_round(desc: str) -> dict:
        times, pdms = [], []
        before = cpu_times()
        for s in tqdm(range(subset), desc=desc, unit="scene", leave=False):
            t0 = time.perf_counter()
            scorer = ReferenceScorer(pick(scenes_np, s), config)  # the scene's geometry: part of the cost
            pdms.append([scorer.score(proposals[s, p], reference[s])["pdms"] for p in range(p_count)])
            times.append(time.perf_counter() - t0)
        return {"s_per_scene": float(np.mean(times)), "cpu_steal_share": steal_share(before, cpu_times()),
                "pdms": pdms}

    rounds = ReferenceRounds(time_round, args)
    rounds.run("many scenes: reference round 1")
    props_j = jnp.asarray(proposals, jnp.float32)
    ref_j = jnp.asarray(reference, jnp.float32)
    row, pdms = timed_jax(lambda: pdm.score_proposals(scenes, props_j, ref_j, config), args)
    rounds.run("many scenes: reference round 2")
    per_scene = rounds.median("s_per_scene")
    per_scene_first = rounds.median("s_per_scene", first_attempts=True)
    total = s_count * p_count
    diff = np.abs(np.asarray(rounds.kept[-1]["pdms"]) - pdms[:subset])
    return {
        "scenes": f"generate_scenes(PRNGKey({args.seed}), {s_count})",
        "num_scenes": s_count,
        "proposals_per_scene": p_count,
        **row,
        "jax_proposals_per_s": total / row["jax_s"],
        "jax_s_per_scene": row["jax_s"] / s_count,
        "reference_s_per_scene": per_scene,
        "reference_s_per_proposal": per_scene / p_count,
        "reference_proposals_per_s": p_count / per_scene,
        "reference": rounds.summary("s_per_scene"),
        "reference_timed_on_scenes": subset,
        "reference_s": s_count * per_scene,
        "reference_extrapolated": s_count > subset,
        "speedup": s_count * per_scene / row["jax_s"],
        "speedup_first_attempt": s_count * per_scene_first / row["attempts"][0]["jax_s"],
        "max_abs_pdms_diff": float(diff.max()),
        "max_abs_pdms_diff_on": f"first {subset} scenes",
    }


def write_whole_process_files(directory: Path, num_scenes: int, num_proposals: int, seed: int) -> tuple[Path, Path]:
    """A scene file of ``num_scenes`` generated scenes (UTM-sized, rotated t0 poses, each with
    its PDM-Closed stand-in) and a JSONL of ``num_proposals`` proposals per scene."""
    import jax

    from jax_drive.pdm_reference import scene_to_numpy
    from jax_drive.scenes import generate_scenes, scene_record, write_scene_file

    scenes = scene_to_numpy(generate_scenes(jax.random.PRNGKey(seed), num_scenes))
    rng = np.random.default_rng(seed)
    records, lines = [], []
    for s in range(num_scenes):
        scene = jax.tree_util.tree_map(lambda a: a[s], scenes)
        origin = np.array([rng.uniform(3e5, 7e5), rng.uniform(4.0e6, 5.0e6), rng.uniform(-math.pi, math.pi)])
        token = f"bench-{s:05d}"
        records.append(scene_record(scene, origin, token, expert_reference(np.asarray(scene.expert, np.float64))))
        props = make_proposals(np.asarray(scene.expert, np.float64), np.asarray(scene.ego.velocity, np.float64),
                               num_proposals, seed=seed + s)
        lines.append(json.dumps({"token": token, "proposals": np.round(props, 4).tolist(), "dt": 0.5}))
    scenes_path = write_scene_file(directory / "scenes.json.gz", records)
    trajectories = directory / "proposals.jsonl"
    trajectories.write_text("\n".join(lines) + "\n")
    return scenes_path, trajectories


def reference_process(scenes_path: Path, trajectories: Path, out: Path, version: str) -> int:
    """The numpy reference's whole process: the same loader as the CLI, then every proposal
    scored one at a time (scene geometry and PDM-Closed shared per scene). Writes the scores."""
    import jax

    from jax_drive.evaluate import load_token_proposals
    from jax_drive.pdm_reference import ReferenceScorer, scene_to_numpy
    from jax_drive.pdm_reference.v2 import ReferenceScorerV2
    from jax_drive.scenes import load_scenes

    loaded = load_scenes(scenes_path)
    proposals = load_token_proposals(trajectories, loaded.tokens)
    scenes = scene_to_numpy(loaded.build())
    scores = []
    for s in range(len(loaded)):
        scene = jax.tree_util.tree_map(lambda a: a[s], scenes)
        if version == "2":
            scorer, key = ReferenceScorerV2(scene), "epdms"
        else:
            scorer, key = ReferenceScorer(scene), "pdms"
        scores.append([scorer.score(p, loaded.references[s])[key] for p in proposals[s]])
    out.write_text(json.dumps({"scores": scores}))
    return 0


def _timed_process(cmd: list[str], env: dict) -> dict:
    """Runs one process; its wall time as the parent sees it (start to exit) and CPU steal."""
    before = cpu_times()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    row = {"wall_s": wall, "returncode": proc.returncode, "cpu_steal_share": steal_share(before, cpu_times()),
           "load_average_after": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    if proc.returncode != 0:
        row["stderr_tail"] = proc.stderr[-2000:]
    return row


def whole_process(args) -> dict:
    """``jax-drive score`` on a scene file as a user runs it: cold, warm, and the reference."""
    work = Path(tempfile.mkdtemp(prefix="jax_drive_bench_pdm_"))
    cache = work / "xla_cache"
    try:
        scenes_path, trajectories = write_whole_process_files(work, args.whole_scenes, args.proposals, args.seed)
        env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")
               and k not in ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "JAX_DRIVE_NO_COMPILE_CACHE")}
        env.update(JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PLATFORMS=env.get("JAX_PLATFORMS", "cpu"))
        runs = {}
        for version in args.whole_versions:
            out = {}
            for label in ("cold", "warm"):
                if label == "cold":
                    shutil.rmtree(cache, ignore_errors=True)
                report = work / f"score_{version}_{label}.json"
                cmd = [sys.executable, "-m", "jax_drive.cli", "score", "--scenes-file", str(scenes_path),
                       "--trajectories", str(trajectories), "--navsim-version", version, "--json", str(report),
                       "--no-progress"]
                out[label] = _timed_process(cmd, env)
                if report.exists():
                    data = json.loads(report.read_text())
                    out[label]["cli_timing"] = data["timing"]
                    out[label]["mean_score"] = data["metrics"]["epdms" if version == "2" else "pdms"]
                    scores = data["per_scene"]["epdms" if version == "2" else "pdms"]
            ref_out = work / f"reference_{version}.json"
            cmd = [sys.executable, os.path.abspath(__file__), "--reference-process", str(scenes_path),
                   str(trajectories), str(ref_out), "--whole-versions", version]
            out["reference"] = _timed_process(cmd, env)
            if ref_out.exists():
                ref_scores = np.asarray(json.loads(ref_out.read_text())["scores"], np.float64)
                out["max_abs_score_diff_vs_reference"] = float(np.max(np.abs(ref_scores - np.asarray(scores, float))))
            warm, ref = out["warm"]["wall_s"], out["reference"]["wall_s"]
            out["speedup_warm_vs_reference"] = ref / warm
            out["speedup_cold_vs_reference"] = ref / out["cold"]["wall_s"]
            runs[version] = out
        return {"scenes": args.whole_scenes, "proposals_per_scene": args.proposals,
                "command": "jax-drive score --scenes-file scenes.json.gz --trajectories proposals.jsonl "
                           "--navsim-version V --json OUT --no-progress",
                "scene_file_mb": scenes_path.stat().st_size / 1e6, "by_navsim_version": runs}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenes", type=int, default=256, help="many-scenes regime: scenes per call (default 256)")
    parser.add_argument("--proposals", type=int, default=8, help="many-scenes regime: proposals per scene (default 8)")
    parser.add_argument("--batches", type=int, nargs="+", default=list(DEFAULT_BATCHES),
                        help="single-scene regime: proposal counts (default 1 4 16 64 256 1024 2048 4096)")
    parser.add_argument("--only", choices=("single", "multi", "whole"), help="run one regime only (default all)")
    parser.add_argument("--whole-scenes", type=int, default=300,
                        help="whole-process regime: scenes in the file (default 300; --proposals per scene)")
    parser.add_argument("--whole-versions", nargs="+", choices=("1.1", "2"), default=["1.1", "2"],
                        help="whole-process regime: NAVSIM rule versions to run (default both)")
    parser.add_argument("--reference-process", nargs=3, metavar=("SCENES", "TRAJECTORIES", "OUT"),
                        help=argparse.SUPPRESS)  # the reference's whole process (run by this script)
    parser.add_argument("--repeats", type=int, default=15, help="timed JAX calls per block (default 15)")
    parser.add_argument("--reference-subset", type=int, default=128, help="single scene: proposals timed on the reference")
    parser.add_argument("--reference-scenes", type=int, default=16, help="many scenes: scenes timed on the reference")
    parser.add_argument("--seed", type=int, default=0, help="scene generator seed of the many-scenes regime")
    parser.add_argument("--max-steal", type=finite_float, default=0.05,
                        help="re-time a block whose CPU steal share is above this (1 = never)")
    parser.add_argument("--steal-retries", type=int, default=3, help="extra attempts per block at most")
    parser.add_argument("--json", type=output_file, metavar="OUT", default=None, help="write the result JSON here (default: print only)")
    args = parser.parse_args(argv)
    if args.reference_process:
        return reference_process(*map(Path, args.reference_process), version=args.whole_versions[0])
    for name in ("scenes", "proposals", "repeats", "reference_subset", "reference_scenes", "whole_scenes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if any(b < 1 for b in args.batches):
        parser.error("--batches must be >= 1")
    if not 0.0 <= args.max_steal <= 1.0:
        parser.error(f"--max-steal must be a share in [0, 1], got {args.max_steal}")
    if args.steal_retries < 0:
        parser.error(f"--steal-retries must be >= 0, got {args.steal_retries}")

    import jax

    from jax_drive import pdm

    config = pdm.PDMConfig(check_finite=False)
    result = {
        "benchmark": "pdm_scorer",
        "meta": run_metadata(command=command_line(__file__, argv), device=str(jax.devices()[0]),
                             note_load=("load_average: the machine is shared by other sessions; compare it "
                                        "with the CPU count before reading a figure")),
        "repeats": args.repeats,
        "pdm_chunk_size": config.chunk_size,
        "pdm_jerk_matrix": config.jerk_matrix,
        "max_steal": args.max_steal,
        "steal_retries": args.steal_retries,
        "blas_threads": os.environ["OPENBLAS_NUM_THREADS"],
        "note": ("jax_s: median of `repeats` calls after compilation (first call separate); reference: "
                 "one proposal at a time with the scene geometry and the PDM-Closed reference trajectory "
                 "shared per scene (many scenes: each scene's setup included), timed on a subset in rounds "
                 "(median round) and extrapolated; cpu_steal_share: share of CPU time the hypervisor gave "
                 "to other guests during a block; blocks above max_steal re-timed, least-steal attempt kept"),
    }
    if args.only in (None, "multi"):
        result["many_scenes"] = many_scenes(args, config, pdm)
    if args.only in (None, "single"):
        result["single_scene"] = single_scene(args, config, pdm)
    if args.only in (None, "whole"):
        result["whole_process"] = whole_process(args)

    summary = {}
    if "many_scenes" in result:
        m = result["many_scenes"]
        summary["many_scenes"] = {k: m[k] for k in ("num_scenes", "proposals_per_scene", "jax_s", "jax_proposals_per_s",
                                                    "reference_proposals_per_s", "speedup", "max_abs_pdms_diff")}
    if "single_scene" in result:
        s = result["single_scene"]
        summary["single_scene"] = {k: s[k] for k in ("jax_proposals_per_s", "reference_proposals_per_s", "speedup",
                                                     "min_speedup_at_1024_plus", "time_4096_s", "max_abs_pdms_diff")}
    if "whole_process" in result:
        summary["whole_process"] = {
            v: {"cold_s": r["cold"]["wall_s"], "warm_s": r["warm"]["wall_s"], "reference_s": r["reference"]["wall_s"],
                "speedup_warm_vs_reference": r["speedup_warm_vs_reference"],
                "cold_compile_s": r["cold"].get("cli_timing", {}).get("compile_s"),
                "max_abs_score_diff_vs_reference": r.get("max_abs_score_diff_vs_reference")}
            for v, r in result["whole_process"]["by_navsim_version"].items()}
    result["meta"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    print(json.dumps(summary, indent=2))
    if args.json is not None:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    diffs = [part["max_abs_pdms_diff"] for part in summary.values() if "max_abs_pdms_diff" in part]
    runs = result.get("whole_process", {}).get("by_navsim_version", {}).values()
    ok = all(r[k]["returncode"] == 0 for r in runs for k in ("cold", "warm", "reference"))
    return 0 if ok and all(math.isfinite(d) for d in diffs) else 1


if __name__ == "__main__":
    raise SystemExit(run_main(main))
