"""What the sampler (``jax_drive.sampling``) needs from a language model.

``CausalLM`` and ``Qwen2_5_VL`` satisfy these protocols (tests/test_sampling.py checks it);
another model that does can be sampled without touching the sampler. Checked with
``isinstance`` (runtime-checkable: member names only, not signatures).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import jax

from jax_drive.models.config import ModelConfig
from jax_drive.models.transformer import KVCache


@runtime_checkable
class DecoderLM(Protocol):
    """A decoder-only model the jitted sampler can prefill and decode.

    config: a frozen, hashable ``ModelConfig`` (a static argument of the decode programs);
    the sampler reads ``vocab_size``, ``max_position_embeddings``, ``jnp_dtype`` and
    ``placeholder_token_ids`` (input-only ids that are never sampled).
    """

    config: ModelConfig

    def __call__(self, input_ids: jax.Array, positions: jax.Array, attention_mask: jax.Array,
                 cache: KVCache | None = None, cache_index: jax.Array | int = 0,
                 **inputs: Any) -> tuple[jax.Array, KVCache | None]:
        """The decode step: logits (B, L, V) float32 of L new tokens written into ``cache`` at
        slots [cache_index, cache_index + L), and the updated cache."""

    def prefill(self, input_ids: jax.Array, positions: jax.Array, attention_mask: jax.Array,
                cache: KVCache, **inputs: Any) -> KVCache:
        """A prompt (B, L)'s keys / values written into slots [0, L) of an empty cache."""

    def arrays(self) -> dict[str, Any]:
        """The parameters as arrays. In the ``CausalLM`` layout (``embed``, ``layers``,
        ``final_norm``, ``lm_head``) the sampler decodes on ``unroll_params`` of them, and
        prefills shared prefixes and packed prompts with ``forward_hidden`` /
        ``packed_prompt_kv``."""


@runtime_checkable
class VisionLM(DecoderLM, Protocol):
    """A ``DecoderLM`` whose prompts may hold images (their pads already expanded); its
    config also names ``image_token_id`` (a prompt must not end inside an image)."""

    def multimodal_inputs(self, input_ids, attention_mask,
                          images: Sequence[Sequence[Any] | None] | None = None):
        """Host-side inputs of a padded prompt batch with images: positions (3, B, L) int32,
        the vision batch (passed as ``vision=`` to ``prefill``), next positions (B,)."""
