"""Scorer internals against independent float64 numpy re-derivations, and API behaviour."""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from jax_drive.pdm import PDMConfig, interpolate_poses, score_candidates, score_proposals, simulate_states
from pdm_scenes import moving_agent, road_scene, straight_poses

CFG = PDMConfig()


# ------------------------------------------------------------ numpy oracle of the tracker
def _wrap(a):
    return (a + np.pi) % (2 * np.pi) - np.pi


def np_track(states: np.ndarray, v0: float, a0: float, steer0: float, cfg: PDMConfig = CFG) -> np.ndarray:
    """Float64 loop version of NAVSIM's LQR + bicycle simulation for ONE trajectory.

    states: (41, 3). Returns (41, 4) [x, y, heading, v]. Written from the published
    equations: least-squares profile fits with pseudo-inverses, per-step LQR, Euler model.
    """
    dt, n_h, wb = cfg.dt, cfg.tracking_horizon, cfg.ego_wheel_base
    disp = np.diff(states, axis=0)
    m = len(disp)
    # Velocity / acceleration fit: full (2M x M) design matrix with headings.
    a_mat = np.zeros((2 * m, m))
    for i in range(m):
        c, s = np.cos(states[i, 2]), np.sin(states[i, 2])
        for j in range(m):
            coef = dt if j == 0 else (dt * dt if j <= i else 0.0)
            a_mat[2 * i, j] = c * coef
            a_mat[2 * i + 1, j] = s * coef
    # Jerk regulariser on [v0, a_0 ..]: NAVSIM's as built (-a_i, the last row a difference)
    # or nuPlan's true difference a_{i+1} - a_i.
    r = np.zeros((m - 2, m))
    for i in range(m - 2):
        r[i, i + 1] = -1.0
        if cfg.jerk_matrix == "nuplan" or i == m - 3:
            r[i, i + 2] = 1.0
    y = disp[:, :2].reshape(-1)
    sol = np.linalg.pinv(a_mat.T @ a_mat + cfg.jerk_penalty * r.T @ r) @ a_mat.T @ y
    vel = sol[0] + np.concatenate([[0.0], np.cumsum(sol[1:] * dt)])
    # Curvature fit.
    b_mat = np.zeros((m, m))
    for i in range(m):
        b_mat[i, 0] = vel[i] * dt
        for j in range(1, i + 1):
            b_mat[i, j] = vel[i] * dt * dt
    q = np.eye(m) * cfg.curvature_rate_penalty
    q[0, 0] = cfg.initial_curvature_penalty
    ksol = np.linalg.pinv(b_mat.T @ b_mat + q) @ b_mat.T @ _wrap(disp[:, 2])
    curv = ksol[0] + np.concatenate([[0.0], np.cumsum(ksol[1:] * dt)])

    x = y_ = h = 0.0
    v, acc, steer = v0, a0, steer0
    out = [[x, y_, h, v]]
    for t in range(40):
        ref_idx = min(t + n_h, m - 1)
        v_ref = vel[ref_idx]
        kappa = np.array([curv[min(t + k, m - 1)] for k in range(n_h)])
        if v_ref <= cfg.stopping_velocity and v <= cfg.stopping_velocity:
            a_cmd, sr_cmd = -cfg.stopping_gain * (v - v_ref), 0.0
        else:
            bl = n_h * dt
            a_cmd = -bl * cfg.q_longitudinal / (bl * cfg.q_longitudinal * bl + cfg.r_longitudinal) * (v - v_ref)
            ref = states[t]
            ex, ey = x - ref[0], y_ - ref[1]
            z = np.array([-ex * np.sin(ref[2]) + ey * np.cos(ref[2]), _wrap(h - ref[2]), steer])
            bvec = np.zeros(3)
            for k in range(n_h):
                vk = v + a_cmd * dt * k
                phi = np.eye(3)
                phi[0, 1] = vk * dt
                phi[1, 2] = vk * dt / wb
                z = phi @ z + np.array([0.0, -vk * kappa[k] * dt, 0.0])
                bvec = phi @ bvec + np.array([0.0, 0.0, dt])
            z[1:] = np.arctan2(np.sin(z[1:]), np.cos(z[1:]))
            qm = np.diag(cfg.q_lateral)
            sr_cmd = -(bvec @ qm @ z) / (bvec @ qm @ bvec + cfg.r_lateral)
        acc_new = dt / (dt + cfg.accel_time_constant) * (a_cmd - acc) + acc
        ideal = steer + dt * sr_cmd
        steer_f = dt / (dt + cfg.steering_time_constant) * (ideal - steer) + steer
        rate = (steer_f - steer) / dt
        x, y_, h = x + v * np.cos(h) * dt, y_ + v * np.sin(h) * dt, _wrap(h + v * np.tan(steer) / wb * dt)
        v = v + acc_new * dt
        steer = np.clip(steer + rate * dt, -cfg.max_steering_angle, cfg.max_steering_angle)
        acc = acc_new
        out.append([x, y_, h, v])
    return np.asarray(out)


