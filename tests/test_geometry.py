"""jax_drive.geometry against shapely (the reference NAVSIM itself uses)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import shapely
from hypothesis import given, settings
from hypothesis import strategies as st

from jax_drive import geometry
from jax_drive.types import VehicleParameters

finite = st.floats(-20.0, 20.0, allow_nan=False, allow_infinity=False)
sizes = st.floats(0.2, 8.0, allow_nan=False, allow_infinity=False)
angles = st.floats(-np.pi, np.pi, allow_nan=False, allow_infinity=False)


def _shapely_box(x, y, heading, length, width):
    corners = np.asarray(geometry.box_corners(x, y, heading, length, width))
    return shapely.Polygon(corners)


def test_box_corners_order_and_shape():
    corners = np.asarray(geometry.box_corners(1.0, 2.0, 0.0, 4.0, 2.0))
    assert corners.shape == (4, 2)
    np.testing.assert_allclose(corners, [[3, 3], [-1, 3], [-1, 1], [3, 1]], atol=1e-6)
    # counter-clockwise: positive signed area
    assert shapely.Polygon(corners).exterior.is_ccw


def test_ego_corners_use_rear_axle_offset():
    params = VehicleParameters()
    corners = np.asarray(geometry.ego_corners(np.zeros(3), params))
    np.testing.assert_allclose(corners[:, 0].max(), params.front_length, atol=1e-5)
    np.testing.assert_allclose(corners[:, 0].min(), -params.rear_length, atol=1e-5)
    np.testing.assert_allclose(corners[:, 1].max(), params.width / 2, atol=1e-6)


@given(finite, finite, angles, sizes, sizes, finite, finite, angles, sizes, sizes)
def test_boxes_overlap_matches_shapely(x1, y1, h1, l1, w1, x2, y2, h2, l2, w2):
    a = _shapely_box(x1, y1, h1, l1, w1)
    b = _shapely_box(x2, y2, h2, l2, w2)
    # skip near-tangent cases where float32 and float64 may legitimately disagree
    if abs(a.distance(b)) < 1e-3 and a.intersection(b).area < 1e-3:
        return
    got = bool(
        geometry.boxes_overlap(
            geometry.box_corners(x1, y1, h1, l1, w1), geometry.box_corners(x2, y2, h2, l2, w2)
        )
    )
    assert got == a.intersects(b)


@given(st.lists(st.tuples(finite, finite), min_size=4, max_size=4))
def test_segments_intersect_matches_shapely(pts):
    p0, p1, q0, q1 = np.array(pts[0]), np.array(pts[1]), np.array(pts[2]), np.array(pts[3])
    s1, s2 = shapely.LineString([p0, p1]), shapely.LineString([q0, q1])
    if s1.length < 1e-3 or s2.length < 1e-3 or (s1.distance(s2) < 1e-3 and not s1.crosses(s2)):
        return
    assert bool(geometry.segments_intersect(p0, p1, q0, q1)) == s1.intersects(s2)


def test_points_in_polygons_matches_shapely_with_padding():
    rng = np.random.default_rng(0)
    # a concave L-shaped polygon padded to 10 vertices, and a triangle padded likewise
    l_shape = np.array([[0, 0], [10, 0], [10, 4], [4, 4], [4, 10], [0, 10]], float)
    tri = np.array([[20, 0], [30, 0], [25, 8]], float)
    polys = np.zeros((3, 10, 2))
    for i, p in enumerate([l_shape, tri]):
        polys[i, : len(p)] = p
        polys[i, len(p) :] = p[0]
    valid = np.array([True, True, False])
    points = rng.uniform(-2, 32, size=(400, 2))
    got = np.asarray(geometry.points_in_polygons(points, polys, valid))
    assert got.shape == (400, 3)
    for j, p in enumerate([l_shape, tri]):
        ref = shapely.contains_xy(shapely.Polygon(p), points[:, 0], points[:, 1])
        np.testing.assert_array_equal(got[:, j], ref)
    assert not got[:, 2].any()


def test_project_on_polyline_matches_shapely():
    rng = np.random.default_rng(1)
    line = np.cumsum(rng.uniform(0.5, 3.0, size=(12, 2)), axis=0)
    padded = np.concatenate([line, np.repeat(line[-1:], 4, axis=0)])
    valid = np.arange(16) < 12
    queries = rng.uniform(line.min(), line.max(), size=(50, 2))
    arc, dist = map(np.asarray, geometry.project_on_polyline(queries, padded, valid))
    ref_line = shapely.LineString(line)
    ref_arc = np.array([ref_line.project(shapely.Point(q)) for q in queries])
    ref_dist = np.array([ref_line.distance(shapely.Point(q)) for q in queries])
    np.testing.assert_allclose(dist, ref_dist, atol=1e-4)
    np.testing.assert_allclose(arc, ref_arc, atol=1e-3)


@pytest.mark.parametrize("angle", [-7.0, -np.pi, 0.0, np.pi - 1e-3, 9.0])
def test_wrap_angle_range(angle):
    wrapped = float(geometry.wrap_angle(angle))
    assert -np.pi <= wrapped < np.pi
    assert np.isclose(np.cos(wrapped), np.cos(angle), atol=1e-5)


# ------------------------------------------------------------------ oriented boxes by pose
@jax.jit
def _pairs_both_ways(x, y, h, length, width):
    """Pairwise overlap from poses, and from corners through :func:`geometry.boxes_overlap`."""
    corners = geometry.box_corners(x, y, h, length, width)
    return (geometry.boxes_overlap_pairwise(x, y, h, length, width),
            geometry.boxes_overlap(corners[:, None], corners[None, :]))


@settings(max_examples=60)
@given(st.lists(st.tuples(st.floats(-6, 6), st.floats(-6, 6), angles, st.floats(3.0, 10.0), st.floats(1.5, 2.6)),
                min_size=5, max_size=5))
def test_boxes_overlap_pairwise_matches_shapely(boxes):
    x, y, h, length, width = (np.asarray(v, np.float32) for v in zip(*boxes))
    pairs, by_corners = map(np.asarray, _pairs_both_ways(x, y, h, length, width))
    polys = [_shapely_box(*b) for b in boxes]
    n = len(boxes)
    ref = np.array([[polys[i].intersects(polys[j]) for j in range(n)] for i in range(n)])
    # exact agreement except for pairs that just touch (float32 rounding either way)
    gap = np.array([[polys[i].distance(polys[j]) for j in range(n)] for i in range(n)])
    depth = np.array([[polys[i].intersection(polys[j]).area for j in range(n)] for i in range(n)])
    clear = (gap > 1e-3) | (depth > 1e-3)
    assert np.array_equal(pairs[clear], ref[clear])
    assert np.array_equal(by_corners[clear], ref[clear])
    assert np.array_equal(pairs, pairs.T) and pairs.diagonal().all()


# ------------------------------------------------------------------------------ polylines
def _curve():
    """A straight piece then a quarter turn, 40 unevenly spaced points, plus shapely's line."""
    t = np.linspace(0.0, 1.0, 25)[1:, None]
    turn = (1 - t) ** 2 * np.array([20.0, 0.0]) + 2 * (1 - t) * t * np.array([40.0, 0.0]) + t**2 * np.array([40.0, 20.0])
    pts = np.concatenate([np.stack([np.linspace(0.0, 20.0, 16), np.zeros(16)], -1), turn])
    return pts, shapely.LineString(pts)


