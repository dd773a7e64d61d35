"""Pose resampling onto the 41-step scoring grid (NAVSIM's InterpolatedTrajectory).

NAVSIM puts the t0 ego state in front of the planner's poses and samples the resulting
trajectory at 0.0, 0.1, ..., 4.0 s; x and y are interpolated linearly, the heading on the
unwrapped angle sequence; times past the last pose are clipped to the last pose.
Everything here is in the ego rear-axle frame at t0, so the t0 pose is (0, 0, 0).
"""

from __future__ import annotations

import functools

import chex
import jax.numpy as jnp
import numpy as np

from jax_drive.geometry import wrap_angle
from jax_drive.types import NUM_SCORE_STEPS, OBS_DT


@functools.lru_cache(maxsize=32)
def interpolation_matrix(num_poses: int, dt: float, num_steps: int = NUM_SCORE_STEPS,
                         step_dt: float = OBS_DT) -> np.ndarray:
    """Linear-interpolation weights (num_steps, num_poses + 1), float32.

    Knot j (0..num_poses) sits at time j * dt (knot 0 = t0 ego). Output row i samples
    time min(i * step_dt, num_poses * dt). Computed once in float64 numpy.
    """
    if num_poses < 1 or dt <= 0:
        raise ValueError(f"need >= 1 pose and dt > 0, got {num_poses} poses, dt={dt}")
    times = np.minimum(np.arange(num_steps, dtype=np.float64) * step_dt, num_poses * dt)
    pos = times / dt
    # Snap values within 1e-9 of a knot (0.1 * 5 / 0.5 etc.) onto it.
    pos = np.where(np.abs(pos - np.round(pos)) < 1e-9, np.round(pos), pos)
    lo = np.clip(np.floor(pos).astype(np.int64), 0, num_poses - 1)
    frac = pos - lo
    w = np.zeros((num_steps, num_poses + 1), np.float64)
    w[np.arange(num_steps), lo] += 1.0 - frac
    w[np.arange(num_steps), lo + 1] += frac
    return w.astype(np.float32)


def unwrap_angles(angles: chex.Array, axis: int = -1) -> chex.Array:
    """Unwraps an angle sequence along ``axis`` so steps are in [-pi, pi). Any shape."""
    angles = jnp.moveaxis(angles, axis, -1)
    steps = wrap_angle(jnp.diff(angles, axis=-1))
    out = jnp.concatenate([angles[..., :1], angles[..., :1] + jnp.cumsum(steps, axis=-1)], -1)
    return jnp.moveaxis(out, -1, axis)


def interpolate_poses(scene, poses: chex.Array, dt: float) -> chex.Array:
    """Resamples planner poses onto the scoring grid.

    Args:
      scene: the Scene (unused beyond its frame: t0 ego is the origin; kept for the API).
      poses: (..., K, 3) [x, y, heading] at dt, 2 dt, ..., K dt in the t0 rear-axle frame.
      dt: spacing of the poses in seconds (0.5 for planner outputs, 0.1 for PDM-Closed).
    Returns:
      (..., 41, 3) states at 0.0 .. 4.0 s (index 0 = (0, 0, 0)), heading wrapped to [-pi, pi).
    """
    del scene
    poses = jnp.asarray(poses, jnp.float32)
    k = poses.shape[-2]
    w = jnp.asarray(interpolation_matrix(k, float(dt)))
    full = jnp.concatenate([jnp.zeros_like(poses[..., :1, :]), poses], axis=-2)  # (..., K+1, 3)
    heading = unwrap_angles(full[..., 2])
    xy = jnp.einsum("sk,...kc->...sc", w, full[..., :2])
    h = jnp.einsum("sk,...k->...s", w, heading)
    return jnp.concatenate([xy, wrap_angle(h)[..., None]], axis=-1)
