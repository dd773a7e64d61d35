"""Tests of the jitted KV-cache sampler (jax_drive.sampling.sampler and its modules) and JaxEngine.

References: a plain non-cached argmax loop over the same model, the model's own
log-softmax on the full (teacher-forced) sequence, and numpy re-implementations of
top-k / top-p filtering. SmolLM2 end to end against transformers' greedy ``generate`` is in
tests/test_model_parity.py.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

from jax_drive.models import CausalLM
from jax_drive.models.tiny import peaked_tiny_model
from jax_drive.sampling import (
    Completion,
    Engine,
    JaxEngine,
    SamplerConfig,
    SamplingParams,
    generate_tokens,
)
from jax_drive.sampling.compiles import CompileCounter
from jax_drive.sampling.sampler import compiled_programs
from jax_drive.sampling.shapes import bucket_size, left_pad
from jax_drive.sampling.weights import DecodeWeightCache, unrolled_weights
from jax_drive.sampling.selection import NEG_INF, categorical_rows, filter_logits, select_tokens

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [42]]


@pytest.fixture(scope="module")
def model() -> CausalLM:
    return peaked_tiny_model("llama")


REF_LEN = 32  # fixed reference buffer: one compilation for every reference call


@pytest.fixture(scope="module")
def ref_logprobs(model):
    """seq -> (len(seq), V) log_softmax of the plain non-cached forward pass.

    The sequence is right-padded to REF_LEN; attention is causal, so positions < len(seq)
    do not see the padding (this just keeps one compiled shape)."""
    positions = jnp.arange(REF_LEN, dtype=jnp.int32)[None]
    mask = jnp.ones((1, REF_LEN), bool)
    forward = jax.jit(lambda ids: jax.nn.log_softmax(model(ids, positions, mask)[0][0], axis=-1))

    def run(seq):
        assert len(seq) <= REF_LEN
        ids = np.zeros((1, REF_LEN), np.int32)
        ids[0, : len(seq)] = seq
        return np.asarray(forward(jnp.asarray(ids)))[: len(seq)]

    return run


def _naive_greedy(ref_logprobs, prompt: list[int], steps: int):
    """Argmax loop re-running the full sequence each step (no KV cache, no left padding)."""
    seq = list(prompt)
    logprobs = []
    for _ in range(steps):
        lp = ref_logprobs(seq)[-1]
        token = int(np.argmax(lp))
        logprobs.append(float(lp[token]))
        seq.append(token)
    return seq[len(prompt):], logprobs


# ----------------------------------------------------------------------------- greedy
def test_greedy_matches_uncached_argmax_loop(model, ref_logprobs):
    steps = 12
    out = generate_tokens(model, PROMPTS, jax.random.key(0), max_new_tokens=steps, temperature=0.0)
    assert out.tokens.shape == (len(PROMPTS), steps)
    for i, prompt in enumerate(PROMPTS):
        ref_tokens, ref_lps = _naive_greedy(ref_logprobs, prompt, steps)
        assert out.tokens[i].tolist() == ref_tokens, f"row {i}"
        np.testing.assert_allclose(out.logprobs[i], ref_lps, atol=2e-4, rtol=1e-4)
    assert len(set(map(tuple, out.tokens.tolist()))) == len(PROMPTS)  # outputs are not trivial
    assert out.lengths.tolist() == [steps] * len(PROMPTS)
    assert not out.stopped.any()


def test_batch_equals_single_prompt_under_left_padding(model):
    steps = 10
    batch = generate_tokens(model, PROMPTS, jax.random.key(0), max_new_tokens=steps, temperature=0.0)
    for i, prompt in enumerate(PROMPTS):
        single = generate_tokens(model, [prompt], jax.random.key(0), max_new_tokens=steps, temperature=0.0)
        assert single.tokens[0].tolist() == batch.tokens[i].tolist()
        np.testing.assert_allclose(single.logprobs[0], batch.logprobs[i], atol=1e-4)


def test_top_k_one_equals_greedy(model):
    greedy = generate_tokens(model, PROMPTS, jax.random.key(0), max_new_tokens=10, temperature=0.0)
    for seed in range(3):
        topk1 = generate_tokens(
            model, PROMPTS, jax.random.key(seed), max_new_tokens=10, temperature=1.3, top_k=1
        )
        np.testing.assert_array_equal(topk1.tokens, greedy.tokens)


# --------------------------------------------------------------------------- logprobs
@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_logprobs_equal_model_log_softmax_at_sampled_tokens(model, ref_logprobs, mode):
    temperature, top_k, top_p = 0.8, 20, 0.9
    steps = 10
    out = generate_tokens(
        model, PROMPTS, jax.random.key(3), max_new_tokens=steps, temperature=temperature,
        top_k=top_k, top_p=top_p, logprobs_mode=mode,
    )
    filt = jax.jit(lambda x: jax.nn.log_softmax(
        filter_logits(x / temperature, jnp.int32(top_k), jnp.float32(top_p)), axis=-1))
    for i, prompt in enumerate(PROMPTS):
        gen = out.tokens[i].tolist()
        raw = ref_logprobs(prompt + gen)[len(prompt) - 1 : -1]  # rows predicting gen tokens
        lp = raw if mode == "raw" else np.asarray(filt(jnp.asarray(raw)))  # shift-invariant
        expected = lp[np.arange(steps), gen]
        np.testing.assert_allclose(out.logprobs[i], expected, atol=2e-4, rtol=1e-4)
        if mode == "processed":  # the sampled token survived the filter
            assert np.all(expected > -1e20)
    assert len(set(out.tokens.ravel().tolist())) > 5  # really sampled, not degenerate


def test_trainer_logprobs_at_temperature_equal_processed_sampler_logprobs(model):
    """RL at T < 1 (recompute_old_logprobs=False): the trainer's token_logprobs(temperature=T)
    must score the sampled tokens exactly as the sampler's 'processed' log-probs."""
    temperature, steps = 0.7, 10
    out = generate_tokens(model, PROMPTS, jax.random.key(5), max_new_tokens=steps, temperature=temperature,
                          logprobs_mode="processed")
    for i, prompt in enumerate(PROMPTS):
        seq = np.asarray(prompt + out.tokens[i].tolist(), np.int32)[None]
        ids, targets = jnp.asarray(seq[:, :-1]), jnp.asarray(seq[:, 1:])
        pos = jnp.arange(ids.shape[1], dtype=jnp.int32)[None]
        trained = model.token_logprobs(ids, pos, jnp.ones_like(ids), targets, temperature=temperature)
        at_one = model.token_logprobs(ids, pos, jnp.ones_like(ids), targets)
        gen = np.asarray(trained)[0, len(prompt) - 1:]
        np.testing.assert_allclose(gen, out.logprobs[i], atol=2e-4, rtol=1e-4)
        assert np.abs(np.asarray(at_one)[0, len(prompt) - 1:] - gen).max() > 1e-3  # T really applied
    with pytest.raises(ValueError, match="temperature"):
        model.token_logprobs(ids, pos, jnp.ones_like(ids), targets, temperature=0.0)


