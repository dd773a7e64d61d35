"""Pure, jittable 2-D geometry: angles, oriented boxes, separating-axis overlap,
point-in-polygon, polyline projection.

All functions broadcast over leading dims; shapes are given per call. Boxes are given by
their four corners in counter-clockwise order: front-left, rear-left, rear-right,
front-right (so corners[0] -> corners[3] is the front edge).
"""

from __future__ import annotations

import chex
import jax.numpy as jnp

from jax_drive.types import VehicleParameters


def wrap_angle(angle: chex.Array) -> chex.Array:
    """Wraps angles to [-pi, pi). Any shape."""
    return (angle + jnp.pi) % (2.0 * jnp.pi) - jnp.pi


def rotate(xy: chex.Array, angle: chex.Array) -> chex.Array:
    """Rotates (..., 2) vectors by (...) angles counter-clockwise."""
    c, s = jnp.cos(angle), jnp.sin(angle)
    x, y = xy[..., 0], xy[..., 1]
    return jnp.stack([c * x - s * y, s * x + c * y], axis=-1)


def box_corners(
    x: chex.Array, y: chex.Array, heading: chex.Array, length: chex.Array, width: chex.Array
) -> chex.Array:
    """Corners of oriented boxes centred at (x, y).

    Args: all (...) arrays (broadcastable).
    Returns: (..., 4, 2) corners FL, RL, RR, FR (counter-clockwise).
    """
    half_l = jnp.asarray(length) / 2.0
    half_w = jnp.asarray(width) / 2.0
    local = jnp.stack(
        [
            jnp.stack([half_l, half_w], -1),
            jnp.stack([-half_l, half_w], -1),
            jnp.stack([-half_l, -half_w], -1),
            jnp.stack([half_l, -half_w], -1),
        ],
        axis=-2,
    )  # (..., 4, 2)
    heading = jnp.asarray(heading)[..., None]
    rotated = rotate(local, heading)
    centre = jnp.stack([jnp.asarray(x), jnp.asarray(y)], -1)[..., None, :]
    return rotated + centre


def ego_center(pose: chex.Array, params: VehicleParameters = VehicleParameters()) -> chex.Array:
    """Geometric centre (..., 2) of the ego box from rear-axle poses (..., 3)."""
    h = pose[..., 2]
    offset = params.rear_axle_to_center
    return pose[..., :2] + offset * jnp.stack([jnp.cos(h), jnp.sin(h)], -1)


def ego_corners(pose: chex.Array, params: VehicleParameters = VehicleParameters()) -> chex.Array:
    """Corners (..., 4, 2) of the ego box (FL, RL, RR, FR) from rear-axle poses (..., 3)."""
    centre = ego_center(pose, params)
    return box_corners(centre[..., 0], centre[..., 1], pose[..., 2], params.length, params.width)


def _project(corners: chex.Array, axis: chex.Array) -> tuple[chex.Array, chex.Array]:
    """Min and max of (..., 4, 2) corners projected on (..., 2) axes."""
    proj = jnp.sum(corners * axis[..., None, :], axis=-1)
    return proj.min(-1), proj.max(-1)


def boxes_overlap(corners_a: chex.Array, corners_b: chex.Array) -> chex.Array:
    """Separating-axis test of two convex quadrilaterals.

    Args: corners_a, corners_b: (..., 4, 2), broadcastable.
    Returns: (...) bool, True when the boxes overlap or touch.
    """
    edges_a = jnp.roll(corners_a, -1, axis=-2) - corners_a
    edges_b = jnp.roll(corners_b, -1, axis=-2) - corners_b
    # Edge normals of both boxes are the candidate axes: (..., 8, 2).
    axes = jnp.concatenate([edges_a, edges_b], axis=-2)
    normals = jnp.stack([-axes[..., 1], axes[..., 0]], -1)
    min_a, max_a = _project(corners_a[..., None, :, :], normals)
    min_b, max_b = _project(corners_b[..., None, :, :], normals)
    separated = (max_a < min_b) | (max_b < min_a)
    return ~jnp.any(separated, axis=-1)


def _cross(o: chex.Array, a: chex.Array, b: chex.Array) -> chex.Array:
    return (a[..., 0] - o[..., 0]) * (b[..., 1] - o[..., 1]) - (a[..., 1] - o[..., 1]) * (
        b[..., 0] - o[..., 0]
    )


