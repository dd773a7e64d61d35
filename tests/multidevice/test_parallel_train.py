"""SFT and mtGRPO steps with data parallelism and FSDP on 8 devices equal one device.

Tolerances (float32; the sharded step sums the loss and gradients in a different order):
losses and metrics rtol 1e-5 (atol 1e-7); parameters and Adam moments atol 1e-5 after 3-4 AdamW
steps at lr 1e-3, i.e. 1% of one step (Adam divides each gradient by its own running RMS, so
summation-order noise in a near-zero gradient moves its weight by more than float32 eps;
measured here: at most 3.7e-6 (SFT, 2 x 4 mesh), 2.8e-6 (SFT, fsdp 8), 6.2e-7 (mtGRPO)).
"""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from jax_drive import parallel
from jax_drive.models.tiny import tiny_policy
from jax_drive.parallel import MeshConfig
from jax_drive.data.tokens import TokenRow
from jax_drive.rl.grpo import GRPOConfig, grpo_update
from jax_drive.rl.loss import LossConfig
from jax_drive.rl.optim import OptimConfig, copy_tree, make_optimizer, split_model
from jax_drive.rl.sft import SFTConfig, sft_train

PARAM_ATOL = 1e-5
LOSS_RTOL = 1e-5


def _token_rows(count: int, seed: int = 0) -> list[TokenRow]:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        n = int(rng.integers(24, 60))
        weight = np.zeros(n, np.float32)
        weight[n // 2:] = 1.0  # the "assistant" half carries loss
        rows.append(TokenRow(rng.integers(0, 256, n).astype(np.int32), weight))
    return rows


def _assert_close_trees(actual, expected, atol):
    for (path, e), a in zip(jax.tree_util.tree_leaves_with_path(jax.device_get(expected)),
                            jax.tree.leaves(jax.device_get(actual))):
        np.testing.assert_allclose(a, e, rtol=0, atol=atol, err_msg=jax.tree_util.keystr(path))


def _fsdp_split(tree) -> int:
    """How many leaves of ``tree`` are split along the fsdp axis."""
    return sum(parallel.is_sharded(x, parallel.FSDP) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("mesh", [MeshConfig(data=2, fsdp=4), MeshConfig(fsdp=8)], ids=["2x4", "fsdp8"])
def test_sft_full_finetuning_sharded_equals_one_device(mesh):
    config = SFTConfig(optim=OptimConfig(learning_rate=1e-3, trainable="full"), batch_size=8, max_steps=3,
                       bucket_size=16, max_length=128)
    rows = _token_rows(20)
    plain_model = tiny_policy(seed=0, lora_rank=None)[0]
    sharded_model = tiny_policy(seed=0, lora_rank=None)[0]
    plain = sft_train(plain_model, rows, config, progress=False, pad_id=0)
    sharded = sft_train(sharded_model, rows, dataclasses.replace(config, mesh=mesh), progress=False, pad_id=0)

    np.testing.assert_allclose([h["loss"] for h in sharded.history], [h["loss"] for h in plain.history],
                               rtol=LOSS_RTOL, atol=1e-7)
    _assert_close_trees(sharded.state.params, plain.state.params, PARAM_ATOL)
    _assert_close_trees(sharded.state.opt_state, plain.state.opt_state, PARAM_ATOL)
    # FSDP really shards: the big weights, their Adam moments and the live model's arrays.
    params = jax.tree.leaves(sharded.state.params)
    assert _fsdp_split(sharded.state.params) >= len([p for p in params if p.ndim >= 2]) - 1
    assert _fsdp_split(sharded.state.opt_state) == 2 * _fsdp_split(sharded.state.params)
    assert _fsdp_split(nnx.state(sharded_model)) == _fsdp_split(sharded.state.params)
    _assert_close_trees(nnx.state(sharded_model, nnx.Param), nnx.state(plain_model, nnx.Param), PARAM_ATOL)


def _grpo_batch(rows: int, length: int, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 256, (rows, length + 1)).astype(np.int32)
    lengths = rng.integers(length // 2, length + 1, rows)
    real = np.arange(length + 1)[None] < lengths[:, None]
    loss_mask = (real[:, 1:] & (np.arange(length)[None] >= length // 3)).astype(np.float32)
    advantages = np.repeat(rng.normal(size=(rows, 1)), length, axis=1).astype(np.float32) * loss_mask
    return {"input_ids": ids[:, :-1], "targets": ids[:, 1:], "attention_mask": real[:, :-1],
            "positions": np.maximum(np.cumsum(real[:, :-1], axis=1) - 1, 0).astype(np.int32),
            "loss_mask": loss_mask, "old_logp": np.zeros((rows, length), np.float32),
            "advantages": advantages, "turn_id": np.where(loss_mask > 0, 0, -1).astype(np.int32)}


def test_grpo_update_lora_sharded_equals_one_device():
    """mu = 2 epochs x 2 mini-batches of the clipped loss + K3 KL, LoRA adapters trained, the
    frozen base weights FSDP-sharded too."""
    config = GRPOConfig(optim=OptimConfig(learning_rate=1e-3), loss=LossConfig(kl_coef=0.05), minibatch_size=8,
                        ppo_epochs=2, chunk_size=64)
    batch = _grpo_batch(16, 48)
    key = jax.random.key(3)
    results = []
    for mesh in (MeshConfig(), MeshConfig(data=2, fsdp=4)):
        model = tiny_policy(seed=0, lora_rank=4)[0]
        parallel.shard_model(model, parallel.make_mesh(mesh))
        graphdef, params, rest = split_model(model, "lora")
        opt_state = parallel.shard_params(make_optimizer(config.optim).init(params), parallel.make_mesh(mesh))
        # a reference that differs from the start point, so the KL term is not zero
        ref = jax.tree.map(lambda x: x + 0.01, copy_tree(params))
        results.append((grpo_update(graphdef, params, rest, opt_state, ref, batch,
                                    dataclasses.replace(config, mesh=mesh), key), rest))
    (p1, o1, m1), _ = results[0]
    (p8, o8, m8), rest8 = results[1]
    assert m1["optimizer_steps"] == m8["optimizer_steps"] == 4
    for name in ("loss", "pg_loss", "kl", "grad_norm", "clip_frac", "ratio_mean"):
        np.testing.assert_allclose(m8[name], m1[name], rtol=LOSS_RTOL, atol=1e-7, err_msg=name)
    assert m1["kl"] > 0
    _assert_close_trees(p8, p1, PARAM_ATOL)
    _assert_close_trees(o8, o1, PARAM_ATOL)
    assert _fsdp_split(p8) > 0 and _fsdp_split(rest8) > 0


def test_trainer_step_rejects_rows_that_do_not_split():
    config = GRPOConfig(minibatch_size=8, mesh=MeshConfig(data=8))
    model = tiny_policy(seed=0, lora_rank=4)[0]
    graphdef, params, rest = split_model(model, "lora")
    with pytest.raises(ValueError, match="multiple of 8"):
        grpo_update(graphdef, params, rest, make_optimizer(config.optim).init(params), None,
                    _grpo_batch(12, 16), dataclasses.replace(config, loss=LossConfig(kl_coef=0.0)), jax.random.key(0))


def test_paper_preset_trains_on_every_device():
    from jax_drive.pipelines.mtdrive.presets import PRESETS

    paper = PRESETS["paper"]
    for mesh_config in (paper.sft.mesh, paper.rl.mesh):
        mesh = parallel.make_mesh(mesh_config)
        assert mesh is not None and parallel.batch_shards(mesh) == len(jax.devices()) == 8
    assert paper.rl.minibatch_size % 8 == 0 and paper.sft.batch_size % 8 == 0
