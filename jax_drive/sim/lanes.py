"""Lane-graph geometry: building centreline paths (NumPy, Python side) and projecting
onto them (JAX, jittable).

A lane path is a polyline of C points with uniform spacing (built by
:func:`resample`). Projection extrapolates the first and last segments so vehicles
slightly before the start or beyond the end get negative / over-length arcs.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np


# ----------------------------------------------------------------------------- building
def resample(points: np.ndarray, num: int) -> np.ndarray:
    """Resamples a polyline (P, 2) to ``num`` points equally spaced in arc length."""
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 2 or len(points) < 2:
        raise ValueError(f"polyline must be (P>=2, 2), got {points.shape}")
    seg = np.linalg.norm(np.diff(points, axis=0), axis=1)
    keep = np.concatenate([[True], seg > 1e-9])
    points = points[keep]
    cum = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(points, axis=0), axis=1))])
    if cum[-1] <= 0:
        raise ValueError("polyline has zero length")
    s = np.linspace(0.0, cum[-1], num)
    return np.stack([np.interp(s, cum, points[:, 0]), np.interp(s, cum, points[:, 1])], -1)


def straight(p0, p1, num: int = 8) -> np.ndarray:
    """Points (num, 2) on the segment p0 -> p1."""
    t = np.linspace(0.0, 1.0, num)[:, None]
    return (1 - t) * np.asarray(p0, float) + t * np.asarray(p1, float)


def bezier(p0, c, p1, num: int = 16) -> np.ndarray:
    """Quadratic Bezier (num, 2) from p0 to p1 with control point c."""
    t = np.linspace(0.0, 1.0, num)[:, None]
    p0, c, p1 = (np.asarray(v, float) for v in (p0, c, p1))
    return (1 - t) ** 2 * p0 + 2 * (1 - t) * t * c + t**2 * p1


def join(*parts: np.ndarray) -> np.ndarray:
    """Concatenates polylines, dropping duplicated joint points."""
    out = [np.asarray(parts[0], float)]
    for part in parts[1:]:
        part = np.asarray(part, float)
        if np.linalg.norm(part[0] - out[-1][-1]) < 1e-6:
            part = part[1:]
        out.append(part)
    return np.concatenate(out, axis=0)


def arc_of_point(points: np.ndarray, xy) -> float:
    """Arc length (NumPy) of the projection of ``xy`` on a polyline (P, 2)."""
    arc, _, _ = project(jnp.asarray(points, jnp.float32), jnp.asarray(xy, jnp.float32))
    return float(arc)


# ---------------------------------------------------------------------------- projection
def project(points: chex.Array, query: chex.Array) -> tuple[chex.Array, chex.Array, chex.Array]:
    """Projects points onto polylines.

    Args:
      points: (..., C, 2) polyline (C >= 2), broadcastable against query's batch dims.
      query: (..., 2).
    Returns:
      arc: (...) arc length of the closest point, metres (extrapolated before the first
        and after the last point).
      lateral: (...) signed offset, positive to the left of the driving direction.
      heading: (...) direction of the closest segment, rad.
    """
    a = points[..., :-1, :]
    b = points[..., 1:, :]
    ab = b - a
    q = query[..., None, :]
    seg_len2 = jnp.maximum(jnp.sum(ab * ab, -1), 1e-9)
    seg_len = jnp.sqrt(seg_len2)
    t_raw = jnp.sum((q - a) * ab, -1) / seg_len2
    n_seg = ab.shape[-2]
    idx = jnp.arange(n_seg)
    lo = jnp.where(idx == 0, -jnp.inf, 0.0)
    hi = jnp.where(idx == n_seg - 1, jnp.inf, 1.0)
    t = jnp.clip(t_raw, lo, hi)
    closest = a + t[..., None] * ab
    d2 = jnp.sum((q - closest) ** 2, -1)
    best = jnp.argmin(d2, axis=-1)
    def take(v):
        v = jnp.broadcast_to(v, d2.shape)
        return jnp.take_along_axis(v, best[..., None], axis=-1)[..., 0]

    cum = jnp.concatenate([jnp.zeros_like(seg_len[..., :1]), jnp.cumsum(seg_len, -1)], -1)
    arc = take(cum[..., :-1] + t * seg_len)
    rel = q - a
    cross = (ab[..., 0] * rel[..., 1] - ab[..., 1] * rel[..., 0]) / seg_len
    lateral = take(cross)
    heading = take(jnp.arctan2(ab[..., 1], ab[..., 0]))
    return arc, lateral, heading


def lane_length(points: chex.Array) -> chex.Array:
    """(...) total length of polylines (..., C, 2)."""
    return jnp.sum(jnp.linalg.norm(jnp.diff(points, axis=-2), axis=-1), axis=-1)


def point_at_arc(points: chex.Array, arc: chex.Array) -> tuple[chex.Array, chex.Array]:
    """Point and heading at an arc length along a polyline (extrapolated at the ends).

    Args: points (..., C, 2); arc (...). Returns xy (..., 2), heading (...).
    """
    seg = jnp.diff(points, axis=-2)
    seg_len = jnp.maximum(jnp.linalg.norm(seg, axis=-1), 1e-9)
    cum = jnp.concatenate([jnp.zeros_like(seg_len[..., :1]), jnp.cumsum(seg_len, -1)], -1)
    n_seg = seg.shape[-2]
    # index of the segment holding arc: number of interior breakpoints passed.
    i = jnp.clip(jnp.sum(cum[..., 1:-1] <= arc[..., None], axis=-1), 0, n_seg - 1)
    onehot = jnp.arange(n_seg) == i[..., None]
    take = lambda v: jnp.sum(jnp.where(onehot, v, 0.0), axis=-1)  # noqa: E731
    start = jnp.sum(jnp.where(onehot[..., None], points[..., :-1, :], 0.0), axis=-2)
    d = jnp.sum(jnp.where(onehot[..., None], seg, 0.0), axis=-2)
    t = (arc - take(cum[..., :-1])) / take(seg_len)
    xy = start + t[..., None] * d
    return xy, jnp.arctan2(d[..., 1], d[..., 0])


def gather_lanes(points: chex.Array, lane: chex.Array) -> chex.Array:
    """Points of chosen lanes: points (L, C, 2), lane (...) int -> (..., C, 2)."""
    return points[jnp.clip(lane, 0, points.shape[0] - 1)]


def offroad(points: chex.Array, width: chex.Array, valid: chex.Array, xy: chex.Array, margin) -> chex.Array:
    """Whether positions are off every lane path.

    Args: points (L, C, 2); width, valid (L,); xy (..., 2); margin metres.
    Returns: (...) bool, True when the distance to every valid path exceeds its half
      width plus ``margin`` or the point lies beyond the path's ends.
    """
    arc, lat, _ = jax.vmap(lambda p: project(p, xy), out_axes=-1)(points)  # (..., L)
    length = lane_length(points)
    inside = (jnp.abs(lat) <= width / 2 + margin) & (arc >= -margin) & (arc <= length + margin)
    return ~jnp.any(inside & valid, axis=-1)


# ------------------------------------------------------------------ precomputed tables
@chex.dataclass(frozen=True)
class LaneTable:
    """Per-segment data of polylines, computed once so per-tick projections need no
    square roots, divisions or cumulative sums.

    Fields (S = C - 1 segments): start (..., S, 2) segment start points; unit (..., S, 2)
    unit directions (zero for degenerate segments); seg_len (..., S); cum (..., S) arc
    length at each segment start.
    """

    start: chex.Array
    unit: chex.Array
    seg_len: chex.Array
    cum: chex.Array

    @property
    def length(self) -> chex.Array:
        """(...) total polyline length."""
        return self.cum[..., -1] + self.seg_len[..., -1]


def lane_table(points: chex.Array) -> LaneTable:
    """Table of polylines (..., C, 2)."""
    seg = jnp.diff(points, axis=-2)
    seg_len = jnp.linalg.norm(seg, axis=-1)
    unit = seg / jnp.maximum(seg_len, 1e-9)[..., None]
    cum = jnp.concatenate([jnp.zeros_like(seg_len[..., :1]), jnp.cumsum(seg_len[..., :-1], -1)], -1)
    return LaneTable(start=points[..., :-1, :], unit=unit, seg_len=seg_len, cum=cum)


def table_rows(table: LaneTable, lane: chex.Array) -> LaneTable:
    """Rows of a table of L polylines (L, S, ...) for indices ``lane`` (...)."""
    return jax.tree.map(lambda v: v[lane], table)


def project_table(rows: LaneTable, query: chex.Array) -> tuple[chex.Array, chex.Array]:
    """:func:`project` on a table: rows (..., S, ...) and query (..., 2) -> arc (...),
    lateral (...) (same extrapolation at the ends)."""
    rel = query[..., None, :] - rows.start  # (..., S, 2)
    t_raw = rel[..., 0] * rows.unit[..., 0] + rel[..., 1] * rows.unit[..., 1]
    n_seg = rows.seg_len.shape[-1]
    idx = jnp.arange(n_seg)
    lo = jnp.where(idx == 0, -jnp.inf, 0.0)
    hi = jnp.where(idx == n_seg - 1, jnp.inf, rows.seg_len)
    t = jnp.clip(t_raw, lo, hi)
    dx = rel[..., 0] - t * rows.unit[..., 0]
    dy = rel[..., 1] - t * rows.unit[..., 1]
    best = jnp.argmin(dx * dx + dy * dy, axis=-1)[..., None]
    pick = lambda v: jnp.take_along_axis(v, best, axis=-1)[..., 0]  # noqa: E731
    arc = pick(rows.cum + t)
    lat = pick(rows.unit[..., 0] * rel[..., 1] - rows.unit[..., 1] * rel[..., 0])
    return arc, lat


def point_at_arc_table(rows: LaneTable, arc: chex.Array) -> chex.Array:
    """:func:`point_at_arc` on a table: rows (..., S, ...), arc (...) -> xy (..., 2)."""
    n_seg = rows.seg_len.shape[-1]
    i = jnp.clip(jnp.sum(rows.cum[..., 1:] <= arc[..., None], axis=-1), 0, n_seg - 1)[..., None]
    pick = lambda v: jnp.take_along_axis(v, i, axis=-1)[..., 0]  # noqa: E731
    s = arc - pick(rows.cum)
    return jnp.stack([pick(rows.start[..., 0]) + s * pick(rows.unit[..., 0]),
                      pick(rows.start[..., 1]) + s * pick(rows.unit[..., 1])], -1)
