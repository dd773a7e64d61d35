"""The sampler's work-saving features against the plain path (tiny random models):

1. shared-prefix prefill (equal prompts prefilled once: same samples and log-probs; a prefix
   common to distinct prompts prefilled once: same samples, log-probs within 1e-4);
2. sessions (``JaxEngine.start`` / ``Session.extend``, KV caches kept between turns):
   greedy tokens identical to generating from the whole context, log-probs within 1e-4;
3. prompt-lookup speculative decoding: greedy outputs identical; sampled tokens keep the
   model's distribution (chi-square against the exact distribution, fixed seeds), their
   log-probs are the model's.

Each with left-padded batches (prompts of different lengths), rows that stop early and
LoRA-merged weights.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from jax_drive.models import lora
from jax_drive.models.tiny import peaked_tiny_model
from jax_drive.sampling import (
    JaxEngine,
    OpenAIEngine,
    PromptLookup,
    SamplerConfig,
    SamplingParams,
    generate_tokens,
    supports_sessions,
)
from jax_drive.sampling import plan as plan_mod
from jax_drive.sampling.packing import pack_prompt_parts
from jax_drive.sampling.plan import common_prefix_length
from jax_drive.sampling.shapes import count_bucket
from jax_drive.sampling.speculative import accept_drafts, lookup_drafts

PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7, 8, 9, 10, 11, 5, 6], [42, 43]]
LOOKUP = PromptLookup(num_draft=3, max_ngram=2)
PLAIN = SamplerConfig(share_prefix=False, pack_prompts=False)  # the references: no work saver


def _merged_lora_qwen():
    """Tiny Qwen2 (q/k/v biases) with non-zero LoRA adapters merged into its kernels."""
    model = peaked_tiny_model("qwen2", seed=1, scale=6.0)
    lora.apply_lora(model, rank=2, alpha=4.0, targets=("q_proj", "v_proj", "up_proj"), rngs=nnx.Rngs(2))
    for name in ("q_proj", "v_proj", "up_proj"):
        proj = getattr(model.layers, name)
        proj.lora_b[...] = 0.5 * jax.random.normal(jax.random.key(3), proj.lora_b.shape)
    return lora.merge_lora(model)


@pytest.fixture(scope="module")
def models():
    return {"llama": peaked_tiny_model("llama", scale=5.0), "qwen2_lora_merged": _merged_lora_qwen()}


@pytest.fixture
def model(models, request):
    """The model named by the test's ``which`` parameter (default llama)."""
    return models[getattr(request, "param", "llama")]


def _which(*names):
    """Parametrises the ``model`` fixture indirectly; the cases below pair models with other
    parameters so that each path runs on both models without the full cross product."""
    return pytest.mark.parametrize("model", names, indirect=True)


def _stop_token(model, rows=PROMPTS[:1], key=jax.random.key(0), at=3, **kw) -> int:
    """A token the first row's continuation (greedy unless ``kw`` says otherwise) produces
    at step ``at``, so that this row stops early while others run on."""
    kw = {"temperature": 0.0, **kw}
    return int(generate_tokens(model, rows, key, max_new_tokens=at + 1, **kw).tokens[0, at])


def _spy_packing(monkeypatch) -> list:
    """Records what each ``pack_prompt_parts`` call of the sampler returns (None: not packed)."""
    packs, pack = [], plan_mod.pack_prompt_parts
    monkeypatch.setattr(plan_mod, "pack_prompt_parts", lambda *a: packs.append(pack(*a)) or packs[-1])
    return packs


def _assert_same(a, b, atol=1e-4):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_array_equal(a.stopped, b.stopped)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=atol)


# ---------------------------------------------------------------------- shared prefix
@pytest.mark.parametrize("model,temperature", [("llama", 1.0), ("qwen2_lora_merged", 0.0)], indirect=["model"])
def test_shared_prefix_equals_unshared(model, temperature):
    rows = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[2], PROMPTS[0], PROMPTS[1]]
    stop = _stop_token(model, rows, jax.random.key(4), temperature=temperature, top_k=20)
    kw = dict(max_new_tokens=10, temperature=temperature, top_k=20, stop_token_ids=[stop])
    shared = generate_tokens(model, rows, jax.random.key(4), **kw)
    plain = generate_tokens(model, rows, jax.random.key(4), config=PLAIN, **kw)
    _assert_same(shared, plain)
    assert shared.stopped.any() and not shared.stopped.all()  # some rows stop early
    if temperature:  # equal prompts still get independent samples
        assert shared.tokens[0].tolist() != shared.tokens[2].tolist()


