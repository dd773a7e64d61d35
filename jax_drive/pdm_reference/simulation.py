"""Reference (numpy, float64) trajectory interpolation, LQR tracker and kinematic bicycle
model, following NAVSIM v1.1's ``PDMSimulator`` semantics one trajectory at a time.

State arrays have 11 columns (same order as NAVSIM's state arrays):
  x, y, heading, vx, vy, ax, ay, steering_angle, steering_rate, yaw_rate, yaw_acceleration.
"""

from __future__ import annotations

import math

import numpy as np

from jax_drive.pdm_reference.config import ReferenceConfig

X, Y, HEADING, VX, VY, AX, AY, STEER, STEER_RATE, YAW_RATE, YAW_ACC = range(11)
NUM_STATE = 11


def principal_angle(angle):
    """Wraps angles to [-pi, pi) (nuPlan's principal value). Any shape."""
    return (np.asarray(angle, dtype=np.float64) + np.pi) % (2.0 * np.pi) - np.pi


def normalize_angle(angle):
    """Maps angles to [-pi, pi] through atan2 (NAVSIM's normalize_angle). Any shape."""
    angle = np.asarray(angle, dtype=np.float64)
    return np.arctan2(np.sin(angle), np.cos(angle))


def relative_to_absolute(origin: np.ndarray, poses: np.ndarray) -> np.ndarray:
    """Poses (K, 3) given in the frame of ``origin`` (3,) -> poses in origin's parent frame."""
    poses = np.asarray(poses, dtype=np.float64)
    c, s = np.cos(origin[2]), np.sin(origin[2])
    out = np.empty_like(poses)
    out[:, 0] = origin[0] + c * poses[:, 0] - s * poses[:, 1]
    out[:, 1] = origin[1] + s * poses[:, 0] + c * poses[:, 1]
    out[:, 2] = origin[2] + poses[:, 2]
    return out


def interpolate_poses(
    origin: np.ndarray, poses: np.ndarray, pose_dt: float, dt: float = 0.1, num_steps: int = 41
) -> np.ndarray:
    """[t0 ego pose] + poses resampled every ``dt`` over 0 .. (num_steps-1)*dt.

    Args:
      origin: (3,) ego rear-axle pose at t0 in the scoring frame.
      poses: (K, 3) poses at pose_dt, 2*pose_dt, ... in the ego frame at t0.
    Returns: (num_steps, 3) poses in the scoring frame; x, y linear in time, heading linear on
      the unwrapped sequence then wrapped to [-pi, pi); times past the last pose are clipped.
    """
    absolute = relative_to_absolute(origin, poses)
    knots = np.concatenate([np.asarray(origin, np.float64)[None], absolute], axis=0)
    knot_t = np.arange(knots.shape[0], dtype=np.float64) * pose_dt
    query_t = np.clip(np.arange(num_steps, dtype=np.float64) * dt, 0.0, knot_t[-1])
    out = np.empty((num_steps, 3), dtype=np.float64)
    out[:, 0] = np.interp(query_t, knot_t, knots[:, 0])
    out[:, 1] = np.interp(query_t, knot_t, knots[:, 1])
    out[:, 2] = principal_angle(np.interp(query_t, knot_t, np.unwrap(knots[:, 2])))
    return out


# --------------------------------------------------------------------------------------
# Profile fitting (least squares with jerk / curvature-rate regularisation)
# --------------------------------------------------------------------------------------


def jerk_regularizer(num_disp: int, kind: str) -> np.ndarray:
    """(num_disp - 2, num_disp) regulariser on the unknowns [v0, a_0 .. a_{num_disp-2}].

    "nuplan": row r is a_{r+1} - a_r (consecutive accelerations, nuPlan's tracker).
    "navsim": what NAVSIM's banded matrix amounts to after its overwritten assignment
    (navsim batch_lqr_utils.py, v1.0 .. v2.2): row r is -a_r, except the last row, which
    stays the difference a_{last} - a_{last-1}.
    """
    rows = num_disp - 2
    out = np.zeros((rows, num_disp))
    for r in range(rows):
        out[r, 1 + r] = -1.0
        if kind == "nuplan" or r == rows - 1:
            out[r, 2 + r] = 1.0
        elif kind != "navsim":
            raise ValueError(f"unknown jerk matrix {kind!r}")
    return out


