"""Flax (nnx) decoder-only language models: Llama / SmolLM2 / Qwen2(.5).

Public API (the contract the sampler and RL code use):
  ModelConfig, KVCache, init_cache, positions_from_mask, CausalLM, LoRAParam,
  load_pretrained, Tokenizer.
"""

from jax_drive.models.config import ModelConfig
from jax_drive.models.transformer import (
    CausalLM,
    KVCache,
    LoRAParam,
    chunked_token_logprobs,
    init_cache,
    positions_from_mask,
)


def __getattr__(name):  # lazy: loading pulls in safetensors / gguf / tokenizers
    if name in ("load_pretrained", "load_model", "resolve_source", "SMOLLM2_NAME"):
        from jax_drive.models import loading

        return getattr(loading, name)
    if name == "Tokenizer":
        from jax_drive.models.tokenizer import Tokenizer

        return Tokenizer
    raise AttributeError(f"module 'jax_drive.models' has no attribute {name!r}")


__all__ = [
    "CausalLM",
    "KVCache",
    "LoRAParam",
    "ModelConfig",
    "Tokenizer",
    "chunked_token_logprobs",
    "init_cache",
    "load_pretrained",
    "positions_from_mask",
]
