"""The Qwen2.5-VL vision tower in flax.nnx: patch embedding, 2-D rotary, window attention with
full-attention blocks, SwiGLU blocks with biases, and the 2 x 2 patch merger.

Layout. Images of different sizes are batched in a padded *window layout* built on the host
from `grid_thw` (:meth:`VisionBatch.build`): every image frame is one row of ``Wr`` windows,
every window holds ``Wt`` patch slots (window_units**2 merged tokens of m*m patches each),
slots of partial windows and of padding rows are empty. So window attention is attention
over (R * Wr, Wt) blocks and full attention over (R, Wr * Wt) rows, both plain reshapes, with
empty slots masked as keys. This is the same computation as transformers' reordering of
tokens by window index (attention within a window does not depend on the order of its tokens)
and it gives static shapes: ``R`` and ``Wr`` are bucketed, so one compiled program serves
every batch of images that fits. The merger output is gathered back into the processor's
token order (image by image, row-major over the merged grid).

Shapes: R rows (frames), Wr windows per row, Wt patch slots per window, S = R Wr Wt slots,
P patch values (1176), C vision width, Dv vision head dim, U = S / m**2 merged-token slots,
H the language model's width.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_drive.models.qwen2_5_vl.config import VisionConfig
from jax_drive.models.transformer import StackedLinear, apply_rope, attention, linear, rms_norm

VISION_PROJECTIONS = ("qkv", "proj", "gate_proj", "up_proj", "down_proj")


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


# --------------------------------------------------------------------------- host layout
@flax.struct.dataclass
class VisionBatch:
    """Device inputs of the vision tower for a batch of images (a pytree of arrays).

    Attributes:
      patches: (S, P) pixel patches in slot order (zeros in empty slots).
      patch_hw: (S, 2) int32 (row, column) of each slot's patch on its image's patch grid.
      slot_valid: (R, Wr, Wt) bool, True where a slot holds a real patch.
      token_index: (U,) int32: the k-th merged token in processor order comes from merged
        slot ``token_index[k]`` (entries past the real tokens point at slot 0).
      token_valid: (U,) bool, True for the real merged tokens (a prefix).
    """

    patches: jax.Array
    patch_hw: jax.Array
    slot_valid: jax.Array
    token_index: jax.Array
    token_valid: jax.Array

    @property
    def rows(self) -> int:
        return self.slot_valid.shape[0]

    @property
    def windows(self) -> int:
        return self.slot_valid.shape[1]

    @staticmethod
    def build(pixel_values, image_grid_thw, config: VisionConfig, rows: int | None = None,
              windows: int | None = None) -> "VisionBatch":
        """Lays out preprocessed images (host side, numpy).

        Args:
          pixel_values: (N, P) patches as produced by the image processor (images
            concatenated, each in merge-block order), any float dtype.
          image_grid_thw: (I, 3) ints (frames, patch rows, patch columns) per image.
          config: the vision tower config.
          rows, windows: bucket sizes (frames, windows per frame); default: the next
            powers of two of what the images need. Raise ValueError when too small.
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
        frames = int(np.sum(grid[:, 0]))
        need_w = max(math.ceil(h / m / wu) * math.ceil(w / m / wu) for _, h, w in grid)
        rows = _next_power_of_two(frames) if rows is None else int(rows)
        windows = _next_power_of_two(need_w) if windows is None else int(windows)
        if rows < frames or windows < need_w:
            raise ValueError(f"bucket ({rows} rows, {windows} windows) too small for "
                             f"{frames} frames needing {need_w} windows")
        slots = rows * windows * wt
        source = np.full((slots,), -1, np.int64)  # patch index feeding each slot
        patch_hw = np.zeros((slots, 2), np.int32)
        token_index = np.zeros((slots // config.merge_unit,), np.int32)
        tokens = 0
        row = 0
        offset = 0
        for t, h, w in grid:
            hm, wm = h // m, w // m
            nww = math.ceil(wm / wu)  # windows per window-row of this image
            uh, uw = np.meshgrid(np.arange(hm), np.arange(wm), indexing="ij")  # merged token
            uh, uw = uh.reshape(-1), uw.reshape(-1)  # processor order (row-major)
            window = (uh // wu) * nww + uw // wu
            unit_slot = window * wu * wu + (uh % wu) * wu + (uw % wu)  # merged slot in the row
            mi, mj = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
            mi, mj = mi.reshape(-1), mj.reshape(-1)
            for _ in range(t):
                base = row * windows * wu * wu  # first merged slot of this row
                slot = ((base + unit_slot)[:, None] * m * m + (mi * m + mj)[None, :]).reshape(-1)
                source[slot] = offset + np.arange(hm * wm * m * m)
                patch_hw[slot, 0] = (uh[:, None] * m + mi[None, :]).reshape(-1)
                patch_hw[slot, 1] = (uw[:, None] * m + mj[None, :]).reshape(-1)
                token_index[tokens:tokens + hm * wm] = base + unit_slot
                tokens += hm * wm
                offset += hm * wm * m * m
                row += 1
        valid = source >= 0
        patches = np.zeros((slots, config.patch_dim), np.float32)
        patches[valid] = pixels[source[valid]]
        token_valid = np.arange(token_index.shape[0]) < tokens
        return VisionBatch(patches=patches, patch_hw=patch_hw,
                           slot_valid=valid.reshape(rows, windows, wt),
                           token_index=token_index, token_valid=token_valid)


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


def vision_forward(params: dict[str, Any], config: VisionConfig, batch: VisionBatch) -> jax.Array:
    """Merged image tokens (U, H) in processor order (real ones: ``batch.token_valid``).

    params: `VisionTower.arrays()`. Pure; jit it (or call it under a jit).
    """
    c = config
    r, wr, wt = batch.slot_valid.shape
    s = r * wr * wt
    nh, dv = c.num_heads, c.head_dim
    kernel = params["patch_embed"]
    x = batch.patches.astype(kernel.dtype) @ kernel  # (S, C)
    cos, sin = vision_rope_tables(c, batch.patch_hw)
    window_mask = jnp.broadcast_to(batch.slot_valid.reshape(r * wr, 1, wt), (r * wr, wt, wt))
    full_mask = jnp.broadcast_to(batch.slot_valid.reshape(r, 1, wr * wt), (r, wr * wt, wr * wt))
    full = np.zeros((c.depth,), bool)
    full[list(c.fullatt_block_indexes)] = True

    def attend(q, k, v, groups: int, mask):
        shape = (groups, s // groups, nh, dv)
        out = attention(q.reshape(shape), k.reshape(shape), v.reshape(shape), mask)
        return out.reshape(s, nh * dv)

    def block(h, xs):
        lp, is_full = xs
        y = rms_norm(h, lp["norm1"], c.rms_norm_eps)
        qkv = linear(y, lp["qkv"]).reshape(s, 3, nh, dv)
        q = _rope_f32(qkv[None, :, 0], cos[None], sin[None])[0]
        k = _rope_f32(qkv[None, :, 1], cos[None], sin[None])[0]
        v = qkv[:, 2]
        att = jax.lax.cond(is_full, lambda: attend(q, k, v, r, full_mask),
                           lambda: attend(q, k, v, r * wr, window_mask))
        h = h + linear(att, lp["proj"])
        y = rms_norm(h, lp["norm2"], c.rms_norm_eps)
        y = jax.nn.silu(linear(y, lp["gate_proj"])) * linear(y, lp["up_proj"])
        return h + linear(y, lp["down_proj"]), None

    x, _ = jax.lax.scan(block, x, (params["blocks"], jnp.asarray(full)))
    mp = params["merger"]
    y = rms_norm(x, mp["norm"], c.rms_norm_eps).reshape(s // c.merge_unit, -1)
    y = jax.nn.gelu(linear(y, mp["fc1"]), approximate=False)
    y = linear(y, mp["fc2"])  # (U, H)
    return jnp.take(y, batch.token_index, axis=0)


vision_forward_jit = partial(jax.jit, static_argnames=("config",))(vision_forward)


# --------------------------------------------------------------------------- module
class VisionBlocks(nnx.Module):
    """All vision blocks, weights stacked along the block axis (NV = depth)."""

    def __init__(self, config: VisionConfig, dtype, rngs: nnx.Rngs):
        n, c, f = config.depth, config.hidden_size, config.intermediate_size
        self.qkv = StackedLinear(n, c, 3 * c, True, dtype, rngs)
        self.proj = StackedLinear(n, c, c, True, dtype, rngs)
        self.gate_proj = StackedLinear(n, c, f, True, dtype, rngs)
        self.up_proj = StackedLinear(n, c, f, True, dtype, rngs)
        self.down_proj = StackedLinear(n, f, c, True, dtype, rngs)
        self.norm1 = nnx.Param(jnp.ones((n, c), dtype))
        self.norm2 = nnx.Param(jnp.ones((n, c), dtype))

    def projections(self) -> dict[str, StackedLinear]:
        return {name: getattr(self, name) for name in VISION_PROJECTIONS}

    def arrays(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: p.arrays() for name, p in self.projections().items()}
        out["norm1"] = self.norm1[...]
        out["norm2"] = self.norm2[...]
        return out


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
