"""Behaviour of the Flax CausalLM: shapes, KV cache, left padding, chunked log-probs,
config parsing, loading errors, tokenizer.

Parity against transformers lives in test_model_parity.py; LoRA in test_lora.py.
"""

import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_drive.models import (
    CausalLM,
    KVCache,
    ModelConfig,
    head_token_logprobs,
    init_cache,
    positions_from_mask,
)
from jax_drive.models.loading import WeightLoadError, load_pretrained, unpermute_qk
from jax_drive.models.tiny import byte_tokenizer
from jax_drive.models.tokenizer import Tokenizer

ARCHS = ("llama", "qwen2")


def _tiny_model(architecture: str):
    config = ModelConfig.tiny(architecture)
    model = CausalLM(config, rngs=nnx.Rngs(1))
    # non-trivial norms / biases so the test catches mis-wired parameters
    key = jax.random.key(7)
    model.final_norm.set_value(1.0 + 0.1 * jax.random.normal(key, model.final_norm.shape))
    if model.layers.q_proj.bias is not None:
        for name in ("q_proj", "k_proj", "v_proj"):
            proj = getattr(model.layers, name)
            proj.bias.set_value(0.1 * jax.random.normal(jax.random.fold_in(key, hash(name) % 99),
                                                        proj.bias.shape))
    return config, model


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request):
    return _tiny_model(request.param)