# ------------------------------------------------------------------------- stopping
def test_stop_token_ends_row_and_pads_after(model):
    steps = 12
    free = generate_tokens(model, PROMPTS, jax.random.key(0), max_new_tokens=steps, temperature=0.0)
    stop = int(free.tokens[0, 3])
    first = {i: (free.tokens[i].tolist().index(stop) if stop in free.tokens[i] else None)
             for i in range(len(PROMPTS))}
    pad = 127
    out = generate_tokens(model, PROMPTS, jax.random.key(0), max_new_tokens=steps, temperature=0.0,
                          stop_token_ids=[stop], pad_id=pad)
    for i in range(len(PROMPTS)):
        if first[i] is None:
            assert out.lengths[i] == steps and not out.stopped[i]
            assert out.tokens[i].tolist() == free.tokens[i].tolist()
        else:
            n = first[i] + 1
            assert out.lengths[i] == n and out.stopped[i]
            assert out.tokens[i, :n].tolist() == free.tokens[i, :n].tolist()  # stop token kept
            assert out.tokens[i, n - 1] == stop
            assert np.all(out.tokens[i, n:] == pad)
            assert np.all(out.logprobs[i, n:] == 0.0)
            np.testing.assert_allclose(out.logprobs[i, :n], free.logprobs[i, :n], atol=1e-5)
    assert out.stopped[0] and out.lengths[0] <= 4


