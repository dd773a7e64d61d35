"""Constrained rows split over 8 devices (``SamplerConfig.mesh``): the grammar tables go to every
device with the weights, each row's automaton state lives with its row. Every sampled answer
matches its grammar (200 draws per grammar at temperature 1, with jump-forward), and the
tokens equal the single-device sampler's."""

import re

import jax
import numpy as np

from jax_drive import parallel
from jax_drive.models.tiny import TINY_VOCAB, byte_tokenizer, peaked_tiny_model
from jax_drive.sampling import JaxEngine, SamplerConfig, SamplingParams
from jax_drive.sampling.grammar import Grammar
from jax_drive.sampling.grammar.regex import parse, to_regex

MESH = parallel.MeshConfig(data=4, fsdp=2)
TOKENIZER = byte_tokenizer()
GRAMMARS = [Grammar.regex(r"(left|right) in [1-9]\d? m"), Grammar.json_schema(
    {"type": "object", "properties": {"go": {"type": "boolean"}}, "required": ["go"]})]
DRAWS = 200


def test_constrained_rows_on_8_devices():
    model = peaked_tiny_model("llama", scale=2.0, vocab_size=TINY_VOCAB)
    params = SamplingParams(max_new_tokens=32, n=DRAWS, grammar=GRAMMARS)
    prompts = ["Where to turn?", "Go or not?"]
    sharded = JaxEngine(model, TOKENIZER, SamplerConfig(mesh=MESH), jump_forward=4)
    out = sharded.generate(prompts, params, jax.random.key(3))
    for i, grammar in enumerate(GRAMMARS):
        pattern = re.compile(to_regex(parse(grammar.pattern), python=True))
        texts = [c.text for c in out[i * DRAWS:(i + 1) * DRAWS]]
        assert all(pattern.fullmatch(t) for t in texts), [t for t in texts if not pattern.fullmatch(t)][:3]
        assert len(set(texts)) >= 2
    single = JaxEngine(model, TOKENIZER, jump_forward=4).generate(prompts, params, jax.random.key(3))
    assert [c.token_ids for c in single] == [c.token_ids for c in out]
    np.testing.assert_allclose(np.concatenate([c.logprobs for c in single]),
                               np.concatenate([c.logprobs for c in out]), atol=1e-5)
