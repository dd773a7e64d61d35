"""Images in rollout prompts: the camera images of a vision-language policy's prompts,
processed for the model, with the prompt ids expanded to hold them."""

from __future__ import annotations

from typing import Any, Sequence

from jax_drive.text.prompts import PromptConfig, prompt_images
from jax_drive.types import Scene


def prompt_image_inputs(tokenizer, scenes: Scene, prompt: PromptConfig, images: Sequence[Sequence[Any]] | None,
                        prompt_ids: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[tuple]]:
    """The S prompts' token ids with their images' pad tokens expanded, and per scene the
    processed images (() for none).

    images: S lists of uint8 images for the prompts' ``<image>`` placeholders, or None for
    the prompt's own (:func:`jax_drive.text.prompts.prompt_images`: the front camera when
    ``prompt.uses_images``, else none). prompt_ids: S prompts tokenised by ``tokenizer``
    (an ``ImageTokenizer`` when there are images: one pad per placeholder).
    """
    if images is None:
        images = prompt_images(scenes, prompt)
    if images is None:
        return [list(p) for p in prompt_ids], [()] * len(prompt_ids)
    if len(images) != len(prompt_ids):
        raise ValueError(f"{len(images)} image lists for {len(prompt_ids)} scenes")
    if not hasattr(tokenizer, "preprocess"):
        raise TypeError("prompts with images need an image tokenizer (jax_drive.models.qwen2_5_vl.ImageTokenizer)")
    processed = [tokenizer.preprocess(row) for row in images]
    return [tokenizer.expand(ids, row) for ids, row in zip(prompt_ids, processed)], processed
