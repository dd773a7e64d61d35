"""Chunked decoding (``sampling.stream``: ``DecodeRun``, ``JaxEngine.stream``) and the decode
loop's logits-mask hook (``sampling.constraints``).

References: the one-call sampler (``generate_tokens`` / ``JaxEngine.generate``) on the same
inputs. Chunks run the same compiled program on the same states, so tokens, lengths, stop
flags and log-probs must be identical (no tolerance); a dropped row must leave the others'
results identical and end the loop as soon as they are done.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_drive.models.tiny import peaked_tiny_model
from jax_drive.sampling import CompileCounter, JaxEngine, PromptLookup, SamplerConfig, SamplingParams, generate_tokens
from jax_drive.sampling.decode import decode
from jax_drive.sampling.outputs import SamplerOutput
from jax_drive.sampling.request import Request
from jax_drive.sampling.sampler import compiled_programs, start_decode
from jax_drive.sampling.selection import NEG_INF
from jax_drive.sampling.stream import DecodeRun
from jax_drive.sampling.weights import unrolled_weights

PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7, 8, 9, 10, 11, 5, 6], [42, 43], [3, 1, 3, 1, 3, 1, 3]]
LONG = 1  # the row that never stops early in these tests
LOOKUP = PromptLookup(num_draft=3, max_ngram=2)
NEW = 16
CASES = {  # name: (temperature, per-row keys, prompt lookup)
    "greedy": (0.0, False, None),
    "sampled": (1.0, False, None),
    "sampled-row-keys": (1.0, True, None),
    "greedy-lookup": (0.0, False, LOOKUP),
    "sampled-lookup": (1.0, False, LOOKUP),
}


@pytest.fixture(scope="module")
def model():
    return peaked_tiny_model("llama", scale=5.0)


def _key(row_keys: bool, seed: int = 3):
    key = jax.random.key(seed)
    return jax.random.split(key, len(PROMPTS)) if row_keys else key


def _early_stops(model, key, temperature, lookup) -> list[int]:
    """Stop ids that end every row but ``LONG`` early: for each other row, its first token
    after step 0 that ``LONG``'s continuation never produces."""
    free = generate_tokens(model, PROMPTS, key, max_new_tokens=NEW, temperature=temperature, prompt_lookup=lookup)
    long_tokens = set(free.tokens[LONG].tolist())
    return sorted({next(int(t) for t in free.tokens[r, 1:] if int(t) not in long_tokens)
                   for r in range(len(PROMPTS)) if r != LONG})


def _assert_identical(a: SamplerOutput, b: SamplerOutput, rows=slice(None)):
    np.testing.assert_array_equal(a.tokens[rows], b.tokens[rows])
    np.testing.assert_array_equal(a.lengths[rows], b.lengths[rows])
    np.testing.assert_array_equal(a.stopped[rows], b.stopped[rows])
    np.testing.assert_array_equal(a.logprobs[rows], b.logprobs[rows])


def _run(model, request, key, config=SamplerConfig()) -> DecodeRun:
    weights = unrolled_weights(model)
    loop, rows, _ = start_decode(model, PROMPTS, key, request, config, None, weights)
    return DecodeRun(model, weights, loop, rows, request, config)


