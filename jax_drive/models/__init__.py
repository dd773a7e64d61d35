"""Flax (nnx) decoder-only language models: Llama / SmolLM2 / Qwen2(.5).

Public API (the contract the sampler, RL code and model builders on top use):
  ModelConfig, CausalLM, LoRAParam                 the model (``model(input_ids)`` works)
  KVCache, LayerCache, init_cache                  stacked / per-layer key-value caches
  positions_from_mask                              RoPE positions of left-padded tokens
  decoder_block, forward_hidden, lm_logits,        one block, the whole forward, one LM head;
    unroll_params, rope_tables                       the unrolled (decode) weight layout
  head_token_logprobs                              log-probs without a (B, L, V) tensor
  load_pretrained, Tokenizer                       loading (lazy: pulls in gguf / tokenizers)
  tiny_policy, byte_tokenizer                      tiny random policies for tests (lazy)
"""

from jax_drive.models.config import ModelConfig
from jax_drive.models.layers import KVCache, LayerCache, init_cache, positions_from_mask, rope_tables
from jax_drive.models.transformer import (
    CausalLM,
    LoRAParam,
    decoder_block,
    forward_hidden,
    head_token_logprobs,
    lm_logits,
    unroll_params,
)


def __getattr__(name):  # lazy: loading pulls in safetensors / gguf / tokenizers
    if name in ("load_pretrained", "load_model", "resolve_source", "SMOLLM2_NAME"):
        from jax_drive.models import loading

        return getattr(loading, name)
    if name == "Tokenizer":
        from jax_drive.models.tokenizer import Tokenizer

        return Tokenizer
    if name in ("tiny_policy", "byte_tokenizer", "TINY_VOCAB"):
        from jax_drive.models import tiny

        return getattr(tiny, name)
    raise AttributeError(f"module 'jax_drive.models' has no attribute {name!r}")


__all__ = [
    "CausalLM",
    "KVCache",
    "LayerCache",
    "LoRAParam",
    "ModelConfig",
    "TINY_VOCAB",
    "Tokenizer",
    "byte_tokenizer",
    "head_token_logprobs",
    "decoder_block",
    "forward_hidden",
    "init_cache",
    "lm_logits",
    "load_pretrained",
    "positions_from_mask",
    "rope_tables",
    "tiny_policy",
    "unroll_params",
]
