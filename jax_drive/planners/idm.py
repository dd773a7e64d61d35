"""IDM along the route centreline (the longitudinal core of PDM-Closed), pure and batched.

Route geometry: the scene's route polyline with arc lengths; poses at arc s and lateral
offset d are interpolated along it (vertex headings = mean of the adjacent segments'
directions, so headings vary continuously).

Leading object: the nearest object (any class) whose box, at the current observation step,
overlaps the ego's path corridor (ego half-width + the object's lateral half-extent +
``corridor_margin`` around the path at the candidate's lateral offset) and whose centre is
ahead of the ego's rear axle; red-light lane connectors on the route act as stopped
obstacles at their entry. The IDM:

    a = a_max * (1 - (v / v0)^4 - (s* / gap)^2),  s* = s0 + v T + v (v - v_lead) / (2 sqrt(a_max b))

with s0 = min_gap, T = headway, a_max = accel, b = decel, integrated at 0.1 s for 40 steps.
"""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp

from jax_drive.geometry import polyline_arc_lengths, project_on_polyline, wrap_angle
from jax_drive.types import NUM_OUTPUT_POSES, OBS_DT, Scene, VehicleParameters, batch_shape


@dataclasses.dataclass(frozen=True)
class IDMConfig:
    """IDM settings (PDM-Closed's defaults).

    Attributes:
      min_gap: s0, metres (1.0). headway: T, s (1.5). accel: a_max, m/s^2 (1.5).
      decel: b, m/s^2 (3.0). exponent: delta (4).
      fallback_speed: target speed when the scene has no valid speed limit, m/s (15).
      max_decel: hard braking limit of the rollout, m/s^2 (8.0).
      corridor_margin: extra lateral margin of the path corridor, metres (0.3).
      lateral_time: seconds to blend from the route centre to a lateral offset (2.0).
      num_steps: rollout steps at 0.1 s (40).
    """

    min_gap: float = 1.0
    headway: float = 1.5
    accel: float = 1.5
    decel: float = 3.0
    exponent: float = 4.0
    fallback_speed: float = 15.0
    max_decel: float = 8.0
    corridor_margin: float = 0.3
    lateral_time: float = 2.0
    num_steps: int = 40


_EGO = VehicleParameters()


def route_pose(points: chex.Array, valid: chex.Array, s: chex.Array, offset: chex.Array = 0.0) -> chex.Array:
    """Poses along a route polyline.

    Args:
      points: (R, 2) polyline (valid prefix), valid: (R,).
      s: (K,) arc lengths (clamped to the valid length; beyond it extrapolates straight).
      offset: (K,) or scalar lateral offsets (+ = left), metres.
    Returns: (K, 3) [x, y, heading].
    """
    cum = polyline_arc_lengths(points, valid)  # (R,)
    n_valid = jnp.maximum(jnp.sum(valid), 2)
    total = cum[n_valid - 1]
    seg = points[1:] - points[:-1]
    seg_h = jnp.arctan2(seg[:, 1], seg[:, 0])
    seg_ok = valid[1:] & valid[:-1] & (jnp.linalg.norm(seg, axis=-1) > 1e-6)
    # forward-fill headings of degenerate / padded segments
    idx = jnp.arange(seg_h.shape[0])
    last_ok = jax.lax.cummax(jnp.where(seg_ok, idx, 0), axis=0)
    seg_h = seg_h[last_ok]
    dh = wrap_angle(seg_h[1:] - seg_h[:-1])
    vert_h = jnp.concatenate([seg_h[:1], seg_h[:-1] + 0.5 * dh, seg_h[-1:]])  # (R,)
    vert_h = jnp.concatenate([vert_h[:1], vert_h[0] + jnp.cumsum(wrap_angle(jnp.diff(vert_h)))])
    s_c = jnp.clip(s, 0.0, total)
    i = jnp.clip(jnp.searchsorted(cum, s_c, side="right") - 1, 0, n_valid - 2)
    seg_len = jnp.maximum(cum[i + 1] - cum[i], 1e-6)
    f = jnp.clip((s_c - cum[i]) / seg_len, 0.0, 1.0)
    xy = points[i] + f[:, None] * (points[i + 1] - points[i])
    h = vert_h[i] + f * (vert_h[i + 1] - vert_h[i])
    # straight extrapolation before the start / after the end
    extra = s - s_c
    h_end = jnp.where(s < 0.0, vert_h[0], vert_h[n_valid - 1])
    xy = xy + extra[:, None] * jnp.stack([jnp.cos(h_end), jnp.sin(h_end)], -1)
    h = jnp.where(extra != 0.0, h_end, h)
    offset = jnp.broadcast_to(jnp.asarray(offset, jnp.float32), s.shape)
    xy = xy + offset[:, None] * jnp.stack([-jnp.sin(h), jnp.cos(h)], -1)
    return jnp.concatenate([xy, wrap_angle(h)[:, None]], -1)


