"""The consensus critic: its score read as an expectation over the allowed values (against
full-vocabulary logits), class-balanced SFT targets, and the separation AUC (against
scipy's Mann-Whitney U)."""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from jax_drive.coop.negotiation import consensus as K
from jax_drive.coop.negotiation.critic import parse_consensus, separation_auc
from jax_drive.coop.negotiation.negotiate import LLMNegotiator
from jax_drive.models.tiny import tiny_policy
from jax_drive.pipelines.interdrive import negotiator as N
from jax_drive.sampling import JaxEngine


@pytest.fixture(scope="module")
def engine():
    model, _, tokenizer = tiny_policy(seed=0, lora_rank=None)
    return JaxEngine(model, tokenizer)


# ------------------------------------------------------------------------------ AUC
def test_separation_auc_on_known_inputs():
    assert separation_auc([0.9, 0.8, 0.3, 0.1], [True, True, False, False]) == 1.0
    assert separation_auc([0.1, 0.3, 0.8, 0.9], [True, True, False, False]) == 0.0
    assert separation_auc([0.5, 0.5, 0.5], [True, False, False]) == 0.5
    # agreed 0.5, 0.7 against 0.5, 0.2, 0.9: 0.5 beats 0.2 and ties 0.5 (1.5), 0.7 beats 0.5, 0.2 (2)
    assert separation_auc([0.5, 0.7, 0.5, 0.2, 0.9], [1, 1, 0, 0, 0]) == pytest.approx(3.5 / 6)
    with pytest.raises(ValueError, match="both classes"):
        separation_auc([0.1, 0.2], [True, True])
    with pytest.raises(ValueError, match="equal-length"):
        separation_auc([0.1, 0.2], [True])


def test_separation_auc_matches_mann_whitney_with_ties():
    rng = np.random.default_rng(0)
    scores = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], size=200)
    agreed = rng.random(200) < 0.4 + 0.4 * scores  # higher scores agree more often
    u = mannwhitneyu(scores[agreed], scores[~agreed]).statistic
    assert separation_auc(scores, agreed) == pytest.approx(u / (agreed.sum() * (~agreed).sum()), abs=1e-12)


# ------------------------------------------------------------------ scores and answers
def test_snapping_and_the_score_context():
    assert [K.snap_score(s) for s in (25, 48, 60, 72, 90, 95, 12.5)] == [25, 50, 50, 75, 100, 100, 0]
    assert K.snap_answer("Short analysis: ok. Consensus score: 95") == "Short analysis: ok. Consensus score: 100"
    assert K.snap_answer("no score here") == "no score here"
    answer = "Short analysis: They agree. Consensus score: 75"
    assert K.answer_context(answer) == "Short analysis: They agree. Consensus score: "
    assert K.answer_context("Consensus score: 75 and more") is None
    assert K.with_score(answer, 62.345) == "Short analysis: They agree. Consensus score: 62.3"
    assert parse_consensus(K.with_score(answer, 62.345))[0] == pytest.approx(0.623)


def test_first_tokens_must_decide_the_value(engine):
    tok = engine.tokenizer
    shared, firsts = K.score_first_tokens(tok, "Consensus score: ", K.CONSENSUS_SCORES)
    assert tok.decode(shared).endswith("score: ") and len(set(firsts)) == 5
    shared, firsts = K.score_first_tokens(tok, "Consensus score: ", (10, 15))  # "1" is forced, then 0 / 5
    assert tok.decode(shared).endswith(": 1") and [tok.decode([f]) for f in firsts] == ["0", "5"]
    for bad in ((10, 15, 20), (1, 10)):
        with pytest.raises(ValueError, match="first digits differ"):
            K.score_first_tokens(tok, "Consensus score: ", bad)


def test_expected_score_is_the_masked_distribution_of_full_logits(engine):
    model, tok = engine.model, engine.tokenizer
    prompts = [tok.encode("Vehicle 1: I will stop."), tok.encode("Both say go first, a much longer prompt here.")]
    answers = ["Short analysis: fine Consensus score: 25", "Short analysis: no Consensus score: 100", "garbage"]
    prompts.append(tok.encode("x"))
    got = K.expected_scores(model, tok, prompts, answers)
    assert got[2] == K.ScoreReadout(None)
    for prompt, answer, readout in zip(prompts, answers, got[:2]):
        ids = list(prompt) + tok.encode(K.answer_context(answer))
        logits = np.asarray(model(jnp.asarray([ids]))[0][0, -1], np.float64)
        firsts = [tok.encode(K.answer_context(answer) + str(s))[len(ids) - len(prompt)] for s in K.CONSENSUS_SCORES]
        p = np.exp(logits[firsts] - logits[firsts].max())
        p /= p.sum()
        np.testing.assert_allclose(readout.probs, p, atol=1e-4)
        assert readout.expected == pytest.approx(float(p @ np.asarray(K.CONSENSUS_SCORES)), abs=1e-2)