@pytest.mark.parametrize("case", list(CASES))
def test_chunked_decoding_equals_one_call_and_compiles_nothing_new(model, case):
    temperature, row_keys, lookup = CASES[case]
    key = _key(row_keys)
    stops = _early_stops(model, key, temperature, lookup)
    kw = dict(max_new_tokens=NEW, temperature=temperature, stop_token_ids=stops, prompt_lookup=lookup)
    whole = generate_tokens(model, PROMPTS, key, **kw)
    assert whole.stopped.sum() == len(PROMPTS) - 1 and not whole.stopped[LONG]  # rows end at different steps
    request = Request(max_new_tokens=NEW, temperature=temperature, stop_token_ids=tuple(stops), prompt_lookup=lookup)
    run = _run(model, request, key)
    with CompileCounter() as compiles:
        chunks = 0
        while not run.finished:
            out = run.advance(3)
            chunks += 1
            assert out.steps == min(3 * chunks, whole.steps)
    assert compiled_programs(compiles) == {"prefill": 0, "decode": 0}  # the one-call programs
    assert chunks == -(-whole.steps // 3) > 1
    _assert_identical(out, whole)
    assert out.steps == whole.steps


@pytest.mark.parametrize("case", ["greedy", "sampled", "sampled-lookup"])
def test_a_dropped_row_ends_early_and_leaves_the_others_unchanged(model, case):
    temperature, row_keys, lookup = CASES[case]
    key = _key(row_keys)
    stops = _early_stops(model, key, temperature, lookup)
    request = Request(max_new_tokens=NEW, temperature=temperature, stop_token_ids=tuple(stops), prompt_lookup=lookup)
    whole = generate_tokens(model, PROMPTS, key, max_new_tokens=NEW, temperature=temperature,
                            stop_token_ids=stops, prompt_lookup=lookup)
    run = _run(model, request, key)
    first = run.advance(1)
    run.drop([LONG])
    while not run.finished:
        out = run.advance(2)
    others = [r for r in range(len(PROMPTS)) if r != LONG]
    _assert_identical(out, whole, others)
    # the dropped row keeps what it had, emits nothing more, and no longer holds the loop open
    n = int(first.lengths[LONG])
    assert out.lengths[LONG] == n and out.tokens[LONG, :n].tolist() == whole.tokens[LONG, :n].tolist()
    assert not out.stopped[LONG] and (out.tokens[LONG, n:] == 0).all()
    assert out.steps < whole.steps
    if lookup is None:  # one token per step: the loop ran until the last other row stopped
        assert out.steps == max(first.steps, max(int(whole.lengths[r]) for r in others))


def test_engine_stream_chunks_add_up_to_generate_and_cancel_drops_rows(model):
    params = SamplingParams(max_new_tokens=NEW, temperature=1.0, n=2, stop_token_ids=())
    prompts = PROMPTS[:3]
    engine = JaxEngine(model, max_batch_size=4)  # 6 rows in two device batches
    expected = engine.generate(prompts, params, jax.random.key(9))
    stream = engine.stream(prompts, params, jax.random.key(9), chunk_steps=5)
    got: dict[int, list] = {r: [[], [], None] for r in range(6)}
    for chunk in stream:
        for delta in chunk.rows:
            assert got[delta.row][2] is None  # nothing after a row's finish
            got[delta.row][0] += delta.token_ids
            got[delta.row][1] += delta.logprobs
            got[delta.row][2] = delta.finish_reason
    assert chunk.steps == 2 * NEW  # each batch ran its budget
    final = stream.completions()
    assert final == expected  # same ids, log-probs, texts, finish reasons
    for r, c in enumerate(expected):
        assert (tuple(got[r][0]), tuple(got[r][1]), got[r][2]) == (c.token_ids, c.logprobs, c.finish_reason)
    # cancel: a dropped row gets no further tokens and no completion; the others are unchanged
    stream = engine.stream(prompts, params, jax.random.key(9), chunk_steps=4)
    first = next(stream)
    stream.cancel([1, 4])
    rest = [delta.row for chunk in stream for delta in chunk.rows]
    assert 1 not in rest and 4 not in rest and len(first.rows) == 6
    final = stream.completions()
    assert final[1] is None and final[4] is None
    assert [c for r, c in enumerate(final) if r not in (1, 4)] == [c for r, c in enumerate(expected) if r not in (1, 4)]


def test_stream_bad_input(model):
    engine = JaxEngine(model)
    with pytest.raises(ValueError, match="chunk_steps"):
        engine.stream([[1, 2]], SamplingParams(max_new_tokens=4), jax.random.key(0), chunk_steps=0)
    stream = engine.stream([[1, 2]], SamplingParams(max_new_tokens=4), jax.random.key(0))
    with pytest.raises(ValueError, match="row 3"):
        stream.cancel([3])


# ------------------------------------------------------------------ logits-mask hook
@jax.tree_util.register_pytree_node_class
class _NoRepeat:
    """A test mask: a row never emits the token it emitted last (state: that token, -1 at
    first), and its budget's last token is always ``FINAL``. Exercises every hook (state, the
    mask at L positions after drafts with their remaining budgets, advance)."""

    FINAL = 7

    def init_state(self, rows):
        return jnp.full((rows,), -1, jnp.int32)

    def mask_logits(self, state, logits, drafts, remaining):
        previous = jnp.concatenate([state[:, None], drafts], axis=1)  # (B, L)
        vocab = jnp.arange(logits.shape[-1])
        banned = jnp.where((remaining == 1)[..., None], vocab != self.FINAL, vocab == previous[..., None])
        return jnp.where(banned, NEG_INF, logits)

    def advance(self, state, tokens, count):
        last = jnp.take_along_axis(tokens, jnp.maximum(count - 1, 0)[:, None], axis=1)[:, 0]
        return jnp.where(count > 0, last, state)

    def propose(self, state, drafts, num_valid, remaining):
        return drafts, num_valid

    def tree_flatten(self):
        return (), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls()


def _masked_generate(model, mask, lookup, temperature=0.0, key=jax.random.key(0)):
    request = Request(max_new_tokens=NEW, temperature=temperature, prompt_lookup=lookup, logits_mask=mask)
    config = SamplerConfig()
    weights = unrolled_weights(model)
    loop, rows, _ = start_decode(model, PROMPTS, key, request, config, None, weights)
    return SamplerOutput.from_state(decode(model, weights, loop, request, config), rows, request)


def test_logits_mask_hook_applies_on_both_step_paths(model):
    free = generate_tokens(model, PROMPTS, jax.random.key(0), max_new_tokens=NEW, temperature=0.0)

    def repeats(out):  # consecutive equal tokens before the last one (which the mask forces)
        return int((out.tokens[:, 1:-1] == out.tokens[:, :-2]).sum())

    plain = _masked_generate(model, _NoRepeat(), None)
    fast = _masked_generate(model, _NoRepeat(), LOOKUP)
    assert repeats(free) > 0 and repeats(plain) == 0
    assert (free.tokens[:, -1] != _NoRepeat.FINAL).any() and (plain.tokens[:, -1] == _NoRepeat.FINAL).all()
    # greedy lookup is exact under the mask, at every draft position (log-probs: another program's rounding)
    np.testing.assert_array_equal(fast.tokens, plain.tokens)
    np.testing.assert_allclose(fast.logprobs, plain.logprobs, atol=1e-4)
    for lookup in (None, LOOKUP):
        sampled = _masked_generate(model, _NoRepeat(), lookup, temperature=1.0)
        assert repeats(sampled) == 0 and (sampled.tokens[:, -1] == _NoRepeat.FINAL).all()
        assert np.isfinite(sampled.logprobs).all()
