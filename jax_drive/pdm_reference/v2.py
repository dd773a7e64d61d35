"""Reference NAVSIM v2 (EPDMS) scoring: numpy + shapely + scipy, one proposal at a time.

Written from NAVSIM v2.2's one-stage scoring (``pdm_score`` with ``LogReplayTrafficAgents``
and the default scorer config), independently of :mod:`jax_drive.pdm`:

* traffic: with ``drop_t0_overlaps`` every object present in the first frame whose box
  intersects (shapely, touching included) the ego's t0 box is removed from all frames;
* the simulation starts from the t0 ego state including its logged yaw rate and yaw
  acceleration (the last history state's); the past states' are 0 (NAVSIM reads the past
  through nuPlan's ``InterpolatedTrajectory``, whose rebuilt states carry none);
* HC: the comfort checks (S-G windows 8 / 15 / 5, values rounded to 8 decimals, strict
  bounds) over the 14 past states at -1.5 .. -0.2 s followed by the 41 simulated states,
  read as one sequence at 0.1 s; accelerations moved to the box centre with nuPlan's shifted
  acceleration (``a_x + d (w^2 + alpha)``, ``a_y``; the jerk magnitude from the rear axle's)
  or the rigid-body transfer; the past states' yaw rates 0, logged or finite differences;
  HC = 1 without a logged past;
* EP: raw progress over the larger of the two (reference, proposal) progresses masked by
  NC * DAC * DDC * TLC, clipped to [0, 1]; 1 when that is <= 5 m;
* human penalty filter: the human trajectory is simulated and scored alone (no past, so its
  HC is 1; its EP normalises itself); every multiplier / weighted metric it scores exactly 0
  on is 1 for the proposal;
* EPDMS = NC * DAC * DDC * TLC * (5 EP + 5 TTC + 2 LK + 2 HC [+ 2 EC]) / (14 [+ 2]), EC left
  out without a previous frame (``ec_without_previous`` "drop") or 1 ("one");
* two-frame EC (:func:`two_frame_extended_comfort`): the RMS differences of acceleration
  magnitude, jerk, yaw rate and yaw acceleration over the overlap of two frames 0.5 s apart.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import shapely
from scipy.signal import savgol_filter

from jax_drive.pdm_reference.config import as_reference_config
from jax_drive.pdm_reference.geometry import _SceneGeometry, ego_coords
from jax_drive.pdm_reference.scorer import _evaluate, initial_state
from jax_drive.pdm_reference.simulation import AX, AY, HEADING, YAW_ACC, YAW_RATE, interpolate_poses, simulate

# the metrics the human penalty filter can set to 1 (NAVSIM's result columns)
FILTERED = ("nc", "dac", "ddc", "tlc", "ep", "ttc", "lk", "hc")


def t0_overlapping_objects(geo: _SceneGeometry, origin: np.ndarray, cfg) -> np.ndarray:
    """Indices of the objects valid in frame 0 whose box intersects the ego's t0 box."""
    state = np.zeros((1, 11))
    state[0, :3] = origin
    ego_box = shapely.Polygon(ego_coords(state, cfg)[0, :4])
    present = np.flatnonzero(geo.valid[:, 0])
    return np.asarray([n for n in present if shapely.intersects(ego_box, geo.boxes[n, 0])], np.int64)


def _yaw(scene: Any, cfg) -> tuple[np.ndarray, np.ndarray]:
    """(16,) yaw rate and yaw acceleration of the past states and t0 (the last), as the
    convention says: "navsim" the past's 0 (nuPlan's interpolated past states carry none)
    and t0's logged, "logged" all logged, "finite_difference" np.gradient of the past
    headings and t0's 0."""
    logged = (np.asarray(scene.ego.history_yaw_rate, np.float64).copy(),
              np.asarray(scene.ego.history_yaw_accel, np.float64).copy())
    if cfg.hc_history_dynamics == "logged":
        return logged
    if cfg.hc_history_dynamics == "navsim":
        rate, accel = np.zeros_like(logged[0]), np.zeros_like(logged[1])
        rate[-1], accel[-1] = logged[0][-1], logged[1][-1]
        return rate, accel
    heading = np.unwrap(np.asarray(scene.ego.history_poses, np.float64)[:, 2])
    rate = np.gradient(heading, cfg.dt)
    accel = np.gradient(rate, cfg.dt)
    rate[-1] = accel[-1] = 0.0
    return rate, accel


def start_state(scene: Any, origin: np.ndarray, cfg) -> np.ndarray:
    """(11,) t0 state with the t0 yaw rate / yaw acceleration of :func:`_yaw`."""
    state = initial_state(scene, origin)
    rate, accel = _yaw(scene, cfg)
    state[YAW_RATE], state[YAW_ACC] = rate[-1], accel[-1]
    return state


