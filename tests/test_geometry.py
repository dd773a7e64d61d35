"""jax_drive.geometry against shapely (the reference NAVSIM itself uses)."""

import numpy as np
import pytest
import shapely
from hypothesis import given
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
