"""Qwen2.5-VL in flax.nnx: a `CausalLM` (the Qwen2 language model) with a vision tower whose
merged image tokens replace the `<|image_pad|>` embeddings, and M-RoPE positions.

`Qwen2_5_VL` *is a* `CausalLM`: LoRA (`apply_lora` on the language model), the KV cache, the
sampler's decode loop and the trainers' `token_logprobs` work on it unchanged. What it adds:

* every entry point accepts ``vision=`` (a :class:`VisionBatch`; or ``pixel_values=`` plus
  ``image_grid_thw=`` as processor outputs, laid out on the host) and positions either (B, L)
  (text only) or (3, B, L) (M-RoPE, from :func:`mrope_positions`);
* :meth:`Qwen2_5_VL.multimodal_inputs` turns a padded prompt batch and its images into those
  two inputs (what a sampler's prefill needs); decoding then continues with ordinary (B,)
  text positions starting at each row's ``next_position``, because equal t / h / w
  positions rotate exactly like 1-D RoPE.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_drive.models.qwen2_5_vl.config import VLMConfig
from jax_drive.models.qwen2_5_vl.mrope import mrope_positions, mrope_tables
from jax_drive.models.qwen2_5_vl.vision import (VisionBatch, VisionSizes, VisionTower,
                                                concat_images, num_image_tokens, vision_forward)
from jax_drive.models.layers import KVCache, rms_norm
from jax_drive.models.transformer import CausalLM, check_logprob_args, decoder_blocks, head_token_logprobs, lm_logits


def scatter_image_tokens(embeds: jax.Array, input_ids: jax.Array, image_tokens: jax.Array,
                         image_token_id: int) -> jax.Array:
    """Replaces the embeddings of image-pad tokens, in reading order, by image tokens.

    embeds (B, L, H); input_ids (B, L); image_tokens (U, H) (the k-th pad token of the
    flattened batch takes row k). Returns (B, L, H).
    """
    b, l, h = embeds.shape
    is_image = (input_ids == image_token_id).reshape(-1)
    index = jnp.clip(jnp.cumsum(is_image.astype(jnp.int32)) - 1, 0, image_tokens.shape[0] - 1)
    picked = jnp.take(image_tokens.astype(embeds.dtype), index, axis=0)
    return jnp.where(is_image[:, None], picked, embeds.reshape(-1, h)).reshape(b, l, h)


def image_pairs(images: Sequence[Any] | None) -> list[tuple[Any, Any]]:
    """(pixel_values, grid_thw) of each processed image (an object with those attributes, or
    a pair already)."""
    return [(im.pixel_values, im.grid_thw) if hasattr(im, "pixel_values") else tuple(im)
            for im in (images or ())]


def embed_inputs(params: dict[str, Any], config: VLMConfig, input_ids: jax.Array,
                 vision: VisionBatch | None) -> jax.Array:
    """Token embeddings (B, L, H) with the image tokens of ``vision`` scattered in.

    vision: the images of the whole batch in reading order (`VisionBatch.build`), or one
    layout per row (`VisionBatch.build_rows`, leaves leading with B).
    """
    x = jnp.take(params["embed"], input_ids.astype(jnp.int32), axis=0)
    if vision is None:
        return x
    image_id = config.image_token_id
    if vision.patches.ndim == 3:  # per row
        tokens = jax.vmap(vision_forward, in_axes=(None, None, 0))(params["visual"], config.vision, vision)
        return jax.vmap(lambda e, i, t: scatter_image_tokens(e[None], i[None], t, image_id)[0])(
            x, input_ids, tokens)
    tokens = vision_forward(params["visual"], config.vision, vision)
    return scatter_image_tokens(x, input_ids, tokens, image_id)


@partial(jax.jit, static_argnames=("config", "empty_cache"))
def vlm_forward_hidden(params: dict[str, Any], config: VLMConfig, input_ids: jax.Array,
                       positions: jax.Array, attention_mask: jax.Array, cache: KVCache | None,
                       cache_index: jax.Array, vision: VisionBatch | None = None,
                       empty_cache: bool = False):
    """Final normed hidden states (B, L, H) and the updated cache.

    params: `Qwen2_5_VL.arrays()`; positions (B, L) or (3, B, L); empty_cache: see
    `transformer.decoder_blocks`.
    """
    x = embed_inputs(params, config, input_ids, vision)
    cos, sin = mrope_tables(config, positions)
    x, cache = decoder_blocks(config, params["layers"], x, cos, sin,
                              attention_mask.astype(bool), cache, cache_index, empty_cache)
    return rms_norm(x, params["final_norm"], config.rms_norm_eps), cache


@partial(jax.jit, static_argnames=("config",))
def vlm_forward_logits(params, config: VLMConfig, input_ids, positions, attention_mask, cache,
                       cache_index, vision=None):
    """(logits (B, L, V) float32, cache or None)."""
    hidden, cache = vlm_forward_hidden(params, config, input_ids, positions, attention_mask,
                                       cache, cache_index, vision)
    return lm_logits(params, hidden), cache


@partial(jax.jit, static_argnames=("config", "chunk_size", "temperature"))
def vlm_token_logprobs(params, config: VLMConfig, input_ids, positions, attention_mask, targets,
                       vision, chunk_size: int, temperature: float = 1.0, allowed=None) -> jax.Array:
    """(B, L) log p(targets) (see `CausalLM.token_logprobs`), images included."""
    hidden, _ = vlm_forward_hidden(params, config, input_ids, positions, attention_mask, None,
                                   jnp.int32(0), vision)
    return head_token_logprobs(params, hidden, targets, chunk_size, temperature, allowed)


class Qwen2_5_VL(CausalLM):
    """Qwen2.5-VL-Instruct (Qwen2_5_VLForConditionalGeneration's numerics).

    `model(input_ids, positions, attention_mask, cache=None, cache_index=0, vision=None)`
    returns `(logits (B, L, V) float32, cache or None)`. Implements
    `jax_drive.models.protocol.VisionLM` (a `DecoderLM` with `multimodal_inputs`).
    """

    def __init__(self, config: VLMConfig, rngs: nnx.Rngs | None = None):
        if not isinstance(config, VLMConfig):
            raise TypeError(f"config must be a VLMConfig, got {type(config).__name__}")
        rngs = nnx.Rngs(0) if rngs is None else rngs
        super().__init__(config, rngs)
        self.visual = VisionTower(config.vision, config.jnp_dtype, rngs)

    # ----------------------------------------------------------------- inputs
    def arrays(self) -> dict[str, Any]:
        out = super().arrays()
        out["visual"] = self.visual.arrays()
        return out

    def _vision(self, vision, pixel_values, image_grid_thw) -> VisionBatch | None:
        if pixel_values is None and image_grid_thw is None:
            return vision
        if vision is not None:
            raise ValueError("pass either vision= or pixel_values= / image_grid_thw=, not both")
        if pixel_values is None or image_grid_thw is None:
            raise ValueError("pixel_values and image_grid_thw go together")
        return VisionBatch.build(np.asarray(pixel_values), np.asarray(image_grid_thw),
                                 self.config.vision)

    def _check(self, input_ids, positions, attention_mask, cache, cache_index):
        if positions.ndim == 3:
            if positions.shape != (3,) + tuple(input_ids.shape):
                raise ValueError(f"M-RoPE positions {positions.shape} must be (3,) + "
                                 f"input_ids {input_ids.shape}")
            positions = positions[0]
        super()._check(input_ids, positions, attention_mask, cache, cache_index)

    def multimodal_inputs(self, input_ids, attention_mask,
                          images: Sequence[Sequence[Any]] | None = None,
                          sizes: VisionSizes | None = None):
        """Host-side inputs of a padded prompt batch with images.

        Args:
          input_ids, attention_mask: (B, L) (image pads already expanded).
          images: per row, a sequence of processed images (objects with ``pixel_values``
            (n, P) and ``grid_thw`` (3,), or (pixel_values, grid_thw) pairs), in reading
            order; None or empty rows for text-only rows.
          sizes: static vision sizes (default: bucketed, see `VisionBatch.build`).
        Returns:
          positions (3, B, L) int32, vision (a VisionBatch, or None without images) and
          next_position (B,) int32 (the position of the token after each row).
        """
        batch = np.asarray(input_ids).shape[0]
        if images is not None and len(images) != batch:
            raise ValueError(f"{len(images)} image lists for {batch} rows")
        pairs = [pair for row in (images or ()) for pair in image_pairs(row)]
        pixels, grid = concat_images(pairs) if pairs else (None, None)
        positions, next_position = mrope_positions(input_ids, attention_mask, grid, self.config)
        vision = (None if grid is None
                  else VisionBatch.build(pixels, grid, self.config.vision, sizes))
        return jnp.asarray(positions), vision, jnp.asarray(next_position)

    def row_inputs(self, input_ids, attention_mask, images: Sequence[Sequence[Any]],
                   sizes: VisionSizes | None = None):
        """Host-side inputs of a (training) batch whose rows each hold their own images.

        Args:
          input_ids, attention_mask: (B, L) (image pads expanded; any padding side).
          images: B sequences of processed images (as in `multimodal_inputs`), empty for rows
            without images.
          sizes: static vision sizes per row (default: `VisionBatch.build_rows`').
        Returns:
          positions (3, B, L) int32 (M-RoPE) and a per-row VisionBatch (leaves lead with B).
        """
        batch = np.asarray(input_ids).shape[0]
        if len(images) != batch:
            raise ValueError(f"{len(images)} image lists for {batch} rows")
        rows = [image_pairs(row) for row in images]
        pairs = [pair for row in rows for pair in row]
        grid = concat_images(pairs)[1] if pairs else None
        positions, _ = mrope_positions(input_ids, attention_mask, grid, self.config)
        return positions, VisionBatch.build_rows(rows, self.config.vision, sizes)

    def num_image_tokens(self, image_grid_thw) -> np.ndarray:
        """(I,) `<|image_pad|>` tokens each image expands to."""
        return num_image_tokens(image_grid_thw, self.config.vision)

    # ----------------------------------------------------------------- forward
    def __call__(self, input_ids: jax.Array, positions: jax.Array, attention_mask: jax.Array,
                 cache: KVCache | None = None, cache_index: jax.Array | int = 0, *,
                 vision: VisionBatch | None = None, pixel_values=None, image_grid_thw=None):
        """Forward pass; see `CausalLM.__call__`. positions: (B, L) or (3, B, L) int32.

        vision: the images whose tokens fill the `<|image_pad|>` positions of input_ids (or
        pixel_values (N, P) + image_grid_thw (I, 3) from the image processor).
        """
        vision = self._vision(vision, pixel_values, image_grid_thw)
        self._check(input_ids, positions, attention_mask, cache, cache_index)
        return vlm_forward_logits(self.arrays(), self.config, input_ids, positions,
                                  attention_mask, cache, jnp.asarray(cache_index, jnp.int32),
                                  vision)

    def prefill(self, input_ids: jax.Array, positions: jax.Array, attention_mask: jax.Array,
                cache: KVCache, *, vision: VisionBatch | None = None) -> KVCache:
        """`CausalLM.prefill` with images: writes the prompt's keys / values into slots
        [0, L) of an empty cache."""
        self._check(input_ids, positions, attention_mask, cache, 0)
        _, cache = vlm_forward_hidden(self.arrays(), self.config, input_ids, positions,
                                      attention_mask, cache, jnp.int32(0), vision,
                                      empty_cache=True)
        return cache

    def hidden_states(self, input_ids, positions, attention_mask, cache=None, cache_index=0, *,
                      vision: VisionBatch | None = None):
        """Final normed hidden states (B, L, H)."""
        self._check(input_ids, positions, attention_mask, cache, cache_index)
        return vlm_forward_hidden(self.arrays(), self.config, input_ids, positions,
                                  attention_mask, cache, jnp.asarray(cache_index, jnp.int32),
                                  vision)[0]

    def image_features(self, vision: VisionBatch) -> jax.Array:
        """The vision tower's merged tokens (U, H) in processor order (real: token_valid)."""
        return self.visual(vision)

    def token_logprobs(self, input_ids: jax.Array, positions: jax.Array,
                       attention_mask: jax.Array, targets: jax.Array, chunk_size: int = 256,
                       temperature: float = 1.0, allowed=None, *, vision: VisionBatch | None = None):
        """`CausalLM.token_logprobs` with images (B, L) float32."""
        check_logprob_args(input_ids, targets, chunk_size, temperature)
        self._check(input_ids, positions, attention_mask, None, 0)
        return vlm_token_logprobs(self.arrays(), self.config, input_ids, positions,
                                  attention_mask, targets, vision, int(chunk_size),
                                  float(temperature), allowed)