def past_states(scene: Any, origin: np.ndarray, cfg) -> np.ndarray | None:
    """(14, 11) past states at -1.5 .. -0.2 s (pose, acceleration, yaw rate / acceleration),
    or None without a logged past."""
    if not bool(np.asarray(scene.ego.history_valid)):
        return None
    n = cfg.hc_history_states
    poses = np.asarray(scene.ego.history_poses, np.float64)[:n]
    c, s = np.cos(origin[2]), np.sin(origin[2])
    out = np.zeros((n, 11))
    out[:, 0] = origin[0] + c * poses[:, 0] - s * poses[:, 1]
    out[:, 1] = origin[1] + s * poses[:, 0] + c * poses[:, 1]
    out[:, HEADING] = poses[:, 2] + origin[2]
    acc = np.asarray(scene.ego.history_acceleration, np.float64)[:n]
    out[:, AX], out[:, AY] = acc[:, 0], acc[:, 1]
    rate, accel = _yaw(scene, cfg)
    out[:, YAW_RATE], out[:, YAW_ACC] = rate[:n], accel[:n]
    return out


def _unwrap(heading: np.ndarray) -> np.ndarray:
    jumps = np.round(np.diff(heading) / (2 * np.pi))
    return heading - 2 * np.pi * np.concatenate([[0.0], np.cumsum(jumps)])


def comfortable_v2(states: np.ndarray, cfg) -> bool:
    """The six comfort checks, NAVSIM v2 filters, over (T, 11) rear-axle states."""
    n, dt, dec = states.shape[0], cfg.dt, cfg.comfort_decimals
    d = cfg.rear_axle_to_center
    w, alpha = states[:, YAW_RATE], states[:, YAW_ACC]
    ax, ay = states[:, AX], states[:, AY]
    if cfg.hc_acceleration == "shifted":
        cx, cy, mag = ax + d * w**2 + d * alpha, ay, np.hypot(ax, ay)
    else:
        cx, cy = ax - d * w**2, ay + d * alpha
        mag = np.hypot(cx, cy)

    def smooth(y):
        return np.round(savgol_filter(y, min(cfg.hc_accel_window, n), 2), dec)

    def derivative(y, window, poly, order):
        return savgol_filter(y, min(window, n), poly, deriv=order, delta=dt)

    lon, lat = smooth(cx), smooth(cy)
    jerk = np.round(derivative(smooth(mag), cfg.hc_jerk_window, 2, 1), dec)
    lon_jerk = np.round(derivative(smooth(cx), cfg.hc_jerk_window, 2, 1), dec)
    heading = _unwrap(states[:, HEADING])
    yaw_rate = np.round(derivative(heading, 5, 2, 1), dec)
    yaw_acc = np.round(derivative(heading, 5, 3, 2), dec)
    checks = [(lon, cfg.min_lon_accel, cfg.max_lon_accel), (lat, -cfg.max_abs_lat_accel, cfg.max_abs_lat_accel),
              (jerk, -cfg.max_abs_mag_jerk, cfg.max_abs_mag_jerk),
              (lon_jerk, -cfg.max_abs_lon_jerk, cfg.max_abs_lon_jerk),
              (yaw_acc, -cfg.max_abs_yaw_accel, cfg.max_abs_yaw_accel),
              (yaw_rate, -cfg.max_abs_yaw_rate, cfg.max_abs_yaw_rate)]
    return all(bool(np.all((v > lo) & (v < hi))) for v, lo, hi in checks)


def history_comfort(past: np.ndarray | None, states: np.ndarray, cfg) -> float:
    """HC: 1 without a past, else the v2 comfort checks over past + simulated states."""
    if past is None:
        return 1.0
    return 1.0 if comfortable_v2(np.concatenate([past, states], 0), cfg) else 0.0


def extended_comfort_features(states: np.ndarray, cfg) -> dict:
    """NAVSIM v2's extended-comfort features of (T, 11) states (rounded to 8 decimals)."""
    n, dt, dec = states.shape[0], cfg.dt, cfg.comfort_decimals
    accel = np.round(savgol_filter(np.hypot(states[:, AX], states[:, AY]), min(8, n), 2), dec)
    heading = _unwrap(states[:, HEADING])
    return {"accel": accel,
            "jerk": np.round(savgol_filter(accel, min(15, n), 2, deriv=1, delta=dt), dec),
            "yaw_rate": np.round(savgol_filter(heading, min(5, n), 2, deriv=1, delta=dt), dec),
            "yaw_accel": np.round(savgol_filter(heading, min(5, n), 2, deriv=2, delta=dt), dec)}


def two_frame_extended_comfort(current: np.ndarray, previous: np.ndarray, config=None) -> float:
    """EC of two (41, 11) simulated trajectories, ``previous`` starting 0.5 s earlier."""
    cfg = as_reference_config(config)
    k = cfg.ec_overlap_steps
    a, b = extended_comfort_features(current[:-k], cfg), extended_comfort_features(previous[k:], cfg)
    rms = [float(np.sqrt(np.mean((a[name] - b[name]) ** 2))) for name in ("accel", "jerk", "yaw_rate", "yaw_accel")]
    return 1.0 if all(r <= t for r, t in zip(rms, cfg.ec_thresholds)) else 0.0


