"""Comfort checks with Savitzky-Golay derivatives as fixed convolution matrices.

``scipy.signal.savgol_filter(y, window, poly, deriv, delta, mode="interp")`` is linear in
``y``; for a fixed length, window, order and derivative it is a constant (T, T) matrix
(interior rows are the S-G kernel, the first/last window//2 rows evaluate a polynomial
fitted to the first/last ``window`` samples: scipy's ``interp`` edge mode). We compute the
matrix once in numpy by filtering the identity with scipy and apply it in JAX.

Differences to NAVSIM kept on purpose: values are compared in float32 without NAVSIM's
rounding to 8 decimals (rounding at 1e-8 is below float32 resolution at these magnitudes);
only values within ~1e-6 of a bound can classify differently.
"""

from __future__ import annotations

import functools

import chex
import jax.numpy as jnp
import numpy as np
from scipy.signal import savgol_filter

from jax_drive.pdm.config import PDMConfig
from jax_drive.pdm.interpolate import unwrap_angles


@functools.lru_cache(maxsize=64)
def savgol_matrix(length: int, window: int, poly: int, deriv: int = 0, delta: float = 1.0) -> np.ndarray:
    """(length, length) float32 matrix M with M @ y == savgol_filter(y, ...) (mode interp).

    The window is clipped to ``length`` (NAVSIM passes ``min(window, n_time)``).
    """
    window = min(window, length)
    if poly >= window:
        raise ValueError(f"savgol: poly order {poly} must be < window {window}")
    eye = np.eye(length, dtype=np.float64)
    mat = savgol_filter(eye, window_length=window, polyorder=poly, deriv=deriv, delta=delta, axis=0)
    return mat.astype(np.float32)


def _apply(mat: np.ndarray, y: chex.Array) -> chex.Array:
    """Applies a (T, T) matrix along the last axis of y (..., T)."""
    return jnp.einsum("ts,...s->...t", jnp.asarray(mat), y)


def comfort_signals(ax: chex.Array, ay: chex.Array, heading: chex.Array, dt: float,
                    accel_window: int, jerk_window: int, config: PDMConfig) -> dict:
    """The six smoothed signals NAVSIM checks, each (..., T).

    Args: ax, ay (..., T) body-frame accelerations; heading (..., T); dt sample spacing.
      accel_window: S-G window for the lon/lat acceleration checks (v1.1: 41, v2: 8).
      jerk_window: S-G window of the jerk derivative (v1.1: 41, v2: 15). The acceleration
        fed to the jerk derivative is always smoothed with ``config.jerk_accel_window`` (8).
    Returns dict lon_accel, lat_accel, jerk (magnitude), lon_jerk, yaw_rate, yaw_accel.
    """
    t = ax.shape[-1]
    acc_m = savgol_matrix(t, accel_window, 2)
    pre_m = savgol_matrix(t, config.jerk_accel_window, 2)
    jerk_m = savgol_matrix(t, jerk_window, 2, 1, dt)
    yaw1 = savgol_matrix(t, config.yaw_window, 2, 1, dt)
    yaw2 = savgol_matrix(t, config.yaw_window, 3, 2, dt)
    mag = jnp.hypot(ax, ay)
    h = unwrap_angles(heading)
    return {
        "lon_accel": _apply(acc_m, ax),
        "lat_accel": _apply(acc_m, ay),
        "jerk": _apply(jerk_m, _apply(pre_m, mag)),
        "lon_jerk": _apply(jerk_m, _apply(pre_m, ax)),
        "yaw_rate": _apply(yaw1, h),
        "yaw_accel": _apply(yaw2, h),
    }


def comfort_checks(signals: dict, config: PDMConfig) -> chex.Array:
    """(..., 6) bool: each check holds at every step (strict bounds).

    Order: lon accel, lat accel, jerk, lon jerk, yaw accel, yaw rate (NAVSIM order).
    """
    def within(v, lo, hi):
        return jnp.all((v > lo) & (v < hi), axis=-1)

    return jnp.stack([
        within(signals["lon_accel"], config.min_lon_accel, config.max_lon_accel),
        within(signals["lat_accel"], -config.max_abs_lat_accel, config.max_abs_lat_accel),
        within(signals["jerk"], -config.max_abs_jerk, config.max_abs_jerk),
        within(signals["lon_jerk"], -config.max_abs_lon_jerk, config.max_abs_lon_jerk),
        within(signals["yaw_accel"], -config.max_abs_yaw_accel, config.max_abs_yaw_accel),
        within(signals["yaw_rate"], -config.max_abs_yaw_rate, config.max_abs_yaw_rate),
    ], axis=-1)


def is_comfortable_v1(ax, ay, heading, config: PDMConfig) -> chex.Array:
    """NAVSIM v1.1 comfort C in {0, 1}, (...) float, from (..., 41) simulated signals."""
    sig = comfort_signals(ax, ay, heading, config.dt, config.accel_window_v1,
                          config.jerk_window_v1, config)
    return jnp.all(comfort_checks(sig, config), axis=-1).astype(jnp.float32)


def center_accelerations(ax, ay, yaw_rate, yaw_accel, config: PDMConfig):
    """Rear-axle body accelerations moved to the box centre (NAVSIM v2 comfort).

    Rigid-body transfer by d = rear_axle_to_center along x: a_c = a + alpha x d + w x (w x d),
    i.e. (ax - w^2 d, ay + alpha d).
    """
    d = config.ego_rear_axle_to_center
    return ax - yaw_rate**2 * d, ay + yaw_accel * d


def is_comfortable_v2(ax, ay, heading, yaw_rate, yaw_accel, config: PDMConfig) -> chex.Array:
    """NAVSIM v2 comfort (used by history comfort HC) over any length T: (...) float."""
    cax, cay = center_accelerations(ax, ay, yaw_rate, yaw_accel, config)
    sig = comfort_signals(cax, cay, heading, config.dt, config.accel_window_v2,
                          config.jerk_window_v2, config)
    return jnp.all(comfort_checks(sig, config), axis=-1).astype(jnp.float32)


def extended_comfort(current: dict, previous: dict, overlap: int, config: PDMConfig) -> chex.Array:
    """NAVSIM v2 two-frame extended comfort EC, (...) float in {0, 1}.

    Args:
      current, previous: dicts with (..., T) 'accel' (magnitude), 'jerk', 'yaw_rate',
        'yaw_accel' signals of this frame and of the frame 0.5 s earlier, already aligned so
        that current[..., :overlap] and previous[..., -overlap:] cover the same times.
      overlap: number of common samples.
    EC = 1 when the RMS of the differences of all four signals over the overlap are within
    (ec_accel, ec_jerk, ec_yaw_rate, ec_yaw_accel).
    """
    bounds = {"accel": config.ec_accel, "jerk": config.ec_jerk, "yaw_rate": config.ec_yaw_rate,
              "yaw_accel": config.ec_yaw_accel}
    ok = []
    for name, bound in bounds.items():
        diff = current[name][..., :overlap] - previous[name][..., -overlap:]
        ok.append(jnp.sqrt(jnp.mean(diff**2, axis=-1)) <= bound)
    return jnp.all(jnp.stack(ok, -1), -1).astype(jnp.float32)
