"""Multimodal rotary positions (M-RoPE) of Qwen2.5-VL.

Each token has three positions (temporal, height, width). Text tokens use the same value on
all three, counting up by one per token. The merged tokens of an image starting at position
s get t = s + frame, h = s + row, w = s + column on the merged grid, and the text after the
image restarts at s + max(rows, columns) (the image's largest position + 1). The rotary
frequencies of a head are split in `mrope_section` groups, rotated by t, h and w in turn.

With equal t / h / w the rotation is exactly the 1-D RoPE of a text model, so prompts
without images, and every decoded token, use the plain (B, L) positions of the text path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.models.qwen2_5_vl.config import VLMConfig
from jax_drive.models.layers import rope_inv_freq, rope_tables


def mrope_positions(input_ids, attention_mask, image_grid_thw, config: VLMConfig):
    """M-RoPE positions of a left- or right-padded batch (host side, numpy).

    Args:
      input_ids: (B, L) ints with each image already expanded to its `<|image_pad|>` tokens.
      attention_mask: (B, L) bool, True for real tokens.
      image_grid_thw: (I, 3) patch grids of the images in reading order (row by row), or
        None / empty when there are no images.
      config: the model config (special ids, merge size).
    Returns:
      positions (3, B, L) int32 (0 at padding) and next_position (B,) int32: the position of
      the token that would follow each row (its largest position + 1).
    Raises:
      ValueError when the image tokens do not match the grids.
    """
    ids = np.asarray(input_ids)
    mask = np.asarray(attention_mask, bool)
    if ids.ndim != 2 or mask.shape != ids.shape:
        raise ValueError(f"input_ids {ids.shape} and attention_mask {mask.shape} must be (B, L)")
    m = config.vision.spatial_merge_size
    grids = [] if image_grid_thw is None else [
        tuple(int(v) for v in g) for g in np.asarray(image_grid_thw).reshape(-1, 3)]
    next_image = 0
    positions = np.zeros((3,) + ids.shape, np.int64)
    next_position = np.zeros((ids.shape[0],), np.int64)
    for b in range(ids.shape[0]):
        cols = np.flatnonzero(mask[b])
        is_image = ids[b, cols] == config.image_token_id
        row = np.zeros((3, cols.size), np.int64)
        cursor, i = 0, 0
        while i < cols.size:
            if not is_image[i]:
                j = i + int(np.argmax(is_image[i:])) if is_image[i:].any() else cols.size
                row[:, i:j] = cursor + np.arange(j - i)
                cursor += j - i
                i = j
                continue
            if next_image >= len(grids):
                raise ValueError(f"row {b} has more image tokens than the {len(grids)} grids")
            t, h, w = grids[next_image]
            next_image += 1
            hm, wm = h // m, w // m
            n = t * hm * wm
            if i + n > cols.size or not is_image[i:i + n].all():
                raise ValueError(f"image {next_image - 1} of grid {(t, h, w)} needs {n} "
                                 f"consecutive image tokens in row {b}")
            tt, hh, ww = np.meshgrid(np.arange(t), np.arange(hm), np.arange(wm), indexing="ij")
            row[:, i:i + n] = cursor + np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)])
            cursor += max(hm, wm)
            i += n
        positions[:, b, cols] = row
        next_position[b] = row.max() + 1 if cols.size else 0
    if next_image != len(grids):
        raise ValueError(f"{len(grids)} image grids but only {next_image} images in the tokens")
    return positions.astype(np.int32), next_position.astype(np.int32)


def mrope_tables(config: VLMConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos, sin (B, L, D) float32 for M-RoPE positions (3, B, L), or for text positions (B, L)
    (then identical to the text model's :func:`rope_tables`)."""
    if positions.ndim == 2:
        return rope_tables(config, positions)
    if positions.ndim != 3 or positions.shape[0] != 3:
        raise ValueError(f"M-RoPE positions must be (3, B, L) or (B, L), got {positions.shape}")
    axis = np.repeat(np.arange(3), config.mrope_section)  # (D/2,) which position rotates each
    chosen = jnp.moveaxis(positions[axis], 0, -1)  # (B, L, D/2)
    angles = chosen.astype(jnp.float32) * rope_inv_freq(config)
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)
