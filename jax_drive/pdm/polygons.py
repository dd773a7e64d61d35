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


def _select_bit(word: chex.Array, rank: chex.Array) -> chex.Array:
    """Position (0-31) of the set bit of ``word`` with ``rank`` set bits below it.

    word (...) uint32, rank (...) int32 below popcount(word) -> (...) int32: a binary
    search over halves of the word by population count (5 elementwise steps).
    """
    pos = jnp.zeros(word.shape, jnp.uint32)
    rank = rank.astype(jnp.uint32)
    for width in (16, 8, 4, 2, 1):
        below = jax.lax.population_count((word >> pos) & jnp.uint32((1 << width) - 1))
        higher = rank >= below
        rank = jnp.where(higher, rank - below, rank)
        pos = jnp.where(higher, pos + jnp.uint32(width), pos)
    return pos.astype(jnp.int32)


def first_true_indices(mask: chex.Array, k: int) -> tuple[chex.Array, chex.Array]:
    """The indices of the first ``k`` True entries of mask (..., n) along its last axis, in
    order, and whether each of the k slots holds one: (..., k) int32 (0 in empty slots),
    (..., k) bool.

    The mask is packed into 32-bit words; slot j finds the word holding the j-th True
    entry from the words' population counts and the bit inside it with :func:`_select_bit`.
    Everything is elementwise over (..., k, n / 32): on XLA:CPU about 10x cheaper than
    ``lax.top_k`` over ranks (a single-threaded sort per row), which is what the band
    tables of many scenes spend most of their build time on.
    """
    words = pack_bits(mask)  # (..., W)
    count = jax.lax.population_count(words).astype(jnp.int32)
    end = jnp.cumsum(count, axis=-1)  # entries up to and including each word
    start = end - count
    slot = jnp.arange(k, dtype=jnp.int32)[:, None]  # (k, 1)
    holds = (start[..., None, :] <= slot) & (slot < end[..., None, :])  # (..., k, W), one-hot or empty
    pick = lambda x: jnp.sum(jnp.where(holds, x, jnp.zeros((), x.dtype)), axis=-1, dtype=x.dtype)
    word_index = pick(jnp.arange(words.shape[-1], dtype=jnp.int32))
    listed = slot[:, 0] < end[..., -1:]
    rank = slot[:, 0] - pick(start[..., None, :])
    bit = _select_bit(pick(words[..., None, :]), jnp.where(listed, rank, 0))
    return jnp.where(listed, word_index * WORD + bit, 0), listed