def _curve(speed, radius):
    t = np.arange(1, 9) * 0.5
    ang = speed * t / radius
    return np.stack([radius * np.sin(ang), radius * (1 - np.cos(ang)), ang], -1).astype(np.float32)


TRACK_CASES = [
    ("straight", 10.0, 0.0, lambda: straight_poses(10.0)),
    ("accelerate", 5.0, 0.5, lambda: straight_poses(5.0, accel=2.0)),
    ("lane_change", 8.0, 0.0, lambda: straight_poses(8.0, lateral=3.5)),
    ("curve", 7.0, 0.0, lambda: _curve(7.0, 25.0)),
    ("stop", 3.0, -1.0, lambda: np.stack([np.minimum(np.arange(1, 9) * 0.5, 1.0) * 1.5,
                                           np.zeros(8), np.zeros(8)], -1).astype(np.float32)),
    ("standstill", 0.0, 0.0, lambda: np.zeros((8, 3), np.float32)),
    ("mismatch", 12.0, 0.0, lambda: straight_poses(4.0)),
]


@pytest.mark.parametrize("name, speed, accel, make", TRACK_CASES, ids=[c[0] for c in TRACK_CASES])
def test_tracker_matches_float64_oracle(name, speed, accel, make):
    scene = road_scene([], speed=speed, ego_accel=accel)
    poses = make()
    states = interpolate_poses(scene, jnp.asarray(poses), 0.5)
    traj = simulate_states(scene, states, CFG)
    ref = np_track(np.asarray(states, np.float64), speed, accel, 0.0)
    np.testing.assert_allclose(np.asarray(traj.x), ref[:, 0], atol=2e-2)
    np.testing.assert_allclose(np.asarray(traj.y), ref[:, 1], atol=2e-2)
    np.testing.assert_allclose(np.asarray(traj.heading), ref[:, 2], atol=2e-3)
    np.testing.assert_allclose(np.asarray(traj.vx), ref[:, 3], atol=2e-2)
    # Kinematic bicycle: lateral velocity / acceleration are 0 after t0.
    assert np.all(np.asarray(traj.vy[1:]) == 0) and np.all(np.asarray(traj.ay[1:]) == 0)


def test_tracker_follows_a_plain_straight_plan():
    scene = road_scene([], speed=10.0)
    traj = simulate_states(scene, interpolate_poses(scene, jnp.asarray(straight_poses(10.0)), 0.5))
    np.testing.assert_allclose(np.asarray(traj.x), np.arange(41) * 1.0, atol=0.05)
    np.testing.assert_allclose(np.asarray(traj.vx), 10.0, atol=0.05)


def test_simulate_false_returns_interpolated_states():
    scene = road_scene([], speed=10.0)
    states = interpolate_poses(scene, jnp.asarray(straight_poses(10.0, accel=1.0)), 0.5)
    traj = simulate_states(scene, states, PDMConfig(simulate=False))
    np.testing.assert_allclose(np.asarray(traj.poses), np.asarray(states), atol=1e-6)
    assert float(traj.vx[0]) == 10.0
    # Linear interpolation between 0.5 s knots: constant speed on each segment, equal to the
    # segment's mean speed 10 + (k + 0.5) * 0.5 for x = 10 t + t^2 / 2.
    seg = (np.arange(1, 41) - 1) // 5
    np.testing.assert_allclose(np.asarray(traj.vx[1:]), 10.0 + (seg + 0.5) * 0.5, atol=0.02)


# ------------------------------------------------------------ interpolation
def test_interpolation_hits_knots_and_midpoints():
    poses = np.stack([np.arange(1, 9) * 2.0, np.arange(1, 9) * 0.5, np.linspace(0.1, 0.8, 8)], -1)
    out = np.asarray(interpolate_poses(None, jnp.asarray(poses, jnp.float32), 0.5))
    chex.assert_shape(out, (41, 3))
    np.testing.assert_allclose(out[0], 0.0)
    np.testing.assert_allclose(out[5::5], poses, atol=1e-5)
    np.testing.assert_allclose(out[1, :2], poses[0, :2] / 5, atol=1e-5)


