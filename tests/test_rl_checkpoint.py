"""Checkpoints: round trip of the run state, and resume == uninterrupted run on a tiny model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_drive.rl.checkpoint import Checkpointer, RunState
from jax_drive.rl.logging import read_jsonl
from jax_drive.rl.optim import OptimConfig, make_optimizer, split_model
from jax_drive.rl.sft import SFTConfig, sft_train
from jax_drive.models.tiny import byte_tokenizer, tiny_policy

DATA = [
    [{"role": "user", "content": f"plan {i}"}, {"role": "assistant", "content": f"[PT, (+{i}.0, 0.0, 0.0)]"}]
    for i in range(6)
]


def _model(seed=0):
    return tiny_policy(seed, lora_rank=None)[0]


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_run_state_round_trip(tmp_path):
    model = _model()
    _, params, _ = split_model(model, "full")
    tx = make_optimizer(OptimConfig(learning_rate=1e-3))
    opt_state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    _, opt_state = jax.jit(tx.update)(grads, opt_state, params)
    key = jax.random.split(jax.random.key(7))[1]
    state = RunState(params=params, opt_state=opt_state, rng=key, step=5, data_position=11)
    ckpt = Checkpointer(tmp_path / "ck")
    ckpt.save(state, extra={"note": "x"})
    # a fresh target of the same structure (different values) is filled from disk
    _, params2, _ = split_model(_model(1), "full")
    target = RunState(params=params2, opt_state=tx.init(params2), rng=jax.random.key(0))
    restored, meta = ckpt.restore(target)
    assert restored.step == 5 and restored.data_position == 11 and meta["extra"] == {"note": "x"}
    for a, b in zip(_leaves(state.params) + _leaves(state.opt_state), _leaves(restored.params) + _leaves(restored.opt_state)):
        np.testing.assert_array_equal(a, b)
    assert jax.tree.structure(restored.opt_state) == jax.tree.structure(opt_state)
    np.testing.assert_array_equal(jax.random.key_data(restored.rng), jax.random.key_data(key))
    np.testing.assert_array_equal(jax.random.normal(restored.rng, (3,)), jax.random.normal(key, (3,)))
    ckpt.close()
    with pytest.raises(FileNotFoundError):
        Checkpointer(tmp_path / "empty").restore(target)


def test_sft_resume_matches_uninterrupted(tmp_path):
    tok = byte_tokenizer()
    base = dict(optim=OptimConfig(learning_rate=1e-2, trainable="full", weight_decay=0.0), batch_size=2, bucket_size=64, seed=3)
    # uninterrupted: 6 steps (two epochs of 3 batches, so the data order crosses an epoch)
    straight_model = _model()
    straight = sft_train(straight_model, DATA, SFTConfig(max_steps=6, **base), tokenizer=tok,
                         out_dir=tmp_path / "a", progress=False)
    # interrupted after 3 steps, then a fresh process-like start with resume=True
    sft_train(_model(), DATA, SFTConfig(max_steps=3, checkpoint_every=3, **base), tokenizer=tok,
              out_dir=tmp_path / "b", progress=False)
    resumed_model = _model()
    resumed = sft_train(resumed_model, DATA, SFTConfig(max_steps=6, **base), tokenizer=tok,
                        out_dir=tmp_path / "b", resume=True, progress=False)
    assert [r["step"] for r in resumed.history] == [4, 5, 6]
    a = [r["loss"] for r in straight.history]
    b = [r["loss"] for r in read_jsonl(tmp_path / "b" / "metrics.jsonl")]
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    for x, y in zip(_leaves(nnx.state(straight_model, nnx.Param)), _leaves(nnx.state(resumed_model, nnx.Param))):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    # and training did move the weights (the comparison above is not vacuous)
    moved = [np.abs(x - y).max() for x, y in zip(_leaves(nnx.state(_model(), nnx.Param)),
                                                  _leaves(nnx.state(straight_model, nnx.Param)))]
    assert max(moved) > 1e-3
