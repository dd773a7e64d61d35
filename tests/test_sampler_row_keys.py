"""One PRNG key per row in the sampler: a row's sample depends on its own key only, not on
the rows it shares a call with (what `jax-drive serve` needs to honour each request's seed
when it batches requests together)."""

import jax
import numpy as np
import pytest

from jax_drive.models.tiny import peaked_tiny_model
from jax_drive.sampling import JaxEngine, PromptLookup, SamplingParams, generate_tokens
from jax_drive.sampling.request import row_keys

PROMPTS = [[5, 9, 2, 7], [3, 3, 8], [11, 4, 6, 1, 2, 9, 13], [5, 9, 2, 7]]


@pytest.fixture(scope="module")
def model():
    return peaked_tiny_model("llama", seed=2, scale=4.0)


def _alone_vs_batched(model, **kw):
    keys = jax.random.split(jax.random.key(3), len(PROMPTS))
    batched = generate_tokens(model, PROMPTS, keys, max_new_tokens=10, **kw)
    for r, prompt in enumerate(PROMPTS):
        alone = generate_tokens(model, [prompt], keys[r:r + 1], max_new_tokens=10, **kw)
        np.testing.assert_array_equal(batched.tokens[r], alone.tokens[0])
        np.testing.assert_allclose(batched.logprobs[r], alone.logprobs[0], atol=1e-5)
        assert batched.lengths[r] == alone.lengths[0]
    return batched


@pytest.mark.parametrize("kw", [{}, {"top_k": 5, "temperature": 0.7, "logprobs_mode": "processed"},
                                {"prompt_lookup": PromptLookup(num_draft=2, max_ngram=2)}],
                         ids=["plain", "filtered", "prompt_lookup"])
def test_a_rows_sample_depends_only_on_its_key(model, kw):
    batched = _alone_vs_batched(model, **kw)
    # rows 0 and 3 share the prompt (one shared prefill) but not the key
    assert not np.array_equal(batched.tokens[0], batched.tokens[3])


def test_equal_keys_give_equal_rows_and_raw_key_data_works(model):
    key = jax.random.key(8)
    keys = jax.numpy.stack([key, key])
    out = generate_tokens(model, [PROMPTS[0], PROMPTS[0]], keys, max_new_tokens=8)
    np.testing.assert_array_equal(out.tokens[0], out.tokens[1])
    raw = generate_tokens(model, [PROMPTS[0], PROMPTS[0]], jax.random.key_data(keys), max_new_tokens=8)
    np.testing.assert_array_equal(raw.tokens, out.tokens)
    # a single key still drives the whole call (one draw per step for all rows)
    assert row_keys(key, 2) is None and row_keys(jax.random.PRNGKey(1), 2) is None


def test_wrong_number_of_keys_is_an_error(model):
    with pytest.raises(ValueError, match="needs 2 keys"):
        generate_tokens(model, PROMPTS[:2], jax.random.split(jax.random.key(0), 3), max_new_tokens=4)


def test_engine_rows_keep_their_keys_across_max_batch_size_chunks(model):
    params = SamplingParams(max_new_tokens=6, n=2, stop_token_ids=())
    keys = jax.random.split(jax.random.key(1), 2 * len(PROMPTS))
    whole = JaxEngine(model).generate(PROMPTS, params, keys)
    chunked = JaxEngine(model, max_batch_size=3).generate(PROMPTS, params, keys)
    assert [c.token_ids for c in whole] == [c.token_ids for c in chunked]
    with pytest.raises(ValueError, match="needs 8 keys"):
        JaxEngine(model).generate(PROMPTS, params, keys[:4])
