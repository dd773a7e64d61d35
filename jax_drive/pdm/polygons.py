"""Exact point-in-polygon tests for many points against one scene's polygons, as bit masks.

The map masks of the scorer (DAC, multiple lanes, oncoming, intersections, red lights) test
every ego footprint point of every step of every proposal against every polygon. Counted
naively that is points x polygons x vertices edge tests, and most of them are wasted: the
padded vertices of a polygon make zero-length edges, and a horizontal ray from a point can
only cross edges whose y-range contains the point's y.

So, per scene, we keep only the real edges (``PolygonBudget.edges`` slots) and cut the
y-extent of those edges into ``PolygonBudget.bands`` equal horizontal bands; each band lists the edges
whose y-range meets it, widened by a small margin (``PolygonBudget.band`` slots per band).
A point finds its band with one multiply and a floor (no search) and tests only the listed
edges. Every edge a ray from the point can cross is listed in the point's band even when
the floor rounds across a band boundary (the margin is ~1e4 times the rounding error);
extra listed edges are harmless, since the crossing test itself requires the edge to
straddle the point's y. So it is the same even-odd test on the same edges as the
brute-force version (:func:`inside_bits_brute`), and the two agree for every point except
one lying within float rounding of an edge, where the compiler's choice of fused
multiply-add decides (the scorer treats boundary points as either way).

Masks are returned as bits: bit ``p % 32`` of word ``p // 32`` is polygon ``p``'s parity,
so crossings combine with XOR and the per-polygon result never needs a (points, polygons)
array. Capacities are static (they shape the arrays); :func:`map_budget` reads them off
concrete scenes on the host and rounds them up so that similar maps share a compilation.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

WORD = 32


NUM_BANDS = 128  # default bands per table: a finer cut lists fewer edges per band, up to a floor
BAND_MARGIN = 0.01  # band widening on the device, as a fraction of the band height
_HOST_MARGIN = 2 * BAND_MARGIN  # the host's capacity count widens more, so it never undercounts
BANDS_PER_TRAJECTORY = 4  # see bands_for
BANDS_PER_TRAJECTORY_MIN = 16


class PolygonBudget(NamedTuple):
    """Static capacities of a band table: real edges kept, edges listed per band, and the
    number of bands (building costs bands x edges per scene, a lookup the band's edges)."""

    edges: int
    band: int
    bands: int = NUM_BANDS


class MapBudget(NamedTuple):
    """Static capacities for one scene batch: drivable and lane band tables, red lanes kept,
    objects kept (the ones valid in some frame; the rest can never collide).

    ``None`` (instead of a MapBudget) means: scenes are traced, use the brute-force test.
    """

    drivable: PolygonBudget
    lanes: PolygonBudget
    red_lanes: int
    objects: int


def num_words(num_polygons: int) -> int:
    return max(1, -(-num_polygons // WORD))


def pack_bits(flags: chex.Array) -> chex.Array:
    """(..., P) bool -> (..., W) uint32, bit p % 32 of word p // 32 set where flags[p]."""
    p = flags.shape[-1]
    w = num_words(p)
    pad = w * WORD - p
    f = jnp.pad(flags, [(0, 0)] * (flags.ndim - 1) + [(0, pad)]).reshape(flags.shape[:-1] + (w, WORD))
    bits = jnp.left_shift(jnp.uint32(1), jnp.arange(WORD, dtype=jnp.uint32))
    return jnp.sum(jnp.where(f, bits, jnp.uint32(0)), axis=-1, dtype=jnp.uint32)


def _xor_reduce(x: chex.Array, axis: int) -> chex.Array:
    return jax.lax.reduce(x, jnp.uint32(0), jax.lax.bitwise_xor, (axis % x.ndim,))


def _edges(vertices: chex.Array, valid: chex.Array) -> dict:
    """Edge arrays (P * V,) of the closed rings; edges of invalid polygons never straddle.

    Every edge is stored from its lower to its upper end, so an edge walked both ways (the
    bridges between a polygon's exterior and its holes, see
    :func:`jax_drive.scenes.builders.ring_layout`) gives two identical crossing tests that
    cancel exactly in the parity.
    Returns ax, ay, by, inv (dx / dy, 0 for horizontal edges), lo, hi (y-range), poly (int32).
    """
    p, v = vertices.shape[:2]
    nxt = jnp.roll(vertices, -1, axis=-2)
    up = (nxt[..., 1] >= vertices[..., 1])[..., None]
    a = jnp.where(up, vertices, nxt)
    b = jnp.where(up, nxt, vertices)
    dy = b[..., 1] - a[..., 1]
    inv = (b[..., 0] - a[..., 0]) / jnp.where(dy == 0, 1.0, dy)
    real = valid[:, None] & (dy != 0)
    flat = lambda z: z.reshape(p * v)
    return {
        "ax": flat(a[..., 0]), "ay": flat(a[..., 1]), "by": flat(b[..., 1]), "inv": flat(inv),
        "lo": flat(jnp.minimum(a[..., 1], b[..., 1])), "hi": flat(jnp.maximum(a[..., 1], b[..., 1])),
        "real": flat(real), "poly": flat(jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32)[:, None], (p, v))),
    }


@chex.dataclass(frozen=True)
class BandTable:
    """Band lookup for one scene's polygon set (no batch dims).

    y0, inv_height: () float32; band b covers y in [y0 + b h, y0 + (b + 1) h), h = 1 / inv_height.
    rows: (G + 2, K, 4 + W) float32 (G bands); row b + 1 lists band b's edges as [ax, ay, by,
      inv, polygon bit words (uint32 bit patterns stored as float32)]; rows 0 and
      G + 1 (below / above every edge) and padding are inert (ay = by = 0, bits 0).
      One array so that a point fetches its band with a single contiguous gather.
    """

    y0: chex.Array
    inv_height: chex.Array
    rows: chex.Array


def band_membership(lo, hi, real, margin_fraction: float, num_bands: int = NUM_BANDS, xp=jnp):
    """Which edges each band lists: lo, hi, real (..., E) -> y0 (...), height (...),
    member (..., G, E) bool.

    Bands cut the y-extent of the real edges into ``num_bands``; a band lists the real edges
    whose [lo, hi] meets it widened by ``margin_fraction`` of its height. A set with no real
    edge gets a unit extent (and lists nothing). ``xp``: jax.numpy (the device's tables) or
    numpy (tests).
    """
    y0 = xp.min(xp.where(real, lo, xp.inf), axis=-1)
    y1 = xp.max(xp.where(real, hi, -xp.inf), axis=-1)
    y0 = xp.where(xp.isfinite(y0), y0, 0.0)
    y1 = xp.where(xp.isfinite(y1), y1, y0 + 1.0)
    height = xp.maximum(y1 - y0, 1e-3) / num_bands
    band_lo = y0[..., None, None] + xp.arange(num_bands, dtype=lo.dtype)[:, None] * height[..., None, None]
    margin = (margin_fraction * height)[..., None, None]
    lo_, hi_ = lo[..., None, :], hi[..., None, :]
    member = real[..., None, :] & (lo_ <= band_lo + height[..., None, None] + margin) & (hi_ >= band_lo - margin)
    return y0, height, member


def first_true_indices(mask: chex.Array, k: int) -> tuple[chex.Array, chex.Array]:
    """The indices of the first ``k`` True entries of mask (..., n) along its last axis, in
    order, and whether each of the k slots holds one: (..., k) int32, (..., k) bool.

    A top-k over descending ranks: on XLA:CPU ~10x cheaper than a stable argsort of the
    whole axis, and it is what makes per-scene band tables affordable for many scenes.
    """
    n = mask.shape[-1]
    rank = jnp.where(mask, jnp.arange(n, 0, -1, dtype=jnp.int32), 0).astype(jnp.float32)  # exact below 2^24
    top, index = jax.lax.top_k(rank, k)
    return index.astype(jnp.int32), top > 0


def build_band_table(vertices: chex.Array, valid: chex.Array, budget: PolygonBudget) -> BandTable:
    """Band table of one polygon set. vertices (P, V, 2), valid (P,); jit-able.

    The budget must hold the scene (see :func:`map_budget`); edges beyond it are dropped.
    """
    p = vertices.shape[0]
    e = _edges(jnp.asarray(vertices, jnp.float32), jnp.asarray(valid, bool))
    # Keep the real edges (in order), budget.edges slots.
    keep, _ = first_true_indices(e["real"], budget.edges)
    e = {k: val[keep] for k, val in e.items()}
    real = e["real"]
    y0, height, member = band_membership(e["lo"], e["hi"], real, BAND_MARGIN, budget.bands)  # (G, E)
    order, listed = first_true_indices(member, budget.band)  # (G, K)
    listed = listed[..., None]
    word = e["poly"] // WORD
    bit = jnp.left_shift(jnp.uint32(1), (e["poly"] % WORD).astype(jnp.uint32))
    onehot_word = jnp.arange(num_words(p), dtype=jnp.int32) == word[:, None]  # (E, W)
    edge_bits = jax.lax.bitcast_convert_type(jnp.where(onehot_word, bit[:, None], jnp.uint32(0)), jnp.float32)
    per_edge = jnp.concatenate([jnp.stack([e["ax"], e["ay"], e["by"], e["inv"]], -1), edge_bits], -1)
    rows = jnp.where(listed, per_edge[order], 0.0)  # (G, K, 4 + W); 0.0 is also the bits' zero
    empty = jnp.zeros_like(rows[:1])
    return BandTable(y0=y0, inv_height=1.0 / height, rows=jnp.concatenate([empty, rows, empty], 0))


def band_index(y: chex.Array, table: BandTable) -> chex.Array:
    """Row of ``table.rows`` for ordinates y (...) -> (...) int32 (0 below, G + 1 above)."""
    band = jnp.floor((y - table.y0) * table.inv_height)
    return jnp.clip(band, -1.0, float(table.rows.shape[0] - 2)).astype(jnp.int32) + 1


def inside_bits(points: chex.Array, table: BandTable) -> chex.Array:
    """Even-odd parity bits of points (..., 2) against a band table -> (..., W) uint32."""
    px, py = points[..., 0, None], points[..., 1, None]
    row = table.rows[band_index(points[..., 1], table)]  # (..., K, 4 + W)
    ax, ay, by, inv = row[..., 0], row[..., 1], row[..., 2], row[..., 3]
    bits = jax.lax.bitcast_convert_type(row[..., 4:], jnp.uint32)  # (..., K, W)
    cross = ((ay > py) != (by > py)) & (px < ax + (py - ay) * inv)
    return _xor_reduce(jnp.where(cross[..., None], bits, jnp.uint32(0)), axis=-2)


def inside_bits_brute(points: chex.Array, vertices: chex.Array, valid: chex.Array) -> chex.Array:
    """The same parity bits by testing every edge. points (..., 2), vertices (P, V, 2)."""
    e = _edges(jnp.asarray(vertices, jnp.float32), jnp.asarray(valid, bool))
    p, v = vertices.shape[:2]
    shape = lambda z: z.reshape(p, v)
    px, py = points[..., 0, None, None], points[..., 1, None, None]
    ay, by = shape(e["ay"]), shape(e["by"])
    cross = ((ay > py) != (by > py)) & (px < shape(e["ax"]) + (py - ay) * shape(e["inv"]))
    odd = (jnp.sum(cross.astype(jnp.int32), axis=-1) & 1) == 1
    return pack_bits(odd & jnp.asarray(valid, bool))


def _round_up(n: int, step: int) -> int:
    return max(step, int(math.ceil(n / step)) * step)


def _max_band_count(lo: np.ndarray, hi: np.ndarray, real: np.ndarray, num_bands: int) -> int:
    """Most real edges listed in one band over scenes lo, hi, real (B, E), counted on the
    host in float64 with a wider margin than the device's (so never below its count).

    An edge [lo, hi] is listed by bands b with lo <= y0 + (b + 1) h + m and hi >= y0 + b h - m
    (:func:`band_membership`): a run of bands [first, last]. A band's count is then
    #(first <= b) - #(last < b): two histograms over all scenes' real edges at once (one
    ``bincount`` each) and a cumulative sum, O(B (E + G)) with no sort or scatter.
    """
    if lo.size == 0:
        return 0
    y0 = np.min(np.where(real, lo, np.inf), axis=-1).astype(np.float64)  # exact: min of float32 values
    y1 = np.max(np.where(real, hi, -np.inf), axis=-1).astype(np.float64)
    y0 = np.where(np.isfinite(y0), y0, 0.0)
    y1 = np.where(np.isfinite(y1), y1, y0 + 1.0)
    height = np.maximum(y1 - y0, 1e-3) / num_bands
    scene, edge = np.nonzero(real)  # only real edges are counted: compact them once
    lo, hi = lo[scene, edge].astype(np.float64), hi[scene, edge].astype(np.float64)
    h, base = height[scene], y0[scene]
    first = np.ceil((lo - base - _HOST_MARGIN * h) / h - 1.0 - 1e-9)
    last = np.floor((hi - base + _HOST_MARGIN * h) / h + 1e-9)
    first, last = np.clip(first, 0, num_bands).astype(np.int64), np.clip(last, -1, num_bands - 1).astype(np.int64)
    listed = first <= last
    row = scene[listed] * (num_bands + 1)
    size = len(real) * (num_bands + 1)
    starts = np.bincount(row + first[listed], minlength=size)
    ends = np.bincount(row + last[listed] + 1, minlength=size)
    counts = np.cumsum((starts - ends).reshape(len(real), num_bands + 1)[:, :num_bands], axis=-1)
    return int(counts.max())


def polygon_budget(vertices: np.ndarray, valid: np.ndarray, num_bands: int = NUM_BANDS) -> PolygonBudget:
    """Capacities for polygons (B..., P, V, 2) of concrete scenes cut into ``num_bands``
    bands, rounded up (edges to 16, band rows to 4) so that similar maps reuse one
    compilation."""
    v = np.asarray(vertices, np.float32)
    ok = np.asarray(valid, bool)
    p, n = v.shape[-3], v.shape[-2]
    y = v[..., 1].reshape((-1, p, n))
    ok = ok.reshape((-1, p))
    y_next = np.concatenate([y[..., 1:], y[..., :1]], axis=-1)  # each ring's next vertex
    lo = np.minimum(y, y_next).reshape(len(y), -1)
    hi = np.maximum(y, y_next).reshape(len(y), -1)
    real = ((y_next != y) & ok[..., None]).reshape(len(y), -1)
    edges = int(real.sum(-1).max()) if len(y) else 0
    return PolygonBudget(edges=min(_round_up(edges, 16), p * n),
                         band=min(_round_up(_max_band_count(lo, hi, real, num_bands), 4), p * n),
                         bands=num_bands)


def bands_for(num_trajectories: int | None) -> int:
    """Bands per table for scenes scored with this many trajectories each (None: many).

    A table costs about bands x edges to build and each footprint point tests one band's
    edges, so few trajectories per scene (MTDrive's 8 proposals + 1 reference) want fewer,
    taller bands; thousands of proposals of one scene want NUM_BANDS.
    """
    if num_trajectories is None:
        return NUM_BANDS
    return int(min(NUM_BANDS, max(BANDS_PER_TRAJECTORY_MIN, 2 ** math.ceil(math.log2(max(num_trajectories, 1)))
                                  * BANDS_PER_TRAJECTORY)))


def map_budget(scene, num_trajectories: int | None = None) -> MapBudget | None:
    """Budget for a concrete Scene batch whose scenes are each scored with
    ``num_trajectories`` trajectories (None: many, see :func:`bands_for`); None when its
    arrays are traced (inside jit)."""
    leaves = (scene.map.drivable.vertices, scene.map.lanes.vertices, scene.map.red_light, scene.agents.valid)
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        return None
    lanes = scene.map.lanes
    red = (np.asarray(scene.map.red_light, bool).any(-1) & np.asarray(lanes.valid, bool)
           & np.asarray(lanes.on_route, bool) & (np.asarray(lanes.kind) == 1))
    red_lanes = int(red.reshape((-1, red.shape[-1])).sum(-1).max()) if red.size else 0
    present = np.asarray(scene.agents.valid, bool).any(-1)  # (..., N)
    n_objects = present.shape[-1]
    objects = int(present.reshape((-1, n_objects)).sum(-1).max()) if present.size else 0
    bands = bands_for(num_trajectories)
    return MapBudget(drivable=polygon_budget(scene.map.drivable.vertices, scene.map.drivable.valid, bands),
                     lanes=polygon_budget(lanes.vertices, lanes.valid, bands),
                     red_lanes=min(_round_up(red_lanes, 2) if red_lanes else 0, red.shape[-1]),
                     objects=min(_round_up(objects, 8), n_objects))
