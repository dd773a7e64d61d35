"""The Qwen2.5-VL vision tower in flax.nnx: patch embedding, 2-D rotary, window attention with
full-attention blocks, SwiGLU blocks with biases, and the 2 x 2 patch merger.

Layout. Patches stay in the image processor's order (image by image, frame by frame, in
m x m merge blocks), padded to a bucketed count, for every matmul. Attention gathers them
into groups built on the host from `grid_thw` (:meth:`VisionBatch.build`): windows of
window_units x window_units merged tokens (``Wt`` patch slots, empty slots at partial
windows masked) for the window blocks, whole frames for the full-attention blocks; the
result is gathered back to processor order. That is transformers' computation (it reorders
tokens by window index and attends within each window / frame; attention within a group
does not depend on the order of its tokens), with static shapes: the patch, window, frame
and frame-length counts are bucketed (:func:`bucket`, at most 25 % padding), so one compiled
program serves every batch of images that fits. The merged tokens come out in processor
order, which is the order of the `<|image_pad|>` tokens in the prompts.

Shapes: N patches (bucketed), P patch values (1176), G windows of Wt slots, R frames of F
slots, C vision width, Dv vision head dim, U = N / m**2 merged tokens, H the language
model's width.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, NamedTuple, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_drive.models.qwen2_5_vl.config import VisionConfig
from jax_drive.models.layers import apply_rope, attention, linear, rms_norm
from jax_drive.models.transformer import StackedBlocks, StackedLinear, swiglu_mlp

VISION_PROJECTIONS = ("qkv", "proj", "gate_proj", "up_proj", "down_proj")


def bucket(n: int, multiple: int = 1) -> int:
    """n rounded up to a multiple of a quarter of the largest power of two <= n (and of
    ``multiple``): 576 -> 640, 1152 -> 1280; at most 25 % padding, few distinct sizes."""
    n = max(int(n), 1)
    step = max(multiple, (1 << (n.bit_length() - 1)) // 4)
    step = -(-step // multiple) * multiple
    return -(-n // step) * step


class VisionSizes(NamedTuple):
    """Static sizes of a VisionBatch: patches (N), windows (G), frames (R), frame_length (F)."""

    patches: int
    windows: int
    frames: int
    frame_length: int


# --------------------------------------------------------------------------- host layout
@flax.struct.dataclass
class VisionBatch:
    """Device inputs of the vision tower for a batch of images (a pytree of arrays).

    Attributes:
      patches: (N, P) pixel patches in processor order, zero rows after the real ones.
      patch_hw: (N, 2) int32 (row, column) of each patch on its image's patch grid.
      window_index: (G, Wt) int32 patch of each window slot; N marks an empty slot.
      window_slot: (N,) int32 flat (G * Wt) slot of each patch.
      frame_index: (R, F) int32 patch of each frame slot; N marks an empty slot.
      frame_slot: (N,) int32 flat (R * F) slot of each patch.
      token_valid: (U,) bool, True for the real merged tokens (a prefix).
    """

    patches: jax.Array
    patch_hw: jax.Array
    window_index: jax.Array
    window_slot: jax.Array
    frame_index: jax.Array
    frame_slot: jax.Array
    token_valid: jax.Array

    @property
    def sizes(self) -> VisionSizes:
        return VisionSizes(self.patches.shape[0], self.window_index.shape[0],
                           self.frame_index.shape[0], self.frame_index.shape[1])

    @staticmethod
    def sizes_for(image_grid_thw, config: VisionConfig) -> VisionSizes:
        """The default (bucketed) sizes for images of these grids."""
        grid = np.asarray(image_grid_thw, np.int64).reshape(-1, 3)
        m, wu = config.spatial_merge_size, config.window_units
        windows = sum(int(t) * math.ceil(h / m / wu) * math.ceil(w / m / wu) for t, h, w in grid)
        return VisionSizes(patches=bucket(int(np.sum(np.prod(grid, axis=1))), config.merge_unit),
                           windows=bucket(windows), frames=bucket(int(np.sum(grid[:, 0]))),
                           frame_length=bucket(int(np.max(grid[:, 1] * grid[:, 2])), 16))

    @staticmethod
    def build(pixel_values, image_grid_thw, config: VisionConfig,
              sizes: VisionSizes | None = None) -> "VisionBatch":
        """Lays out preprocessed images (host side, numpy).

        Args:
          pixel_values: (n, P) patches as produced by the image processor (images
            concatenated, each in merge-block order), any float dtype.
          image_grid_thw: (I, 3) ints (frames, patch rows, patch columns) per image.
          config: the vision tower config.
          sizes: static sizes (default: :meth:`sizes_for`); ValueError when too small.
        Returns:
          A VisionBatch (numpy leaves; float32 patches).
        """
        grid = np.asarray(image_grid_thw, np.int64).reshape(-1, 3)
        pixels = np.asarray(pixel_values)
        m, wu, wt = config.spatial_merge_size, config.window_units, config.window_tokens
        if grid.shape[0] == 0:
            raise ValueError("VisionBatch.build needs at least one image")
        if np.any(grid <= 0) or np.any(grid[:, 1:] % m):
            raise ValueError(f"image_grid_thw rows must be positive with h, w multiples of "
                             f"{m}, got {grid.tolist()}")
        n = int(np.sum(np.prod(grid, axis=1)))
        if pixels.ndim != 2 or pixels.shape != (n, config.patch_dim):
            raise ValueError(f"pixel_values must be ({n}, {config.patch_dim}) for grids "
                             f"{grid.tolist()}, got {pixels.shape}")
        need = VisionBatch.sizes_for(grid, config)
        sizes = need if sizes is None else VisionSizes(*sizes)
        if any(s < r for s, r in zip(sizes, need)) or sizes.patches % config.merge_unit:
            too_small = [f for f, s, r in zip(VisionSizes._fields, sizes, need) if s < r]
            raise ValueError(f"sizes {tuple(sizes)} too small for these images "
                             f"({', '.join(too_small) or 'patches not a multiple of m*m'})")
        big_n, big_g, big_r, big_f = sizes
        patch_hw = np.zeros((big_n, 2), np.int32)
        window_index = np.full((big_g, wt), big_n, np.int32)
        window_slot = np.zeros((big_n,), np.int32)
        frame_index = np.full((big_r, big_f), big_n, np.int32)
        frame_slot = np.zeros((big_n,), np.int32)
        mi, mj = (a.reshape(-1) for a in np.meshgrid(np.arange(m), np.arange(m), indexing="ij"))
        offset = window = frame = 0
        for t, h, w in grid:
            hm, wm = h // m, w // m
            uh, uw = (a.reshape(-1) for a in np.meshgrid(np.arange(hm), np.arange(wm),
                                                          indexing="ij"))  # processor order
            nww = math.ceil(wm / wu)
            unit_window = (uh // wu) * nww + uw // wu
            unit_slot = (uh % wu) * wu + (uw % wu)
            rows = (uh[:, None] * m + mi[None]).reshape(-1)
            cols = (uw[:, None] * m + mj[None]).reshape(-1)
            win = np.repeat(unit_window, m * m)
            slot = (unit_slot[:, None] * m * m + (mi * m + mj)[None]).reshape(-1)
            for _ in range(t):
                idx = offset + np.arange(h * w)
                patch_hw[idx, 0], patch_hw[idx, 1] = rows, cols
                window_index[window + win, slot] = idx
                window_slot[idx] = (window + win) * wt + slot
                frame_index[frame, :h * w] = idx
                frame_slot[idx] = frame * big_f + np.arange(h * w)
                offset += h * w
                window += math.ceil(hm / wu) * nww
                frame += 1
        patches = np.zeros((big_n, config.patch_dim), np.float32)
        patches[:n] = pixels
        token_valid = np.arange(big_n // config.merge_unit) < n // config.merge_unit
        return VisionBatch(patches=patches, patch_hw=patch_hw, window_index=window_index,
                           window_slot=window_slot, frame_index=frame_index,
                           frame_slot=frame_slot, token_valid=token_valid)


    @staticmethod
    def empty(config: VisionConfig, sizes: VisionSizes) -> "VisionBatch":
        """A layout of the given sizes holding no image (every slot empty, no real token)."""
        big_n, big_g, big_r, big_f = sizes
        return VisionBatch(patches=np.zeros((big_n, config.patch_dim), np.float32),
                           patch_hw=np.zeros((big_n, 2), np.int32),
                           window_index=np.full((big_g, config.window_tokens), big_n, np.int32),
                           window_slot=np.zeros((big_n,), np.int32),
                           frame_index=np.full((big_r, big_f), big_n, np.int32),
                           frame_slot=np.zeros((big_n,), np.int32),
                           token_valid=np.zeros((big_n // config.merge_unit,), bool))

    @staticmethod
    def build_rows(images_per_row: Sequence[Sequence[tuple[np.ndarray, np.ndarray]]],
                   config: VisionConfig, sizes: VisionSizes | None = None) -> "VisionBatch":
        """One layout per row (host side): row b's images alone, in reading order, so its k-th
        merged token fills its k-th `<|image_pad|>`; every leaf leads with the row axis B, so
        a training batch splits into mini-batches by rows. Rows without images get an empty
        layout.

        Args:
          images_per_row: B sequences of (pixel_values (n, P), grid_thw (3,)) pairs.
          sizes: common static sizes (default: the largest of the rows' bucketed sizes).
        """
        rows = [concat_images(row) if row else None for row in images_per_row]
        grids = [grid for row in rows if row is not None for grid in [row[1]]]
        if not grids:
            raise ValueError("VisionBatch.build_rows needs at least one image")
        if sizes is None:
            sizes = VisionSizes(*(max(s) for s in zip(*(VisionBatch.sizes_for(g, config) for g in grids))))
        built = [VisionBatch.empty(config, sizes) if row is None
                 else VisionBatch.build(row[0], row[1], config, sizes) for row in rows]
        return jax.tree.map(lambda *leaves: np.stack(leaves), *built)


def num_image_tokens(image_grid_thw, config: VisionConfig) -> np.ndarray:
    """(I,) merged tokens (= `<|image_pad|>` tokens) of each image: t * h * w / m**2."""
    grid = np.asarray(image_grid_thw, np.int64).reshape(-1, 3)
    return np.prod(grid, axis=1) // config.merge_unit


# --------------------------------------------------------------------------- math
def vision_rope_tables(config: VisionConfig, patch_hw: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos, sin (S, Dv) float32 for patch (row, col) positions (S, 2): the first quarter of
    the frequencies rotates by the row, the second by the column, both halves repeat them."""
    quarter = config.head_dim // 2
    inv = 1.0 / (config.rope_theta ** (jnp.arange(0, quarter, 2, dtype=jnp.float32) / quarter))
    angles = patch_hw.astype(jnp.float32)[..., None] * inv  # (S, 2, Dv/4)
    angles = angles.reshape(angles.shape[0], -1)  # (S, Dv/2): rows then cols
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def _rope_f32(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x (B, L, N, Dv) rotated in float32 (as the reference does), back in x's dtype."""
    return apply_rope(x.astype(jnp.float32), cos, sin).astype(x.dtype)


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, index: jax.Array,
                      slot: jax.Array) -> jax.Array:
    """Attention within groups of tokens. q, k, v (N, Nh, Dv); index (G, L) token of each
    group slot (N: empty, masked as a key); slot (N,) flat group slot of each token.
    Returns (N, Nh * Dv) in processor order."""
    n = q.shape[0]
    pad = lambda x: jnp.concatenate([x, jnp.zeros((1,) + x.shape[1:], x.dtype)])  # noqa: E731
    g, l = index.shape
    mask = jnp.broadcast_to((index < n)[:, None, :], (g, l, l))
    out = attention(pad(q)[index], pad(k)[index], pad(v)[index], mask)  # (G, L, Nh Dv)
    return out.reshape(g * l, -1)[slot]


def vision_forward(params: dict[str, Any], config: VisionConfig, batch: VisionBatch) -> jax.Array:
    """Merged image tokens (U, H) in processor order (real ones: ``batch.token_valid``).

    params: `VisionTower.arrays()`. Pure; jit it (or call it under a jit).
    """
    c = config
    n = batch.patches.shape[0]
    nh, dv = c.num_heads, c.head_dim
    kernel = params["patch_embed"]
    x = batch.patches.astype(kernel.dtype) @ kernel  # (N, C)
    cos, sin = vision_rope_tables(c, batch.patch_hw)
    full = np.zeros((c.depth,), bool)
    full[list(c.fullatt_block_indexes)] = True

    def block(h, xs):
        lp, is_full = xs
        y = rms_norm(h, lp["norm1"], c.rms_norm_eps)
        qkv = linear(y, lp["qkv"]).reshape(n, 3, nh, dv)
        q = _rope_f32(qkv[None, :, 0], cos[None], sin[None])[0]
        k = _rope_f32(qkv[None, :, 1], cos[None], sin[None])[0]
        v = qkv[:, 2]
        att = jax.lax.cond(is_full,
                           lambda: grouped_attention(q, k, v, batch.frame_index, batch.frame_slot),
                           lambda: grouped_attention(q, k, v, batch.window_index,
                                                     batch.window_slot))
        h = h + linear(att, lp["proj"])
        return h + swiglu_mlp(lp, rms_norm(h, lp["norm2"], c.rms_norm_eps)), None

    x, _ = jax.lax.scan(block, x, (params["blocks"], jnp.asarray(full)))
    mp = params["merger"]
    y = rms_norm(x, mp["norm"], c.rms_norm_eps).reshape(n // c.merge_unit, -1)
    y = jax.nn.gelu(linear(y, mp["fc1"]), approximate=False)
    return linear(y, mp["fc2"])  # (U, H)


vision_forward_jit = partial(jax.jit, static_argnames=("config",))(vision_forward)


# --------------------------------------------------------------------------- module
class VisionBlocks(StackedBlocks):
    """All vision blocks, weights stacked along the block axis (NV = depth)."""

    projection_names = VISION_PROJECTIONS
    norm_names = ("norm1", "norm2")

    def __init__(self, config: VisionConfig, dtype, rngs: nnx.Rngs):
        n, c, f = config.depth, config.hidden_size, config.intermediate_size
        self.qkv = StackedLinear(n, c, 3 * c, True, dtype, rngs)
        self.proj = StackedLinear(n, c, c, True, dtype, rngs)
        self.gate_proj = StackedLinear(n, c, f, True, dtype, rngs)
        self.up_proj = StackedLinear(n, c, f, True, dtype, rngs)
        self.down_proj = StackedLinear(n, f, c, True, dtype, rngs)
        self.norm1 = nnx.Param(jnp.ones((n, c), dtype))
        self.norm2 = nnx.Param(jnp.ones((n, c), dtype))


class Dense(nnx.Module):
    """One affine map: kernel (in, out) and bias (out,)."""

    def __init__(self, in_features: int, out_features: int, dtype, rngs: nnx.Rngs):
        init = jax.nn.initializers.normal(0.02)
        self.kernel = nnx.Param(
            init(rngs.params(), (in_features, out_features), jnp.float32).astype(dtype))
        self.bias = nnx.Param(jnp.zeros((out_features,), dtype))

    def arrays(self) -> dict[str, Any]:
        return {"kernel": self.kernel[...], "bias": self.bias[...]}


class VisionTower(nnx.Module):
    """Qwen2.5-VL vision encoder: `tower(batch)` -> merged tokens (U, H); see `vision_forward`."""

    def __init__(self, config: VisionConfig, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        if not isinstance(config, VisionConfig):
            raise TypeError(f"config must be a VisionConfig, got {type(config).__name__}")
        rngs = nnx.Rngs(0) if rngs is None else rngs
        self.config = config
        c, merged = config.hidden_size, config.hidden_size * config.merge_unit
        init = jax.nn.initializers.normal(0.02)
        self.patch_embed = nnx.Param(
            init(rngs.params(), (config.patch_dim, c), jnp.float32).astype(dtype))
        self.blocks = VisionBlocks(config, dtype, rngs)
        self.merger_norm = nnx.Param(jnp.ones((c,), dtype))
        self.merger_fc1 = Dense(merged, merged, dtype, rngs)
        self.merger_fc2 = Dense(merged, config.out_hidden_size, dtype, rngs)

    def arrays(self) -> dict[str, Any]:
        return {
            "patch_embed": self.patch_embed[...],
            "blocks": self.blocks.arrays(),
            "merger": {"norm": self.merger_norm[...], "fc1": self.merger_fc1.arrays(),
                       "fc2": self.merger_fc2.arrays()},
        }

    def __call__(self, batch: VisionBatch) -> jax.Array:
        """(U, H) merged tokens in processor order; rows past ``batch.token_valid`` are padding."""
        return vision_forward_jit(self.arrays(), self.config, batch)


def concat_images(images: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """[(pixel_values (n_i, P), grid_thw (3,) or (k, 3)), ...] -> (pixel_values, grid_thw (I, 3))."""
    if not images:
        raise ValueError("no images")
    pixels = np.concatenate([np.asarray(p) for p, _ in images], axis=0)
    grid = np.concatenate([np.asarray(g, np.int64).reshape(-1, 3) for _, g in images], axis=0)
    return pixels, grid
