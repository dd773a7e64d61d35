"""The PDM scorer with its scenes split over 8 devices: every score equals the single-device
call exactly, and the compiled program has no cross-device communication."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_drive import parallel
from jax_drive.pdm import PDMConfig, score_candidates, score_proposals
from jax_drive.pdm.polygons import map_budget
from jax_drive.pdm.scorer import _score_candidates_jit
from jax_drive.scenes import generate_scenes, index_scene

NUM_SCENES = 12  # not a multiple of 8: the sharded call pads and cuts the scene batch


def _trajectories(scenes, steps: int, dt: float, count: int = 8):
    """(S, count, steps, 3) constant-speed poses at 0.5 .. 1.5 x the ego speed with lateral
    offsets -2 .. 2 m: a mix of progress, comfort, lane and collision outcomes."""
    speed = jnp.linalg.norm(scenes.ego.velocity, axis=-1)  # (S,)
    t = dt * jnp.arange(1, steps + 1)
    frac = jnp.linspace(0.0, 1.0, count)
    x = speed[:, None, None] * (0.5 + frac)[None, :, None] * t
    y = jnp.broadcast_to((4.0 * frac - 2.0)[None, :, None] * t / t[-1], x.shape)
    return jnp.stack([x, y, jnp.arctan2(y, jnp.maximum(x, 1.0)) * 0.1], axis=-1)


@pytest.fixture(scope="module")
def scenes():
    return generate_scenes(jax.random.key(7), NUM_SCENES)


def _assert_same(actual, expected):
    leaves = jax.tree_util.tree_leaves_with_path(jax.device_get(expected))
    for (path, e), a in zip(leaves, jax.tree.leaves(jax.device_get(actual))):
        np.testing.assert_array_equal(a, e, err_msg=jax.tree_util.keystr(path))


def test_proposals_on_8_devices_equal_one_device_exactly(scenes):
    proposals = _trajectories(scenes, 8, 0.5)
    reference = _trajectories(scenes, 40, 0.1, count=3)[:, 1]  # ego speed, no offset
    plain = score_proposals(scenes, proposals, reference)
    sharded = score_proposals(scenes, proposals, reference, mesh=parallel.MeshConfig(data=8))
    assert sharded.pdms.shape == (NUM_SCENES, 8)
    _assert_same(sharded, plain)
    pdms = np.asarray(plain.pdms)
    assert (pdms == 0).any() and ((pdms > 0) & (pdms < 1)).any(), "the scenes should score varied outcomes"


def test_candidates_on_a_2x4_mesh_equal_one_device_exactly_without_communication(scenes):
    """Data parallelism, not a replicated program: every device runs the scorer on its own
    scenes (``parallel.on_rows``) without any all-gather / all-reduce / permutation."""
    mesh = parallel.make_mesh(parallel.MeshConfig(data=2, fsdp=4))
    first = index_scene(scenes, np.arange(8))
    candidates = _trajectories(first, 40, 0.1)
    plain = score_candidates(first, candidates)
    sharded = score_candidates(first, candidates, mesh=mesh)
    _assert_same(sharded, plain)

    args = parallel.shard_batch((first, candidates), mesh)  # the program the call above ran
    budget = map_budget(first, candidates.shape[-3])
    program = parallel.on_rows(lambda s, c: _score_candidates_jit(s, c, PDMConfig(), budget), mesh)
    compiled = program.lower(*args).compile()
    found = parallel.collective_counts(compiled.as_text())
    assert sum(found.values()) == 0, found
    out = compiled(*args)
    assert parallel.is_sharded(out.pdms, parallel.DATA) and parallel.is_sharded(out.pdms, parallel.FSDP)


def test_a_mesh_needs_a_scene_batch_dim(scenes):
    one = index_scene(scenes, 0)
    with pytest.raises(ValueError, match="batch dim"):
        score_proposals(one, _trajectories(scenes, 8, 0.5)[0], _trajectories(scenes, 40, 0.1)[0, 1],
                        mesh=parallel.MeshConfig(data=8))
