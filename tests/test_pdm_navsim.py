"""NAVSIM: the metric-cache exporter on stand-in objects (always), and against NAVSIM itself
(only where navsim and nuplan are installed; skipped with the reason otherwise)."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace as NS

import jax
import numpy as np
import pytest
import shapely

from jax_drive.adapters import navsim_export
from jax_drive.pdm import PDMConfig, interpolate_poses, score_proposals, simulate_states
from jax_drive.scenes import generate_scenes, io
from jax_drive.scenes.builders import SceneSizes, polygon_rings
from jax_drive.types import AGENT_TYPE_NAMES, AgentType

ORIGIN = np.array([664_321.25, 3_996_512.75, -0.7])


def test_exporter_format_constants_match_the_reader():
    assert navsim_export.FORMAT_NAME == io.FORMAT_NAME
    assert navsim_export.FORMAT_VERSION == io.FORMAT_VERSION


def test_box_from_corners_in_nuplan_order():
    c, s, hl, hw = math.cos(0.4), math.sin(0.4), 2.25, 1.0
    fwd, left = np.array([c, s]), np.array([-s, c])
    centre = np.array([5e5, 4.5e6])
    corners = [centre + hl * fwd + hw * left, centre - hl * fwd + hw * left, centre - hl * fwd - hw * left,
               centre + hl * fwd - hw * left]
    box = navsim_export.box_from_corners(np.asarray(corners))
    assert box["heading"] == pytest.approx(0.4, abs=1e-9)  # float64 at UTM coordinates
    assert (box["length"], box["width"]) == (pytest.approx(4.5, abs=1e-9), pytest.approx(2.0, abs=1e-9))
    assert (box["x"], box["y"]) == (pytest.approx(5e5, abs=1e-9), pytest.approx(4.5e6, abs=1e-9))


# ------------------------------------------------------------------ stand-ins for NAVSIM's objects
class _Time(NS):
    def __init__(self, time_us):
        super().__init__(time_us=int(time_us))


class _Trajectory:
    """InterpolatedTrajectory stand-in: rear-axle poses at knot times (us), linear in between."""

    def __init__(self, times_us, poses):
        self.times, self.poses = np.asarray(times_us, np.float64), np.asarray(poses, np.float64)
        self.start_time, self.end_time = _Time(times_us[0]), _Time(times_us[-1])

    def get_state_at_time(self, t):
        p = [np.interp(t.time_us, self.times, self.poses[:, j]) for j in range(3)]
        return NS(rear_axle=NS(x=p[0], y=p[1], heading=p[2]))


class _Map:
    def __init__(self, tokens, geometries, types=None):
        self.tokens, self._geometries = list(tokens), dict(zip(tokens, geometries))
        self.map_types = types

    def __getitem__(self, token):
        return self._geometries[token]


def _global(xy, origin=ORIGIN):
    c, s = math.cos(origin[2]), math.sin(origin[2])
    xy = np.asarray(xy, np.float64)
    return np.stack([origin[0] + c * xy[..., 0] - s * xy[..., 1], origin[1] + s * xy[..., 0] + c * xy[..., 1]], -1)


def fake_metric_cache(scene, reference):
    """A NAVSIM v1.1-like MetricCache of one ego-frame scene placed at ORIGIN."""
    sc = jax.tree.map(np.asarray, scene)
    ag = sc.agents
    c, s = math.cos(ORIGIN[2]), math.sin(ORIGIN[2])
    unique, maps = {}, []
    red_lanes = [i for i in np.flatnonzero(sc.map.lanes.valid) if sc.map.red_light[i].any()]
    for k in range(ag.valid.shape[1]):
        tokens, geoms = [], []
        for n in np.flatnonzero(ag.valid[:, k]):
            token = f"track-{n}"
            h = float(ag.heading[n, k])
            fwd, left = np.array([math.cos(h), math.sin(h)]), np.array([-math.sin(h), math.cos(h)])
            centre, hl, hw = np.array([ag.x[n, k], ag.y[n, k]], np.float64), ag.length[n] / 2, ag.width[n] / 2
            corners = [centre + hl * fwd + hw * left, centre - hl * fwd + hw * left, centre - hl * fwd - hw * left,
                       centre + hl * fwd - hw * left]
            tokens.append(token)
            geoms.append(shapely.Polygon(_global(np.asarray(corners))))
            if token not in unique:
                vx, vy = float(ag.vx[n, k]), float(ag.vy[n, k])
                unique[token] = NS(tracked_object_type=NS(name=AGENT_TYPE_NAMES[AgentType(int(ag.agent_type[n]))].upper()),
                                   box=NS(height=float(ag.height[n])), center=NS(z=0.0),
                                   velocity=NS(x=c * vx - s * vy, y=s * vx + c * vy))
        for i in red_lanes:
            if sc.map.red_light[i, k]:
                ext, _ = polygon_rings(sc.map.lanes.vertices[i].astype(np.float64))
                tokens.append(f"red_light_lane-{i}")
                geoms.append(shapely.Polygon(_global(ext)))
        maps.append(_Map(tokens, geoms))
    observation = type("Observation", (), {"__getitem__": lambda self, k: maps[k]})()
    observation.red_light_token, observation.unique_objects, observation._occupancy_maps = "red_light", unique, maps
    tokens, geoms, types, route = [], [], [], []
    layer = {0: "ROADBLOCK", 1: "INTERSECTION", 2: "CARPARK_AREA"}
    for i in np.flatnonzero(sc.map.drivable.valid):
        ext, holes = polygon_rings(sc.map.drivable.vertices[i].astype(np.float64))
        tokens.append(f"drivable-{i}")
        geoms.append(shapely.Polygon(_global(ext), [_global(h) for h in holes]))
        types.append(NS(name=layer[int(sc.map.drivable.kind[i])]))
    for i in np.flatnonzero(sc.map.lanes.valid):
        ext, _ = polygon_rings(sc.map.lanes.vertices[i].astype(np.float64))
        tokens.append(f"lane-{i}")
        geoms.append(shapely.Polygon(_global(ext)))
        types.append(NS(name="LANE_CONNECTOR" if int(sc.map.lanes.kind[i]) == 1 else "LANE"))
        if sc.map.lanes.on_route[i]:
            route.append(f"lane-{i}")
    t0 = 1_000_000_000
    plan = np.concatenate([np.zeros((1, 3)), np.asarray(reference, np.float64)])
    plan_global = np.concatenate([_global(plan[:, :2]), plan[:, 2:] + ORIGIN[2]], -1)
    ego = NS(rear_axle=NS(x=ORIGIN[0], y=ORIGIN[1], heading=ORIGIN[2]), time_point=_Time(t0),
             tire_steering_angle=float(sc.ego.steering_angle),
             dynamic_car_state=NS(rear_axle_velocity_2d=NS(x=float(sc.ego.velocity[0]), y=float(sc.ego.velocity[1])),
                                  rear_axle_acceleration_2d=NS(x=float(sc.ego.acceleration[0]),
                                                               y=float(sc.ego.acceleration[1]))))
    route_xy = _global(sc.route.points[sc.route.valid].astype(np.float64))
    return NS(ego_state=ego, observation=observation, drivable_area_map=_Map(tokens, geoms, types),
              route_lane_ids=route, centerline=NS(linestring=shapely.LineString(route_xy)),
              trajectory=_Trajectory(t0 + np.arange(41) * 100_000, plan_global))


def test_exported_metric_cache_scores_like_the_scene_it_describes():
    """Stand-in metric caches of generated scenes (boxes as nuPlan corner polygons, map
    polygons with layers, red-light obstacles, PDM-Closed as a trajectory) export to records
    that load and score like the scenes themselves (PDMS parts and TLC; the stand-ins carry
    no history, so HC is not compared)."""
    scenes = generate_scenes(jax.random.PRNGKey(12), 3)
    reference = np.asarray(interpolate_poses(scenes, scenes.expert, 0.5))[:, 1:]
    records = [navsim_export.record_from_metric_cache(fake_metric_cache(jax.tree.map(lambda a: a[i], scenes),
                                                                        reference[i]), f"tok-{i}")
               for i in range(3)]
    loaded = io.load_scenes(records)
    np.testing.assert_allclose(loaded.references, reference, atol=1e-5)
    back = loaded.build(sizes=SceneSizes())
    props = np.asarray(scenes.expert)[:, None] * np.array([1.0, 0.5, 1.5])[None, :, None, None]
    a = score_proposals(scenes, props, reference)
    b = score_proposals(back, props, loaded.references)
    for name in ("nc", "dac", "ddc", "ttc", "comfort", "tlc"):
        np.testing.assert_array_equal(np.asarray(getattr(b, name)), np.asarray(getattr(a, name)), err_msg=name)
    for name in ("ep", "pdms", "progress"):
        np.testing.assert_allclose(np.asarray(getattr(b, name)), np.asarray(getattr(a, name)), atol=1e-5, err_msg=name)
    assert any("no history" in n for n in loaded.notes[0])


# ------------------------------------------------------------------ NAVSIM itself
def test_tracker_matches_navsims_batch_lqr_tracker():
    """Our tracking simulation against NAVSIM's BatchLQRTracker + BatchKinematicBicycleModel
    (the code the PDM score runs) on generated scenes' trajectories: NAVSIM's jerk matrix
    agrees to float32 accuracy."""
    pytest.importorskip("nuplan", reason="needs the nuPlan devkit (installed with NAVSIM from its own sources)")
    lqr = pytest.importorskip("navsim.planning.simulation.planner.pdm_planner.simulation.batch_lqr",
                              reason="needs NAVSIM (https://github.com/autonomousvision/navsim)")
    from navsim.planning.simulation.planner.pdm_planner.simulation.batch_kinematic_bicycle import (
        BatchKinematicBicycleModel,
    )
    from nuplan.common.actor_state.state_representation import TimePoint
    from nuplan.planning.simulation.simulation_time_controller.simulation_iteration import SimulationIteration

    scenes = generate_scenes(jax.random.PRNGKey(3), 8)
    states = np.asarray(interpolate_poses(scenes, scenes.expert, 0.5), np.float64)  # (8, 41, 3)
    ours = simulate_states(scenes, states, PDMConfig())
    tracker, model = lqr.BatchLQRTracker(), BatchKinematicBicycleModel()
    tracker._discretization_time = 0.1
    proposal = np.zeros(states.shape[:2] + (11,))
    proposal[..., :3] = states
    tracker.update(proposal)
    sim = np.zeros_like(proposal)
    sim[:, 0, 3:5] = np.asarray(scenes.ego.velocity)
    sim[:, 0, 5:7] = np.asarray(scenes.ego.acceleration)
    sim[:, 0, 7] = np.asarray(scenes.ego.steering_angle)
    for i in range(1, 41):
        now, nxt = SimulationIteration(TimePoint(100_000 * (i - 1)), i - 1), SimulationIteration(TimePoint(100_000 * i), i)
        command = tracker.track_trajectory(now, nxt, sim[:, i - 1])
        sim[:, i] = model.propagate_state(sim[:, i - 1], command, TimePoint(100_000))
    np.testing.assert_allclose(np.asarray(ours.x), sim[..., 0], atol=2e-4)
    np.testing.assert_allclose(np.asarray(ours.y), sim[..., 1], atol=2e-4)


def test_load_metric_cache_from_a_real_cache():
    """Set JAX_DRIVE_NAVSIM_METRIC_CACHE to a NAVSIM metric cache folder to run this."""
    pytest.importorskip("navsim", reason="needs NAVSIM (https://github.com/autonomousvision/navsim)")
    cache = os.environ.get("JAX_DRIVE_NAVSIM_METRIC_CACHE")
    if not cache:
        pytest.skip("set JAX_DRIVE_NAVSIM_METRIC_CACHE to a NAVSIM metric cache folder")
    from jax_drive.adapters.navsim import load_metric_cache

    scenes = load_metric_cache(cache, max_scenes=4, progress=False)
    assert len(scenes) >= 1 and scenes.has_reference.all()
    batch = scenes.build()
    result = score_proposals(batch, np.asarray(batch.expert)[:, None], scenes.references)
    assert np.all(np.isfinite(np.asarray(result.pdms)))
