"""Multi-turn rollouts through engine sessions (KV caches kept between turns, only the
appended ids prefilled, prompt lookup on refinement turns) against the path that re-sends
every row's whole context: greedy rollouts must be identical (tokens, turns, scores, stop
reasons) with sampling log-probs within 1e-4, on a tiny policy with unmerged LoRA, with left-padded
prompts, rows whose turn ends early at a stop token, rows dropped by the context limit and
sessions split over several device batches."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from flax import nnx

from jax_drive.models import lora
from jax_drive.models.tiny import TINY_VOCAB, byte_tokenizer, peaked_tiny_model, tiny_policy
from jax_drive.rollout import RolloutConfig, run_rollouts
from jax_drive.sampling import JaxEngine, PromptLookup, SamplingParams
from jax_drive.scenes import stack_scenes, straight_road_scene

SPEED = 10.0
MAX_NEW = 12
# scene 1's prompt is longer: left padding in turn 1, and it reaches the context limit first
PROMPTS = ["plan scene 0", "plan scene 1, a longer prompt that pads the other rows on the left"]
FEEDBACK = "Use the [PT, ...] format."


def _reference(num):
    t = 0.1 * np.arange(1, 41)
    ref = np.stack([SPEED * t, np.zeros(40), np.zeros(40)], -1)
    return np.broadcast_to(ref, (num, 40, 3)).astype(np.float32)


class RecordingEngine:
    """Delegates to a JaxEngine and records what its sessions are asked to append."""

    supports_sessions = True

    def __init__(self, engine):
        self.engine = engine
        self.started: list[list[list[int]]] = []
        self.appended: list[list] = []

    def generate(self, prompts, params, key):  # pragma: no cover - the session path never calls it
        raise AssertionError("a session engine's rollout must not re-send whole contexts")

    def start(self, prompts, params, key):
        self.started.append([list(p) for p in prompts])
        session, completions = self.engine.start(prompts, params, key)
        outer = self

        class Recorded:
            num_rows = session.num_rows

            def extend(self, appended, params, key):
                outer.appended.append([None if a is None else list(a) for a in appended])
                return session.extend(appended, params, key)

            def close(self):
                session.close()

        return Recorded(), completions


def _policy():
    """A tiny byte-level policy with peaked logits (varied greedy answers) and non-zero,
    unmerged LoRA adapters (sessions must keep the LoRA model's decode weights)."""
    model = peaked_tiny_model("llama", seed=0, scale=3.0, vocab_size=TINY_VOCAB, max_position_embeddings=4096)
    lora.apply_lora(model, rank=2, alpha=4.0, rngs=nnx.Rngs(2))
    proj = model.layers.q_proj
    proj.lora_b[...] = 0.5 * jax.random.normal(jax.random.key(3), proj.lora_b.shape)
    return model, byte_tokenizer()


@pytest.fixture(scope="module")
def setup():
    model, tok = _policy()
    scenes = stack_scenes([straight_road_scene(scene_id=i, ego_speed=SPEED) for i in range(2)])
    # a stop token that scene 0's greedy first answer produces at step 3: its rows end turn 1 early
    probe = JaxEngine(model, tok).generate([tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": PROMPTS[0]}], add_generation_prompt=True))],
        SamplingParams(max_new_tokens=4, temperature=0.0, stop_token_ids=()), jax.random.key(0))[0]
    stop_ids = (int(probe.token_ids[3]),) + tuple(tok.eos_token_ids)
    sampling = SamplingParams(max_new_tokens=MAX_NEW, temperature=0.0, stop_token_ids=stop_ids)
    base = RolloutConfig(group_size=3, max_turns=3, sampling=sampling, format_feedback=FEEDBACK)
    # context limit: scene 0's rows fit all 3 turns, scene 1's (longer prompt) only 2
    full = run_rollouts(JaxEngine(model, tok), tok, scenes, jax.random.key(1),
                        RolloutConfig(**{**base.__dict__, "use_sessions": False}), reference=_reference(2),
                        prompts=PROMPTS)

    def before_turn(row, j):  # context length when row starts turn j
        return int(np.flatnonzero(full.turn_ids[row] == j)[0])

    limit = max(before_turn(0, 2), before_turn(3, 1)) + MAX_NEW
    assert before_turn(3, 2) + MAX_NEW > limit
    config = RolloutConfig(**{**base.__dict__, "max_context_tokens": limit})
    return model, tok, scenes, config


def _run(engine, tok, scenes, config, use_sessions):
    config = RolloutConfig(**{**config.__dict__, "use_sessions": use_sessions})
    return run_rollouts(engine, tok, scenes, jax.random.key(1), config, reference=_reference(2), prompts=PROMPTS)


def _assert_same_rollouts(a, b):
    assert [t.tolist() for t in a.tokens] == [t.tolist() for t in b.tokens]
    assert [t.tolist() for t in a.turn_ids] == [t.tolist() for t in b.turn_ids]
    for x, y in zip(a.sample_logprobs, b.sample_logprobs):
        np.testing.assert_allclose(x, y, atol=1e-4)
    assert a.turns == b.turns  # texts, finish reasons, feedback
    np.testing.assert_array_equal(a.stop_reason, b.stop_reason)
    for name in ("pdms", "format", "reward", "turn_mask", "usable"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


@pytest.mark.parametrize("lookup, max_batch_size", [(None, None), (PromptLookup(num_draft=3, max_ngram=2), None),
                                                    (PromptLookup(num_draft=2), 4)])
def test_session_rollouts_equal_resending_contexts(setup, lookup, max_batch_size):
    model, tok, scenes, config = setup
    plain = _run(JaxEngine(model, tok, max_batch_size=max_batch_size), tok, scenes, config, use_sessions=False)
    recording = RecordingEngine(JaxEngine(model, tok, max_batch_size=max_batch_size, prompt_lookup=lookup))
    sessions = _run(recording, tok, scenes, config, use_sessions=True)
    _assert_same_rollouts(sessions, plain)
    # the cases the test is about are present
    assert {t[0].finish_reason for t in plain.turns} == {"stop", "length"}  # a turn ended early at a stop token
    assert list(plain.stop_reason[1]) == ["context"] * 3 and list(plain.stop_reason[0]) == ["max_turns"] * 3
    np.testing.assert_array_equal(plain.num_turns, [[3, 3, 3], [2, 2, 2]])
    # turn 1 started the session with the prompts; later turns appended only the ids after each answer
    assert len(recording.started) == 1 and len(recording.appended) == 2
    for j, appended in enumerate(recording.appended, start=1):
        for r, extra in enumerate(appended):
            row = plain.transcripts.reshape(-1)[r]
            if j >= row.turn_ids.max() + 1:  # the row took no turn j
                assert extra is None
                continue
            gap = np.flatnonzero(row.turn_ids == j - 1)[-1] + 1, np.flatnonzero(row.turn_ids == j)[0]
            assert extra == row.tokens[gap[0]:gap[1]].tolist()


def test_use_sessions_false_never_starts_a_session(setup):
    model, tok, scenes, config = setup

    class NoStart(JaxEngine):
        def start(self, *args, **kwargs):  # pragma: no cover - must not be called
            raise AssertionError("use_sessions=False must send whole contexts")

    result = _run(NoStart(model, tok), tok, scenes, config, use_sessions=False)
    assert result.turn_mask.sum() == 15


def test_decode_weight_cache_hits_with_unmerged_lora():
    """Sessions keep their caches only while the engine's decode weights are the same object:
    an unmerged LoRA model must hit the cache until its arrays change."""
    from jax_drive.sampling.weights import DecodeWeightCache

    model, _, _ = tiny_policy(seed=0, lora_rank=4)
    cache = DecodeWeightCache()
    first = cache.get(model)
    assert cache.get(model) is first
    proj = model.layers.q_proj
    proj.lora_b[...] = proj.lora_b[...] + 1.0  # a trainer step assigns new arrays
    assert cache.get(model) is not first
