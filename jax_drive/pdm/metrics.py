"""Per-step PDM rules on simulated ego states of ONE scene (vectorised over trajectories).

All functions here take an unbatched scene and Q trajectories (the PDM-Closed reference and
the proposals); :mod:`jax_drive.pdm.scorer` vmaps them over scene batch dims. Shapes:
Q trajectories, T = 41 scoring steps, N objects, F = 51 observation frames,
Pd drivable polygons, Pl lane polygons, V vertices per polygon.

Semantics (NAVSIM v1.1, see ``/work/shared/reference/navsim_pdm.md``):
  * ego footprint masks per step: multiple lanes, non-drivable (a corner outside every
    drivable polygon), oncoming (centre in no on-route lane polygon); point-in-polygon is
    even-odd, points exactly on a boundary may go either way;
  * NC: the ego box at step t against the object boxes of frame t (touching counts);
    classification stopped ego -> stopped track -> rear -> front bumper -> lateral, with
    an object's class and speed taken from its FIRST valid frame and its position from
    frame t; not-at-fault hits put the object on the per-trajectory NC ignore list;
  * TTC: the ego box moved by speed * (cos h, sin h) * d for d = 0, 0.3, 0.6, 0.9 s, against
    frames t, t+3, t+6, t+9, processed in that order within a step, with its own ignore list;
  * relative angle (ahead < 30 deg, behind > 150 deg) between the ego heading and the
    rear-axle -> object-centre vector (object centre of the current frame, ego rear axle of
    step t, also for the TTC projections). nuPlan's unclipped arccos can give NaN for an
    exactly collinear object (then neither ahead nor behind). We decide geometrically, as
    a clipped arccos would: a collinear object in front is ahead, one directly behind is
    behind, and a centre exactly on the rear axle counts as ahead. Generated scenes should
    avoid exact alignment if they are compared with NAVSIM itself.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.geometry import project_on_polyline
from jax_drive.pdm.config import PDMConfig
from jax_drive.types import MOVING_AGENT_TYPES, PolygonType


def ego_frame_overlap(lon: chex.Array, lat: chex.Array, crel: chex.Array, srel: chex.Array,
                      ego_lon: float | chex.Array, ego_hl: float, ego_hw: float,
                      obj_hl: chex.Array, obj_hw: chex.Array) -> chex.Array:
    """Rectangle overlap with the object centre and heading given in the ego rear-axle frame.

    Args:
      lon, lat: (...) object centre in the ego rear-axle frame (x forward, y left).
      crel, srel: (...) cos / sin of the object heading relative to the ego heading.
      ego_lon: longitudinal offset of the ego rectangle's centre from the rear axle.
      ego_hl, ego_hw: ego rectangle half length / half width (0 half length: a segment).
      obj_hl, obj_hw: (...) object half sizes.
    Returns: (...) bool overlap-or-touch (separating-axis test on the four box axes).
    """
    dl = lon - ego_lon
    ac, as_ = jnp.abs(crel), jnp.abs(srel)
    sep = (
        (jnp.abs(dl) > ego_hl + obj_hl * ac + obj_hw * as_)
        | (jnp.abs(lat) > ego_hw + obj_hl * as_ + obj_hw * ac)
        | (jnp.abs(dl * crel + lat * srel) > obj_hl + ego_hl * ac + ego_hw * as_)
        | (jnp.abs(lat * crel - dl * srel) > obj_hw + ego_hl * as_ + ego_hw * ac)
    )
    return ~sep


def ahead_behind(lon: chex.Array, lat: chex.Array, config: PDMConfig) -> tuple[chex.Array, chex.Array]:
    """Ahead (< 30 deg) / behind (> 150 deg) from an object centre in the rear-axle frame.

    Equivalent to comparing the clipped arccos of the heading / ego->object angle, without
    divisions: ahead <=> lon > 0 and lat^2 < tan^2(30 deg) lon^2. A centre exactly on the
    rear axle counts as ahead.
    """
    ka = math.tan(math.radians(config.ahead_angle_deg)) ** 2
    kb = math.tan(math.radians(180.0 - config.behind_angle_deg)) ** 2
    lat2, lon2 = lat * lat, lon * lon
    ahead = ((lon > 0) & (lat2 < ka * lon2)) | ((lon == 0) & (lat == 0))
    behind = (lon < 0) & (lat2 < kb * lon2)
    return ahead, behind


def points_in_polygons_fast(points: chex.Array, edges: tuple) -> chex.Array:
    """Even-odd test with precomputed edges. points (..., K, 2) -> (..., K, P) bool.

    ``edges`` = (ax, ay, by, inv_slope, valid) from :func:`polygon_edges`.
    """
    ax, ay, by, inv, valid = edges
    px = points[..., :, None, None, 0]
    py = points[..., :, None, None, 1]
    straddle = (ay > py) != (by > py)
    cross = straddle & (px < ax + (py - ay) * inv)
    inside = (jnp.sum(cross.astype(jnp.int32), axis=-1) & 1) == 1
    return inside & valid


def polygon_edges(vertices: chex.Array, valid: chex.Array) -> tuple:
    """Edge data (each (P, V)) for :func:`points_in_polygons_fast`; padded edges are inert."""
    a = vertices
    b = jnp.roll(vertices, -1, axis=-2)
    dy = b[..., 1] - a[..., 1]
    inv = (b[..., 0] - a[..., 0]) / jnp.where(dy == 0, 1.0, dy)
    return (a[..., 0], a[..., 1], b[..., 1], inv, valid)


@chex.dataclass(frozen=True)
class SceneArrays:
    """Scene data re-laid out for the per-step scan (one scene, no batch dims).

    obj_x, obj_y, obj_z, obj_heading, obj_valid: (F, N) per frame.
    obj_half_l, obj_half_w, obj_size: (N,), (N,), (N, 3) [length, width, height].
    obj_agent: (N,) bool moving-agent class (collision with it scores 0, else 0.5).
    obj_stopped: (N,) bool stopped track (not a moving agent, or first-frame speed <= 0.05).
    drivable_vertices (Pd, V, 2), drivable_valid (Pd,), intersection (Pd,) bool.
    lane_vertices (Pl, V, 2), lane_valid (Pl,), lane_on_route (Pl,), red (F, Pl) bool.
    route_points (R, 2), route_valid (R,).
    """

    obj_x: chex.Array
    obj_y: chex.Array
    obj_z: chex.Array
    obj_heading: chex.Array
    obj_valid: chex.Array
    obj_half_l: chex.Array
    obj_half_w: chex.Array
    obj_size: chex.Array
    obj_agent: chex.Array
    obj_stopped: chex.Array
    drivable_vertices: chex.Array
    drivable_valid: chex.Array
    intersection: chex.Array
    lane_vertices: chex.Array
    lane_valid: chex.Array
    lane_on_route: chex.Array
    red: chex.Array
    route_points: chex.Array
    route_valid: chex.Array


def scene_arrays(scene, config: PDMConfig) -> SceneArrays:
    """Builds :class:`SceneArrays` from an unbatched Scene."""
    ag = scene.agents
    valid = jnp.asarray(ag.valid, bool)
    first = jnp.argmax(valid, axis=-1)  # (N,)
    any_valid = jnp.any(valid, axis=-1)
    take = lambda a: jnp.take_along_axis(a, first[:, None], axis=-1)[:, 0]
    first_speed = jnp.hypot(take(ag.vx), take(ag.vy))
    agent = jnp.isin(ag.agent_type, jnp.asarray([int(t) for t in MOVING_AGENT_TYPES]))
    stopped = (~agent) | (first_speed <= config.collision_stopped_speed)
    lanes = scene.map.lanes
    red = (jnp.asarray(scene.map.red_light, bool) & lanes.valid[:, None] & lanes.on_route[:, None]
           & (lanes.kind[:, None] == 1))
    f32 = lambda a: jnp.asarray(a, jnp.float32)
    return SceneArrays(
        obj_x=f32(ag.x).T, obj_y=f32(ag.y).T, obj_z=f32(ag.z).T, obj_heading=f32(ag.heading).T,
        obj_valid=(valid & any_valid[:, None]).T,
        obj_half_l=f32(ag.length) / 2, obj_half_w=f32(ag.width) / 2,
        obj_size=jnp.stack([f32(ag.length), f32(ag.width), f32(ag.height)], -1),
        obj_agent=agent, obj_stopped=stopped,
        drivable_vertices=f32(scene.map.drivable.vertices),
        drivable_valid=jnp.asarray(scene.map.drivable.valid, bool),
        intersection=jnp.asarray(scene.map.drivable.valid, bool)
        & (scene.map.drivable.kind == int(PolygonType.INTERSECTION)),
        lane_vertices=f32(lanes.vertices), lane_valid=jnp.asarray(lanes.valid, bool),
        lane_on_route=jnp.asarray(lanes.on_route, bool) & jnp.asarray(lanes.valid, bool),
        red=red.T,
        route_points=f32(scene.route.points), route_valid=jnp.asarray(scene.route.valid, bool),
    )


def ego_geometry(x, y, h, config: PDMConfig) -> dict:
    """Ego footprint points from rear-axle poses, fields (..., 2) / (..., 4, 2).

    Returns dict: rear (..., 2), centre (..., 2), corners (..., 4, 2) FL, RL, RR, FR,
    front (..., 2) middle of the front bumper.
    """
    c, s = jnp.cos(h), jnp.sin(h)
    fwd = jnp.stack([c, s], -1)
    left = jnp.stack([-s, c], -1)
    rear = jnp.stack([x, y], -1)
    centre = rear + config.ego_rear_axle_to_center * fwd
    hl, hw = config.ego_length / 2, config.ego_width / 2
    corners = jnp.stack([
        centre + hl * fwd + hw * left,
        centre - hl * fwd + hw * left,
        centre - hl * fwd - hw * left,
        centre + hl * fwd - hw * left,
    ], axis=-2)
    return {"rear": rear, "centre": centre, "corners": corners, "heading": h,
            "front": rear + config.ego_front_length * fwd, "half_length": hl, "half_width": hw}


def footprint_masks(geo: dict, sa: SceneArrays, red_t: chex.Array) -> dict:
    """Map masks for ego footprints.

    Args: geo from :func:`ego_geometry` with leading dims (Q,); red_t (Pl,) red lanes now.
    Returns dict of (Q,) bool: multiple_lanes, non_drivable, oncoming, rear_in_intersection,
      centre_in_intersection, red_light (ego box meets a red on-route lane connector:
      an ego corner / the centre inside it, or one of its vertices inside the ego box;
      a connector crossing the box with no vertex inside and no ego point inside is missed).
    """
    pts = jnp.concatenate([geo["corners"], geo["centre"][..., None, :], geo["rear"][..., None, :]], -2)
    in_drv = points_in_polygons_fast(pts, polygon_edges(sa.drivable_vertices, sa.drivable_valid))
    in_lane = points_in_polygons_fast(pts[..., :5, :], polygon_edges(sa.lane_vertices, sa.lane_valid))
    corner_lane = in_lane[..., :4, :]
    lanes_touched = jnp.sum(jnp.any(corner_lane, axis=-2), axis=-1)
    one_lane_holds_all = jnp.any(jnp.all(corner_lane, axis=-2), axis=-1)
    multiple = (lanes_touched > 1) & ~one_lane_holds_all
    non_drivable = jnp.sum(jnp.any(in_drv[..., :4, :], axis=-1), axis=-1) < 4
    oncoming = ~jnp.any(in_lane[..., 4, :] & sa.lane_on_route, axis=-1)
    rear_int = jnp.any(in_drv[..., 5, :] & sa.intersection, axis=-1)
    centre_int = jnp.any(in_drv[..., 4, :] & sa.intersection, axis=-1)
    pts_in_red = jnp.any(in_lane & red_t, axis=(-2, -1))
    # Red polygon vertices inside the ego box (box axes from the rear-axle heading).
    h = geo["heading"]
    c, s_ = jnp.cos(h)[:, None, None], jnp.sin(h)[:, None, None]
    rel = sa.lane_vertices[None] - geo["centre"][:, None, None, :]  # (Q, Pl, V, 2)
    lon = rel[..., 0] * c + rel[..., 1] * s_
    lat = -rel[..., 0] * s_ + rel[..., 1] * c
    vert_in = (jnp.abs(lon) <= geo["half_length"]) & (jnp.abs(lat) <= geo["half_width"])
    vert_in_red = jnp.any(jnp.any(vert_in, -1) & red_t, -1)
    return {"multiple_lanes": multiple, "non_drivable": non_drivable, "oncoming": oncoming,
            "rear_in_intersection": rear_int, "centre_in_intersection": centre_int,
            "red_light": pts_in_red | vert_in_red}


def _first_index(mask: chex.Array) -> chex.Array:
    """Index of the first True along the last axis, -1 if none. (..., N) -> (...)."""
    idx = jnp.argmax(mask, axis=-1)
    return jnp.where(jnp.any(mask, axis=-1), idx, -1).astype(jnp.int32)


def run_steps(traj: dict, sa: SceneArrays, config: PDMConfig) -> dict:
    """Scans the 41 scoring steps: masks, NC and TTC with their ignore lists.

    Args:
      traj: dict of (Q, T) arrays x, y, heading, speed.
      sa: SceneArrays.
    Returns dict of per-step (T, Q) outputs: multiple_lanes, non_drivable, oncoming,
      rear_in_intersection, centre_in_intersection, red_light, nc (score at that step, 1 if
      no at-fault hit), nc_object (int32, -1 none), ttc_fail (bool), ttc_object, ttc_frame,
      plus centre (T, Q, 2).
    """
    n_obj = sa.obj_half_l.shape[0]
    q = traj["x"].shape[0]
    n_frames = sa.obj_x.shape[0]
    hl_ego, hw_ego = config.ego_length / 2, config.ego_width / 2
    centre_lon = config.ego_rear_axle_to_center
    agent_score = jnp.where(sa.obj_agent, 0.0, config.static_collision_score)  # (N,)
    d_frames = jnp.asarray(config.ttc_future_frames, jnp.int32)  # (D,)
    obj_cos, obj_sin = jnp.cos(sa.obj_heading), jnp.sin(sa.obj_heading)  # (F, N)
    ohl, ohw = sa.obj_half_l, sa.obj_half_w

    def to_ego(x, y, c, s, ox, oy, oc, os_):
        """Object centres / headings in the ego rear-axle frame: (Q, 1..) x (.., N)."""
        dx, dy = ox - x, oy - y
        return (c * dx + s * dy, -s * dx + c * dy, c * oc + s * os_, c * os_ - s * oc)

    def step(carry, xs):
        nc_ign, ttc_ign = carry
        t, x, y, h, v = xs
        geo = ego_geometry(x, y, h, config)
        masks = footprint_masks(geo, sa, sa.red[t])
        c, s = jnp.cos(h), jnp.sin(h)
        risky = masks["multiple_lanes"] | masks["non_drivable"]  # (Q,)

        # ---- NC: ego box at step t against frame t.
        lon, lat, crel, srel = to_ego(x[:, None], y[:, None], c[:, None], s[:, None],
                                      sa.obj_x[t], sa.obj_y[t], obj_cos[t], obj_sin[t])  # (Q, N)
        hit = ego_frame_overlap(lon, lat, crel, srel, centre_lon, hl_ego, hw_ego, ohl, ohw)
        hit = hit & sa.obj_valid[t] & ~nc_ign
        _, behind = ahead_behind(lon, lat, config)
        front = ego_frame_overlap(lon, lat, crel, srel, config.ego_front_length, 0.0, hw_ego, ohl, ohw)
        ego_stopped = (v <= config.collision_stopped_speed)[:, None]
        at_fault = hit & ~ego_stopped & (sa.obj_stopped | (~behind & (front | risky[:, None])))
        obj_score = jnp.where(at_fault, agent_score, 1.0)
        nc_t = jnp.min(obj_score, axis=-1, initial=1.0)
        nc_obj = jnp.where(nc_t < 1.0, jnp.argmin(obj_score, axis=-1), -1).astype(jnp.int32)
        nc_ign = nc_ign | (hit & ~at_fault)

        # ---- TTC: ego box moved by v * d * dt along its heading, against frames t + d.
        frames = jnp.minimum(t + d_frames, n_frames - 1)  # (D,)
        fvalid = sa.obj_valid[frames] & ((t + d_frames) < n_frames)[:, None]  # (D, N)
        lon, lat, crel, srel = to_ego(x[:, None, None], y[:, None, None], c[:, None, None],
                                      s[:, None, None], sa.obj_x[frames], sa.obj_y[frames],
                                      obj_cos[frames], obj_sin[frames])  # (Q, D, N)
        shift = centre_lon + (v[:, None] * d_frames * config.dt)[..., None]  # (Q, D, 1)
        raw = ego_frame_overlap(lon, lat, crel, srel, shift, hl_ego, hw_ego, ohl, ohw)
        moving = (v >= config.ttc_stopped_speed)[:, None, None]
        raw = raw & fvalid & ~ttc_ign[:, None] & moving
        ahead, behind = ahead_behind(lon, lat, config)
        risky_ttc = (risky | masks["rear_in_intersection"])[:, None, None]
        danger = ahead | (risky_ttc & ~behind)
        # Projections are processed in order d = 0, 0.3, 0.6, 0.9 s: the first harmless hit
        # puts the object on the ignore list, later projections skip it.
        harmless = raw & ~danger
        ignored_before = (jnp.cumsum(harmless.astype(jnp.int32), axis=1) - harmless) > 0
        effective = raw & ~ignored_before
        fail = effective & danger  # (Q, D, N)
        ttc_ign = ttc_ign | jnp.any(effective & ~danger, axis=1)
        first = _first_index(fail.reshape(q, -1))
        fail_any = first >= 0
        fail_obj = jnp.where(fail_any, first % n_obj, -1).astype(jnp.int32)
        fail_frame = jnp.where(fail_any, frames[jnp.maximum(first, 0) // n_obj], -1).astype(jnp.int32)

        out = dict(masks)
        out.update(nc=nc_t, nc_object=nc_obj, ttc_fail=fail_any, ttc_object=fail_obj,
                   ttc_frame=fail_frame, centre=geo["centre"])
        return (nc_ign, ttc_ign), out

    n_steps = traj["x"].shape[1]
    xs = (jnp.arange(n_steps), traj["x"].T, traj["y"].T, traj["heading"].T, traj["speed"].T)
    init = (jnp.zeros((q, n_obj), bool), jnp.zeros((q, n_obj), bool))
    _, outs = jax.lax.scan(step, init, xs)
    return outs


def route_progress(centre_start: chex.Array, centre_end: chex.Array, sa: SceneArrays) -> chex.Array:
    """Raw progress (Q,) along the route: arc(end) - arc(start), clipped >= 0.

    A degenerate route (fewer than 2 valid points) gives progress 0 (then EP follows the
    <= 5 m rule: 1 unless NC * DAC == 0).
    """
    pts = jnp.stack([centre_start, centre_end], axis=-2)  # (Q, 2, 2)
    arc, _ = project_on_polyline(pts, sa.route_points, sa.route_valid)
    ok = jnp.sum(sa.route_valid) >= 2
    return jnp.where(ok, jnp.maximum(arc[..., 1] - arc[..., 0], 0.0), 0.0)


def route_distance(centre: chex.Array, sa: SceneArrays) -> chex.Array:
    """Distance (...) of points (..., 2) to the route polyline; 0 for a degenerate route.

    Same value as the distance of :func:`jax_drive.geometry.project_on_polyline`, computed
    with squared distances and one square root per point (it runs on 41 x Q points).
    """
    pts, valid = sa.route_points, sa.route_valid
    a, b = pts[:-1], pts[1:]  # (R-1, 2)
    seg_ok = valid[:-1] & valid[1:]
    ab = b - a
    inv = 1.0 / jnp.maximum(jnp.sum(ab * ab, -1), 1e-12)
    rel = centre[..., None, :] - a  # (..., R-1, 2)
    t = jnp.clip(jnp.sum(rel * ab, -1) * inv, 0.0, 1.0)
    d2 = jnp.sum((rel - t[..., None] * ab) ** 2, -1)
    d2 = jnp.where(seg_ok, d2, jnp.inf)
    ok = jnp.sum(valid) >= 2
    return jnp.where(ok, jnp.sqrt(jnp.min(d2, axis=-1)), 0.0)


def driving_direction(centre: chex.Array, oncoming: chex.Array, config: PDMConfig) -> chex.Array:
    """DDC (Q,) from centres (T, Q, 2) and oncoming masks (T, Q).

    Per-step centre displacement counted while oncoming; sums over windows t-10 .. t;
    max < 2 m -> 1, < 6 m -> 0.5, else 0.
    """
    disp = jnp.linalg.norm(jnp.diff(centre, axis=0), axis=-1)
    disp = jnp.concatenate([jnp.zeros_like(disp[:1]), disp], 0)
    disp = jnp.where(oncoming, disp, 0.0)
    cum = jnp.cumsum(disp, axis=0)
    w = config.ddc_horizon_steps + 1
    lagged = jnp.concatenate([jnp.zeros((w,) + cum.shape[1:], cum.dtype), cum[:-w]], 0)
    worst = jnp.max(cum - lagged, axis=0)
    return jnp.where(worst < config.ddc_compliance_threshold, 1.0,
                     jnp.where(worst < config.ddc_violation_threshold, 0.5, 0.0))


def lane_keeping(deviation: chex.Array, in_intersection: chex.Array, config: PDMConfig) -> chex.Array:
    """LK (Q,) from (T, Q) centre-to-route distances and intersection flags.

    Fails (0) once the deviation exceeds the limit for ``lk_steps`` consecutive counted
    steps; steps in an intersection are skipped (they neither count nor reset).
    """
    def body(count, xs):
        dev, inter = xs
        new = jnp.where(dev > config.lk_deviation_limit, count + 1, 0)
        count = jnp.where(inter, count, new)
        return count, count >= config.lk_steps

    _, fails = jax.lax.scan(body, jnp.zeros(deviation.shape[1:], jnp.int32),
                            (deviation, in_intersection))
    return jnp.where(jnp.any(fails, axis=0), 0.0, 1.0)


def pose_windows(num_steps: int = 41, num_poses: int = 8, per_pose: int = 5) -> np.ndarray:
    """(num_poses, num_steps) bool: pose k covers steps 5k+1 .. 5k+5 (pose 0 also step 0)."""
    w = np.zeros((num_poses, num_steps), bool)
    for k in range(num_poses):
        w[k, per_pose * k + 1: per_pose * k + per_pose + 1] = True
    w[0, 0] = True
    return w
