"""Model configuration shared by the Flax decoder-only language models.

`ModelConfig` describes a Llama-family (Llama 2/3, SmolLM2) or Qwen2/Qwen2.5 decoder. It is
a frozen dataclass so it can be a static argument of jitted functions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

ARCHITECTURES = ("llama", "qwen2")
DTYPES = ("float32", "bfloat16")
ROPE_TYPES = ("default", "llama3")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a decoder-only transformer.

    Defaults are those of SmolLM2-135M(-Instruct).

    Attributes:
      architecture: 'llama' or 'qwen2' (Qwen2 and Qwen2.5 share one layout).
      vocab_size: number of token embeddings (V).
      hidden_size: model width (H).
      intermediate_size: SwiGLU hidden width (F).
      num_layers: number of decoder blocks.
      num_heads: query heads (Nq).
      num_kv_heads: key/value heads (Nk); Nq must be a multiple of Nk (grouped-query attention).
      head_dim: per-head width (D).
      rope_theta: RoPE base frequency.
      rms_norm_eps: RMSNorm epsilon.
      tie_embeddings: the LM head reuses the token embedding matrix.
      attention_bias: q/k/v projections carry biases (Qwen2: True); o_proj never does.
      max_position_embeddings: longest context the model was trained for (informational).
      dtype: 'float32' or 'bfloat16' for parameters and compute (norms/softmax/logits in f32).
      rope_type: 'default' or 'llama3' (Llama 3.1+ frequency scaling).
      rope_factor, rope_low_freq_factor, rope_high_freq_factor,
      rope_original_max_position_embeddings: llama3 scaling parameters (unused otherwise).
      remat_layers: recompute each decoder block in the backward pass instead of keeping its
        activations (the (B, Nq, L, L) attention weights above all): training memory then holds
        one block's activations plus the (B, L, H) block inputs, for about one more forward
        pass of compute. A memory setting for training, not part of the checkpoint; results
        are the same up to float32 rounding (tested).
      frozen_layers: in the cache-free forward (training), the first k decoder blocks run
        outside differentiation (their output is a constant to autodiff): no gradient reaches
        them or the embedding, and the backward pass (with its rematerialisation) covers only
        the last ``num_layers - k`` blocks. Training LoRA adapters of the top blocks this way
        costs about 1.8x less per token for SmolLM2 with k = 20 of 30 (CPU, B=2, L=768).
        A training setting, not part of the checkpoint; forward values are unchanged.
    """

    architecture: str = "llama"
    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_layers: int = 30
    num_heads: int = 9
    num_kv_heads: int = 3
    head_dim: int = 64
    rope_theta: float = 100000.0
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = True
    attention_bias: bool = False
    max_position_embeddings: int = 8192
    dtype: str = "float32"
    rope_type: str = "default"
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position_embeddings: int = 8192
    remat_layers: bool = False
    frozen_layers: int = 0

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise ValueError(
                f"unknown architecture {self.architecture!r}; supported: {ARCHITECTURES}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; supported: {DTYPES}")
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"unknown rope_type {self.rope_type!r}; supported: {ROPE_TYPES}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if not 0 <= self.frozen_layers <= self.num_layers:
            raise ValueError(f"frozen_layers must be in [0, num_layers], got {self.frozen_layers}")

    # ------------------------------------------------------------------ helpers
    @property
    def placeholder_token_ids(self) -> tuple[int, ...]:
        """Ids that stand for inputs other than text (a VLM's image / video pads): the sampler
        never emits them. None for a text model."""
        return ()

    @property
    def jnp_dtype(self):
        """The jnp dtype of parameters and activations."""
        return jnp.bfloat16 if self.dtype == "bfloat16" else jnp.float32

    @property
    def model_type(self) -> str:
        """HF `model_type` string."""
        return self.architecture

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------- constructors
    @classmethod
    def tiny(cls, architecture: str = "llama", **overrides) -> "ModelConfig":
        """A very small config for tests: 2 layers, H=64, 4 query / 2 KV heads, V=128."""
        base = dict(
            architecture=architecture,
            vocab_size=128,
            hidden_size=64,
            intermediate_size=128,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            rope_theta=10000.0,
            rms_norm_eps=1e-6,
            tie_embeddings=architecture == "llama",
            attention_bias=architecture == "qwen2",
            max_position_embeddings=512,
        )
        base.update(overrides)
        return cls(**base)

    @classmethod
    def from_hf(cls, config: Mapping[str, Any], dtype: str | None = None) -> "ModelConfig":
        """Builds a config from a HF `config.json` dict (transformers 4.x or 5.x layout).

        Raises ValueError for unsupported `model_type`s or missing keys.
        """
        if not isinstance(config, Mapping):
            raise TypeError(f"config must be a mapping, got {type(config).__name__}")
        model_type = config.get("model_type")
        if model_type is None:
            archs = config.get("architectures") or []
            if any("Qwen2ForCausalLM" == a for a in archs):
                model_type = "qwen2"
            elif any("LlamaForCausalLM" == a for a in archs):
                model_type = "llama"
        if model_type not in ARCHITECTURES:
            raise ValueError(
                f"unsupported model_type {model_type!r} (architectures="
                f"{config.get('architectures')}); supported: {ARCHITECTURES}"
            )
        act = config.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"unsupported hidden_act {act!r}; only SwiGLU (silu) is supported")
        if config.get("mlp_bias", False):
            raise ValueError("mlp_bias=True is not supported")
        try:
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            kw: dict[str, Any] = dict(
                architecture=model_type,
                vocab_size=int(config["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(config["intermediate_size"]),
                num_layers=int(config["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                tie_embeddings=bool(config.get("tie_word_embeddings", model_type == "llama")),
                attention_bias=bool(config.get("attention_bias", model_type == "qwen2")),
                max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            )
        except KeyError as error:
            raise ValueError(f"config.json lacks required key {error.args[0]!r}") from None
        if model_type == "qwen2":
            kw["attention_bias"] = True  # Qwen2 always has q/k/v biases
        rope = dict(config.get("rope_scaling") or {})
        rope.update(config.get("rope_parameters") or {})
        kw["rope_theta"] = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
        if rope_type == "llama3":
            kw.update(
                rope_type="llama3",
                rope_factor=float(rope["factor"]),
                rope_low_freq_factor=float(rope["low_freq_factor"]),
                rope_high_freq_factor=float(rope["high_freq_factor"]),
                rope_original_max_position_embeddings=int(
                    rope["original_max_position_embeddings"]
                ),
            )
        elif rope_type != "default":
            raise ValueError(f"unsupported rope scaling type {rope_type!r}")
        if dtype is None:
            torch_dtype = config.get("dtype") or config.get("torch_dtype")
            dtype = "bfloat16" if torch_dtype == "bfloat16" else "float32"
        kw["dtype"] = dtype
        return cls(**kw)

    def to_hf(self) -> dict[str, Any]:
        """A HF `config.json` dict (loadable by transformers' Llama/Qwen2 classes)."""
        rope: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
        if self.rope_type == "llama3":
            rope.update(
                factor=self.rope_factor,
                low_freq_factor=self.rope_low_freq_factor,
                high_freq_factor=self.rope_high_freq_factor,
                original_max_position_embeddings=self.rope_original_max_position_embeddings,
            )
        out: dict[str, Any] = {
            "architectures": [
                "LlamaForCausalLM" if self.architecture == "llama" else "Qwen2ForCausalLM"
            ],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_embeddings,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "dtype": self.dtype,
            "torch_dtype": self.dtype,
        }
        if self.rope_type == "llama3":
            out["rope_scaling"] = dict(rope)
        if self.architecture == "llama":
            out["attention_bias"] = self.attention_bias
            out["mlp_bias"] = False
        return out