def fit_velocity_curvature_profiles(poses: np.ndarray, cfg: ReferenceConfig):
    """Velocity and curvature profiles of a pose sequence.

    Args: poses (N, 3) sampled every cfg.dt.
    Returns: velocity (N-1,), curvature (N-1,) profiles (m/s, 1/m).
    """
    dt = cfg.dt
    disp = np.diff(poses, axis=0)
    xy = disp[:, :2]
    dheading = normalize_angle(disp[:, 2])
    m = xy.shape[0]
    headings = poses[:-1, 2]

    # Unknowns: v0, a_0 .. a_{m-2}; displacement i = dt * (v0 + dt * sum_{j<i} a_j) * dir_i.
    design = np.zeros((2 * m, m))
    lower = np.tril(np.ones((m, m)), k=0)
    lower[:, 0] = 0.0  # the v0 column is filled separately
    for comp, fn in ((0, np.cos), (1, np.sin)):
        direction = fn(headings)
        block = lower * (dt * dt) * direction[:, None]
        block[:, 0] = direction * dt
        design[comp::2] = block
    target = xy.reshape(-1)
    diff = jerk_regularizer(m, cfg.jerk_matrix)
    normal = design.T @ design + cfg.jerk_penalty * diff.T @ diff
    sol = np.linalg.pinv(normal) @ design.T @ target
    velocity = sol[0] + np.concatenate([[0.0], np.cumsum(sol[1:] * dt)])

    # Unknowns: k0, kr_0 .. kr_{m-2}; heading change i = v_i*dt*(k0 + dt*sum_{j<i} kr_j).
    design_k = np.tril(np.ones((m, m)))
    design_k[:, 0] = velocity * dt
    design_k[1:, 1:] *= (velocity[1:] * dt * dt)[:, None]
    reg = cfg.curvature_rate_penalty * np.eye(m)
    reg[0, 0] = cfg.initial_curvature_penalty
    sol_k = np.linalg.pinv(design_k.T @ design_k + reg) @ design_k.T @ dheading
    curvature = sol_k[0] + np.concatenate([[0.0], np.cumsum(sol_k[1:] * dt)])
    return velocity, curvature


# --------------------------------------------------------------------------------------
# Tracker (one step) and bicycle model (one step)
# --------------------------------------------------------------------------------------


def lqr_command(
    state: np.ndarray,
    index: int,
    target: np.ndarray,
    velocity_profile: np.ndarray,
    curvature_profile: np.ndarray,
    cfg: ReferenceConfig,
) -> tuple[float, float]:
    """Acceleration and steering-rate commands at simulation step ``index``.

    Args:
      state: (11,) current simulated state.
      target: (N, 3) poses being tracked.
      velocity_profile, curvature_profile: (N-1,) fitted profiles of ``target``.
    """
    dt, horizon = cfg.dt, cfg.tracking_horizon
    ref = target[index]
    dx, dy = state[X] - ref[0], state[Y] - ref[1]
    lateral_error = -dx * np.sin(ref[2]) + dy * np.cos(ref[2])
    dh = state[HEADING] - ref[2]
    heading_error = math.atan2(math.sin(dh), math.cos(dh))
    v0 = state[VX]

    n = velocity_profile.shape[0]
    ref_idx = min(index + horizon, n - 1)
    v_ref = velocity_profile[ref_idx]
    curv = np.empty(horizon)
    length = ref_idx - index
    curv[:length] = curvature_profile[index:ref_idx]
    curv[length:] = curvature_profile[ref_idx]

    if v_ref <= cfg.stopping_velocity and v0 <= cfg.stopping_velocity:
        return -cfg.stopping_proportional_gain * (v0 - v_ref), 0.0

    # Longitudinal: v_N = v0 + (N dt) a, one-step LQR towards v_ref.
    b_lon = horizon * dt
    accel = -(b_lon * cfg.q_longitudinal * (v0 - v_ref)) / (
        b_lon * cfg.q_longitudinal * b_lon + cfg.r_longitudinal
    )

    # Lateral: roll the linear time-varying error dynamics over the horizon,
    # e_{k+1} = S_k e_k + b u + g_k with S_k = [[1, v_k dt, 0], [0, 1, v_k dt / L], [0, 0, 1]],
    # b = [0, 0, dt], g_k = [0, -v_k kappa_k dt, 0]; accumulate e_N = A e_0 + B u + g.
    # A is unit upper triangular: keep its three free entries a01, a02, a12.
    a01 = a02 = a12 = 0.0
    b0 = b1 = b2 = 0.0
    g0 = g1 = 0.0
    wheel_base = cfg.wheel_base
    for k in range(horizon):
        vk = v0 + accel * dt * k
        s01, s12 = vk * dt, vk * dt / wheel_base
        a01, a02, a12 = a01 + s01, a02 + s01 * a12, a12 + s12
        b0, b1, b2 = b0 + s01 * b1, b1 + s12 * b2, b2 + dt
        g0, g1 = g0 + s01 * g1, g1 - vk * curv[k] * dt
    x0, x1, x2 = lateral_error, heading_error, float(state[STEER])
    e0 = x0 + a01 * x1 + a02 * x2 + g0
    e1 = x1 + a12 * x2 + g1
    e2 = x2
    e1 = math.atan2(math.sin(e1), math.cos(e1))
    e2 = math.atan2(math.sin(e2), math.cos(e2))
    q0, q1, q2 = cfg.q_lateral
    num = b0 * q0 * e0 + b1 * q1 * e1 + b2 * q2 * e2
    den = b0 * q0 * b0 + b1 * q1 * b1 + b2 * q2 * b2 + cfg.r_lateral
    steering_rate = -num / den
    return float(accel), float(steering_rate)