CURVE, CURVE_LINE = _curve()


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_project_on_table_matches_shapely(backend):
    rng = np.random.default_rng(3)
    queries = rng.uniform([-5.0, -8.0], [50.0, 25.0], size=(300, 2))
    pts = CURVE if backend == "numpy" else jnp.asarray(CURVE, jnp.float32)
    q = queries if backend == "numpy" else jnp.asarray(queries, jnp.float32)
    proj = geometry.project_on_table(geometry.polyline_table(pts), q)
    assert isinstance(proj.arc, np.ndarray if backend == "numpy" else jax.Array)
    ref_arc = np.array([CURVE_LINE.project(shapely.Point(p)) for p in queries])
    ref_dist = np.array([CURVE_LINE.distance(shapely.Point(p)) for p in queries])
    tol = 1e-9 if backend == "numpy" else 2e-3
    np.testing.assert_allclose(np.asarray(proj.distance), ref_dist, atol=tol)
    # the arc is unique except at equidistant ties; there both feet are as far
    feet, _ = geometry.point_at_arc(geometry.polyline_table(CURVE), np.asarray(proj.arc, float))
    np.testing.assert_allclose(np.linalg.norm(feet - queries, axis=-1), ref_dist, atol=tol)
    unique = np.abs(np.asarray(proj.arc) - ref_arc) < 1e-3
    assert unique.mean() > 0.95


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_point_at_arc_matches_shapely_and_extrapolates(backend):
    pts = CURVE if backend == "numpy" else jnp.asarray(CURVE, jnp.float32)
    table = geometry.polyline_table(pts)
    length = float(table.length)
    assert abs(length - CURVE_LINE.length) < 1e-3
    arcs = np.linspace(0.0, length, 57)
    xy, heading = geometry.point_at_arc(table, arcs if backend == "numpy" else jnp.asarray(arcs, jnp.float32))
    ref = np.array([[CURVE_LINE.interpolate(s).x, CURVE_LINE.interpolate(s).y] for s in arcs])
    np.testing.assert_allclose(np.asarray(xy), ref, atol=1e-3)
    # past both ends the first and last segments are extended
    xy, heading = geometry.point_at_arc(table, np.array([-5.0, length + 5.0]))
    last = (CURVE[-1] - CURVE[-2]) / np.linalg.norm(CURVE[-1] - CURVE[-2])
    np.testing.assert_allclose(np.asarray(xy), [[-5.0, 0.0], CURVE[-1] + 5.0 * last], atol=1e-3)
    np.testing.assert_allclose(np.asarray(heading), [0.0, np.arctan2(last[1], last[0])], atol=1e-5)


