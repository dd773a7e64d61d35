"""Rollout rows split over 8 devices (``SamplerConfig.mesh``) give the single-device samples.

Greedy and sampled tokens, lengths and stop flags are identical (sampling draws its random
bits from the key and the array shape, not from the device layout: JAX's partitionable
threefry); log-probs agree within 1e-5 (float32 logits of differently batched programs).
Covers left-padded prompts of different lengths, repeated prompts (shared-prefix prefill),
a row that stops early, and a multi-turn session whose caches stay on the devices.
"""

import dataclasses

import jax
import numpy as np
import pytest

from jax_drive import parallel
from jax_drive.models.tiny import peaked_tiny_model
from jax_drive.sampling import JaxEngine, SamplerConfig, SamplingParams, generate_tokens
from jax_drive.sampling.decode import decode
from jax_drive.sampling.request import Request
from jax_drive.sampling.sampler import start_decode

PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7, 8, 9, 10, 11, 5, 6], [42, 43], [1, 2, 3, 4, 1, 2, 3], [9] * 12]
MESH = parallel.MeshConfig(data=4, fsdp=2)
LOGP_ATOL = 1e-5


@pytest.fixture(scope="module")
def model():
    return peaked_tiny_model("llama", scale=5.0)


def _assert_same(a, b):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_array_equal(a.stopped, b.stopped)
    np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=LOGP_ATOL)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_generate_tokens_on_8_devices_equals_one_device(model, temperature):
    stop = int(generate_tokens(model, PROMPTS[:1], jax.random.key(0), max_new_tokens=4, temperature=0.0).tokens[0, 3])
    kw = dict(max_new_tokens=12, temperature=temperature, stop_token_ids=[stop] if temperature == 0 else [])
    plain = generate_tokens(model, PROMPTS, jax.random.key(5), **kw)
    sharded = generate_tokens(model, PROMPTS, jax.random.key(5), config=SamplerConfig(mesh=MESH), **kw)
    _assert_same(sharded, plain)
    if temperature == 0:
        assert plain.stopped[0] and plain.lengths[0] == 4 and plain.lengths.max() == 12  # one row stops early


def test_decode_loop_rows_live_on_every_device(model):
    config = SamplerConfig(mesh=MESH)
    request = Request(max_new_tokens=4, temperature=0.0)
    loop, rows, _ = start_decode(model, PROMPTS, jax.random.key(0), request, config)
    assert loop.tokens.shape[0] == 8 and rows == len(PROMPTS)  # 5 rows padded to the 8 devices
    out = decode(model, None, loop, request, config)
    for x in (out.tokens, out.logprobs, out.done):
        assert parallel.is_sharded(x, parallel.DATA) and parallel.is_sharded(x, parallel.FSDP)


def test_session_turns_on_8_devices_equal_one_device(model):
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=2)
    follow = dataclasses.replace(params, n=1)
    turns = []
    for config in (SamplerConfig(), SamplerConfig(mesh=MESH)):
        engine = JaxEngine(model, None, config)
        session, first = engine.start(PROMPTS[:3], params, jax.random.key(1))
        second = session.extend([[7, 8]] * session.num_rows, follow, jax.random.key(2))
        turns.append([first, second])
    for plain, sharded in zip(*turns):
        for a, b in zip(plain, sharded):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            np.testing.assert_allclose(b.logprobs, a.logprobs, rtol=0, atol=LOGP_ATOL)