def segments_intersect(p0: chex.Array, p1: chex.Array, q0: chex.Array, q1: chex.Array) -> chex.Array:
    """Whether segments p0-p1 and q0-q1 intersect (touching counts). Points (..., 2)."""
    d1 = _cross(q0, q1, p0)
    d2 = _cross(q0, q1, p1)
    d3 = _cross(p0, p1, q0)
    d4 = _cross(p0, p1, q1)
    proper = (d1 * d2 < 0) & (d3 * d4 < 0)

    def on_segment(a, b, c, d):  # c collinear with a-b and within its bounding box
        within = (
            (jnp.minimum(a[..., 0], b[..., 0]) <= c[..., 0])
            & (c[..., 0] <= jnp.maximum(a[..., 0], b[..., 0]))
            & (jnp.minimum(a[..., 1], b[..., 1]) <= c[..., 1])
            & (c[..., 1] <= jnp.maximum(a[..., 1], b[..., 1]))
        )
        return (d == 0) & within

    touching = (
        on_segment(q0, q1, p0, d1)
        | on_segment(q0, q1, p1, d2)
        | on_segment(p0, p1, q0, d3)
        | on_segment(p0, p1, q1, d4)
    )
    return proper | touching


def points_in_polygons(points: chex.Array, vertices: chex.Array, valid: chex.Array) -> chex.Array:
    """Even-odd point-in-polygon test.

    Args:
      points: (..., K, 2).
      vertices: (..., P, V, 2) padded rings (padding repeats the first vertex).
      valid: (..., P) bool.
    Returns: (..., K, P) bool; False for invalid polygons.
    """
    p = points[..., :, None, None, :]  # (..., K, 1, 1, 2)
    a = vertices[..., None, :, :, :]  # (..., 1, P, V, 2)
    b = jnp.roll(vertices, -1, axis=-2)[..., None, :, :, :]
    px, py = p[..., 0], p[..., 1]
    ax, ay, bx, by = a[..., 0], a[..., 1], b[..., 0], b[..., 1]
    straddles = (ay > py) != (by > py)
    dy = jnp.where(by == ay, 1.0, by - ay)
    x_cross = ax + (py - ay) * (bx - ax) / dy
    crossings = jnp.sum(straddles & (px < x_cross), axis=-1)
    inside = (crossings % 2) == 1
    return inside & valid[..., None, :]


def polyline_arc_lengths(points: chex.Array, valid: chex.Array) -> chex.Array:
    """Cumulative arc length (..., R) of a polyline (..., R, 2) whose valid points form a prefix."""
    seg = jnp.linalg.norm(jnp.diff(points, axis=-2), axis=-1)
    seg = jnp.where(valid[..., 1:] & valid[..., :-1], seg, 0.0)
    return jnp.concatenate([jnp.zeros_like(seg[..., :1]), jnp.cumsum(seg, axis=-1)], axis=-1)


def project_on_polyline(
    query: chex.Array, points: chex.Array, valid: chex.Array
) -> tuple[chex.Array, chex.Array]:
    """Projects query points onto a polyline.

    Args:
      query: (..., K, 2).
      points: (..., R, 2) polyline with (..., R) validity (valid prefix, at least 2 points).
    Returns:
      arc: (..., K) arc length of the closest point on the polyline, metres.
      distance: (..., K) distance to it, metres.
    """
    a = points[..., None, :-1, :]  # (..., 1, R-1, 2)
    b = points[..., None, 1:, :]
    seg_valid = (valid[..., :-1] & valid[..., 1:])[..., None, :]
    ab = b - a
    q = query[..., :, None, :]  # (..., K, 1, 2)
    denom = jnp.maximum(jnp.sum(ab * ab, -1), 1e-12)
    t = jnp.clip(jnp.sum((q - a) * ab, -1) / denom, 0.0, 1.0)  # (..., K, R-1)
    closest = a + t[..., None] * ab
    dist = jnp.linalg.norm(q - closest, axis=-1)
    dist = jnp.where(seg_valid, dist, jnp.inf)
    best = jnp.argmin(dist, axis=-1)  # (..., K)
    cum = polyline_arc_lengths(points, valid)  # (..., R)
    seg_len = jnp.sqrt(denom)  # (..., 1, R-1)
    arc_all = cum[..., None, :-1] + t * seg_len
    arc = jnp.take_along_axis(arc_all, best[..., None], axis=-1)[..., 0]
    distance = jnp.take_along_axis(dist, best[..., None], axis=-1)[..., 0]
    return arc, distance