@_which("qwen2_lora_merged")
def test_engine_n_samples_share_the_prompt(model):
    params = SamplingParams(max_new_tokens=6, temperature=1.0, n=3, stop_token_ids=())
    shared = JaxEngine(model).generate(PROMPTS, params, jax.random.key(1))
    plain = JaxEngine(model, sampler_config=PLAIN).generate(
        PROMPTS, params, jax.random.key(1))
    assert [c.token_ids for c in shared] == [c.token_ids for c in plain]
    np.testing.assert_allclose([c.logprobs for c in shared], [c.logprobs for c in plain], atol=1e-4)


SYSTEM = [7, 3, 9, 1, 4, 4, 8, 2, 6, 5, 3, 1, 9, 9, 2, 7, 4, 6, 1, 8, 3]  # 21 ids every prompt starts with


def test_common_prefix_length():
    assert common_prefix_length([SYSTEM + [1], SYSTEM + [2, 3], SYSTEM + [1]]) == 16  # 21 rounded down to the grid
    assert common_prefix_length([SYSTEM[:17], SYSTEM + [5]]) == 16  # each row keeps >= 1 token
    assert common_prefix_length([SYSTEM[:16], SYSTEM + [5]]) == 0  # 15 common: below the minimum
    assert common_prefix_length([SYSTEM + [1]]) == 0  # one row: nothing to share
    assert common_prefix_length([SYSTEM + [1], [0] + SYSTEM]) == 0
    assert common_prefix_length([SYSTEM + [1] * 100, SYSTEM + [2]]) == 0  # under a quarter of the longest
    shared = list(range(3, 203))  # the grid: 16, 24, 32, 48, 64, 96, 128, 192, ...
    for lcp, expected in ((23, 16), (24, 24), (47, 32), (50, 48), (100, 96), (200, 192)):
        assert common_prefix_length([shared[:lcp] + [1], shared[:lcp] + [2, 3]]) == expected


@pytest.mark.parametrize("model,temperature,lookup", [("llama", 1.0, None), ("qwen2_lora_merged", 0.0, None),
                                                      ("llama", 0.0, LOOKUP)], indirect=["model"])
def test_common_prefix_prefill_equals_unshared(model, temperature, lookup, monkeypatch):
    """Distinct prompts (different lengths: left padding after the shared part) with a common
    system prefix, one of them repeated; a row stopping early."""
    rows = [SYSTEM + p for p in (PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[2])]
    assert common_prefix_length(rows) == 16
    stop = _stop_token(model, rows, jax.random.key(5), temperature=temperature)
    kw = dict(max_new_tokens=9, temperature=temperature, stop_token_ids=[stop], prompt_lookup=lookup)
    plain = generate_tokens(model, rows, jax.random.key(5), config=PLAIN, **kw)
    packs = _spy_packing(monkeypatch)
    for config in (SamplerConfig(pack_prompts=False), SamplerConfig()):  # left-padded rest, packed rest
        shared = generate_tokens(model, rows, jax.random.key(5), config=config, **kw)
        _assert_same(shared, plain)
    assert int(packs[-1].positions[0, 0]) == 16  # the last call packed the parts after the prefix
    assert shared.stopped.any() and not shared.stopped.all()


# --------------------------------------------------------------------- packed prefill
def test_pack_prompt_parts_layout():
    parts = [[5] * 9, [], [6, 7], [8] * 4, [9] * 12]
    packed = pack_prompt_parts(parts, first_position=3, width=14, rows=8)
    ids, pos, seg, src = (np.asarray(x) for x in (packed.ids, packed.positions, packed.segments, packed.slot_token))
    assert ids.shape == (2, 16)  # bins of 16 (the longest part, 12, on the grid): 27 tokens in 2
    for r, part in enumerate(parts):
        n = len(part)
        assert (src[r, :14 - n] == -1).all()  # left padding of the cache layout
        at = src[r, 14 - n:]
        assert ids.ravel()[at].tolist() == part
        assert pos.ravel()[at].tolist() == list(range(3, 3 + n))
        assert (seg.ravel()[at] == r).all()
    assert (seg >= 0).sum() == sum(map(len, parts))
    assert (src[len(parts):] == -1).all()  # dummy rows
    # packing that would skip less than a quarter of the left-padded work is not done
    assert pack_prompt_parts([[1] * 12, [2] * 12], 0, width=14, rows=2) is None
    assert pack_prompt_parts([[], []], 0, width=14, rows=2) is None  # nothing to pack
    # the bin length that gives the least work: 33 + 30 tokens in one bin of 64, not 2 of 48
    assert pack_prompt_parts([[1] * 33, [2] * 30], 0, width=40, rows=4).ids.shape == (1, 64)
    assert pack_prompt_parts([[1] * 30, [2] * 20, [3] * 10], 0, width=40, rows=4).ids.shape == (2, 32)


