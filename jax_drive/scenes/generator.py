"""Procedural NAVSIM-like scenes, batched and deterministic per PRNG key.

``generate_scenes(key, num_scenes, config)`` returns a Scene with batch dim (num_scenes,),
built by one jitted ``vmap`` over per-scene keys (scene i uses ``fold_in(key, i)``, so a
scene does not depend on how many others are generated).

Layouts (:mod:`jax_drive.scenes.layouts`; ego frame, the ego rear axle at the origin heading +x,
right-hand traffic):
  * STRAIGHT: 1-4 lanes in the ego direction, sometimes one oncoming lane on the left.
  * CURVE: the same road bending left or right (straight, arc, straight).
  * INTERSECTION: a 4-way crossing with one lane each way per arm, a square intersection
    polygon, lane connectors; the route turns left / right or goes straight (the command
    says which); traffic lights: the ego connector's light is red or the crossing ones are.
  * MERGE: the ego on an on-ramp merging into the right lane of a two-lane road.
Every road is an analytic path (:mod:`jax_drive.scenes.paths`) so polygons, centrelines,
the route and all agent motions come from the same closed-form geometry.

Agents: a lead vehicle on the route (cruising, braking, stopped or absent), a follower,
traffic on the other lanes (crossing traffic waits or drives according to the lights),
crossing pedestrians, a sidewalk pedestrian, a cyclist, cones / barriers on the shoulder
or closing another lane, and parked cars. Every object gets a small lateral and heading
jitter so nothing is exactly collinear with the ego (nuPlan's unclipped arccos).

Expert: IDM along the route w.r.t. the nearest object that is (or within 2 s will be) in
the ego's corridor and w.r.t. a red stop line, slowing for curves (lateral acceleration
<= 2.5 m/s^2, yaw rate <= 0.6 rad/s); its t0 acceleration and history are consistent;
the follower behind the ego replays the expert's speed profile at a fixed gap.

Hard scenes (``hard_fraction``): a stopped car close ahead (constant velocity collides),
a sharp curve right ahead (constant velocity leaves the road), a fast ego behind a
hard-braking lead (low TTC / collision), a sharp turn at a T-junction close ahead
(constant velocity drives off the road; the expert must brake to a comfortable turning
speed). :func:`scene_labels` returns the layout and hard kind drawn for each scene.

Randomness: each scene draws from one uniform pool keyed by ``fold_in(key, scene_id)``;
``hard_fraction`` and ``start_id`` are traced, so changing them does not recompile.
"""

from __future__ import annotations

import dataclasses
import enum
import functools

import chex
import numpy as np
import jax
import jax.numpy as jnp

from jax_drive.geometry import polyline_arc_lengths, project_on_polyline, wrap_angle
from jax_drive.scenes import paths as P
from jax_drive.scenes.builders import SceneSizes, history_from_motion_jax
from jax_drive.scenes.layouts import (
    BEHIND,
    EGO,
    MAX_LANES,
    MAX_STRIPS,
    UniformPool,
    intersection_layout,
    merge_layout,
    road_layout,
)
from jax_drive.types import (
    NUM_OBS_STEPS,
    NUM_OUTPUT_POSES,
    OBS_DT,
    Agents,
    AgentType,
    EgoState,
    MapData,
    Polygons,
    Route,
    Scene,
)


class SceneKind(enum.IntEnum):
    STRAIGHT = 0
    CURVE = 1
    INTERSECTION = 2
    MERGE = 3


class HardKind(enum.IntEnum):
    NONE = -1
    STOPPED_AHEAD = 0
    SHARP_CURVE = 1
    BRAKING_LEAD = 2
    SHARP_TURN = 3


