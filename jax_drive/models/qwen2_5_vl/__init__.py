"""Qwen2.5-VL (vision-language model) in flax.nnx; see `model.py` for the API."""

from jax_drive.models.qwen2_5_vl.config import VisionConfig, VLMConfig
from jax_drive.models.qwen2_5_vl.lora import apply_vision_lora
from jax_drive.models.qwen2_5_vl.model import Qwen2_5_VL, scatter_image_tokens
from jax_drive.models.qwen2_5_vl.mrope import mrope_positions, mrope_tables
from jax_drive.models.qwen2_5_vl.processor import ImageTokenizer
from jax_drive.models.qwen2_5_vl.vision import (VisionBatch, VisionSizes, VisionTower,
                                                num_image_tokens)

__all__ = [
    "ImageTokenizer",
    "Qwen2_5_VL",
    "VLMConfig",
    "VisionBatch",
    "VisionConfig",
    "VisionSizes",
    "VisionTower",
    "apply_vision_lora",
    "mrope_positions",
    "mrope_tables",
    "num_image_tokens",
    "scatter_image_tokens",
]