def test_all_rows_stopped_exits_early_and_pads(model):
    free = generate_tokens(model, [PROMPTS[0]], jax.random.key(0), max_new_tokens=8, temperature=0.0)
    stop = int(free.tokens[0, 0])
    out = generate_tokens(model, [PROMPTS[0]], jax.random.key(0), max_new_tokens=8, temperature=0.0,
                          stop_token_ids=[stop], pad_id=0)
    assert out.lengths.tolist() == [1] and out.stopped.tolist() == [True]
    assert out.tokens[0].tolist() == [stop] + [0] * 7


def test_min_new_tokens_forbids_early_stop(model):
    free = generate_tokens(model, [PROMPTS[1]], jax.random.key(0), max_new_tokens=8, temperature=0.0)
    stop = int(free.tokens[0, 0])
    out = generate_tokens(model, [PROMPTS[1]], jax.random.key(0), max_new_tokens=8, temperature=0.0,
                          stop_token_ids=[stop], min_new_tokens=3)
    assert stop not in out.tokens[0, :3].tolist()
    assert out.lengths[0] >= 3


# ---------------------------------------------------------------------- determinism
def test_same_key_same_output_different_key_different_output(model):
    kwargs = dict(max_new_tokens=16, temperature=1.5, top_k=40, top_p=0.95)
    a = generate_tokens(model, PROMPTS, jax.random.key(7), **kwargs)
    b = generate_tokens(model, PROMPTS, jax.random.key(7), **kwargs)
    c = generate_tokens(model, PROMPTS, jax.random.key(8), **kwargs)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    assert not np.array_equal(a.tokens, c.tokens)


# ------------------------------------------------------------------------- bucketing
def _compiled(*calls) -> dict[str, int]:
    """The sampler programs (prefill, decode) compiled while running ``calls`` (counted from
    jax.monitoring's compile events)."""
    with CompileCounter() as compiles:
        for call in calls:
            call()
    return compiled_programs(compiles)


NONE_NEW = {"prefill": 0, "decode": 0}


def test_compile_count_constant_within_buckets(model):
    cfg = SamplerConfig(prompt_buckets=(8, 24), gen_buckets=(12,), pack_prompts=False)  # packing: below
    key = jax.random.key(0)
    generate_tokens(model, [[1] * 9, [2] * 10], key, max_new_tokens=12, temperature=0.0, config=cfg)
    # other prompt lengths, batch sizes within the same power of two, generation lengths,
    # stop ids, min lengths, pad id and keys are all dynamic: no new trace
    assert _compiled(
        lambda: generate_tokens(model, [[3] * 17, [4]], key, max_new_tokens=5, temperature=0.0, config=cfg),
        lambda: generate_tokens(model, [[4] * 24, [5] * 3], jax.random.key(1), max_new_tokens=12, temperature=0.0,
                                stop_token_ids=[3, 4, 5], min_new_tokens=2, pad_id=1, config=cfg),
    ) == NONE_NEW
    # a new prompt bucket compiles exactly one new prefill and one new decode program
    assert _compiled(lambda: generate_tokens(model, [[1] * 5, [2] * 6], key, max_new_tokens=12, temperature=0.0,
                                             config=cfg)) == {"prefill": 1, "decode": 1}


