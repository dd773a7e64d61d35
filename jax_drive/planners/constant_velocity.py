"""Constant-velocity baseline (NAVSIM's ConstantVelocityAgent): keep the t0 speed, drive straight."""

from __future__ import annotations

import chex
import jax.numpy as jnp

from jax_drive.types import NUM_OUTPUT_POSES, OUTPUT_DT, Scene


def constant_velocity(scene: Scene) -> chex.Array:
    """Straight-ahead poses at the t0 speed.

    Args: scene with batch dims (...).
    Returns: (..., 8, 3) [speed * t, 0, 0] for t = 0.5 .. 4.0 s (ego frame).
    """
    speed = jnp.linalg.norm(scene.ego.velocity, axis=-1)  # (...)
    t = (jnp.arange(NUM_OUTPUT_POSES) + 1) * OUTPUT_DT
    x = speed[..., None] * t
    zeros = jnp.zeros_like(x)
    return jnp.stack([x, zeros, zeros], axis=-1)