@dataclasses.dataclass(frozen=True)
class GeneratorConfig:
    """Scene generator settings.

    Attributes:
      hard_fraction: share of scenes built so that naive planners fail (default 0.3).
      kind_probs: probabilities of STRAIGHT, CURVE, INTERSECTION, MERGE for normal scenes.
      lane_width: metres (default 3.5).
      ped_prob: probability of a crossing pedestrian (normal scenes).
      cyclist_prob, static_prob, parked_prob: probabilities of a cyclist, of each of three
        cones / barriers, of each of two parked cars.
      other_vehicle_prob: probability of each of four vehicles on the other lanes.
      red_prob: probability that the ego's light is red at an intersection (when it can stop).
      sizes: padded sizes.
      idm_*: expert IDM (desired gap min_gap + headway * v; accel; comfortable decel). The
        expert never brakes harder than 1.2x the constant deceleration that matches an
        obstacle's speed 3 m before it, and slows for curves (lateral accel <= 2.5 m/s^2,
        yaw rate <= 0.6 rad/s).
    """

    hard_fraction: float = 0.3
    kind_probs: tuple[float, float, float, float] = (0.3, 0.25, 0.3, 0.15)
    lane_width: float = 3.5
    ped_prob: float = 0.25
    cyclist_prob: float = 0.2
    static_prob: float = 0.35
    parked_prob: float = 0.3
    other_vehicle_prob: float = 0.6
    red_prob: float = 0.35
    sizes: SceneSizes = SceneSizes()
    idm_min_gap: float = 3.0
    idm_headway: float = 1.2
    idm_accel: float = 1.5
    idm_decel: float = 2.5


_NUM_SLOTS = 14  # object slots the generator fills (the rest of SceneSizes.num_agents is padding)


# ---------------------------------------------------------------------------------------
# agents


def _agent_tracks(path, offset, direction, s0, v0, t_brake, decel, present):
    """Tracks of one object following a path (all inputs scalars; path (7,)).

    Returns x, y, heading, vx, vy (51,) each and valid (51,).
    """
    t = jnp.arange(NUM_OBS_STEPS) * OBS_DT
    tb = jnp.minimum(t, t_brake)
    after = jnp.maximum(t - t_brake, 0.0)
    t_stop = v0 / jnp.maximum(decel, 1e-6)
    ta = jnp.minimum(after, t_stop)
    dist = v0 * tb + v0 * ta - 0.5 * decel * ta**2
    speed = jnp.where(after > 0.0, jnp.maximum(v0 - decel * after, 0.0), v0)
    pose = P.path_pose(path, s0 + direction * dist, offset)
    heading = wrap_angle(pose[:, 2] + jnp.where(direction < 0, jnp.pi, 0.0))
    return pose[:, 0], pose[:, 1], heading, speed * jnp.cos(heading), speed * jnp.sin(heading), jnp.full(t.shape, present)