def test_packed_prefills_keep_the_decode_program(model):
    """Packed prefills compile once per packed shape (bins and bin length on a coarse grid)
    and never a new decode program."""
    cfg = SamplerConfig(prompt_buckets=(64,), gen_buckets=(8,))
    key = jax.random.key(0)
    generate_tokens(model, [[r] * 40 for r in range(1, 5)], key, max_new_tokens=8, temperature=0.0,
                    config=cfg)  # 4 parts of 39 tokens do not pack into less than 3/4 of 4 x 63 columns
    assert _compiled(lambda: generate_tokens(model, [[1] * 40, [2] * 5, [3] * 6, [4] * 7], key, max_new_tokens=8,
                                             temperature=0.0, config=cfg)
                     ) == {"prefill": 1, "decode": 0}  # same buckets: the packing's
    # parts of 39, 6, 5, 4 tokens, then of 37, 7, 5, 3: one bin of 64 each time -> the same programs
    assert _compiled(lambda: generate_tokens(model, [[5] * 38, [6] * 4, [7] * 6, [8] * 8], key, max_new_tokens=8,
                                             temperature=0.0, config=cfg)) == NONE_NEW
    assert _compiled(lambda: generate_tokens(model, [[5] * 60, [6] * 4, [7] * 6, [8] * 8], key, max_new_tokens=8,
                                             temperature=0.0, config=cfg)
                     ) == {"prefill": 1, "decode": 0}  # one bin of 96: a new prefill


def test_common_prefixes_keep_the_decode_program(model):
    """Prompts sharing a prefix keep the bucket's padded length: a new shared length compiles
    one new prefill, no decode program; the same shared length compiles nothing."""
    cfg = SamplerConfig(prompt_buckets=(64,), gen_buckets=(8,), pack_prompts=False)
    key = jax.random.key(0)
    system = [5, 9, 2, 7] * 8  # 32 ids
    generate_tokens(model, [[1] * 9, [2] * 10], key, max_new_tokens=8, temperature=0.0, config=cfg)
    assert _compiled(lambda: generate_tokens(model, [system[:16] + [1, 2], system[:16] + [3]], key, max_new_tokens=8,
                                             temperature=0.0, config=cfg)) == {"prefill": 1, "decode": 0}
    assert _compiled(lambda: generate_tokens(model, [system[:20] + [4] * 30, system[:21] + [6]], key,
                                             max_new_tokens=8, temperature=0.0, config=cfg)
                     ) == NONE_NEW  # common prefix 20 -> 16 on the grid: same program
    assert _compiled(lambda: generate_tokens(model, [system + [1], system + [2]], key, max_new_tokens=8,
                                             temperature=0.0, config=cfg)) == {"prefill": 1, "decode": 0}
    with pytest.raises(ValueError, match="exceeds the largest bucket"):  # the bucket still bounds the prompt
        generate_tokens(model, [system + [1] * 40, system + [2]], key, max_new_tokens=8, config=cfg)


def test_bucket_size_rules():
    assert bucket_size(1, None, 16, "x") == 16
    assert bucket_size(17, None, 16, "x") == 32
    assert bucket_size(64, None, 16, "x") == 64
    assert bucket_size(10, (8, 24), 1, "x") == 24
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        bucket_size(25, (8, 24), 1, "x")