def test_count_bucket_grid():
    assert [count_bucket(n) for n in (1, 5, 8, 9, 11, 16, 17, 33, 100)] == [1, 5, 8, 10, 12, 16, 20, 40, 112]


@pytest.mark.parametrize("model,temperature,lookup", [("llama", 1.0, None), ("qwen2_lora_merged", 0.0, None),
                                                      ("llama", 0.0, LOOKUP)], indirect=["model"])
def test_packed_prefill_equals_left_padded(model, temperature, lookup, monkeypatch):
    """Prompts of very different lengths (one repeated, no common prefix) packed without
    padding give the left-padded prefill's outputs; a row stops early."""
    rows = [PROMPTS[1] * 3, PROMPTS[0], PROMPTS[2], PROMPTS[1] * 3, [11, 12, 13, 14]]
    packs = _spy_packing(monkeypatch)
    stop = _stop_token(model, rows, jax.random.key(6), temperature=temperature)
    kw = dict(max_new_tokens=9, temperature=temperature, stop_token_ids=[stop], prompt_lookup=lookup)
    packed = generate_tokens(model, rows, jax.random.key(6), **kw)
    assert packs[-1].ids.shape == (1, 48)  # parts of 26, 6, 3 and 1 tokens in one bin of 48, not 4 rows of 31
    padded = generate_tokens(model, rows, jax.random.key(6), config=PLAIN, **kw)
    _assert_same(packed, padded)
    assert packed.stopped.any() and not packed.stopped.all()


# --------------------------------------------------------------------------- sessions
def _assert_completions_equal(got, ref, logprob_atol=1e-4):
    assert got.token_ids == ref.token_ids
    assert got.prompt_token_ids == ref.prompt_token_ids
    assert got.finish_reason == ref.finish_reason
    np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=logprob_atol)


@pytest.mark.parametrize("model,lookup,max_batch_size", [
    ("llama", None, None), ("llama", LOOKUP, 2), ("qwen2_lora_merged", None, 2),
    ("qwen2_lora_merged", LOOKUP, None)], indirect=["model"], ids=["llama-plain-1group",
    "llama-lookup-groups", "qwen2_lora_merged-plain-groups", "qwen2_lora_merged-lookup-1group"])
def test_session_turns_equal_generating_from_scratch(model, lookup, max_batch_size):
    """Three turns: rows of different lengths (left padding), n = 2, one row stopping early,
    empty and non-empty appended tokens, a row dropped after each turn."""
    engine = JaxEngine(model, max_batch_size=max_batch_size, prompt_lookup=lookup)
    fresh = JaxEngine(model, max_batch_size=max_batch_size, sampler_config=PLAIN)
    params = SamplingParams(max_new_tokens=7, temperature=0.0, n=2, stop_token_ids=(_stop_token(model),))
    key = jax.random.key(0)
    session, first = engine.start(PROMPTS, params, key)
    for got, ref in zip(first, fresh.generate(PROMPTS, params, key)):
        _assert_completions_equal(got, ref)
    assert any(c.finish_reason == "stop" for c in first) and any(c.finish_reason == "length" for c in first)
    contexts = [list(c.prompt_token_ids) + list(c.token_ids) for c in first]
    one = params.replace(n=1)
    turns = [
        [[9, 8, 7, 6, 5], [], None, [3] * 15, [11], [2, 2, 2]],
        [[1, 9], [4], None, [5, 6, 7], None, [8] * 14],
    ]
    for j, appended in enumerate(turns):
        out = session.extend(appended, one, jax.random.fold_in(key, j + 1))
        live = [r for r, a in enumerate(appended) if a is not None]
        ref = fresh.generate([contexts[r] + appended[r] for r in live], one, jax.random.fold_in(key, j + 1))
        assert [r for r, c in enumerate(out) if c is not None] == live
        for r, c in zip(live, ref):
            _assert_completions_equal(out[r], c)
            contexts[r] = contexts[r] + appended[r] + list(c.token_ids)
        assert session.live_rows == live
        assert [session.contexts[r] for r in live] == [contexts[r] for r in live]