def test_interpolation_heading_is_angle_aware():
    poses = np.zeros((8, 3), np.float32)
    poses[:, 0] = np.arange(1, 9)
    poses[:, 2] = [3.0, -3.0, 3.0, -3.0, 3.0, -3.0, 3.0, -3.0]  # alternating across +-pi
    out = np.asarray(interpolate_poses(None, jnp.asarray(poses), 0.5))
    mid = out[7, 2]  # between 3.0 and -3.0 (i.e. 3.28): the short way round, near pi
    assert abs(abs(mid) - np.pi) < 0.2


def test_interpolation_clips_past_last_pose():
    poses = np.stack([np.arange(1, 5) * 1.0, np.zeros(4), np.zeros(4)], -1).astype(np.float32)
    out = np.asarray(interpolate_poses(None, jnp.asarray(poses), 0.5))  # covers only 2 s
    np.testing.assert_allclose(out[20:, 0], 4.0, atol=1e-6)


# ------------------------------------------------------------ candidates / violations
def test_score_candidates_normalises_against_best():
    scene = road_scene([], speed=8.0)
    cands = np.stack([straight_poses(8.0, num=40, dt=0.1), straight_poses(8.0, num=40, dt=0.1, accel=1.0),
                      straight_poses(8.0, num=40, dt=0.1, accel=-1.0),
                      straight_poses(8.0, num=40, dt=0.1, lateral=-3.0)])
    r = score_candidates(scene, cands, CFG)
    prog = np.asarray(r.progress)
    ok = np.asarray(r.nc * r.dac) > 0
    best = np.max(prog * ok)
    np.testing.assert_allclose(np.asarray(r.ep)[ok], prog[ok] / best, rtol=1e-5)
    assert float(r.ep[1]) == pytest.approx(1.0)
    assert float(r.dac[3]) == 0.0 and float(r.ep[3]) == 0.0


def test_violation_details_point_at_the_collision():
    scene = road_scene([moving_agent(15.0, 0.0, vx=3.0, length=4.0, width=1.8)], speed=10.0)
    props = np.stack([straight_poses(10.0)] * 4)
    r = score_proposals(scene, props, straight_poses(10.0, num=40, dt=0.1), CFG)
    v = r.violations
    # Front bumper meets the rear of the car when 10 t + 4.049 = 13 + 3 t -> t = 1.28 s (step 13)
    # -> output pose k = 2 (steps 11..15).
    first = int(np.argmax(np.asarray(v.nc_point[0])))
    assert first == 2
    assert int(v.nc_object[0, first]) == 0 and int(v.nc_class[0, first]) == 0
    box = np.asarray(v.nc_box[0, first])
    assert box[3] == pytest.approx(4.0) and box[4] == pytest.approx(1.8)
    assert box[0] == pytest.approx(15.0 + 3.0 * 1.3, abs=0.4)
    # TTC fires earlier than the collision.
    assert int(np.argmax(np.asarray(v.ttc_point[0]))) <= first


def test_tlc_red_light_and_v2_metrics():
    red = road_scene([], speed=10.0, red_light_frames=(0, 50))
    green = road_scene([], speed=10.0, red_light_frames=None)
    props = np.stack([straight_poses(10.0), braking_poses_np(10.0, 20.0), straight_poses(10.0),
                      straight_poses(10.0)])
    ref = straight_poses(10.0, num=40, dt=0.1)
    r_red = score_proposals(red, props, ref, CFG)
    r_green = score_proposals(green, props, ref, CFG)
    assert float(r_red.tlc[0]) == 0.0 and float(r_red.epdms[0]) == 0.0
    assert float(r_red.tlc[1]) == 1.0  # stops before the connector at x = 30
    assert float(r_green.tlc[0]) == 1.0
    assert float(r_green.epdms[0]) == pytest.approx(1.0, abs=1e-5)
    # TLC does not enter PDMS (v1.1).
    assert float(r_red.pdms[0]) == pytest.approx(float(r_green.pdms[0]))


