"""Optimiser plumbing shared by the SFT and mtGRPO trainers.

The nnx model is split once into ``(graphdef, params, rest)``: ``params`` is the trainable
state (only ``LoRAParam`` adapters for LoRA, every ``nnx.Param`` for full fine-tuning) and
``rest`` everything else (frozen base weights). Jitted steps are pure functions of
``(params, rest, opt_state, batch)``; ``nnx.merge`` rebuilds the model inside the trace. After
training, :func:`write_back` puts the trained params into the live model object (which the
sampler holds).

The update is ``clip_by_global_norm(max_grad_norm)`` followed by AdamW with a constant
learning rate (MTDrive: 1e-6 for RL, 4e-5 for SFT).

With a device mesh (``jax_drive.parallel``), the step is data-parallel over the batch rows and
FSDP over the parameters: ``params``, ``rest``, the optimiser state and the gradients are
constrained to their FSDP split (by shape) and the batch to its row split, and XLA inserts
the weight gathers and gradient reduce-scatters.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jax_drive.models import LoRAParam
from jax_drive.parallel import constrain_batch, constrain_params, replicated


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW + global-norm clipping.

    Attributes:
      learning_rate: constant lr (MTDrive RL 1e-6, SFT 4e-5).
      weight_decay: AdamW decoupled weight decay (veRL / torch default 0.01).
      b1, b2, eps: Adam moments (torch defaults).
      max_grad_norm: global-norm gradient clip (veRL 1.0); None disables.
      trainable: 'lora' (only LoRAParam, needs apply_lora first) or 'full' (every nnx.Param).
      skip_nonfinite: a step with a non-finite loss or gradient drops its update and training
        goes on (as optax's ``apply_if_finite``); default False: the run stops with an error
        naming the step (:mod:`jax_drive.rl.loop`).
    """

    learning_rate: float = 1e-6
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0
    trainable: Literal["lora", "full"] = "lora"
    skip_nonfinite: bool = False

    def __post_init__(self):
        if self.trainable not in ("lora", "full"):
            raise ValueError(f"trainable must be 'lora' or 'full', got {self.trainable!r}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"learning_rate must be > 0 and finite, got {self.learning_rate}")
        for name in ("weight_decay", "b1", "b2", "eps"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {getattr(self, name)}")
        if self.max_grad_norm is not None and not (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise ValueError(f"max_grad_norm must be a finite number > 0 (or None), got {self.max_grad_norm}")


def trainable_filter(trainable: str):
    """The nnx filter selecting trainable variables: LoRAParam or nnx.Param."""
    return LoRAParam if trainable == "lora" else nnx.Param


def make_optimizer(config: OptimConfig) -> optax.GradientTransformation:
    """clip_by_global_norm -> adamw(constant lr)."""
    parts = []
    if config.max_grad_norm is not None:
        parts.append(optax.clip_by_global_norm(config.max_grad_norm))
    parts.append(optax.adamw(config.learning_rate, b1=config.b1, b2=config.b2, eps=config.eps,
                             weight_decay=config.weight_decay))
    return optax.chain(*parts)


def split_model(model: nnx.Module, trainable: str = "lora"):
    """model -> (graphdef, params, rest). Raises if nothing is trainable."""
    graphdef, params, rest = nnx.split(model, trainable_filter(trainable), ...)
    if not jax.tree.leaves(params):
        hint = " (call jax_drive.models.lora.apply_lora first)" if trainable == "lora" else ""
        raise ValueError(f"the model has no {trainable} parameters to train{hint}")
    return graphdef, params, rest


def write_back(model: nnx.Module, params) -> None:
    """Copy trained params into the live model in place."""
    nnx.update(model, params)


def copy_tree(tree):
    """A deep copy of a pytree of arrays (for frozen reference params)."""
    return jax.tree.map(lambda x: jnp.array(x, copy=True), tree)


LossFn = Callable[[nnx.Module, Any], tuple[jax.Array, dict[str, jax.Array]]]


def _shared(tree, mesh):
    """Inside a jitted function: ``tree`` (inputs every row reads, e.g. grammar tables) copied
    to every device."""
    if mesh is None or tree is None:
        return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, replicated(mesh)), tree)


def _call(fn, model, batch, shared):
    return fn(model, batch) if shared is None else fn(model, batch, shared)


def make_train_step(graphdef, loss_fn: LossFn, tx: optax.GradientTransformation, mesh=None):
    """A jitted ``step(params, rest, opt_state, batch, shared=None) -> (params, opt_state, loss,
    metrics)``.

    ``loss_fn(model, batch) -> (scalar loss, metrics dict)`` sees the merged model; gradients
    flow only into ``params``. metrics gain ``grad_norm`` (before clipping). ``mesh``: a
    ``jax_drive.parallel`` mesh (None = one device); the batch's row count must then be a
    multiple of ``parallel.batch_shards(mesh)``. ``shared``: a pytree that is not split by rows
    (e.g. grammar tables), replicated on every device and passed as
    ``loss_fn(model, batch, shared)`` when given.
    """

    def step(params, rest, opt_state, batch, shared=None):
        params, rest, opt_state = constrain_params((params, rest, opt_state), mesh)
        batch = constrain_batch(batch, mesh)
        shared = _shared(shared, mesh)

        def f(p):
            return _call(loss_fn, nnx.merge(graphdef, p, rest), batch, shared)

        (loss, metrics), grads = jax.value_and_grad(f, has_aux=True)(params)
        grads = constrain_params(grads, mesh)  # reduce-scatter, not all-reduce
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        params, opt_state = constrain_params((params, opt_state), mesh)
        metrics = dict(metrics, grad_norm=optax.tree.norm(grads))
        return params, opt_state, loss, metrics

    # no donation: params may share buffers with the live model the sampler uses
    return jax.jit(step)


def make_eval_fn(graphdef, fn: Callable[[nnx.Module, Any], Any], mesh=None):
    """A jitted ``f(params, rest, batch, shared=None) = fn(merged model, batch[, shared])`` (no
    gradient); ``mesh`` and ``shared`` as in :func:`make_train_step`."""

    def run(params, rest, batch, shared=None):
        params, rest = constrain_params((params, rest), mesh)
        return _call(fn, nnx.merge(graphdef, params, rest), constrain_batch(batch, mesh), _shared(shared, mesh))

    return jax.jit(run)


def minibatch_indices(key: jax.Array, batch_size: int, minibatch_size: int, shuffle: bool = True) -> list:
    """Split range(batch_size) into mini-batches (a random permutation when shuffle).

    The last mini-batch is dropped if incomplete (fixed shapes -> no recompiles), unless the
    batch is smaller than one mini-batch, in which case it is one mini-batch of everything.
    Returns a list of int32 index arrays.
    """
    if batch_size <= 0:
        raise ValueError("empty batch")
    order = jax.random.permutation(key, batch_size) if shuffle else jnp.arange(batch_size)
    mbs = min(minibatch_size, batch_size)
    n = batch_size // mbs
    return [order[i * mbs:(i + 1) * mbs] for i in range(n)]
