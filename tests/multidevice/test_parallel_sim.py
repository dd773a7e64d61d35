"""Simulator episodes split over 8 devices.

Each device runs the single-device program on its own episodes: the sharded batch equals,
bit for bit, the single-device batch run on each device's episodes separately, and it
equals the whole single-device batch within 1e-5 (XLA:CPU compiles the physics slightly
differently for 8 episodes than for 2: a few heading / steering values differ by 1 ulp
between those two single-device runs already).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_drive import parallel
from jax_drive.sim import core, scenarios as S
from jax_drive.sim.state import SimConfig

CFG = SimConfig()
MESH = parallel.MeshConfig(data=4, fsdp=2)


def _episodes(count: int):
    keys = [jax.random.key(k) for k in range(count)]
    names = ["tv_highway_merge", "ic_chaos", "tv_red_light", "lc_highway_change"]
    scs = [S.build(names[i % len(names)], k, accident_prone=i % 2 == 0, background=True)
           for i, k in enumerate(keys)]
    return jnp.stack(keys), jax.tree.map(lambda *x: jnp.stack(x), *scs)


@pytest.fixture(scope="module")
def episodes():
    """(keys, scenarios) of 8 episodes, built once for the module."""
    return _episodes(8)


def _steps(keys, batch, go, decisions: int = 3):
    st = core.batched_reset(CFG, keys, batch)
    for _ in range(decisions):
        st = core.batched_step(CFG, batch, st, go)
    return st


def _assert_trees(actual, expected, atol=0.0):
    for a, e in zip(jax.tree.leaves(jax.device_get(actual)), jax.tree.leaves(jax.device_get(expected))):
        if atol:
            np.testing.assert_allclose(a, e, rtol=0, atol=atol)
        else:
            np.testing.assert_array_equal(a, e)


def test_sharded_steps_run_each_devices_episodes_like_one_device(episodes):
    mesh = parallel.make_mesh(MESH)
    keys, batch = episodes
    go = core.go_action(CFG, batch)
    sharded = _steps(*parallel.shard_batch((keys, batch, go), mesh))
    assert parallel.is_sharded(sharded.x, parallel.DATA) and parallel.is_sharded(sharded.x, parallel.FSDP)
    per_device = [_steps(*jax.tree.map(lambda x: x[i:i + 2], (keys, batch, go))) for i in range(0, 8, 2)]
    _assert_trees(sharded, jax.tree.map(lambda *x: np.concatenate(x), *jax.device_get(per_device)))
    _assert_trees(sharded, _steps(keys, batch, go), atol=1e-5)


def test_sharded_rollout_pads_and_cuts_the_episode_batch(episodes):
    mesh = parallel.make_mesh(MESH)
    keys, batch = jax.tree.map(lambda x: x[:6], episodes)  # padded to 8 over the devices, cut back to 6
    go = core.go_action(CFG, batch)
    acts = jax.tree.map(lambda v: jnp.stack([v] * 4, axis=1), go)  # (E, D, ...)
    rollout = jax.jit(lambda sc, st, a: core.batched_rollout(CFG, sc, st, a))
    args = (batch, core.batched_reset(CFG, keys, batch), acts)
    sharded = parallel.call_on_rows(rollout, args, mesh)
    assert sharded.x.shape[0] == 6
    plain = rollout(*args)
    _assert_trees(sharded, plain, atol=1e-5)  # integer fields (events, steps): exactly