def _batch(config, lengths, total, seed=0):
    """Left-padded random batch: ids (B, total), mask (B, total)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, config.vocab_size, size=(len(lengths), total)).astype(np.int32)
    mask = np.zeros((len(lengths), total), bool)
    for b, n in enumerate(lengths):
        mask[b, total - n:] = True
    ids = np.where(mask, ids, 0)
    return jnp.asarray(ids), jnp.asarray(mask)


def test_forward_shapes_and_dtypes(tiny):
    config, model = tiny
    ids, mask = _batch(config, [5, 3], 5)
    logits, cache = model(ids, positions_from_mask(mask), mask)
    assert logits.shape == (2, 5, config.vocab_size)
    assert logits.dtype == jnp.float32
    assert cache is None
    assert bool(jnp.all(jnp.isfinite(logits)))
    hidden = model.hidden_states(ids, positions_from_mask(mask), mask)
    assert hidden.shape == (2, 5, config.hidden_size)


def test_left_padding_matches_unpadded(tiny):
    """Real tokens of a left-padded row get the logits of the same sequence unpadded."""
    config, model = tiny
    ids, mask = _batch(config, [6, 3], 6)
    logits, _ = model(ids, positions_from_mask(mask), mask)
    short = ids[1:, 3:]
    ones = jnp.ones_like(short, bool)
    ref, _ = model(short, positions_from_mask(ones), ones)
    np.testing.assert_allclose(logits[1, 3:], ref[0], atol=1e-5, rtol=1e-5)


def test_causality(tiny):
    """Changing a later token never changes earlier logits."""
    config, model = tiny
    ids, mask = _batch(config, [6], 6)
    pos = positions_from_mask(mask)
    a, _ = model(ids, pos, mask)
    b, _ = model(ids.at[0, 4].set((ids[0, 4] + 1) % config.vocab_size), pos, mask)
    np.testing.assert_allclose(a[0, :4], b[0, :4], atol=1e-6)
    assert float(jnp.abs(a[0, 4:] - b[0, 4:]).max()) > 1e-4


def test_cache_prefill_and_decode_equal_full_forward(tiny):
    config, model = tiny
    total, extra = 6, 4
    prompt_ids, prompt_mask = _batch(config, [6, 2, 4], total, seed=3)
    new_ids, _ = _batch(config, [extra] * 3, extra, seed=4)
    full_ids = jnp.concatenate([prompt_ids, new_ids], axis=1)
    full_mask = jnp.concatenate([prompt_mask, jnp.ones((3, extra), bool)], axis=1)
    full_pos = positions_from_mask(full_mask)
    ref, _ = model(full_ids, full_pos, full_mask)

    cache = init_cache(config, 3, 16)
    assert cache.mask.shape == (3, 16) and not bool(cache.mask.any())
    step = nnx.jit(lambda m, i, p, a, c, idx: m(i, p, a, c, idx))
    logits, cache = step(model, full_ids[:, :total], full_pos[:, :total], prompt_mask, cache, 0)
    np.testing.assert_allclose(np.asarray(logits)[np.asarray(prompt_mask)],
                               np.asarray(ref[:, :total])[np.asarray(prompt_mask)], atol=1e-5)
    for t in range(total, total + extra):
        logits, cache = step(model, full_ids[:, t:t + 1], full_pos[:, t:t + 1],
                             full_mask[:, t:t + 1], cache, jnp.int32(t))
        np.testing.assert_allclose(logits[:, 0], ref[:, t], atol=1e-5)
    np.testing.assert_array_equal(np.asarray(cache.mask[:, :total + extra]),
                                  np.asarray(full_mask))
    assert not bool(cache.mask[:, total + extra:].any())


def test_blocked_prefill_writes_the_same_cache(tiny):
    """CausalLM.prefill (blocked causal attention over the prompt: 3 query blocks at L = 300)
    fills the cache as the generic cached call does, and decoding from it gives the same logits."""
    config, model = tiny
    total = 300
    ids, mask = _batch(config, [300, 40, 170], total, seed=6)
    pos = positions_from_mask(mask)
    generic = nnx.jit(lambda m, c: m(ids, pos, mask, c, 0)[1])(model, init_cache(config, 3, total + 4))
    blocked = nnx.jit(lambda m, c: m.prefill(ids, pos, mask, c))(model, init_cache(config, 3, total + 4))
    real = np.asarray(mask)
    for a, b in ((generic.k, blocked.k), (generic.v, blocked.v)):
        np.testing.assert_allclose(np.asarray(b)[:, :, :total][:, real], np.asarray(a)[:, :, :total][:, real],
                                   atol=1e-5)
    np.testing.assert_array_equal(np.asarray(blocked.mask), np.asarray(generic.mask))
    nxt = jnp.asarray([[5], [6], [7]], jnp.int32)
    one = jnp.ones((3, 1), bool)
    la, _ = model(nxt, pos[:, -1:] + 1, one, generic, total)
    lb, _ = model(nxt, pos[:, -1:] + 1, one, blocked, total)
    np.testing.assert_allclose(lb, la, atol=1e-5)


def test_call_defaults_positions_and_mask_like_transformers(tiny):
    """model(ids) numbers the tokens 0..L-1 and treats all of them as real; with a cache the
    default positions continue after the cached real tokens."""
    config, model = tiny
    ids, _ = _batch(config, [6, 6], 6, seed=8)
    ones = jnp.ones(ids.shape, bool)
    explicit, _ = model(ids, positions_from_mask(ones), ones)
    implicit, cache = model(ids)
    assert cache is None
    np.testing.assert_array_equal(np.asarray(implicit), np.asarray(explicit))
    np.testing.assert_array_equal(np.asarray(model.hidden_states(ids)),
                                  np.asarray(model.hidden_states(ids, positions_from_mask(ones), ones)))
    first, cache = model(ids[:, :4], cache=init_cache(config, 2, 8))
    rest, _ = model(ids[:, 4:], cache=cache, cache_index=4)
    np.testing.assert_allclose(np.asarray(jnp.concatenate([first, rest], 1)), np.asarray(explicit),
                               atol=1e-5)


def _lora_qwen():
    """Tiny Qwen2 (q/k/v biases) with non-zero LoRA adapters on some projections."""
    from jax_drive.models.lora import apply_lora

    config, model = _tiny_model("qwen2")
    apply_lora(model, rank=2, alpha=4.0, targets=("q_proj", "v_proj", "up_proj", "down_proj"))
    for i, name in enumerate(("q_proj", "v_proj", "up_proj", "down_proj")):
        proj = getattr(model.layers, name)
        proj.lora_b[...] = 0.3 * jax.random.normal(jax.random.key(i), proj.lora_b.shape)
    return config, model


@pytest.mark.parametrize("which", ["llama", "qwen2_lora"])
def test_unrolled_layout_and_per_row_cache_index_equal_stacked_forward(which):
    """The unrolled weight layout (per-layer, fused q/k/v and gate/up, LoRA folded in) with a
    LayerCache gives the stacked model's logits; rows written at their own cache slots
    (right-padded prompts, (B,) cache_index) give each unpadded sequence's logits."""
    from jax_drive.models import LayerCache, unroll_params
    from jax_drive.models.transformer import forward_logits

    config, model = _tiny_model("llama") if which == "llama" else _lora_qwen()
    stacked = model.arrays()
    unrolled = unroll_params(stacked)
    assert isinstance(unrolled["layers"], tuple) and "qkv_proj" in unrolled["layers"][0]
    lengths = [6, 3, 5]
    rng = np.random.default_rng(2)
    seqs = np.zeros((3, 7), np.int32)  # right padded; column n holds the next token
    for b, n in enumerate(lengths):
        seqs[b, :n + 1] = rng.integers(3, config.vocab_size, size=n + 1)
    # causal attention: a right-padded row's first n + 1 logits are the unpadded sequence's
    ref = np.asarray(model(jnp.asarray(seqs))[0])
    mask = jnp.asarray(np.arange(6)[None] < np.asarray(lengths)[:, None])
    ids = jnp.where(mask, jnp.asarray(seqs[:, :6]), 0)
    pos = jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), (3, 6))
    index = jnp.asarray(lengths, jnp.int32)
    nxt = jnp.asarray(seqs[np.arange(3), lengths][:, None])
    one = jnp.ones((3, 1), bool)
    for params, cache in ((stacked, init_cache(config, 3, 10)),
                          (unrolled, LayerCache.from_stacked(init_cache(config, 3, 10)))):
        full, _ = forward_logits(params, config, ids, pos, mask, None, jnp.int32(0))
        first, cache = forward_logits(params, config, ids, pos, mask, cache, jnp.int32(0))
        step, cache = forward_logits(params, config, nxt, index[:, None], one, cache, index)
        for b, n in enumerate(lengths):
            np.testing.assert_allclose(full[b, :n], ref[b, :n], atol=2e-5)
            np.testing.assert_allclose(first[b, :n], ref[b, :n], atol=2e-5)
            np.testing.assert_allclose(step[b, 0], ref[b, n], atol=2e-5)
        assert np.asarray(cache.mask)[np.arange(3), lengths].all()


