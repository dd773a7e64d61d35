"""Reference PDM scorer: numpy + shapely + scipy, one proposal at a time, written like
NAVSIM v1.1 does it (Python loops over steps and objects). It is the slow, independent
peer of :mod:`jax_drive.pdm` and is used only by tests and benchmarks.

Conventions (NAVSIM v1.1 semantics; see docs in /work/shared/reference/navsim_pdm.md):
  * the proposal (8 poses at 0.5 s) and the PDM-Closed reference (40 poses at 0.1 s) are
    given in the ego rear-axle frame at t0; both get the t0 ego pose in front, are resampled
    to 41 states (0 .. 4 s, 0.1 s) and re-simulated with the LQR tracker + bicycle model;
  * point-in-polygon tests are strict (shapely ``contains``), object overlap tests count
    touching (shapely ``intersects``);
  * an object's class and speed come from its first valid observation step, its position
    from the current step;
  * the relative angle between the ego heading and the ego->object vector is
    ``arccos(clip(dot, -1, 1))``; an object centred exactly on the ego rear axle has no
    direction and counts as neither ahead nor behind (nuPlan yields NaN there).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import shapely
from scipy.signal import savgol_filter

from jax_drive.pdm_reference.config import ReferenceConfig, as_reference_config
from jax_drive.pdm_reference.geometry import _SceneGeometry, ego_areas, ego_coords, relative_angle
from jax_drive.pdm_reference.simulation import (
    AX,
    AY,
    HEADING,
    NUM_STATE,
    STEER,
    VX,
    VY,
    X,
    Y,
    interpolate_poses,
    simulate,
    unsimulated_states,
)


# --------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------


def no_at_fault_collisions(states, coords, areas, geo: _SceneGeometry, cfg: ReferenceConfig) -> dict:
    """NC score and per-step at-fault hits (step (T,) bool, object (T,) int, -1 none)."""
    t_steps = states.shape[0]
    score = 1.0
    ignored: set[int] = set()
    step_hit = np.zeros(t_steps, dtype=bool)
    step_obj = np.full(t_steps, -1, dtype=np.int64)
    behind = math.radians(cfg.behind_angle_deg)
    ego_polys = shapely.polygons(coords[:, :4])
    hit_matrix = shapely.intersects(ego_polys[:, None], geo.boxes.T[:t_steps]) & geo.valid.T[:t_steps]
    for t in range(t_steps):
        hits = np.flatnonzero(hit_matrix[t])
        if hits.size == 0:
            continue
        bumper = shapely.LineString([coords[t, 0], coords[t, 3]])
        speed = math.hypot(states[t, VX], states[t, VY])
        lateral_fault = bool(areas["multiple_lanes"][t] or areas["non_drivable"][t])
        for n in hits:
            if n in ignored:
                continue
            box = geo.boxes[n, t]
            if speed <= cfg.collision_stopped_speed:
                at_fault = False  # stopped ego
            elif geo.is_stopped_track[n]:
                at_fault = True  # stopped track
            elif relative_angle(states[t, :3], (geo.ax[n, t], geo.ay[n, t])) > behind:
                at_fault = False  # active rear
            elif shapely.intersects(bumper, box):
                at_fault = True  # active front
            else:
                at_fault = lateral_fault  # active lateral
            if at_fault:
                value = 0.0 if geo.is_moving_type[n] else cfg.static_collision_score
                score = min(score, value)
                if not step_hit[t]:
                    step_obj[t] = n
                step_hit[t] = True
            else:
                ignored.add(int(n))
    return {"score": score, "step": step_hit, "object": step_obj}


def time_to_collision(
    states, coords, areas, geo: _SceneGeometry, cfg: ReferenceConfig, last_step: int | None = None
) -> dict:
    """TTC score and per-step infractions (step (T,) bool, object (T,) int, frame (T,) int).
    ``last_step``: only steps t <= last_step are checked (NAVSIM v2: 31)."""
    t_steps = states.shape[0]
    score = 1.0
    ignored: set[int] = set()
    step_hit = np.zeros(t_steps, dtype=bool)
    step_obj = np.full(t_steps, -1, dtype=np.int64)
    step_frame = np.full(t_steps, -1, dtype=np.int64)
    ahead = math.radians(cfg.ahead_angle_deg)
    behind = math.radians(cfg.behind_angle_deg)
    speeds = np.hypot(states[:, VX], states[:, VY])
    future = np.asarray(cfg.ttc_future_steps)
    direction = np.stack([np.cos(states[:, HEADING]), np.sin(states[:, HEADING])], -1)  # (T, 2)
    shift = (speeds[:, None, None] * direction[:, None, :]) * (future[None, :, None] * cfg.dt)  # (T, D, 2)
    projected = shapely.polygons(coords[:, None, :4] + shift[:, :, None, :])  # (T, D)
    frames = np.arange(t_steps)[:, None] + future[None, :]  # (T, D)
    in_range = frames < geo.num_frames
    frames_c = np.minimum(frames, geo.num_frames - 1)
    boxes = geo.boxes.T[frames_c]  # (T, D, N)
    hit_matrix = shapely.intersects(projected[..., None], boxes) & geo.valid.T[frames_c] & in_range[..., None]
    rear_axles = shapely.points(states[:, X], states[:, Y])
    in_intersection = np.zeros(t_steps, dtype=bool)
    for poly in geo.intersections:
        in_intersection |= shapely.within(rear_axles, poly)
    for t in range(t_steps):
        if last_step is not None and t > last_step:
            break
        if not hit_matrix[t].any():
            continue
        risky = bool(areas["multiple_lanes"][t] or areas["non_drivable"][t] or in_intersection[t])
        for di, d in enumerate(future):
            frame = t + int(d)
            for n in np.flatnonzero(hit_matrix[t, di]):
                if n in ignored:
                    continue
                if speeds[t] < cfg.ttc_stopped_speed:
                    continue
                angle = relative_angle(states[t, :3], (geo.ax[n, frame], geo.ay[n, frame]))
                if angle < ahead or (risky and not angle > behind):
                    score = 0.0
                    if not step_hit[t]:
                        step_obj[t], step_frame[t] = n, frame
                    step_hit[t] = True
                else:
                    ignored.add(int(n))
    return {"score": score, "step": step_hit, "object": step_obj, "frame": step_frame}


def _centre_in_intersection(coords, geo: _SceneGeometry) -> np.ndarray:
    """(T,) the ego centre lies strictly inside an intersection polygon."""
    inside = np.zeros(coords.shape[0], dtype=bool)
    for poly in geo.intersections:
        inside |= shapely.contains_xy(poly, coords[:, 4, 0], coords[:, 4, 1])
    return inside


def traffic_light_compliance(coords, geo: _SceneGeometry) -> float:
    """TLC (NAVSIM v2): 0 if the ego box ever intersects an on-route lane connector whose
    light is red at that step, else 1."""
    if not geo.red_connectors:
        return 1.0
    ego_polys = shapely.polygons(coords[:, :4])
    for poly, red in geo.red_connectors:
        steps = min(coords.shape[0], red.shape[0])
        hit = shapely.intersects(ego_polys[:steps], poly) & red[:steps]
        if hit.any():
            return 0.0
    return 1.0


def lane_keeping(coords, geo: _SceneGeometry, cfg: ReferenceConfig) -> float:
    """LK (NAVSIM v2): 0 when the centre is more than 0.5 m from the route centreline for
    20 consecutive steps; steps with the centre inside an intersection are skipped."""
    in_intersection = _centre_in_intersection(coords, geo)
    distances = shapely.distance(shapely.points(coords[:, 4]), geo.centerline)
    run = 0
    for t in range(coords.shape[0]):
        if in_intersection[t]:
            continue
        run = run + 1 if distances[t] > cfg.lane_keeping_deviation else 0
        if run >= cfg.lane_keeping_steps:
            return 0.0
    return 1.0


def driving_direction_compliance(coords, areas, cfg: ReferenceConfig, geo=None) -> float:
    """DDC from the centre's displacement while off the on-route lanes. With ``geo``
    (NAVSIM v2) steps whose centre lies inside an intersection do not count."""
    centre = coords[:, 4]
    step = np.zeros(centre.shape[0])
    step[1:] = np.linalg.norm(np.diff(centre, axis=0), axis=-1)
    step[~areas["oncoming"]] = 0.0
    if geo is not None:
        step[_centre_in_intersection(coords, geo)] = 0.0
    horizon = int(cfg.driving_direction_horizon / cfg.dt)
    worst = max(step[max(0, t - horizon) : t + 1].sum() for t in range(step.shape[0]))
    if worst < cfg.driving_direction_compliance_threshold:
        return 1.0
    if worst < cfg.driving_direction_violation_threshold:
        return 0.5
    return 0.0


def raw_progress(coords, geo: _SceneGeometry) -> float:
    """Arc length along the route of the ego centre at the end minus at the start, >= 0."""
    start = geo.centerline.project(shapely.Point(coords[0, 4]))
    end = geo.centerline.project(shapely.Point(coords[-1, 4]))
    return max(0.0, float(end - start))


_SAVGOL_CACHE: dict = {}


def _savgol_matrix(n: int, window: int, poly: int, deriv: int, delta: float) -> np.ndarray:
    """(n, n) matrix M with M @ y == scipy.signal.savgol_filter(y, window, poly, deriv, delta)
    (mode 'interp'); the filter is linear, so M is scipy's filter applied to the identity."""
    key = (n, window, poly, deriv, delta)
    if key not in _SAVGOL_CACHE:
        eye = np.eye(n)
        _SAVGOL_CACHE[key] = savgol_filter(
            eye, window_length=window, polyorder=poly, deriv=deriv, delta=delta, axis=0
        )
    return _SAVGOL_CACHE[key]