def build_band_table(vertices: chex.Array, valid: chex.Array, budget: PolygonBudget) -> BandTable:
    """Band table of one polygon set. vertices (P, V, 2), valid (P,); jit-able.

    The budget must hold the scene (see :func:`map_budget`): real edges beyond
    ``budget.edges`` rounded up to a multiple of 32, or band members beyond ``budget.band``,
    are dropped.
    """
    p = vertices.shape[0]
    edges = _edges(jnp.asarray(vertices, jnp.float32), jnp.asarray(valid, bool))
    # Keep the real edges (in order) in budget.edges slots, rounded up to whole 32-bit words
    # so the membership mask packs without padding (a padded pack costs 4x the whole build).
    keep, kept = first_true_indices(edges["real"], -(-budget.edges // WORD) * WORD)
    lo, hi, real = edges["lo"][keep], edges["hi"][keep], edges["real"][keep] & kept  # empty slots: unlisted
    y0, height, member = band_membership(lo, hi, real, BAND_MARGIN, budget.bands)  # (G, E)
    order, listed = first_true_indices(member, budget.band)  # (G, K)
    # Rows 0 and G + 1 list nothing; each row is gathered once from the uncompacted edges (a
    # gather of a gather, fused, recomputes the inner one per element).
    source = jnp.pad(keep[order], ((1, 1), (0, 0)))
    listed = jnp.pad(listed, ((1, 1), (0, 0)))[..., None]
    word = edges["poly"] // WORD
    bit = jnp.left_shift(jnp.uint32(1), (edges["poly"] % WORD).astype(jnp.uint32))
    onehot_word = jnp.arange(num_words(p), dtype=jnp.int32) == word[:, None]  # (P V, W)
    edge_bits = jax.lax.bitcast_convert_type(jnp.where(onehot_word, bit[:, None], jnp.uint32(0)), jnp.float32)
    per_edge = jnp.concatenate([jnp.stack([edges[k] for k in ("ax", "ay", "by", "inv")], -1), edge_bits], -1)
    rows = jnp.where(listed, per_edge[source], 0.0)  # (G + 2, K, 4 + W); 0.0 is also the bits' zero
    return BandTable(y0=y0, inv_height=1.0 / height, rows=rows)


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
    """The smallest ``step * k >= n`` with k in 1, 2, 3, 4, 6, 8, 12, ... (powers of two and
    1.5 times them): at most 1.5x the need, and few distinct values, so that batches and
    files of similar maps share one compilation."""
    k = max(1, int(math.ceil(n / step)))
    p = 1 << (k - 1).bit_length()  # next power of two >= k
    return step * (p * 3 // 4 if p >= 4 and p * 3 // 4 >= k else p)


def merge_budgets(budgets) -> MapBudget | None:
    """The elementwise largest of several :class:`MapBudget` (one program for all of them);
    None if any is None."""
    budgets = list(budgets)
    if not budgets or any(b is None for b in budgets):
        return None
    poly = lambda parts: PolygonBudget(max(b.edges for b in parts), max(b.band for b in parts),  # noqa: E731
                                       max(b.bands for b in parts))
    return MapBudget(drivable=poly([b.drivable for b in budgets]), lanes=poly([b.lanes for b in budgets]),
                     red_lanes=max(b.red_lanes for b in budgets), objects=max(b.objects for b in budgets))


def _max_band_count(scene: np.ndarray, lo: np.ndarray, hi: np.ndarray, per_scene: np.ndarray, num_bands: int) -> int:
    """Most real edges listed in one band of one scene, counted on the host in float64 with
    a wider margin than the device's (so never below its count).

    scene (R,) int64 ascending, lo, hi (R,) float64 (holding float32 values): the real edges
    of all scenes, compacted; per_scene (B,) int: real edges per scene.
    An edge [lo, hi] is listed by bands b with lo <= y0 + (b + 1) h + m and hi >= y0 + b h - m
    (:func:`band_membership`): a run of bands [first, last]. A band's count is then
    #(first <= b) - #(last < b): two histograms over all scenes' real edges at once (one
    ``bincount`` each) and a cumulative sum, O(R + B G) with no sort or scatter.
    """
    if scene.size == 0:
        return 0
    num_scenes = len(per_scene)
    present = per_scene > 0
    offsets = (np.cumsum(per_scene) - per_scene)[present]
    y0 = np.zeros(num_scenes)
    y1 = np.ones(num_scenes)  # a scene without real edges: unit extent (it lists nothing)
    y0[present] = np.minimum.reduceat(lo, offsets)  # exact: min of float32 values
    y1[present] = np.maximum.reduceat(hi, offsets)
    height = np.maximum(y1 - y0, 1e-3) / num_bands
    h, base = height[scene], y0[scene]
    first = np.ceil((lo - base - _HOST_MARGIN * h) / h - 1.0 - 1e-9)
    last = np.floor((hi - base + _HOST_MARGIN * h) / h + 1e-9)
    first, last = np.clip(first, 0, num_bands).astype(np.int64), np.clip(last, -1, num_bands - 1).astype(np.int64)
    listed = first <= last
    row = scene[listed] * (num_bands + 1)
    size = num_scenes * (num_bands + 1)
    starts = np.bincount(row + first[listed], minlength=size)
    ends = np.bincount(row + last[listed] + 1, minlength=size)
    counts = np.cumsum((starts - ends).reshape(num_scenes, num_bands + 1)[:, :num_bands], axis=-1)
    return int(counts.max())


def polygon_budget(vertices: np.ndarray, valid: np.ndarray, num_bands: int = NUM_BANDS) -> PolygonBudget:
    """Capacities for polygons (B..., P, V, 2) of concrete scenes cut into ``num_bands``
    bands, rounded up (edges to 16, band rows to 4) so that similar maps reuse one
    compilation."""
    v = np.asarray(vertices, np.float32)
    ok = np.asarray(valid, bool)
    p, n = v.shape[-3], v.shape[-2]
    y = v[..., 1].reshape((-1, p, n))
    y_next = np.concatenate([y[..., 1:], y[..., :1]], axis=-1)  # each ring's next vertex
    real = (y_next != y) & ok.reshape((-1, p))[..., None]
    flat = np.flatnonzero(real)  # only real edges are counted: compact them once
    scene = flat // (p * n)
    ya, yb = y.reshape(-1)[flat].astype(np.float64), y_next.reshape(-1)[flat].astype(np.float64)
    per_scene = np.bincount(scene, minlength=len(y))
    count = _max_band_count(scene, np.minimum(ya, yb), np.maximum(ya, yb), per_scene, num_bands)
    return PolygonBudget(edges=min(_round_up(int(per_scene.max(initial=0)), 16), p * n),
                         band=min(_round_up(count, 4), p * n),
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
                     # at least 2 (an all-false pair when no lane is ever red): batches with
                     # and without red lights then share one compilation
                     red_lanes=min(_round_up(red_lanes, 2), red.shape[-1]),
                     objects=min(_round_up(objects, 8), n_objects))
