"""Loading Qwen2.5-VL safetensors checkpoints (and writing them back).

Both key layouts are read: the original one (`visual.*`, `model.layers.*`,
`model.embed_tokens.weight`, `lm_head.weight`) and the transformers >= 4.52 one
(`model.visual.*`, `model.language_model.*`). The language side goes through the text
models' `assign_hf_weights`; the vision tower is mapped here (torch (out, in) linears are
transposed to (in, out) kernels; the Conv3d patch embedding is a linear map over the
flattened (channel, frame, row, column) patch). bfloat16 and float32 checkpoints load into
either dtype.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_drive.configs import one_of
from jax_drive.models.hf_weights import WeightLoadError, assign_hf_weights
from jax_drive.models.qwen2_5_vl.config import VisionConfig, VLMConfig
from jax_drive.models.qwen2_5_vl.model import Qwen2_5_VL
from jax_drive.models.qwen2_5_vl.vision import VISION_PROJECTIONS, VisionTower
from jax_drive.models.layers import fold_lora

HF_VISION_BLOCK_KEYS = {
    "qkv": "attn.qkv",
    "proj": "attn.proj",
    "gate_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
}
LAYOUTS = ("legacy", "transformers5")


def vision_hf_shapes(config: VisionConfig) -> dict[str, tuple[int, ...]]:
    """HF key (under `visual.`) -> torch-layout shape of every vision tensor."""
    c, f, n = config.hidden_size, config.intermediate_size, config.depth
    merged = c * config.merge_unit
    shapes = {
        "patch_embed.proj.weight": (c, config.in_channels, config.temporal_patch_size,
                                    config.patch_size, config.patch_size),
        "merger.ln_q.weight": (c,),
        "merger.mlp.0.weight": (merged, merged), "merger.mlp.0.bias": (merged,),
        "merger.mlp.2.weight": (config.out_hidden_size, merged),
        "merger.mlp.2.bias": (config.out_hidden_size,),
    }
    proj = {"qkv": (3 * c, c), "proj": (c, c), "gate_proj": (f, c), "up_proj": (f, c),
            "down_proj": (c, f)}
    for i in range(n):
        for name, key in HF_VISION_BLOCK_KEYS.items():
            shapes[f"blocks.{i}.{key}.weight"] = proj[name]
            shapes[f"blocks.{i}.{key}.bias"] = (proj[name][0],)
        shapes[f"blocks.{i}.norm1.weight"] = (c,)
        shapes[f"blocks.{i}.norm2.weight"] = (c,)
    return shapes


def _vision_names(names: Iterable[str]) -> dict[str, str]:
    """key below `visual.` -> stored name, for either layout."""
    out: dict[str, str] = {}
    for name in names:
        for prefix in ("model.visual.", "visual."):
            if name.startswith(prefix):
                out.setdefault(name[len(prefix):], name)
    return out


def assign_vision_weights(config: VisionConfig, dtype, get: Callable[[str], np.ndarray],
                          names: Iterable[str]) -> VisionTower:
    """A VisionTower from HF-named torch-layout tensors (`visual.*` or `model.visual.*`)."""
    available = _vision_names(names)
    shapes = vision_hf_shapes(config)
    missing = [k for k in shapes if k not in available]
    if missing:
        raise WeightLoadError(f"checkpoint lacks {len(missing)} vision tensors, e.g. "
                              f"{['visual.' + k for k in missing[:3]]}")

    def fetch(key: str) -> np.ndarray:
        arr = np.asarray(get(available[key]), np.float32)
        if tuple(arr.shape) != shapes[key]:
            raise WeightLoadError(f"tensor visual.{key} has shape {tuple(arr.shape)}, "
                                  f"expected {shapes[key]}")
        return arr

    def param(arr: np.ndarray):
        return jnp.asarray(arr, jnp.float32).astype(dtype)

    tower = nnx.eval_shape(lambda: VisionTower(config, dtype, nnx.Rngs(0)))
    tower.patch_embed.set_value(param(fetch("patch_embed.proj.weight").reshape(
        config.hidden_size, -1).T))
    tower.merger_norm.set_value(param(fetch("merger.ln_q.weight")))
    for dense, key in ((tower.merger_fc1, "merger.mlp.0"), (tower.merger_fc2, "merger.mlp.2")):
        dense.kernel.set_value(param(fetch(key + ".weight").T))
        dense.bias.set_value(param(fetch(key + ".bias")))
    n = config.depth
    for name in VISION_PROJECTIONS:
        proj = getattr(tower.blocks, name)
        key = HF_VISION_BLOCK_KEYS[name]
        proj.kernel.set_value(param(np.stack([fetch(f"blocks.{i}.{key}.weight").T
                                              for i in range(n)])))
        proj.bias.set_value(param(np.stack([fetch(f"blocks.{i}.{key}.bias") for i in range(n)])))
    for attr in ("norm1", "norm2"):
        getattr(tower.blocks, attr).set_value(
            param(np.stack([fetch(f"blocks.{i}.{attr}.weight") for i in range(n)])))
    return tower


def assign_vlm_weights(config: VLMConfig, get: Callable[[str], np.ndarray],
                       names: Iterable[str]) -> Qwen2_5_VL:
    """A Qwen2_5_VL from HF-named tensors in either key layout."""
    names = list(names)
    language = assign_hf_weights(config, get, [n for n in names if "visual." not in n])
    model = nnx.eval_shape(lambda: Qwen2_5_VL(config, nnx.Rngs(0)))
    model.embed = language.embed
    model.layers = language.layers
    model.final_norm = language.final_norm
    model.lm_head = language.lm_head
    model.visual = assign_vision_weights(config.vision, config.jnp_dtype, get, names)
    return model


# ----------------------------------------------------------------------------- export
def vlm_hf_state_dict(model: Qwen2_5_VL, layout: str = "legacy") -> dict[str, jnp.ndarray]:
    """HF name -> array (torch layout, model dtype), LoRA folded in.

    layout: 'legacy' (`visual.*`, `model.layers.*`; what transformers 5 still writes) or
    'transformers5' (`model.visual.*`, `model.language_model.*`).
    """
    from jax_drive.models.export import hf_state_dict

    one_of("layout", layout, LAYOUTS)
    lm_prefix, vis_prefix = (("model.", "visual.") if layout == "legacy"
                             else ("model.language_model.", "model.visual."))
    out = {}
    for key, value in hf_state_dict(model).items():
        out[lm_prefix + key[len("model."):] if key.startswith("model.") else key] = value
    c = model.config.vision
    tower = model.visual
    out[vis_prefix + "patch_embed.proj.weight"] = tower.patch_embed[...].T.reshape(
        c.hidden_size, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size)
    out[vis_prefix + "merger.ln_q.weight"] = tower.merger_norm[...]
    for dense, key in ((tower.merger_fc1, "merger.mlp.0"), (tower.merger_fc2, "merger.mlp.2")):
        out[vis_prefix + key + ".weight"] = dense.kernel[...].T
        out[vis_prefix + key + ".bias"] = dense.bias[...]
    for name in VISION_PROJECTIONS:
        proj = getattr(tower.blocks, name)
        kernel = fold_lora(proj.arrays())  # vision adapters (apply_vision_lora) folded in
        for i in range(c.depth):
            base = f"{vis_prefix}blocks.{i}.{HF_VISION_BLOCK_KEYS[name]}"
            out[base + ".weight"] = kernel[i].T
            out[base + ".bias"] = proj.bias[...][i]
    for attr in ("norm1", "norm2"):
        for i in range(c.depth):
            out[f"{vis_prefix}blocks.{i}.{attr}.weight"] = getattr(tower.blocks, attr)[...][i]
    return out


def save_vlm(model: Qwen2_5_VL, out_dir: str | Path, layout: str = "legacy",
             max_shard_bytes: int = 4 * 2**30) -> Path:
    """Writes config.json + model(-0000i-of-n).safetensors loadable by transformers."""
    from jax_drive.models.export import save_tensors

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_tensors(vlm_hf_state_dict(model, layout), out, "model", max_shard_bytes)
    (out / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2))
    return out


def peft_target_regex(targets) -> str:
    """PEFT target_modules regex for the language model's projections only (module names
    containing 'visual' are excluded, so the vision MLP's gate/up/down_proj stay frozen)."""
    return r"^(?!.*visual).*\.(?:" + "|".join(sorted(targets)) + r")$"


