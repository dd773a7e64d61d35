"""Batched oriented-box overlap (separating axes) for (proposals x steps x objects).

Two rectangles A and B (centres, unit headings (cos, sin), half lengths / widths) are
disjoint exactly when one of the four box axes separates them. With d = c_B - c_A,
|cos| = |cos(h_B - h_A)| and |sin| = |sin(h_B - h_A)|, the projections give, for A's axes

    |d . u_A| > l_A + l_B |cos| + w_B |sin|        |d . v_A| > w_A + l_B |sin| + w_B |cos|

and the same with A and B swapped (u forward, v left, l / w half sizes). Touching counts
as overlap (strict >), as in NAVSIM's and our corner-based tests. Closed form, equal to the
corner-based separating-axis test on rectangles.

The pure-JAX twin broadcasts this formula over (..., P, T, O); the Pallas kernel runs it per
(batch, step, proposal tile) on a (proposal_block, object_block) tile. Both call
:func:`rectangles_overlap`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jax_drive import geometry
from kernels.dispatch import resolve_impl

BOX_FIELDS = ("x", "y", "heading", "length", "width")
_NUM_FEATURES = 8  # x, y, cos, sin, half length, half width, valid, unused (a sublane tile)


@dataclasses.dataclass(frozen=True)
class BoxOverlapConfig:
    """Pallas tile of :func:`boxes_overlap`: proposal_block (8) x object_block (128) pairs
    per program; P and O are padded up to multiples of them (powers of two, for Triton)."""

    proposal_block: int = 8
    object_block: int = 128

    def __post_init__(self):
        for v in (self.proposal_block, self.object_block):
            if not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"BoxOverlapConfig blocks must be powers of two, got {self}")


def rectangles_overlap(a: tuple, b: tuple) -> jax.Array:
    """Overlap-or-touch of rectangles A and B, each given as a tuple of fields.

    Args:
      a, b: (x, y, cos, sin, half_length, half_width), arrays broadcastable together
        (metres; cos / sin of the heading).
    Returns: bool, the broadcast shape (:func:`jax_drive.geometry.rectangles_overlap`).
    """
    xa, ya, ca, sa, la, wa = a
    xb, yb, cb, sb, lb, wb = b
    return geometry.rectangles_overlap(xb - xa, yb - ya, ca, sa, la, wa, cb, sb, lb, wb)


def _features(boxes: jax.Array, valid: jax.Array) -> tuple:
    """(..., 5) boxes (x, y, heading, length, width) and (...) validity -> 8 (...) float32 fields."""
    boxes = boxes.astype(jnp.float32)
    x, y, heading, length, width = (boxes[..., k] for k in range(5))
    return (x, y, jnp.cos(heading), jnp.sin(heading), length / 2, width / 2,
            valid.astype(jnp.float32), jnp.zeros_like(x))


def _twin(fa: tuple, fb: tuple) -> jax.Array:
    """fa: fields (B, P, T); fb: fields (B, T, O) -> (B, P, T, O) bool."""
    a = tuple(f[..., None] for f in fa[:6])
    b = tuple(f[:, None] for f in fb[:6])
    return rectangles_overlap(a, b) & (fa[6][..., None] > 0) & (fb[6][:, None] > 0)


def _kernel(a_ref, b_ref, out_ref):
    a = a_ref[...]  # (8, proposal_block)
    b = b_ref[...]  # (8, object_block)
    fa = tuple(a[k][:, None] for k in range(7))
    fb = tuple(b[k][None, :] for k in range(7))
    hit = rectangles_overlap(fa[:6], fb[:6]) & (fa[6] > 0) & (fb[6] > 0)
    out_ref[...] = hit.astype(jnp.int8)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _pallas(fa: tuple, fb: tuple, config: BoxOverlapConfig, interpret: bool) -> jax.Array:
    """Same contract as :func:`_twin`; one program per (batch, step, P tile, O tile)."""
    nb, p, t = fa[0].shape
    o = fb[0].shape[-1]
    pb, ob = min(config.proposal_block, pl.next_power_of_2(p)), config.object_block
    pp, op = _round_up(p, pb), _round_up(o, ob)
    # Stack the fields (a zero-padded box is invalid): (8, B, T, P') and (8, B, T, O').
    a = jnp.pad(jnp.stack(fa).transpose(0, 1, 3, 2), ((0, 0), (0, 0), (0, 0), (0, pp - p)))
    b = jnp.pad(jnp.stack(fb), ((0, 0), (0, 0), (0, 0), (0, op - o)))
    out = pl.pallas_call(
        _kernel,
        out_shape=jax.ShapeDtypeStruct((nb, t, pp, op), jnp.int8),
        grid=(nb, t, pp // pb, op // ob),
        in_specs=[pl.BlockSpec((_NUM_FEATURES, None, None, pb), lambda i, s, j, k: (0, i, s, j)),
                  pl.BlockSpec((_NUM_FEATURES, None, None, ob), lambda i, s, j, k: (0, i, s, k))],
        out_specs=pl.BlockSpec((None, None, pb, ob), lambda i, s, j, k: (i, s, j, k)),
        interpret=interpret,
        name="boxes_overlap",
    )(a, b)
    return out[:, :, :p, :o].transpose(0, 2, 1, 3) > 0


@functools.partial(jax.jit, static_argnames=("config", "impl"))
def boxes_overlap(boxes_a: jax.Array, boxes_b: jax.Array, valid_a: jax.Array | None = None,
                  valid_b: jax.Array | None = None, *,
                  config: BoxOverlapConfig = BoxOverlapConfig(),
                  impl: str | None = None) -> jax.Array:
    """Which of P boxes overlap which of O boxes at each of T steps.

    Args:
      boxes_a: (..., P, T, 5) e.g. the ego box of P proposals at T steps, and
      boxes_b: (..., T, O, 5) e.g. O objects at those steps; both as (x, y, heading,
        length, width) with the centre in metres and the heading in radians. Leading
        dims broadcast.
      valid_a: (..., P, T) bool and valid_b: (..., T, O) bool (None: all valid); a pair
        with an invalid box never overlaps.
      config: the Pallas tile (:class:`BoxOverlapConfig`).
      impl: "jax" (twin), "pallas", "interpret" or None (see :mod:`kernels.dispatch`).
    Returns:
      (..., P, T, O) bool, True where the two boxes overlap or touch.

    The simulator's all-pairs test of A agents is ``boxes_overlap(b[:, None], b[None])[:, 0]``
    with b (A, 5); time-to-collision projections fold their offsets into T.
    """
    if boxes_a.ndim < 3 or boxes_b.ndim < 3 or boxes_a.shape[-1] != 5 or boxes_b.shape[-1] != 5:
        raise ValueError(f"boxes_a {boxes_a.shape} must be (..., P, T, 5) and boxes_b "
                         f"{boxes_b.shape} (..., T, O, 5), fields {BOX_FIELDS}")
    (p, t), (t_b, o) = boxes_a.shape[-3:-1], boxes_b.shape[-3:-1]
    if t != t_b:
        raise ValueError(f"boxes_a has {t} steps, boxes_b {t_b}")
    valid_a = jnp.ones(boxes_a.shape[:-1], bool) if valid_a is None else valid_a
    valid_b = jnp.ones(boxes_b.shape[:-1], bool) if valid_b is None else valid_b
    if valid_a.shape != boxes_a.shape[:-1] or valid_b.shape != boxes_b.shape[:-1]:
        raise ValueError(f"valid_a {valid_a.shape} / valid_b {valid_b.shape} must be "
                         f"{boxes_a.shape[:-1]} / {boxes_b.shape[:-1]}")
    lead = jnp.broadcast_shapes(boxes_a.shape[:-3], boxes_b.shape[:-3])
    fa = _features(boxes_a, valid_a)
    fb = _features(boxes_b, valid_b)
    fa = tuple(jnp.broadcast_to(f, lead + (p, t)).reshape(-1, p, t) for f in fa)
    fb = tuple(jnp.broadcast_to(f, lead + (t, o)).reshape(-1, t, o) for f in fb)
    impl = resolve_impl(impl)
    hits = _twin(fa, fb) if impl == "jax" else _pallas(fa, fb, config, impl == "interpret")
    return hits.reshape(lead + (p, t, o))
