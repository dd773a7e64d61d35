"""Planners (constant velocity, IDM, PDM-Closed) and the evaluation API."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_drive.planners import IDMConfig, PDMClosedConfig, constant_velocity, idm_planner, pdm_closed
from jax_drive.planners.idm import idm_rollout_single, route_pose, target_speed
from jax_drive.scenes import add_agent, stack_scenes, straight_road, straight_road_scene
from jax_drive.types import AgentType


def _stopped_car_scene(x=30.0, speed=10.0, scene_id=0):
    return straight_road_scene([dict(x=x, y=0.12, speed=0.0)], scene_id=scene_id, ego_speed=speed)


@pytest.fixture(scope="module")
def batch8():
    """8 hand-built scenes (fixed batch size shared with the scorer tests: one compilation)."""
    scenes = [
        _stopped_car_scene(30.0, 10.0, 0),
        straight_road_scene([], scene_id=1, ego_speed=8.0, speed_limit=15.0),
        straight_road_scene([dict(x=25.0, y=0.2, speed=6.0)], scene_id=2, ego_speed=10.0),  # slower lead
        _stopped_car_scene(45.0, 12.0, 3),
    ]
    spec = straight_road(num_lanes=3, ego_lane=1, ego_speed=10.0)
    add_agent(spec, x=20.0, y=0.15, speed=0.0, length=0.5, width=0.5, agent_type=AgentType.TRAFFIC_CONE)
    scenes.append(spec.build(scene_id=4))
    scenes += [straight_road_scene([], scene_id=i, ego_speed=float(i)) for i in range(5, 8)]
    return stack_scenes(scenes)


def test_constant_velocity_shape_and_values(batch8):
    out = constant_velocity(batch8)
    chex.assert_shape(out, (8, 8, 3))
    np.testing.assert_allclose(out[0, :, 0], 10.0 * 0.5 * np.arange(1, 9), rtol=1e-6)
    np.testing.assert_allclose(out[..., 1:], 0.0)
    # arbitrary batch dims
    two = jax.tree.map(lambda a: a.reshape((2, 4) + a.shape[1:]), batch8)
    chex.assert_shape(constant_velocity(two), (2, 4, 8, 3))


def test_route_pose_straight_and_curved():
    pts = jnp.stack([jnp.linspace(-10.0, 90.0, 64), jnp.zeros(64)], -1)
    valid = jnp.arange(64) < 50  # padded tail
    s = jnp.array([0.0, 10.0, 55.5])
    rp = jax.jit(route_pose)
    pose = rp(pts, valid, s, jnp.array([0.0, 1.0, -1.0]))
    np.testing.assert_allclose(pose, [[-10.0, 0.0, 0.0], [0.0, 1.0, 0.0], [45.5, -1.0, 0.0]], atol=1e-4)
    # beyond the valid end: straight extrapolation
    end = float((49) * 100.0 / 63 - 10.0)
    np.testing.assert_allclose(rp(pts, valid, jnp.array([200.0]), jnp.zeros(1))[0, 0], end + 200.0 - (end + 10.0), atol=1e-3)
    # a circle of radius 20: poses stay on it, heading tangent
    ang = jnp.linspace(0.0, jnp.pi / 2, 64)
    circ = jnp.stack([20.0 * jnp.sin(ang), 20.0 - 20.0 * jnp.cos(ang)], -1)
    p = rp(circ, jnp.ones(64, bool), jnp.array([10.0, 20.0]), jnp.zeros(2))
    np.testing.assert_allclose(np.linalg.norm(p[:, :2] - jnp.array([0.0, 20.0]), axis=-1), 20.0, atol=2e-3)
    np.testing.assert_allclose(p[:, 2], [0.5, 1.0], atol=2e-2)


def test_target_speed_fallback():
    out = target_speed(jnp.array([10.0, 0.0, jnp.nan, -3.0]), IDMConfig())
    np.testing.assert_allclose(out, [10.0, 15.0, 15.0, 15.0])


_rollout = jax.jit(idm_rollout_single, static_argnames="config")


def test_idm_stops_behind_a_stopped_car_and_follows_the_road():
    scene = _stopped_car_scene(30.0, 10.0)
    both = _rollout(scene, jnp.array([0.0, 3.5]), jnp.array([15.0, 15.0]))  # (2, 40, 3)
    chex.assert_shape(both, (2, 40, 3))
    poses = both[0]
    front = poses[:, 0] + 4.049
    car_rear = 30.0 - 4.5 / 2
    assert float(front.max()) < car_rear - 0.5  # never reaches the car
    assert float(jnp.abs(poses[:, 1]).max()) < 1e-4
    assert bool(jnp.all(jnp.diff(poses[:, 0]) >= -1e-5))  # never reverses
    # a candidate shifted into the next lane leaves the car's corridor and drives past it
    assert float(both[1, -1, 0]) > car_rear + 4.5 and float(both[1, -1, 0]) > float(poses[-1, 0]) + 5.0
    np.testing.assert_allclose(both[1, -1, 1], 3.5, atol=1e-3)  # offset reached after 2 s
    # free road: speeds up towards the target without exceeding it
    free = straight_road_scene([], ego_speed=5.0)
    fp = _rollout(free, jnp.array([0.0, 1.0]), jnp.array([15.0, 15.0]))
    v_end = (fp[0, -1, 0] - fp[0, -2, 0]) / 0.1
    assert 5.5 < float(v_end) <= 15.0
    np.testing.assert_allclose(fp[1, -1, 1], 1.0, atol=1e-3)


def test_idm_planner_batched(batch8):
    out = idm_planner(batch8)
    chex.assert_shape(out, (8, 8, 3))
    assert float(out[0, -1, 0]) + 4.049 < 30.0 - 2.25  # stops behind the stopped car
    assert float(out[1, -1, 0]) > 8.0 * 4.0  # free road: accelerates


@pytest.mark.slow
def test_pdm_closed_picks_a_safe_candidate_and_scores_well(batch8):
    from jax_drive.evaluate import evaluate_planner, evaluate_proposals

    out = pdm_closed(batch8)
    chex.assert_shape(out.poses, (8, 40, 3))
    chex.assert_shape(out.output, (8, 8, 3))
    chex.assert_shape(out.candidates, (8, 15, 40, 3))
    np.testing.assert_allclose(out.output, out.poses[:, 4::5])
    # the chosen candidate is the best-scored one
    np.testing.assert_array_equal(out.best, np.argmax(np.asarray(out.candidate_pdms), -1))
    pdmc = evaluate_planner("pdm_closed", batch8, batch_size=8)
    cv = evaluate_planner("constant_velocity", batch8, batch_size=8)
    assert float(pdmc.nc.min()) == 1.0 and float(pdmc.dac.min()) == 1.0
    assert float(cv.nc[0]) == 0.0  # constant velocity runs into the stopped car
    assert float(cv.nc[4]) == 0.5  # ... and into the cone (static object: 0.5)
    assert pdmc.pdms.mean() > cv.pdms.mean()
    # evaluate_proposals == scoring against the PDM-Closed reference (same shapes: no recompile)
    res = evaluate_proposals(batch8, constant_velocity(batch8)[:, None])
    chex.assert_shape(res.pdms, (8, 1))
    np.testing.assert_allclose(res.pdms[:, 0], cv.pdms, atol=1e-5)
    np.testing.assert_allclose(res.epdms[:, 0], cv.epdms, atol=1e-5)
    # every candidate of the grid is there: speeds 0.2 .. 1.0 of the limit, offsets -1, 0, 1
    lat_end = np.asarray(out.candidates[1, :, -1, 1]).reshape(5, 3)
    np.testing.assert_allclose(lat_end, np.tile([-1.0, 0.0, 1.0], (5, 1)), atol=1e-3)
    assert PDMClosedConfig().speed_fractions == (0.2, 0.4, 0.6, 0.8, 1.0)
