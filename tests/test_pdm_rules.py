"""Hand-built unit tests of each PDM rule (NAVSIM v1.1 semantics).

All scenes share one padded layout (8 objects, 6 lane and 4 drivable polygons) and every
call scores P = 4 proposals, so the scorer compiles once for the whole file.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from jax_drive.pdm import PDMConfig, score_proposals
from jax_drive.pdm.comfort import comfort_checks, comfort_signals
from jax_drive.scenes import stack_scenes
from pdm_scenes import braking_poses, moving_agent, road_scene, straight_poses
from jax_drive.types import AgentType

CFG = PDMConfig()
P = 4


def score(scene, proposals, reference=None, speed=None):
    """Scores exactly 4 proposals (padding with copies of the first)."""
    props = np.asarray(proposals, np.float32)
    if props.ndim == 2:
        props = props[None]
    props = np.concatenate([props, np.repeat(props[:1], P - len(props), 0)], 0)
    if reference is None:
        v = float(scene.ego.velocity[0]) if speed is None else speed
        reference = straight_poses(v, num=40, dt=0.1)
    return score_proposals(scene, props, reference, CFG)


# ------------------------------------------------------------------ NC
def test_rear_ended_is_not_at_fault():
    # A faster car from behind runs into the ego (ego keeps 5 m/s).
    scene = road_scene([moving_agent(-7.0, 0.0, vx=12.0)], speed=5.0)
    r = score(scene, straight_poses(5.0))
    assert float(r.nc[0]) == 1.0
    assert not bool(np.any(r.violations.nc_point[0]))


def test_front_collision_is_at_fault():
    # Ego at 10 m/s drives into a slower car 15 m ahead in its lane.
    scene = road_scene([moving_agent(15.0, 0.0, vx=3.0)], speed=10.0)
    r = score(scene, straight_poses(10.0))
    assert float(r.nc[0]) == 0.0
    assert float(r.pdms[0]) == 0.0
    assert bool(np.any(r.violations.nc_point[0]))
    assert int(np.max(r.violations.nc_object[0])) == 0


def test_stopped_ego_is_not_at_fault():
    # Ego stands still; an oncoming car drives into its front.
    scene = road_scene([moving_agent(15.0, 0.0, heading=np.pi, vx=-6.0)], speed=0.0)
    r = score(scene, np.zeros((8, 3), np.float32), speed=0.0)
    assert float(r.nc[0]) == 1.0


def test_static_object_gives_half():
    cone = moving_agent(20.0, 0.0, length=0.5, width=0.5, agent_type=AgentType.TRAFFIC_CONE)
    r = score(road_scene([cone], speed=10.0), straight_poses(10.0))
    assert float(r.nc[0]) == 0.5
    assert int(np.max(r.violations.nc_class[0])) == int(AgentType.TRAFFIC_CONE)


def test_stopped_vehicle_gives_zero():
    parked = moving_agent(20.0, 0.0)
    r = score(road_scene([parked], speed=10.0), straight_poses(10.0))
    assert float(r.nc[0]) == 0.0


def test_first_appearance_speed_decides_stopped_track():
    # A car from the left lane drifts into the ego's flank on a single lane: active lateral,
    # not at fault. The same motion, but with the car's first observed speed 0, makes it a
    # "stopped track" (class and speed come from the first appearance): at fault.
    moving = moving_agent(1.5, 3.5, vx=8.0, vy=-1.0)
    parked_first = moving_agent(1.5, 3.5, vx=8.0, vy=-1.0)
    parked_first.vx[0], parked_first.vy[0] = 0.0, 0.0
    assert float(score(road_scene([moving], speed=8.0), straight_poses(8.0)).nc[0]) == 1.0
    assert float(score(road_scene([parked_first], speed=8.0), straight_poses(8.0)).nc[0]) == 0.0


def test_not_at_fault_hit_is_ignored_afterwards():
    # Rear-ended and then pushed: the object stays overlapping for many steps, but the
    # first not-at-fault classification puts it on the ignore list.
    scene = road_scene([moving_agent(-6.0, 0.0, vx=6.5)], speed=5.0)
    r = score(scene, straight_poses(5.0))
    assert float(r.nc[0]) == 1.0


def test_lateral_collision_at_fault_only_across_lanes():
    # Single lane: a car from the left lane drifts into the ego's side -> not at fault.
    drifter = moving_agent(1.5, 3.5, vx=8.0, vy=-1.0)
    r_single = score(road_scene([drifter], speed=8.0), straight_poses(8.0))
    assert float(r_single.nc[0]) == 1.0
    # The ego drifts left across the lane line into a car beside it -> at fault.
    beside = moving_agent(1.5, 3.8, vx=8.0)
    r_multi = score(road_scene([beside], speed=8.0), straight_poses(8.0, lateral=2.0))
    assert float(r_multi.nc[0]) == 0.0


# ------------------------------------------------------------------ DAC
def test_one_corner_off_road_fails_dac():
    inside = straight_poses(5.0, lateral=-0.3)
    outside = straight_poses(5.0, lateral=-1.2)
    r = score(road_scene([], speed=5.0), np.stack([inside, outside]))
    assert float(r.dac[0]) == 1.0
    assert float(r.dac[1]) == 0.0
    assert float(r.pdms[1]) == 0.0
    assert bool(np.any(r.violations.dac_point[1])) and not bool(np.any(r.violations.dac_point[0]))
    # The corner leaves late in the horizon, not at the first pose.
    assert not bool(r.violations.dac_point[1, 0])


# ------------------------------------------------------------------ TTC
def test_ttc_object_ahead_fails_even_without_collision():
    # Braking to stand 2 m behind a parked car: no collision, but the 0.9 s projection
    # at speed reaches it.
    parked = moving_agent(25.0 + 2.25, 0.0)
    scene = road_scene([parked], speed=10.0)
    front = 25.0 - 2.0 - 4.049  # stop so that the bumper is 2 m behind the car's rear
    r = score(scene, braking_poses(10.0, front))
    assert float(r.nc[0]) == 1.0
    assert float(r.ttc[0]) == 0.0
    assert bool(np.any(r.violations.ttc_point[0]))


def test_ttc_ahead_vs_behind():
    # Same relative geometry: a closing car ahead fails TTC, one closing from behind doesn't.
    # Ahead: a slower car in front. Behind: a long truck closing from behind; its centre
    # stays behind the ego rear axle when its front first reaches the projected ego box, so
    # it is put on the TTC ignore list (and the later rear-end hit is not at fault).
    ahead = road_scene([moving_agent(12.0, 0.0, vx=6.0)], speed=10.0)
    truck = moving_agent(-8.0, 0.0, vx=14.0, length=12.0, width=2.5)
    behind = road_scene([truck], speed=10.0)
    r_a = score(ahead, straight_poses(10.0))
    r_b = score(behind, straight_poses(10.0))
    assert float(r_a.ttc[0]) == 0.0
    assert float(r_b.ttc[0]) == 1.0
    assert float(r_b.nc[0]) == 1.0


def test_ttc_counts_fast_follower_that_gets_ahead():
    # NAVSIM compares the ego projected from its current state with the object d seconds
    # later: a short fast follower whose centre passes the current rear axle counts as ahead.
    r = score(road_scene([moving_agent(-7.0, 0.0, vx=12.0)], speed=5.0), straight_poses(5.0))
    assert float(r.ttc[0]) == 0.0


def test_ttc_skipped_when_ego_stopped():
    scene = road_scene([moving_agent(4.5, 0.0, heading=np.pi, vx=-3.0)], speed=0.0)
    r = score(scene, np.zeros((8, 3)), speed=0.0)
    assert float(r.ttc[0]) == 1.0


# ------------------------------------------------------------------ EP
def test_ep_5m_threshold():
    scene = road_scene([], speed=0.0)
    tiny = braking_poses(1e-3, 1e-3) * 0  # standing still
    ref_small = np.stack([np.linspace(0.1, 4.0, 40), np.zeros(40), np.zeros(40)], -1)  # ~4 m
    ref_large = np.stack([np.linspace(0.25, 10.0, 40), np.zeros(40), np.zeros(40)], -1)  # ~10 m
    prop = np.stack([np.linspace(0.25, 2.0, 8), np.zeros(8), np.zeros(8)], -1)  # ~2 m
    r_small = score(scene, np.stack([prop, tiny]), ref_small)
    r_large = score(scene, np.stack([prop, tiny]), ref_large)
    # Both below 5 m: EP = 1 for any proposal with NC * DAC > 0.
    assert float(r_small.ep[0]) == 1.0 and float(r_small.ep[1]) == 1.0
    # Reference above 5 m: EP = progress / reference progress.
    assert 0.05 < float(r_large.ep[0]) < 0.5
    assert float(r_large.ep[1]) == pytest.approx(0.0, abs=1e-3)


def test_ep_equals_ratio_of_progress():
    scene = road_scene([], speed=8.0)
    slow, fast = straight_poses(8.0, accel=-1.0), straight_poses(8.0, accel=1.0)
    r = score(scene, np.stack([slow, fast]), straight_poses(8.0, num=40, dt=0.1))
    ref_progress = float(score(scene, straight_poses(8.0)).progress[0])
    assert float(r.ep[0]) == pytest.approx(float(r.progress[0]) / ref_progress, rel=1e-4)
    assert float(r.ep[1]) == pytest.approx(1.0)


# ------------------------------------------------------------------ comfort
def _checks(ax, ay, heading):
    t = ax.shape[-1]
    sig = comfort_signals(jnp.asarray(ax), jnp.asarray(ay), jnp.asarray(heading), 0.1,
                          CFG.accel_window_v1, CFG.jerk_window_v1, CFG)
    return np.asarray(comfort_checks(sig, CFG))


TIME = np.arange(41) * 0.1
ZERO = np.zeros(41)


def _scipy_signal(index, ax, ay, h):
    """Independent oracle: the NAVSIM comfort signal straight from scipy (float64)."""
    from scipy.signal import savgol_filter as sg

    if index == 0:
        return sg(ax, 41, 2)
    if index == 1:
        return sg(ay, 41, 2)
    if index in (2, 3):
        base = np.hypot(ax, ay) if index == 2 else ax
        return sg(sg(base, 8, 2), 41, 2, deriv=1, delta=0.1)
    if index == 4:
        return sg(np.unwrap(h), 5, 3, deriv=2, delta=0.1)
    return sg(np.unwrap(h), 5, 2, deriv=1, delta=0.1)


# (check index, which input carries the signal, base shape, bound on the max / min)
COMFORT_CASES = [
    (0, 0, np.ones(41), 2.40),
    (0, 0, -np.ones(41), -4.05),
    (1, 1, np.ones(41), 4.89),
    (2, 1, TIME, 8.37),
    (3, 0, TIME - 2.0, 4.13),
    (4, 2, 0.5 * TIME**2 + 0.3 * np.sin(3 * TIME), 1.93),
    (5, 2, TIME + 0.2 * np.sin(2 * TIME), 0.95),
]


@pytest.mark.parametrize("index, slot, base, bound", COMFORT_CASES)
def test_comfort_bounds_just_inside_and_outside(index, slot, base, bound):
    def inputs(scale):
        arrs = [np.zeros(41), np.zeros(41), np.zeros(41)]
        arrs[slot] = base * scale
        return arrs

    ref = _scipy_signal(index, *inputs(1.0))
    peak = np.max(ref) if bound > 0 else np.min(ref)
    for factor, expected in ((0.995, True), (1.005, False)):
        arrs = inputs(bound * factor / peak)
        got = _checks(*[a.astype(np.float32) for a in arrs])
        assert bool(got[index]) is expected, (factor, index)
        # Parity of the whole signal with scipy.
        sig = comfort_signals(*[jnp.asarray(a, jnp.float32) for a in arrs], 0.1,
                              CFG.accel_window_v1, CFG.jerk_window_v1, CFG)
        name = ["lon_accel", "lat_accel", "jerk", "lon_jerk", "yaw_accel", "yaw_rate"][index]
        np.testing.assert_allclose(np.asarray(sig[name]), _scipy_signal(index, *arrs), atol=2e-4 * abs(bound))


def test_comfort_heading_wraps_across_pi():
    # A steady slow turn through +pi must not look like a 2 pi jump.
    h = np.pi - 0.2 + 0.1 * TIME
    h = (h + np.pi) % (2 * np.pi) - np.pi
    assert bool(_checks(ZERO.astype(np.float32), ZERO.astype(np.float32), h.astype(np.float32))[5])


def test_hard_braking_is_uncomfortable():
    r = score(road_scene([], speed=10.0), np.stack([straight_poses(10.0), braking_poses(10.0, 5.0)]))
    assert float(r.comfort[0]) == 1.0
    assert float(r.comfort[1]) == 0.0


# ------------------------------------------------------------------ batch properties
def test_scores_do_not_depend_on_other_proposals():
    scene = road_scene([moving_agent(30.0, 0.0, vx=5.0), moving_agent(10.0, 3.5, vx=9.0)], speed=8.0)
    a = straight_poses(8.0, lateral=0.5)
    others1 = [straight_poses(8.0), braking_poses(8.0, 6.0), straight_poses(8.0, lateral=3.5)]
    others2 = [straight_poses(3.0), straight_poses(8.0, accel=2.0), straight_poses(8.0, lateral=-2.0)]
    r1 = score(scene, np.stack([a] + others1))
    r2 = score(scene, np.stack([others2[0], a] + others2[1:]))
    for name in ("nc", "dac", "ddc", "ttc", "ep", "comfort", "pdms", "epdms", "progress"):
        assert float(getattr(r1, name)[0]) == pytest.approx(float(getattr(r2, name)[1]), abs=1e-6), name


def test_result_shapes():
    r = score(road_scene([moving_agent(30.0, 0.0, vx=5.0)], speed=8.0), straight_poses(8.0))
    for name in ("nc", "dac", "ddc", "ttc", "ep", "comfort", "pdms", "tlc", "lk", "hc", "ec",
                 "epdms", "progress", "ttc_v2", "ep_v2", "ddc_v2", "finite"):
        chex.assert_shape(getattr(r, name), (P,))
    v = r.violations
    chex.assert_shape([v.dac_point, v.nc_point, v.nc_object, v.nc_class, v.ttc_point,
                       v.ttc_object, v.ttc_class], (P, 8))
    chex.assert_shape([v.nc_box, v.ttc_box], (P, 8, 7))
    assert v.nc_object.dtype == jnp.int32 and v.nc_point.dtype == jnp.bool_


def test_jit_vmap_over_scenes_and_proposals():
    scenes = [road_scene([moving_agent(15.0, 0.0, vx=3.0)], speed=10.0),
              road_scene([moving_agent(-7.0, 0.0, vx=12.0)], speed=5.0)]
    batch = stack_scenes(scenes)
    props = np.stack([np.stack([straight_poses(10.0)] * P), np.stack([straight_poses(5.0)] * P)])
    refs = np.stack([straight_poses(10.0, num=40, dt=0.1), straight_poses(5.0, num=40, dt=0.1)])
    r = score_proposals(batch, props, refs, CFG)
    chex.assert_shape(r.pdms, (2, P))
    for i, sc in enumerate(scenes):
        single = score_proposals(sc, props[i], refs[i], CFG)
        np.testing.assert_allclose(np.asarray(r.pdms[i]), np.asarray(single.pdms), atol=1e-5)
        np.testing.assert_array_equal(np.asarray(r.nc[i]), np.asarray(single.nc))
    assert float(r.nc[0, 0]) == 0.0 and float(r.nc[1, 0]) == 1.0