def comfort_checks(states: np.ndarray, cfg: ReferenceConfig) -> dict:
    """The six comfort checks (bool each) over (T, 11) states, NAVSIM v1.1 filters."""
    n = states.shape[0]
    dt = cfg.dt
    dec = cfg.comfort_decimals

    def smooth(values, window):
        return np.round(_savgol_matrix(n, min(window, n), 2, 0, dt) @ values, dec)

    def deriv(values, window, poly, order):
        return _savgol_matrix(n, min(window, n), poly, order, dt) @ values

    ax, ay = states[:, AX], states[:, AY]
    lon_acc = smooth(ax, n)
    lat_acc = smooth(ay, n)
    mag_jerk = np.round(deriv(smooth(np.hypot(ax, ay), 8), n, 2, 1), dec)
    lon_jerk = np.round(deriv(smooth(ax, 8), n, 2, 1), dec)
    heading = states[:, HEADING]
    unwrapped = heading.copy()
    unwrapped[1:] = heading[1:] - 2 * np.pi * np.cumsum(np.round(np.diff(heading) / (2 * np.pi)))
    yaw_rate = np.round(deriv(unwrapped, 5, 2, 1), dec)
    yaw_acc = np.round(deriv(unwrapped, 5, 3, 2), dec)

    def within(v, lo, hi):
        return bool(np.all((v > lo) & (v < hi)))

    return {
        "lon_accel": within(lon_acc, cfg.min_lon_accel, cfg.max_lon_accel),
        "lat_accel": within(lat_acc, -cfg.max_abs_lat_accel, cfg.max_abs_lat_accel),
        "jerk": within(mag_jerk, -cfg.max_abs_mag_jerk, cfg.max_abs_mag_jerk),
        "lon_jerk": within(lon_jerk, -cfg.max_abs_lon_jerk, cfg.max_abs_lon_jerk),
        "yaw_accel": within(yaw_acc, -cfg.max_abs_yaw_accel, cfg.max_abs_yaw_accel),
        "yaw_rate": within(yaw_rate, -cfg.max_abs_yaw_rate, cfg.max_abs_yaw_rate),
    }


