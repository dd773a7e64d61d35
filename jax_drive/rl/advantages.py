"""Group-relative advantages for multi-turn rollouts (GRPO and the two mtGRPO variants).

All functions are pure and jittable. Rewards (MTDrive Eq. 2,
:func:`jax_drive.rollout.reward.turn_rewards`) come as a dense array over
``(num_prompts, G, max_turns)`` with a boolean ``turn_mask`` of the same shape that says
which turns exist: a rollout that stopped after turn k (empty feedback, or the turn budget
ran out) has ``turn_mask[p, i, k:] == False``. Missing turns never enter a mean or a std and
always get advantage 0.

The three estimators of MTDrive's Table 3 (``r`` = turn reward, ``m`` = turn mask, ``i`` =
rollout in the group of prompt ``p``, ``j`` = turn index):

1. ``grpo`` (sequence reward). ``R_i = sum_j m_ij r_ij / sum_j m_ij`` (mean of the turns a
   rollout took), then ``A_i = (R_i - mean_i R_i) / (std_i R_i + eps)`` over the G rollouts,
   broadcast to every generated token of every turn of rollout i.
2. ``mtgrpo_intra`` (intra-group, per turn index; the paper's Eq. 3). For each turn index j,
   ``A_ij = (r_ij - mu_j) / (sigma_j + eps)`` with ``mu_j``, ``sigma_j`` over the rollouts
   ``{i : m_ij}`` of the same prompt that reached turn j.
3. ``mtgrpo_cross`` (cross-turn; the paper's best). ``A_ij = (r_ij - mu) / (sigma + eps)``
   with ``mu``, ``sigma`` over all existing turns ``{(i, j) : m_ij}`` of the group.

Bias of per-turn-index statistics (variant 2): the policy itself decides how many turns a
rollout takes (a rollout continues only while the PDM Agent still reports a violation), so
the population that reaches turn j > 1 is selected: it holds only rollouts whose earlier
turns failed, and it shrinks with j. A late turn is therefore compared only with other
late turns of struggling rollouts (a mediocre turn-3 answer may get a large positive
advantage because its peers are also bad), and a turn index reached by a single rollout has
no peer at all. We keep the paper's definition and make the two edge cases explicit:

* a group (or turn-index slot) with fewer than ``min_group_size`` (default 2) valid entries
  gets advantage 0 under ``singleton='zero'`` (default: no relative signal), or the raw
  reward minus nothing divided by one under ``singleton='raw'`` (veRL's convention for
  groups of size 1: mean 0, std 1);
* a group whose valid rewards are all exactly equal (zero variance) gets advantage 0
  (tested exactly with max == min, not through ``eps``).

The std convention is configurable: ``unbiased_std=True`` divides by ``n - 1`` (veRL, TRL,
Tunix: torch.std default), ``False`` by ``n``. ``epsilon`` defaults to 1e-6 (veRL, Tunix;
TRL uses 1e-4). ``scale_by_std=False`` gives Dr.GRPO's mean-only centring.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import chex
import jax
import jax.numpy as jnp

from jax_drive.configs import at_least
from jax_drive.names import ADVANTAGE_MODES

AdvantageMode = Literal["grpo", "mtgrpo_intra", "mtgrpo_cross"]


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """How turn rewards become advantages.

    Attributes:
      mode: 'grpo' (sequence reward), 'mtgrpo_intra' (per turn index) or 'mtgrpo_cross'
        (all turns of the group; MTDrive's best, the default).
      epsilon: added to the std in the denominator (veRL / Tunix 1e-6; TRL 1e-4).
      unbiased_std: std with the n - 1 denominator (torch.std default, used by veRL/TRL).
      scale_by_std: divide by the std (False = Dr.GRPO: centring only).
      singleton: 'zero' (default) or 'raw' for groups with fewer than ``min_group_size``
        valid entries ('raw' = veRL's mean 0 / std 1 convention).
      min_group_size: smallest number of valid entries that is normalised (>= 1).
    """

    mode: AdvantageMode = "mtgrpo_cross"
    epsilon: float = 1e-6
    unbiased_std: bool = True
    scale_by_std: bool = True
    singleton: Literal["zero", "raw"] = "zero"
    min_group_size: int = 2

    def __post_init__(self):
        if self.mode not in ADVANTAGE_MODES:
            raise ValueError(f"unknown advantage mode {self.mode!r}; expected one of {ADVANTAGE_MODES}")
        if self.singleton not in ("zero", "raw"):
            raise ValueError(f"singleton must be 'zero' or 'raw', got {self.singleton!r}")
        at_least(self, 0, "epsilon")
        at_least(self, 1, "min_group_size")


def masked_group_normalize(
    values: chex.Array,
    mask: chex.Array,
    axes: tuple[int, ...],
    config: AdvantageConfig = AdvantageConfig(),
) -> chex.Array:
    """Normalise ``values`` over ``axes`` using only entries where ``mask`` is True.

    ``out = (x - mean) / (std + eps)`` where mean/std run over the valid entries of each
    group (the slice spanned by ``axes``); invalid entries give 0; groups with zero variance
    give 0; groups with fewer than ``config.min_group_size`` valid entries give 0
    (``singleton='zero'``) or ``x`` (``singleton='raw'``).

    Args:
      values: (...) float. mask: same shape, bool. axes: the group axes (negative ok).
    Returns:
      same shape as values, float32.
    """
    x = jnp.asarray(values, jnp.float32)
    m = jnp.asarray(mask, bool)
    mf = m.astype(jnp.float32)
    n = jnp.sum(mf, axis=axes, keepdims=True)
    safe_n = jnp.maximum(n, 1.0)
    mean = jnp.sum(x * mf, axis=axes, keepdims=True) / safe_n
    sq = jnp.sum(jnp.square(x - mean) * mf, axis=axes, keepdims=True)
    denom = jnp.maximum(n - 1.0, 1.0) if config.unbiased_std else safe_n
    std = jnp.sqrt(sq / denom)
    # exact zero-variance test: every valid entry equal
    big = jnp.finfo(jnp.float32).max
    vmax = jnp.max(jnp.where(m, x, -big), axis=axes, keepdims=True)
    vmin = jnp.min(jnp.where(m, x, big), axis=axes, keepdims=True)
    constant = vmax <= vmin
    centred = x - mean
    scaled = centred / (std + config.epsilon) if config.scale_by_std else centred
    normalised = jnp.where(constant, 0.0, scaled)
    small = n < config.min_group_size
    fallback = x if config.singleton == "raw" else jnp.zeros_like(x)
    out = jnp.where(small, fallback, normalised)
    return jnp.where(m, out, 0.0)


def grpo_sequence_advantages(
    rewards: chex.Array, turn_mask: chex.Array, config: AdvantageConfig = AdvantageConfig(mode="grpo")
) -> chex.Array:
    """Table 3 row 1: sequence reward (mean of existing turns), normalised over the G rollouts.

    Args:
      rewards, turn_mask: (P, G, N).
    Returns:
      (P, G, N): the rollout's advantage repeated on each existing turn, 0 on missing turns.
    """
    m = jnp.asarray(turn_mask, bool)
    mf = m.astype(jnp.float32)
    turns = jnp.sum(mf, axis=-1)
    seq = jnp.sum(jnp.asarray(rewards, jnp.float32) * mf, axis=-1) / jnp.maximum(turns, 1.0)
    adv = masked_group_normalize(seq, turns > 0, axes=(-1,), config=config)  # over G
    return jnp.where(m, adv[..., None], 0.0)


def mtgrpo_intra_advantages(
    rewards: chex.Array, turn_mask: chex.Array, config: AdvantageConfig = AdvantageConfig(mode="mtgrpo_intra")
) -> chex.Array:
    """Table 3 row 2 (paper Eq. 3): each turn index normalised across the G rollouts.
    rewards, turn_mask: (P, G, N) -> (P, G, N) advantages (0 on missing turns)."""
    return masked_group_normalize(rewards, turn_mask, axes=(-2,), config=config)


def mtgrpo_cross_advantages(
    rewards: chex.Array, turn_mask: chex.Array, config: AdvantageConfig = AdvantageConfig(mode="mtgrpo_cross")
) -> chex.Array:
    """Table 3 row 3: normalised within the group over all existing turns of all G rollouts.
    rewards, turn_mask: (P, G, N) -> (P, G, N) advantages (0 on missing turns)."""
    return masked_group_normalize(rewards, turn_mask, axes=(-2, -1), config=config)


def compute_advantages(rewards: chex.Array, turn_mask: chex.Array, config: AdvantageConfig = AdvantageConfig()) -> chex.Array:
    """Dispatch on ``config.mode``. rewards, turn_mask: (P, G, N) -> (P, G, N) float32."""
    chex.assert_rank(rewards, 3)
    chex.assert_equal_shape([rewards, turn_mask])
    if config.mode == "grpo":
        return grpo_sequence_advantages(rewards, turn_mask, config)
    if config.mode == "mtgrpo_intra":
        return mtgrpo_intra_advantages(rewards, turn_mask, config)
    return mtgrpo_cross_advantages(rewards, turn_mask, config)


compute_advantages_jit = jax.jit(compute_advantages, static_argnames=("config",))


def token_advantages(turn_advantages: chex.Array, turn_ids: chex.Array) -> chex.Array:
    """Broadcast per-turn advantages to tokens.

    Args:
      turn_advantages: (B, N) advantages of each row's turns (rows = flattened (P, G)).
      turn_ids: (B, L) int32 turn index of each token, -1 for tokens that carry no loss
        (prompt, feedback, padding).
    Returns:
      (B, L) float32, 0 where turn_ids < 0.
    """
    ids = jnp.asarray(turn_ids, jnp.int32)
    n = turn_advantages.shape[-1]
    gathered = jnp.take_along_axis(turn_advantages, jnp.clip(ids, 0, n - 1), axis=-1)
    return jnp.where(ids >= 0, gathered, 0.0).astype(jnp.float32)
