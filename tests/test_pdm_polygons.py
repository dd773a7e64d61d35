"""Band-table point-in-polygon tests, the scorer's budgets, and the curvature solve.

The band lookup must agree with the brute-force even-odd test (the same edge tests on the
same edges) for every point not within float rounding of an edge, including points on the
horizontal lines through vertices (the half-open straddle rule) and points on and
next to band boundaries (where the band index may round either way), and with shapely away
from boundaries.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import shapely

from jax_drive.pdm import PDMConfig
from jax_drive.pdm import scorer as scorer_mod
from jax_drive.pdm.polygons import (
    BAND_MARGIN,
    NUM_BANDS,
    PolygonBudget,
    _edges,
    band_membership,
    build_band_table,
    first_true_indices,
    inside_bits,
    inside_bits_brute,
    map_budget,
    pack_bits,
    polygon_budget,
)
from jax_drive.pdm.tracker import solve_path_laplacian_system
from jax_drive.scenes import generate_scenes


def _random_polygons(rng, count: int, max_vertices: int):
    """Star-shaped simple polygons, padded by repeating the first vertex (as the scene model)."""
    verts = np.zeros((count, max_vertices, 2), np.float32)
    for p in range(count):
        n = int(rng.integers(3, max_vertices + 1))
        ang = np.sort(rng.uniform(0, 2 * np.pi, n))
        rad = rng.uniform(2.0, 10.0, n)
        centre = rng.uniform(-20, 20, 2)
        ring = centre + np.stack([rad * np.cos(ang), rad * np.sin(ang)], -1)
        verts[p, :n] = ring
        verts[p, n:] = ring[0]
    return verts


def _bits_to_bool(bits: np.ndarray, count: int) -> np.ndarray:
    words = np.asarray(bits, np.uint64)
    idx = np.arange(count)
    return ((words[..., idx // 32] >> (idx % 32).astype(np.uint64)) & 1).astype(bool)


@pytest.mark.parametrize("count, bands", [(5, 16), (40, NUM_BANDS)])  # 40 polygons need two bit words
def test_band_lookup_equals_brute_and_shapely(count, bands):
    rng = np.random.default_rng(count)
    verts = _random_polygons(rng, count, 12)
    valid = rng.uniform(size=count) < 0.8
    pts = rng.uniform(-32, 32, (3000, 2)).astype(np.float32)
    # Points exactly on vertices, on horizontal lines through vertices, and on edge midpoints.
    on_vertex = verts[:, :5].reshape(-1, 2)
    same_y = np.stack([rng.uniform(-32, 32, len(on_vertex)), on_vertex[:, 1]], -1)
    mid = ((verts[:, :4] + verts[:, 1:5]) / 2).reshape(-1, 2)
    budget = polygon_budget(verts[None], valid[None], bands)
    table = build_band_table(jnp.asarray(verts), jnp.asarray(valid), budget)
    assert table.rows.shape[0] == bands + 2
    # Ordinates on every band boundary and one float step either side of it.
    edges_y = np.float32(table.y0) + np.arange(bands + 1, dtype=np.float32) / np.float32(table.inv_height)
    near = np.concatenate([edges_y, np.nextafter(edges_y, -np.inf), np.nextafter(edges_y, np.inf)])
    on_bands = np.stack([rng.uniform(-32, 32, len(near)), near], -1)
    pts = np.concatenate([pts, on_vertex, same_y, mid, on_bands]).astype(np.float32)
    fast = np.asarray(jax.jit(inside_bits)(jnp.asarray(pts), table))
    brute = np.asarray(inside_bits_brute(jnp.asarray(pts), jnp.asarray(verts), jnp.asarray(valid)))
    # Exactly on an edge the x-crossing test is decided by rounding, which depends on how
    # the compiler fuses the multiply-add; everywhere else the two must agree exactly.
    polys = [shapely.Polygon(v) for v in verts]
    points = shapely.points(pts.astype(np.float64))
    edge_dist = np.stack([shapely.distance(points, p.exterior) for p in polys], -1)  # (n, P)
    off_edge = edge_dist.min(-1) > 1e-4
    assert off_edge[3000:].sum() >= len(same_y) // 2  # the same-y points stay in the check
    np.testing.assert_array_equal(fast[off_edge], brute[off_edge])

    # Away from boundaries, both agree with shapely.
    inside = _bits_to_bool(fast, count)
    want = np.stack([shapely.contains_xy(p, pts[:, 0], pts[:, 1]) for p in polys], -1) & valid
    clear = edge_dist > 1e-3
    np.testing.assert_array_equal(inside[clear], want[clear])
    assert want[clear].any() and not want[clear].all()


def test_budget_covers_every_band_and_too_small_budget_loses_edges():
    rng = np.random.default_rng(3)
    verts = _random_polygons(rng, 8, 10)
    valid = np.ones(8, bool)
    budget = polygon_budget(verts[None], valid[None])
    real = np.sum(np.roll(verts, -1, axis=1)[..., 1] != verts[..., 1])
    assert budget.edges >= real and budget.edges % 16 == 0
    pts = jnp.asarray(rng.uniform(-30, 30, (2000, 2)), jnp.float32)
    brute = np.asarray(inside_bits_brute(pts, jnp.asarray(verts), jnp.asarray(valid)))
    ok = inside_bits(pts, build_band_table(jnp.asarray(verts), jnp.asarray(valid), budget))
    np.testing.assert_array_equal(np.asarray(ok), brute)
    # The check can fail: a band capacity of 1 drops crossings and changes answers.
    tiny = inside_bits(pts, build_band_table(jnp.asarray(verts), jnp.asarray(valid), PolygonBudget(budget.edges, 1)))
    assert not np.array_equal(np.asarray(tiny), brute)


def test_pack_bits():
    flags = np.zeros((2, 35), bool)
    flags[0, [0, 5, 31]] = True
    flags[1, [32, 34]] = True
    bits = np.asarray(pack_bits(jnp.asarray(flags)))
    assert bits.dtype == np.uint32 and bits.shape == (2, 2)
    assert bits[0, 0] == (1 | 1 << 5 | 1 << 31) and bits[0, 1] == 0
    assert bits[1, 0] == 0 and bits[1, 1] == (1 | 1 << 2)


@pytest.mark.parametrize("n, k", [(1, 1), (20, 5), (31, 40), (32, 32), (33, 7), (100, 100), (176, 28)])
def test_first_true_indices_lists_the_first_k_true_entries_in_order(n, k):
    rng = np.random.default_rng(n * 100 + k)
    mask = rng.uniform(size=(64, n)) < rng.choice([0.0, 0.05, 0.3, 0.9, 1.0], size=(64, 1))
    index, listed = jax.jit(first_true_indices, static_argnums=1)(jnp.asarray(mask), k)
    assert index.shape == listed.shape == (64, k) and index.dtype == jnp.int32
    for row, idx, ok in zip(mask, np.asarray(index), np.asarray(listed)):
        want = np.flatnonzero(row)[:k]
        np.testing.assert_array_equal(ok, np.arange(k) < len(want))
        np.testing.assert_array_equal(idx[: len(want)], want)
        assert np.all(idx[len(want):] == 0)


def test_polygon_budget_never_below_the_device_band_count():
    """Scenes of different extents in one batch (one without any valid polygon, one with
    horizontal edges only in part): the host's capacities hold every scene's tables."""
    rng = np.random.default_rng(7)
    verts = np.stack([_random_polygons(rng, 6, 9) * s for s in (1.0, 0.2, 5.0, 1.0)])
    verts[3, :, :, 1] = np.round(verts[3, :, :, 1] / 4) * 4  # many horizontal (unreal) edges
    valid = rng.uniform(size=(4, 6)) < 0.8
    valid[1] = False
    for bands in (4, 16, NUM_BANDS):
        budget = polygon_budget(verts, valid, bands)
        e = jax.vmap(_edges)(jnp.asarray(verts), jnp.asarray(valid))
        real = np.asarray(e["real"])
        _, _, member = band_membership(e["lo"], e["hi"], e["real"], BAND_MARGIN, bands)
        assert budget.edges >= real.sum(-1).max()
        assert budget.band >= np.asarray(member).sum(-1).max()
        assert budget.band - np.asarray(member).sum(-1).max() < 4 + 2  # rounding up to 4, margin-wide extras
        # any leading batch shape: the same scenes as a (2, 2) batch
        assert polygon_budget(verts.reshape((2, 2) + verts.shape[1:]), valid.reshape(2, 2, -1), bands) == budget


def test_map_budget_concrete_and_traced():
    scenes = generate_scenes(jax.random.PRNGKey(5), 6)
    budget = map_budget(scenes)
    assert budget is not None
    assert budget.objects <= scenes.agents.valid.shape[-2]
    seen = []
    jax.jit(lambda s: seen.append(map_budget(s)) or 0)(scenes)
    assert seen == [None]  # traced scenes fall back to the brute-force path


def test_scorer_same_result_with_and_without_budget():
    """The budgeted path (band tables, kept objects, kept red lanes) is exact."""
    scenes = generate_scenes(jax.random.PRNGKey(11), 12)
    rng = np.random.default_rng(0)
    expert = np.asarray(scenes.expert)
    props = expert[:, None] + rng.normal(0, 1.0, (12, 6, 8, 3)) * np.array([1.0, 1.0, 0.05])
    t = np.arange(1, 41) * 0.1
    ref = np.stack([np.stack([np.interp(t, np.r_[0, np.arange(1, 9) * 0.5], np.r_[0, e[:, c]])
                              for c in range(3)], -1) for e in expert])
    cfg = PDMConfig()
    args = (scenes, jnp.asarray(props, jnp.float32), jnp.asarray(ref, jnp.float32), cfg)
    budget = map_budget(scenes, num_trajectories=7)  # what score_proposals uses for 6 proposals
    assert budget.lanes.bands < NUM_BANDS
    with_budget = scorer_mod._score_proposals_jit(*args, budget)
    brute = scorer_mod._score_proposals_jit(*args, None)
    for name in ("nc", "dac", "ttc", "ep", "pdms", "tlc", "ddc", "lk", "epdms"):
        np.testing.assert_array_equal(np.asarray(getattr(with_budget, name)), np.asarray(getattr(brute, name)),
                                      err_msg=name)
    for name in ("nc_object", "ttc_object", "dac_point", "nc_box"):
        np.testing.assert_array_equal(np.asarray(getattr(with_budget.violations, name)),
                                      np.asarray(getattr(brute.violations, name)), err_msg=name)
    assert np.any(np.asarray(brute.nc) < 1) or np.any(np.asarray(brute.ttc) < 1)  # collisions exercised


def test_path_laplacian_solve_matches_numpy_and_standing_still_is_zero():
    rng = np.random.default_rng(0)
    m, lam = 40, 1.0
    w = rng.uniform(0.0, 1.5, (5, m))
    neighbours = np.full(m, 2.0)
    neighbours[[0, -1]] = 1.0
    diag = w * w + lam * neighbours
    diag[:, 0] += 1e-10
    rhs = rng.normal(0, 0.05, (5, m)) * w
    got = np.asarray(solve_path_laplacian_system(jnp.asarray(diag, jnp.float32), jnp.asarray(rhs, jnp.float32), lam))
    for b in range(5):
        mat = np.diag(diag[b]) - lam * (np.eye(m, k=1) + np.eye(m, k=-1))
        np.testing.assert_allclose(got[b], np.linalg.solve(mat, rhs[b]), atol=2e-5, rtol=1e-3)
    # A standing ego: the float32 system is singular; the answer must be 0, not NaN.
    still = np.asarray(solve_path_laplacian_system(jnp.asarray(lam * neighbours + 0.0, jnp.float32)[None],
                                                   jnp.zeros((1, m), jnp.float32), lam))
    assert np.all(still == 0.0)
