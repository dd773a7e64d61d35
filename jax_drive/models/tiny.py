"""Tiny random policies for smoke tests, CI and CLI dry runs (no downloads).

``byte_tokenizer()`` is a real byte-level tokenizer (one token per UTF-8 byte, no merges)
with ChatML special tokens, wrapped in :class:`jax_drive.models.Tokenizer`, so chat
templates, encode/decode and stop tokens behave as with SmolLM2 but every id is < 320.
``tiny_policy()`` pairs it with a randomly initialised ``CausalLM`` (``ModelConfig.tiny``)
and optionally LoRA adapters; ``peaked_tiny_model()`` is a tiny model with peaked logits for
sampler tests.
"""

from __future__ import annotations

import jax
from flax import nnx

from jax_drive.models.config import ModelConfig
from jax_drive.models.transformer import CausalLM

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen2.5-VL's image tokens, after the ChatML ones (ids 259-262) in the vision-language policy
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
TINY_VOCAB = 320  # 256 bytes + 3 specials (+ 4 vision tokens), rounded up
# Named sizes of the random byte-level policy (``ModelConfig.tiny`` overrides): 'tiny' for
# tests (2 layers, width 64, ~0.1 M parameters); 'tiny-1m' for studies that train a policy
# from scratch in minutes on a CPU (4 layers, width 128, ~0.8 M parameters).
TINY_SIZES = {
    "tiny": {},
    "tiny-1m": dict(hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32),
}


def _backend(extra_special: tuple[str, ...] = ()):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS) + list(extra_special))
    return backend


def byte_tokenizer(extra_special: tuple[str, ...] = ()):
    """A byte-level ChatML tokenizer: 256 byte ids + <|endoftext|> (pad), <|im_start|>, <|im_end|> (eos),
    then the ``extra_special`` tokens (ids 259, 260, ...)."""
    from jax_drive.models.tokenizer import Tokenizer

    backend = _backend(tuple(extra_special))
    return Tokenizer(
        backend,
        chat_template=None,  # ChatML fallback
        eos_token_ids=(backend.token_to_id("<|im_end|>"),),
        pad_token_id=backend.token_to_id("<|endoftext|>"),
    )


def tiny_policy(seed: int = 0, architecture: str = "llama", lora_rank: int | None = 4, size: str = "tiny",
                **overrides):
    """(model, config, tokenizer): a random tiny CausalLM over the byte tokenizer.

    ``ModelConfig.tiny(architecture, vocab_size=TINY_VOCAB, max_position_embeddings=4096,
    **TINY_SIZES[size], **overrides)`` initialised from ``seed``; equal arguments give equal,
    independent models.
    With ``lora_rank`` set, LoRA adapters are applied (B initialised to zero as usual, so the
    adapted model equals the base model until trained).
    """
    if size not in TINY_SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; choose from {', '.join(TINY_SIZES)}")
    config = ModelConfig.tiny(architecture, vocab_size=TINY_VOCAB, max_position_embeddings=4096,
                              **{**TINY_SIZES[size], **overrides})
    model = CausalLM(config, rngs=nnx.Rngs(int(seed)))
    if lora_rank:
        from jax_drive.models.lora import apply_lora

        apply_lora(model, rank=lora_rank, alpha=2.0 * lora_rank, rngs=nnx.Rngs(int(seed) + 1))
    return model, config, byte_tokenizer()


def tiny_vlm_policy(seed: int = 0, lora_rank: int | None = 4, **overrides):
    """(model, config, tokenizer): a random tiny Qwen2.5-VL (``VLMConfig.tiny(vocab_size=TINY_VOCAB,
    max_position_embeddings=4096, **overrides)``) over the byte tokenizer with the vision tokens,
    wrapped in an ``ImageTokenizer`` (Qwen2.5-VL's image processing). LoRA as in
    :func:`tiny_policy` (on the language model)."""
    from jax_drive.models.qwen2_5_vl import Qwen2_5_VL, VLMConfig
    from jax_drive.models.qwen2_5_vl.processor import ImageTokenizer

    tokenizer = byte_tokenizer(VISION_TOKENS)
    start, end, image, video = (tokenizer.token_to_id(t) for t in VISION_TOKENS)
    config = VLMConfig.tiny(vocab_size=TINY_VOCAB, max_position_embeddings=4096, vision_start_token_id=start,
                            vision_end_token_id=end, image_token_id=image, video_token_id=video, **overrides)
    model = Qwen2_5_VL(config, rngs=nnx.Rngs(int(seed)))
    if lora_rank:
        from jax_drive.models.lora import apply_lora

        apply_lora(model, rank=lora_rank, alpha=2.0 * lora_rank, rngs=nnx.Rngs(int(seed) + 1))
    return model, config, ImageTokenizer(tokenizer, config)


def peaked_tiny_model(architecture: str = "llama", seed: int = 0, scale: float = 10.0,
                      **overrides) -> CausalLM:
    """A random ``ModelConfig.tiny(architecture, tie_embeddings=False, **overrides)`` model
    whose weight matrices are multiplied by ``scale``: peaked logits (clear argmaxes, varied
    greedy outputs) instead of the near-uniform ones of a 0.02-std initialisation."""
    config = ModelConfig.tiny(architecture, **{"tie_embeddings": False, **overrides})
    graphdef, state = nnx.split(CausalLM(config, rngs=nnx.Rngs(int(seed))))
    return nnx.merge(graphdef, jax.tree.map(lambda x: x * scale if x.ndim >= 2 else x, state))