def _make_agents(r, lay, cfg, ego_speed, speed_limit, hard_kind, kind):
    """Samples the 14 agent slots; returns per-slot parameters and static attributes."""
    paths = lay["paths"]
    route = paths[0]
    n_slots = 14
    jit_lat = r.u(0.05, 0.25, (n_slots,)) * jnp.where(r.u(0.0, 1.0, (n_slots,)) < 0.5, -1.0, 1.0)
    jit_head = r.u(0.005, 0.03, (n_slots,)) * jnp.where(r.u(0.0, 1.0, (n_slots,)) < 0.5, -1.0, 1.0)

    # slot 0: lead vehicle on the route
    lead_len = r.u(4.2, 5.2)
    v = ego_speed
    bumper = EGO.front_length + lead_len / 2  # rear axle to lead centre at zero bumper gap
    lead_mode = r.randint(0, 4)  # 0 none, 1 cruise, 2 mild braking, 3 stopped far
    gap_safe = 2.0 + 1.5 * v + r.u(0.0, 25.0)
    lead_s = BEHIND + bumper + jnp.select(
        [hard_kind == HardKind.STOPPED_AHEAD, hard_kind == HardKind.BRAKING_LEAD, lead_mode == 3],
        [v**2 / 8.0 + r.u(6.0, 14.0), 2.0 + v * r.u(1.0, 1.4), 4.0 * v + r.u(12.0, 40.0)],
        gap_safe,
    )
    lead_v = jnp.select(
        [hard_kind == HardKind.STOPPED_AHEAD, hard_kind == HardKind.BRAKING_LEAD, lead_mode == 3],
        [0.0, v, 0.0],
        jnp.minimum(v * r.u(0.7, 1.1), speed_limit),
    )
    lead_v = jnp.where(kind == SceneKind.INTERSECTION, jnp.minimum(lead_v, r.u(3.0, 5.0)), lead_v)
    lead_tb = jnp.where(hard_kind == HardKind.BRAKING_LEAD, r.u(0.3, 1.0), jnp.where(lead_mode == 2, r.u(1.0, 3.0), 100.0))
    lead_dec = jnp.where(hard_kind == HardKind.BRAKING_LEAD, r.u(4.0, 6.0), r.u(1.0, 2.5))
    # a queued lead waits at a red stop line
    lead_s = jnp.where(lay["ego_red"] & (lead_mode == 1), lay["stop_s"] - 1.5 - lead_len / 2, lead_s)
    lead_v = jnp.where(lay["ego_red"] & (lead_mode == 1), 0.0, lead_v)
    lead_present = (hard_kind == HardKind.STOPPED_AHEAD) | (hard_kind == HardKind.BRAKING_LEAD) | (
        (hard_kind < 0) & (lead_mode > 0)
    )
    lead_present = lead_present & ~((hard_kind == HardKind.SHARP_TURN) | (hard_kind == HardKind.SHARP_CURVE))

    # slot 1: follower on the route
    fol_s = BEHIND - r.u(12.0, 30.0)
    fol_v = v * r.u(0.8, 1.0)
    fol_present = r.u() < 0.5

    # slots 2..5: traffic on other lanes
    tr = lay["traffic"]
    tr_s = tr[:, 3] + (tr[:, 4] - tr[:, 3]) * r.u(0.0, 1.0, (4,))
    tr_v = speed_limit * (tr[:, 5] + (tr[:, 6] - tr[:, 5]) * r.u(0.0, 1.0, (4,)))
    tr_present = (r.u(0.0, 1.0, (4,)) < tr[:, 7] * cfg.other_vehicle_prob / 0.6)
    tr_paths = paths[tr[:, 0].astype(jnp.int32)]

    # slot 6: crossing pedestrian, at the route centre at t_cross
    t_cross = r.u(2.0, 4.5)
    ped_v = r.u(0.9, 1.6)
    s_c = BEHIND + jnp.maximum(v * t_cross * r.u(0.5, 1.1), v**2 / 4.0 + 10.0)
    side = jnp.where(r.u() < 0.5, -1.0, 1.0)
    pc = P.path_pose(route, s_c[None])[0]
    ped_h = pc[2] - side * (jnp.pi / 2) + r.u(-0.2, 0.2)
    ped_start = pc[:2] - ped_v * t_cross * jnp.stack([jnp.cos(ped_h), jnp.sin(ped_h)])
    ped_path = P.path(ped_start[0], ped_start[1], ped_h, 100.0)
    ped_present = (hard_kind < 0) & (r.u() < cfg.ped_prob) & (kind != SceneKind.MERGE)

    # slot 7: sidewalk pedestrian walking along the road outside its edge
    side_off = jnp.where(r.u() < 0.5, lay["edge_lo"] - 1.5, lay["edge_hi"] + 1.5)
    walk_s = BEHIND + r.u(-10.0, 60.0)
    walker_present = (r.u() < 0.4) & (walk_s < lay["static_s_max"] - 8.0)

    # slot 8: cyclist at the right edge of the rightmost lane, ahead
    cyc_s = BEHIND + EGO.front_length + 2.0 * v + r.u(10.0, 40.0)
    cyc_off = lay["edge_lo"] + 1.0
    cyc_v = r.u(3.0, 6.0)
    cyc_present = (hard_kind < 0) & (r.u() < cfg.cyclist_prob) & (kind != SceneKind.INTERSECTION)

    # slots 9..11: cones / barriers on the shoulder or closing another lane
    st_s = BEHIND + r.u(8.0, 70.0, (3,))
    in_lane = (r.u(0.0, 1.0, (3,)) < 0.4) & lay["other_lane_valid"][:3]
    shoulder_off = jnp.where(r.u(0.0, 1.0, (3,)) < 0.5, lay["edge_lo"] - 0.6, lay["edge_hi"] + 0.6)
    st_off = jnp.where(in_lane, lay["other_lane_offsets"][:3], shoulder_off)
    st_type = jnp.where(r.u(0.0, 1.0, (3,)) < 0.6, AgentType.TRAFFIC_CONE, AgentType.BARRIER)
    st_present = (r.u(0.0, 1.0, (3,)) < cfg.static_prob) & (st_s < lay["static_s_max"])

    # slots 12..13: parked cars beyond the road edge
    pk_s = BEHIND + r.u(-20.0, 80.0, (2,))
    pk_off = jnp.where(r.u(0.0, 1.0, (2,)) < 0.5, lay["edge_lo"] - 2.2, lay["edge_hi"] + 2.2)
    pk_present = (r.u(0.0, 1.0, (2,)) < cfg.parked_prob) & (pk_s < lay["static_s_max"])

    z3 = jnp.zeros(3)
    slot_path = jnp.concatenate(
        [route[None], route[None], tr_paths, ped_path[None], route[None], route[None], jnp.tile(route[None], (3, 1)), jnp.tile(route[None], (2, 1))]
    )
    offset = jnp.concatenate([jnp.zeros(2), tr[:, 1], jnp.zeros(1), side_off[None], cyc_off[None], st_off, pk_off]) + jit_lat
    direction = jnp.concatenate([jnp.ones(2), tr[:, 2], jnp.ones(1), jnp.where(r.u() < 0.5, 1.0, -1.0)[None], jnp.ones(1), jnp.ones(3), jnp.ones(2)])
    s0 = jnp.concatenate([lead_s[None], fol_s[None], tr_s, jnp.zeros(1), walk_s[None], cyc_s[None], st_s, pk_s])
    v0 = jnp.concatenate([lead_v[None], fol_v[None], tr_v, ped_v[None], r.u(0.8, 1.4)[None], cyc_v[None], z3, jnp.zeros(2)])
    t_brake = jnp.concatenate([lead_tb[None], jnp.full(13, 100.0)])
    decel = jnp.concatenate([lead_dec[None], jnp.zeros(13)])
    present = jnp.concatenate([lead_present[None], fol_present[None], tr_present, ped_present[None], walker_present[None], cyc_present[None], st_present, pk_present])
    kinds = jnp.array([0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 3, 3, 0, 0], jnp.int32)
    kinds = kinds.at[9:12].set(st_type.astype(jnp.int32))
    size_l = jnp.concatenate([lead_len[None], r.u(4.2, 5.2, (5,)), jnp.array([0.6, 0.6, 1.8]), jnp.where(st_type == AgentType.TRAFFIC_CONE, 0.45, 2.0), r.u(4.3, 5.0, (2,))])
    size_w = jnp.concatenate([jnp.full(6, 1.9) + r.u(0.0, 0.2, (6,)), jnp.array([0.6, 0.6, 0.7]), jnp.where(st_type == AgentType.TRAFFIC_CONE, 0.45, 0.6), jnp.full(2, 1.9)])
    size_h = jnp.concatenate([jnp.full(6, 1.6), jnp.array([1.75, 1.75, 1.7]), jnp.where(st_type == AgentType.TRAFFIC_CONE, 0.8, 1.0), jnp.full(2, 1.6)])
    x, y, h, vx, vy, valid = jax.vmap(_agent_tracks)(slot_path, offset, direction, s0, v0, t_brake, decel, present)
    h = wrap_angle(h + jit_head[:, None])
    return dict(
        x=x, y=y, heading=h, vx=vx, vy=vy, valid=valid, agent_type=kinds, length=size_l, width=size_w, height=size_h,
        fol_gap=BEHIND - fol_s, fol_offset=jit_lat[1],
    )