def test_cache_chunked_prefill(tiny):
    """Writing the prompt in two chunks gives the same logits as one pass."""
    config, model = tiny
    ids, mask = _batch(config, [7, 5], 7, seed=5)
    pos = positions_from_mask(mask)
    ref, _ = model(ids, pos, mask)
    cache = init_cache(config, 2, 10)
    a, cache = model(ids[:, :4], pos[:, :4], mask[:, :4], cache, 0)
    b, cache = model(ids[:, 4:], pos[:, 4:], mask[:, 4:], cache, 4)
    np.testing.assert_allclose(b, ref[:, 4:], atol=1e-5)


def test_cache_overflow_and_shape_errors(tiny):
    config, model = tiny
    ids, mask = _batch(config, [4], 4)
    with pytest.raises(ValueError, match="overflow"):
        model(ids, positions_from_mask(mask), mask, init_cache(config, 1, 3), 0)
    with pytest.raises(ValueError, match="batch"):
        model(ids, positions_from_mask(mask), mask, init_cache(config, 2, 8), 0)
    with pytest.raises(ValueError, match="must match"):
        model(ids, positions_from_mask(mask)[:, :2], mask)
    with pytest.raises(ValueError):
        init_cache(config, 0, 4)


def test_bfloat16_model_close_to_float32():
    """dtype handling is architecture independent: llama suffices."""
    config, model = _tiny_model("llama")
    graph, state = nnx.split(model)
    bf_config = config.replace(dtype="bfloat16")
    bf_model = CausalLM(bf_config)
    bf_state = jax.tree.map(lambda x: x.astype(jnp.bfloat16), state)
    nnx.update(bf_model, bf_state)
    assert bf_model.embed[...].dtype == jnp.bfloat16
    ids, mask = _batch(config, [5, 5], 5)
    pos = positions_from_mask(mask)
    ref, _ = model(ids, pos, mask)
    out, _ = bf_model(ids, pos, mask)
    assert out.dtype == jnp.float32
    assert float(jnp.abs(out - ref).max()) < 0.05 * float(jnp.abs(ref).max()) + 0.02
    cache = init_cache(bf_config, 2, 8)
    assert cache.k.dtype == jnp.bfloat16
    out2, _ = bf_model(ids, pos, mask, cache, 0)
    np.testing.assert_allclose(out2, out, atol=5e-2)


