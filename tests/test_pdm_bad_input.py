"""Bad input at the scorer boundary and defined scores for degenerate scenes."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_drive.pdm import PDMConfig, score_candidates, score_proposals
from pdm_scenes import moving_agent, road_scene, straight_poses

CFG = PDMConfig()
REF = straight_poses(8.0, num=40, dt=0.1)


def _props():
    return np.stack([straight_poses(8.0), straight_poses(8.0, accel=1.0), straight_poses(8.0, lateral=0.5),
                     straight_poses(6.0)])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_proposals_raise(bad):
    props = _props()
    props[2, 3, 1] = bad
    with pytest.raises(ValueError, match="NaN or inf"):
        score_proposals(road_scene([], speed=8.0), props, REF, CFG)


def test_non_finite_reference_raises():
    ref = REF.copy()
    ref[5, 0] = np.nan
    with pytest.raises(ValueError, match="reference"):
        score_proposals(road_scene([], speed=8.0), _props(), ref, CFG)


@pytest.mark.parametrize("shape", [(4, 7, 3), (4, 8, 2), (8, 3), (2, 4, 8, 3)])
def test_wrong_proposal_shapes_raise(shape):
    with pytest.raises(ValueError, match="proposals must have shape"):
        score_proposals(road_scene([], speed=8.0), np.zeros(shape, np.float32), REF, CFG)


def test_wrong_reference_shape_raises():
    with pytest.raises(ValueError, match="reference must have shape"):
        score_proposals(road_scene([], speed=8.0), _props(), REF[:8], CFG)


def test_wrong_candidate_shape_raises():
    with pytest.raises(ValueError, match="candidates must have shape"):
        score_candidates(road_scene([], speed=8.0), _props(), CFG)


def test_scene_type_checked():
    with pytest.raises(TypeError, match="Scene"):
        score_proposals({"not": "a scene"}, _props(), REF, CFG)


def test_unchecked_non_finite_scores_zero_and_is_flagged():
    cfg = dataclasses.replace(CFG, check_finite=False)
    props = _props()
    props[1, 0, 0] = np.nan
    props[3, 7, 2] = np.inf
    scene = road_scene([moving_agent(40.0, 0.0, vx=8.0)], speed=8.0)
    r = score_proposals(scene, props, REF, cfg)
    finite = np.asarray(r.finite)
    assert finite.tolist() == [True, False, True, False]
    for name in ("pdms", "epdms", "nc", "dac", "ep", "ttc", "comfort", "progress"):
        vals = np.asarray(getattr(r, name))
        assert np.all(np.isfinite(vals)), name
        assert np.all(vals[~finite] == 0.0), name
    assert float(r.pdms[0]) > 0.9
    assert not np.any(np.asarray(r.violations.nc_point)[~finite])
    # The good proposals score exactly as without the bad ones.
    clean = score_proposals(scene, np.stack([props[0], props[0], props[2], props[2]]), REF, CFG)
    assert float(r.pdms[0]) == pytest.approx(float(clean.pdms[0]), abs=1e-6)
    assert float(r.pdms[2]) == pytest.approx(float(clean.pdms[2]), abs=1e-6)


def test_unchecked_inside_jit():
    cfg = dataclasses.replace(CFG, check_finite=False)
    scene = road_scene([], speed=8.0)

    @jax.jit
    def run(sc, p):
        return score_proposals(sc, p, jnp.asarray(REF), cfg).pdms

    props = _props()
    props[0, 0, 0] = np.nan
    out = np.asarray(run(scene, jnp.asarray(props)))
    assert out[0] == 0.0 and np.all(out[1:] > 0.5)


def test_scene_without_agents_has_full_nc_and_ttc():
    scene = road_scene([], speed=8.0)
    r = score_proposals(scene, _props(), REF, CFG)
    assert np.all(np.asarray(r.nc) == 1.0) and np.all(np.asarray(r.ttc) == 1.0)
    assert np.all(np.asarray(r.violations.nc_object) == -1)


def test_degenerate_route_defined_scores():
    scene = road_scene([], speed=8.0)
    scene = scene.replace(route=scene.route.replace(valid=jnp.zeros_like(scene.route.valid)))
    r = score_proposals(scene, _props(), REF, CFG)
    assert np.all(np.asarray(r.progress) == 0.0)
    # Both progresses are 0 <= 5 m: EP = 1 where NC * DAC > 0; LK sees no deviation.
    assert np.all(np.asarray(r.ep) == 1.0)
    assert np.all(np.asarray(r.lk) == 1.0)
    assert np.all(np.isfinite(np.asarray(r.pdms)))
