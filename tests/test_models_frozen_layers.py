"""``ModelConfig.frozen_layers``: the first k blocks of the cache-free forward get no gradient.

Against the unfrozen model on the same weights (tiny Llama, 3 layers, non-zero LoRA B,
left-padded batch): token log-probs equal; LoRA gradients of the frozen blocks are exactly
zero and those of the other blocks equal the unfrozen gradients (the forward is the same, and
a block's gradient only depends on what follows it); with remat on as well."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_drive.models import CausalLM, LoRAParam, ModelConfig, positions_from_mask
from jax_drive.models.lora import apply_lora


def _model():
    model = CausalLM(ModelConfig.tiny("llama", vocab_size=96, num_layers=3), rngs=nnx.Rngs(4))
    apply_lora(model, rank=2, alpha=4.0, rngs=nnx.Rngs(5))
    for proj in (model.layers.q_proj, model.layers.down_proj):
        proj.lora_b[...] = 0.3 * jax.random.normal(jax.random.key(6), proj.lora_b.shape)
    return model


def _batch():
    ids = jax.random.randint(jax.random.key(1), (2, 12), 0, 96)
    mask = jnp.ones((2, 12), bool).at[1, :4].set(False)
    return ids, positions_from_mask(mask), mask, jnp.roll(ids, -1, axis=1)


def _logp_and_grads(model, frozen: int, remat: bool):
    model.config = dataclasses.replace(model.config, frozen_layers=frozen, remat_layers=remat)
    graphdef, params, rest = nnx.split(model, LoRAParam, ...)
    ids, pos, mask, targets = _batch()

    def loss(p):
        logp = nnx.merge(graphdef, p, rest).token_logprobs(ids, pos, mask, targets, chunk_size=8)
        return -jnp.sum(logp * mask), logp

    (_, logp), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return np.asarray(logp), grads


@pytest.mark.parametrize("remat", [False, True])
def test_frozen_layers_cut_gradients_below_and_keep_them_above(remat):
    model = _model()
    logp_full, grads_full = _logp_and_grads(model, 0, remat)
    logp, grads = _logp_and_grads(model, 2, remat)
    np.testing.assert_allclose(logp, logp_full, atol=1e-6)
    full = dict(jax.tree_util.tree_leaves_with_path(grads_full))
    checked = 0
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        g, want = np.asarray(g), np.asarray(full[path])
        assert np.all(g[:2] == 0), jax.tree_util.keystr(path)
        np.testing.assert_allclose(g[2:], want[2:], rtol=1e-5, atol=1e-7)
        checked += int(np.any(want[2:] != 0))
    assert checked >= 2  # the top block's adapters did get a gradient


def test_all_layers_frozen_and_bad_values():
    model = _model()
    _, grads = _logp_and_grads(model, 3, False)
    assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves(grads))
    with pytest.raises(ValueError):
        ModelConfig.tiny("llama", num_layers=2, frozen_layers=3)