def export_vlm_peft(model: Qwen2_5_VL, out_dir: str | Path, base_model_name: str = "",
                    layout: str = "transformers5") -> Path:
    """Writes the language model's LoRA adapters in PEFT format for Qwen2.5-VL
    (`Qwen2_5_VLForConditionalGeneration` in transformers / PEFT, and vLLM).

    layout: 'transformers5' names the layers `model.language_model.layers.{i}` (the module
    path in transformers >= 4.52); 'legacy' names them `model.layers.{i}` (older exports).
    """
    from jax_drive.models.export import export_peft
    from jax_drive.models.lora import lora_projections

    if not isinstance(model, Qwen2_5_VL):
        raise TypeError(f"expected a Qwen2_5_VL, got {type(model).__name__}")
    one_of("layout", layout, LAYOUTS)
    prefix = "model.layers" if layout == "legacy" else "model.language_model.layers"
    targets = lora_projections(model)
    return export_peft(model, out_dir, base_model_name, layers_prefix=prefix,
                       target_modules=peft_target_regex(targets) if targets else None)


def load_vlm_peft(model: Qwen2_5_VL, adapter_dir: str | Path,
                  layout: str = "transformers5") -> Qwen2_5_VL:
    """Applies an adapter written by `export_vlm_peft` (same layout) to ``model`` in place."""
    from jax_drive.models.export import load_peft

    one_of("layout", layout, LAYOUTS)
    prefix = "model.layers" if layout == "legacy" else "model.language_model.layers"
    return load_peft(model, adapter_dir, layers_prefix=prefix)
