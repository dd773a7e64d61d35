"""The one training loop (jax_drive.rl.loop): checkpoints, the non-finite guard and its skip mode,
on a scripted step and on a real SFT run whose loss is NaN."""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_drive.rl.checkpoint import Checkpointer, RunState, committed_steps
from jax_drive.rl.loop import LoopConfig, NonFiniteError, StepOutcome, first_nonfinite, open_checkpointer, train_loop


class Holder(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.zeros(3))


def _scripted(losses):
    """A step that adds 1 to the params and reports ``losses[step]``."""

    def step(state: RunState) -> StepOutcome:
        loss = losses[state.step]
        params = jax.tree.map(lambda x: x + 1.0, state.params)
        after = dataclasses.replace(state, params=params, step=state.step + 1, data_position=state.data_position + 1)
        return StepOutcome(after, {"loss": loss}, finite={"loss": loss})

    return step


def _start():
    model = Holder()
    _, params = nnx.split(model, nnx.Param)
    return model, RunState(params=params, opt_state={"m": jnp.zeros(3)}, rng=jax.random.key(0))


def test_first_nonfinite():
    assert first_nonfinite({"loss": 1.0, "grad_norm": 2.0}) is None
    assert first_nonfinite({"loss": 1.0, "grad_norm": float("inf")}) == ("grad_norm", math.inf)
    name, value = first_nonfinite({"loss": float("nan")})
    assert name == "loss" and math.isnan(value)


def test_a_nan_step_stops_the_run_after_checkpointing_the_last_finite_state(tmp_path):
    model, state = _start()
    config = LoopConfig("sft", total_steps=5, checkpoint_every=10)  # no step checkpoint before the NaN
    with pytest.raises(NonFiniteError, match=r"sft step 3: loss is nan .*checkpoint 2 in .*resume"):
        train_loop(model, state, _scripted([1.0, 0.5, float("nan"), 0.2, 0.1]), config,
                   ckpt=open_checkpointer(tmp_path, "sft"), out_dir=tmp_path, progress=False)
    assert committed_steps(os.path.join(tmp_path, "checkpoints")) == [2]  # the last finite state, never 3
    ckpt = Checkpointer(os.path.join(tmp_path, "checkpoints"))
    restored, meta = ckpt.restore(state)
    ckpt.close()
    np.testing.assert_array_equal(np.asarray(jax.tree.leaves(restored.params)[0]), np.full(3, 2.0))
    assert meta["step"] == 2


def test_skip_mode_drops_the_nan_update_and_goes_on(tmp_path):
    model, state = _start()
    config = LoopConfig("sft", total_steps=4, skip_nonfinite=True)
    result = train_loop(model, state, _scripted([1.0, float("inf"), 0.5, 0.25]), config,
                        ckpt=open_checkpointer(tmp_path, "sft"), out_dir=tmp_path, progress=False)
    assert result.state.step == 4 and result.state.data_position == 4
    # three updates of +1 kept, the infinite one dropped; the live model holds the result
    np.testing.assert_array_equal(np.asarray(model.w[...]), np.full(3, 3.0))
    assert [r.get("skipped_nonfinite", 0.0) for r in result.history] == [0.0, 1.0, 0.0, 0.0]


def test_a_real_sft_run_with_a_nan_loss_stops_with_the_step_and_quantity(tmp_path):
    from jax_drive.models.tiny import tiny_policy
    from jax_drive.rl.optim import OptimConfig
    from jax_drive.rl.sft import SFTConfig, sft_train

    model, _, tok = tiny_policy(seed=0, lora_rank=2)
    # a frozen base weight goes bad: the trained adapters stay finite, the loss does not
    model.layers.q_proj.kernel.set_value(jnp.full_like(model.layers.q_proj.kernel[...], jnp.nan))
    data = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]] * 2
    config = SFTConfig(optim=OptimConfig(learning_rate=1e-3), batch_size=2, max_steps=3, bucket_size=16,
                       max_length=64, checkpoint_every=1)
    with pytest.raises(NonFiniteError, match=r"sft step 1: (loss|grad_norm) is nan"):
        sft_train(model, data, config, tokenizer=tok, out_dir=tmp_path, progress=False)
    assert committed_steps(os.path.join(tmp_path, "checkpoints")) == [0]  # the initial adapters, finite
