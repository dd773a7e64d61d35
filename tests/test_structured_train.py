"""The trainer under the sampler's grammar masks:

1. the chunked log-prob kernel with per-position allowed classes equals a dense masked
   log-softmax (values and gradients, the pure-JAX twin and the Pallas kernel in interpret
   mode); a position with one allowed token has log-prob 0 and no gradient;
2. constrained MTDrive rollouts (the trajectory grammar, two turns in a session, a tiny random
   policy over the byte tokenizer, a budget that binds the finish-in-budget mask): the
   trainer's per-token log-probs (``batch_token_logprobs`` with the grammar, states replayed
   per turn) equal the sampler's within 1e-5, the unmasked trainer's do not, and
   ``grpo_update`` recomputes pi_old under the same masks (its ``logp_mismatch``);
3. a row whose tokens leave its grammar is scored unmasked (finite), not with -inf.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_drive.models.tiny import tiny_policy
from jax_drive.rl.batching import answer_allowed, batch_token_logprobs
from jax_drive.rl.grpo import GRPOConfig, answer_grammar_tables, build_train_batch, grpo_update
from jax_drive.rl.loss import LossConfig
from jax_drive.rl.optim import OptimConfig, make_optimizer, split_model
from jax_drive.rollout import RolloutConfig, run_rollouts
from jax_drive.sampling import JaxEngine, SamplingParams
from jax_drive.scenes import stack_scenes, straight_road_scene
from kernels import AllowedTokens, LogprobConfig, token_logprobs

SMALL = LogprobConfig(token_chunk=16, vocab_chunk=32, token_block=8, vocab_block=8, hidden_block=8)


def _dense_masked(hidden, head, targets, allowed: AllowedTokens):
    logits = hidden @ head.T
    columns = allowed.token_class[allowed.grammar]  # (..., V)
    ok = jnp.take_along_axis(allowed.classes, columns, axis=-1)
    logp = jax.nn.log_softmax(jnp.where(ok, logits, -jnp.inf), axis=-1)
    return jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


@pytest.mark.parametrize("impl", ["jax", "interpret"])
def test_masked_kernel_equals_the_dense_masked_log_softmax(impl):
    rng = np.random.default_rng(0)
    lead, d, v, c = (3, 11), 16, 45, 5
    hidden = jnp.asarray(rng.normal(size=(*lead, d)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(v, d)) * 0.5, jnp.float32)
    token_class = jnp.asarray(rng.integers(0, c, size=(2, v)), jnp.int32)
    grammar = jnp.asarray(rng.integers(0, 2, size=lead), jnp.int32)
    classes = jnp.asarray(rng.random((*lead, c)) < 0.6).at[..., 0].set(True)
    only = np.flatnonzero(np.asarray(token_class[grammar[0, 0]]) == 0)
    token_class = token_class.at[grammar[0, 0], only[1:]].set(1)  # class 0 of this grammar: one token
    classes = classes.at[0, 0].set(False).at[0, 0, 0].set(True)  # position (0, 0) allows only it: forced
    targets = np.asarray(rng.integers(0, v, size=lead))
    allowed_cols = np.asarray(jnp.take_along_axis(classes, token_class[grammar], axis=-1))
    for idx in np.ndindex(*lead):  # every target is an allowed token
        targets[idx] = rng.choice(np.flatnonzero(allowed_cols[idx]))
    assert targets[0, 0] == only[0]
    targets = jnp.asarray(targets)
    allowed = AllowedTokens(classes, token_class, grammar)

    def run(h, w):
        return token_logprobs(h, w, targets, config=SMALL, impl=impl, allowed=allowed)

    out, vjp = jax.vjp(run, hidden, head)
    ref, ref_vjp = jax.vjp(lambda h, w: _dense_masked(h, w, targets, allowed), hidden, head)
    np.testing.assert_allclose(out, ref, atol=1e-5)
    g = jnp.asarray(rng.normal(size=lead), jnp.float32)
    for got, want in zip(vjp(g), ref_vjp(g)):
        np.testing.assert_allclose(got, want, atol=1e-4)
    assert float(out[0, 0]) == 0.0 and not np.asarray(vjp(g)[0])[0, 0].any()  # forced: 0, no gradient
    unmasked = token_logprobs(hidden, head, targets, config=SMALL, impl=impl)
    assert float(jnp.max(jnp.abs(unmasked - out))) > 0.1


@pytest.fixture(scope="module")
def rollouts():
    """One scene x 2 rollouts x 2 turns of a tiny policy under the trajectory grammar, with a
    budget 12 tokens above the grammar's shortest answer (the finish-in-budget mask binds)."""
    model, _, tokenizer = tiny_policy(seed=3, lora_rank=None)
    engine = JaxEngine(model, tokenizer, jump_forward=4)
    probe = RolloutConfig(constrain_answers=True)
    budget = engine.grammars.compile(probe.answer_grammar(), tokenizer.eos_token_ids).min_tokens + 12
    config = RolloutConfig(group_size=2, max_turns=2, constrain_answers=True,
                           sampling=SamplingParams(max_new_tokens=budget, temperature=1.0))
    scenes = stack_scenes([straight_road_scene()])
    t = 0.1 * np.arange(1, 41)
    reference = np.stack([10 * t, 0 * t, 0 * t], -1)[None].astype(np.float32)
    result = run_rollouts(engine, tokenizer, scenes, jax.random.key(0), config, reference=reference,
                          prompts=["Plan scene 0."])
    return model, tokenizer, config, result