def target_speed(scene_speed_limit: chex.Array, config: IDMConfig) -> chex.Array:
    """Speed limit (...) with the fallback for invalid (<= 0 or non-finite) limits."""
    ok = jnp.isfinite(scene_speed_limit) & (scene_speed_limit > 0.0)
    return jnp.where(ok, scene_speed_limit, config.fallback_speed)


def _obstacles_single(scene: Scene):
    """Projections of every object and red connector on the route (one scene).

    Returns dict: arc, lat (N, T) route arc / signed lateral offset of object centres;
    half_lat, half_lon (N, T) box half-extents across / along the route; v_along (N, T);
    valid (N, T); red_arc (L,), red (L, T) for red-light connectors on the route.
    """
    pts, valid = scene.route.points, scene.route.valid
    ag = scene.agents
    n, t = ag.x.shape
    q = jnp.stack([ag.x, ag.y], -1).reshape(-1, 2)
    arc, dist = project_on_polyline(q, pts, valid)
    arc = arc.reshape(n, t)
    pose = route_pose(pts, valid, arc.reshape(-1)).reshape(n, t, 3)
    rel = jnp.stack([ag.x, ag.y], -1) - pose[..., :2]
    lat = -jnp.sin(pose[..., 2]) * rel[..., 0] + jnp.cos(pose[..., 2]) * rel[..., 1]
    dh = ag.heading - pose[..., 2]
    length, width = ag.length[:, None], ag.width[:, None]
    half_lat = jnp.abs(length / 2 * jnp.sin(dh)) + jnp.abs(width / 2 * jnp.cos(dh))
    half_lon = jnp.abs(length / 2 * jnp.cos(dh)) + jnp.abs(width / 2 * jnp.sin(dh))
    v_along = ag.vx * jnp.cos(pose[..., 2]) + ag.vy * jnp.sin(pose[..., 2])
    del dist
    lanes = scene.map.lanes
    first = scene.map.lane_centerlines[:, 0, :]  # (L, 2) entry of each lane
    l_arc, l_dist = project_on_polyline(first, pts, valid)
    # A connector without a centreline (scene files from NAVSIM caches) cannot be placed on the route.
    is_red_conn = lanes.valid & (lanes.kind == 1) & (l_dist < 1.5) & scene.map.lane_centerline_valid[:, 0]
    red = scene.map.red_light & is_red_conn[:, None]
    return dict(arc=arc, lat=lat, half_lat=half_lat, half_lon=half_lon, v_along=v_along, valid=ag.valid,
                red_arc=l_arc, red=red)