def test_the_negotiator_writes_the_expected_score_into_its_answer(engine):
    neg = LLMNegotiator(engine, "compact", consensus_tokens=40, constrain_answers=True,
                        consensus_scores=K.CONSENSUS_SCORES, consensus_readout="expected")
    prompts = [[{"role": "user", "content": f"Vehicle {k}: I will go first."}] for k in range(3)]
    answers = neg.consensus_answers(prompts)
    for answer, sampled, readout in zip(answers, neg.last_sampled, neg.last_readouts):
        assert int(sampled.rsplit(": ", 1)[1]) in K.CONSENSUS_SCORES  # the grammar's choices
        assert sum(readout.probs) == pytest.approx(1.0) and 0.0 <= readout.expected <= 100.0
        assert parse_consensus(answer)[0] == pytest.approx(round(readout.expected, 1) / 100)
    with pytest.raises(ValueError, match="constrain_answers"):
        LLMNegotiator(engine, consensus_readout="expected")
    with pytest.raises(ValueError, match="local model"):
        LLMNegotiator(object(), constrain_answers=True, consensus_scores=(0, 100), consensus_readout="expected")


# ------------------------------------------------------------------------ SFT targets
def _consensus(prompt, score):
    answer = f"Short analysis: x Consensus score: {score}"
    return {"kind": "consensus", "messages": [{"role": "user", "content": prompt},
                                              {"role": "assistant", "content": answer}]}


def test_consensus_targets_are_snapped_and_class_balanced():
    examples = ([_consensus(f"a{k}", 95) for k in range(9)] + [_consensus(f"b{k}", 90) for k in range(3)]
                + [_consensus(f"c{k}", 25) for k in range(3)] + [_consensus(f"d{k}", 60) for k in range(2)])
    chosen = N.select_examples(examples, [("consensus", 6)], consensus_scores=K.CONSENSUS_SCORES)
    assert sorted(N.consensus_class(e) for e in chosen) == [25, 25, 50, 50, 100, 100]
    chosen = N.select_examples(examples, [("consensus", 12)], consensus_scores=K.CONSENSUS_SCORES)
    counts = {c: sum(N.consensus_class(e) == c for e in chosen) for c in (25, 50, 100)}
    assert counts == {25: 3, 50: 2, 100: 7}  # the small classes run out, the large one fills the rest
    raw = N.select_examples(examples, [("consensus", 6)])  # without allowed values: balanced over raw scores
    classes = [N.consensus_class(e) for e in raw]
    assert {classes.count(c) for c in (25, 60, 90, 95)} == {1, 2}  # four classes, 6 picks: one each, then two more
    assert N.balanced_order(["a", "a", "a", "b"], [0, 1, 2, 3]) == [0, 3, 1, 2]


def test_critic_probe_is_held_out_and_balanced_by_agreement_and_its_auc():
    recorded = [_consensus(f"p{k}", 95 if k < 8 else 25) for k in range(12)]
    probe = N.critic_probe_examples(recorded, recorded[:2], 6)
    assert len(probe) == 6 and not {e["messages"][0]["content"] for e in probe} & {"p0", "p1"}
    assert sum(N.ended_in_agreement(e) for e in probe) == 3

    class Scripted:
        """A critic that answers 90 where the teacher saw agreement, else 10, except one."""
        consensus_readout = "sampled"

        def consensus_answers(self, conversations):
            out = []
            for k, c in enumerate(conversations):
                agreed = int(c[0]["content"][1:]) < 8
                score = 90 if agreed != (k == 0) else 10  # the first one is scored the wrong way
                out.append(f"Short analysis: x Consensus score: {score}")
            return out

    report = N.critic_discrimination(Scripted(), probe)
    first_agreed = N.ended_in_agreement(probe[0])
    # one of the 6 is scored like the other class: it ties with the 3 of that class (1.5 of 9 pairs lost)
    assert report["auc"] == pytest.approx(7.5 / 9) and report["agreed"] == 3 and report["unreadable"] == 0
    assert report["mean_agreed"] == pytest.approx((0.9 * 2 + (0.1 if first_agreed else 0.9)) / 3)
