"""NAVSIM's tracking simulation: batch LQR tracker driving a kinematic bicycle model.

Given 41 interpolated states (0 .. 4 s at 0.1 s), the tracker fits a velocity and a
curvature profile to the poses (regularised least squares, as NAVSIM / nuPlan do), then runs
40 steps of: LQR command (acceleration, steering rate) -> first-order actuator delays ->
Euler step of the rear-axle kinematic bicycle model. The simulation starts from the full
t0 ego state (velocity, acceleration, steering angle) of the scene.

Semantics kept from NAVSIM (see ``/work/shared/reference/navsim_pdm.md``):
  * lateral velocity and lateral acceleration are 0 for every simulated step; only the
    t0 state carries the logged values;
  * the reference speed is the fitted speed ``tracking_horizon`` steps ahead (clamped at
    the last profile index), the curvature window the next ``tracking_horizon`` fitted
    curvatures (padded with the last one);
  * the stopping P-controller replaces LQR when both the current and the reference speed
    are <= ``stopping_velocity``.
The velocity fit's jerk penalty uses NAVSIM's banded matrix by default
(``PDMConfig.jerk_matrix``, see :func:`jerk_difference_matrix`): NAVSIM's matrix is not the
difference matrix its name says, and matching it is what makes our simulated states agree
with NAVSIM's; nuPlan's true difference stays selectable.
Known difference: we run in float32 and solve the curvature least squares as a tridiagonal
system in the curvature values instead of a float64 pseudo-inverse over curvature rates
(same minimiser when the system is regular; see :func:`fit_profiles`).
The t0 steering rate is taken as 0; the t0 yaw rate and yaw acceleration are the scene's
logged ones (the last entries of ``history_yaw_rate`` / ``history_yaw_accel``), as NAVSIM's
ego state carries them: they enter the step-0 outputs and the step-1 ``yaw_accel``, which
only NAVSIM v2's history comfort reads.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.configs import one_of
from jax_drive.geometry import wrap_angle
from jax_drive.pdm.config import PDMConfig


@chex.dataclass(frozen=True)
class EgoTrajectory:
    """Simulated ego states over the scoring grid; every field (..., 41).

    Fields: x, y, heading (rear axle, t0 frame), vx, vy (rear-axle velocity in the body
    frame, m/s), ax, ay (body-frame acceleration, m/s^2), steering (tyre angle, rad),
    steering_rate (rad/s), yaw_rate (rad/s), yaw_accel (rad/s^2).
    """

    x: chex.Array
    y: chex.Array
    heading: chex.Array
    vx: chex.Array
    vy: chex.Array
    ax: chex.Array
    ay: chex.Array
    steering: chex.Array
    steering_rate: chex.Array
    yaw_rate: chex.Array
    yaw_accel: chex.Array

    @property
    def poses(self) -> chex.Array:
        """(..., 41, 3) [x, y, heading]."""
        return jnp.stack([self.x, self.y, self.heading], -1)

    @property
    def speed(self) -> chex.Array:
        """(..., 41) hypot(vx, vy)."""
        return jnp.hypot(self.vx, self.vy)


JERK_MATRICES = ("navsim", "nuplan")


def jerk_difference_matrix(num_rows: int, kind: str = "navsim") -> np.ndarray:
    """(num_rows, num_rows + 1) float64 "banded difference" matrix of the velocity fit.

    kind "nuplan": the true first difference, row i = e_{i+1} - e_i (nuPlan's tracker,
      ``nuplan/planning/simulation/controller/tracker/tracker_utils.py``).
    kind "navsim": the matrix NAVSIM actually builds (``_make_banded_difference_matrix`` in
      ``navsim/planning/simulation/planner/pdm_planner/simulation/batch_lqr_utils.py``,
      identical at tags v1.0, v1.1, v2.0 .. v2.2): it sets +I on the band above the
      diagonal and then -I on the main band by assignment, and the second assignment
      overwrites the first, so every row but the last is -e_i and only the last row is a
      difference, e_n - e_{n-1}.
    """
    one_of("jerk matrix", kind, JERK_MATRICES)
    out = np.zeros((num_rows, num_rows + 1), np.float64)
    rows = np.arange(num_rows)
    out[rows, rows] = -1.0
    if kind == "nuplan":
        out[rows, rows + 1] = 1.0
    elif num_rows:
        out[-1, -1] = 1.0
    return out


@functools.lru_cache(maxsize=8)
def velocity_fit_matrix(num_disp: int, dt: float, jerk_penalty: float, jerk_matrix: str = "navsim") -> np.ndarray:
    """(M, M) float64 map from projected displacements to [v0, a_1 .. a_{M-1}].

    NAVSIM fits x = [v0, a...] to the pose displacements d_i by least squares with a
    "jerk" penalty lambda ||R x||^2, R = [0 | :func:`jerk_difference_matrix`] ((M-2, M)).
    The rows of the design matrix for displacement i are (cos h_i, sin h_i) times u_i,
    with u_i = [dt, dt^2 (j = 1..i), 0 ...]; since cos^2 + sin^2 = 1 the normal matrix
    does not depend on the headings and the solution is
    x = pinv(U^T U + lambda R^T R) U^T p, p_i = cos h_i dx_i + sin h_i dy_i.
    """
    m = num_disp
    u = np.zeros((m, m), np.float64)
    u[:, 0] = dt
    for i in range(m):
        u[i, 1 : i + 1] = dt * dt
    r = np.concatenate([np.zeros((m - 2, 1)), jerk_difference_matrix(m - 2, jerk_matrix)], axis=1)
    return np.linalg.pinv(u.T @ u + jerk_penalty * r.T @ r) @ u.T


def _profile(initial: chex.Array, derivatives: chex.Array, dt: float) -> chex.Array:
    """[x0, x0 + d0 dt, ...]: (...,) and (..., n) -> (..., n + 1)."""
    cum = jnp.cumsum(derivatives * dt, axis=-1)
    return initial[..., None] + jnp.concatenate([jnp.zeros_like(cum[..., :1]), cum], -1)


def solve_path_laplacian_system(diag: chex.Array, rhs: chex.Array, coupling: float,
                                 pivot_floor: float = 1e-5) -> chex.Array:
    """Solves the symmetric tridiagonal system with ``diag`` and constant off-diagonal
    ``-coupling`` (Thomas algorithm, one forward and one backward sweep along the last axis).

    Args: diag, rhs (..., M). Returns x (..., M).
    With a standing ego (w = 0) the curvature system is the path Laplacian plus the tiny
    initial-curvature penalty: singular in float32, where the last pivot cancels to ~0.
    Pivots are floored at ``pivot_floor * coupling`` (far above the float32 noise of the
    sweep, far below any pivot of a moving ego), so such a system gives x = 0 for rhs = 0
    instead of NaN, where NAVSIM's float64 solve also gives 0.
    """
    floor = pivot_floor * coupling
    diag_t, rhs_t = jnp.moveaxis(diag, -1, 0), jnp.moveaxis(rhs, -1, 0)

    def forward(carry, xs):
        d_prev, b_prev = carry
        d, b = xs
        factor = coupling / d_prev
        d_new = jnp.maximum(d - coupling * factor, floor)
        b_new = b + factor * b_prev
        return (d_new, b_new), (d_new, b_new)

    d0 = jnp.maximum(diag_t[0], floor)
    _, (d_rest, b_rest) = jax.lax.scan(forward, (d0, rhs_t[0]), (diag_t[1:], rhs_t[1:]))
    piv = jnp.concatenate([d0[None], d_rest], 0)
    red = jnp.concatenate([rhs_t[:1], b_rest], 0)

    def backward(x_next, xs):
        d, b = xs
        x = (b + coupling * x_next) / d
        return x, x

    x_last = red[-1] / piv[-1]
    _, x_rest = jax.lax.scan(backward, x_last, (piv[:-1], red[:-1]), reverse=True)
    return jnp.moveaxis(jnp.concatenate([x_rest, x_last[None]], 0), 0, -1)


def fit_profiles(poses: chex.Array, config: PDMConfig) -> tuple[chex.Array, chex.Array]:
    """Velocity and curvature profiles fitted to the reference poses.

    Args: poses (..., N, 3) reference states at ``config.dt``.
    Returns: velocity (..., N-1) m/s, curvature (..., N-1) 1/m.
    """
    dt = config.dt
    disp = jnp.diff(poses, axis=-2)  # (..., M, 3)
    m = disp.shape[-2]
    heading = poses[..., :-1, 2]
    proj = jnp.cos(heading) * disp[..., 0] + jnp.sin(heading) * disp[..., 1]
    k_v = jnp.asarray(velocity_fit_matrix(m, dt, config.jerk_penalty, config.jerk_matrix), jnp.float32)
    # k_v @ proj accumulated column by column in a fixed order, not a dot or a sum: XLA:CPU
    # vectorises those reductions differently for different batch sizes (1-ulp changes
    # between scoring 16 scenes at once or 8 at a time, hence between 1 and 8 devices); the
    # elementwise accumulation gives each row the same bits at any batch size.
    sol, _ = jax.lax.scan(lambda acc, col: (acc + col[0] * col[1][..., None], None),
                          jnp.zeros_like(proj), (k_v.T, jnp.moveaxis(proj, -1, 0)))  # k_v is (M, M)
    velocity = _profile(sol[..., 0], sol[..., 1:], dt)  # (..., M)

    # Curvature. NAVSIM solves for x = [k0, kr_1 .. kr_{M-1}] with
    #   heading_disp_i ~ v_i dt c_i,   c_i = k0 + dt * sum_{1<=j<=i} kr_j,
    # penalising p0 k0^2 + pr sum kr_j^2. In the curvatures c themselves (k0 = c_0,
    # kr_j = (c_j - c_{j-1}) / dt) the same objective is
    #   sum_i (w_i c_i - dh_i)^2 + p0 c_0^2 + (pr / dt^2) sum_j (c_j - c_{j-1})^2,  w = v dt,
    # whose normal equations are tridiagonal: same minimiser, O(M) instead of a Cholesky.
    dh = wrap_angle(disp[..., 2])
    w = velocity * dt
    lam = config.curvature_rate_penalty / dt**2
    neighbours = np.full((m,), 2.0)
    neighbours[0] = neighbours[-1] = 1.0
    extra = np.zeros((m,))
    extra[0] = config.initial_curvature_penalty
    diag = w * w + jnp.asarray(lam * neighbours + extra, jnp.float32)
    curvature = solve_path_laplacian_system(diag, w * dh, lam)
    return velocity, curvature


def _lqr_command(state: dict, ref_pose: chex.Array, v_ref: chex.Array, curv: chex.Array,
                 config: PDMConfig) -> tuple[chex.Array, chex.Array]:
    """One tracker call: (acceleration, steering-rate) commands, each (...)."""
    dt, n = config.dt, config.tracking_horizon
    v0 = state["vx"]
    # Longitudinal one-step LQR with B = n dt (acceleration held over the horizon).
    b = n * dt
    q_lon, r_lon = config.q_longitudinal, config.r_longitudinal
    accel_lqr = -(b * q_lon / (b * q_lon * b + r_lon)) * (v0 - v_ref)
    stop = (v_ref <= config.stopping_velocity) & (v0 <= config.stopping_velocity)
    accel = jnp.where(stop, -config.stopping_gain * (v0 - v_ref), accel_lqr)

    # Lateral error state in the reference pose frame.
    dx, dy = state["x"] - ref_pose[..., 0], state["y"] - ref_pose[..., 1]
    href = ref_pose[..., 2]
    z = [
        -dx * jnp.sin(href) + dy * jnp.cos(href),
        wrap_angle(state["heading"] - href),
        state["steering"],
    ]
    bvec = [jnp.zeros_like(v0), jnp.zeros_like(v0), jnp.zeros_like(v0)]
    wb = config.ego_wheel_base
    # Propagate the affine LTV lateral dynamics over the horizon (fixed 10-step unroll of
    # the controller horizon, not of simulation time).
    for k in range(n):
        vk = v0 + accel * dt * k
        ck = curv[..., k]
        z = [
            z[0] + vk * dt * z[1],
            z[1] + vk * dt / wb * z[2] - vk * ck * dt,
            z[2],
        ]
        bvec = [
            bvec[0] + vk * dt * bvec[1],
            bvec[1] + vk * dt / wb * bvec[2],
            bvec[2] + dt,
        ]
    z[1] = jnp.arctan2(jnp.sin(z[1]), jnp.cos(z[1]))
    z[2] = jnp.arctan2(jnp.sin(z[2]), jnp.cos(z[2]))
    q = config.q_lateral
    btqb = q[0] * bvec[0] ** 2 + q[1] * bvec[1] ** 2 + q[2] * bvec[2] ** 2
    btqz = q[0] * bvec[0] * z[0] + q[1] * bvec[1] * z[1] + q[2] * bvec[2] * z[2]
    steer_rate = -btqz / (btqb + config.r_lateral)
    steer_rate = jnp.where(stop, 0.0, steer_rate)
    return accel, steer_rate


def _bicycle_step(state: dict, accel_cmd: chex.Array, steer_rate_cmd: chex.Array,
                  config: PDMConfig) -> dict:
    """Actuator delays + one Euler step of the rear-axle kinematic bicycle model."""
    dt = config.dt
    wb = config.ego_wheel_base
    ideal_steer = dt * steer_rate_cmd + state["steering"]
    ax = dt / (dt + config.accel_time_constant) * (accel_cmd - state["ax"]) + state["ax"]
    steer_f = (dt / (dt + config.steering_time_constant) * (ideal_steer - state["steering"])
               + state["steering"])
    steer_rate = (steer_f - state["steering"]) / dt
    v, h = state["vx"], state["heading"]
    new_v = v + ax * dt
    new_steer = jnp.clip(state["steering"] + steer_rate * dt, -config.max_steering_angle,
                         config.max_steering_angle)
    yaw_rate = new_v * jnp.tan(new_steer) / wb
    return {
        "x": state["x"] + v * jnp.cos(h) * dt,
        "y": state["y"] + v * jnp.sin(h) * dt,
        "heading": wrap_angle(h + v * jnp.tan(state["steering"]) / wb * dt),
        "vx": new_v,
        "vy": jnp.zeros_like(new_v),
        "ax": ax,
        "ay": jnp.zeros_like(ax),
        "steering": new_steer,
        "steering_rate": steer_rate,
        "yaw_rate": yaw_rate,
        "yaw_accel": (yaw_rate - state["yaw_rate"]) / dt,
    }


_FIELDS = ("x", "y", "heading", "vx", "vy", "ax", "ay", "steering", "steering_rate",
           "yaw_rate", "yaw_accel")


def initial_state(scene, batch_shape: tuple[int, ...]) -> dict:
    """t0 ego state of ``scene`` broadcast to ``batch_shape`` (scene dims first)."""
    ego = scene.ego
    scene_ndim = ego.steering_angle.ndim
    extra = len(batch_shape) - scene_ndim

    def bc(v):
        v = jnp.asarray(v, jnp.float32)
        return jnp.broadcast_to(v.reshape(v.shape + (1,) * extra), batch_shape)

    zeros = jnp.zeros(batch_shape, jnp.float32)
    return {
        "x": zeros, "y": zeros, "heading": zeros,
        "vx": bc(ego.velocity[..., 0]), "vy": bc(ego.velocity[..., 1]),
        "ax": bc(ego.acceleration[..., 0]), "ay": bc(ego.acceleration[..., 1]),
        "steering": bc(ego.steering_angle), "steering_rate": zeros,
        "yaw_rate": bc(ego.history_yaw_rate[..., -1]), "yaw_accel": bc(ego.history_yaw_accel[..., -1]),
    }


def _finite_difference_states(scene, states: chex.Array, config: PDMConfig) -> EgoTrajectory:
    """simulate=False: raw states; body-frame speeds and accelerations by differences.

    Step 0 carries the scene's t0 velocity/acceleration; step i >= 1 uses the backward
    difference of positions projected on the heading (lateral components 0, as NAVSIM's
    simulated states).
    """
    dt = config.dt
    init = initial_state(scene, states.shape[:-2])
    d = jnp.diff(states[..., :2], axis=-2)
    h = states[..., 1:, 2]
    v = (jnp.cos(h) * d[..., 0] + jnp.sin(h) * d[..., 1]) / dt
    vx = jnp.concatenate([init["vx"][..., None], v], -1)
    ax = jnp.concatenate([init["ax"][..., None], jnp.diff(vx, axis=-1) / dt], -1)
    zeros = jnp.zeros_like(vx)
    vy = zeros.at[..., 0].set(init["vy"])
    ay = zeros.at[..., 0].set(init["ay"])
    yaw_rate = jnp.concatenate([init["yaw_rate"][..., None], wrap_angle(jnp.diff(states[..., 2], axis=-1)) / dt], -1)
    yaw_accel = jnp.concatenate([init["yaw_accel"][..., None], jnp.diff(yaw_rate, axis=-1) / dt], -1)
    steering = jnp.arctan(yaw_rate * config.ego_wheel_base / jnp.maximum(jnp.abs(vx), 1e-3))
    return EgoTrajectory(x=states[..., 0], y=states[..., 1], heading=states[..., 2], vx=vx, vy=vy,
                         ax=ax, ay=ay, steering=steering, steering_rate=zeros,
                         yaw_rate=yaw_rate, yaw_accel=yaw_accel)


def simulate_states(scene, states: chex.Array, config: PDMConfig = PDMConfig()) -> EgoTrajectory:
    """Tracks interpolated states with NAVSIM's LQR + kinematic bicycle model.

    Args:
      scene: Scene with batch dims (...); only its t0 ego state is read.
      states: (..., [extra dims], 41, 3) interpolated reference states (index 0 = t0 ego).
      config: PDMConfig (``simulate=False`` returns the raw states with finite differences).
    Returns:
      EgoTrajectory with fields (..., [extra dims], 41); index 0 is the t0 ego state.
    """
    states = jnp.asarray(states, jnp.float32)
    if not config.simulate:
        return _finite_difference_states(scene, states, config)
    n_steps = states.shape[-2] - 1
    batch = states.shape[:-2]
    velocity, curvature = fit_profiles(states, config)  # (..., M)
    m = velocity.shape[-1]
    h = config.tracking_horizon
    # Reference speed at index min(t + h, M - 1); curvature window min(t + k, M - 1).
    idx_v = np.minimum(np.arange(n_steps) + h, m - 1)
    idx_c = np.minimum(np.arange(n_steps)[:, None] + np.arange(h)[None, :], m - 1)
    v_ref = jnp.moveaxis(velocity[..., idx_v], -1, 0)  # (T, ...)
    curv = jnp.moveaxis(curvature[..., idx_c], -2, 0)  # (T, ..., h)
    ref_pose = jnp.moveaxis(states[..., :n_steps, :], -2, 0)  # (T, ..., 3)

    def step(state, xs):
        pose_t, v_ref_t, curv_t = xs
        accel, steer_rate = _lqr_command(state, pose_t, v_ref_t, curv_t, config)
        new = _bicycle_step(state, accel, steer_rate, config)
        return new, new

    init = initial_state(scene, batch)
    _, traj = jax.lax.scan(step, init, (ref_pose, v_ref, curv))
    out = {k: jnp.concatenate([init[k][None], traj[k]], axis=0) for k in _FIELDS}
    return EgoTrajectory(**{k: jnp.moveaxis(v, 0, -1) for k, v in out.items()})