def epdms(parts: dict, cfg, ec: float | None = None) -> float:
    """EPDMS from metric values; ``ec`` None: no previous frame (``ec_without_previous``)."""
    w_ep, w_ttc, w_lk, w_hc, w_ec = cfg.epdms_weights
    num = w_ep * parts["ep"] + w_ttc * parts["ttc"] + w_lk * parts["lk"] + w_hc * parts["hc"]
    den = w_ep + w_ttc + w_lk + w_hc
    if ec is None and cfg.ec_without_previous == "one":
        ec = 1.0
    if ec is not None:
        num, den = num + w_ec * ec, den + w_ec
    return parts["nc"] * parts["dac"] * parts["ddc"] * parts["tlc"] * num / den


class ReferenceScorerV2:
    """NAVSIM v2 scores of proposals of one scene (numpy Scene without batch dims, in the
    frame in which ``origin`` is the t0 rear-axle pose); the geometry, the PDM-Closed plan's
    and the human trajectory's metrics are computed once per instance."""

    def __init__(self, scene_np: Any, config=None, origin: np.ndarray | None = None):
        self.cfg = as_reference_config(config)
        self.scene = scene_np
        self.origin = np.zeros(3) if origin is None else np.asarray(origin, np.float64)
        self.geo = _SceneGeometry(scene_np, self.cfg)
        self.dropped = np.zeros(0, np.int64)
        if self.cfg.drop_t0_overlaps:
            self.dropped = t0_overlapping_objects(self.geo, self.origin, self.cfg)
            self.geo.valid[self.dropped] = False
        self.past = past_states(scene_np, self.origin, self.cfg)
        self.start = start_state(scene_np, self.origin, self.cfg)
        self._reference: tuple[bytes, dict] | None = None  # the last PDM-Closed plan's metrics
        self._human: dict | None = None

    def simulate(self, poses: np.ndarray, pose_dt: float) -> np.ndarray:
        """(41, 11) simulated states of ego-frame poses."""
        target = interpolate_poses(self.origin, np.asarray(poses, np.float64), pose_dt, self.cfg.dt,
                                   self.cfg.num_steps)
        return simulate(target, self.start.copy(), self.cfg)

    def metrics(self, states: np.ndarray, past: np.ndarray | None) -> dict:
        """Every v2 metric of one simulated trajectory (EP still raw: ``progress``)."""
        ev = _evaluate(states, self.geo, self.cfg, full=True)
        return {"nc": ev["nc"]["score"], "dac": ev["dac"], "ddc": ev["ddc_v2"], "tlc": ev["tlc"],
                "ttc": ev["ttc_v2"]["score"], "lk": ev["lk"], "hc": history_comfort(past, states, self.cfg),
                "progress": ev["progress"]}

    def _human_metrics(self) -> dict:
        """The human trajectory scored alone, without its past (computed once per scene)."""
        if self._human is None:
            human = self.metrics(self.simulate(np.asarray(self.scene.expert, np.float64), self.cfg.output_dt), None)
            human["ep"] = self._ep(human["progress"], human["progress"] * self._multiplier(human))
            self._human = human
        return self._human

    @staticmethod
    def _multiplier(m: dict) -> float:
        return m["nc"] * m["dac"] * m["ddc"] * m["tlc"]

    def _ep(self, progress: float, norm: float) -> float:
        if norm > self.cfg.progress_distance_threshold:
            return min(1.0, max(0.0, progress / norm))
        return 1.0

    def score(self, proposal: np.ndarray, reference: np.ndarray) -> dict:
        """Scores one proposal (8, 3) against the PDM-Closed reference (40, 3), both in the ego
        frame at t0. Returns nc, dac, ddc, tlc, ep, ttc, lk, hc, epdms (no previous frame),
        the unfiltered ``epdms_unfiltered``, ``filtered`` (the metrics the human filter set to
        1) and ``states`` (41, 11)."""
        cfg = self.cfg
        key = np.asarray(reference, np.float64).tobytes()
        if self._reference is None or self._reference[0] != key:
            self._reference = (key, self.metrics(self.simulate(reference, cfg.dt), self.past))
        ref = self._reference[1]
        states = self.simulate(proposal, cfg.output_dt)
        prop = self.metrics(states, self.past)
        norm = max(prop["progress"] * self._multiplier(prop), ref["progress"] * self._multiplier(ref))
        prop["ep"] = self._ep(prop["progress"], norm)
        out = dict(prop, epdms_unfiltered=epdms(prop, cfg), states=states, filtered=[])
        if cfg.human_penalty_filter and bool(np.asarray(self.scene.expert_valid)):
            human = self._human_metrics()
            for name in FILTERED:
                if human[name] == 0.0:
                    out[name] = 1.0
                    out["filtered"].append(name)
        out["epdms"] = epdms(out, cfg)
        return out