# --------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------


def initial_state(scene: Any, origin: np.ndarray) -> np.ndarray:
    """(11,) NAVSIM state array of the t0 ego state placed at ``origin`` (x, y, heading)."""
    state = np.zeros(NUM_STATE)
    state[:3] = origin
    vel = np.asarray(scene.ego.velocity, np.float64)
    acc = np.asarray(scene.ego.acceleration, np.float64)
    state[VX], state[VY] = vel[0], vel[1]
    state[AX], state[AY] = acc[0], acc[1]
    state[STEER] = float(np.asarray(scene.ego.steering_angle))
    return state


def simulate_trajectory(
    scene: Any, poses: np.ndarray, pose_dt: float, config=None, origin=None
) -> np.ndarray:
    """Interpolates ego-frame ``poses`` (K, 3) at ``pose_dt`` and (optionally) re-simulates
    them -> (41, 11) state arrays in the scene frame."""
    cfg = as_reference_config(config)
    origin = np.zeros(3) if origin is None else np.asarray(origin, np.float64)
    target = interpolate_poses(origin, np.asarray(poses, np.float64), pose_dt, cfg.dt, cfg.num_steps)
    init = initial_state(scene, origin)
    return simulate(target, init, cfg) if cfg.simulate else unsimulated_states(target, init)