# ---------------------------------------------------------------------------------------
# expert


def curve_speed(route: chex.Array) -> chex.Array:
    """Comfortable speed (...) on the path's arc: lateral accel <= 2.5 m/s^2, yaw rate <= 0.6 rad/s."""
    kappa = jnp.abs(jnp.sign(route[..., 5]) / jnp.maximum(route[..., 4], 1e-3))
    k = jnp.maximum(kappa, 1e-6)
    return jnp.where(kappa > 0, jnp.minimum(jnp.sqrt(2.5 / k), 0.6 / k), 1e3)


def _expert(cfg, route, agents, ego_speed, speed_limit_des, stop_s):
    """IDM along the route path. Returns arc lengths s (51,) at 0..5 s, speeds (51,), a0."""
    dense_s = jnp.linspace(0.0, P.path_length(route), 256)
    dense = P.path_pose(route, dense_s)
    pts = dense[:, :2]
    valid_pts = jnp.ones(256, bool)
    n, t_steps = agents["x"].shape
    q = jnp.stack([agents["x"], agents["y"]], -1).reshape(-1, 2)
    arc, dist = project_on_polyline(q, pts, valid_pts)
    arc, dist = arc.reshape(n, t_steps), dist.reshape(n, t_steps)
    route_h = P.path_pose(route, arc.reshape(-1)).reshape(n, t_steps, 3)[..., 2]
    dh = agents["heading"] - route_h
    half_lat = jnp.abs(agents["length"][:, None] / 2 * jnp.sin(dh)) + jnp.abs(agents["width"][:, None] / 2 * jnp.cos(dh))
    half_lon = jnp.abs(agents["length"][:, None] / 2 * jnp.cos(dh)) + jnp.abs(agents["width"][:, None] / 2 * jnp.sin(dh))
    v_along = agents["vx"] * jnp.cos(route_h) + agents["vy"] * jnp.sin(route_h)
    in_corr = agents["valid"] & (dist < EGO.width / 2 + half_lat + 0.5)
    total_len = polyline_arc_lengths(pts, valid_pts)[-1]
    in_corr = in_corr & (arc < total_len - 1.0)  # projections clamped to the route end
    a0_arc, a1_arc = P.arc_range(route)
    v_curve = curve_speed(route)
    window = 20

    def idm_accel(s, vel, t_idx):
        idx = jnp.minimum(t_idx + jnp.arange(window + 1), t_steps - 1)
        # objects in the corridor now or within the window, and ahead of the ego now
        occ = in_corr[:, idx] & (arc[:, idx] > s) & (arc[:, t_idx] > s)[:, None]  # (n, W)
        gaps = arc[:, idx] - half_lon[:, idx] - s - EGO.front_length
        now = occ[:, 0]
        first = jnp.argmax(occ, axis=1)
        any_occ = jnp.any(occ, axis=1)
        gap_future = jnp.take_along_axis(gaps, first[:, None], 1)[:, 0]
        gap = jnp.where(now, gaps[:, 0], jnp.where(any_occ, gap_future, jnp.inf))
        vobs = jnp.where(now, jnp.maximum(v_along[:, t_idx], 0.0), 0.0)
        stop_gap = stop_s - s - EGO.front_length
        gap = jnp.concatenate([gap, jnp.where(stop_gap > -0.5, stop_gap, jnp.inf)[None]])
        vobs = jnp.concatenate([vobs, jnp.zeros(1)])
        s_star = cfg.idm_min_gap + vel * cfg.idm_headway + vel * (vel - vobs) / (2 * jnp.sqrt(cfg.idm_accel * cfg.idm_decel))
        inter = jnp.where(jnp.isfinite(gap), (jnp.maximum(s_star, 0.0) / jnp.maximum(gap, 0.1)) ** 2, 0.0)
        free = 1.0 - (vel / jnp.maximum(speed_limit_des, 0.1)) ** 4
        a_idm = cfg.idm_accel * (free - inter)
        # A human brakes no harder than needed: cap IDM's braking at 1.2x the constant
        # deceleration that matches the obstacle's speed 3 m before it.
        need = (vel**2 - vobs**2) / (2.0 * jnp.maximum(gap - 3.0, 0.1))
        a_kin = jnp.where((vel > vobs) & jnp.isfinite(gap), -1.2 * need, -jnp.inf)
        a = jnp.minimum(cfg.idm_accel * free, jnp.min(jnp.maximum(a_idm, a_kin)))
        # curve speed: brake (about constant decel) to reach v_curve at the arc start
        dist_arc = jnp.maximum(a0_arc - s, 0.0)
        on_or_before = s < a1_arc
        need = (vel**2 - v_curve**2) / (2.0 * jnp.maximum(dist_arc, 0.5))
        a_curve = jnp.where(on_or_before & (vel > v_curve) & (need > 0.8), -need, jnp.inf)
        return jnp.clip(jnp.minimum(a, a_curve), -7.0, cfg.idm_accel)

    def step(carry, t_idx):
        s, vel = carry
        a = idm_accel(s, vel, t_idx)
        v_new = jnp.maximum(vel + a * OBS_DT, 0.0)
        s_new = s + 0.5 * (vel + v_new) * OBS_DT
        return (s_new, v_new), (s_new, v_new, a)

    (_, _), (s_traj, v_traj, a_traj) = jax.lax.scan(step, (jnp.float32(BEHIND), ego_speed), jnp.arange(NUM_OBS_STEPS - 1))
    s_all = jnp.concatenate([jnp.full(1, BEHIND), s_traj])
    v_all = jnp.concatenate([ego_speed[None], v_traj])
    return s_all, v_all, a_traj[0]