def test_token_logprobs_matches_log_softmax_and_grad():
    """One architecture suffices: qwen2 also covers biases."""
    config, model = _tiny_model("qwen2")
    ids, mask = _batch(config, [6, 4, 5], 6, seed=11)
    pos = positions_from_mask(mask)
    targets = jnp.roll(ids, -1, axis=1)
    logits, _ = model(ids, pos, mask)
    ref = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
    for chunk in (5, 256):
        out = model.token_logprobs(ids, pos, mask, targets, chunk_size=chunk)
        np.testing.assert_allclose(out, ref, atol=2e-5)

    def naive(m):
        lg, _ = m(ids, pos, mask)
        lp = jnp.take_along_axis(jax.nn.log_softmax(lg), targets[..., None], -1)[..., 0]
        return jnp.sum(jnp.where(mask, lp, 0.0))

    def chunked(m):
        return jnp.sum(jnp.where(mask, m.token_logprobs(ids, pos, mask, targets, 4), 0.0))

    g_ref = nnx.grad(naive)(model)
    g_out = nnx.grad(chunked)(model)
    for a, b in zip(jax.tree.leaves(g_ref), jax.tree.leaves(g_out)):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("block", [5, 64])
def test_blocked_causal_attention_equals_full(block):
    """Query-blocked causal self-attention = full attention on every real row, values and
    gradients, including a last block shorter than the others and left-padded rows."""
    from jax_drive.models.layers import attention, causal_self_attention

    b, l, nq, nk, d = 3, 23, 6, 2, 8
    rng = np.random.default_rng(block)
    q, k, v = (jnp.asarray(rng.standard_normal((b, l, n, d)), jnp.float32) for n in (nq, nk, nk))
    lengths = np.array([23, 17, 5])
    keys_ok = np.arange(l)[None, :] >= (l - lengths)[:, None]  # left padding
    mask = jnp.asarray(np.tril(np.ones((l, l), bool))[None] & keys_ok[:, None, :])
    real = jnp.asarray(keys_ok)[:, :, None]
    full = jax.jit(attention)(q, k, v, mask)
    blocked = jax.jit(causal_self_attention, static_argnames="block")(q, k, v, mask, block=block)
    np.testing.assert_allclose(np.where(real, blocked, 0), np.where(real, full, 0), atol=1e-6)

    def loss(fn):
        return lambda q, k, v: jnp.sum(jnp.where(real, fn(q, k, v), 0.0) ** 2)

    g_full = jax.jit(jax.grad(loss(lambda *a: attention(*a, mask)), argnums=(0, 1, 2)))(q, k, v)
    g_block = jax.jit(jax.grad(loss(lambda *a: causal_self_attention(*a, mask, block=block)),
                               argnums=(0, 1, 2)))(q, k, v)
    for x, y in zip(g_block, g_full):
        np.testing.assert_allclose(x, y, atol=1e-5)


