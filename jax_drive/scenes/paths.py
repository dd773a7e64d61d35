"""Analytic road paths: straight -> circular arc -> straight, and what is built from them.

A path is a (..., 7) array ``[x0, y0, h0, l1, radius, angle, l2]``: start pose, a straight of
length ``l1``, an arc turning by ``angle`` (rad, + = left) with ``radius`` (arc length
``radius * |angle|``), then a straight of length ``l2``. Poses at arc length ``s`` are exact
(closed form, jittable); ``s`` outside [0, length] extrapolates the end straights. A
lateral ``offset`` (metres, + = left) gives parallel lanes and road edges.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp

PATH_FIELDS = 7


def path(x0, y0, h0, l1, radius=100.0, angle=0.0, l2=0.0) -> chex.Array:
    """Packs path parameters (scalars or broadcastable arrays) into a (..., 7) array."""
    parts = jnp.broadcast_arrays(*[jnp.asarray(v, jnp.float32) for v in (x0, y0, h0, l1, radius, angle, l2)])
    return jnp.stack(parts, -1)


def path_length(p: chex.Array) -> chex.Array:
    """(...) total arc length of (..., 7) paths."""
    return p[..., 3] + p[..., 4] * jnp.abs(p[..., 5]) + p[..., 6]


def arc_range(p: chex.Array) -> tuple[chex.Array, chex.Array]:
    """(...) arc lengths where the arc starts and ends."""
    return p[..., 3], p[..., 3] + p[..., 4] * jnp.abs(p[..., 5])


def curvature_at(p: chex.Array, s: chex.Array) -> chex.Array:
    """Signed curvature (1/m) of path (..., 7) at arc lengths s (..., K)."""
    a0, a1 = arc_range(p)
    kappa = jnp.sign(p[..., 5]) / jnp.maximum(p[..., 4], 1e-3)
    on_arc = (s >= a0[..., None]) & (s <= a1[..., None])
    return jnp.where(on_arc, kappa[..., None], 0.0)


def path_pose(p: chex.Array, s: chex.Array, offset: chex.Array = 0.0) -> chex.Array:
    """Poses on a path.

    Args:
      p: (..., 7) path.
      s: (..., K) arc lengths along the reference line (extrapolated outside [0, length]).
      offset: (..., K) or broadcastable lateral offsets, metres (+ = left).
    Returns: (..., K, 3) [x, y, heading].
    """
    x0, y0, h0 = p[..., 0:1], p[..., 1:2], p[..., 2:3]
    l1, radius, angle = p[..., 3:4], jnp.maximum(p[..., 4:5], 1e-3), p[..., 5:6]
    la = radius * jnp.abs(angle)
    kappa = jnp.sign(angle) / radius
    s1 = jnp.minimum(s, l1)
    u = jnp.clip(s - l1, 0.0, la)
    w = jnp.maximum(s - l1 - la, 0.0)
    c0, s0 = jnp.cos(h0), jnp.sin(h0)
    h = h0 + kappa * u
    # Chord of the arc: length u * sinc(kappa u / 2), direction h0 + kappa u / 2 (no 1/kappa).
    chord = u * jnp.sinc(kappa * u / (2.0 * jnp.pi))
    hm = h0 + 0.5 * kappa * u
    x = x0 + s1 * c0 + chord * jnp.cos(hm) + w * jnp.cos(h)
    y = y0 + s1 * s0 + chord * jnp.sin(hm) + w * jnp.sin(h)
    offset = jnp.asarray(offset, jnp.float32)
    x = x - offset * jnp.sin(h)
    y = y + offset * jnp.cos(h)
    return jnp.stack([x, y, h], -1)


def sample_s(p: chex.Array, s_lo: chex.Array, s_hi: chex.Array, n: int, arc_weight: float = 8.0) -> chex.Array:
    """``n`` arc lengths in [s_lo, s_hi] (each (...)), ``arc_weight`` times denser on the arc.

    Returns (..., n). Straights need few points; this keeps polygon chords close to arcs.
    """
    a0, a1 = arc_range(p)
    la = a1 - a0
    wgt = arc_weight - 1.0

    def effort(s):
        return s + wgt * jnp.clip(s - a0, 0.0, la)

    e_lo, e_hi = effort(s_lo), effort(s_hi)
    e = e_lo[..., None] + (e_hi - e_lo)[..., None] * jnp.linspace(0.0, 1.0, n)
    a0_, la_ = a0[..., None], la[..., None]
    s_arc = a0_ + (e - a0_) / arc_weight
    s_after = e - wgt * la_
    return jnp.where(e <= a0_, e, jnp.where(e <= a0_ + arc_weight * la_, s_arc, s_after))


def strip_polygon(
    p: chex.Array, off_lo: chex.Array, off_hi: chex.Array, s_lo: chex.Array, s_hi: chex.Array, per_side: int
) -> chex.Array:
    """Counter-clockwise polygon (..., 2 * per_side, 2) covering offsets [off_lo, off_hi] of s in [s_lo, s_hi]."""
    s = sample_s(p, s_lo, s_hi, per_side)
    right = path_pose(p, s, off_lo[..., None])[..., :2]
    left = path_pose(p, s, off_hi[..., None])[..., :2]
    return jnp.concatenate([right, left[..., ::-1, :]], axis=-2)