# ---------------------------------------------------------------------------------------
# one scene


def _render_lanes(lay, sizes: SceneSizes):
    lanes = lay["lanes"]
    p = lay["paths"][lanes[:, 0].astype(jnp.int32)]
    off, wid = lanes[:, 1], lanes[:, 2]
    half_v = sizes.lane_vertices // 2
    verts = P.strip_polygon(p, off - wid / 2, off + wid / 2, lanes[:, 7], lanes[:, 8], half_v)
    s = P.sample_s(p, lanes[:, 7], lanes[:, 8], sizes.centerline_points)
    cl = P.path_pose(p, s, off[:, None])[..., :2]
    cl = jnp.where(lanes[:, 5, None, None] > 0.5, cl[:, ::-1], cl)
    pad = sizes.num_lanes - lanes.shape[0]
    valid = lanes[:, 9] > 0.5
    verts = jnp.where(valid[:, None, None], verts, 0.0)
    verts = jnp.concatenate([verts, jnp.zeros((pad,) + verts.shape[1:])])
    cl = jnp.concatenate([cl, jnp.zeros((pad,) + cl.shape[1:])])
    valid_all = jnp.concatenate([valid, jnp.zeros(pad, bool)])
    return Polygons(
        vertices=verts,
        valid=valid_all,
        kind=jnp.concatenate([lanes[:, 3].astype(jnp.int32), jnp.zeros(pad, jnp.int32)]),
        on_route=jnp.concatenate([(lanes[:, 4] > 0.5) & valid, jnp.zeros(pad, bool)]),
    ), cl, valid_all[:, None] & jnp.ones((1, sizes.centerline_points), bool), jnp.concatenate(
        [(lanes[:, 6] > 0.5) & valid, jnp.zeros(pad, bool)]
    )


