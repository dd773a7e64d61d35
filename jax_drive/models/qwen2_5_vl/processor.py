"""Prompts with images for Qwen2.5-VL: the processor's token facts over a text tokenizer.

MTDrive's prompt marks its camera image with ``<image>`` (:data:`IMAGE_PLACEHOLDER`).
:class:`ImageTokenizer` wraps the policy's tokenizer so that text holding placeholders is
tokenised the way Qwen2.5-VL's processor tokenises a message with an image:

* ``encode`` writes each placeholder as ``<|vision_start|><|image_pad|><|vision_end|>`` (the
  ids the Qwen2.5-VL chat template writes for an image part; the text around it is encoded
  piece by piece, as a tokenizer splits text at special tokens anyway);
* ``preprocess`` turns uint8 RGB images into model inputs (:mod:`jax_drive.models.image_processing`);
* ``expand`` repeats the i-th image's pad id t * h * w / merge_size**2 times (transformers'
  ``Qwen2_5_VLProcessor``), on token ids and, for training rows, on any per-token array.

Every other attribute (``decode``, ``apply_chat_template``, ``eos_token_ids``, ...) is the
wrapped tokenizer's, so code written for text policies takes an ``ImageTokenizer`` unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from jax_drive.models.image_processing import (ImageProcessorConfig, ProcessedImage,
                                               image_token_repeats, preprocess_image)
from jax_drive.models.qwen2_5_vl.config import VLMConfig
from jax_drive.text.prompts import IMAGE_PLACEHOLDER


class ImageTokenizer:
    """A tokenizer for prompts with images (see the module docstring).

    Args:
      tokenizer: the language model's tokenizer (``encode(text) -> ids`` without added
        special tokens, ``decode``, ``apply_chat_template``, ...).
      config: the model's config (special ids, merge size).
      processor: image preprocessing (default: Qwen2.5-VL-Instruct's).
    """

    takes_images = True

    def __init__(self, tokenizer, config: VLMConfig,
                 processor: ImageProcessorConfig = ImageProcessorConfig()):
        if not isinstance(config, VLMConfig):
            raise TypeError(f"config must be a VLMConfig, got {type(config).__name__}")
        vision = config.vision
        if (processor.patch_size, processor.temporal_patch_size, processor.merge_size) != (
                vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size):
            raise ValueError("the image processor's patching does not match the vision tower's")
        self.tokenizer = tokenizer
        self.processor = processor
        self.image_token_id = int(config.image_token_id)
        self.marker = (int(config.vision_start_token_id), self.image_token_id,
                       int(config.vision_end_token_id))

    def __getattr__(self, name: str) -> Any:
        if name == "tokenizer":  # not set yet (e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self.tokenizer, name)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text`` with one ``<|image_pad|>`` (between the vision start / end ids)
        per placeholder; ``expand`` gives each image its full run of pads."""
        pieces = text.split(IMAGE_PLACEHOLDER)
        ids = list(self.tokenizer.encode(pieces[0], add_special_tokens=add_special_tokens))
        for piece in pieces[1:]:
            ids.extend(self.marker)
            if piece:
                ids.extend(self.tokenizer.encode(piece, add_special_tokens=False))
        return ids

    def preprocess(self, images: Sequence[np.ndarray]) -> tuple[ProcessedImage, ...]:
        """uint8 (H, W, 3) RGB images -> the model's inputs, in order."""
        return tuple(preprocess_image(np.asarray(im), self.processor) for im in images)

    def expand(self, ids: Sequence[int], images: Sequence[ProcessedImage], *per_token):
        """``ids`` with the i-th ``<|image_pad|>`` repeated for ``images[i]`` (all pads of a
        prompt, in reading order). With ``per_token`` arrays aligned with ``ids`` (e.g. loss
        weights), returns (ids, *arrays) with each entry repeated like its token.

        Raises ValueError when the number of pads and of images differ.
        """
        grids = np.asarray([np.asarray(im.grid_thw).reshape(3) for im in images], np.int64)
        repeats = image_token_repeats(ids, grids, self.image_token_id, self.processor.merge_size)
        out = np.repeat(np.asarray(ids, np.int64), repeats).tolist()
        if not per_token:
            return out
        return (out, *(np.repeat(np.asarray(a), repeats) for a in per_token))

    def encode_with_images(self, text: str, images: Sequence[ProcessedImage]) -> list[int]:
        """``expand(encode(text), images)``: the ids of a prompt whose placeholders hold ``images``."""
        return self.expand(self.encode(text), images)


def image_processor_config(path) -> ImageProcessorConfig:
    """The image processing of a checkpoint directory: its preprocessor_config.json when
    present, else Qwen2.5-VL-Instruct's defaults."""
    file = Path(path) / "preprocessor_config.json"
    if not file.is_file():
        return ImageProcessorConfig()
    return ImageProcessorConfig.from_hf(json.loads(file.read_text()))
