"""Configuration of Qwen2.5-VL: the vision tower (`VisionConfig`) and the whole model
(`VLMConfig`, a `ModelConfig` whose language side is a Qwen2 decoder with M-RoPE).

`VLMConfig` subclasses `ModelConfig`, so everything written for the text models (KV cache,
sampler, LoRA, trainers) reads the language side's fields unchanged; the vision tower, the
M-RoPE sections and the special token ids are extra fields. Both are frozen dataclasses (so
they can be static arguments of jitted functions).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jax_drive.models.config import ModelConfig

QWEN2_5_VL_MODEL_TYPE = "qwen2_5_vl"


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """Hyper-parameters of the Qwen2.5-VL vision tower. Defaults: the 3B/7B/72B tower.

    Attributes:
      depth: number of vision blocks.
      hidden_size: vision width (C).
      intermediate_size: SwiGLU hidden width of a vision block.
      num_heads: attention heads; head_dim = hidden_size / num_heads must be a multiple of 4
        (half of each head rotates by the patch row, half by the column).
      out_hidden_size: width of the merged tokens (the language model's hidden size).
      in_channels, patch_size, temporal_patch_size: a patch is in_channels x temporal x
        patch x patch values (3 x 2 x 14 x 14 = 1176; a still image repeats its frame).
      spatial_merge_size: m; m x m neighbouring patches merge into one language token.
      window_size: window attention side in pixels (112 = 4 x 4 merged tokens).
      fullatt_block_indexes: blocks that attend over the whole image instead of windows.
      rope_theta: base of the 2-D rotary embedding.
      tokens_per_second: temporal position scale for videos (kept for round trips; images
        do not use it).
      rms_norm_eps: RMSNorm epsilon of every vision norm (fixed at 1e-6 in Qwen2.5-VL).
    """

    depth: int = 32
    hidden_size: int = 1280
    intermediate_size: int = 3420
    num_heads: int = 16
    out_hidden_size: int = 2048
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    window_size: int = 112
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    rope_theta: float = 10000.0
    tokens_per_second: int = 2
    rms_norm_eps: float = 1e-6

    def __post_init__(self):
        object.__setattr__(self, "fullatt_block_indexes",
                           tuple(int(i) for i in self.fullatt_block_indexes))
        for name in ("depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size",
                     "in_channels", "patch_size", "temporal_patch_size", "spatial_merge_size"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"vision {name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"vision hidden_size {self.hidden_size} is not a multiple of "
                             f"num_heads {self.num_heads}")
        if self.head_dim % 4:
            raise ValueError(f"vision head_dim {self.head_dim} must be a multiple of 4 (2-D RoPE)")
        if self.window_units < 1:
            raise ValueError(f"window_size {self.window_size} is smaller than one merged token "
                             f"({self.patch_size * self.spatial_merge_size} px)")
        bad = [i for i in self.fullatt_block_indexes if not 0 <= i < self.depth]
        if bad:
            raise ValueError(f"fullatt_block_indexes {bad} outside [0, {self.depth})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values per patch: in_channels * temporal_patch_size * patch_size**2."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merge_unit(self) -> int:
        """Patches per merged token (m * m)."""
        return self.spatial_merge_size**2

    @property
    def window_units(self) -> int:
        """Side of an attention window in merged tokens."""
        return self.window_size // self.spatial_merge_size // self.patch_size

    @property
    def window_tokens(self) -> int:
        """Patches per (full) attention window."""
        return self.window_units**2 * self.merge_unit

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> "VisionConfig":
        """From a HF `vision_config` dict (transformers 4.x or 5.x key names)."""
        act = config.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"unsupported vision hidden_act {act!r}; only silu is supported")
        rope = dict(config.get("rope_parameters") or {})
        try:
            return cls(
                depth=int(config["depth"]),
                hidden_size=int(config["hidden_size"]),
                intermediate_size=int(config["intermediate_size"]),
                num_heads=int(config["num_heads"]),
                out_hidden_size=int(config["out_hidden_size"]),
                in_channels=int(config.get("in_channels", config.get("in_chans", 3))),
                patch_size=int(config.get("patch_size", config.get("spatial_patch_size", 14))),
                temporal_patch_size=int(config.get("temporal_patch_size", 2)),
                spatial_merge_size=int(config.get("spatial_merge_size", 2)),
                window_size=int(config.get("window_size", 112)),
                fullatt_block_indexes=tuple(config.get("fullatt_block_indexes", (7, 15, 23, 31))),
                rope_theta=float(rope.get("rope_theta", 10000.0)),
                tokens_per_second=int(config.get("tokens_per_second", 2)),
            )
        except KeyError as error:
            raise ValueError(f"vision_config lacks required key {error.args[0]!r}") from None

    def to_hf(self) -> dict[str, Any]:
        return {
            "model_type": "qwen2_5_vl_vision",
            "depth": self.depth,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_heads": self.num_heads,
            "out_hidden_size": self.out_hidden_size,
            "in_channels": self.in_channels,
            "patch_size": self.patch_size,
            "temporal_patch_size": self.temporal_patch_size,
            "spatial_merge_size": self.spatial_merge_size,
            "window_size": self.window_size,
            "fullatt_block_indexes": list(self.fullatt_block_indexes),
            "tokens_per_second": self.tokens_per_second,
            "hidden_act": "silu",
            "rope_parameters": {"rope_type": "axial", "rope_theta": self.rope_theta},
        }


@dataclasses.dataclass(frozen=True)
class VLMConfig(ModelConfig):
    """Qwen2.5-VL: a Qwen2 language model (the inherited `ModelConfig` fields) plus a vision
    tower. Defaults of the extra fields are Qwen2.5-VL's; use :meth:`qwen2_5_vl_3b` or
    :meth:`tiny` for whole configs.

    Attributes (beyond ModelConfig):
      vision: the vision tower.
      mrope_section: frequencies of each head half rotated by the (temporal, height, width)
        position; sums to head_dim / 2.
      image_token_id, video_token_id, vision_start_token_id, vision_end_token_id: special ids
        (`<|image_pad|>` = 151655 is the one replaced by image embeddings).
    """

    vision: VisionConfig = VisionConfig()
    mrope_section: tuple[int, ...] = (16, 24, 24)
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "mrope_section", tuple(int(s) for s in self.mrope_section))
        if self.architecture != "qwen2":
            raise ValueError(f"Qwen2.5-VL's language model is qwen2, got {self.architecture!r}")
        if self.rope_type != "default":
            raise ValueError(f"Qwen2.5-VL uses M-RoPE without scaling, got {self.rope_type!r}")
        if len(self.mrope_section) != 3 or sum(self.mrope_section) != self.head_dim // 2:
            raise ValueError(f"mrope_section {self.mrope_section} must have 3 entries summing "
                             f"to head_dim / 2 = {self.head_dim // 2}")
        if self.vision.out_hidden_size != self.hidden_size:
            raise ValueError(f"vision out_hidden_size {self.vision.out_hidden_size} != language "
                             f"hidden_size {self.hidden_size}")
        if not 0 <= self.image_token_id < self.vocab_size:
            raise ValueError(f"image_token_id {self.image_token_id} outside the vocabulary "
                             f"({self.vocab_size})")

    @property
    def model_type(self) -> str:
        return QWEN2_5_VL_MODEL_TYPE

    @property
    def placeholder_token_ids(self) -> tuple[int, ...]:
        """The image and video pad ids: they only mark where vision embeddings go, and a
        sampled one would have no pixels behind it."""
        return tuple(i for i in (self.image_token_id, self.video_token_id) if 0 <= i < self.vocab_size)

    @property
    def text_config(self) -> ModelConfig:
        """The language side as a plain ModelConfig."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(ModelConfig)}
        return ModelConfig(**fields)

    # ------------------------------------------------------------- constructors
    @classmethod
    def qwen2_5_vl_3b(cls, **overrides) -> "VLMConfig":
        """Qwen2.5-VL-3B-Instruct's shapes (overrides e.g. num_layers=4 for a shallow copy)."""
        vision = overrides.pop("vision", VisionConfig(out_hidden_size=2048))
        base = dict(architecture="qwen2", vocab_size=151936, hidden_size=2048,
                    intermediate_size=11008, num_layers=36, num_heads=16, num_kv_heads=2,
                    head_dim=128, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_embeddings=True,
                    attention_bias=True, max_position_embeddings=128000, vision=vision)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def tiny(cls, architecture: str = "qwen2", **overrides) -> "VLMConfig":
        """A very small config for tests: 2 LM layers (H=64, head_dim 16), a 3-block vision
        tower (C=32, 2 heads) with 56 px windows, vocabulary 160 (special ids 148-151)."""
        vision = overrides.pop("vision", VisionConfig(
            depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
            window_size=56, fullatt_block_indexes=(1,)))
        base = dict(architecture=architecture, vocab_size=160, hidden_size=64,
                    intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                    rope_theta=10000.0, rms_norm_eps=1e-6, tie_embeddings=False,
                    attention_bias=True, max_position_embeddings=1024, vision=vision,
                    mrope_section=(2, 3, 3), image_token_id=150, video_token_id=151,
                    vision_start_token_id=148, vision_end_token_id=149)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def from_hf(cls, config: Mapping[str, Any], dtype: str | None = None) -> "VLMConfig":
        """From a Qwen2.5-VL `config.json` dict: the transformers 5 layout (`text_config` /
        `vision_config`) or the flat 4.x layout (text keys at the top, `rope_scaling` with
        type 'mrope')."""
        if not isinstance(config, Mapping):
            raise TypeError(f"config must be a mapping, got {type(config).__name__}")
        if config.get("model_type") != QWEN2_5_VL_MODEL_TYPE:
            raise ValueError(f"not a Qwen2.5-VL config: model_type={config.get('model_type')!r}")
        if "vision_config" not in config:
            raise ValueError("Qwen2.5-VL config.json lacks 'vision_config'")
        text = dict(config.get("text_config") or {})
        if not text:  # 4.x: text keys at the top level
            text = {k: v for k, v in config.items() if k not in ("vision_config", "model_type")}
        for key in ("tie_word_embeddings", "dtype", "torch_dtype", "rope_theta"):
            if key not in text and key in config:
                text[key] = config[key]
        tied = bool(config.get("tie_word_embeddings", False) or text.get("tie_word_embeddings", False))
        if text.get("use_sliding_window", False):
            raise ValueError("Qwen2.5-VL sliding-window attention is not supported")
        rope = dict(text.pop("rope_scaling", None) or {})
        rope.update(text.pop("rope_parameters", None) or {})
        rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
        if rope_type not in ("default", "mrope"):
            raise ValueError(f"unsupported Qwen2.5-VL rope type {rope_type!r}")
        theta = float(rope.get("rope_theta", text.get("rope_theta", 1000000.0)))
        text.update(model_type="qwen2", tie_word_embeddings=tied,
                    rope_parameters={"rope_type": "default", "rope_theta": theta})
        lm = ModelConfig.from_hf(text, dtype=dtype)
        fields = {f.name: getattr(lm, f.name) for f in dataclasses.fields(ModelConfig)}
        ids = {k: int(config[k]) for k in ("image_token_id", "video_token_id",
                                           "vision_start_token_id", "vision_end_token_id")
               if config.get(k) is not None}
        return cls(**fields, vision=VisionConfig.from_hf(config["vision_config"]),
                   mrope_section=tuple(rope.get("mrope_section", (16, 24, 24))), **ids)

    def to_hf(self) -> dict[str, Any]:
        """A transformers 5 `config.json` dict (loadable by `Qwen2_5_VLConfig`)."""
        text = self.text_config.to_hf()
        for key in ("architectures", "rope_scaling", "rope_theta", "dtype", "torch_dtype",
                    "tie_word_embeddings"):
            text.pop(key, None)
        text["model_type"] = "qwen2_5_vl_text"
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta,
                                   "mrope_section": list(self.mrope_section)}
        return {
            "architectures": ["Qwen2_5_VLForConditionalGeneration"],
            "model_type": QWEN2_5_VL_MODEL_TYPE,
            "text_config": text,
            "vision_config": self.vision.to_hf(),
            "image_token_id": self.image_token_id,
            "video_token_id": self.video_token_id,
            "vision_start_token_id": self.vision_start_token_id,
            "vision_end_token_id": self.vision_end_token_id,
            "tie_word_embeddings": self.tie_embeddings,
            "dtype": self.dtype,
            "torch_dtype": self.dtype,
        }
