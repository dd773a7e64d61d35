"""Parity of jax-drive's PDM scorer with NAVSIM's own ``pdm_score`` (v1.1 and v2.2), per column.

Three steps; the middle one runs where NAVSIM is importable (a NAVSIM environment: NAVSIM
and the nuPlan devkit on PYTHONPATH, no JAX needed), the others in jax-drive's environment:

  1. python experiments/navsim_parity.py cases --scenes 400 --seed 0 --out WORK
     writes WORK/scenes.json.gz (scene records, jax-drive-scenes format) and
     WORK/proposals.json (8 proposals per scene): see jax_drive/pdm_reference/navsim_parity.py.
  2. PYTHONPATH=<navsim tree>:<nuplan-devkit tree> <navsim python> experiments/navsim_parity.py \\
         navsim --cases WORK --json tests/data/navsim/navsim_v2.2.json.gz
     builds NAVSIM metric caches (nuPlan EgoStates, Agents, PDMObservation, PDMDrivableMap,
     PDMPath, InterpolatedTrajectory) from the records and scores every proposal with
     NAVSIM's ``pdm_score`` (v2: default scorer config with the human penalty filter,
     non-reactive ``LogReplayTrafficAgents``, one-stage final score; plus the two-frame
     extended comfort of each proposal against another one as its "previous frame");
     writes NAVSIM's per-proposal outputs.
  3. python experiments/navsim_parity.py compare --navsim tests/data/navsim/navsim_v1.1.json.gz \\
         tests/data/navsim/navsim_v2.2.json.gz --json experiments/results/navsim_parity.json
     regenerates the cases (checking each scene's fingerprint), scores them with jax-drive
     and writes the per-column comparison.

The NAVSIM outputs are committed as test data (figures only) and compared in
tests/test_pdm_navsim_parity.py.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from jax_drive.runinfo import add_output_args, command_line, output_dir, run_main, run_metadata, write_json


# ----------------------------------------------------------------------------- files
def _open(path: Path, mode: str):
    return gzip.open(path, mode + "t", encoding="utf-8") if path.suffix == ".gz" else open(path, mode, encoding="utf-8")


def read_json(path: Path):
    with _open(path, "r") as f:
        return json.load(f)


def write_gz_json(path: Path, payload) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with _open(path, "w") as f:
        json.dump(payload, f, separators=(",", ":"))
    return path


# ----------------------------------------------------------------------------- step 1
def make_cases(args) -> int:
    from jax_drive.pdm_reference.navsim_parity import parity_cases
    from jax_drive.scenes import write_scene_file

    cases = parity_cases(args.scenes, args.seed)
    out = Path(args.out)
    write_scene_file(out / "scenes.json.gz", cases.records)
    write_gz_json(out / "proposals.json", {"scenes": args.scenes, "seed": args.seed, "tokens": cases.tokens,
                                          "variants": list(cases.variants), "fingerprints": list(cases.fingerprints),
                                          "proposals": cases.proposals.tolist()})
    print(f"wrote {len(cases.records)} scenes and {cases.proposals.shape[0] * cases.proposals.shape[1]} "
          f"proposals to {out}")
    return 0


# ----------------------------------------------------------------------------- step 2 (NAVSIM)
class NavsimCases:
    """Builds NAVSIM metric caches from scene records (global frame, 0.1 s observation)."""

    DRIVABLE = ("ROADBLOCK", "INTERSECTION", "CARPARK_AREA", "DRIVABLE_AREA")

    def __init__(self, v2: bool):
        from nuplan.common.actor_state.vehicle_parameters import get_pacifica_parameters
        from nuplan.planning.simulation.trajectory.trajectory_sampling import TrajectorySampling

        self.v2 = v2
        self.vehicle = get_pacifica_parameters()
        self.proposal_sampling = TrajectorySampling(num_poses=40, interval_length=0.1)
        self.t0_us = 1_000_000_000

    def ego_state(self, pose, velocity, acceleration, steering, time_us, yaw_rate=0.0, yaw_accel=0.0):
        from nuplan.common.actor_state.ego_state import EgoState
        from nuplan.common.actor_state.state_representation import StateSE2, StateVector2D, TimePoint

        return EgoState.build_from_rear_axle(
            rear_axle_pose=StateSE2(*map(float, pose)), rear_axle_velocity_2d=StateVector2D(*map(float, velocity)),
            rear_axle_acceleration_2d=StateVector2D(*map(float, acceleration)), tire_steering_angle=float(steering),
            time_point=TimePoint(int(time_us)), vehicle_parameters=self.vehicle, is_in_auto_mode=True,
            angular_vel=float(yaw_rate), angular_accel=float(yaw_accel))

    def tracked(self, box: dict, frame: int):
        from nuplan.common.actor_state.agent import Agent
        from nuplan.common.actor_state.oriented_box import OrientedBox
        from nuplan.common.actor_state.scene_object import SceneObjectMetadata
        from nuplan.common.actor_state.state_representation import StateSE2, StateVector2D
        from nuplan.common.actor_state.static_object import StaticObject
        from nuplan.common.actor_state.tracked_objects_types import AGENT_TYPES, TrackedObjectType

        kind = TrackedObjectType[box["type"].upper()]
        oriented = OrientedBox(StateSE2(box["x"], box["y"], box["heading"]), box["length"], box["width"], box["height"])
        meta = SceneObjectMetadata(timestamp_us=self.t0_us + frame * 100_000, token=f"{box['token']}-{frame}",
                                   track_id=None, track_token=box["token"])
        if kind in AGENT_TYPES:
            return Agent(tracked_object_type=kind, oriented_box=oriented,
                         velocity=StateVector2D(box.get("vx", 0.0), box.get("vy", 0.0)), metadata=meta)
        return StaticObject(tracked_object_type=kind, oriented_box=oriented, metadata=meta)

    def build(self, record: dict):
        import shapely
        from nuplan.common.actor_state.state_representation import StateSE2
        from nuplan.common.maps.maps_datatypes import SemanticMapLayer, TrafficLightStatusData, TrafficLightStatusType
        from nuplan.common.actor_state.tracked_objects import TrackedObjects
        from nuplan.planning.simulation.observation.observation_type import DetectionsTracks
        from nuplan.planning.simulation.trajectory.interpolated_trajectory import InterpolatedTrajectory

        from navsim.planning.simulation.planner.pdm_planner.observation.pdm_observation import PDMObservation
        from navsim.planning.simulation.planner.pdm_planner.observation.pdm_occupancy_map import PDMDrivableMap
        from navsim.planning.simulation.planner.pdm_planner.utils.pdm_path import PDMPath
        from types import SimpleNamespace

        ego = record["ego"]
        history = ego.get("history")
        t0_yaw = (history["yaw_rate"][-1], history["yaw_acceleration"][-1]) if history else (0.0, 0.0)
        ego_state = self.ego_state(ego["pose"], ego["velocity"], ego["acceleration"], ego.get("steering_angle", 0.0),
                                   self.t0_us, *t0_yaw)
        frames = record["observation"]["frames"]
        n_frames = 41 if self.v2 else 51
        tracks = [DetectionsTracks(TrackedObjects([self.tracked(b, k) for b in frames[k]])) for k in range(n_frames)]
        tokens, types, geometries, lanes = [], [], [], {}
        for poly in record["map"]["polygons"]:
            if poly["layer"] not in self.DRIVABLE + ("LANE", "LANE_CONNECTOR"):
                continue
            geometry = shapely.Polygon(poly["exterior"], poly.get("holes", []))
            tokens.append(poly["id"])
            types.append(SemanticMapLayer[poly["layer"]])
            geometries.append(geometry)
            if poly["layer"] in ("LANE", "LANE_CONNECTOR"):
                lanes[poly["id"]] = SimpleNamespace(polygon=geometry)
        drivable = PDMDrivableMap(tokens, types, np.array(geometries, dtype=object))
        route_ids = [str(r) for r in record["map"]["route_lane_ids"]]
        route = np.asarray(record["map"]["route"], np.float64)
        heading = np.arctan2(np.diff(route[:, 1]), np.diff(route[:, 0]))
        heading = np.concatenate([heading, heading[-1:]])
        centerline = PDMPath([StateSE2(x, y, h) for (x, y), h in zip(route, heading)])
        plan = record["pdm_closed"]["poses"]
        reference = InterpolatedTrajectory([ego_state] + [
            self.ego_state(p, (0.0, 0.0), (0.0, 0.0), 0.0, self.t0_us + (k + 1) * 100_000) for k, p in enumerate(plan)])
        if not self.v2:
            from navsim.planning.metric_caching.metric_cache import MetricCache

            observation = PDMObservation(type(self.proposal_sampling)(num_poses=50, interval_length=0.1),
                                         self.proposal_sampling, 100, observation_sample_res=1)
            observation.update_detections_tracks(tracks)
            return MetricCache(None, reference, ego_state, observation, centerline, route_ids, drivable)
        return self._build_v2(record, ego_state, tracks, drivable, route_ids, centerline, reference, lanes,
                              TrafficLightStatusData, TrafficLightStatusType, InterpolatedTrajectory, PDMObservation)

    def _build_v2(self, record, ego_state, tracks, drivable, route_ids, centerline, reference, lanes,
                  TrafficLightStatusData, TrafficLightStatusType, InterpolatedTrajectory, PDMObservation):
        from navsim.common.dataclasses import Trajectory
        from navsim.common.enums import SceneFrameType
        from navsim.planning.metric_caching.metric_cache import MapParameters, MetricCache
        from nuplan.planning.simulation.trajectory.trajectory_sampling import TrajectorySampling

        lights = [[] for _ in range(41)]
        for light in record["map"].get("traffic_lights", []):
            red = light["red"]
            for k in range(41):
                if (red if isinstance(red, bool) else red[k]):
                    lights[k].append(TrafficLightStatusData(TrafficLightStatusType.RED, light["lane_id"],
                                                            self.t0_us + k * 100_000))
        route_lanes = {lane: lanes[lane] for lane in route_ids if lane in lanes}
        observation = PDMObservation(self.proposal_sampling, self.proposal_sampling, 100, observation_sample_res=1,
                                     extend_observation_for_ttc=False)
        observation.update_detections_tracks(tracks, lights, route_lanes, compute_traffic_light_data=True)
        history = record["ego"].get("history")
        past = None
        if history is not None:
            n = len(history["poses"])
            past = InterpolatedTrajectory([
                self.ego_state(history["poses"][k], history["velocity"][k], history["acceleration"][k], 0.0,
                               self.t0_us - (n - 1 - k) * 100_000, history["yaw_rate"][k],
                               history["yaw_acceleration"][k]) for k in range(n)])
        human = None
        if "expert" in record:
            origin = np.asarray(record["ego"]["pose"], np.float64)
            glob = np.asarray(record["expert"]["poses"], np.float64)
            c, s = math.cos(origin[2]), math.sin(origin[2])
            d = glob[:, :2] - origin[:2]
            local = np.stack([c * d[:, 0] + s * d[:, 1], -s * d[:, 0] + c * d[:, 1],
                              np.arctan2(np.sin(glob[:, 2] - origin[2]), np.cos(glob[:, 2] - origin[2]))], -1)
            human = Trajectory(poses=local, trajectory_sampling=TrajectorySampling(
                time_horizon=4.0, interval_length=float(record["expert"]["dt"])))
        return MetricCache(
            file_path=None, log_name="parity", timepoint=ego_state.time_point,
            scene_type=SceneFrameType.ORIGINAL if human is not None else SceneFrameType.SYNTHETIC,
            trajectory=reference, human_trajectory=human, past_human_trajectory=past, ego_state=ego_state,
            observation=observation, centerline=centerline, route_lane_ids=route_ids, drivable_area_map=drivable,
            past_detections_tracks=[], current_tracked_objects=[tracks[0]], future_tracked_objects=tracks[1:],
            map_parameters=MapParameters(map_root="", map_version="", map_name="parity"))


def run_navsim(args, argv=None) -> int:
    try:
        import navsim  # noqa: F401
    except ImportError:
        print("error: `navsim` is not importable: run this step in a NAVSIM environment "
              "(NAVSIM and nuplan-devkit on PYTHONPATH)", file=sys.stderr)
        return 2
    from navsim.common.dataclasses import Trajectory
    from navsim.evaluate.pdm_score import pdm_score
    from navsim.planning.simulation.planner.pdm_planner.scoring.pdm_scorer import PDMScorer, PDMScorerConfig
    from navsim.planning.simulation.planner.pdm_planner.simulation.pdm_simulator import PDMSimulator
    from nuplan.planning.simulation.trajectory.trajectory_sampling import TrajectorySampling

    try:
        from navsim.traffic_agents_policies.log_replay_traffic_agents import LogReplayTrafficAgents
        v2 = True
    except ImportError:
        v2 = False
    meta = run_metadata(command=command_line(__file__, argv))
    cases_dir = Path(args.cases)
    records = read_json(cases_dir / "scenes.json.gz")["scenes"]
    props = read_json(cases_dir / "proposals.json")
    proposals = np.asarray(props["proposals"], np.float64)
    if args.max_scenes:
        records, proposals = records[: args.max_scenes], proposals[: args.max_scenes]
    builder = NavsimCases(v2)
    sampling = builder.proposal_sampling
    simulator = PDMSimulator(sampling)
    scorer = PDMScorer(sampling, PDMScorerConfig(human_penalty_filter=True) if v2 else PDMScorerConfig())
    output_sampling = TrajectorySampling(time_horizon=4.0, interval_length=0.5)
    columns: dict[str, list] = {}
    build_s = score_s = 0.0
    for i, record in enumerate(records):
        t0 = time.perf_counter()
        cache = builder.build(record)
        build_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        rows, states = [], []
        for p in proposals[i]:
            traj = Trajectory(poses=p, trajectory_sampling=output_sampling)
            if v2:
                policy = LogReplayTrafficAgents(sampling)
                frame, simulated = pdm_score(cache, traj, sampling, simulator, scorer, policy)
                rows.append(_v2_row(frame))
                states.append(simulated)
            else:
                rows.append(_v1_row(pdm_score(cache, traj, sampling, simulator, scorer)))
        if v2:
            _add_extended_comfort(rows, states)
        score_s += time.perf_counter() - t0
        for row in rows:
            for key in row:
                columns.setdefault(key, [[] for _ in records])
        for key in columns:
            columns[key][i] = [row[key] for row in rows]
        if (i + 1) % 25 == 0:
            print(f"{i + 1}/{len(records)} scenes ({build_s:.1f} s building, {score_s:.1f} s scoring)", flush=True)
    payload = {
        "navsim_version": "2.2" if v2 else "1.1",
        "what": "NAVSIM's own pdm_score outputs per proposal on jax-drive's parity cases",
        "cases": {k: props[k] for k in ("scenes", "seed")} | {"scored_scenes": len(records)},
        "tokens": [r["token"] for r in records], "variants": props["variants"][: len(records)],
        "fingerprints": props["fingerprints"][: len(records)], "columns": columns,
        "seconds": {"build_metric_caches": build_s, "score": score_s},
        "meta": meta | {"load_average_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None},
    }
    write_gz_json(Path(args.json), payload)
    print(f"wrote {args.json}: {len(records)} scenes, NAVSIM {payload['navsim_version']}, "
          f"{build_s:.1f} s building metric caches, {score_s:.1f} s scoring")
    return 0


def _v1_row(result) -> dict:
    return {"no_at_fault_collisions": result.no_at_fault_collisions,
            "drivable_area_compliance": result.drivable_area_compliance, "ego_progress": result.ego_progress,
            "time_to_collision_within_bound": result.time_to_collision_within_bound, "comfort": result.comfort,
            "driving_direction_compliance": result.driving_direction_compliance, "score": result.score}


V2_COLUMNS = ("no_at_fault_collisions", "drivable_area_compliance", "driving_direction_compliance",
              "traffic_light_compliance", "ego_progress", "time_to_collision_within_bound", "lane_keeping",
              "history_comfort", "pdm_score")


def _v2_row(frame) -> dict:
    """One proposal's columns, and its one-stage final score without a previous frame
    (``run_pdm_score_one_stage.compute_final_scores`` with EC NaN: EC and its weight left out)."""
    from navsim.planning.simulation.planner.pdm_planner.utils.pdm_enums import WeightedMetricIndex

    row = {c: float(frame[c].iloc[0]) for c in V2_COLUMNS}
    weighted = np.array(frame["weighted_metrics"].iloc[0], np.float64)
    weights = np.array(frame["weighted_metrics_array"].iloc[0], np.float64)
    prod = float(frame["multiplicative_metrics_prod"].iloc[0])
    ec = WeightedMetricIndex.TWO_FRAME_EXTENDED_COMFORT
    keep = np.arange(len(weights)) != ec
    row["score"] = prod * float((weighted[keep] * weights[keep]).sum() / weights[keep].sum())
    row["_weighted"], row["_weights"], row["_prod"] = weighted.tolist(), weights.tolist(), prod
    return row


def _add_extended_comfort(rows: list, states: list) -> None:
    """NAVSIM's two-frame EC of each proposal with proposal (p + 1) % P as the previous
    frame (0.5 s earlier), and the final score with it (all five weights)."""
    from navsim.planning.simulation.planner.pdm_planner.scoring.pdm_comfort_metrics import (
        ego_is_two_frame_extended_comfort,
    )
    from navsim.planning.simulation.planner.pdm_planner.utils.pdm_enums import WeightedMetricIndex

    n = len(rows)
    for p, row in enumerate(rows):
        current, previous = states[p], states[(p + 1) % n]
        cur, prev = current[:-5], previous[5:]
        ec = float(ego_is_two_frame_extended_comfort(cur[None], prev[None], np.arange(len(cur)) * 0.1)[0])
        weighted, weights = np.array(row.pop("_weighted")), np.array(row.pop("_weights"))
        weighted[WeightedMetricIndex.TWO_FRAME_EXTENDED_COMFORT] = ec
        row["two_frame_extended_comfort"] = ec
        row["score_with_ec"] = row.pop("_prod") * float((weighted * weights).sum() / weights.sum())


# ----------------------------------------------------------------------------- step 3
def run_compare(args, argv=None) -> int:
    from jax_drive.pdm_reference.navsim_parity import compare, parity_cases, same_cases, score_cases

    outputs = [read_json(Path(p)) for p in args.navsim]
    report = {"meta": run_metadata(command=command_line(__file__, argv)), "versions": {}}
    cache: dict = {}
    for out in outputs:
        key = (out["cases"]["scenes"], out["cases"]["seed"])
        if key not in cache:
            cache[key] = parity_cases(*key)
        cases = cache[key]
        n = out["cases"]["scored_scenes"]
        stale = [t for t, a, b in zip(out["tokens"], out["fingerprints"], cases.fingerprints[:n])
                 if not same_cases(a, b)]
        ours = score_cases(cases, out["navsim_version"])
        ours = {k: v[:n] for k, v in ours.items()}
        table = compare(out["columns"], ours, out["tokens"])
        entry = {
            "cases": out["cases"], "proposals": int(np.size(next(iter(ours.values())))),
            "stale_scenes": stale, "navsim_seconds": out["seconds"], "columns": table,
            "all_equal": {c: r["equal"] == r["compared"] for c, r in table.items()},
        }
        if out["navsim_version"].startswith("2"):
            entry["rules_exercised"] = rule_sensitivity(cases, out, n)
        report["versions"][out["navsim_version"]] = entry
        worst = {c: f"{r['equal']}/{r['compared']}" for c, r in table.items()}
        print(f"NAVSIM {out['navsim_version']}: {worst}")
    write_json(args.json, report)
    print(f"wrote {args.json}")
    return 0


def rule_sensitivity(cases, out: dict, n: int) -> dict:
    """Per NAVSIM v2 convention: on how many proposals the other choice (jax-drive's earlier
    rule) would differ from NAVSIM in some column, and in which columns: how much each
    rule is exercised by the cases."""
    from jax_drive.pdm_reference.navsim_parity import OTHER_CONVENTION, compare, score_cases

    result = {}
    for name, value in OTHER_CONVENTION.items():
        other = {k: v[:n] for k, v in score_cases(cases, out["navsim_version"], **{name: value}).items()}
        table = compare(out["columns"], other, out["tokens"], max_listed=100_000)
        rows = {(d["token"], d["proposal"]) for r in table.values() for d in r["differences"]}
        result[name] = {"other_choice": value, "proposals_that_would_differ": len(rows),
                        "columns": {c: r["compared"] - r["equal"] for c, r in table.items()
                                    if r["equal"] < r["compared"]}}
        print(f"  {name}={value!r}: {len(rows)} proposals would differ from NAVSIM")
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("cases", help="write the parity cases (jax-drive environment)")
    p.add_argument("--scenes", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, type=output_dir, help="folder for scenes.json.gz and proposals.json")
    p = sub.add_parser("navsim", help="score the cases with NAVSIM's pdm_score (NAVSIM environment)")
    p.add_argument("--cases", required=True, help="folder written by the cases step")
    p.add_argument("--max-scenes", type=int, default=None, help="only the first N scenes")
    add_output_args(p, json_required=True, progress=False)
    p = sub.add_parser("compare", help="compare NAVSIM's outputs with jax-drive (jax-drive environment)")
    p.add_argument("--navsim", nargs="+", required=True, help="NAVSIM output files of the navsim step")
    add_output_args(p, json_required=True, progress=False)
    args = parser.parse_args(argv)
    if getattr(args, "scenes", 1) < 1:
        parser.error("--scenes must be >= 1")
    if args.step == "cases":
        return make_cases(args)
    return {"navsim": run_navsim, "compare": run_compare}[args.step](args, argv)


if __name__ == "__main__":
    sys.exit(run_main(main))
