"""Token-level clipped policy-gradient loss with a K3 KL penalty (GRPO / mtGRPO, Eq. 4).

Per generated token t (``m_t`` = loss mask, ``A_t`` = advantage of the token's turn):

* ratio ``rho_t = exp(clamp(logp_t - logp_old_t, -20, 20))``;
* clipped surrogate (a loss, to minimise)
  ``l_t = max(-A_t rho_t, -A_t clip(rho_t, 1 - eps_low, 1 + eps_high))``;
* optional dual clip (Ye et al. 2020, veRL's ``clip_ratio_c``, c > 1): for ``A_t < 0`` the
  loss is capped, ``l_t = min(l_t, -A_t c)``;
* KL to the frozen reference, K3 estimator (Schulman's "low variance" k3, veRL
  ``low_var_kl``): ``d = clamp(logp_ref - logp, -20, 20)``, ``kl_t = clamp(exp(d) - d - 1,
  -kl_clamp, kl_clamp)`` (unbiased for KL(pi || pi_ref) under samples from pi, always >= 0);
  k1 ``kl_t = logp - logp_ref`` and k2 ``0.5 (logp - logp_ref)^2`` are offered too;
* total per-token loss ``l_t + beta kl_t``.

Aggregation of a (B, L) per-token quantity ``x`` with mask ``m``:

* ``token-mean``: ``sum_bt m x / sum_bt m`` (veRL default, DAPO);
* ``seq-mean-token-mean``: ``mean_b (sum_t m x / sum_t m)`` (the paper's Eq. 4, GRPO);
* ``seq-mean-token-sum``: ``mean_b sum_t m x``;
* ``seq-mean-token-sum-norm``: ``sum_bt m x / (B * norm_length)`` (Dr.GRPO; ``norm_length``
  defaults to L, the padded length).

Rows whose mask is empty do not count in the ``seq-*`` means (they are padding rows).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import chex
import jax.numpy as jnp

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGGREGATIONS: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "none")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Policy loss settings (defaults: MTDrive / GRPO).

    Attributes:
      clip_eps: lower clip range epsilon (0.2 in GRPO, veRL, TRL).
      clip_eps_high: upper clip epsilon (None = same as clip_eps; DAPO's clip-higher uses 0.28).
      dual_clip_c: dual-clip constant c > 1 for negative advantages (None = off; veRL uses 3).
      kl_coef: beta, weight of the KL penalty (0.01 in MTDrive; 0 disables the reference pass).
      kl_estimator: 'k3' (default, veRL low_var_kl), 'k1', 'k2' or 'none'.
      kl_clamp: the K3 value is clamped to [-kl_clamp, kl_clamp] (veRL: 10).
      log_ratio_clamp: log-ratios are clamped to +-this before exp (veRL: 20).
      aggregation: see the module docstring (default 'seq-mean-token-mean', the paper's Eq. 4).
      norm_length: Dr.GRPO's constant length for 'seq-mean-token-sum-norm' (None = L).
    """

    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    dual_clip_c: float | None = None
    kl_coef: float = 0.01
    kl_estimator: str = "k3"
    kl_clamp: float = 10.0
    log_ratio_clamp: float = 20.0
    aggregation: Aggregation = "seq-mean-token-mean"
    norm_length: int | None = None

    def __post_init__(self):
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {self.aggregation!r}; expected one of {AGGREGATIONS}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown KL estimator {self.kl_estimator!r}; expected one of {KL_ESTIMATORS}")
        if self.dual_clip_c is not None and self.dual_clip_c <= 1.0:
            raise ValueError("dual_clip_c must be > 1")
        if not self.kl_coef >= 0.0:  # also refuses NaN
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.clip_eps < 0 or (self.clip_eps_high is not None and self.clip_eps_high < 0):
            raise ValueError("clip epsilons must be >= 0")

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef != 0.0 and self.kl_estimator != "none"


def aggregate(values: chex.Array, mask: chex.Array, mode: str, norm_length: int | None = None) -> chex.Array:
    """Reduce a (B, L) per-token quantity to a scalar; see the module docstring."""
    m = jnp.asarray(mask, jnp.float32)
    x = jnp.asarray(values, jnp.float32) * m
    if mode == "token-mean":
        return jnp.sum(x) / jnp.maximum(jnp.sum(m), 1.0)
    rows = (jnp.sum(m, axis=-1) > 0).astype(jnp.float32)
    num_rows = jnp.maximum(jnp.sum(rows), 1.0)
    if mode == "seq-mean-token-mean":
        per_seq = jnp.sum(x, axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)
        return jnp.sum(per_seq * rows) / num_rows
    if mode == "seq-mean-token-sum":
        return jnp.sum(jnp.sum(x, axis=-1) * rows) / num_rows
    if mode == "seq-mean-token-sum-norm":
        length = values.shape[-1] if norm_length is None else norm_length
        return jnp.sum(x) / (num_rows * float(length))
    raise ValueError(f"unknown aggregation {mode!r}")