def _assert_next_turn_equals_scratch(session, first, engine, params):
    """Extending three rows by a few ids equals ``engine`` generating from their whole contexts."""
    appended = [[7, 7], [8], [9, 9, 9]]
    out = session.extend(appended, params, jax.random.key(3))
    ref = engine.generate([list(c.prompt_token_ids) + list(c.token_ids) + a for c, a in zip(first, appended)],
                          params, jax.random.key(3))
    for got, want in zip(out, ref):
        _assert_completions_equal(got, want)


@_which("llama")
def test_session_after_a_common_prefix_prefill(model):
    """A first turn whose prompts share a prefix (prefilled once) keeps caches that the next
    turn extends like a from-scratch generation without any sharing."""
    prompts = [SYSTEM + p for p in PROMPTS]
    assert common_prefix_length(prompts) == 16
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    session, first = JaxEngine(model).start(prompts, params, jax.random.key(1))
    fresh = JaxEngine(model, sampler_config=PLAIN)
    for got, ref in zip(first, fresh.generate(prompts, params, jax.random.key(1))):
        _assert_completions_equal(got, ref)
    _assert_next_turn_equals_scratch(session, first, fresh, params)


@_which("qwen2_lora_merged")
def test_packed_prefill_with_long_bins_and_a_common_prefix(model, monkeypatch):
    """Bins longer than the attention block (the blocked path with the prefix keys in front),
    a common prefix, a repeated prompt: the packed, left-padded and plain prefills agree, and
    a session extended after the packed turn equals generating from scratch."""
    rng = np.random.default_rng(0)
    own = [list(rng.integers(1, 90, n)) for n in (150, 20)]
    rows = [SYSTEM + own[0], SYSTEM + own[1], SYSTEM + own[0]]
    packs = _spy_packing(monkeypatch)
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    engine = JaxEngine(model)
    session, first = engine.start(rows, params, jax.random.key(2))
    assert packs[-1].ids.shape[1] > 128 and int(packs[-1].positions[0, 0]) == 16
    for config in (SamplerConfig(pack_prompts=False), PLAIN):
        for got, ref in zip(first, JaxEngine(model, sampler_config=config).generate(rows, params, jax.random.key(2))):
            _assert_completions_equal(got, ref)
    _assert_next_turn_equals_scratch(session, first, JaxEngine(model, sampler_config=PLAIN), params)


def test_session_sampled_turn_equals_generating_from_scratch(model):
    """With equal batches and keys, a sampled continuation draws the same tokens."""
    engine = JaxEngine(model)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.9)
    session, first = engine.start(PROMPTS, params, jax.random.key(2))
    _assert_next_turn_equals_scratch(session, first, engine, params)


def test_session_bad_input_and_capability_flag(model):
    engine = JaxEngine(model)
    assert supports_sessions(engine)
    assert not supports_sessions(OpenAIEngine("http://127.0.0.1:9", model="m"))
    params = SamplingParams(max_new_tokens=2, temperature=0.0, stop_token_ids=())
    session, _ = engine.start(PROMPTS, params, jax.random.key(0))
    with pytest.raises(ValueError, match="entries"):
        session.extend([[1]], params, jax.random.key(0))
    with pytest.raises(ValueError, match="n must be 1"):
        session.extend([[1], [1], [1]], params.replace(n=2), jax.random.key(0))
    with pytest.raises(ValueError, match="token ids must lie"):
        session.extend([[1], [10_000], [1]], params, jax.random.key(0))
    session.extend([[1], None, [1]], params, jax.random.key(0))
    with pytest.raises(ValueError, match="dropped"):
        session.extend([[1], [1], [1]], params, jax.random.key(0))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        session.extend([[1] * 600, None, None], params, jax.random.key(0))
    model.final_norm[...] = model.final_norm[...] + 0.0  # new arrays: the caches are stale
    with pytest.raises(RuntimeError, match="weights changed"):
        session.extend([[1], None, [1]], params, jax.random.key(0))
    session.close()
    assert session.live_rows == []


