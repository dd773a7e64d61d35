"""Hand-built cases for each PDM rule, checked against the numpy/shapely reference scorer
(jax_drive.pdm_reference), plus unit tests of its interpolation, tracker and comfort checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from jax_drive.pdm_reference import (
    ReferenceConfig,
    ReferenceScorer,
    comfort_checks,
    interpolate_poses,
    scene_to_numpy,
    score_proposal_reference,
    simulate,
)
from jax_drive.pdm_reference.frames import scene_to_global
from jax_drive.pdm_reference.scorer import ego_coords, time_to_collision, _SceneGeometry, ego_areas
from jax_drive.scenes import PolygonSpec, add_agent, add_static, straight_road
from jax_drive.types import AgentType

T8 = np.arange(1, 9) * 0.5
T40 = np.arange(1, 41) * 0.1
CFG = ReferenceConfig()


def cv(speed: float, times: np.ndarray, y: float = 0.0) -> np.ndarray:
    """Straight constant-velocity poses along +x."""
    return np.stack([speed * times, np.full_like(times, y), np.zeros_like(times)], -1)


def const_accel(speed: float, accel: float, times: np.ndarray) -> np.ndarray:
    """Straight poses with constant acceleration, stopping at zero speed."""
    t_stop = speed / -accel if accel < 0 else np.inf
    tc = np.minimum(times, t_stop)
    s = speed * tc + 0.5 * accel * tc**2
    return np.stack([s, np.zeros_like(times), np.zeros_like(times)], -1)


def build(spec) -> object:
    return scene_to_numpy(spec.build())


def score(spec, proposal, reference=None, **kw):
    if reference is None:
        reference = cv(float(spec.ego_velocity[0]), T40)
    return score_proposal_reference(build(spec), proposal, reference, **kw)


# --------------------------------------------------------------------------------------
# Interpolation and tracking
# --------------------------------------------------------------------------------------


def test_interpolation_is_linear_and_heading_aware():
    poses = np.zeros((8, 3))
    poses[:, 0] = T8 * 4.0
    poses[:, 2] = np.linspace(3.0, 3.0 + 0.35 * 7, 8)  # crosses +pi
    out = interpolate_poses(np.zeros(3), poses, 0.5)
    assert out.shape == (41, 3)
    np.testing.assert_allclose(out[:, 0], np.arange(41) * 0.4, atol=1e-12)
    # Between t0 (heading 0) and the first pose (heading 3.0) heading is linear.
    np.testing.assert_allclose(out[1:6, 2], 3.0 * np.arange(1, 6) / 5, atol=1e-12)
    # Across the wrap the heading keeps moving by 0.07 per step and stays in [-pi, pi).
    steps = np.diff(np.unwrap(out[5:, 2]))
    np.testing.assert_allclose(steps, 0.07, atol=1e-9)
    assert np.all(out[:, 2] >= -np.pi) and np.all(out[:, 2] < np.pi)


def test_interpolation_with_origin_matches_ego_frame():
    poses = np.stack([T8 * 5.0, 0.2 * T8**2, 0.05 * T8], -1)
    origin = np.array([4.0e5, 5.0e6, 2.5])
    local = interpolate_poses(np.zeros(3), poses, 0.5)
    glob = interpolate_poses(origin, poses, 0.5)
    c, s = math.cos(origin[2]), math.sin(origin[2])
    back_x = c * (glob[:, 0] - origin[0]) + s * (glob[:, 1] - origin[1])
    back_y = -s * (glob[:, 0] - origin[0]) + c * (glob[:, 1] - origin[1])
    np.testing.assert_allclose(back_x, local[:, 0], atol=1e-8)
    np.testing.assert_allclose(back_y, local[:, 1], atol=1e-8)


def test_tracker_reproduces_straight_constant_velocity():
    target = interpolate_poses(np.zeros(3), cv(8.0, T8), 0.5)
    init = np.zeros(11)
    init[3] = 8.0
    states = simulate(target, init, CFG)
    np.testing.assert_allclose(states[:, :3], target, atol=1e-9)
    np.testing.assert_allclose(states[:, 3], 8.0, atol=1e-9)


def test_tracker_follows_a_curve_and_catches_up_speed():
    # Arc of radius 40 m at 10 m/s, ego starting straight at 8 m/s.
    radius, speed = 40.0, 10.0
    ang = speed * T8 / radius
    poses = np.stack([radius * np.sin(ang), radius * (1 - np.cos(ang)), ang], -1)
    target = interpolate_poses(np.zeros(3), poses, 0.5)
    init = np.zeros(11)
    init[3] = 8.0
    states = simulate(target, init, CFG)
    # Cross-track error stays below 1 m (the ego starts with zero steering on a curve).
    radial = np.hypot(states[:, 0], states[:, 1] - radius)
    assert np.abs(radial - radius).max() < 1.0
    assert abs(states[-1, 2] - target[-1, 2]) < 0.1
    assert abs(states[-1, 3] - speed) < 0.1  # velocity tracked, position lag remains
    # The bicycle model never has lateral velocity or acceleration after t0.
    assert np.all(states[1:, 4] == 0.0) and np.all(states[1:, 6] == 0.0)


def test_stopping_controller_keeps_a_stopped_ego_still():
    target = np.zeros((41, 3))
    states = simulate(target, np.zeros(11), CFG)
    np.testing.assert_allclose(states[:, :4], 0.0, atol=1e-12)


# --------------------------------------------------------------------------------------
# Collisions (NC)
# --------------------------------------------------------------------------------------


def test_clear_road_scores_one():
    r = score(straight_road(ego_speed=10.0), cv(10.0, T8))
    for key in ("nc", "dac", "ddc", "ttc", "ep", "comfort", "pdms"):
        assert r[key] == pytest.approx(1.0), key
    assert r["progress"] == pytest.approx(40.0, abs=1e-6)


def test_front_collision_with_moving_vehicle_is_at_fault():
    spec = straight_road(ego_speed=10.0)
    # Slower vehicle 1.5 m ahead of the front bumper: the ego drives into it.
    add_agent(spec, x=4.049 + 2.25 + 1.5, y=0.0, speed=5.0)
    r = score(spec, cv(10.0, T8))
    assert r["nc"] == 0.0
    assert r["pdms"] == 0.0
    first = int(np.argmax(r["nc_step"]))
    assert 1 <= first <= 5 and r["nc_object"][first] == 0
    assert r["nc_point"][0]


def test_rear_ended_ego_is_not_at_fault():
    spec = straight_road(ego_speed=10.0)
    # Faster follower 0.5 m behind the rear bumper (closing at 2 m/s).
    add_agent(spec, x=-1.127 - 0.5 - 2.25, y=0.0, speed=12.0)
    r = score(spec, cv(10.0, T8))
    assert r["nc"] == 1.0
    assert not r["nc_step"].any()
    # Its first TTC encounter has it behind the ego: ignored, TTC stays 1.
    assert r["ttc"] == 1.0


def test_stopped_ego_is_not_at_fault():
    spec = straight_road(ego_speed=0.0)
    # Oncoming vehicle in the ego lane driving into the stopped ego.
    add_agent(spec, x=12.0, y=0.0, heading=math.pi, speed=6.0)
    r = score(spec, np.zeros((8, 3)), np.zeros((40, 3)))
    assert r["nc"] == 1.0
    assert r["ttc"] == 1.0  # a stopped ego has no TTC check


def test_collision_with_stopped_vehicle_is_at_fault_even_from_the_side():
    spec = straight_road(ego_speed=10.0)
    add_agent(spec, x=20.0, y=2.0, speed=0.0)  # parked, overlapping the ego's left side
    r = score(spec, cv(10.0, T8))
    assert r["nc"] == 0.0


@pytest.mark.parametrize(
    "agent_type, expected",
    [(AgentType.TRAFFIC_CONE, 0.5), (AgentType.BARRIER, 0.5), (AgentType.GENERIC_OBJECT, 0.5)],
)
def test_static_object_collision_scores_half(agent_type, expected):
    spec = straight_road(ego_speed=10.0)
    add_static(spec, x=20.0, y=0.0, agent_type=int(agent_type))
    r = score(spec, cv(10.0, T8))
    assert r["nc"] == expected
    # PDMS keeps the 0.5 multiplier; EP is masked with it too.
    assert r["pdms"] == pytest.approx(0.5 * (5 * r["ttc"] + 5 * r["ep"] + 2 * r["comfort"]) / 12)


def test_vehicle_beats_static_object_minimum():
    spec = straight_road(ego_speed=10.0)
    add_static(spec, x=12.0, y=0.0)
    add_agent(spec, x=30.0, y=0.0, speed=1.0)
    r = score(spec, cv(10.0, T8))
    assert r["nc"] == 0.0


def test_lateral_collision_is_at_fault_only_across_lanes():
    # A vehicle from the left lane slides into the ego's left side at the same speed.
    def scene_with_cut_in(map_shift: float):
        spec = straight_road(ego_speed=10.0)
        for lane in spec.lanes:
            lane.vertices = lane.vertices + [0.0, map_shift]
            lane.centerline = lane.centerline + [0.0, map_shift]
        spec.drivable[0].vertices = spec.drivable[0].vertices + [0.0, map_shift]
        spec.route = spec.route + [0.0, map_shift]
        add_agent(spec, x=1.5, y=3.5, speed=10.0)
        spec.agents[0].y = np.maximum(3.5 - 1.0 * np.arange(51) * 0.1, 1.9)
        return spec

    in_lane = score(scene_with_cut_in(0.0), cv(10.0, T8))
    assert not in_lane["areas"]["multiple_lanes"].any()
    assert in_lane["nc"] == 1.0
    # Same cut-in while the ego straddles two lanes (map shifted by 1.75 m): at fault.
    straddle = score(scene_with_cut_in(-1.75), cv(10.0, T8))
    assert straddle["areas"]["multiple_lanes"].all()
    assert straddle["nc"] == 0.0


def test_object_overlapping_at_t0_is_not_exempt():
    spec = straight_road(ego_speed=10.0)
    add_static(spec, x=3.0, y=0.0)  # inside the ego box at t0
    r = score(spec, cv(10.0, T8))
    assert r["nc"] == 0.5 and r["nc_step"][0]


def test_class_and_speed_come_from_first_appearance():
    spec = straight_road(ego_speed=10.0)
    add_agent(spec, x=4.049 + 2.25 + 1.5, y=0.0, speed=5.0)
    a = spec.agents[0]
    # Invisible for the first 2 frames, then "stopped" per its later velocity fields:
    # classification must use its first visible step (moving) -> active front, at fault.
    a.valid = np.arange(51) >= 2
    a.vx = np.where(np.arange(51) >= 3, 0.0, a.vx)
    r = score(spec, cv(10.0, T8))
    assert r["nc"] == 0.0


# --------------------------------------------------------------------------------------
# Drivable area (DAC)
# --------------------------------------------------------------------------------------


def _notched_road(notch_x0: float, notch_x1: float, notch_y: float):
    spec = straight_road(ego_speed=0.0, num_lanes=3)
    # Roadblock y in [-5.25, 5.25] with a notch cut from the left edge down to notch_y.
    poly = np.array(
        [[-50, -5.25], [150, -5.25], [150, 5.25], [notch_x1, 5.25], [notch_x1, notch_y],
         [notch_x0, notch_y], [notch_x0, 5.25], [-50, 5.25]], float,
    )
    spec.drivable = [PolygonSpec(poly)]
    return spec


def test_one_corner_off_road_fails_dac():
    # The front-left corner at t0 is (4.049, 1.1485): a notch around it puts it off-road.
    spec = _notched_road(3.9, 4.5, 1.0)
    r = score(spec, np.zeros((8, 3)), np.zeros((40, 3)))
    assert r["dac"] == 0.0 and r["pdms"] == 0.0
    assert r["dac_step"].all()


def test_box_edge_off_road_without_a_corner_passes_dac():
    # A notch between the two left corners cuts the box edge but holds no corner.
    spec = _notched_road(0.0, 2.0, 1.0)
    r = score(spec, np.zeros((8, 3)), np.zeros((40, 3)))
    assert r["dac"] == 1.0


def test_driving_off_the_road_fails_dac_and_ddc():
    spec = straight_road(ego_speed=10.0)
    proposal = cv(10.0, T8)
    proposal[:, 1] = np.linspace(1.0, 9.0, 8)  # veers left off the 3-lane road
    proposal[:, 2] = 0.0
    r = score(spec, proposal)
    assert r["dac"] == 0.0
    assert r["ddc"] < 1.0


# --------------------------------------------------------------------------------------
# TTC
# --------------------------------------------------------------------------------------


def _ttc(spec, states):
    scene = build(spec)
    geo = _SceneGeometry(scene, CFG)
    coords = ego_coords(states, CFG)
    return time_to_collision(states, coords, ego_areas(coords, geo), geo, CFG)


def _cv_states(speed: float) -> np.ndarray:
    states = np.zeros((41, 11))
    states[:, 0] = speed * np.arange(41) * 0.1
    states[:, 3] = speed
    return states


def test_ttc_object_ahead_fails():
    spec = straight_road(ego_speed=10.0)
    add_agent(spec, x=4.049 + 2.25 + 1.5, y=0.0, speed=8.0)  # caught within 0.9 s
    out = _ttc(spec, _cv_states(10.0))
    assert out["score"] == 0.0 and out["step"][0] and out["frame"][0] == 9


def test_ttc_object_behind_is_ignored():
    spec = straight_road(ego_speed=10.0)
    add_agent(spec, x=-1.127 - 0.5 - 2.25, y=0.0, speed=12.0)
    out = _ttc(spec, _cv_states(10.0))
    assert out["score"] == 1.0


def test_ttc_fast_follower_counts_as_ahead():
    # A follower that is ahead of the ego's rear axle 0.9 s later counts as "ahead".
    spec = straight_road(ego_speed=10.0)
    add_agent(spec, x=-1.127 - 2.0 - 2.25, y=0.0, speed=14.0)
    out = _ttc(spec, _cv_states(10.0))
    assert out["score"] == 0.0


def test_ttc_braking_before_a_stopped_car():
    spec = straight_road(ego_speed=10.0)
    add_agent(spec, x=4.049 + 23.0 + 2.25, y=0.0, speed=0.0)  # rear 23 m ahead of the bumper
    proposal = const_accel(10.0, -2.4, T8)  # the tracked ego ends ~0.5 m short, still rolling
    r = score(spec, proposal)
    assert r["nc"] == 1.0
    assert r["ttc"] == 0.0
    assert r["states"][-1, 0] < 23.0 and r["states"][-1, 3] > 0.5  # front short of its rear
    # Same scene without the car: TTC passes.
    r2 = score(straight_road(ego_speed=10.0), proposal)
    assert r2["ttc"] == 1.0


def test_ttc_ignores_a_stopped_ego():
    spec = straight_road(ego_speed=0.0)
    add_agent(spec, x=9.0, y=0.0, heading=math.pi, speed=5.0)
    out = _ttc(spec, np.zeros((41, 11)))
    assert out["score"] == 1.0


# --------------------------------------------------------------------------------------
# Ego progress (EP)
# --------------------------------------------------------------------------------------


def test_ep_below_5m_threshold_is_one():
    spec = straight_road(ego_speed=1.0)
    r = score(spec, cv(1.0, T8), cv(1.1, T40))
    assert r["progress"] < r["reference_progress"] <= 5.0
    assert r["ep"] == 1.0


def test_ep_above_5m_threshold_is_the_ratio():
    spec = straight_road(ego_speed=1.0)
    r = score(spec, cv(1.0, T8), cv(1.6, T40))
    assert r["reference_progress"] > 5.0
    assert r["ep"] == pytest.approx(r["progress"] / r["reference_progress"], rel=1e-12)
    assert r["ep"] < 0.9


def test_ep_below_threshold_is_zero_only_when_multiplier_is_zero():
    spec = straight_road(ego_speed=1.0)
    add_agent(spec, x=7.0, y=0.0, speed=0.0)  # parked car: NC 0 -> EP 0
    r = score(spec, cv(1.0, T8), np.zeros((40, 3)))
    assert r["nc"] == 0.0 and r["ep"] == 0.0
    spec = straight_road(ego_speed=1.0)
    add_static(spec, x=6.0, y=0.0)  # cone: NC 0.5, the multiplier is not 0 -> EP 1
    r = score(spec, cv(1.0, T8), np.zeros((40, 3)))
    assert r["nc"] == 0.5 and r["ep"] == 1.0


def test_ep_reference_failing_nc_is_masked():
    # The reference drives into a cone (masked progress 0.5 x raw); the proposal stops.
    spec = straight_road(ego_speed=10.0)
    add_static(spec, x=30.0, y=0.0)
    r = score(spec, const_accel(10.0, -3.0, T8), cv(10.0, T40))
    assert r["reference_nc"] == 0.5
    expected = r["progress"] / max(r["progress"], 0.5 * r["reference_progress"])
    assert r["ep"] == pytest.approx(expected, rel=1e-12)


# --------------------------------------------------------------------------------------
# Comfort
# --------------------------------------------------------------------------------------


def _states_with(ax=None, ay=None, heading=None) -> np.ndarray:
    states = np.zeros((41, 11))
    if ax is not None:
        states[:, 5] = ax
    if ay is not None:
        states[:, 6] = ay
    if heading is not None:
        states[:, 2] = heading
    return states


T41 = np.arange(41) * 0.1


def _ramp(bound: float, factor: float) -> np.ndarray:
    """Acceleration ramp whose filtered jerk peaks at factor * bound.

    NAVSIM smooths acceleration with an even (8-sample) Savitzky-Golay window before
    differentiating, which distorts a ramp's slope; the peak gain of that chain is taken from
    scipy itself (the filter semantics NAVSIM relies on)."""
    from scipy.signal import savgol_filter

    smooth = savgol_filter(T41, 8, 2)
    gain = np.abs(savgol_filter(smooth, 41, 2, deriv=1, delta=0.1)).max()
    return factor * bound / gain * T41


@pytest.mark.parametrize(
    "key, inside, outside",
    [
        ("lon_accel", _states_with(ax=np.full(41, 2.39)), _states_with(ax=np.full(41, 2.41))),
        ("lon_accel", _states_with(ax=np.full(41, -4.04)), _states_with(ax=np.full(41, -4.06))),
        ("lat_accel", _states_with(ay=np.full(41, 4.88)), _states_with(ay=np.full(41, -4.90))),
        ("lon_jerk", _states_with(ax=_ramp(4.13, 0.998)), _states_with(ax=_ramp(4.13, 1.002))),
        ("lon_jerk", _states_with(ax=-_ramp(4.13, 0.998)), _states_with(ax=-_ramp(4.13, 1.002))),
        ("jerk", _states_with(ax=1.0 + _ramp(8.37, 0.998)), _states_with(ax=1.0 + _ramp(8.37, 1.002))),
        ("yaw_rate", _states_with(heading=0.94 * T41), _states_with(heading=-0.96 * T41)),
        ("yaw_accel", _states_with(heading=0.5 * 1.92 * T41**2), _states_with(heading=0.5 * 1.94 * T41**2)),
    ],
)
def test_comfort_bounds_just_inside_and_outside(key, inside, outside):
    assert comfort_checks(inside, CFG)[key]
    assert not comfort_checks(outside, CFG)[key]


def test_comfort_yaw_rate_survives_heading_wrap():
    heading = (3.0 + 0.5 * T41 + np.pi) % (2 * np.pi) - np.pi  # wraps past +pi
    assert comfort_checks(_states_with(heading=heading), CFG)["yaw_rate"]


def test_harsh_braking_proposal_is_uncomfortable():
    r = score(straight_road(ego_speed=10.0), const_accel(10.0, -6.0, T8))
    assert r["comfort"] == 0.0
    assert not r["comfort_checks"]["lon_accel"]


# --------------------------------------------------------------------------------------
# Frames, API
# --------------------------------------------------------------------------------------


def test_utm_offset_and_rotation_do_not_change_scores():
    spec = straight_road(ego_speed=10.0)
    add_agent(spec, x=4.049 + 2.25 + 1.5, y=0.0, speed=8.0)
    add_static(spec, x=25.0, y=-3.5)
    scene = build(spec)
    proposal = cv(10.0, T8)
    proposal[:, 1] = -0.08 * T8**2
    proposal[:, 2] = -0.16 * T8 / 4
    ref = cv(9.0, T40)
    local = score_proposal_reference(scene, proposal, ref)
    origin = np.array([431_234.56, 5_412_345.67, 2.2])
    glob = score_proposal_reference(scene_to_global(scene, origin), proposal, ref, origin=origin)
    for key in ("nc", "dac", "ddc", "ttc", "comfort"):
        assert glob[key] == local[key], key
    for key in ("ep", "pdms", "progress"):
        assert glob[key] == pytest.approx(local[key], abs=1e-6), key


def test_scorer_reuses_scene_and_validates_inputs():
    scorer = ReferenceScorer(build(straight_road(ego_speed=10.0)))
    a = scorer.score(cv(10.0, T8), cv(10.0, T40))
    b = scorer.score(cv(8.0, T8), cv(10.0, T40))
    assert a["ep"] == 1.0 and b["ep"] == pytest.approx(b["progress"] / a["progress"], rel=1e-9)
    with pytest.raises(ValueError, match="proposal"):
        scorer.score(np.zeros((7, 3)), cv(10.0, T40))
    with pytest.raises(ValueError, match="reference"):
        scorer.score(cv(10.0, T8), np.zeros((8, 3)))
    with pytest.raises(ValueError, match="finite"):
        scorer.score(np.full((8, 3), np.nan), cv(10.0, T40))


# --------------------------------------------------------------------------------------
# NAVSIM v2 parts: TLC, lane keeping, TTC up to step 31
# --------------------------------------------------------------------------------------


def _with_connector(red, on_route=True):
    from jax_drive.scenes import LaneSpec
    from jax_drive.scenes.builders import rectangle

    spec = straight_road(ego_speed=10.0)
    xs = np.linspace(20.0, 30.0, 5)
    spec.lanes.append(
        LaneSpec(rectangle(20.0, 30.0, -1.75, 1.75), np.stack([xs, np.zeros(5)], -1),
                 kind=1, on_route=on_route, red_light=red)
    )
    return spec


def test_tlc_red_on_route_connector():
    assert score(_with_connector(True), cv(10.0, T8))["tlc"] == 0.0
    assert score(_with_connector(False), cv(10.0, T8))["tlc"] == 1.0
    assert score(_with_connector(True, on_route=False), cv(10.0, T8))["tlc"] == 1.0
    # Red only after the ego has left the connector (centre past x = 30 + 5.2 m at ~3.2 s).
    late = np.arange(51) >= 36
    assert score(_with_connector(late), cv(10.0, T8))["tlc"] == 1.0
    # Red while the ego is on it.
    early = (np.arange(51) >= 20) & (np.arange(51) < 25)
    assert score(_with_connector(early), cv(10.0, T8))["tlc"] == 0.0


def _shifted_route(offset, intersection=None):
    spec = straight_road(ego_speed=10.0)
    spec.route = spec.route + [0.0, offset]
    if intersection is not None:
        from jax_drive.scenes.builders import rectangle
        from jax_drive.types import PolygonType

        spec.drivable.append(PolygonSpec(rectangle(*intersection), kind=int(PolygonType.INTERSECTION)))
    return spec


def test_lane_keeping_deviation_and_intersection_skip():
    assert score(_shifted_route(0.8), cv(10.0, T8))["lk"] == 0.0
    assert score(_shifted_route(0.4), cv(10.0, T8))["lk"] == 1.0
    # Inside an intersection (x in [5, 40]) the deviation is not counted: 6 steps remain.
    assert score(_shifted_route(0.8, (5.0, 40.0, -5.0, 5.0)), cv(10.0, T8))["lk"] == 1.0
    # Skipped steps do not reset the counter: 12 + 12 outside steps around an intersection
    # (centre x in (13, 30) for steps 12 .. 28) still add up to 20.
    assert score(_shifted_route(0.8, (13.0, 30.0, -5.0, 5.0)), cv(10.0, T8))["lk"] == 0.0


def test_ttc_v2_only_checks_up_to_step_31():
    spec = straight_road(ego_speed=10.0)
    add_agent(spec, x=4.049 + 42.0 + 2.25, y=0.0, speed=0.0)  # first TTC hit at t = 33
    r = score(spec, cv(10.0, T8))
    assert r["nc"] == 1.0 and r["ttc"] == 0.0 and r["ttc_v2"] == 1.0
    assert int(np.argmax(r["ttc_step"])) == 33
