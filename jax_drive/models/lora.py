"""Low-rank adapters (LoRA) on the attention and MLP projections of `CausalLM`.

For a projection y = x W (W: (in, out)) LoRA adds  (x A) B * alpha / r  with
A: (in, r) initialised like PEFT (uniform in +-1/sqrt(in)) and B: (r, out) zeros, so a fresh
adapter leaves the model unchanged. A and B are `LoRAParam`s (an `nnx.Param` subclass):
`nnx.state(model, LoRAParam)` selects only them, `nnx.grad(..., argnums=nnx.DiffState(0,
LoRAParam))` differentiates only them; the base weights stay frozen.

Adapters are stored in float32 whatever the model dtype; they are cast to the compute dtype
in the forward pass. Merging into bfloat16 weights rounds (unmerge is then not exact).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jax_drive.models.layers import low_rank_update
from jax_drive.models.transformer import PROJECTIONS, CausalLM, LoRAParam, StackedLinear

DEFAULT_TARGETS = PROJECTIONS


def _check_model(model) -> None:
    if not isinstance(model, CausalLM):
        raise TypeError(f"expected a CausalLM, got {type(model).__name__}")


def apply_lora(model: CausalLM, rank: int, alpha: float,
               targets: Sequence[str] = DEFAULT_TARGETS, rngs: nnx.Rngs | None = None) -> CausalLM:
    """Adds fresh LoRA adapters (in place) to the named projections; returns the model.

    Args:
      model: the CausalLM (must not already have adapters).
      rank: adapter rank r > 0.
      alpha: LoRA alpha; the update is scaled by alpha / r.
      targets: subset of ('q_proj','k_proj','v_proj','o_proj','gate_proj','up_proj','down_proj').
      rngs: randomness for A's initialisation (default nnx.Rngs(0)).
    """
    _check_model(model)
    add_adapters(model.layers, targets, PROJECTIONS, rank, alpha, rngs)
    return model


def add_adapters(stack: nnx.Module, targets: Sequence[str], allowed: Sequence[str], rank: int, alpha: float,
                 rngs: nnx.Rngs | None = None) -> None:
    """Fresh adapters (in place) on the named `StackedLinear` attributes of ``stack`` (names
    from ``allowed``); see :func:`apply_lora`. Raises ValueError for a bad rank, an unknown
    name or a projection that already has an adapter."""
    if int(rank) <= 0:
        raise ValueError(f"rank must be positive, got {rank}")
    targets = tuple(targets)
    unknown = [t for t in targets if t not in allowed]
    if unknown or not targets:
        raise ValueError(f"unknown LoRA targets {unknown}; choose from {tuple(allowed)}")
    rngs = nnx.Rngs(0) if rngs is None else rngs
    for name in targets:
        _add_adapter(getattr(stack, name), rank, alpha, rngs, name)


def _add_adapter(proj: StackedLinear, rank: int, alpha: float, rngs: nnx.Rngs, name: str) -> None:
    """A fresh adapter on one stacked projection: A (NL, in, r) uniform in +-1/sqrt(in) (PEFT),
    B (NL, r, out) zeros, scale alpha / r."""
    if proj.lora_a is not None:
        raise ValueError(f"{name} already has a LoRA adapter")
    n, fan_in, fan_out = proj.kernel.shape
    bound = 1.0 / fan_in**0.5
    a = jax.random.uniform(rngs.params(), (n, fan_in, rank), jnp.float32, -bound, bound)
    proj.lora_a = LoRAParam(a)
    proj.lora_b = LoRAParam(jnp.zeros((n, rank, fan_out), jnp.float32))
    proj.lora_scale = float(alpha) / float(rank)
    proj.lora_rank = int(rank)
    proj.lora_alpha = float(alpha)
    proj.lora_merged = False


def lora_projections(model: CausalLM) -> dict[str, StackedLinear]:
    """name -> projection for every projection that carries an adapter."""
    _check_model(model)
    return {
        name: getattr(model.layers, name)
        for name in PROJECTIONS
        if getattr(model.layers, name).lora_a is not None
    }


def lora_delta(proj: StackedLinear) -> jax.Array:
    """(NL, in, out) float32 update A @ B * alpha / r of one projection."""
    return low_rank_update(proj.lora_a[...], proj.lora_b[...], proj.lora_scale)


def merge_lora(model: CausalLM) -> CausalLM:
    """Folds every (unmerged) adapter into its base kernel; the adapter is then skipped."""
    for proj in lora_projections(model).values():
        if not proj.lora_merged:
            kernel = proj.kernel[...]
            proj.kernel.set_value((kernel.astype(jnp.float32) + lora_delta(proj)).astype(kernel.dtype))
            proj.lora_merged = True
    return model


def unmerge_lora(model: CausalLM) -> CausalLM:
    """Subtracts merged adapters from the base kernels again (exact only in float32 up to
    rounding)."""
    for proj in lora_projections(model).values():
        if proj.lora_merged:
            kernel = proj.kernel[...]
            proj.kernel.set_value((kernel.astype(jnp.float32) - lora_delta(proj)).astype(kernel.dtype))
            proj.lora_merged = False
    return model


def remove_lora(model: CausalLM, merge: bool = False) -> CausalLM:
    """Drops the adapters (folding them in first when merge=True)."""
    if merge:
        merge_lora(model)
    else:
        unmerge_lora(model)
    for proj in lora_projections(model).values():
        proj.lora_a = None
        proj.lora_b = None
        proj.lora_scale = 0.0
        proj.lora_merged = False
    return model



__all__ = [
    "DEFAULT_TARGETS",
    "LoRAParam",
    "add_adapters",
    "apply_lora",
    "lora_delta",
    "lora_projections",
    "merge_lora",
    "remove_lora",
    "unmerge_lora",
]