# ------------------------------------------------------------------ prompt lookup
def test_lookup_drafts_takes_the_longest_suffix_then_the_fullest_most_recent_match():
    lookup = PromptLookup(num_draft=3, max_ngram=2, min_ngram=1)
    history = jnp.asarray([
        [5, 1, 2, 7, 1, 2, 8, 9, 1, 2, 0, 0],  # suffix (1, 2): last full match -> 8 9 1
        [4, 4, 6, 3, 5, 6, 0, 0, 0, 0, 0, 0],  # no (5, 6) earlier; (6,) at 2 -> 3 5 6
        [1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0],  # nothing repeats
        [7, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # (7,) at 0 -> 7, then the context ends
        [3, 3, 3, 3, 3, 3, 0, 0, 0, 0, 0, 0],  # (3, 3) at 0..3: at 1 the last with 3 drafts
        [1, 2, 6, 1, 2, 9, 9, 9, 1, 2, 6, 0],  # (2, 6): at 1 -> 1 2 9 (at 9 is the suffix)
    ], jnp.int32)
    drafts, valid = lookup_drafts(history, jnp.asarray([10, 6, 4, 2, 6, 11], jnp.int32), lookup)
    assert valid.tolist() == [3, 3, 0, 1, 3, 3]
    assert drafts[0].tolist() == [8, 9, 1] and drafts[1].tolist() == [3, 5, 6]
    assert drafts[3, 0] == 7 and drafts[4].tolist() == [3, 3, 3]
    assert drafts[5].tolist() == [1, 2, 9]


@pytest.mark.parametrize("model,min_new_tokens", [("llama", 0), ("qwen2_lora_merged", 5)], indirect=["model"])
def test_prompt_lookup_greedy_equals_plain_greedy(model, min_new_tokens):
    kw = dict(max_new_tokens=24, temperature=0.0, stop_token_ids=[_stop_token(model, at=min_new_tokens + 3)],
              min_new_tokens=min_new_tokens)
    prompts = PROMPTS + [[3, 1, 3, 1, 3, 1, 3]]
    plain = generate_tokens(model, prompts, jax.random.key(0), **kw)
    fast = generate_tokens(model, prompts, jax.random.key(0), prompt_lookup=LOOKUP, **kw)
    _assert_same(fast, plain)
    assert fast.stopped.any() and not fast.stopped.all()


def test_prompt_lookup_accepts_the_drafts_of_a_repeating_continuation():
    """A model that continues the cycle 0 1 2 3 4 0 ... (blocks zeroed, one-hot embeddings, a
    head mapping token t to t + 1 mod 5): every draft after the first cycle is right, so
    K = 3 drafts give 4 tokens per forward pass, with the same greedy tokens."""
    model = peaked_tiny_model("llama", vocab_size=32)
    for proj in (model.layers.o_proj, model.layers.down_proj):
        proj.kernel[...] = jnp.zeros_like(proj.kernel[...])
    hidden = model.config.hidden_size
    model.embed[...] = jnp.eye(32, hidden)
    model.lm_head[...] = jnp.zeros((hidden, 32)).at[jnp.arange(5), (jnp.arange(5) + 1) % 5].set(1.0)
    prompts = [[0, 1, 2, 3, 4, 0, 1], [3, 4, 0, 1, 2, 3]]
    kw = dict(max_new_tokens=40, temperature=0.0)
    plain = generate_tokens(model, prompts, jax.random.key(0), **kw)
    fast = generate_tokens(model, prompts, jax.random.key(0), prompt_lookup=LOOKUP, **kw)
    _assert_same(fast, plain)
    assert plain.tokens[0, :4].tolist() == [2, 3, 4, 0]
    assert plain.steps == 40 and fast.steps == 10


@pytest.mark.parametrize("model,mode", [("llama", "raw"), ("qwen2_lora_merged", "processed")], indirect=["model"])
def test_prompt_lookup_logprobs_are_the_models(model, mode):
    """Sampled with temperature and top-k / top-p: each reported log-prob is the model's
    (teacher-forced) log-softmax at the token, raw or after temperature and filtering."""
    from jax_drive.sampling.selection import filter_logits

    temperature, top_k, top_p, steps = 0.8, 20, 0.9, 16
    out = generate_tokens(model, PROMPTS, jax.random.key(6), max_new_tokens=steps, temperature=temperature,
                          top_k=top_k, top_p=top_p, logprobs_mode=mode, prompt_lookup=LOOKUP)
    for i, prompt in enumerate(PROMPTS):
        seq = prompt + out.tokens[i].tolist()
        logits = model(jnp.asarray([seq]))[0][0, len(prompt) - 1:-1]
        if mode == "processed":
            logits = filter_logits(logits / temperature, jnp.int32(top_k), jnp.float32(top_p))
        expected = np.asarray(jax.nn.log_softmax(logits))[np.arange(steps), out.tokens[i]]
        np.testing.assert_allclose(out.logprobs[i], expected, atol=2e-4, rtol=1e-4)


def _chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Goodness of fit of counts to probs; cells expected below 5 are pooled."""
    expected = probs * counts.sum()
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


def _accept_samples(logits, drafts, num_valid, n, greedy=False):
    keys = jax.random.split(jax.random.key(11), n)
    run = jax.jit(jax.vmap(lambda k: accept_drafts(logits[None], drafts[None], num_valid[None], k,
                                                   jnp.float32(1.0), jnp.int32(0), jnp.float32(1.0),
                                                   greedy=greedy, use_filter=False)))
    tokens, accepted, _ = run(keys)
    return np.asarray(tokens)[:, 0], np.asarray(accepted)[:, 0]


def test_accept_drafts_keeps_the_target_distribution():
    """Unit check of the acceptance rule on fixed distributions at 3 positions (2 drafts):
    the first emitted token follows p0; the one after an accepted draft d1 follows p1; the
    test rejects a rule that accepts drafts unconditionally (the negative control)."""
    v = 6
    logits = jnp.log(jnp.asarray([[0.05, 0.4, 0.2, 0.15, 0.1, 0.1],
                                  [0.3, 0.05, 0.25, 0.1, 0.2, 0.1],
                                  [0.1, 0.1, 0.1, 0.1, 0.1, 0.5]], jnp.float32))
    drafts = jnp.asarray([2, 0], jnp.int32)
    p = np.asarray(jax.nn.softmax(logits))
    tokens, accepted = _accept_samples(logits, drafts, jnp.int32(2), 100_000)
    assert 0.1 < (accepted >= 1).mean() < 0.3 and (accepted == 2).any()  # both outcomes occur
    first = np.bincount(tokens[:, 0], minlength=v)
    second = np.bincount(tokens[accepted >= 1, 1], minlength=v)
    assert _chi_square_pvalue(first, p[0]) > 1e-4
    assert _chi_square_pvalue(second, p[1]) > 1e-4
    # negative control: accepting a draft whenever it is the argmax (a greedy rule under
    # sampling) changes the first token's distribution, and the same check sees it
    argmax_rule = np.where(np.random.default_rng(0).random(len(tokens)) < p[0, 2] + p[0, 1],
                           np.argmax(p[0]), tokens[:, 0])
    assert _chi_square_pvalue(np.bincount(argmax_rule, minlength=v), p[0]) < 1e-10


def test_prompt_lookup_sampling_keeps_the_model_distribution():
    """4096 sampled 3-token continuations of a repetitive prompt with a 6-token vocabulary,
    with and without prompt lookup, against the exact joint distribution of the model
    (all 216 continuations scored teacher-forced): both fit (chi-square p > 1e-4), while the
    lookup drafts were accepted in a good share of rows."""
    model = peaked_tiny_model("llama", seed=3, scale=3.0, vocab_size=6)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    conts = np.asarray(list(itertools.product(range(6), repeat=3)), np.int32)  # (216, 3)
    seqs = jnp.asarray(np.concatenate([np.tile(prompt, (len(conts), 1)), conts], axis=1))
    logp = jax.nn.log_softmax(model(seqs)[0], axis=-1)[:, len(prompt) - 1:-1]  # (216, 3, V)
    exact = np.exp(np.asarray(jnp.take_along_axis(logp, seqs[:, len(prompt):, None], -1)).sum((1, 2)))
    np.testing.assert_allclose(exact.sum(), 1.0, rtol=1e-4)
    n = 4096
    cells = lambda out: np.bincount(out.tokens @ np.asarray([36, 6, 1]), minlength=216)  # noqa: E731
    kw = dict(max_new_tokens=3, temperature=1.0, stop_token_ids=())
    plain = generate_tokens(model, [prompt] * n, jax.random.key(21), **kw)
    fast = generate_tokens(model, [prompt] * n, jax.random.key(22), prompt_lookup=PromptLookup(num_draft=2), **kw)
    assert _chi_square_pvalue(cells(plain), exact) > 1e-4
    assert _chi_square_pvalue(cells(fast), exact) > 1e-4
    drafted = np.all(fast.tokens[:, :2] == [3, 1], axis=1).mean()  # both drafts taken
    assert drafted > 0.02