def test_lane_keeping_and_ddc():
    scene = road_scene([], speed=8.0)
    props = np.stack([straight_poses(8.0), straight_poses(8.0, lateral=3.5),
                      straight_poses(8.0, lateral=0.4), straight_poses(8.0, lateral=1.0)])
    r = score_proposals(scene, props, straight_poses(8.0, num=40, dt=0.1), CFG)
    lk = np.asarray(r.lk)
    assert lk[0] == 1.0 and lk[1] == 0.0 and lk[2] == 1.0
    ddc = np.asarray(r.ddc)
    assert ddc[0] == 1.0 and ddc[1] < 1.0  # the left lane is not on the route


def braking_poses_np(v0, stop_at):
    a = v0**2 / (2 * stop_at)
    t = np.minimum(np.arange(1, 9) * 0.5, v0 / a)
    return np.stack([v0 * t - 0.5 * a * t**2, np.zeros(8), np.zeros(8)], -1).astype(np.float32)


# ------------------------------------------------------------ geometry primitives vs shapely
def test_ego_frame_overlap_matches_shapely():
    from shapely.geometry import Polygon

    from jax_drive.pdm.metrics import ego_frame_overlap

    rng = np.random.default_rng(1)
    n = 400
    lon, lat = rng.uniform(-8, 10, n), rng.uniform(-5, 5, n)
    rel = rng.uniform(-np.pi, np.pi, n)
    hl, hw = rng.uniform(0.3, 4.0, n), rng.uniform(0.3, 1.5, n)
    got = np.asarray(ego_frame_overlap(jnp.asarray(lon), jnp.asarray(lat), jnp.asarray(np.cos(rel)),
                                       jnp.asarray(np.sin(rel)), CFG.ego_rear_axle_to_center,
                                       CFG.ego_length / 2, CFG.ego_width / 2, jnp.asarray(hl), jnp.asarray(hw)))

    def box(cx, cy, h, l2, w2):
        c, s = np.cos(h), np.sin(h)
        pts = [(cx + c * a - s * b, cy + s * a + c * b) for a, b in ((l2, w2), (-l2, w2), (-l2, -w2), (l2, -w2))]
        return Polygon(pts)

    ego = box(CFG.ego_rear_axle_to_center, 0.0, 0.0, CFG.ego_length / 2, CFG.ego_width / 2)
    want = np.array([ego.intersects(box(lon[i], lat[i], rel[i], hl[i], hw[i])) for i in range(n)])
    assert 20 < want.sum() < n - 20  # both outcomes are exercised
    np.testing.assert_array_equal(got, want)


def test_scores_stay_in_range_on_random_proposals():
    rng = np.random.default_rng(3)
    scene = road_scene([moving_agent(25.0, 0.0, vx=5.0), moving_agent(5.0, 3.5, vx=9.0),
                            moving_agent(40.0, -0.5, length=0.6, width=0.6, agent_type=3)], speed=8.0)
    ref = straight_poses(8.0, num=40, dt=0.1)
    for _ in range(3):
        props = straight_poses(8.0)[None] + rng.normal(size=(4, 8, 3)).astype(np.float32) * [2.0, 1.0, 0.1]
        r = score_proposals(scene, props.astype(np.float32), ref, CFG)
        for name in ("nc", "dac", "ddc", "ttc", "ep", "comfort", "pdms", "tlc", "lk", "hc", "epdms", "ep_v2"):
            v = np.asarray(getattr(r, name))
            assert np.all((v >= 0.0) & (v <= 1.0 + 1e-6)), name
        assert np.all(np.asarray(r.nc) >= 0) and set(np.unique(np.asarray(r.nc))) <= {0.0, 0.5, 1.0}
        pdms = np.asarray(r.nc * r.dac * (5 * r.ttc + 5 * r.ep + 2 * r.comfort) / 12)
        np.testing.assert_allclose(np.asarray(r.pdms), pdms, atol=1e-6)