def test_attention_head_major_equals_attention():
    from jax_drive.models.layers import attention, attention_head_major

    ks = jax.random.split(jax.random.key(3), 3)
    q = jax.random.normal(ks[0], (2, 3, 6, 8))
    k = jax.random.normal(ks[1], (2, 5, 2, 8))
    v = jax.random.normal(ks[2], (2, 5, 2, 8))
    mask = jnp.asarray(np.random.default_rng(0).random((2, 3, 5)) > 0.3).at[:, :, 0].set(True)
    np.testing.assert_allclose(attention_head_major(q, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), mask),
                               attention(q, k, v, mask), atol=1e-5)


def test_remat_layers_same_values_and_gradients():
    """remat_layers only changes what the backward pass keeps, never the numbers."""
    import dataclasses

    from jax_drive.models.transformer import forward_token_logprobs

    config = ModelConfig.tiny("qwen2")
    model = CausalLM(config, rngs=nnx.Rngs(3))
    params = model.arrays()
    ids, mask = _batch(config, [7, 5], 7, seed=5)
    pos = positions_from_mask(mask)
    targets = jnp.roll(ids, -1, axis=1)

    def loss(p, cfg):
        lp = forward_token_logprobs(p, cfg, ids, pos, mask, targets, 4)
        return jnp.sum(jnp.where(mask, lp, 0.0))

    remat = dataclasses.replace(config, remat_layers=True)
    v_plain, g_plain = jax.value_and_grad(loss)(params, config)
    v_remat, g_remat = jax.value_and_grad(loss)(params, remat)
    np.testing.assert_allclose(v_remat, v_plain, rtol=1e-6)
    # Recomputation may fuse differently: equal up to float32 rounding.
    for a, b in zip(jax.tree.leaves(g_remat), jax.tree.leaves(g_plain)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # The option is really on: the layer scan adds a remat to the program (the chunked
    # log-prob head has one either way).
    count = lambda cfg: str(jax.make_jaxpr(jax.grad(loss), static_argnums=1)(params, cfg)).count("remat")
    assert count(remat) > count(config)


def test_token_logprobs_never_materialises_full_logits():
    """No float32 array with B*L*V elements appears in the jaxpr (forward or backward)."""
    config = ModelConfig.tiny("llama", vocab_size=512)
    model = CausalLM(config)
    b, l, chunk = 4, 32, 8
    ids = jnp.zeros((b, l), jnp.int32)
    mask = jnp.ones((b, l), bool)
    pos = positions_from_mask(mask)
    graph, state = nnx.split(model)

    def loss(state):
        m = nnx.merge(graph, state)
        return m.token_logprobs(ids, pos, mask, ids, chunk_size=chunk).sum()

    big = b * l * config.vocab_size

    def sizes(jaxpr):
        for eqn in jaxpr.eqns:
            for var in eqn.outvars:
                yield var.aval.size, var.aval.dtype
            stack = list(eqn.params.values())
            while stack:
                param = stack.pop()
                if isinstance(param, (list, tuple)):
                    stack.extend(param)
                elif hasattr(param, "eqns"):
                    yield from sizes(param)
                elif hasattr(getattr(param, "jaxpr", None), "eqns"):
                    yield from sizes(param.jaxpr)

    for fn in (loss, jax.grad(loss)):
        jaxpr = jax.make_jaxpr(fn)(state).jaxpr
        largest = max(size for size, dtype in sizes(jaxpr) if dtype == jnp.float32)
        assert largest < big, (largest, big)
        assert largest >= chunk * config.vocab_size  # the chunk itself is there
    # the naive forward does materialise it (the check can fail)
    jaxpr = jax.make_jaxpr(lambda s: nnx.merge(graph, s)(ids, pos, mask)[0])(state).jaxpr
    assert max(size for size, _ in sizes(jaxpr)) >= big


@pytest.mark.parametrize("b,l,chunk,tied", [(1, 1, 1, True), (2, 7, 3, False), (3, 5, 30, True)])
def test_head_token_logprobs_matches_log_softmax(b, l, chunk, tied):
    """Both head layouts (tied (V, H) embedding, untied (H, V) lm_head), ragged chunks."""
    key = jax.random.key(b * 100 + l)
    hidden = jax.random.normal(key, (b, l, 8))
    head = jax.random.normal(jax.random.fold_in(key, 1), (8, 11))
    targets = jax.random.randint(jax.random.fold_in(key, 2), (b, l), 0, 11)
    params = {"embed": head.T, "lm_head": None} if tied else {"embed": None, "lm_head": head}
    out = head_token_logprobs(params, hidden, targets, chunk, temperature=0.7)
    ref = jnp.take_along_axis(jax.nn.log_softmax(hidden @ head / 0.7), targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(out, ref, atol=1e-5)


def test_positions_from_mask():
    mask = jnp.array([[0, 0, 1, 1], [1, 1, 1, 1]], bool)
    np.testing.assert_array_equal(positions_from_mask(mask), [[0, 0, 0, 1], [0, 1, 2, 3]])
    np.testing.assert_array_equal(positions_from_mask(mask, jnp.array([2, 0])),
                                  [[1, 1, 2, 3], [0, 1, 2, 3]])


def test_kvcache_is_pytree():
    cache = init_cache(ModelConfig.tiny(), 2, 5)
    assert isinstance(cache, KVCache)
    leaves = jax.tree.leaves(cache)
    assert len(leaves) == 3
    assert cache.k.shape == (2, 2, 5, 2, 16)


# ----------------------------------------------------------------------------- config
def test_config_validation():
    with pytest.raises(ValueError, match="architecture"):
        ModelConfig.tiny("gpt2")
    with pytest.raises(ValueError, match="multiple"):
        ModelConfig.tiny(num_heads=3, num_kv_heads=2)
    with pytest.raises(ValueError, match="dtype"):
        ModelConfig.tiny(dtype="float16")


def test_config_from_hf_roundtrip_and_errors():
    for arch in ARCHS:
        config = ModelConfig.tiny(arch, rope_theta=5e5)
        assert ModelConfig.from_hf(config.to_hf()) == config
    llama3 = ModelConfig.tiny(rope_type="llama3", rope_factor=32.0)
    assert ModelConfig.from_hf(llama3.to_hf()) == llama3
    old_style = dict(ModelConfig.tiny().to_hf())
    old_style.pop("rope_parameters")
    assert ModelConfig.from_hf(old_style).rope_theta == 10000.0
    with pytest.raises(ValueError, match="unsupported model_type"):
        ModelConfig.from_hf({"model_type": "mistral"})
    bad = dict(ModelConfig.tiny().to_hf())
    del bad["hidden_size"]
    with pytest.raises(ValueError, match="hidden_size"):
        ModelConfig.from_hf(bad)


def test_llama3_rope_changes_low_frequencies_only():
    from jax_drive.models.layers import rope_inv_freq

    base = rope_inv_freq(ModelConfig.tiny(head_dim=64))
    scaled = rope_inv_freq(ModelConfig.tiny(head_dim=64, rope_type="llama3",
                                            rope_original_max_position_embeddings=64))
    np.testing.assert_allclose(scaled[0], base[0])  # highest frequency kept
    np.testing.assert_allclose(scaled[-1], base[-1] / 8.0, rtol=1e-6)  # lowest divided


# ----------------------------------------------------------------------------- loading
def test_unpermute_qk_inverts_llama_cpp_permutation():
    heads, d, h = 3, 8, 5
    w = np.arange(heads * d * h, dtype=np.float32).reshape(heads * d, h)
    permuted = w.reshape(heads, 2, d // 2, h).swapaxes(1, 2).reshape(w.shape)  # llama.cpp
    np.testing.assert_array_equal(unpermute_qk(permuted, heads), w)
    assert not np.array_equal(permuted, w)


def _tiny_tokenizer_files(path):
    byte_tokenizer().save(path)


def _save_tiny(tmp_path, arch="qwen2"):
    from jax_drive.models.export import save_safetensors

    config = ModelConfig.tiny(arch, vocab_size=259)
    model = CausalLM(config, rngs=nnx.Rngs(3))
    save_safetensors(model, tmp_path)
    _tiny_tokenizer_files(tmp_path)
    return model, config


def test_load_roundtrip_without_torch(tmp_path):
    """Saving and loading an HF dir round-trips exactly, and loading never imports torch."""
    model, config = _save_tiny(tmp_path)
    script = textwrap.dedent(f"""
        import sys
        import jax.numpy as jnp
        from jax_drive.models import load_pretrained, positions_from_mask
        m, c, tok = load_pretrained({str(tmp_path)!r})
        ids = jnp.array([tok.encode("hello")], jnp.int32)
        mask = jnp.ones_like(ids, bool)
        logits, _ = m(ids, positions_from_mask(mask), mask)
        assert "torch" not in sys.modules, "torch was imported"
        assert "transformers" not in sys.modules, "transformers was imported"
        print(float(logits.sum()))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded, loaded_config, tok = load_pretrained(tmp_path)
    assert loaded_config == config
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(loaded))):
        np.testing.assert_array_equal(a, b)
    ids = jnp.array([tok.encode("hello")], jnp.int32)
    mask = jnp.ones_like(ids, bool)
    ref, _ = model(ids, positions_from_mask(mask), mask)
    assert abs(float(out.stdout.strip()) - float(ref.sum())) < 1e-3 * (1 + abs(float(ref.sum())))


def test_load_bfloat16(tmp_path):
    _save_tiny(tmp_path, "llama")
    model, config, _ = load_pretrained(tmp_path, dtype="bfloat16")
    assert config.dtype == "bfloat16"
    assert model.layers.q_proj.kernel[...].dtype == jnp.bfloat16


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither"):
        load_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightLoadError, match="config.json"):
        load_pretrained(tmp_path / "empty")
    not_gguf = tmp_path / "weights.bin"
    not_gguf.write_bytes(b"xx")
    with pytest.raises(WeightLoadError, match="gguf"):
        load_pretrained(not_gguf)
    bad_gguf = tmp_path / "bad.gguf"
    bad_gguf.write_bytes(b"not a gguf file at all")
    with pytest.raises(WeightLoadError, match="cannot read"):
        load_pretrained(bad_gguf)

    ckpt = tmp_path / "ckpt"
    _save_tiny(ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    # unknown architecture
    (ckpt / "config.json").write_text(json.dumps({**cfg, "model_type": "mamba"}))
    with pytest.raises(ValueError, match="unsupported model_type"):
        load_pretrained(ckpt)
    # shape mismatch
    (ckpt / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 96}))
    with pytest.raises(WeightLoadError, match="shape"):
        load_pretrained(ckpt)
    # missing tensors (more layers than stored)
    (ckpt / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    with pytest.raises(WeightLoadError, match="lacks"):
        load_pretrained(ckpt)
    # no weights
    (ckpt / "config.json").write_text(json.dumps(cfg))
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(WeightLoadError, match="safetensors"):
        load_pretrained(ckpt)


def test_sharded_safetensors(tmp_path):
    from jax_drive.models.export import save_safetensors

    config = ModelConfig.tiny("llama", tie_embeddings=False)
    model = CausalLM(config, rngs=nnx.Rngs(2))
    save_safetensors(model, tmp_path, max_shard_bytes=40_000)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    from jax_drive.models.loading import load_model

    loaded, _ = load_model(tmp_path)
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(loaded))):
        np.testing.assert_array_equal(a, b)
    next(tmp_path.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(WeightLoadError, match="missing"):
        load_model(tmp_path)


# ----------------------------------------------------------------------------- tokenizer
def test_tokenizer_dir_roundtrip(tmp_path):
    tok = byte_tokenizer()
    tok.save(tmp_path)
    loaded = Tokenizer.from_dir(tmp_path)
    text = "héllo <|im_start|>x"
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.decode(loaded.encode("héllo")) == "héllo"
    assert loaded.eos_token_ids == tok.eos_token_ids
    assert loaded.pad_token_id == tok.pad_token_id
    prompt = loaded.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError):
        loaded.apply_chat_template([{"content": "no role"}])
    with pytest.raises(ValueError):
        Tokenizer.from_dir(tmp_path / "missing")


# ----------------------------------------------------------------------------- CLIs
def test_convert_cli_roundtrip_and_errors(tmp_path, capsys):
    from jax_drive.cli import main

    model, config = _save_tiny(tmp_path / "src", "llama")
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--dtype", "bfloat16"]) == 0
    loaded, loaded_config, tok = load_pretrained(tmp_path / "out", dtype=None)
    assert loaded_config.dtype == "bfloat16"
    np.testing.assert_allclose(
        np.asarray(loaded.layers.q_proj.kernel[...], np.float32),
        np.asarray(model.layers.q_proj.kernel[...].astype(jnp.bfloat16), np.float32),
    )
    assert tok.encode("abc") == Tokenizer.from_dir(tmp_path / "src").encode("abc")
    # refuses a non-empty output, and reports a missing source without a traceback
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "out")]) == 2
    assert main(["convert", str(tmp_path / "missing"), str(tmp_path / "out2")]) == 2
    assert "error" in capsys.readouterr().err


def test_chat_cli_one_shot(tmp_path, capsys):
    from jax_drive.cli import main

    _save_tiny(tmp_path, "llama")
    assert main(["chat", "--model", str(tmp_path), "--prompt", "hi", "--max-new-tokens", "3"]) == 0
    captured = capsys.readouterr()
    assert "3 tokens" in captured.err or "tokens" in captured.err
    assert main(["chat", "--model", str(tmp_path / "nope"), "--prompt", "hi"]) == 2


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_roundtrip_tiny(arch, tmp_path):
    """A tiny model written as GGUF the way llama.cpp's converter does (ggml names, Llama q/k
    rows permuted, one Q8_0 tensor) loads back to the same weights."""
    import gguf

    from jax_drive.models.export import hf_state_dict
    from jax_drive.models.loading import load_model

    config = ModelConfig.tiny(arch, vocab_size=96, tie_embeddings=arch == "llama")
    model = CausalLM(config, rngs=nnx.Rngs(4))
    state = {k: np.asarray(v, np.float32) for k, v in hf_state_dict(model).items()}
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)

    def permute(w, heads):  # llama.cpp's rotary layout
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    for key, value in state.items():
        if key == "model.embed_tokens.weight":
            name = "token_embd.weight"
        elif key == "model.norm.weight":
            name = "output_norm.weight"
        elif key == "lm_head.weight":
            name = "output.weight"
        else:
            _, _, idx, rest = key.split(".", 3)
            module, suffix = rest.rsplit(".", 1)
            name = f"blk.{idx}.{names[module]}.{suffix}"
            if arch == "llama" and names[module] == "attn_q":
                value = permute(value, config.num_heads)
            elif arch == "llama" and names[module] == "attn_k":
                value = permute(value, config.num_kv_heads)
        if name == "blk.0.ffn_up.weight":  # one quantised tensor
            quant = gguf.quants.quantize(value, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, quant, raw_shape=quant.shape,
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            state[key] = gguf.quants.dequantize(quant, gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, np.ascontiguousarray(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    loaded, loaded_config = load_model(path)
    assert loaded_config == config
    for key, value in hf_state_dict(loaded).items():
        np.testing.assert_allclose(np.asarray(value), state[key], atol=1e-6, err_msg=key)
