"""PDM rules on simulated ego states of ONE scene (vectorised over trajectories and steps).

Stages, each a typed result: :func:`scene_arrays` (:class:`SceneArrays`, once per scene) ->
:func:`run_steps` (:class:`StepResults`: footprint masks, NC and TTC per step) -> one named
function per metric returning a :class:`MetricResult` (value and validity, as Waymax's
metrics do): :func:`no_at_fault_collisions`, :func:`drivable_area_compliance`,
:func:`time_to_collision`, :func:`traffic_light_compliance`,
:func:`driving_direction_compliance`, :func:`ego_progress`, :func:`lane_keeping`,
:func:`comfort`, :func:`history_comfort`.

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

from jax_drive.geometry import project_on_polyline, rectangles_overlap
from jax_drive.pdm.comfort import is_comfortable_v1, is_comfortable_v2
from jax_drive.pdm.config import PDMConfig
from jax_drive.pdm.polygons import BandTable, MapBudget, build_band_table, inside_bits, inside_bits_brute, pack_bits
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
    # The ego rectangle is axis-aligned in its own frame: cos 1, sin 0.
    return rectangles_overlap(lon - ego_lon, lat, 1.0, 0.0, ego_hl, ego_hw, crel, srel, obj_hl, obj_hw)


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


@chex.dataclass(frozen=True)
class SceneArrays:
    """Scene data re-laid out for the vectorised steps (one scene, no batch dims).

    obj_x, obj_y, obj_heading, obj_valid: (F, N) per frame.
    obj_half_l, obj_half_w: (N,) half length / width.
    obj_agent: (N,) bool moving-agent class (collision with it scores 0, else 0.5).
    obj_stopped: (N,) bool stopped track (not a moving agent, or first-frame speed <= 0.05).
    obj_index: (N,) int32 the objects' indices in the scene (with a budget only the objects
      valid in some frame are kept, in scene order, so N can be smaller than the scene's).
    drivable_vertices (Pd, V, 2), drivable_valid (Pd,); lane_vertices (Pl, V, 2), lane_valid (Pl,).
    drivable_table, lane_table: :class:`BandTable` or None (then brute-force tests).
    intersection_bits (Wd,), on_route_bits (Wl,), red_bits (F, Wl): intersection polygons,
      on-route lanes and red on-route lane connectors per frame, as polygon bit masks.
    red_vertices (L, V, 2), red_kept (F, L): vertices and per-frame red flags of the lanes
      that can be red (all lanes when no budget is given).
    route_points (R, 2), route_valid (R,).
    """

    obj_x: chex.Array
    obj_y: chex.Array
    obj_heading: chex.Array
    obj_valid: chex.Array
    obj_half_l: chex.Array
    obj_half_w: chex.Array
    obj_agent: chex.Array
    obj_stopped: chex.Array
    obj_index: chex.Array
    drivable_vertices: chex.Array
    drivable_valid: chex.Array
    lane_vertices: chex.Array
    lane_valid: chex.Array
    drivable_table: BandTable | None
    lane_table: BandTable | None
    intersection_bits: chex.Array
    on_route_bits: chex.Array
    red_bits: chex.Array
    red_vertices: chex.Array
    red_kept: chex.Array
    route_points: chex.Array
    route_valid: chex.Array


def t0_overlaps(scene, config: PDMConfig) -> chex.Array:
    """(N,) bool: objects present in the first frame whose box meets (touching included)
    the ego's box at t = 0 (NAVSIM v2's ``LogReplayTrafficAgents`` drops them)."""
    ag = scene.agents
    h0 = jnp.asarray(ag.heading[:, 0], jnp.float32)
    hit = ego_frame_overlap(jnp.asarray(ag.x[:, 0], jnp.float32), jnp.asarray(ag.y[:, 0], jnp.float32),
                            jnp.cos(h0), jnp.sin(h0), config.ego_rear_axle_to_center, config.ego_length / 2,
                            config.ego_width / 2, jnp.asarray(ag.length, jnp.float32) / 2,
                            jnp.asarray(ag.width, jnp.float32) / 2)
    return hit & jnp.asarray(ag.valid[:, 0], bool)


def scene_arrays(scene, config: PDMConfig, budget: MapBudget | None = None) -> SceneArrays:
    """Builds :class:`SceneArrays` from an unbatched Scene.

    ``budget`` (from :func:`jax_drive.pdm.polygons.map_budget` on the concrete scene batch)
    enables the band tables; None keeps the brute-force polygon tests (same results).
    With ``config.t0_overlap == "drop"`` the objects of :func:`t0_overlaps` are invalid in
    every frame.
    """
    ag = scene.agents
    valid = jnp.asarray(ag.valid, bool)
    if config.t0_overlap == "drop":
        valid = valid & ~t0_overlaps(scene, config)[:, None]
    first = jnp.argmax(valid, axis=-1)  # (N,)
    any_valid = jnp.any(valid, axis=-1)
    take = lambda a: jnp.take_along_axis(a, first[:, None], axis=-1)[:, 0]
    first_speed = jnp.hypot(take(ag.vx), take(ag.vy))
    agent = jnp.isin(ag.agent_type, jnp.asarray([int(t) for t in MOVING_AGENT_TYPES]))
    stopped = (~agent) | (first_speed <= config.collision_stopped_speed)
    lanes = scene.map.lanes
    red = (jnp.asarray(scene.map.red_light, bool) & lanes.valid[:, None] & lanes.on_route[:, None]
           & (lanes.kind[:, None] == 1)).T  # (F, Pl)
    f32 = lambda a: jnp.asarray(a, jnp.float32)
    drivable_vertices, drivable_valid = f32(scene.map.drivable.vertices), jnp.asarray(scene.map.drivable.valid, bool)
    lane_vertices, lane_valid = f32(lanes.vertices), jnp.asarray(lanes.valid, bool)
    intersection = drivable_valid & (scene.map.drivable.kind == int(PolygonType.INTERSECTION))
    on_route = jnp.asarray(lanes.on_route, bool) & lane_valid
    if budget is None:
        obj_index = jnp.arange(valid.shape[0], dtype=jnp.int32)
        tables = (None, None)
        red_vertices, red_kept = lane_vertices, red
    else:
        # Objects never valid cannot collide; stable order keeps first-index tie-breaks.
        obj_index = jnp.argsort(~any_valid, stable=True)[: budget.objects].astype(jnp.int32)
        tables = (build_band_table(drivable_vertices, drivable_valid, budget.drivable),
                  build_band_table(lane_vertices, lane_valid, budget.lanes))
        # Only lanes that are ever red can put a red vertex inside the ego box.
        kept = jnp.argsort(~jnp.any(red, axis=0), stable=True)[: budget.red_lanes]
        red_vertices, red_kept = lane_vertices[kept], red[:, kept]
    o = lambda a: jnp.asarray(a)[obj_index]
    return SceneArrays(
        obj_x=o(f32(ag.x)).T, obj_y=o(f32(ag.y)).T, obj_heading=o(f32(ag.heading)).T,
        obj_valid=o(valid & any_valid[:, None]).T,
        obj_half_l=o(f32(ag.length)) / 2, obj_half_w=o(f32(ag.width)) / 2,
        obj_agent=o(agent), obj_stopped=o(stopped), obj_index=obj_index,
        drivable_vertices=drivable_vertices, drivable_valid=drivable_valid,
        lane_vertices=lane_vertices, lane_valid=lane_valid,
        drivable_table=tables[0], lane_table=tables[1],
        intersection_bits=pack_bits(intersection), on_route_bits=pack_bits(on_route),
        red_bits=pack_bits(red), red_vertices=red_vertices, red_kept=red_kept,
        route_points=f32(scene.route.points), route_valid=jnp.asarray(scene.route.valid, bool),
    )


@chex.dataclass(frozen=True)
class EgoFootprint:
    """Ego footprint points from rear-axle poses, leading dims (...) (e.g. (Q, T)).

    rear, centre, front (middle of the front bumper): (..., 2); corners: (..., 4, 2) in the
    order FL, RL, RR, FR; heading: (...).
    """

    rear: chex.Array
    centre: chex.Array
    front: chex.Array
    corners: chex.Array
    heading: chex.Array


def ego_footprint(x, y, h, config: PDMConfig) -> EgoFootprint:
    """:class:`EgoFootprint` of rear-axle poses x, y, h (...)."""
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
    return EgoFootprint(rear=rear, centre=centre, front=rear + config.ego_front_length * fwd,
                        corners=corners, heading=h)


@chex.dataclass(frozen=True)
class FootprintMasks:
    """Map masks of ego footprints, each (...) bool (the footprint's leading dims).

    multiple_lanes: more than one lane polygon holds a corner and none holds all four;
    non_drivable: a corner lies outside every drivable polygon; oncoming: the centre is in
    no on-route lane polygon; rear_in_intersection / centre_in_intersection: the rear axle /
    centre lies in an intersection polygon; red_light: the ego box meets an on-route lane
    connector that is red at that step.
    """

    multiple_lanes: chex.Array
    non_drivable: chex.Array
    oncoming: chex.Array
    rear_in_intersection: chex.Array
    centre_in_intersection: chex.Array
    red_light: chex.Array


def footprint_masks(geo: EgoFootprint, sa: SceneArrays, red_bits: chex.Array, red_kept: chex.Array,
                    config: PDMConfig) -> FootprintMasks:
    """Map masks for ego footprints.

    Args: geo with leading dims (...) (e.g. (Q, T)); red_bits (..., Wl) and red_kept
      (..., L): the red lanes at each footprint's step (from ``sa.red_bits`` /
      ``sa.red_kept``, broadcastable to the leading dims).
    The red-light test counts an ego corner / the centre inside a red connector, or one of
    the connector's vertices inside the ego box; a connector crossing the box with no
    vertex inside and no ego point inside is missed.
    """
    pts = jnp.concatenate([geo.corners, geo.centre[..., None, :], geo.rear[..., None, :]], -2)
    if sa.drivable_table is None:
        in_drv = inside_bits_brute(pts, sa.drivable_vertices, sa.drivable_valid)  # (..., 6, Wd)
        in_lane = inside_bits_brute(pts[..., :5, :], sa.lane_vertices, sa.lane_valid)  # (..., 5, Wl)
    else:
        in_drv = inside_bits(pts, sa.drivable_table)
        in_lane = inside_bits(pts[..., :5, :], sa.lane_table)
    hits = lambda bits: jnp.any(bits != 0, axis=-1)
    corner_lane = in_lane[..., :4, :]
    touched = corner_lane[..., 0, :] | corner_lane[..., 1, :] | corner_lane[..., 2, :] | corner_lane[..., 3, :]
    common = corner_lane[..., 0, :] & corner_lane[..., 1, :] & corner_lane[..., 2, :] & corner_lane[..., 3, :]
    lanes_touched = jnp.sum(jax.lax.population_count(touched), axis=-1)
    pts_in_red = jnp.any(hits(in_lane & red_bits[..., None, :]), axis=-1)
    # Red polygon vertices inside the ego box (box axes from the rear-axle heading).
    c, s_ = jnp.cos(geo.heading)[..., None, None], jnp.sin(geo.heading)[..., None, None]
    relx = sa.red_vertices[..., 0] - geo.centre[..., 0, None, None]  # (..., L, V)
    rely = sa.red_vertices[..., 1] - geo.centre[..., 1, None, None]
    lon = relx * c + rely * s_
    lat = -relx * s_ + rely * c
    vert_in = (jnp.abs(lon) <= config.ego_length / 2) & (jnp.abs(lat) <= config.ego_width / 2)
    vert_in_red = jnp.any(jnp.any(vert_in, -1) & red_kept, -1)
    return FootprintMasks(
        multiple_lanes=(lanes_touched > 1) & ~hits(common),
        non_drivable=jnp.sum(hits(in_drv[..., :4, :]), axis=-1) < 4,
        oncoming=~hits(in_lane[..., 4, :] & sa.on_route_bits),
        rear_in_intersection=hits(in_drv[..., 5, :] & sa.intersection_bits),
        centre_in_intersection=hits(in_drv[..., 4, :] & sa.intersection_bits),
        red_light=pts_in_red | vert_in_red)


def _first_true(mask: chex.Array, axis: int) -> chex.Array:
    """Index of the first True along ``axis``, or the axis length if none (keeps the axis)."""
    n = mask.shape[axis]
    # A min over an iota instead of argmax: XLA:CPU's variadic argmax reduce is slow.
    shape = [1] * mask.ndim
    shape[axis] = n
    iota = jnp.arange(n, dtype=jnp.int32).reshape(shape)
    return jnp.min(jnp.where(mask, iota, n), axis=axis, keepdims=True)


def _at_frames(a: chex.Array, n_steps: int, offsets: tuple[int, ...]) -> chex.Array:
    """a (F, ...) read at frames min(t + d, F - 1) for t < n_steps and d in ``offsets``
    (static, >= 0) -> (T, D, ...).

    Static slices of the edge-padded array: XLA:CPU runs a gather with an index array
    several times slower than these copies.
    """
    pad = max(max(offsets) + n_steps - a.shape[0], 0)
    padded = jnp.concatenate([a, jnp.broadcast_to(a[-1:], (pad,) + a.shape[1:])], 0)
    return jnp.stack([padded[d:d + n_steps] for d in offsets], axis=1)


def _to_ego(x, y, c, s, ox, oy, oc, os_):
    """Object centres / headings in the ego rear-axle frame (all args broadcast).

    Returns lon, lat (object centre), crel, srel (cos / sin of the relative heading).
    """
    dx, dy = ox - x, oy - y
    return c * dx + s * dy, -s * dx + c * dy, c * oc + s * os_, c * os_ - s * oc


@chex.dataclass(frozen=True)
class StepResults:
    """Per-step outputs of :func:`run_steps`, all (T, Q) unless noted.

    masks: :class:`FootprintMasks` with (T, Q) fields; centre: (T, Q, 2) ego centre;
    nc: NC score at that step (1 if no at-fault hit); nc_object: int32 scene index of the
    worst at-fault object (-1 none); ttc_fail: bool; ttc_object, ttc_frame: int32 the first
    failing object and the observation frame it was hit at (-1 none).
    """

    masks: FootprintMasks
    centre: chex.Array
    nc: chex.Array
    nc_object: chex.Array
    ttc_fail: chex.Array
    ttc_object: chex.Array
    ttc_frame: chex.Array


def run_steps(x: chex.Array, y: chex.Array, heading: chex.Array, speed: chex.Array, sa: SceneArrays,
              config: PDMConfig) -> StepResults:
    """The 41 scoring steps at once: masks, NC and TTC with their ignore lists.

    NAVSIM walks the steps in order and puts an object on an ignore list at its first
    harmless hit (NC: a not-at-fault collision; TTC: a projected overlap that is neither
    ahead nor risky), so later hits with it are skipped. Whether a hit is harmless never
    depends on the lists, hence an object is ignored at step k exactly when some earlier
    step (TTC: earlier (step, projection) pair in time-major order) had a harmless hit
    with it: the lists reduce to the index of the first harmless hit, and no sequential
    scan is needed.

    Args: x, y, heading, speed (Q, T) simulated rear-axle states; sa: SceneArrays.
    """
    h, v = heading, speed  # (Q, T)
    n_steps = x.shape[1]
    n_frames, n_obj = sa.obj_x.shape
    hl_ego, hw_ego = config.ego_length / 2, config.ego_width / 2
    centre_lon = config.ego_rear_axle_to_center
    geo = ego_footprint(x, y, h, config)
    masks = footprint_masks(geo, sa, sa.red_bits[:n_steps], sa.red_kept[:n_steps], config)  # (Q, T) each
    risky = masks.multiple_lanes | masks.non_drivable
    c, s = jnp.cos(h), jnp.sin(h)
    obj_cos, obj_sin = jnp.cos(sa.obj_heading), jnp.sin(sa.obj_heading)  # (F, N)
    ohl, ohw = sa.obj_half_l, sa.obj_half_w
    steps = jnp.arange(n_steps, dtype=jnp.int32)

    # Object centres and headings in the ego frame at frames t + d for the TTC projections
    # d (0, 3, 6, 9 frames); (Q, T, D, N). NC's boxes (step t against frame t) are the d = 0 slice.
    d_frames = jnp.asarray(config.ttc_future_frames, jnp.int32)  # (D,)
    n_d = d_frames.shape[0]
    ahead_t = np.arange(n_steps)[:, None] + np.asarray(config.ttc_future_frames)  # (T, D), static
    at = lambda a: _at_frames(a, n_steps, config.ttc_future_frames)
    fvalid = at(sa.obj_valid) & (ahead_t < n_frames)[..., None]  # (T, D, N)
    e = lambda a: a[..., None]
    e2 = lambda a: a[..., None, None]
    lon, lat, crel, srel = _to_ego(e2(x), e2(y), e2(c), e2(s), at(sa.obj_x), at(sa.obj_y),
                                   at(obj_cos), at(obj_sin))  # (Q, T, D, N)
    shift = centre_lon + (e(v) * (d_frames * config.dt))[..., None]  # (Q, T, D, 1)
    overlap = ego_frame_overlap(lon, lat, crel, srel, shift, hl_ego, hw_ego, ohl, ohw) & fvalid
    ahead, behind = ahead_behind(lon, lat, config)

    # ---- NC: ego box at step t against frame t; (Q, T, N).
    if config.ttc_future_frames[0] == 0:
        hit, nc_behind = overlap[:, :, 0], behind[:, :, 0]
        nc_lon, nc_lat, nc_crel, nc_srel = lon[:, :, 0], lat[:, :, 0], crel[:, :, 0], srel[:, :, 0]
    else:
        nc_lon, nc_lat, nc_crel, nc_srel = _to_ego(e(x), e(y), e(c), e(s), sa.obj_x[:n_steps], sa.obj_y[:n_steps],
                                                   obj_cos[:n_steps], obj_sin[:n_steps])
        hit = ego_frame_overlap(nc_lon, nc_lat, nc_crel, nc_srel, centre_lon, hl_ego, hw_ego, ohl, ohw)
        hit = hit & sa.obj_valid[:n_steps]
        _, nc_behind = ahead_behind(nc_lon, nc_lat, config)
    front = ego_frame_overlap(nc_lon, nc_lat, nc_crel, nc_srel, config.ego_front_length, 0.0, hw_ego, ohl, ohw)
    ego_moving = e(v > config.collision_stopped_speed)
    fault = ego_moving & (sa.obj_stopped | (~nc_behind & (front | e(risky))))
    first_harmless = _first_true(hit & ~fault, axis=1)  # (Q, 1, N)
    hit = hit & (steps[:, None] <= first_harmless)
    agent_score = jnp.where(sa.obj_agent, 0.0, config.static_collision_score)  # (N,)
    obj_score = jnp.where(hit & fault, agent_score, 1.0)
    nc = jnp.min(obj_score, axis=-1, initial=1.0)  # (Q, T)
    nc_obj = jnp.where(nc < 1.0, _first_true(obj_score == nc[..., None], axis=-1)[..., 0], -1)

    # ---- TTC: ego box moved by v * d * dt along its heading, against frames t + d.
    raw = overlap & e2(v >= config.ttc_stopped_speed)
    danger = ahead | (e2(risky | masks.rear_in_intersection) & ~behind)
    # Time-major (step, projection) order; reductions keep the (Q, T, D, N) layout (a
    # reshape to (Q, T, D * N) before reducing made XLA:CPU copy and run 3x slower).
    order = (steps[:, None] * n_d + jnp.arange(n_d, dtype=jnp.int32))[..., None]  # (T, D, 1)
    first_harmless = jnp.min(jnp.where(raw & ~danger, order, n_steps * n_d), axis=(1, 2), keepdims=True)
    fail = raw & danger & (order <= first_harmless)  # (Q, T, D, N)
    key = jnp.arange(n_d * n_obj, dtype=jnp.int32).reshape(n_d, n_obj)  # projection-major
    first = jnp.min(jnp.where(fail, key, n_d * n_obj), axis=(2, 3))  # (Q, T)
    fail_any = first < n_d * n_obj
    first = jnp.where(fail_any, first, 0)
    fail_obj = jnp.where(fail_any, first % n_obj, -1).astype(jnp.int32)
    fail_frame = jnp.where(fail_any, jnp.minimum(steps + d_frames[first // n_obj], n_frames - 1), -1)

    scene_index = lambda i: jnp.where(i >= 0, sa.obj_index[jnp.maximum(i, 0)], -1)
    return StepResults(
        masks=jax.tree_util.tree_map(lambda a: a.T, masks), centre=jnp.swapaxes(geo.centre, 0, 1),
        nc=nc.T, nc_object=scene_index(nc_obj).T, ttc_fail=fail_any.T, ttc_object=scene_index(fail_obj).T,
        ttc_frame=fail_frame.astype(jnp.int32).T)


# ---------------------------------------------------------------------------------------
# Metrics: one named function each, returning value and validity.


@chex.dataclass(frozen=True)
class MetricResult:
    """One metric for Q trajectories: value (Q,) float32 and valid (Q,) bool.

    ``valid`` is False where the metric is not defined by the scene's data (a route with
    fewer than 2 points for progress and lane keeping, no previous frame for extended
    comfort); the scorer then reports its documented default instead of ``value``.
    """

    value: chex.Array
    valid: chex.Array


def _always(value: chex.Array) -> MetricResult:
    return MetricResult(value=value, valid=jnp.ones(value.shape, bool))


def _pass_fail(failed: chex.Array) -> chex.Array:
    return jnp.where(failed, 0.0, 1.0).astype(jnp.float32)


def no_at_fault_collisions(steps: StepResults) -> MetricResult:
    """NC: the worst at-fault collision score over the steps (0 agent, 0.5 static, 1 none)."""
    return _always(jnp.min(steps.nc, axis=0))


def drivable_area_compliance(steps: StepResults) -> MetricResult:
    """DAC: 0 if a footprint corner leaves the drivable area at any step, else 1."""
    return _always(_pass_fail(jnp.any(steps.masks.non_drivable, axis=0)))


def time_to_collision(steps: StepResults, last_step: int | None = None) -> MetricResult:
    """TTC: 0 if a projected ego box fails at any step t <= last_step (None: all), else 1.
    NAVSIM v2 passes last_step = 31: its observation ends at 4 s."""
    fail = steps.ttc_fail if last_step is None else steps.ttc_fail[: last_step + 1]
    return _always(_pass_fail(jnp.any(fail, axis=0)))


def traffic_light_compliance(steps: StepResults) -> MetricResult:
    """TLC (v2): 0 if the ego box meets a red on-route lane connector at any step."""
    return _always(_pass_fail(jnp.any(steps.masks.red_light, axis=0)))


def driving_direction_compliance(steps: StepResults, config: PDMConfig, skip_intersections: bool) -> MetricResult:
    """DDC: the centre's displacement while oncoming, summed over windows t-10 .. t; the
    worst window < 2 m -> 1, < 6 m -> 0.5, else 0. ``skip_intersections`` (NAVSIM >= 2.1):
    steps whose centre lies in an intersection do not count."""
    oncoming = steps.masks.oncoming
    if skip_intersections:
        oncoming = oncoming & ~steps.masks.centre_in_intersection
    disp = jnp.linalg.norm(jnp.diff(steps.centre, axis=0), axis=-1)
    disp = jnp.concatenate([jnp.zeros_like(disp[:1]), disp], 0)
    cum = jnp.cumsum(jnp.where(oncoming, disp, 0.0), axis=0)
    w = config.ddc_horizon_steps + 1
    lagged = jnp.concatenate([jnp.zeros((w,) + cum.shape[1:], cum.dtype), cum[:-w]], 0)
    worst = jnp.max(cum - lagged, axis=0)
    return _always(jnp.where(worst < config.ddc_compliance_threshold, 1.0,
                             jnp.where(worst < config.ddc_violation_threshold, 0.5, 0.0)))


def _route_usable(sa: SceneArrays, shape: tuple[int, ...]) -> chex.Array:
    return jnp.broadcast_to(jnp.sum(sa.route_valid) >= 2, shape)


def ego_progress(steps: StepResults, sa: SceneArrays) -> MetricResult:
    """Raw progress (m) along the route: arc(centre at 4 s) - arc(centre at 0 s), >= 0.
    Invalid for a route with fewer than 2 valid points."""
    pts = jnp.stack([steps.centre[0], steps.centre[-1]], axis=-2)  # (Q, 2, 2)
    arc, _ = project_on_polyline(pts, sa.route_points, sa.route_valid)
    value = jnp.maximum(arc[..., 1] - arc[..., 0], 0.0)
    return MetricResult(value=value, valid=_route_usable(sa, value.shape))


def route_distance(centre: chex.Array, sa: SceneArrays) -> chex.Array:
    """Distance (...) of points (..., 2) to the route polyline (inf for a degenerate route).

    Same value as the distance of :func:`jax_drive.geometry.project_on_polyline`, computed
    with squared distances and one square root per point (it runs on 41 x Q points).
    """
    pts, valid = sa.route_points, sa.route_valid
    ax, ay = pts[:-1, 0], pts[:-1, 1]  # (R-1,)
    abx, aby = pts[1:, 0] - ax, pts[1:, 1] - ay
    seg_ok = valid[:-1] & valid[1:]
    inv = 1.0 / jnp.maximum(abx * abx + aby * aby, 1e-12)
    # x / y kept apart: XLA:CPU fuses these elementwise chains, not reductions over a size-2 axis.
    relx = centre[..., 0, None] - ax  # (..., R-1)
    rely = centre[..., 1, None] - ay
    t = jnp.clip((relx * abx + rely * aby) * inv, 0.0, 1.0)
    d2 = jnp.square(relx - t * abx) + jnp.square(rely - t * aby)
    return jnp.sqrt(jnp.min(jnp.where(seg_ok, d2, jnp.inf), axis=-1))


def lane_keeping(steps: StepResults, sa: SceneArrays, config: PDMConfig) -> MetricResult:
    """LK (v2): 0 once the centre is farther than ``lk_deviation_limit`` from the route for
    ``lk_steps`` consecutive counted steps; steps in an intersection neither count nor
    reset. Invalid for a route with fewer than 2 valid points."""
    deviation = route_distance(steps.centre, sa)  # (T, Q)

    def body(count, xs):
        dev, inter = xs
        new = jnp.where(dev > config.lk_deviation_limit, count + 1, 0)
        count = jnp.where(inter, count, new)
        return count, count >= config.lk_steps

    _, fails = jax.lax.scan(body, jnp.zeros(deviation.shape[1:], jnp.int32),
                            (deviation, steps.masks.centre_in_intersection))
    value = _pass_fail(jnp.any(fails, axis=0))
    return MetricResult(value=value, valid=_route_usable(sa, value.shape))


def comfort(ax: chex.Array, ay: chex.Array, heading: chex.Array, config: PDMConfig) -> MetricResult:
    """C (v1.1): the six comfort checks on (Q, 41) simulated signals."""
    return _always(is_comfortable_v1(ax, ay, heading, config))


def history_comfort(signals: dict, history: dict, config: PDMConfig) -> MetricResult:
    """HC (v2): the v2 comfort checks over the logged history followed by the simulated states
    (the 14 history states at -1.5 .. -0.2 s and the 41 simulated ones, read as one sequence
    at 0.1 s, as NAVSIM does). 1 where the scene has no logged history (NAVSIM: no past
    trajectory, no check).

    signals: (Q, 41) arrays ax, ay, heading, yaw_rate, yaw_accel; history: (H,) arrays of
    the same names (one scene's logged past) and ``valid`` (a scalar bool)."""
    q = signals["ax"].shape[0]
    cat = lambda name: jnp.concatenate(
        [jnp.broadcast_to(history[name], (q,) + history[name].shape), signals[name]], axis=-1)
    ok = is_comfortable_v2(cat("ax"), cat("ay"), cat("heading"), cat("yaw_rate"), cat("yaw_accel"), config)
    return _always(jnp.where(history["valid"], ok, 1.0))


def pose_windows(num_steps: int = 41, num_poses: int = 8, per_pose: int = 5) -> np.ndarray:
    """(num_poses, num_steps) bool: pose k covers steps 5k+1 .. 5k+5 (pose 0 also step 0)."""
    w = np.zeros((num_poses, num_steps), bool)
    for k in range(num_poses):
        w[k, per_pose * k + 1: per_pose * k + per_pose + 1] = True
    w[0, 0] = True
    return w
