"""LoRA on the Qwen2.5-VL vision tower (the language model's adapters: `jax_drive.models.lora`).

`apply_vision_lora` adds adapters to the vision blocks' stacked projections; the tower's
forward (`vision_forward`, through `transformer.linear`) applies them, the trainers'
``trainable="lora"`` split (every `LoRAParam`) trains them with the language model's,
`save_vlm` folds them into the exported kernels, and the PEFT export leaves them out (its
``target_modules`` exclude the tower: vLLM serves LoRA on the language model only).
"""

from __future__ import annotations

from typing import Sequence

from flax import nnx

from jax_drive.models.lora import add_adapters
from jax_drive.models.qwen2_5_vl.model import Qwen2_5_VL
from jax_drive.models.qwen2_5_vl.vision import VISION_PROJECTIONS


def apply_vision_lora(model: Qwen2_5_VL, rank: int, alpha: float,
                      targets: Sequence[str] = VISION_PROJECTIONS,
                      rngs: nnx.Rngs | None = None) -> Qwen2_5_VL:
    """Adds fresh LoRA adapters (in place) to the vision blocks' projections; returns the model.

    targets: subset of ('qkv', 'proj', 'gate_proj', 'up_proj', 'down_proj'). A fresh adapter
    (B = 0) leaves the tower unchanged.
    """
    if not isinstance(model, Qwen2_5_VL):
        raise TypeError(f"expected a Qwen2_5_VL, got {type(model).__name__}")
    add_adapters(model.visual.blocks, targets, VISION_PROJECTIONS, rank, alpha, rngs)
    return model