def _evaluate(states, geo, cfg, full: bool) -> dict:
    coords = ego_coords(states, cfg)
    areas = ego_areas(coords, geo)
    nc = no_at_fault_collisions(states, coords, areas, geo, cfg)
    out = {
        "coords": coords,
        "areas": areas,
        "nc": nc,
        "dac": 0.0 if areas["non_drivable"].any() else 1.0,
        "progress": raw_progress(coords, geo),
    }
    out["ddc_v2"] = driving_direction_compliance(coords, areas, cfg, geo)
    out["tlc"] = traffic_light_compliance(coords, geo)
    if full:
        out["ttc"] = time_to_collision(states, coords, areas, geo, cfg)
        out["ttc_v2"] = time_to_collision(states, coords, areas, geo, cfg, last_step=cfg.ttc_v2_last_step)
        out["ddc"] = driving_direction_compliance(coords, areas, cfg)
        out["lk"] = lane_keeping(coords, geo, cfg)
        out["comfort_checks"] = comfort_checks(states, cfg)
    return out


def per_pose(step_mask: np.ndarray, num_poses: int = 8, per: int = 5) -> np.ndarray:
    """(num_poses,) bool: pose k is flagged when any step 5k+1 .. 5k+5 is."""
    return np.array([bool(step_mask[per * k + 1 : per * k + per + 1].any()) for k in range(num_poses)])