def kl_penalty(logp: chex.Array, ref_logp: chex.Array, estimator: str = "k3", clamp: float = 10.0,
               log_ratio_clamp: float = 20.0) -> chex.Array:
    """Per-token KL(pi || pi_ref) estimate from sampled tokens. (B, L) -> (B, L) float32."""
    logp = jnp.asarray(logp, jnp.float32)
    ref_logp = jnp.asarray(ref_logp, jnp.float32)
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k2":
        return 0.5 * jnp.square(logp - ref_logp)
    if estimator == "k3":
        d = jnp.clip(ref_logp - logp, -log_ratio_clamp, log_ratio_clamp)
        return jnp.clip(jnp.exp(d) - d - 1.0, -clamp, clamp)
    if estimator == "none":
        return jnp.zeros_like(logp)
    raise ValueError(f"unknown KL estimator {estimator!r}")


def policy_loss(
    logp: chex.Array,
    old_logp: chex.Array,
    advantages: chex.Array,
    mask: chex.Array,
    ref_logp: chex.Array | None = None,
    config: LossConfig = LossConfig(),
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """The mtGRPO objective as a loss (negated Eq. 4).

    Args:
      logp: (B, L) log pi_theta of the sampled tokens (differentiable).
      old_logp: (B, L) log pi_old of the same tokens (no gradient).
      advantages: (B, L) per-token advantages.
      mask: (B, L) bool/float, 1 on generated tokens that carry loss.
      ref_logp: (B, L) log pi_ref, required when ``config.uses_reference``.
      config: LossConfig.
    Returns:
      (loss scalar, metrics) with metrics pg_loss, kl, clip_frac, dual_clip_frac, ratio_mean,
      approx_kl_old (k3 of old vs current), entropy proxy (-logp mean), num_tokens.
    """
    chex.assert_equal_shape([logp, old_logp, advantages, mask])
    m = jnp.asarray(mask, jnp.float32)
    logp = jnp.asarray(logp, jnp.float32)
    old_logp = jnp.asarray(old_logp, jnp.float32)
    adv = jnp.asarray(advantages, jnp.float32)
    log_ratio = jnp.clip(logp - old_logp, -config.log_ratio_clamp, config.log_ratio_clamp)
    ratio = jnp.exp(log_ratio)
    eps_high = config.clip_eps if config.clip_eps_high is None else config.clip_eps_high
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - config.clip_eps, 1.0 + eps_high)
    pg = jnp.maximum(unclipped, clipped)
    clip_active = (clipped > unclipped).astype(jnp.float32)
    dual_active = jnp.zeros_like(pg)
    if config.dual_clip_c is not None:
        cap = -adv * config.dual_clip_c
        dual_active = ((adv < 0) & (pg > cap)).astype(jnp.float32)
        pg = jnp.where(adv < 0, jnp.minimum(pg, cap), pg)
    pg_loss = aggregate(pg, m, config.aggregation, config.norm_length)
    loss = pg_loss
    if config.uses_reference:
        if ref_logp is None:
            raise ValueError("ref_logp is required when kl_coef != 0")
        kl_tok = kl_penalty(logp, ref_logp, config.kl_estimator, config.kl_clamp, config.log_ratio_clamp)
        kl = aggregate(kl_tok, m, config.aggregation, config.norm_length)
        loss = loss + config.kl_coef * kl
    else:
        kl = jnp.zeros((), jnp.float32)
    n = jnp.maximum(jnp.sum(m), 1.0)
    metrics = {
        "pg_loss": pg_loss,
        "kl": kl,
        "clip_frac": jnp.sum(clip_active * m) / n,
        "dual_clip_frac": jnp.sum(dual_active * m) / n,
        "ratio_mean": jnp.sum(ratio * m) / n,
        "approx_kl_old": jnp.sum(kl_penalty(logp, old_logp, "k3") * m) / n,
        "neg_logp": -jnp.sum(logp * m) / n,
        "num_tokens": jnp.sum(m),
    }
    return loss, metrics