def idm_rollout_single(
    scene: Scene, offsets: chex.Array, speeds: chex.Array, config: IDMConfig = IDMConfig()
) -> chex.Array:
    """IDM rollouts of one scene for C (lateral offset, target speed) pairs.

    Args:
      scene: one Scene (no batch dims).
      offsets: (C,) lateral offsets from the route centreline, metres.
      speeds: (C,) target speeds v0, m/s.
    Returns: (C, num_steps, 3) poses at 0.1 .. num_steps * 0.1 s in the ego frame.
    """
    pts, valid = scene.route.points, scene.route.valid
    obs = _obstacles_single(scene)
    s0, _ = project_on_polyline(jnp.zeros((1, 2)), pts, valid)
    s0 = s0[0]
    v_init = jnp.linalg.norm(scene.ego.velocity)
    t_max = obs["arc"].shape[1] - 1
    sqrt_ab = 2.0 * jnp.sqrt(config.accel * config.decel)

    def rollout(offset, v0):
        def lateral(t):  # smoothstep blend from 0 to the offset
            u = jnp.clip(t / config.lateral_time, 0.0, 1.0)
            return offset * u * u * (3.0 - 2.0 * u)

        def step(carry, k):
            s, v = carry
            t_idx = jnp.minimum(k, t_max)
            d = lateral(k * OBS_DT)
            arc, lat = obs["arc"][:, t_idx], obs["lat"][:, t_idx]
            in_path = obs["valid"][:, t_idx] & (
                jnp.abs(lat - d) < _EGO.width / 2 + obs["half_lat"][:, t_idx] + config.corridor_margin
            )
            ahead = in_path & (arc > s)
            gap = jnp.where(ahead, arc - obs["half_lon"][:, t_idx] - s - _EGO.front_length, jnp.inf)
            v_lead = jnp.where(ahead, obs["v_along"][:, t_idx], 0.0)
            red_gap = obs["red_arc"] - s - _EGO.front_length
            red_on = obs["red"][:, t_idx] & (red_gap > -0.5)
            gap = jnp.concatenate([gap, jnp.where(red_on, red_gap, jnp.inf)])
            v_lead = jnp.concatenate([v_lead, jnp.zeros_like(red_gap)])
            s_star = config.min_gap + v * config.headway + v * (v - v_lead) / sqrt_ab
            inter = jnp.where(jnp.isfinite(gap), (jnp.maximum(s_star, 0.0) / jnp.maximum(gap, 0.01)) ** 2, 0.0)
            a = config.accel * (1.0 - (v / jnp.maximum(v0, 0.1)) ** config.exponent - jnp.max(inter))
            a = jnp.clip(a, -config.max_decel, config.accel)
            v_new = jnp.maximum(v + a * OBS_DT, 0.0)
            s_new = s + 0.5 * (v + v_new) * OBS_DT
            return (s_new, v_new), s_new

        _, s_traj = jax.lax.scan(step, (s0, v_init), jnp.arange(config.num_steps))
        t = (jnp.arange(config.num_steps) + 1) * OBS_DT
        d = lateral(t)
        poses = route_pose(pts, valid, s_traj, d)
        # heading follows the lateral blend: add atan(dd/ds)
        dd = jnp.gradient(d) / jnp.maximum(jnp.gradient(s_traj), 1e-3)
        moving = jnp.gradient(s_traj) > 1e-3
        return poses.at[:, 2].add(jnp.where(moving, jnp.arctan(dd), 0.0))

    return jax.vmap(rollout)(offsets, speeds)


def _flat(scene: Scene):
    shape = batch_shape(scene)
    return jax.tree.map(lambda a: a.reshape((-1,) + a.shape[len(shape):]), scene), shape


@functools.partial(jax.jit, static_argnames=("config",))
def idm_planner(scene: Scene, config: IDMConfig = IDMConfig()) -> chex.Array:
    """IDM at the speed limit along the route centreline.

    Args: scene with batch dims (...).
    Returns: (..., 8, 3) poses at 0.5 .. 4.0 s.
    """
    flat, shape = _flat(scene)
    v0 = target_speed(flat.map.speed_limit, config)
    poses = jax.vmap(lambda s, v: idm_rollout_single(s, jnp.zeros(1), v[None], config)[0])(flat, v0)
    out = poses[:, 4::5][:, :NUM_OUTPUT_POSES]
    return out.reshape(shape + out.shape[1:])
