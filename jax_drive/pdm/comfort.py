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

from jax_drive.pdm.config import PDMConfig
from jax_drive.pdm.interpolate import unwrap_angles


@functools.lru_cache(maxsize=64)
def savgol_matrix(length: int, window: int, poly: int, deriv: int = 0, delta: float = 1.0) -> np.ndarray:
    """(length, length) float32 matrix M with M @ y == savgol_filter(y, ...) (mode interp).

    The window is clipped to ``length`` (NAVSIM passes ``min(window, n_time)``).
    """
    from scipy.signal import savgol_filter  # only while tracing (a stored executable needs no scipy)

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
                    accel_window: int, jerk_window: int, config: PDMConfig,
                    magnitude: chex.Array | None = None) -> dict:
    """The six smoothed signals NAVSIM checks, each (..., T).

    Args: ax, ay (..., T) body-frame accelerations; heading (..., T); dt sample spacing.
      accel_window: S-G window for the lon/lat acceleration checks (v1.1: 41, v2: 8).
      jerk_window: S-G window of the jerk derivative (v1.1: 41, v2: 15). The acceleration
        fed to the jerk derivative is always smoothed with ``config.jerk_accel_window`` (8).
      magnitude: (..., T) acceleration magnitude for the jerk check (default hypot(ax, ay);
        NAVSIM v2 passes the unshifted rear-axle magnitude with centre-shifted ax, ay).
    Returns dict lon_accel, lat_accel, jerk (magnitude), lon_jerk, yaw_rate, yaw_accel.
    """
    t = ax.shape[-1]
    acc_m = savgol_matrix(t, accel_window, 2)
    pre_m = savgol_matrix(t, config.jerk_accel_window, 2)
    jerk_m = savgol_matrix(t, jerk_window, 2, 1, dt)
    yaw1 = savgol_matrix(t, config.yaw_window, 2, 1, dt)
    yaw2 = savgol_matrix(t, config.yaw_window, 3, 2, dt)
    mag = jnp.hypot(ax, ay) if magnitude is None else magnitude
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
    """Rear-axle body accelerations moved to the box centre, d = rear_axle_to_center ahead.

    ``config.hc_acceleration`` "shifted" (NAVSIM v2, nuPlan's ``get_acceleration_shifted``
    with displacement (d, 0)): (ax + d (w^2 + alpha), ay). "rigid_body": a + alpha x d +
    w x (w x d) = (ax - w^2 d, ay + alpha d).
    """
    d = config.ego_rear_axle_to_center
    if config.hc_acceleration == "shifted":
        return ax + d * (yaw_rate**2 + yaw_accel), ay
    return ax - yaw_rate**2 * d, ay + yaw_accel * d


def is_comfortable_v2(ax, ay, heading, yaw_rate, yaw_accel, config: PDMConfig) -> chex.Array:
    """NAVSIM v2 comfort (used by history comfort HC) over any length T: (...) float.

    Inputs (..., T) are rear-axle values; the acceleration checks see them at the box centre
    (:func:`center_accelerations`); with "shifted" the jerk magnitude stays the rear axle's
    (NAVSIM shifts only the x / y components it reads)."""
    cax, cay = center_accelerations(ax, ay, yaw_rate, yaw_accel, config)
    mag = jnp.hypot(ax, ay) if config.hc_acceleration == "shifted" else None
    sig = comfort_signals(cax, cay, heading, config.dt, config.accel_window_v2,
                          config.jerk_window_v2, config, magnitude=mag)
    return jnp.all(comfort_checks(sig, config), axis=-1).astype(jnp.float32)


EC_OVERLAP_STEPS = 5  # NAVSIM v2: frames 0.5 s apart, i.e. 5 steps of 0.1 s


def extended_comfort_features(ax, ay, heading, config: PDMConfig) -> dict:
    """NAVSIM v2's extended-comfort features of (..., T) rear-axle signals, each (..., T):
    acceleration magnitude (S-G window 8, poly 2), its jerk (S-G derivative window 15, poly
    2, of the magnitude smoothed with window 8), yaw rate (window 5, poly 2) and yaw
    acceleration (window 5, poly 2: NAVSIM passes no poly order 3 here)."""
    t = ax.shape[-1]
    dt = config.dt
    mag = jnp.hypot(ax, ay)
    smooth = _apply(savgol_matrix(t, config.jerk_accel_window, 2), mag)
    h = unwrap_angles(heading)
    return {"accel": smooth,
            "jerk": _apply(savgol_matrix(t, config.jerk_window_v2, 2, 1, dt), smooth),
            "yaw_rate": _apply(savgol_matrix(t, config.yaw_window, 2, 1, dt), h),
            "yaw_accel": _apply(savgol_matrix(t, config.yaw_window, 2, 2, dt), h)}


def two_frame_extended_comfort(current, previous, config: PDMConfig,
                               overlap_steps: int = EC_OVERLAP_STEPS) -> chex.Array:
    """NAVSIM v2's two-frame extended comfort EC, (...) float in {0, 1}.

    Args:
      current, previous: simulated trajectories (objects with (..., T) ``ax``, ``ay``,
        ``heading``, e.g. :class:`jax_drive.pdm.EgoTrajectory`) of this frame and of the
        frame ``overlap_steps`` steps (0.5 s) earlier, each in its own frame's time.
      overlap_steps: how many steps the previous frame started earlier.
    The overlap is this frame's first T - overlap_steps states against the previous frame's
    last T - overlap_steps; the features (:func:`extended_comfort_features`) are computed on
    those two cut sequences, and EC = 1 when the RMS of the differences of all four are
    within (ec_accel, ec_jerk, ec_yaw_rate, ec_yaw_accel) (<=).
    """
    k = overlap_steps
    feats = [extended_comfort_features(t.ax[..., sl], t.ay[..., sl], t.heading[..., sl], config)
             for t, sl in ((current, slice(None, -k)), (previous, slice(k, None)))]
    bounds = {"accel": config.ec_accel, "jerk": config.ec_jerk, "yaw_rate": config.ec_yaw_rate,
              "yaw_accel": config.ec_yaw_accel}
    ok = [jnp.sqrt(jnp.mean((feats[0][name] - feats[1][name]) ** 2, axis=-1)) <= bound
          for name, bound in bounds.items()]
    return jnp.all(jnp.stack(ok, -1), -1).astype(jnp.float32)
