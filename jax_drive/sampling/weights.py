"""The decode copy of a model's weights: ``unroll_params`` of its arrays (per-layer buffers,
LoRA folded in, q/k/v and gate/up fused), built once and kept while the weights are unchanged."""

from __future__ import annotations

import jax
from flax import nnx

from jax_drive.models.protocol import DecoderLM
from jax_drive.models.transformer import unroll_params

DECODE_PARAMS = ("embed", "layers", "final_norm", "lm_head")  # the language model's arrays


@jax.jit
def _unroll(arrays: dict) -> dict:
    return unroll_params(arrays)


def unrolled_weights(model: DecoderLM) -> dict | None:
    """``unroll_params(model.arrays())`` (a new copy of the weights), or None when the model's
    ``arrays()`` are not in the CausalLM layout (it then decodes through ``__call__``)."""
    arrays = model.arrays()
    if not isinstance(arrays, dict) or "layers" not in arrays or "embed" not in arrays:
        return None
    # the language model only (a vision tower's weights are not needed to decode)
    return _unroll({k: arrays[k] for k in DECODE_PARAMS})


class DecodeWeightCache:
    """The unrolled decode copy of one model's weights, kept while its arrays are unchanged.

    Keyed by the identity of the model's state arrays (``nnx.state``; ``arrays()`` for other
    models): the cache holds those arrays, so an id cannot be reused while the entry lives,
    and an in-place update (a trainer step assigns new arrays) makes the next ``get`` rebuild
    the copy. (Not ``arrays()`` of an nnx model: with unmerged LoRA it builds a new
    ``lora_scale`` array on every call, which would miss every time.) Owned by an engine
    (one entry).
    """

    def __init__(self) -> None:
        self._entry: tuple | None = None  # (leaf ids, leaves, weights)

    def get(self, model: DecoderLM) -> dict | None:
        """The cached (or rebuilt) ``unrolled_weights(model)``."""
        leaves = jax.tree.leaves(nnx.state(model) if isinstance(model, nnx.Module) else model.arrays())
        ids = tuple(id(x) for x in leaves)
        if self._entry is not None and self._entry[0] == ids:
            return self._entry[2]
        weights = unrolled_weights(model)
        self._entry = None if weights is None else (ids, leaves, weights)
        return weights

    def clear(self) -> None:
        """Drops the copy (frees its memory)."""
        self._entry = None
