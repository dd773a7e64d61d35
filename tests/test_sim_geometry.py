"""Lane projection parity with shapely, occlusion (line of sight) and collision geometry."""

import jax.numpy as jnp
import numpy as np
import shapely.geometry as sg
from hypothesis import given, settings, strategies as st

from jax_drive.geometry import box_corners, boxes_overlap
from jax_drive.sim import lanes as L
from jax_drive.sim.baselines import np_point_at, np_project
from jax_drive.sim.observe import line_of_sight

POLY = L.resample(L.join(L.straight([0, 0], [20, 0], 5), L.bezier([20, 0], [40, 0], [40, 20], 12)), 64)
LINE = sg.LineString(POLY)


@settings(max_examples=40)
@given(st.floats(1.0, 39.0), st.floats(-5.0, 15.0))
def test_project_matches_shapely(x, y):
    arc, lat, _ = L.project(jnp.asarray(POLY, jnp.float32), jnp.asarray([x, y], jnp.float32))
    p = sg.Point(x, y)
    np.testing.assert_allclose(float(arc), LINE.project(p), atol=2e-2)
    np.testing.assert_allclose(abs(float(lat)), LINE.distance(p), atol=2e-2)
    a2, l2, _ = np_project(POLY, np.array([[x, y]]))
    np.testing.assert_allclose([a2[0], l2[0]], [float(arc), float(lat)], atol=2e-2)


@settings(max_examples=30)
@given(st.floats(0.0, 50.0))
def test_point_at_arc_matches_shapely(s):
    xy, _ = L.point_at_arc(jnp.asarray(POLY, jnp.float32), jnp.asarray(s, jnp.float32))
    ref = LINE.interpolate(s)
    np.testing.assert_allclose(np.asarray(xy), [ref.x, ref.y], atol=2e-2)
    np.testing.assert_allclose(np_point_at(POLY, np.array([s]))[0], [ref.x, ref.y], atol=2e-2)


def test_lateral_sign_left_positive_and_offroad():
    pts = jnp.asarray(L.resample(L.straight([0, 0], [100, 0]), 16), jnp.float32)
    _, lat, heading = L.project(pts, jnp.array([[50.0, 1.0], [50.0, -2.0]]))
    np.testing.assert_allclose(np.asarray(lat), [1.0, -2.0], atol=1e-5)
    np.testing.assert_allclose(np.asarray(heading), 0.0, atol=1e-6)
    off = L.offroad(pts[None], jnp.array([3.5]), jnp.array([True]), jnp.array([[50.0, 1.0], [50.0, 3.0], [120.0, 0.0]]),
                    0.5)
    assert np.asarray(off).tolist() == [False, True, True]


@settings(max_examples=40)
@given(st.floats(-6, 6), st.floats(-6, 6), st.floats(-3.2, 3.2), st.floats(-3.2, 3.2))
def test_box_overlap_matches_shapely(dx, dy, h1, h2):
    a = box_corners(0.0, 0.0, h1, 4.6, 2.0)
    b = box_corners(dx, dy, h2, 4.6, 2.0)
    ref = sg.Polygon(np.asarray(a)).intersects(sg.Polygon(np.asarray(b)))
    assert bool(boxes_overlap(a, b)) == ref


def _scene(xs, ys, lengths, widths):
    xs, ys = jnp.asarray(xs, jnp.float32), jnp.asarray(ys, jnp.float32)
    corners = box_corners(xs, ys, jnp.zeros_like(xs), jnp.asarray(lengths), jnp.asarray(widths))
    return jnp.stack([xs, ys], -1), corners


def test_middle_truck_occludes_and_side_offset_reveals():
    # observer at x=0, truck at x=10 (10 m x 2.6 m), car at x=30, all on y=0
    centres, corners = _scene([0.0, 10.0, 30.0], [0.0, 0.0, 0.0], [4.6, 10.0, 4.6], [2.0, 2.6, 2.0])
    vis = np.asarray(line_of_sight(centres, corners, jnp.array([True, True, True])))
    assert vis[0, 1] and not vis[0, 2] and not vis[2, 0]
    # an absent truck does not block
    vis = np.asarray(line_of_sight(centres, corners, jnp.array([True, False, True])))
    assert vis[0, 2]
    # the far car moved 10 m sideways: visible past the truck
    centres, corners = _scene([0.0, 10.0, 30.0], [0.0, 0.0, 10.0], [4.6, 10.0, 4.6], [2.0, 2.6, 2.0])
    vis = np.asarray(line_of_sight(centres, corners, jnp.array([True, True, True])))
    assert vis[0, 2]


