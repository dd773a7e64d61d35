"""Scene builders, the procedural generator and frame conversion."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_drive.geometry import ego_corners, points_in_polygons
from jax_drive.scenes import (SceneSizes, add_agent, add_static, index_scene, make_scene, scene_to_numpy,
                               stack_scenes, straight_road, straight_road_scene)
from jax_drive.scenes import paths as P
from jax_drive.scenes.builders import history_from_motion, pad_polygon, signed_area
from jax_drive.scenes.frames import poses_to_global, poses_to_local, scene_to_global, to_ego_frame
from jax_drive.scenes.generator import GeneratorConfig, HardKind, generate_scenes, scene_labels
from jax_drive.types import AgentType, Command, PolygonType

N_GEN = 24  # scenes in the shared generated batch (one compilation)


@pytest.fixture(scope="module")
def generated():
    return generate_scenes(jax.random.key(7), N_GEN)


# --------------------------------------------------------------------------- builders


def test_straight_road_scene_shapes_and_masks():
    spec = straight_road(num_lanes=3, ego_lane=1, ego_speed=10.0)
    add_agent(spec, x=25.0, y=0.1, speed=0.0)
    add_static(spec, x=30.0, y=5.6, agent_type=AgentType.TRAFFIC_CONE)
    scene = spec.build(scene_id=3)
    s = SceneSizes()
    chex.assert_shape(scene.agents.x, (s.num_agents, 51))
    chex.assert_shape(scene.map.drivable.vertices, (s.num_drivable, s.drivable_vertices, 2))
    chex.assert_shape(scene.map.lanes.vertices, (s.num_lanes, s.lane_vertices, 2))
    chex.assert_shape(scene.map.lane_centerlines, (s.num_lanes, s.centerline_points, 2))
    chex.assert_shape(scene.route.points, (s.route_points, 2))
    assert scene.agents.valid[:2].all() and not scene.agents.valid[2:].any()
    assert int(scene.agents.agent_type[1]) == AgentType.TRAFFIC_CONE
    assert int(scene.map.drivable.valid.sum()) == 1 and int(scene.map.lanes.valid.sum()) == 3
    assert scene.map.lanes.on_route.tolist()[:3] == [False, True, False]
    assert int(scene.scene_id) == 3 and int(scene.command) == Command.GO_STRAIGHT
    # stopped car stays put, constant-velocity expert along +x
    np.testing.assert_allclose(scene.agents.x[0], 25.0)
    np.testing.assert_allclose(scene.expert[:, 0], 10.0 * 0.5 * np.arange(1, 9), rtol=1e-6)
    # padding vertices repeat the first vertex
    v = np.asarray(scene.map.drivable.vertices[0])
    np.testing.assert_allclose(v[4:], np.repeat(v[:1], len(v) - 4, axis=0))
    # ego and its route: the origin is inside the drivable polygon and the ego lane
    inside = points_in_polygons(jnp.zeros((1, 2)), scene.map.lanes.vertices, scene.map.lanes.valid)
    assert inside[0].tolist()[:3] == [False, True, False]


def test_pad_polygon_orientation_and_errors():
    cw = np.array([[0, 0], [0, 1], [1, 1], [1, 0]], float)
    assert signed_area(cw) < 0
    padded = pad_polygon(cw, 6)
    assert signed_area(padded[:4]) > 0
    np.testing.assert_allclose(padded[4:], padded[:1].repeat(2, 0))
    with pytest.raises(ValueError, match="exceed"):
        pad_polygon(np.random.rand(10, 2), 6)
    with pytest.raises(ValueError, match="degenerate"):
        pad_polygon([[0, 0], [1, 1], [2, 2]], 6)


def test_make_scene_errors_are_clear():
    spec = straight_road()
    with pytest.raises(ValueError, match="ego_lane"):
        straight_road(num_lanes=2, ego_lane=2)
    for _ in range(33):
        add_agent(spec, x=50.0, y=0.3)
    with pytest.raises(ValueError, match="agents"):
        spec.build()
    with pytest.raises(ValueError, match="route"):
        make_scene(route=[[0.0, 0.0]])
    with pytest.raises(ValueError, match="NaN"):
        make_scene(route=[[0.0, 0.0], [1.0, np.nan]])
    with pytest.raises(ValueError, match="expert"):
        make_scene(route=[[0.0, 0.0], [1.0, 0.0]], expert=np.zeros((7, 3)))
    with pytest.raises(ValueError, match="command"):
        make_scene(route=[[0.0, 0.0], [1.0, 0.0]], command=9)


def test_history_consistent_with_speed_and_accel():
    hp, hv, ha = history_from_motion(10.0, -1.0)
    # backwards: x(t) = v t + a t^2 / 2 for t in -1.5 .. 0
    t = np.arange(-15, 1) * 0.1
    np.testing.assert_allclose(hp[:, 0], 10.0 * t - 0.5 * t**2, atol=2e-3)
    np.testing.assert_allclose(hv[:, 0], 10.0 - t, atol=1e-4)
    np.testing.assert_allclose(ha[:, 0], -1.0)
    # turning: positions follow the heading (finite differences)
    hp, _, _ = history_from_motion(8.0, 0.0, 0.2)
    d = np.diff(hp[:, :2], axis=0)
    heading_mid = 0.5 * (hp[1:, 2] + hp[:-1, 2])
    np.testing.assert_allclose(np.arctan2(d[:, 1], d[:, 0]), heading_mid, atol=1e-3)


def test_stack_index_and_numpy():
    a = straight_road_scene([dict(x=20.0, y=0.2)], scene_id=0)
    b = straight_road_scene([], scene_id=1, ego_speed=5.0)
    batch = stack_scenes([a, b])
    assert batch.agents.x.shape == (2, 32, 51) and batch.scene_id.tolist() == [0, 1]
    host = scene_to_numpy(batch)
    assert isinstance(host.agents.x, np.ndarray)
    np.testing.assert_array_equal(index_scene(host, 1).ego.velocity, b.ego.velocity)
    with pytest.raises(ValueError):
        stack_scenes([])


# --------------------------------------------------------------------------- paths


def test_path_pose_matches_circle_and_sampling_is_monotone():
    p = P.path(0.0, 0.0, 0.0, 10.0, 20.0, jnp.pi / 2, 5.0)
    s = jnp.array([0.0, 10.0, 10.0 + 20.0 * jnp.pi / 4, 10.0 + 10.0 * jnp.pi, 10.0 + 10.0 * jnp.pi + 5.0])
    pose = np.asarray(P.path_pose(p, s))
    centre = np.array([10.0, 20.0])
    np.testing.assert_allclose(np.linalg.norm(pose[1:4, :2] - centre, axis=1), 20.0, atol=1e-4)
    np.testing.assert_allclose(pose[-1], [30.0, 25.0, np.pi / 2], atol=1e-4)
    # offset to the left shrinks a left turn's radius
    inner = np.asarray(P.path_pose(p, s[2:3], 2.0))
    np.testing.assert_allclose(np.linalg.norm(inner[0, :2] - centre), 18.0, atol=1e-4)
    ss = np.asarray(P.sample_s(p, jnp.float32(0.0), P.path_length(p), 16))
    assert np.all(np.diff(ss) > 0) and ss[0] == 0.0
    np.testing.assert_allclose(ss[-1], float(P.path_length(p)), rtol=1e-5)


# --------------------------------------------------------------------------- generator


def test_generator_shapes_validity_and_finiteness(generated):
    sc = generated
    s = SceneSizes()
    chex.assert_shape(sc.agents.x, (N_GEN, s.num_agents, 51))
    chex.assert_shape(sc.expert, (N_GEN, 8, 3))
    chex.assert_shape(sc.ego.history_poses, (N_GEN, 16, 3))
    chex.assert_shape(sc.map.red_light, (N_GEN, s.num_lanes, 51))
    assert sc.scene_id.tolist() == list(range(N_GEN))
    for leaf in jax.tree.leaves(sc):
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            assert bool(jnp.all(jnp.isfinite(leaf)))
    assert bool(sc.route.valid.all())
    assert bool(jnp.all(sc.map.drivable.valid.sum(-1) >= 1))
    assert bool(jnp.all(jnp.any(sc.map.lanes.valid & sc.map.lanes.on_route, -1)))
    # objects exist for the whole horizon or not at all; padding slots are invalid
    v = np.asarray(sc.agents.valid)
    assert np.all(v.all(-1) | ~v.any(-1))
    assert not v[:, 14:].any()
    # headings are wrapped, the ego history ends at the origin
    assert float(jnp.max(jnp.abs(sc.agents.heading))) <= np.pi + 1e-5
    np.testing.assert_allclose(sc.ego.history_poses[:, -1], 0.0, atol=1e-5)
    assert set(np.asarray(sc.command).tolist()) <= {0, 1, 2}
    assert set(np.asarray(sc.map.drivable.kind).ravel().tolist()) <= {PolygonType.ROADBLOCK, PolygonType.INTERSECTION}


def test_generator_deterministic_and_independent_of_count(generated):
    again = generate_scenes(jax.random.key(7), N_GEN)
    for a, b in zip(jax.tree.leaves(generated), jax.tree.leaves(again)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other = generate_scenes(jax.random.key(8), N_GEN)
    assert not np.allclose(np.asarray(other.agents.x), np.asarray(generated.agents.x))
    # scene i only depends on (key, i): a shifted window reproduces the same scenes
    window = generate_scenes(jax.random.key(7), N_GEN, start_id=3)
    np.testing.assert_array_equal(np.asarray(window.expert[:-3]), np.asarray(generated.expert[3:]))
    assert window.scene_id.tolist() == list(range(3, N_GEN + 3))


def test_generator_covers_all_layouts_and_hard_kinds():
    kind, hard = scene_labels(jax.random.key(1), 400)
    kind, hard = np.asarray(kind), np.asarray(hard)
    assert set(kind.tolist()) == {0, 1, 2, 3}
    assert set(hard.tolist()) == {-1, 0, 1, 2, 3}
    assert 0.2 < np.mean(hard >= 0) < 0.4  # default hard_fraction 0.3
    _, h1 = scene_labels(jax.random.key(1), 50, GeneratorConfig(hard_fraction=1.0))
    _, h0 = scene_labels(jax.random.key(1), 50, GeneratorConfig(hard_fraction=0.0))
    assert np.all(np.asarray(h1) >= 0) and np.all(np.asarray(h0) == HardKind.NONE)
    with pytest.raises(ValueError):
        generate_scenes(jax.random.key(0), 0)
    with pytest.raises(ValueError, match="sizes too small"):
        generate_scenes(jax.random.key(0), 2, GeneratorConfig(sizes=SceneSizes(num_agents=8)))


def test_no_object_overlaps_or_aligns_exactly_with_the_ego(generated):
    sc = generated
    x, y = np.asarray(sc.agents.x[..., 0]), np.asarray(sc.agents.y[..., 0])
    valid = np.asarray(sc.agents.valid[..., 0])
    # no object centre exactly on the ego's heading line (nuPlan's arccos NaN)
    assert np.all(np.abs(y[valid]) > 1e-3)
    # no object box overlaps the ego box at t0 (centre distance above the inscribed radii)
    ego_c = np.array([1.461, 0.0])
    d = np.hypot(x - ego_c[0], y - ego_c[1])
    min_sep = np.minimum(np.asarray(sc.agents.width), np.asarray(sc.agents.length)) / 2 + 2.297 / 2
    assert np.all(d[valid] > min_sep[valid])


def test_expert_stays_on_drivable_area(generated):
    sc = generated
    corners = ego_corners(sc.expert)  # (N, 8, 4, 2)
    pts = corners.reshape(N_GEN, 32, 2)
    inside = points_in_polygons(pts, sc.map.drivable.vertices, sc.map.drivable.valid).any(-1)
    per_scene = np.asarray(inside).all(-1)
    assert per_scene.mean() >= 0.9, per_scene
    # the t0 ego is on an on-route lane in every scene
    on = points_in_polygons(jnp.zeros((N_GEN, 1, 2)), sc.map.lanes.vertices, sc.map.lanes.valid & sc.map.lanes.on_route)
    assert bool(on.any(-1).all())


def test_expert_history_is_consistent_with_t0_state(generated):
    sc = generated
    hp = np.asarray(sc.ego.history_poses)
    v0 = np.asarray(sc.ego.velocity[:, 0])
    # the last history step moves at about the t0 speed
    step = np.linalg.norm(hp[:, -1, :2] - hp[:, -2, :2], axis=-1) / 0.1
    np.testing.assert_allclose(step, v0, atol=0.5)
    # the expert starts at the t0 speed too (first 0.5 s within the accel bounds)
    first = np.linalg.norm(np.asarray(sc.expert[:, 0, :2]), axis=-1)
    assert np.all(np.abs(first - v0 * 0.5) <= 0.5 * 0.5**2 * 8.0 + 1e-3)


# --------------------------------------------------------------------------- frames


def test_frames_round_trip_at_utm_offsets(generated):
    sc = index_scene(generated, slice(0, 3))
    origin = np.array([[512345.25, 4512345.75, 1.2], [400000.0, 4000000.0, -2.9], [612000.5, 4999999.5, 3.1]])
    glob = scene_to_global(sc, origin)
    assert glob.agents.x.dtype == np.float64 and glob.agents.x.max() > 1e5
    back = to_ego_frame(glob, origin)
    for a, b in zip(jax.tree.leaves(sc), jax.tree.leaves(back)):
        if jnp.issubdtype(a.dtype, jnp.floating):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-3)
        else:
            np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


def test_to_ego_frame_keeps_centimetres_far_from_the_origin():
    # a hand-built global scene: a car 20.03 m ahead of an ego heading north at UTM coords
    local = straight_road_scene([dict(x=20.03, y=0.01)])
    origin = np.array([512345.123, 4512345.678, np.pi / 2])
    glob = scene_to_global(local, origin)
    np.testing.assert_allclose(glob.agents.x[0, 0], origin[0] - 0.01, atol=1e-6)
    np.testing.assert_allclose(glob.agents.y[0, 0], origin[1] + 20.03, atol=1e-6)
    back = to_ego_frame(glob, origin)
    np.testing.assert_allclose(float(back.agents.x[0, 0]), 20.03, atol=1e-5)
    np.testing.assert_allclose(float(back.agents.y[0, 0]), 0.01, atol=1e-5)
    poses = np.array([[[1.0, 2.0, 0.3], [4.0, -1.0, 3.1]]])
    np.testing.assert_allclose(poses_to_local(poses_to_global(poses, origin[None]), origin[None]), poses, atol=1e-8)
    with pytest.raises(ValueError, match="origin_pose"):
        to_ego_frame(glob, np.zeros(2))


# --------------------------------------------------------------------------- hard scenes vs planners


@pytest.mark.slow
def test_hard_scenes_make_constant_velocity_fail_but_not_the_expert():
    from jax_drive.evaluate import evaluate_planner

    hard = index_scene(generate_scenes(jax.random.key(3), N_GEN, GeneratorConfig(hard_fraction=1.0)), slice(0, 8))
    cv = evaluate_planner("constant_velocity", hard, batch_size=8)
    ex = evaluate_planner("expert", hard, batch_size=8)
    cv_fail = (cv.nc < 1) | (cv.dac < 1) | (cv.ttc < 1) | (cv.comfort < 1)
    assert cv_fail.mean() >= 0.5, cv.pdms
    assert (cv.nc < 1).any() and (cv.dac < 1).any()
    assert ex.nc.mean() >= 0.85 and ex.dac.mean() >= 0.85
    assert ex.pdms.mean() > cv.pdms.mean() + 0.3


# --------------------------------------------------------------------------- waymax adapter


def _waymax_like_arrays(origin=(512000.0, 4500000.0, 0.7)):
    """A 2-object log (SDC driving at 10 m/s, a car 20 m ahead) and one straight lane."""
    t = np.arange(91) * 0.1
    ox, oy, oh = origin
    d = np.array([np.cos(oh), np.sin(oh)])
    s_sdc, s_car = 10.0 * t, 20.0 + 5.0 * t
    x = np.stack([ox + s_sdc * d[0], ox + s_car * d[0] + 0.2 * -d[1]])
    y = np.stack([oy + s_sdc * d[1], oy + s_car * d[1] + 0.2 * d[0]])
    traj = dict(
        x=x, y=y, z=np.zeros_like(x), yaw=np.full_like(x, oh),
        vel_x=np.stack([10.0 * d[0] * np.ones(91), 5.0 * d[0] * np.ones(91)]),
        vel_y=np.stack([10.0 * d[1] * np.ones(91), 5.0 * d[1] * np.ones(91)]),
        valid=np.ones_like(x, bool), length=np.array([5.0, 4.5]), width=np.array([2.0, 1.9]), height=np.array([1.7, 1.6]),
    )
    s = np.linspace(-50.0, 150.0, 60)
    roadgraph = dict(
        x=ox + s * d[0], y=oy + s * d[1], types=np.full(60, 2), ids=np.zeros(60, int), valid=np.ones(60, bool)
    )
    return traj, roadgraph


def test_waymax_adapter_converts_layout_arrays():
    from jax_drive.adapters.waymax import scene_from_arrays

    traj, rg = _waymax_like_arrays()
    scene = scene_from_arrays(traj, 0, np.array([1, 1]), rg, timestep=20)
    # at t0 = 2 s the car is 10 m ahead of the SDC centre (+1.461 m to the rear axle), 0.2 m left
    np.testing.assert_allclose(float(scene.agents.x[0, 0]), 10.0 + 1.461, atol=1e-3)
    np.testing.assert_allclose(float(scene.agents.y[0, 0]), 0.2, atol=1e-3)
    np.testing.assert_allclose(scene.ego.velocity, [10.0, 0.0], atol=1e-4)
    np.testing.assert_allclose(scene.expert[:, 0], 5.0 * np.arange(1, 9), atol=1e-3)
    np.testing.assert_allclose(scene.ego.history_poses[0], [-15.0, 0.0, 0.0], atol=1e-3)
    assert int(scene.agents.agent_type[0]) == AgentType.VEHICLE and bool(scene.agents.valid[0, 50])
    inside = points_in_polygons(jnp.zeros((1, 2)), scene.map.drivable.vertices, scene.map.drivable.valid)
    assert bool(inside.any())
    assert int(scene.command) == Command.GO_STRAIGHT
    with pytest.raises(ValueError, match="timestep"):
        scene_from_arrays(traj, 0, np.array([1, 1]), rg, timestep=200)


def test_waymax_state_conversion_needs_waymo_waymax():
    from jax_drive.adapters import waymax as adapter

    try:
        import waymax  # noqa: F401
        from waymax import datatypes  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="git"):
            adapter.scene_from_waymax(object())
        pytest.skip("Waymo's waymax is not installed (install it from its git source; see jax_drive/adapters/waymax.py)")
    traj, rg = _waymax_like_arrays()  # pragma: no cover - only with waymax installed
    assert adapter.INSTALL_HINT