def test_left_pad_layout():
    ids, mask, valid = left_pad([[7, 8], [9]], length=4, batch=4, pad_id=0)
    assert ids.tolist() == [[0, 0, 7, 8], [0, 0, 0, 9], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert mask.tolist() == [[False, False, True, True], [False, False, False, True],
                             [False, False, False, True], [False, False, False, True]]
    assert valid.tolist() == [True, True, False, False]


# ------------------------------------------------------- unrolled vs generic decode path
def _qwen_with_lora():
    """Tiny Qwen2 (q/k/v biases) with LoRA adapters whose B is non-zero (so they matter)."""
    from jax_drive.models.lora import apply_lora

    m = peaked_tiny_model("qwen2", scale=6.0, seed=1)
    apply_lora(m, rank=2, alpha=4.0, targets=("q_proj", "v_proj", "up_proj"), rngs=nnx.Rngs(2))
    for name in ("q_proj", "v_proj", "up_proj"):
        proj = getattr(m.layers, name)
        proj.lora_b[...] = jax.random.normal(jax.random.key(3), proj.lora_b.shape) * 0.5
    return m


@pytest.mark.parametrize("which", ["llama", "qwen2_lora"])
def test_unrolled_decode_path_equals_model_call_path(model, which):
    m = model if which == "llama" else _qwen_with_lora()
    prompts = PROMPTS if which == "llama" else [PROMPTS[1]]
    kw = dict(max_new_tokens=10, temperature=0.0)
    fast = generate_tokens(m, prompts, jax.random.key(0), config=SamplerConfig(), **kw)
    slow = generate_tokens(m, prompts, jax.random.key(0),
                           config=SamplerConfig(unroll_layers=False), **kw)
    np.testing.assert_array_equal(fast.tokens, slow.tokens)
    np.testing.assert_allclose(fast.logprobs, slow.logprobs, atol=1e-4)
    if which == "qwen2_lora":  # adapters are folded into the fused per-layer kernels
        layer = unrolled_weights(m)["layers"][1]
        q = m.layers.q_proj
        merged = q.kernel[...][1] + (q.lora_a[...][1] @ q.lora_b[...][1]) * q.lora_scale
        qd = m.config.num_heads * m.config.head_dim
        np.testing.assert_allclose(layer["qkv_proj"]["kernel"][:, :qd], merged, rtol=1e-5, atol=1e-5)
        assert not np.allclose(merged, q.kernel[...][1], atol=1e-2)
        np.testing.assert_allclose(layer["qkv_proj"]["bias"][:qd], q.bias[...][1])


def test_decode_weights_cached_until_weights_change():
    m = peaked_tiny_model("llama", seed=5)
    cache = DecodeWeightCache()
    first = cache.get(m)
    assert cache.get(m) is first
    assert len(first["layers"]) == m.config.num_layers
    m.final_norm[...] = m.final_norm[...] * 2.0  # new array -> new copy
    second = cache.get(m)
    assert second is not first
    np.testing.assert_allclose(second["final_norm"], first["final_norm"] * 2.0)
    cache.clear()
    assert cache.get(m) is not second
    engine = JaxEngine(m)  # the engine owns its copy and reuses it across calls
    params = SamplingParams(max_new_tokens=2, temperature=0.0, stop_token_ids=())
    engine.generate([[1, 2]], params, jax.random.key(0))
    kept = engine.decode_weights.get(m)
    engine.generate([[3, 4]], params, jax.random.key(0))
    assert engine.decode_weights.get(m) is kept


# -------------------------------------------------------------------- token selection
def _np_filter(logits: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """Reference: keep the top_k largest, then the smallest prefix (by descending prob)
    whose mass before the token is < top_p."""
    out = np.full_like(logits, -np.inf)
    for b, row in enumerate(logits):
        order = np.argsort(-row, kind="stable")
        k = len(row) if top_k == 0 else min(top_k, len(row))
        kept = order[:k]
        p = np.exp(row[kept] - row[kept].max())
        p /= p.sum()
        before = np.cumsum(p) - p
        kept = kept[before < top_p]
        out[b, kept] = row[kept]
    return out


_filter_jit = jax.jit(filter_logits)


@given(
    logits=st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=12, max_size=12).map(
        lambda v: np.asarray(v, np.float32).reshape(2, 6)
    ),
    top_k=st.integers(0, 7),
    top_p=st.floats(0.05, 1.0),
)
def test_filter_logits_matches_numpy_reference(logits, top_k, top_p):
    ref = _np_filter(logits, top_k, top_p)
    got = np.asarray(_filter_jit(jnp.asarray(logits), jnp.int32(top_k), jnp.float32(top_p)))
    ref_kept = np.isfinite(ref)
    got_kept = got > -1e29
    # ties at the threshold may keep extra equal-valued entries; never fewer
    assert np.all(got_kept >= ref_kept)
    thresh = np.where(ref_kept, logits, np.inf).min(axis=1, keepdims=True)
    assert np.all(got_kept == (logits >= thresh))
    np.testing.assert_array_equal(got[got_kept], logits[got_kept])


def test_sampling_frequencies_follow_filtered_softmax():
    logits = jnp.asarray([[2.0, 1.5, 1.0, 0.0, -1.0, -3.0]], jnp.float32)
    temperature, top_k, top_p = 0.7, 4, 0.95
    keys = jax.random.split(jax.random.key(0), 20000)

    def one(k):
        tok, _ = select_tokens(logits, k, jnp.float32(temperature), jnp.int32(top_k),
                               jnp.float32(top_p), greedy=False, use_filter=True)
        return tok[0]

    tokens = np.asarray(jax.jit(jax.vmap(one))(keys))
    freq = np.bincount(tokens, minlength=6) / len(tokens)
    filtered = _np_filter(np.asarray(logits) / temperature, top_k, top_p)[0]
    p = np.exp(filtered - filtered[np.isfinite(filtered)].max())
    p /= p.sum()
    np.testing.assert_allclose(freq, p, atol=0.015)  # ~4 sigma at n = 20000
    assert freq[4] == 0 and freq[5] == 0


_draw_jit = jax.jit(categorical_rows)


def _chi2_pvalue(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson chi-square p-value; entries expected below 5 draws are pooled into one bin."""
    from scipy import stats

    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep]).pvalue)


def test_categorical_rows_frequencies_follow_softmax():
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 1.5, 1000).astype(np.float32)  # three full blocks of 256, a partial one
    logits[256:512] = NEG_INF  # a whole masked block
    logits[rng.random(1000) < 0.2] = NEG_INF  # masked entries anywhere
    logits[990:] = NEG_INF  # and a masked tail
    n = 60_000
    tokens = np.asarray(_draw_jit(jax.random.key(3), jnp.broadcast_to(jnp.asarray(logits), (n, 1000))))
    counts = np.bincount(tokens, minlength=1000)
    p = np.exp(logits.astype(np.float64) - logits.max())
    p[logits <= NEG_INF / 2] = 0.0
    p /= p.sum()
    assert counts[p == 0].sum() == 0
    assert _chi2_pvalue(counts, p * n) > 1e-3  # every entry (small ones pooled)
    blocks = np.arange(0, 1000, 256)  # the block level alone
    assert _chi2_pvalue(np.add.reduceat(counts, blocks), np.add.reduceat(p, blocks) * n) > 1e-3


def test_categorical_rows_single_allowed_entry():
    logits = np.full((4, 600), NEG_INF, np.float32)
    for row, j in enumerate((0, 255, 256, 599)):  # first, block edges, last (partial block)
        logits[row, j] = 3.0
    for k in range(20):
        np.testing.assert_array_equal(np.asarray(_draw_jit(jax.random.key(k), jnp.asarray(logits))), [0, 255, 256, 599])


def test_categorical_rows_robust_to_rounding_noise():
    """Logits that differ by float rounding (e.g. a shared-prefix prefill) almost never change
    a draw with the same key (Gumbel-max flips only on near-ties)."""
    rng = np.random.default_rng(2)
    logits = jnp.asarray(rng.normal(0, 3, (4096, 2048)), jnp.float32)
    noisy = logits * (1 + 1e-5 * jnp.asarray(rng.normal(size=logits.shape), jnp.float32))
    a = np.asarray(_draw_jit(jax.random.key(5), logits))
    b = np.asarray(_draw_jit(jax.random.key(5), noisy))
    assert (a != b).mean() < 1e-3  # an inverse-CDF draw changes ~5e-3 of these draws


def test_categorical_rows_row_keys_are_independent():
    logits = jnp.asarray(np.random.default_rng(1).normal(0, 1, (2, 300)), jnp.float32)
    keys = jax.random.split(jax.random.key(4), 8)
    alone = [int(categorical_rows(keys[i:i + 1], logits[:1])[0]) for i in range(8)]
    together = np.asarray(categorical_rows(keys, jnp.broadcast_to(logits[:1], (8, 300))))
    assert together.tolist() == alone  # a row's draw depends on its own key only
    assert len(set(alone)) > 1


# ----------------------------------------------------------------------- bad inputs
def test_bad_inputs_raise_clear_errors(model):
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="at least one token"):
        generate_tokens(model, [[1], []], key, max_new_tokens=2)
    with pytest.raises(ValueError, match="token ids must lie"):
        generate_tokens(model, [[1, 500]], key, max_new_tokens=2)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        generate_tokens(model, [[1] * 10], key, max_new_tokens=600)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="min_new_tokens"):
        SamplingParams(max_new_tokens=4, min_new_tokens=5)


# ---------------------------------------------------------------------------- engine
class _CharTokenizer:
    """Minimal tokenizer for engine tests: one id per character (ids 3..127), EOS = 2."""

    eos_token_ids = (2,)
    pad_token_id = 0

    def encode(self, text):
        return [3 + (ord(c) % 125) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + (i % 26)) for i in ids if not (skip_special_tokens and i < 3))

    def apply_chat_template(self, messages, add_generation_prompt=True):
        text = "".join(f"{m['role'][0]}:{m['content']};" for m in messages)
        return text + ("a:" if add_generation_prompt else "")


def test_jax_engine_generate_ordering_and_fields(model):
    engine = JaxEngine(model, _CharTokenizer())
    assert isinstance(engine, Engine)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, top_k=40, top_p=0.95, n=2,
                            stop_token_ids=())
    out = engine.generate(["hello", "hi there"], params, jax.random.key(0))
    assert len(out) == 4 and all(isinstance(c, Completion) for c in out)
    tok = _CharTokenizer()
    for i, c in enumerate(out):
        assert c.prompt_token_ids == tuple(tok.encode(["hello", "hi there"][i // 2]))
        assert len(c.token_ids) == 6 == len(c.logprobs) and c.finish_reason == "length"
        assert c.text == tok.decode(list(c.token_ids))
        assert all(lp <= 0.0 for lp in c.logprobs)
    # samples of the same prompt differ (independent draws per row)
    assert out[0].token_ids != out[1].token_ids and out[2].token_ids != out[3].token_ids


def test_jax_engine_greedy_matches_sampler_and_chunking(model):
    params = SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=())
    whole = JaxEngine(model).generate(PROMPTS, params, jax.random.key(0))
    chunked = JaxEngine(model, max_batch_size=1).generate(PROMPTS, params, jax.random.key(0))
    ref = generate_tokens(model, PROMPTS, jax.random.key(0), max_new_tokens=8, temperature=0.0)
    for i, (a, b) in enumerate(zip(whole, chunked)):
        assert a.token_ids == b.token_ids == tuple(ref.tokens[i].tolist())
        assert a.text == ""  # no tokenizer


def test_jax_engine_stop_reason_and_chat(model):
    tok = _CharTokenizer()
    engine = JaxEngine(model, tok)
    conv = [[{"role": "user", "content": "go"}], [{"role": "system", "content": "x"},
                                                  {"role": "user", "content": "stop"}]] * 2
    free = engine.generate_chat(conv, SamplingParams(max_new_tokens=8, temperature=0.0,
                                                     stop_token_ids=()), jax.random.key(0))
    assert free[0].prompt_token_ids == tuple(tok.encode("u:go;a:"))
    stop = free[0].token_ids[2]
    out = engine.generate_chat(conv, SamplingParams(max_new_tokens=8, temperature=0.0,
                                                    stop_token_ids=(stop,)), jax.random.key(0))
    assert out[0].finish_reason == "stop" and out[0].token_ids[-1] == stop
    assert out[0].token_ids == free[0].token_ids[: len(out[0].token_ids)]
    with pytest.raises(ValueError):
        engine.generate([], SamplingParams(), jax.random.key(0))
    with pytest.raises(TypeError):
        engine.generate(["a", [1, 2]], SamplingParams(), jax.random.key(0))
    with pytest.raises(TypeError):
        engine.generate_chat([[{"content": "no role"}]], SamplingParams(), jax.random.key(0))


def test_completion_validates_lengths():
    with pytest.raises(ValueError, match="differ in length"):
        Completion((1,), (2, 3), "", (0.0,), "length")
    c = Completion((1,), (2, 3), "ab", (-1.0, -0.5), "stop")
    assert c.num_tokens == 2 and c.cumulative_logprob == pytest.approx(-1.5)
    assert dataclasses.is_dataclass(c)
