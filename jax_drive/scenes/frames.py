"""Global <-> ego frame conversion of whole scenes, in float64 numpy on the host.

Real driving logs (NAVSIM / nuPlan) use UTM-sized coordinates (x ~ 5e5, y ~ 4.5e6 m):
float32 keeps only ~0.5 m there. So a scene is described in the global frame with float64
numpy leaves (same :class:`~jax_drive.types.Scene` layout; every position, heading and
velocity global) and converted with :func:`to_ego_frame` before any jitted float32 math.

Converted fields: agents x, y, heading, vx, vy; drivable and lane polygon vertices; lane
centrelines; route points; ego history poses; expert poses. Ego velocity / acceleration
(and the history's velocities / accelerations) are in body frames and stay unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.types import Scene


def _wrap(a: np.ndarray) -> np.ndarray:
    return (a + np.pi) % (2.0 * np.pi) - np.pi


def _check_pose(origin_pose, batch: tuple[int, ...]) -> np.ndarray:
    pose = np.asarray(origin_pose, np.float64)
    if pose.shape != batch + (3,):
        raise ValueError(f"origin_pose: expected shape {batch + (3,)}, got {pose.shape}")
    if not np.all(np.isfinite(pose)):
        raise ValueError("origin_pose: contains NaN or inf")
    return pose


def _xy_to_local(x, y, pose, extra_dims: int):
    """x, y: (..., *extra) float64; pose (..., 3). Returns local x, y."""
    p = pose.reshape(pose.shape[:-1] + (1,) * extra_dims + (3,))
    c, s = np.cos(p[..., 2]), np.sin(p[..., 2])
    dx, dy = x - p[..., 0], y - p[..., 1]
    return c * dx + s * dy, -s * dx + c * dy


def _xy_to_global(x, y, pose, extra_dims: int):
    p = pose.reshape(pose.shape[:-1] + (1,) * extra_dims + (3,))
    c, s = np.cos(p[..., 2]), np.sin(p[..., 2])
    return p[..., 0] + c * x - s * y, p[..., 1] + s * x + c * y


def _rot(vx, vy, angle, extra_dims: int):
    a = angle.reshape(angle.shape + (1,) * extra_dims)
    c, s = np.cos(a), np.sin(a)
    return c * vx - s * vy, s * vx + c * vy


def _transform(scene: Scene, pose: np.ndarray, to_local: bool) -> Scene:
    sc = jax.tree.map(lambda a: np.asarray(a, np.float64) if np.issubdtype(np.asarray(a).dtype, np.floating) else np.asarray(a), scene)
    xy = _xy_to_local if to_local else _xy_to_global
    sign = -1.0 if to_local else 1.0

    def points(arr: np.ndarray, extra: int) -> np.ndarray:  # (..., *extra, 2)
        x, y = xy(arr[..., 0], arr[..., 1], pose, extra)
        return np.stack([x, y], -1)

    def poses(arr: np.ndarray, extra: int) -> np.ndarray:  # (..., *extra, 3)
        x, y = xy(arr[..., 0], arr[..., 1], pose, extra)
        h = _wrap(arr[..., 2] + sign * pose[..., 2].reshape(pose.shape[:-1] + (1,) * extra))
        return np.stack([x, y, h], -1)

    ag = sc.agents
    ax, ay = xy(ag.x, ag.y, pose, 2)
    ah = _wrap(ag.heading + sign * pose[..., 2].reshape(pose.shape[:-1] + (1, 1)))
    avx, avy = _rot(ag.vx, ag.vy, sign * pose[..., 2], 2)
    agents = ag.replace(x=ax, y=ay, heading=ah, vx=avx, vy=avy)
    m = sc.map
    new_map = m.replace(
        drivable=m.drivable.replace(vertices=points(m.drivable.vertices, 2)),
        lanes=m.lanes.replace(vertices=points(m.lanes.vertices, 2)),
        lane_centerlines=points(m.lane_centerlines, 2),
    )
    return sc.replace(
        agents=agents,
        map=new_map,
        route=sc.route.replace(points=points(sc.route.points, 1)),
        ego=sc.ego.replace(history_poses=poses(sc.ego.history_poses, 1)),
        expert=poses(sc.expert, 1),
    )


def to_ego_frame(global_scene: Scene, origin_pose) -> Scene:
    """Converts a global-frame scene (float64 numpy leaves) into the ego frame.

    Args:
      global_scene: Scene with batch dims (...) whose positions / headings / agent
        velocities are global (e.g. UTM metres), ideally float64.
      origin_pose: (..., 3) float64 global pose [x, y, heading] of the ego rear axle at t0.
    Returns: Scene in the ego rear-axle frame with float32 jax arrays (ints / bools kept).
    Raises: ValueError on a wrongly shaped or non-finite origin pose.
    """
    batch = tuple(np.shape(global_scene.command))
    pose = _check_pose(origin_pose, batch)
    local = _transform(global_scene, pose, to_local=True)
    return jax.tree.map(
        lambda a: jnp.asarray(a, jnp.float32) if np.issubdtype(a.dtype, np.floating) else jnp.asarray(a), local
    )


def scene_to_global(scene: Scene, origin_pose) -> Scene:
    """Inverse of :func:`to_ego_frame`: an ego-frame scene -> global frame, float64 numpy leaves."""
    batch = tuple(np.shape(scene.command))
    pose = _check_pose(origin_pose, batch)
    return _transform(scene, pose, to_local=False)


def poses_to_global(poses, origin_pose) -> np.ndarray:
    """(..., K, 3) ego-frame poses -> global float64, origin_pose (..., 3)."""
    p = np.asarray(poses, np.float64)
    pose = np.asarray(origin_pose, np.float64)
    x, y = _xy_to_global(p[..., 0], p[..., 1], pose, 1)
    return np.stack([x, y, _wrap(p[..., 2] + pose[..., 2, None])], -1)


def poses_to_local(poses, origin_pose) -> np.ndarray:
    """(..., K, 3) global poses -> ego frame float64, origin_pose (..., 3)."""
    p = np.asarray(poses, np.float64)
    pose = np.asarray(origin_pose, np.float64)
    x, y = _xy_to_local(p[..., 0], p[..., 1], pose, 1)
    return np.stack([x, y, _wrap(p[..., 2] - pose[..., 2, None])], -1)