class ReferenceScorer:
    """Scores proposals of one scene; the scene geometry and the simulated PDM-Closed
    reference are built once per instance (nothing is kept between instances).

    Args:
      scene_np: one Scene with numpy leaves and no batch dims (see :func:`scene_to_numpy`),
        in the frame in which ``origin`` is the t0 ego rear-axle pose.
      config: :class:`ReferenceConfig`, or another config whose ``simulate`` flag is used.
      origin: (3,) t0 ego pose in the scene frame; default (0, 0, 0) (ego-frame scenes).
    """

    def __init__(self, scene_np: Any, config=None, origin: np.ndarray | None = None):
        self.cfg = as_reference_config(config)
        self.scene = scene_np
        self.origin = np.zeros(3) if origin is None else np.asarray(origin, np.float64)
        self.geo = _SceneGeometry(scene_np, self.cfg)
        self._reference_key = None
        self._reference_eval = None

    def _reference(self, reference: np.ndarray) -> dict:
        key = reference.tobytes()
        if key != self._reference_key:
            states = simulate_trajectory(self.scene, reference, self.cfg.dt, self.cfg, self.origin)
            self._reference_eval = _evaluate(states, self.geo, self.cfg, full=False)
            self._reference_eval["states"] = states
            self._reference_key = key
        return self._reference_eval

    def score(self, proposal: np.ndarray, reference: np.ndarray) -> dict:
        """Scores one proposal; see :func:`score_proposal_reference` for shapes and outputs."""
        cfg = self.cfg
        proposal = np.asarray(proposal, np.float64)
        reference = np.asarray(reference, np.float64)
        if proposal.shape != (8, 3):
            raise ValueError(f"proposal must have shape (8, 3), got {proposal.shape}")
        if reference.shape != (40, 3):
            raise ValueError(f"reference must have shape (40, 3), got {reference.shape}")
        if not (np.all(np.isfinite(proposal)) and np.all(np.isfinite(reference))):
            raise ValueError("proposal and reference must be finite")
        ref = self._reference(reference)
        prop_states = simulate_trajectory(self.scene, proposal, cfg.output_dt, cfg, self.origin)
        prop = _evaluate(prop_states, self.geo, cfg, full=True)

        nc, dac = prop["nc"]["score"], prop["dac"]
        multiplier = nc * dac
        masked = prop["progress"] * multiplier
        ref_masked = ref["progress"] * ref["nc"]["score"] * ref["dac"]
        best = max(masked, ref_masked)
        if best > cfg.progress_distance_threshold:
            ep = masked / best
        else:
            ep = 0.0 if multiplier == 0.0 else 1.0
        ttc = prop["ttc"]["score"]
        comfort = 1.0 if all(prop["comfort_checks"].values()) else 0.0
        ddc = prop["ddc"]
        weights = cfg.progress_weight + cfg.ttc_weight + cfg.comfort_weight + cfg.driving_direction_weight
        weighted = (
            cfg.progress_weight * ep
            + cfg.ttc_weight * ttc
            + cfg.comfort_weight * comfort
            + cfg.driving_direction_weight * ddc
        ) / weights
        # NAVSIM v2 progress: multipliers NC, DAC, DDC, TLC mask the normaliser only.
        mult_v2 = multiplier * prop["ddc_v2"] * prop["tlc"]
        ref_mult_v2 = ref["nc"]["score"] * ref["dac"] * ref["ddc_v2"] * ref["tlc"]
        norm_v2 = max(prop["progress"] * mult_v2, ref["progress"] * ref_mult_v2)
        if norm_v2 > cfg.progress_distance_threshold:
            ep_v2 = min(1.0, max(0.0, prop["progress"] / norm_v2))
        else:
            ep_v2 = 1.0
        non_drivable = prop["areas"]["non_drivable"]
        return {
            "tlc": prop["tlc"],
            "lk": prop["lk"],
            "ttc_v2": prop["ttc_v2"]["score"],
            "ep_v2": ep_v2,
            "ddc_v2": prop["ddc_v2"],
            "nc": nc,
            "dac": dac,
            "ddc": ddc,
            "ttc": ttc,
            "ep": ep,
            "comfort": comfort,
            "pdms": multiplier * weighted,
            "progress": prop["progress"],
            "reference_progress": ref["progress"],
            "reference_nc": ref["nc"]["score"],
            "reference_dac": ref["dac"],
            "comfort_checks": prop["comfort_checks"],
            "dac_step": non_drivable,
            "nc_step": prop["nc"]["step"],
            "nc_object": prop["nc"]["object"],
            "ttc_step": prop["ttc"]["step"],
            "ttc_object": prop["ttc"]["object"],
            "dac_point": per_pose(non_drivable),
            "nc_point": per_pose(prop["nc"]["step"]),
            "ttc_point": per_pose(prop["ttc"]["step"]),
            "areas": prop["areas"],
            "states": prop_states,
            "reference_states": ref["states"],
        }


def score_proposal_reference(
    scene_np: Any,
    proposal: np.ndarray,
    reference: np.ndarray,
    config=None,
    origin: np.ndarray | None = None,
) -> dict:
    """Scores one proposal against the PDM-Closed reference, NAVSIM v1.1 style.

    Args:
      scene_np: one Scene with numpy leaves and no batch dims (see :func:`scene_to_numpy`),
        in the frame in which ``origin`` is the t0 ego rear-axle pose.
      proposal: (8, 3) poses at 0.5 .. 4.0 s in the ego frame at t0.
      reference: (40, 3) PDM-Closed poses at 0.1 .. 4.0 s in the ego frame at t0.
      config: :class:`ReferenceConfig`, or another config whose ``simulate`` flag is used.
      origin: (3,) t0 ego pose in the scene frame; default (0, 0, 0) (ego-frame scenes).
    Returns: dict with floats nc, dac, ddc, ttc, ep, comfort, pdms, progress (raw metres),
      reference_progress, reference_nc, reference_dac; NAVSIM v2 parts tlc, lk, ttc_v2,
      ep_v2, ddc_v2 (HC, EC and EPDMS are not computed by the reference);
      comfort_checks (dict of six bools);
      per-step arrays (41,) dac_step, nc_step, nc_object, ttc_step, ttc_object;
      per-pose arrays (8,) dac_point, nc_point, ttc_point (pose k covers steps 5k+1 .. 5k+5);
      areas (dict of (41,) masks); states and reference_states (41, 11).
    Raises: ValueError on wrong shapes or non-finite poses.
    """
    return ReferenceScorer(scene_np, config, origin).score(proposal, reference)
