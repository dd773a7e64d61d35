"""Clipped policy loss + K3 KL vs a direct numpy formula."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_drive.rl.loss import LossConfig, aggregate, kl_penalty, policy_loss


def _np_loss(logp, old, ref, adv, mask, eps=0.2, c=None, beta=0.01, agg="seq-mean-token-mean"):
    b, l = logp.shape
    per_tok = np.zeros((b, l))
    kl_tok = np.zeros((b, l))
    for i in range(b):
        for t in range(l):
            ratio = np.exp(logp[i, t] - old[i, t])
            surr1 = ratio * adv[i, t]
            surr2 = min(max(ratio, 1 - eps), 1 + eps) * adv[i, t]
            obj = min(surr1, surr2)  # PPO objective (to maximise)
            if c is not None and adv[i, t] < 0:
                obj = max(obj, c * adv[i, t])
            per_tok[i, t] = -obj
            d = ref[i, t] - logp[i, t]
            kl_tok[i, t] = min(max(np.exp(d) - d - 1, -10), 10)

    def reduce(x):
        if agg == "token-mean":
            return (x * mask).sum() / mask.sum()
        rows = [i for i in range(b) if mask[i].sum() > 0]
        if agg == "seq-mean-token-mean":
            return np.mean([(x[i] * mask[i]).sum() / mask[i].sum() for i in rows])
        if agg == "seq-mean-token-sum":
            return np.mean([(x[i] * mask[i]).sum() for i in rows])
        return (x * mask).sum() / (len(rows) * l)

    return reduce(per_tok) + beta * reduce(kl_tok), reduce(kl_tok)


def _batch(seed=0, b=4, l=7):
    rng = np.random.default_rng(seed)
    logp = rng.uniform(-3, -0.1, (b, l))
    old = logp + rng.normal(0, 0.4, (b, l))  # ratios well outside [0.8, 1.2] for some tokens
    ref = logp + rng.normal(0, 0.5, (b, l))
    adv = rng.normal(0, 1.5, (b, l))
    mask = (rng.uniform(size=(b, l)) < 0.7).astype(np.float64)
    mask[-1] = 0  # an all-padding row
    mask[0, 0] = 1
    return logp, old, ref, adv, mask


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("dual", [None, 3.0])
def test_loss_matches_numpy(agg, dual):
    logp, old, ref, adv, mask = _batch()
    cfg = LossConfig(aggregation=agg, dual_clip_c=dual, kl_coef=0.01)
    loss, metrics = policy_loss(*(jnp.asarray(x, jnp.float32) for x in (logp, old, adv, mask)),
                                ref_logp=jnp.asarray(ref, jnp.float32), config=cfg)
    want, want_kl = _np_loss(logp, old, ref, adv, mask, c=dual, agg=agg)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(metrics["kl"]), want_kl, rtol=1e-5, atol=1e-6)
    assert 0.0 < float(metrics["clip_frac"]) < 1.0


def test_dual_clip_changes_large_negative_ratio_tokens():
    logp = np.log(np.array([[5.0, 1.0]]))  # ratio 5 and 1 vs old = 0
    old = np.zeros((1, 2))
    adv = np.array([[-1.0, -1.0]])
    mask = np.ones((1, 2))
    kw = dict(ref_logp=None)
    plain, _ = policy_loss(logp, old, adv, mask, config=LossConfig(kl_coef=0.0, aggregation="token-mean"), **kw)
    dual, m = policy_loss(logp, old, adv, mask, config=LossConfig(kl_coef=0.0, aggregation="token-mean", dual_clip_c=3.0), **kw)
    np.testing.assert_allclose(float(plain), (5.0 + 1.0) / 2, rtol=1e-6)
    np.testing.assert_allclose(float(dual), (3.0 + 1.0) / 2, rtol=1e-6)
    assert float(m["dual_clip_frac"]) == 0.5


def test_k3_values():
    # KL(p || q) for two categoricals equals the expectation of k3 under p
    p = np.array([0.7, 0.2, 0.1])
    q = np.array([0.4, 0.4, 0.2])
    k3 = np.asarray(kl_penalty(np.log(p), np.log(q), "k3"))
    exact = np.sum(p * np.log(p / q))
    np.testing.assert_allclose(np.sum(p * k3), exact, rtol=1e-5)
    np.testing.assert_allclose(np.sum(p * np.asarray(kl_penalty(np.log(p), np.log(q), "k1"))), exact, rtol=1e-5)
    # point values: d = log q - log p; k3 = e^d - d - 1 >= 0, 0 iff equal, clamped at 10
    np.testing.assert_allclose(k3, (q / p) - np.log(q / p) - 1, rtol=1e-5)
    assert float(kl_penalty(jnp.array(-1.0), jnp.array(-1.0), "k3")) == 0.0
    assert float(kl_penalty(jnp.array(-30.0), jnp.array(-1.0), "k3")) == 10.0
    np.testing.assert_allclose(float(kl_penalty(jnp.array(-1.0), jnp.array(-3.0), "k2")), 2.0)


def test_gradient_zero_on_clipped_tokens_and_matches_numpy():
    logp, old, ref, adv, mask = _batch(seed=3)
    cfg = LossConfig(kl_coef=0.0, aggregation="token-mean")

    def f(lp):
        return policy_loss(lp, jnp.asarray(old, jnp.float32), jnp.asarray(adv, jnp.float32),
                           jnp.asarray(mask, jnp.float32), config=cfg)[0]

    g = np.asarray(jax.grad(f)(jnp.asarray(logp, jnp.float32)))
    ratio = np.exp(logp - old)
    clipped = ((adv > 0) & (ratio > 1.2)) | ((adv < 0) & (ratio < 0.8))
    want = np.where(clipped, 0.0, -adv * ratio) * mask / mask.sum()
    np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-7)
    assert np.any(clipped & (mask > 0))


def test_on_policy_first_step_is_pg():
    # ratio 1, no clipping: loss = -mean(A) and KL = 0 when logp == ref
    logp, _, _, adv, mask = _batch(seed=5)
    loss, m = policy_loss(logp, logp, adv, mask, ref_logp=logp, config=LossConfig(aggregation="token-mean"))
    np.testing.assert_allclose(float(loss), -(adv * mask).sum() / mask.sum(), rtol=1e-5)
    assert float(m["clip_frac"]) == 0.0 and float(m["kl"]) == 0.0


def test_errors():
    with pytest.raises(ValueError):
        LossConfig(aggregation="sum")
    with pytest.raises(ValueError):
        LossConfig(dual_clip_c=0.5)
    for beta in (-0.01, float("nan")):
        with pytest.raises(ValueError, match="kl_coef must be >= 0"):
            LossConfig(kl_coef=beta)
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError):
        policy_loss(x, x, x, x, ref_logp=None, config=LossConfig(kl_coef=0.01))
    assert float(aggregate(x, x, "token-mean")) == 0.0
