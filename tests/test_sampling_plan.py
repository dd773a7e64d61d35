"""Request planning (``sampling.plan.plan_prefill``: pure, no model) and the model contract
the sampler checks (``jax_drive.models.protocol``)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jax_drive.models.protocol import DecoderLM, VisionLM
from jax_drive.models.qwen2_5_vl import Qwen2_5_VL, VLMConfig
from jax_drive.models.tiny import peaked_tiny_model
from jax_drive.sampling import JaxEngine, PromptLookup, SamplerConfig, generate_tokens
from jax_drive.sampling.plan import plan_continuation, plan_prefill
from jax_drive.sampling.request import Request

SYSTEM = list(range(100, 132))  # a 32-token shared prefix


def _plan(prompts, config=SamplerConfig(), max_new_tokens=8, **kw):
    return plan_prefill(prompts, Request(max_new_tokens=max_new_tokens, pad_id=0, **kw), config, max_positions=512)


def test_plan_buckets_and_repeated_prompts():
    plan = _plan([[1, 2, 3], [4, 5, 6, 7, 8], [1, 2, 3]], max_new_tokens=20)
    assert (plan.rows, plan.batch, plan.prompt_len, plan.gen_len, plan.draft_len) == (3, 4, 16, 32, 0)
    assert (plan.slots, plan.width) == (48, 32)
    assert plan.prefill_rows == (0, 1) and plan.source.tolist() == [0, 1, 0, 0]  # row 2 repeats row 0
    assert plan.ids.shape == (2, 16) and plan.ids[0, -3:].tolist() == [1, 2, 3]
    assert plan.row_valid.tolist() == [True, True, True, False] and plan.history is None
    unshared = _plan([[1, 2, 3], [4, 5, 6, 7, 8], [1, 2, 3]], SamplerConfig(share_prefix=False))
    assert unshared.source is None and unshared.prefill_rows == (0, 1, 2) and unshared.ids.shape == (4, 16)


def test_plan_common_prefix_packing_and_lookup_history():
    prompts = [SYSTEM + [1] * 40, SYSTEM + [2], SYSTEM + [3, 4]]
    packed = _plan(prompts)
    assert packed.common == 32 and packed.packed is not None  # the rest packed after the prefix
    assert int(packed.packed.positions[0, 0]) == 32 and packed.packed.slot_token.shape == (4, 128 - 1 - 32)
    padded = _plan(prompts, SamplerConfig(pack_prompts=False))
    assert padded.common == 32 and padded.packed is None
    assert (padded.ids[:, :32] == np.asarray(SYSTEM)).all() and padded.mask[:, :32].all()
    plain = _plan(prompts, SamplerConfig(share_prefix=False, pack_prompts=False))
    assert plain.common == 0 and plain.packed is None
    lookup = _plan(prompts, SamplerConfig(), prompt_lookup=PromptLookup(num_draft=3))
    assert lookup.draft_len == 3 and lookup.gen_len == 16 and lookup.width == 16 + 4 and lookup.slots == 128 + 16 + 3
    assert lookup.history.shape == (4, 128 + 16 + 3 + 1)
    assert lookup.history_len.tolist() == [72, 33, 34, 0]
    text_only = plan_prefill(prompts, Request(max_new_tokens=8), SamplerConfig(), max_positions=512, packable=False)
    assert text_only.common == 0 and text_only.packed is None


def test_plan_refuses_what_the_model_cannot_hold():
    with pytest.raises(ValueError, match="max_position_embeddings"):
        plan_prefill([[1] * 500], Request(max_new_tokens=20), SamplerConfig(), max_positions=512)
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        _plan([[1] * 40], SamplerConfig(prompt_buckets=(32,)))


def test_models_satisfy_the_sampler_protocols():
    text = peaked_tiny_model("llama")
    vlm = Qwen2_5_VL(VLMConfig.tiny())
    assert isinstance(text, DecoderLM) and not isinstance(text, VisionLM)
    assert isinstance(vlm, DecoderLM) and isinstance(vlm, VisionLM)

    class NotAModel:
        config = text.config

    with pytest.raises(TypeError, match="not a DecoderLM.*prefill, arrays"):
        generate_tokens(NotAModel(), [[1, 2]], jax.random.key(0), max_new_tokens=2)
    with pytest.raises(TypeError, match="not a DecoderLM"):
        JaxEngine(NotAModel())


def test_plan_continuation_writes_the_pending_token_and_all_but_the_last_appended_one():
    contexts = [[1, 2, 3], [4, 5, 6, 7, 8]]  # 3 and 8 are pending (fed, not cached)
    plan = plan_continuation(contexts, [[9, 10, 11], []], take=[2, 0], slot=[10, 12], shift=[0, -3],
                             request=Request(max_new_tokens=5, pad_id=0), config=SamplerConfig())
    assert (plan.rows, plan.batch, plan.gen_len) == (2, 2, 16)
    assert plan.take.tolist() == [2, 0] and plan.chunk_len.tolist() == [3, 0]
    assert plan.chunk.shape == (2, 16) and plan.chunk[0, :3].tolist() == [3, 9, 10]
    assert plan.slot.tolist() == [10, 12] and plan.start.tolist() == [13, 12]
    assert plan.position.tolist() == [2, 1]  # last context token's position: index + shift
    assert plan.pending.tolist() == [11, 8]
    assert plan.slots == 32 and plan.slots >= 13 + 5  # the pending slot plus the budget, bucketed
    lookup = plan_continuation(contexts, [[9, 10, 11], []], [2, 0], [10, 12], [0, 0],
                               Request(max_new_tokens=5, prompt_lookup=PromptLookup(num_draft=2)), SamplerConfig())
    assert lookup.history_len.tolist() == [6, 5] and lookup.history[0, :6].tolist() == [1, 2, 3, 9, 10, 11]
    assert lookup.width == 16 + 3