def test_projection_lateral_sign_heading_and_extrapolation():
    pts = np.stack([np.linspace(0.0, 100.0, 16), np.zeros(16)], -1)
    table = geometry.polyline_table(pts)
    proj = geometry.project_on_table(table, np.array([[50.0, 1.0], [50.0, -2.0], [-10.0, 3.0], [120.0, -1.0]]),
                                     extrapolate=True)
    np.testing.assert_allclose(proj.lateral, [1.0, -2.0, 3.0, -1.0], atol=1e-12)  # left of travel positive
    np.testing.assert_allclose(proj.arc, [50.0, 50.0, -10.0, 120.0], atol=1e-12)
    np.testing.assert_allclose(proj.heading, 0.0, atol=1e-12)
    clamped = geometry.project_on_table(table, np.array([[-10.0, 3.0], [120.0, -1.0]]))
    np.testing.assert_allclose(clamped.arc, [0.0, 100.0], atol=1e-12)
    np.testing.assert_allclose(clamped.distance, [np.hypot(10, 3), np.hypot(20, 1)], atol=1e-12)


def test_padded_polylines_ignore_invalid_points_in_both_backends():
    rng = np.random.default_rng(4)
    line = np.cumsum(rng.uniform(0.5, 3.0, size=(9, 2)), axis=0)
    padded = np.concatenate([line, np.zeros((5, 2))])  # padding far from the line's end
    valid = np.arange(14) < 9
    queries = rng.uniform(line.min(), line.max() + 5.0, size=(40, 2))
    ref_line = shapely.LineString(line)
    ref_dist = np.array([ref_line.distance(shapely.Point(q)) for q in queries])
    for pts, ok in ((padded, valid), (jnp.asarray(padded, jnp.float32), jnp.asarray(valid))):
        table = geometry.polyline_table(pts, ok)
        np.testing.assert_allclose(float(table.length), ref_line.length, rtol=1e-5)
        proj = geometry.project_on_table(table, queries)
        np.testing.assert_allclose(np.asarray(proj.distance), ref_dist, atol=1e-3)
        # extrapolation runs along the last valid segment, never into the padding
        end, _ = geometry.point_at_arc(table, np.asarray(table.length) + 2.0)
        step = (line[-1] - line[-2]) / np.linalg.norm(line[-1] - line[-2])
        np.testing.assert_allclose(np.asarray(end), line[-1] + 2.0 * step, atol=1e-3)