def bicycle_step(state: np.ndarray, accel_cmd: float, steer_rate_cmd: float, cfg: ReferenceConfig):
    """One Euler step of the kinematic bicycle model with first-order actuator lags.

    Args: state (11,), commands (scalars). Returns the next (11,) state.
    """
    dt = cfg.dt
    accel = state[AX]
    steer = state[STEER]
    ideal_steer = dt * steer_rate_cmd + steer
    new_accel = dt / (dt + cfg.accel_time_constant) * (accel_cmd - accel) + accel
    lagged_steer = dt / (dt + cfg.steering_angle_time_constant) * (ideal_steer - steer) + steer
    steer_rate = (lagged_steer - steer) / dt

    v = state[VX]
    out = state.copy()
    out[X] = state[X] + v * np.cos(state[HEADING]) * dt
    out[Y] = state[Y] + v * np.sin(state[HEADING]) * dt
    out[HEADING] = principal_angle(state[HEADING] + v * np.tan(steer) / cfg.wheel_base * dt)
    out[VX] = v + new_accel * dt
    out[VY] = 0.0
    out[STEER] = np.clip(steer + steer_rate * dt, -cfg.max_steering_angle, cfg.max_steering_angle)
    out[YAW_RATE] = out[VX] * np.tan(out[STEER]) / cfg.wheel_base
    out[AX] = new_accel
    out[AY] = 0.0
    out[YAW_ACC] = (out[YAW_RATE] - state[YAW_RATE]) / dt
    out[STEER_RATE] = steer_rate
    return out


def simulate(target: np.ndarray, initial_state: np.ndarray, cfg: ReferenceConfig) -> np.ndarray:
    """Tracks ``target`` (N, 3) from ``initial_state`` (11,) for N-1 steps -> (N, 11) states."""
    velocity, curvature = fit_velocity_curvature_profiles(target, cfg)
    n = target.shape[0]
    states = np.zeros((n, NUM_STATE))
    states[0] = initial_state
    for i in range(1, n):
        accel, steer_rate = lqr_command(states[i - 1], i - 1, target, velocity, curvature, cfg)
        states[i] = bicycle_step(states[i - 1], accel, steer_rate, cfg)
    return states


def unsimulated_states(target: np.ndarray, initial_state: np.ndarray) -> np.ndarray:
    """The interpolated poses as states (``simulate=False``): t0 keeps the real ego state, later
    states carry only the pose (NAVSIM's interpolated trajectory has zero velocities there)."""
    states = np.zeros((target.shape[0], NUM_STATE))
    states[:, :3] = target
    states[0] = initial_state
    return states
