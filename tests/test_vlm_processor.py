"""The numpy Qwen2-VL image processor against transformers' (`Qwen2VLImageProcessorPil`, the
processor transformers 5 uses without torchvision) and Pillow's bicubic resize.

Random uint8 images of several sizes (upscaled, downscaled by up to ~4x, one side only,
already a multiple of 28, clamped by min_pixels / max_pixels): our pixel_values must equal
transformers' exactly (same float32 values) with the same image_grid_thw, and our resize
must equal Pillow's pixel for pixel.
"""

import numpy as np
import pytest

from jax_drive.models.image_processing import (
    ImageProcessorConfig,
    expand_image_tokens,
    preprocess_image,
    preprocess_images,
    resize_bicubic,
    smart_resize,
)

from PIL import Image  # noqa: E402  (pinned in requirements-test.txt)
import transformers  # noqa: E402

SIZES = [(37, 53), (300, 200), (56, 56), (1080, 1920), (252, 448), (15, 700)]


def _images(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=s + (3,), dtype=np.uint8) for s in sizes]


@pytest.mark.parametrize("out", [(56, 28), (252, 336), (84, 56), (224, 112), (37, 53)])
def test_resize_equals_pillow_bicubic(out):
    for image in _images([(37, 53), (480, 640), (30, 30), (1080, 1920)], seed=sum(out)):
        ref = np.asarray(Image.fromarray(image).resize(out[::-1], Image.BICUBIC))
        np.testing.assert_array_equal(resize_bicubic(image, *out), ref)


@pytest.mark.parametrize("max_pixels", [28 * 28 * 64, 28 * 28 * 1280])
def test_preprocess_equals_transformers(max_pixels):
    images = _images(SIZES, seed=max_pixels)
    hf = transformers.models.qwen2_vl.image_processing_pil_qwen2_vl.Qwen2VLImageProcessorPil(
        min_pixels=56 * 56, max_pixels=max_pixels)
    ref = hf(images=images, return_tensors="np")
    pixels, grids = preprocess_images(images, ImageProcessorConfig(max_pixels=max_pixels))
    np.testing.assert_array_equal(grids, ref["image_grid_thw"])
    assert pixels.dtype == np.float32
    np.testing.assert_array_equal(pixels, ref["pixel_values"])
    one = preprocess_image(images[1], ImageProcessorConfig(max_pixels=max_pixels))
    assert one.num_tokens == int(np.prod(one.grid_thw)) // 4


def test_smart_resize_rules():
    assert smart_resize(252, 448) == (252, 448)  # already multiples of 28: unchanged
    h, w = smart_resize(1080, 1920, max_pixels=28 * 28 * 256)
    assert h % 28 == 0 and w % 28 == 0 and h * w <= 28 * 28 * 256
    h, w = smart_resize(10, 20)  # too small: scaled up to min_pixels
    assert h * w >= 56 * 56 and h % 28 == 0 and w % 28 == 0
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 2500)
    with pytest.raises(ValueError, match="positive"):
        smart_resize(0, 10)


def test_expand_image_tokens_and_bad_images():
    grids = np.array([[1, 4, 6], [1, 2, 2]])
    assert expand_image_tokens([7, 9, 8, 9, 5], grids, 9) == [7] + [9] * 6 + [8, 9, 5]
    with pytest.raises(ValueError, match="2 images but 1"):
        expand_image_tokens([7, 9], grids, 9)
    with pytest.raises(ValueError, match="2 images but 3 image pad tokens"):
        expand_image_tokens([9, 9, 9], grids, 9)
    with pytest.raises(ValueError, match="uint8"):
        preprocess_image(np.zeros((28, 28, 3), np.float32))
    with pytest.raises(ValueError, match="uint8"):
        preprocess_image(np.zeros((28, 28, 4), np.uint8))
