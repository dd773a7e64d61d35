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
) -> chex.Array:
    """MTDrive Eq. 2: ``r_ij = w_p * PDMS_ij + w_f * format_ij`` (0 where the turn is missing).

    Args:
      pdms, format_score: (..., N) float in [0, 1].
      turn_mask: (..., N) bool.
    Returns:
      (..., N) float32.
    """
    r = pdms_weight * jnp.asarray(pdms, jnp.float32) + format_weight * jnp.asarray(format_score, jnp.float32)
    return jnp.where(turn_mask, r, 0.0)