def _render_strips(lay, sizes: SceneSizes):
    st = lay["strips"]
    p = lay["paths"][st[:, 0].astype(jnp.int32)]
    verts = P.strip_polygon(p, st[:, 1], st[:, 2], st[:, 4], st[:, 5], sizes.drivable_vertices // 2)
    valid = st[:, 6] > 0.5
    verts = jnp.where(valid[:, None, None], verts, 0.0)
    pad = sizes.num_drivable - st.shape[0]
    return Polygons(
        vertices=jnp.concatenate([verts, jnp.zeros((pad,) + verts.shape[1:])]),
        valid=jnp.concatenate([valid, jnp.zeros(pad, bool)]),
        kind=jnp.concatenate([st[:, 3].astype(jnp.int32), jnp.zeros(pad, jnp.int32)]),
        on_route=jnp.zeros(sizes.num_drivable, bool),
    )


def _select(pred, a, b):
    return jax.tree.map(lambda x, y: jnp.where(pred, x, y), a, b)


def _draw_header(key, cfg: GeneratorConfig, hard_fraction=None):
    r = UniformPool(key)
    hard = r.u() < (cfg.hard_fraction if hard_fraction is None else hard_fraction)
    hard_kind = jnp.where(hard, r.randint(0, 4), HardKind.NONE)
    cum = np.cumsum(cfg.kind_probs) / sum(cfg.kind_probs)
    normal_kind = jnp.sum(r.u() > jnp.asarray(cum[:-1], jnp.float32))
    hard_map = jnp.array([SceneKind.STRAIGHT, SceneKind.CURVE, SceneKind.STRAIGHT, SceneKind.INTERSECTION])
    kind = jnp.where(hard, hard_map[jnp.maximum(hard_kind, 0)], normal_kind)
    return r, hard, hard_kind, kind


def generate_scene(key: jax.Array, scene_id, config: GeneratorConfig = GeneratorConfig(), hard_fraction=None) -> Scene:
    """One scene (no batch dims) from a PRNG key; jittable and vmappable.

    ``hard_fraction`` (traceable) overrides ``config.hard_fraction`` when given.
    """
    cfg = config
    r, hard, hard_kind, kind = _draw_header(key, cfg, hard_fraction)
    speed_limit = jnp.select(
        [kind == SceneKind.INTERSECTION, kind == SceneKind.MERGE], [r.u(10.0, 14.0), r.u(16.0, 25.0)], r.u(12.0, 25.0)
    )
    desired = speed_limit * r.u(0.8, 1.0)
    ego_speed = desired * r.u(0.5, 1.05)
    ego_speed = jnp.where(r.u() < 0.05, 0.0, ego_speed)
    ego_speed = jnp.select(
        [hard_kind == HardKind.STOPPED_AHEAD, hard_kind == HardKind.SHARP_CURVE, hard_kind == HardKind.BRAKING_LEAD, hard_kind == HardKind.SHARP_TURN],
        [r.u(8.0, 15.0), r.u(8.0, 12.0), r.u(12.0, 18.0), r.u(7.0, 10.0)],
        ego_speed,
    )
    road = road_layout(r, cfg.lane_width, kind == SceneKind.CURVE, hard_kind == HardKind.SHARP_CURVE)
    # on a sharp curve the ego already drives about the comfortable curve speed
    ego_speed = jnp.where(
        hard_kind == HardKind.SHARP_CURVE, jnp.minimum(ego_speed, 0.95 * curve_speed(road["paths"][0])), ego_speed
    )
    speed_limit = jnp.maximum(speed_limit, ego_speed)
    desired = jnp.maximum(desired, ego_speed)
    inter = intersection_layout(
        r, cfg.lane_width, hard_kind == HardKind.SHARP_TURN, ego_speed, r.u() < cfg.red_prob
    )
    merge = merge_layout(r, cfg.lane_width)
    lay = _select(kind == SceneKind.MERGE, merge, _select(kind == SceneKind.INTERSECTION, inter, road))

    agents = _make_agents(r, lay, cfg, ego_speed, speed_limit, hard_kind, kind)
    route = lay["paths"][0]
    s_traj, v_traj, a0 = _expert(cfg, route, agents, ego_speed, desired, lay["stop_s"])
    # the follower (slot 1) drives the expert's speed profile a fixed gap behind: it never
    # runs into the ego (the expert ignores objects behind it, so order does not matter)
    fpose = P.path_pose(route, s_traj - agents.pop("fol_gap"), agents.pop("fol_offset"))
    agents["x"] = agents["x"].at[1].set(fpose[:, 0])
    agents["y"] = agents["y"].at[1].set(fpose[:, 1])
    agents["heading"] = agents["heading"].at[1].set(wrap_angle(fpose[:, 2]))
    agents["vx"] = agents["vx"].at[1].set(v_traj * jnp.cos(fpose[:, 2]))
    agents["vy"] = agents["vy"].at[1].set(v_traj * jnp.sin(fpose[:, 2]))
    out_idx = (jnp.arange(NUM_OUTPUT_POSES) + 1) * 5
    expert = P.path_pose(route, s_traj[out_idx])
    expert = expert.at[:, 2].set(wrap_angle(expert[:, 2]))

    sizes = cfg.sizes
    kappa0 = P.curvature_at(route, jnp.full((1,), BEHIND))[0]
    a0 = jnp.where(ego_speed > 0.0, a0, jnp.maximum(a0, 0.0))
    hp, hv, ha = history_from_motion_jax(ego_speed, jnp.minimum(a0, ego_speed / 1.5), ego_speed * kappa0)
    ego = EgoState(
        velocity=jnp.stack([ego_speed, 0.0]),
        acceleration=jnp.stack([a0, ego_speed**2 * kappa0]),
        steering_angle=jnp.arctan(EGO.wheel_base * kappa0),
        history_poses=hp,
        history_velocity=hv,
        history_acceleration=ha,
        # the history turns at the constant t0 yaw rate
        history_yaw_rate=jnp.full(hp.shape[:1], ego_speed * kappa0),
        history_yaw_accel=jnp.zeros(hp.shape[:1]),
        history_valid=jnp.asarray(True),
    )
    n_slots = agents["x"].shape[0]
    pad = sizes.num_agents - n_slots

    def pad_agents(a, fill=0.0):
        return jnp.concatenate([a, jnp.full((pad,) + a.shape[1:], fill, a.dtype)])

    agents_out = Agents(
        x=pad_agents(agents["x"]), y=pad_agents(agents["y"]), z=jnp.zeros((sizes.num_agents, NUM_OBS_STEPS)),
        heading=pad_agents(agents["heading"]), vx=pad_agents(agents["vx"]), vy=pad_agents(agents["vy"]),
        length=pad_agents(agents["length"], 1.0), width=pad_agents(agents["width"], 1.0),
        height=pad_agents(agents["height"], 1.0), agent_type=pad_agents(agents["agent_type"]),
        valid=pad_agents(agents["valid"], False),
    )
    lanes, cl, cl_valid, red = _render_lanes(lay, sizes)
    red_t = red[:, None] & jnp.ones((1, NUM_OBS_STEPS), bool)
    rs = jnp.linspace(0.0, lay["route_len"], sizes.route_points)
    route_pts = P.path_pose(route, rs)[:, :2]
    return Scene(
        ego=ego,
        agents=agents_out,
        map=MapData(
            drivable=_render_strips(lay, sizes), lanes=lanes, lane_centerlines=cl, lane_centerline_valid=cl_valid,
            red_light=red_t, speed_limit=speed_limit,
        ),
        route=Route(points=route_pts, valid=jnp.ones(sizes.route_points, bool)),
        command=lay["command"],
        expert=expert,
        expert_valid=jnp.asarray(True),
        scene_id=jnp.asarray(scene_id, jnp.int32),
    )


@functools.partial(jax.jit, static_argnames=("num_scenes", "config"))
def _generate(key, hard_fraction, start_id, num_scenes: int, config: GeneratorConfig) -> Scene:
    ids = jnp.arange(num_scenes) + start_id
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(ids)
    return jax.vmap(lambda k, i: generate_scene(k, i, config, hard_fraction))(keys, ids)


def generate_scenes(key: jax.Array, num_scenes: int, config: GeneratorConfig = GeneratorConfig(), start_id: int = 0) -> Scene:
    """Generates ``num_scenes`` scenes, batch dim (num_scenes,); scene i uses fold_in(key, start_id + i).

    Deterministic per key; ``scene_id`` = start_id + i. Sizes follow ``config.sizes``.
    """
    if num_scenes < 1:
        raise ValueError(f"num_scenes must be >= 1, got {num_scenes}")
    if not 0.0 <= config.hard_fraction <= 1.0:
        raise ValueError(f"hard_fraction must be in [0, 1], got {config.hard_fraction}")
    sz = config.sizes
    if sz.num_agents < _NUM_SLOTS or sz.num_lanes < MAX_LANES or sz.num_drivable < MAX_STRIPS:
        raise ValueError(
            f"sizes too small for the generator: need num_agents >= {_NUM_SLOTS}, num_lanes >= {MAX_LANES}, "
            f"num_drivable >= {MAX_STRIPS}; got {sz}"
        )
    if sz.lane_vertices % 2 or sz.drivable_vertices % 2 or min(sz.lane_vertices, sz.drivable_vertices) < 8:
        raise ValueError(f"lane_vertices and drivable_vertices must be even and >= 8; got {sz}")
    if min(sz.centerline_points, sz.route_points) < 2:
        raise ValueError(f"centerline_points and route_points must be >= 2; got {sz}")
    # hard_fraction and start_id are traced: changing them does not recompile
    static = dataclasses.replace(config, hard_fraction=0.0)
    return _generate(key, jnp.float32(config.hard_fraction), jnp.int32(start_id), int(num_scenes), static)


def scene_labels(key: jax.Array, num_scenes: int, config: GeneratorConfig = GeneratorConfig(), start_id: int = 0):
    """(kind, hard_kind) int arrays (num_scenes,) drawn for ``generate_scenes(key, num_scenes, config, start_id)``.

    kind: :class:`SceneKind`; hard_kind: :class:`HardKind` (-1 = a normal scene).
    """
    return _labels(key, jnp.int32(start_id), int(num_scenes), config)


@functools.partial(jax.jit, static_argnames=("num_scenes", "config"))
def _labels(key, start_id, num_scenes: int, config: GeneratorConfig):
    ids = jnp.arange(num_scenes) + start_id
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(ids)
    return jax.vmap(lambda k: _draw_header(k, config)[:-3:-1])(keys)
