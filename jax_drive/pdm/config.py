"""Constants of the PDM score (NAVSIM v1.1 defaults, v2 extensions), in one frozen dataclass.

Every number below is read off the public NAVSIM / nuPlan sources (see
``/work/shared/reference/navsim_pdm.md``). The dataclass is hashable, so it can be passed
to jitted functions as a static argument.
"""

from __future__ import annotations

import dataclasses
import math

from jax_drive.configs import one_of
from jax_drive.types import VehicleParameters


NAVSIM_VERSIONS = ("1.1", "2")
# Conventions per version: "2" is NAVSIM v2.2's; "1.1" keeps NAVSIM v1.1's traffic and, for
# the v2-only metrics (HC, EC), jax-drive's earlier conventions.
VERSION_DEFAULTS = {
    "1.1": {"t0_overlap": "keep", "human_penalty_filter": False, "hc_acceleration": "rigid_body",
            "hc_history_dynamics": "finite_difference", "ec_without_previous": "one"},
    "2": {"t0_overlap": "drop", "human_penalty_filter": True, "hc_acceleration": "shifted",
          "hc_history_dynamics": "navsim", "ec_without_previous": "drop"},
}


@dataclasses.dataclass(frozen=True)
class PDMConfig:
    """All PDM-score constants.

    Attributes (defaults = NAVSIM v1.1):
      navsim_version: "1.1" (default) or "2": which NAVSIM's rules the fields below default
        to where the two versions differ (``PDMConfig(navsim_version="2")`` is NAVSIM v2.2's
        default one-stage scoring: non-reactive log-replay traffic, human penalty filter).
        A field left at None takes the version's default (:data:`VERSION_DEFAULTS`; "1.1"
        keeps jax-drive's earlier conventions for the v2-only HC and EC, so read EPDMS in
        "2" mode). Every result field is computed either way; in "2" mode NC, DAC and the v2 fields
        (ddc_v2, tlc, ep_v2, ttc_v2, lk, hc, ec, epdms) are NAVSIM v2's, and the v1.1-only
        fields (ttc, ddc, ep, comfort, pdms) see the v2 traffic, so read PDMS in "1.1" mode.
      t0_overlap: objects whose box meets the ego box at t = 0. "keep" (v1.1 default: NAVSIM
        v1.1 scores them like any other object) or "drop" (v2 default: NAVSIM v2's
        ``LogReplayTrafficAgents`` removes every object present in the first frame whose box
        intersects, touching included, the ego's t0 box, from every frame). Applied at
        scoring time; scene files keep all objects.
      human_penalty_filter: NAVSIM v2's filter (v2 default True, v1.1 False): the scene's
        human trajectory (``Scene.expert``, where ``Scene.expert_valid``) is simulated and
        scored alone in the same call, and every multiplier / weighted metric it scores 0 on
        (NC, DAC, DDC, TLC, EP, TTC, LK, HC; EP and HC never are: scored alone its progress
        normalises itself, and NAVSIM scores it without a history) is set to 1 for the
        proposals; NC 0.5 and DDC 0.5 of the human do not count. Scenes without a logged
        human trajectory (NAVSIM's synthetic scenes) are not filtered.
      hc_acceleration: how history comfort moves the rear-axle acceleration to the box centre.
        "shifted" (v2 default: NAVSIM v2 through nuPlan's ``get_acceleration_shifted`` with the
        displacement d along x): longitudinal ``a_x + d (w^2 + alpha)``, lateral ``a_y``
        unchanged, the jerk magnitude from the unshifted rear-axle acceleration. "rigid_body"
        (v1.1 default): the rigid-body transfer ``(a_x - w^2 d, a_y + alpha d)`` for all three.
      hc_history_dynamics: the yaw rate / yaw acceleration history comfort uses to move the
        past states' accelerations to the box centre, and the t0 ones the simulation starts
        from. "navsim" (v2 default): the past states' are 0 (NAVSIM reads the past from an
        ``InterpolatedTrajectory``, and nuPlan's ``EgoState.from_split_state`` rebuilds its
        states without angular velocity or acceleration), t0's the logged ones (the metric
        cache's ego state). "logged": every state's logged values
        (``EgoState.history_yaw_rate`` / ``history_yaw_accel``). "finite_difference" (v1.1
        default): ``np.gradient`` of the past headings, t0's 0.
      ec_without_previous: EPDMS of a single frame (no previous frame, EC undefined).
        "drop" (v2 default, NAVSIM v2): EC leaves the weighted average (weights 5 + 5 + 2 + 2
        over 14). "one" (v1.1 default): EC = 1 at its weight (over 16). :func:`jax_drive.pdm.scorer.
        with_extended_comfort` adds a two-frame EC (weights over 16).
      simulate: run the LQR tracker + kinematic bicycle model on the interpolated states
        (NAVSIM behaviour). False scores the raw interpolated states, with speeds and
        accelerations from finite differences.
      check_finite: at the Python boundary, raise ``ValueError`` on NaN/inf poses. Turn it
        off inside larger jitted programs (under a trace the values cannot be inspected, so
        the check is skipped there anyway): non-finite proposals then score 0 everywhere,
        their violations are empty and ``PDMResult.finite`` is False for them. Shapes are
        always checked. The flag does not change the compiled program.
      chunk_size: simulate and score a scene's trajectories in equal chunks of at most this
        many with ``lax.map`` (0 = all at once). Default 512: it bounds the temp memory of
        one call (4,096 proposals of one scene need ~98 MB of temp buffers unchunked, ~25 MB
        with 512) and on the 2-core CPU made 1,024 / 2,048 / 4,096 proposals faster (38-39
        vs 41-47 ms, 73-78 vs 85-106 ms, 138-147 vs 170-188 ms). Scores do not depend on it
        beyond float32 rounding.
      num_steps, dt: scoring grid, 41 states at 0.1 s (0 .. 4 s).

      Ego vehicle (Chrysler Pacifica): ego_width, ego_front_length, ego_rear_length,
        ego_wheel_base, ego_rear_axle_to_center (metres; defaults from :class:`VehicleParameters`).

      LQR tracker: q_longitudinal 10, r_longitudinal 1, q_lateral (1, 10, 0), r_lateral 1,
        tracking_horizon 10 steps, jerk_penalty 1e-4, curvature_rate_penalty 1e-2,
        initial_curvature_penalty 1e-10, stopping_gain 0.5, stopping_velocity 0.2 m/s.
      jerk_matrix: which "banded difference" matrix the velocity fit's jerk penalty uses.
        "navsim" (default): the matrix NAVSIM builds (v1.0 to v2.2 alike), in which an
        overwritten assignment leaves every row but the last as -e_i, so the penalty acts
        on the accelerations themselves; this is what gives NAVSIM's numbers. "nuplan": the
        true difference of consecutive accelerations of nuPlan's tracker. See
        :func:`jax_drive.pdm.tracker.jerk_difference_matrix`. The choice moves the
        simulated ego by centimetres to decimetres and changes a sub-score on ~5 % of
        proposals; it applies to PDMS and EPDMS alike (NAVSIM v2 uses the same tracker).
      Bicycle model: max_steering_angle pi/3, accel_time_constant 0.2 s,
        steering_time_constant 0.05 s.

      Collision / TTC: collision_stopped_speed 0.05 m/s (ego and track "stopped" in the
        collision classification, <=), ttc_stopped_speed 5e-3 m/s (TTC skipped below, <),
        ttc_future_frames (0, 3, 6, 9) observation frames ahead (0/0.3/0.6/0.9 s),
        ahead_angle_deg 30, behind_angle_deg 150, static_collision_score 0.5.
      ttc_v2_last_step 31: NAVSIM v2's observation ends at 4 s, so its TTC only looks at
        steps t with t + 9 <= 40.

      Progress: progress_distance_threshold 5.0 m.
      Driving direction: ddc_horizon_steps 10 (window t-10 .. t, 11 samples),
        ddc_compliance_threshold 2 m, ddc_violation_threshold 6 m.
      Lane keeping (v2): lk_deviation_limit 0.5 m, lk_steps 20 consecutive steps.
      History comfort (v2): hc_history_steps 14 (logged states at -1.5 .. -0.2 s; NAVSIM
        samples [-1.5, 0) at 0.1 s and drops the last one).
      Extended comfort (v2) RMS thresholds: ec_accel 0.7, ec_jerk 0.5, ec_yaw_rate 0.1,
        ec_yaw_accel 0.1.

      Comfort bounds (strict): lon accel in (min_lon_accel, max_lon_accel) =
        (-4.05, 2.40) m/s^2, |lat accel| < 4.89, |jerk| < 8.37, |lon jerk| < 4.13 m/s^3,
        |yaw rate| < 0.95 rad/s, |yaw accel| < 1.93 rad/s^2.
      Savitzky-Golay settings (v1.1): acceleration window = whole horizon (41), poly 2;
        jerk = derivative (poly 2, window = horizon) of the acceleration smoothed with
        window 8; yaw rate poly 2 window 5; yaw accel poly 3 window 5.
      v2 (history comfort): acceleration window 8, jerk derivative window 15.

      Weights: PDMS = NC * DAC * (5 TTC + 5 EP + 2 C) / 12;
        EPDMS = NC * DAC * DDC * TLC * (5 EP + 5 TTC + 2 LK + 2 HC [+ 2 EC]) / 14 [16]
        (EC only with a previous frame, see ``ec_without_previous``).
    """

    navsim_version: str = "1.1"
    t0_overlap: str | None = None
    human_penalty_filter: bool | None = None
    hc_acceleration: str | None = None
    hc_history_dynamics: str | None = None
    ec_without_previous: str | None = None
    simulate: bool = True
    check_finite: bool = True
    chunk_size: int = 512
    num_steps: int = 41
    dt: float = 0.1

    ego_width: float = VehicleParameters.width
    ego_front_length: float = VehicleParameters.front_length
    ego_rear_length: float = VehicleParameters.rear_length
    ego_wheel_base: float = VehicleParameters.wheel_base
    ego_rear_axle_to_center: float = VehicleParameters.rear_axle_to_center

    q_longitudinal: float = 10.0
    r_longitudinal: float = 1.0
    q_lateral: tuple[float, float, float] = (1.0, 10.0, 0.0)
    r_lateral: float = 1.0
    tracking_horizon: int = 10
    jerk_penalty: float = 1e-4
    jerk_matrix: str = "navsim"
    curvature_rate_penalty: float = 1e-2
    initial_curvature_penalty: float = 1e-10
    stopping_gain: float = 0.5
    stopping_velocity: float = 0.2
    max_steering_angle: float = math.pi / 3
    accel_time_constant: float = 0.2
    steering_time_constant: float = 0.05

    collision_stopped_speed: float = 0.05
    ttc_stopped_speed: float = 5e-3
    ttc_future_frames: tuple[int, ...] = (0, 3, 6, 9)
    ttc_v2_last_step: int = 31
    ahead_angle_deg: float = 30.0
    behind_angle_deg: float = 150.0
    static_collision_score: float = 0.5

    progress_distance_threshold: float = 5.0
    ddc_horizon_steps: int = 10
    ddc_compliance_threshold: float = 2.0
    ddc_violation_threshold: float = 6.0
    lk_deviation_limit: float = 0.5
    lk_steps: int = 20
    hc_history_steps: int = 14
    ec_accel: float = 0.7
    ec_jerk: float = 0.5
    ec_yaw_rate: float = 0.1
    ec_yaw_accel: float = 0.1

    min_lon_accel: float = -4.05
    max_lon_accel: float = 2.40
    max_abs_lat_accel: float = 4.89
    max_abs_jerk: float = 8.37
    max_abs_lon_jerk: float = 4.13
    max_abs_yaw_rate: float = 0.95
    max_abs_yaw_accel: float = 1.93
    accel_window_v1: int = 41
    jerk_accel_window: int = 8
    jerk_window_v1: int = 41
    accel_window_v2: int = 8
    jerk_window_v2: int = 15
    yaw_window: int = 5

    weight_ttc: float = 5.0
    weight_ep: float = 5.0
    weight_comfort: float = 2.0
    weight_lk: float = 2.0
    weight_hc: float = 2.0
    weight_ec: float = 2.0

    def __post_init__(self):
        one_of("PDMConfig.navsim_version", self.navsim_version, NAVSIM_VERSIONS)
        # The chosen version's convention where a field is left at None.
        for name, value in VERSION_DEFAULTS[self.navsim_version].items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        for name, allowed in (("t0_overlap", ("keep", "drop")), ("hc_acceleration", ("shifted", "rigid_body")),
                              ("hc_history_dynamics", ("navsim", "logged", "finite_difference")),
                              ("ec_without_previous", ("drop", "one"))):
            one_of(f"PDMConfig.{name}", getattr(self, name), allowed)
        if self.jerk_matrix not in ("navsim", "nuplan"):
            raise ValueError(f"PDMConfig.jerk_matrix must be 'navsim' or 'nuplan', got {self.jerk_matrix!r}")
        if not self.ttc_future_frames or min(self.ttc_future_frames) < 0:
            raise ValueError(f"PDMConfig.ttc_future_frames must be frame offsets >= 0, got {self.ttc_future_frames!r}")
        if self.chunk_size < 0:
            raise ValueError(f"PDMConfig.chunk_size must be >= 0, got {self.chunk_size}")

    @property
    def vehicle(self) -> VehicleParameters:
        """Ego geometry as the shared :class:`VehicleParameters`."""
        return VehicleParameters(
            width=self.ego_width,
            front_length=self.ego_front_length,
            rear_length=self.ego_rear_length,
            wheel_base=self.ego_wheel_base,
            rear_axle_to_center=self.ego_rear_axle_to_center,
        )

    @property
    def ego_length(self) -> float:
        return self.ego_front_length + self.ego_rear_length
