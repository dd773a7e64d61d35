"""Pure, jittable 2-D geometry: angles, oriented boxes, separating-axis overlap,
point-in-polygon, polyline tables and projection.

All functions broadcast over leading dims; shapes are given per call. Boxes are given by
their four corners in counter-clockwise order: front-left, rear-left, rear-right,
front-right (so corners[0] -> corners[3] is the front edge), or by centre, heading and
size. The polyline functions built on :class:`PolylineTable` also run on NumPy arrays
(returning NumPy), so Python-side code (scenario building, rule-based policies) shares
them instead of keeping NumPy twins.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

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


def _weighted_sum(*pairs):
    """Sum of k * x over (k, x) pairs, with Python-number weights folded: 0 drops the term
    and 1 / -1 skip the product (XLA keeps x * 0.0, which is not 0 for every float), so a
    box given as axis-aligned (cos 1.0, sin 0.0) costs no work for its zero terms."""
    total = None
    for k, x in pairs:
        if isinstance(k, (int, float)) and k in (0, 1, -1):
            if k == 0:
                continue
            term = x if k == 1 else -x
        else:
            term = k * x
        total = term if total is None else total + term
    return 0.0 if total is None else total


def rectangles_overlap(dx, dy, cos_a, sin_a, half_l_a, half_w_a, cos_b, sin_b, half_l_b, half_w_b) -> chex.Array:
    """Separating-axis test of two rectangles on their four edge directions, in closed form.

    The one home of the oriented-box overlap test: the PDM collision / TTC checks, the
    simulator's collisions and the ``kernels.box_overlap`` Pallas kernel all call it.

    Args (all broadcastable): dx, dy: centre of b minus centre of a; (cos, sin): unit
      length direction of each box (Python numbers allowed: an axis-aligned box a, cos 1.0
      and sin 0.0, skips its zero terms with identical results for finite inputs);
      half_l, half_w: half length and half width.
    Returns: bool, True when the boxes overlap or touch.
    """
    cos_ab = jnp.abs(_weighted_sum((cos_a, cos_b), (sin_a, sin_b)))  # |cos| and |sin| of the relative heading
    sin_ab = jnp.abs(_weighted_sum((cos_a, sin_b), (-sin_a, cos_b)))
    sep = jnp.abs(_weighted_sum((cos_a, dx), (sin_a, dy))) > half_l_a + half_l_b * cos_ab + half_w_b * sin_ab
    sep |= jnp.abs(_weighted_sum((-sin_a, dx), (cos_a, dy))) > half_w_a + half_l_b * sin_ab + half_w_b * cos_ab
    sep |= jnp.abs(dx * cos_b + dy * sin_b) > half_l_b + half_l_a * cos_ab + half_w_a * sin_ab
    sep |= jnp.abs(-dx * sin_b + dy * cos_b) > half_w_b + half_l_a * sin_ab + half_w_a * cos_ab
    return ~sep


def boxes_overlap(corners_a: chex.Array, corners_b: chex.Array) -> chex.Array:
    """Whether two oriented boxes (rectangles) overlap or touch.

    Args: corners_a, corners_b: (..., 4, 2) corners FL, RL, RR, FR (as from
      :func:`box_corners`), broadcastable.
    Returns: (...) bool. Same closed-form test as :func:`boxes_overlap_pairwise`.
    """

    def frame(corners):
        centre = jnp.mean(corners, axis=-2)
        front = 0.5 * (corners[..., 0, :] + corners[..., 3, :]) - centre  # half length along the heading
        left = 0.5 * (corners[..., 0, :] + corners[..., 1, :]) - centre
        half_l = jnp.linalg.norm(front, axis=-1)
        unit = front / jnp.maximum(half_l, 1e-12)[..., None]
        return centre, unit[..., 0], unit[..., 1], half_l, jnp.linalg.norm(left, axis=-1)

    centre_a, cos_a, sin_a, hl_a, hw_a = frame(corners_a)
    centre_b, cos_b, sin_b, hl_b, hw_b = frame(corners_b)
    d = centre_b - centre_a
    return rectangles_overlap(d[..., 0], d[..., 1], cos_a, sin_a, hl_a, hw_a, cos_b, sin_b, hl_b, hw_b)


def boxes_overlap_pairwise(
    x: chex.Array, y: chex.Array, heading: chex.Array, length: chex.Array, width: chex.Array
) -> chex.Array:
    """Overlap of every pair of N oriented boxes.

    Args: x, y, heading, length, width: (..., N) box centres, headings and sizes.
    Returns: (..., N, N) bool, symmetric, True on the diagonal.
    """
    c, s = jnp.cos(heading), jnp.sin(heading)
    hl, hw = length / 2, width / 2
    col = lambda v: v[..., :, None]  # noqa: E731  (box a along rows)
    row = lambda v: v[..., None, :]  # noqa: E731  (box b along columns)
    return rectangles_overlap(row(x) - col(x), row(y) - col(y), col(c), col(s), col(hl), col(hw),
                             row(c), row(s), row(hl), row(hw))


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


# ------------------------------------------------------------------------- polylines
def _namespace(*arrays):
    """Array module for the inputs: NumPy when none is a JAX array (Python-side callers
    such as scenario building and the rule-based policies keep float64 and pay no dispatch),
    jax.numpy otherwise (device arrays and tracers)."""
    return jnp if any(isinstance(a, jax.Array) for a in arrays) else np


@chex.dataclass(frozen=True)
class PolylineTable:
    """Per-segment data of polylines, computed once (:func:`polyline_table`) so that
    projections need no square roots, divisions or cumulative sums per query.

    Fields (S = R - 1 segments of polylines of R points):
      start: (..., S, 2) segment start points.
      unit: (..., S, 2) unit directions (zero for degenerate and invalid segments).
      seg_len: (..., S) segment lengths (zero for invalid segments).
      cum: (..., S) arc length at each segment start.
      valid: (..., S) bool segment validity, or None when every segment is valid.
    Arrays are NumPy or JAX, following the points they were built from.
    """

    start: chex.Array
    unit: chex.Array
    seg_len: chex.Array
    cum: chex.Array
    valid: chex.Array | None = None

    @property
    def length(self) -> chex.Array:
        """(...) total polyline length."""
        return self.cum[..., -1] + self.seg_len[..., -1]

    def take(self, index: chex.Array) -> "PolylineTable":
        """Tables of the polylines ``index`` (...) of a table of P polylines (P, S, ...)."""
        return jax.tree.map(lambda v: v[index], self)

    def expand(self) -> "PolylineTable":
        """The same polylines (..., 1, S, ...), so that queries (..., K, 2) each project on
        the polyline of their leading dims."""
        return PolylineTable(start=self.start[..., None, :, :], unit=self.unit[..., None, :, :],
                             seg_len=self.seg_len[..., None, :], cum=self.cum[..., None, :],
                             valid=None if self.valid is None else self.valid[..., None, :])

    def last_segment(self) -> chex.Array | int:
        """(...) index of the last valid segment (S - 1 when all are valid)."""
        if self.valid is None:
            return self.seg_len.shape[-1] - 1
        return self.valid.sum(axis=-1) - 1


def polyline_table(points: chex.Array, valid: chex.Array | None = None) -> PolylineTable:
    """Table of polylines (..., R, 2) whose valid points (..., R) form a prefix of at least
    two points (``valid=None``: all points valid)."""
    xp = _namespace(points, valid)
    seg = xp.diff(points, axis=-2)
    seg_len = xp.linalg.norm(seg, axis=-1)
    unit = seg / xp.maximum(seg_len, 1e-9)[..., None]
    seg_valid = None
    if valid is not None:
        seg_valid = valid[..., 1:] & valid[..., :-1]
        seg_len = xp.where(seg_valid, seg_len, 0.0)
        unit = xp.where(seg_valid[..., None], unit, 0.0)
    cum = xp.concatenate([xp.zeros_like(seg_len[..., :1]), xp.cumsum(seg_len[..., :-1], axis=-1)], axis=-1)
    return PolylineTable(start=points[..., :-1, :], unit=unit, seg_len=seg_len, cum=cum, valid=seg_valid)


class PolylineProjection(NamedTuple):
    """Closest point of a polyline to a query (each field (...)).

    arc: its arc length, metres; lateral: signed offset of the query from the closest
    segment's line, positive to the left of the direction of travel; distance: Euclidean
    distance to the closest point; heading: direction of the closest segment, rad.
    """

    arc: chex.Array
    lateral: chex.Array
    distance: chex.Array
    heading: chex.Array


def project_on_table(table: PolylineTable, query: chex.Array, extrapolate: bool = False) -> PolylineProjection:
    """Projects query points (..., 2) onto the polylines of ``table`` (..., S, ...).

    ``extrapolate`` (static) extends the first segment backwards and the last valid one
    forwards, so points before the start get negative arcs and points past the end arcs
    beyond the length (lane following); otherwise the closest point is clamped to the
    polyline. Ties between equidistant segments go to the first.
    """
    xp = _namespace(table.start, query)
    rel = xp.asarray(query)[..., None, :] - table.start  # (..., S, 2)
    along = rel[..., 0] * table.unit[..., 0] + rel[..., 1] * table.unit[..., 1]
    if extrapolate:
        idx = xp.arange(table.seg_len.shape[-1])
        lo = xp.where(idx == 0, -xp.inf, 0.0)
        hi = xp.where(idx == xp.asarray(table.last_segment())[..., None], xp.inf, table.seg_len)
    else:
        lo, hi = 0.0, table.seg_len
    t = xp.clip(along, lo, hi)
    dx = rel[..., 0] - t * table.unit[..., 0]
    dy = rel[..., 1] - t * table.unit[..., 1]
    d2 = dx * dx + dy * dy
    if table.valid is not None:
        d2 = xp.where(table.valid, d2, xp.inf)
    best = xp.argmin(d2, axis=-1)[..., None]
    pick = lambda v: xp.take_along_axis(xp.broadcast_to(v, d2.shape), best, axis=-1)[..., 0]  # noqa: E731
    ux, uy = pick(table.unit[..., 0]), pick(table.unit[..., 1])
    return PolylineProjection(
        arc=pick(table.cum + t),
        lateral=ux * pick(rel[..., 1]) - uy * pick(rel[..., 0]),
        distance=xp.sqrt(pick(d2)),
        heading=xp.arctan2(uy, ux),
    )


def point_at_arc(table: PolylineTable, arc: chex.Array) -> tuple[chex.Array, chex.Array]:
    """Point and heading at arc lengths along polylines, extrapolated past both ends.

    Args: table (..., S, ...); arc (...). Returns xy (..., 2) and heading (...) of the
    segment holding the point.
    """
    xp = _namespace(table.start, arc)
    arc = xp.asarray(arc)
    i = xp.clip(xp.sum(table.cum[..., 1:] <= arc[..., None], axis=-1), 0, table.last_segment())
    pick = lambda v: xp.take_along_axis(xp.broadcast_to(v, i.shape + v.shape[-1:]), i[..., None], axis=-1)[..., 0]  # noqa: E731
    ux, uy = pick(table.unit[..., 0]), pick(table.unit[..., 1])
    s = arc - pick(table.cum)
    xy = xp.stack([pick(table.start[..., 0]) + s * ux, pick(table.start[..., 1]) + s * uy], axis=-1)
    return xy, xp.arctan2(uy, ux)


def polyline_arc_lengths(points: chex.Array, valid: chex.Array) -> chex.Array:
    """Cumulative arc length (..., R) of a polyline (..., R, 2) whose valid points form a prefix."""
    table = polyline_table(jnp.asarray(points), jnp.asarray(valid))
    return jnp.concatenate([table.cum, table.length[..., None]], axis=-1)


def project_on_polyline(
    query: chex.Array, points: chex.Array, valid: chex.Array
) -> tuple[chex.Array, chex.Array]:
    """Projects query points onto a polyline (clamped to it).

    Args:
      query: (..., K, 2).
      points: (..., R, 2) polyline with (..., R) validity (valid prefix, at least 2 points).
    Returns:
      arc: (..., K) arc length of the closest point on the polyline, metres.
      distance: (..., K) distance to it, metres.
    """
    table = polyline_table(jnp.asarray(points), jnp.asarray(valid)).expand()
    proj = project_on_table(table, jnp.asarray(query))
    return proj.arc, proj.distance
