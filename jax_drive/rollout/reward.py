"""The turn reward of a multi-turn rollout (MTDrive Eq. 2).

It lives with the rollouts (not in :mod:`jax_drive.rl`) because the rollout computes it and
the trainer consumes it: ``jax_drive.rl`` imports ``jax_drive.rollout``, never the reverse.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp


def turn_rewards(
    pdms: chex.Array,
    format_score: chex.Array,
    turn_mask: chex.Array,
    pdms_weight: float = 0.8,
    format_weight: float = 0.2,
    improvement_weight: float = 0.0,
) -> chex.Array:
    """MTDrive Eq. 2: ``r_ij = w_p * PDMS_ij + w_f * format_ij`` (0 where the turn is missing),
    plus an optional refinement bonus ``alpha * (r_ij - r_i,j-1)`` on every turn j > 1.

    The bonus (``improvement_weight`` = alpha, default 0 = the paper's reward) is the reward
    shaping of SCoRe (Kumar et al., 2024, stage II): multi-turn RL on a policy that already
    answers well tends to collapse to repeating its first answer, because a copy scores as
    much as its first attempt; the bonus pays for the change a turn makes, so a repeated
    violating answer earns nothing extra and a fix earns alpha times its gain. Turns are
    contiguous (a rollout stops for good), so turn j - 1 exists wherever turn j does.

    Args:
      pdms, format_score: (..., N) float in [0, 1].
      turn_mask: (..., N) bool.
      improvement_weight: alpha >= 0.
    Returns:
      (..., N) float32.
    """
    r = pdms_weight * jnp.asarray(pdms, jnp.float32) + format_weight * jnp.asarray(format_score, jnp.float32)
    gain = jnp.concatenate([jnp.zeros_like(r[..., :1]), r[..., 1:] - r[..., :-1]], axis=-1)
    return jnp.where(turn_mask, r + improvement_weight * gain, 0.0)