# Proposals score as 1 + P trajectories (the reference first), candidates as P: 5 rows in
# chunks of at most 2 or 3 are padded by one row (3 x 2, 2 x 3); 4 candidates split evenly.
@pytest.mark.parametrize("chunk_size", [2, 3])
def test_chunked_scoring_matches_unchunked(chunk_size):
    import dataclasses

    scene = road_scene([moving_agent(15.0, 0.0, vx=3.0), moving_agent(-7.0, 0.0, vx=12.0)], speed=10.0)
    props = np.stack([straight_poses(10.0), braking_poses_np(10.0, 8.0), straight_poses(10.0, lateral=3.0),
                      straight_poses(10.0, lateral=-1.5)])
    ref = straight_poses(10.0, num=40, dt=0.1)
    unchunked, chunked = (dataclasses.replace(CFG, chunk_size=c) for c in (0, chunk_size))
    cands = np.stack([straight_poses(10.0, num=40, dt=0.1, lateral=y) for y in (0.0, 1.0, -1.0, 3.0)])
    for full, part in ((score_proposals(scene, props, ref, unchunked), score_proposals(scene, props, ref, chunked)),
                       (score_candidates(scene, cands, unchunked), score_candidates(scene, cands, chunked))):
        for name in ("nc", "dac", "ttc", "ep", "comfort", "pdms", "epdms", "progress"):
            np.testing.assert_allclose(np.asarray(getattr(part, name)), np.asarray(getattr(full, name)),
                                       atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(np.asarray(part.violations.nc_point), np.asarray(full.violations.nc_point))


# ------------------------------------------------------------ NAVSIM's jerk matrix
NAVSIM_BAND_4 = np.array([[-1, 0, 0, 0, 0],
                          [0, -1, 0, 0, 0],
                          [0, 0, -1, 0, 0],
                          [0, 0, 0, -1, 1]], np.float64)
NUPLAN_BAND_4 = np.array([[-1, 1, 0, 0, 0],
                          [0, -1, 1, 0, 0],
                          [0, 0, -1, 1, 0],
                          [0, 0, 0, -1, 1]], np.float64)


def test_jerk_matrix_is_pinned_to_navsims_and_shared_with_the_reference():
    """NAVSIM (batch_lqr_utils.py, v1.0 .. v2.2) assigns +I above the diagonal and then -I
    on it, so only its last row is a difference; nuPlan's is the true difference. Both
    scorers build these matrices on their own and default to NAVSIM's."""
    from jax_drive.pdm.tracker import jerk_difference_matrix
    from jax_drive.pdm_reference.config import ReferenceConfig, as_reference_config
    from jax_drive.pdm_reference.simulation import jerk_regularizer

    np.testing.assert_array_equal(jerk_difference_matrix(4, "navsim"), NAVSIM_BAND_4)
    np.testing.assert_array_equal(jerk_difference_matrix(4, "nuplan"), NUPLAN_BAND_4)
    # The reference's regulariser acts on [v0, a_0 ..]: a zero column, then the band.
    for kind, band in (("navsim", NAVSIM_BAND_4), ("nuplan", NUPLAN_BAND_4)):
        np.testing.assert_array_equal(jerk_regularizer(6, kind), np.concatenate([np.zeros((4, 1)), band], 1))
    assert PDMConfig().jerk_matrix == "navsim" and ReferenceConfig().jerk_matrix == "navsim"
    assert as_reference_config(PDMConfig(jerk_matrix="nuplan")).jerk_matrix == "nuplan"
    with pytest.raises(ValueError, match="jerk_matrix"):
        PDMConfig(jerk_matrix="difference")


def test_jerk_matrix_decides_nc_behind_a_parked_car():
    """Hard braking from 14 m/s towards a parked car: NAVSIM's matrix penalises the
    accelerations themselves, so the tracked ego brakes a little less and stops ~7.5 cm
    further. The car's rear sits between the two stopping points (about 3.7 cm from each),
    so NC (and with it PDMS and EPDMS) differs, in the JAX scorer and in the reference."""
    from jax_drive.pdm_reference import ReferenceScorer, scene_to_numpy
    from jax_drive.pdm_reference.config import ReferenceConfig

    v0, decel = 14.0, 10.0
    t = np.minimum(np.arange(1, 9) * 0.5, v0 / decel)
    brake = np.stack([v0 * t - 0.5 * decel * t**2, np.zeros(8), np.zeros(8)], -1).astype(np.float32)
    scene = road_scene([moving_agent(20.34 + 2.25, 0.0)], speed=v0)  # parked, rear edge at x = 20.34
    reference = np.asarray(interpolate_poses(scene, jnp.asarray(brake), 0.5))[1:]
    for kind, nc in (("navsim", 0.0), ("nuplan", 1.0)):
        r = score_proposals(scene, brake[None], reference, PDMConfig(jerk_matrix=kind))
        assert float(r.nc[0]) == nc, kind
        assert (float(r.epdms[0]) == 0.0) == (nc == 0.0), kind  # v2 uses the same tracker
        ref = ReferenceScorer(scene_to_numpy(scene), ReferenceConfig(jerk_matrix=kind)).score(brake, reference)
        assert ref["nc"] == nc, kind