def test_visibility_respects_sensor_range():
    import jax

    from jax_drive.sim import core, observe, scenarios as S
    from jax_drive.sim.state import SimConfig

    cfg = SimConfig()
    b = S.Builder(cfg)
    lane = b.lane(L.straight([0, 0], [300, 0]))
    b.add(S._Agent(lane=lane, arc=10.0, speed=0.0))
    b.add(S._Agent(lane=lane, arc=10.0 + cfg.sensor_range - 1.0, speed=0.0))
    b.add(S._Agent(lane=lane, arc=10.0 + cfg.sensor_range + 30.0, speed=0.0))
    sc = b.build(timeout=10.0, accident_prone=False, scenario_id=0)
    st = core.reset(cfg, jax.random.key(0), sc)
    vis = np.asarray(observe.visibility(cfg, sc, st))
    assert vis[0, 1] and not vis[0, 2] and not vis[0, 0]
    assert not vis[:, 3:].any()  # padding never visible


@settings(max_examples=60)
@given(st.lists(st.tuples(st.floats(-6, 6), st.floats(-6, 6), st.floats(-3.2, 3.2), st.floats(3.0, 10.0),
                          st.floats(1.5, 2.6)), min_size=2, max_size=5))
def test_closed_form_pair_overlap_matches_corner_sat(boxes):
    from jax_drive.sim.core import obb_overlap_pairs

    x, y, h, length, width = (jnp.asarray(v, jnp.float32) for v in zip(*boxes))
    pairs = np.asarray(obb_overlap_pairs(x, y, h, length, width))
    corners = box_corners(x, y, h, length, width)
    n = len(boxes)
    ca = jnp.broadcast_to(corners[:, None], (n, n, 4, 2))
    ref = np.asarray(boxes_overlap(ca, jnp.swapaxes(ca, 0, 1)))
    # exact agreement except for pairs that just touch (float rounding either way)
    gap = np.array([[sg.Polygon(np.asarray(corners[i])).distance(sg.Polygon(np.asarray(corners[j])))
                     for j in range(n)] for i in range(n)])
    depth = np.array([[sg.Polygon(np.asarray(corners[i])).intersection(sg.Polygon(np.asarray(corners[j]))).area
                       for j in range(n)] for i in range(n)])
    clear = (gap > 1e-3) | (depth > 1e-3)
    assert np.array_equal(pairs[clear], ref[clear])
    assert np.array_equal(pairs, pairs.T)


@settings(max_examples=200)
@given(st.floats(-10.0, 60.0), st.floats(-8.0, 25.0), st.floats(-5.0, 60.0))
def test_lane_table_matches_direct_projection(x, y, s):
    pts = jnp.asarray(POLY, jnp.float32)
    tab = L.lane_table(pts)
    arc, lat = L.project_table(tab, jnp.asarray([x, y], jnp.float32))
    arc0, lat0, _ = L.project(pts, jnp.asarray([x, y], jnp.float32))
    # the distance to the polyline is unique; the arc is too except at equidistant ties,
    # where either nearest segment is right: then the points at both arcs are as far
    np.testing.assert_allclose(abs(float(lat)), abs(float(lat0)), atol=1e-3)
    if abs(float(arc) - float(arc0)) > 1e-3:
        foot = np.asarray(L.point_at_arc_table(tab, arc))
        foot0 = np.asarray(L.point_at_arc(pts, arc0)[0])
        np.testing.assert_allclose(np.hypot(*(foot - [x, y])), np.hypot(*(foot0 - [x, y])), atol=1e-3)
    xy = L.point_at_arc_table(tab, jnp.asarray(s, jnp.float32))
    xy0, _ = L.point_at_arc(pts, jnp.asarray(s, jnp.float32))
    np.testing.assert_allclose(np.asarray(xy), np.asarray(xy0), atol=1e-3)
    assert abs(float(tab.length) - LINE.length) < 1e-2