def test_sampler_and_trainer_logprobs_agree_under_the_masks(rollouts):
    model, tokenizer, config, result = rollouts
    assert result.turn_mask[..., 1].any()  # a row took a second turn (its own automaton)
    assert result.usable[result.turn_mask].all()  # every constrained answer parses in range
    tables, rows = answer_grammar_tables(tokenizer, model.config.vocab_size, config)
    adv = np.zeros(result.pdms.shape, np.float32)
    batch = build_train_batch(result, adv, tokenizer.pad_token_id, bucket_size=64, grammar_rows=rows)
    batch = jax.tree.map(jnp.asarray, batch)
    answer = np.asarray(batch["loss_mask"]) > 0
    masked = np.asarray(batch_token_logprobs(model, batch, grammar=tables))
    plain = np.asarray(batch_token_logprobs(model, batch))
    sampler = np.asarray(batch["old_logp"])
    assert np.abs(masked - sampler)[answer].max() < 1e-5
    assert np.abs(plain - sampler)[answer].max() > 0.5  # the unmasked trainer differs
    assert (sampler[answer] == 0).mean() > 0.5  # most trajectory characters are forced
    # the finish-in-budget rule decided some of those masks: without it more classes are allowed
    allowed, legal = answer_allowed(tables, batch)
    assert bool(legal.all())
    unbounded = dict(batch, grammar_budget=jnp.full_like(batch["grammar_budget"], 10_000))
    loose, _ = answer_allowed(tables, unbounded)
    binds = np.any(np.asarray(loose.classes) != np.asarray(allowed.classes), axis=-1) & answer
    assert binds.sum() > 0

    graphdef, params, rest = split_model(model, "full")
    opt_state = make_optimizer(OptimConfig()).init(params)
    grpo = GRPOConfig(rollout=config, loss=LossConfig(kl_coef=0.0), optim=OptimConfig(trainable="full"),
                      minibatch_size=4)
    _, _, metrics = grpo_update(graphdef, params, rest, opt_state, None, dict(batch), grpo, jax.random.key(1),
                                grammar=tables)
    assert metrics["logp_mismatch"] < 1e-6 and np.isfinite(metrics["loss"])  # pi_old recomputed under the masks


def test_a_row_that_leaves_its_grammar_is_scored_unmasked(rollouts):
    model, tokenizer, config, result = rollouts
    tables, rows = answer_grammar_tables(tokenizer, model.config.vocab_size, config)
    batch = build_train_batch(result, np.zeros(result.pdms.shape, np.float32), tokenizer.pad_token_id,
                              bucket_size=64, grammar_rows=rows)
    first = int(np.argmax(batch["loss_mask"][0] > 0))
    batch["targets"][0, first] = tokenizer.encode("Q")[0]  # 'Q' cannot start a trajectory answer
    batch = jax.tree.map(jnp.asarray, batch)
    allowed, legal = answer_allowed(tables, batch)
    assert not bool(legal[0]) and bool(legal[1:].all())
    assert bool(np.asarray(allowed.classes)[0].all())  # row 0: every class (unmasked)
    logp = np.asarray(batch_token_logprobs(model, batch, grammar=tables))
    assert np.isfinite(logp).all()
    np.testing.assert_allclose(logp[0], np.asarray(batch_token_logprobs(model, batch))[0], atol=1e-6)
