"""The Qwen2-VL / Qwen2.5-VL image processor in numpy.

Facts (those of transformers' `Qwen2VLImageProcessor` / `Qwen2VLImageProcessorPil`):

* each side is resized to a multiple of ``patch_size * merge_size`` (28) close to the
  original aspect ratio, with the pixel count kept within [min_pixels, max_pixels]
  (:func:`smart_resize`);
* resizing is bicubic on uint8 RGB, computed as Pillow computes it (separable Keys kernel with
  a = -0.5, widened by the scale factor when shrinking, 22-bit fixed-point weights, a
  horizontal then a vertical pass, each rounded back to uint8), so our pixels equal
  Pillow's bit for bit (:func:`resize_bicubic`);
* values are scaled by 1/255 and normalised with the CLIP mean / std;
* the image becomes (grid_h * grid_w, 3 * 2 * 14 * 14) patches, ordered by 2 x 2 merge
  blocks, each patch holding its frame twice (temporal patch 2) (:func:`patchify`);
* in the prompt, each `<|image_pad|>` expands to grid_t * grid_h * grid_w / 4 copies
  (:func:`expand_image_tokens`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_PRECISION_BITS = 32 - 8 - 2  # Pillow's fixed-point precision for 8-bit images


@dataclasses.dataclass(frozen=True)
class ImageProcessorConfig:
    """Preprocessing settings (defaults: Qwen2.5-VL-Instruct's `preprocessor_config.json`).

    Attributes:
      min_pixels, max_pixels: bounds of the resized pixel count.
      patch_size, temporal_patch_size, merge_size: the vision tower's patching.
      image_mean, image_std: per-channel normalisation (CLIP's).
      rescale_factor: multiplies the uint8 values before normalisation.
    """

    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD
    rescale_factor: float = 1 / 255

    def __post_init__(self):
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(f"need 0 < min_pixels <= max_pixels, got {self.min_pixels}, "
                             f"{self.max_pixels}")

    @property
    def factor(self) -> int:
        """Both resized sides are multiples of this (patch_size * merge_size)."""
        return self.patch_size * self.merge_size

    @classmethod
    def from_hf(cls, config: dict) -> "ImageProcessorConfig":
        """From a `preprocessor_config.json` dict (min/max_pixels or size's edges)."""
        size = config.get("size") or {}
        return cls(
            min_pixels=int(config.get("min_pixels", size.get("shortest_edge", 56 * 56))),
            max_pixels=int(config.get("max_pixels", size.get("longest_edge", 28 * 28 * 1280))),
            patch_size=int(config.get("patch_size", 14)),
            temporal_patch_size=int(config.get("temporal_patch_size", 2)),
            merge_size=int(config.get("merge_size", 2)),
            image_mean=tuple(config.get("image_mean", CLIP_MEAN)),
            image_std=tuple(config.get("image_std", CLIP_STD)),
            rescale_factor=float(config.get("rescale_factor", 1 / 255)),
        )


@dataclasses.dataclass(frozen=True)
class ProcessedImage:
    """One preprocessed image: pixel_values (n, P) float32 patches and grid_thw (3,) int64
    (frames, patch rows, patch columns), n = prod(grid_thw)."""

    pixel_values: np.ndarray
    grid_thw: np.ndarray

    @property
    def num_tokens(self) -> int:
        """Merged tokens (image pads) at merge size 2."""
        return int(np.prod(self.grid_thw)) // 4


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 28 * 28 * 1280) -> tuple[int, int]:
    """(height, width) rounded to multiples of ``factor`` with the pixel count in
    [min_pixels, max_pixels], keeping the aspect ratio as well as that allows.

    Raises ValueError for an aspect ratio above 200 or a non-positive side.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image sides must be positive, got {height} x {width}")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio must be at most 200, got {height} x {width}")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def _bicubic(x: np.ndarray) -> np.ndarray:
    """Keys cubic kernel with a = -0.5 (Pillow's BICUBIC), float64, in Pillow's operation order."""
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def resize_weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pillow's fixed-point bicubic weights of one axis: (first (out,) int64 input index of
    each output, weights (out, taps) int64; taps past an output's window are 0)."""
    scale = in_size / out_size
    filter_scale = max(scale, 1.0)
    support = 2.0 * filter_scale
    taps = int(math.ceil(support)) * 2 + 1
    center = (np.arange(out_size) + 0.5) * scale
    lo = np.maximum(np.trunc(center - support + 0.5).astype(np.int64), 0)
    hi = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size)
    count = hi - lo
    weights = np.zeros((out_size, taps))
    total = np.zeros((out_size,))
    for x in range(taps):  # sequential sums, as Pillow adds them
        w = np.where(x < count, _bicubic(((x + lo) - center + 0.5) * (1.0 / filter_scale)), 0.0)
        weights[:, x] = w
        total = total + w
    weights = np.where(total[:, None] != 0.0, weights / np.where(total == 0, 1, total)[:, None],
                       weights)
    fixed = np.where(weights < 0, np.trunc(-0.5 + weights * (1 << _PRECISION_BITS)),
                     np.trunc(0.5 + weights * (1 << _PRECISION_BITS))).astype(np.int64)
    return lo, fixed


def _resample_rows(image: np.ndarray, lo: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """uint8 (in, ...) -> uint8 (out, ...): out[o] = sum_x weights[o, x] * image[lo[o] + x]
    in Pillow's int32 fixed point (the sums stay below 2**31), rounded and clipped."""
    source = np.ascontiguousarray(image, dtype=np.int32)
    weights = weights.astype(np.int32).reshape(weights.shape + (1,) * (image.ndim - 1))
    acc = np.full((lo.shape[0],) + image.shape[1:], 1 << (_PRECISION_BITS - 1), np.int32)
    for x in range(weights.shape[1]):
        index = np.minimum(lo + x, image.shape[0] - 1)  # weight 0 past the window
        acc += weights[:, x] * source[index]
    return np.clip(acc >> _PRECISION_BITS, 0, 255).astype(np.uint8)


def resize_bicubic(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bicubic resize of a uint8 (H, W, C) image to (height, width, C), equal to Pillow's
    ``Image.resize((width, height), Image.BICUBIC)``."""
    image = _check_image(image)
    out = image
    if width != image.shape[1]:  # horizontal pass first, as Pillow
        out = _resample_rows(np.swapaxes(out, 0, 1), *resize_weights(image.shape[1], width))
        out = np.swapaxes(out, 0, 1)
    if height != image.shape[0]:
        out = _resample_rows(out, *resize_weights(image.shape[0], height))
    return np.array(out, copy=True, order="C")


def _check_image(image) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected a uint8 (H, W, 3) RGB image, got {image.dtype} "
                         f"{image.shape}")
    return image


def normalize(image: np.ndarray, config: ImageProcessorConfig) -> np.ndarray:
    """uint8 (H, W, 3) -> float32 (3, H, W): scaled by rescale_factor, CLIP-normalised."""
    x = (image.astype(np.float64) * config.rescale_factor).astype(np.float32)
    x = (x - np.asarray(config.image_mean, np.float32)) / np.asarray(config.image_std, np.float32)
    return np.ascontiguousarray(np.moveaxis(x, -1, 0))


def patchify(image: np.ndarray, config: ImageProcessorConfig) -> tuple[np.ndarray, np.ndarray]:
    """float (C, H, W) with H, W multiples of the factor -> (patches (gh * gw, C*T*p*p)
    float32 in merge-block order, grid_thw (3,) int64 = (1, gh, gw))."""
    c, h, w = image.shape
    p, m, t = config.patch_size, config.merge_size, config.temporal_patch_size
    if h % config.factor or w % config.factor:
        raise ValueError(f"image {h} x {w} is not a multiple of {config.factor}")
    gh, gw = h // p, w // p
    x = image.reshape(c, gh // m, m, p, gw // m, m, p)
    x = np.transpose(x, (1, 4, 2, 5, 0, 3, 6))  # (gh/m, gw/m, m, m, C, p, p)
    x = np.broadcast_to(x[:, :, :, :, :, None], x.shape[:5] + (t, p, p))
    return (np.ascontiguousarray(x, dtype=np.float32).reshape(gh * gw, c * t * p * p),
            np.array([1, gh, gw], np.int64))


def preprocess_image(image: np.ndarray,
                     config: ImageProcessorConfig = ImageProcessorConfig()) -> ProcessedImage:
    """A uint8 (H, W, 3) RGB image -> ProcessedImage (resize, normalise, patchify)."""
    image = _check_image(image)
    h, w = smart_resize(image.shape[0], image.shape[1], config.factor, config.min_pixels,
                        config.max_pixels)
    pixels, grid = patchify(normalize(resize_bicubic(image, h, w), config), config)
    return ProcessedImage(pixel_values=pixels, grid_thw=grid)


def preprocess_images(images: Sequence[np.ndarray],
                      config: ImageProcessorConfig = ImageProcessorConfig()
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Several images -> (pixel_values (N, P), image_grid_thw (I, 3)), the processor's batch."""
    done = [preprocess_image(im, config) for im in images]
    if not done:
        raise ValueError("no images")
    return (np.concatenate([d.pixel_values for d in done]),
            np.stack([d.grid_thw for d in done]))


def image_token_repeats(token_ids: Sequence[int], grid_thw, image_token_id: int,
                        merge_size: int = 2) -> np.ndarray:
    """(n,) int64: how many times each of the n ids occurs after expansion: t * h * w /
    merge_size**2 for the i-th `<|image_pad|>` id (the i-th grid of ``grid_thw`` (I, 3)), 1
    for every other id.

    Raises ValueError when the number of pad ids and of grids differ.
    """
    grids = np.asarray(grid_thw, np.int64).reshape(-1, 3)
    counts = np.prod(grids, axis=1) // merge_size**2
    is_pad = np.asarray(token_ids, np.int64).reshape(-1) == image_token_id
    if int(is_pad.sum()) != len(counts):
        raise ValueError(f"{len(counts)} images but {int(is_pad.sum())} image pad tokens")
    repeats = np.ones(is_pad.shape, np.int64)
    repeats[is_pad] = counts
    return repeats


def expand_image_tokens(token_ids: Sequence[int], grid_thw, image_token_id: int,
                        merge_size: int = 2) -> list[int]:
    """Replaces the i-th `<|image_pad|>` id of ``token_ids`` by t * h * w / merge_size**2
    copies for the i-th grid of ``grid_thw`` (I, 3).

    Raises ValueError when the number of pad ids and of grids differ.
    """
    repeats = image_token_repeats(token_ids, grid_thw, image_token_id, merge_size)
    return np.repeat(np.asarray(token_ids, np.int64).reshape(-1), repeats).tolist()
