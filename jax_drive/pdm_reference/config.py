"""Constants of the reference PDM scorer (NAVSIM v1.1 defaults), kept separate from
:mod:`jax_drive.pdm` on purpose so the two implementations stay independent."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class ReferenceConfig:
    """Every constant the reference scorer uses. Defaults reproduce NAVSIM v1.1.

    Vehicle (Chrysler Pacifica, metres):
      width 2.297, front_length 4.049 (rear axle to front bumper), rear_length 1.127,
      wheel_base 3.089, rear_axle_to_center 1.461.
    Time grid: 41 scoring states (0 .. 4 s at dt = 0.1 s); proposals are 8 poses at 0.5 s.
    Tracker (batch LQR of NAVSIM): q_lon 10, r_lon 1, q_lat (1, 10, 0), r_lat 1, horizon 10,
      jerk penalty 1e-4, curvature-rate penalty 1e-2, stopping gain 0.5, stopping velocity 0.2.
    Bicycle model: max steering pi/3, time constants 0.2 s (acceleration) and 0.05 s (steering).
    Scoring thresholds: see field comments.
    ``jerk_matrix``: "navsim" (NAVSIM's velocity-fit regulariser as its code builds it) or
    "nuplan" (the true acceleration difference); see ``simulation.jerk_regularizer``.
    ``simulate``: run the LQR + bicycle simulation (True, NAVSIM) or score the interpolated
    states directly (False; velocities/accelerations are then zero after t0 as in NAVSIM's
    interpolated trajectory).
    """

    simulate: bool = True
    # vehicle
    width: float = 2.297
    front_length: float = 4.049
    rear_length: float = 1.127
    wheel_base: float = 3.089
    rear_axle_to_center: float = 1.461
    # time grid
    dt: float = 0.1
    num_steps: int = 41
    output_dt: float = 0.5
    # tracker
    q_longitudinal: float = 10.0
    r_longitudinal: float = 1.0
    q_lateral: tuple = (1.0, 10.0, 0.0)
    r_lateral: float = 1.0
    tracking_horizon: int = 10
    jerk_penalty: float = 1e-4
    jerk_matrix: str = "navsim"  # NAVSIM's banded matrix as built; "nuplan": true difference
    curvature_rate_penalty: float = 1e-2
    initial_curvature_penalty: float = 1e-10
    stopping_proportional_gain: float = 0.5
    stopping_velocity: float = 0.2
    # bicycle
    max_steering_angle: float = math.pi / 3
    accel_time_constant: float = 0.2
    steering_angle_time_constant: float = 0.05
    # collisions
    collision_stopped_speed: float = 5e-2  # ego / track considered stopped (NC), m/s
    ahead_angle_deg: float = 30.0
    behind_angle_deg: float = 150.0
    static_collision_score: float = 0.5
    # TTC
    ttc_stopped_speed: float = 5e-3  # m/s
    ttc_future_steps: tuple = (0, 3, 6, 9)
    ttc_v2_last_step: int = 31  # NAVSIM v2 observations end at 4 s: t + 9 <= 40
    # lane keeping (v2)
    lane_keeping_deviation: float = 0.5  # m
    lane_keeping_steps: int = 20  # consecutive steps (2 s)
    # progress
    progress_distance_threshold: float = 5.0  # m
    # driving direction
    driving_direction_horizon: float = 1.0  # s
    driving_direction_compliance_threshold: float = 2.0  # m
    driving_direction_violation_threshold: float = 6.0  # m
    # weights of the PDMS weighted average
    progress_weight: float = 5.0
    ttc_weight: float = 5.0
    comfort_weight: float = 2.0
    driving_direction_weight: float = 0.0
    # comfort bounds (strict) and rounding
    max_lon_accel: float = 2.40
    min_lon_accel: float = -4.05
    max_abs_lat_accel: float = 4.89
    max_abs_mag_jerk: float = 8.37
    max_abs_lon_jerk: float = 4.13
    max_abs_yaw_rate: float = 0.95
    max_abs_yaw_accel: float = 1.93
    comfort_decimals: int = 8
    # NAVSIM v2 (EPDMS): conventions where jax-drive offers a choice (NAVSIM v2's first)
    drop_t0_overlaps: bool = True  # LogReplayTrafficAgents drops objects meeting the t0 ego box
    human_penalty_filter: bool = True
    hc_acceleration: str = "shifted"  # nuPlan's shifted acceleration; "rigid_body"
    hc_history_dynamics: str = "navsim"  # past yaw rates 0, t0's logged; "logged"; "finite_difference"
    ec_without_previous: str = "drop"  # EC out of the weighted average; "one": EC = 1
    hc_history_states: int = 14  # past states at -1.5 .. -0.2 s
    hc_accel_window: int = 8
    hc_jerk_window: int = 15
    ec_overlap_steps: int = 5
    ec_thresholds: tuple = (0.7, 0.5, 0.1, 0.1)  # RMS: accel, jerk, yaw rate, yaw accel
    # EPDMS weights: EP, TTC, LK, HC, EC
    epdms_weights: tuple = (5.0, 5.0, 2.0, 2.0, 2.0)

    @property
    def length(self) -> float:
        return self.front_length + self.rear_length


def as_reference_config(config=None) -> ReferenceConfig:
    """Returns a :class:`ReferenceConfig`. Any other config object (e.g. the JAX scorer's
    ``PDMConfig``) only contributes its choices, ``simulate`` and ``jerk_matrix``; every
    constant of the reference stays its own so the two implementations remain independent."""
    if config is None:
        return ReferenceConfig()
    if isinstance(config, ReferenceConfig):
        return config
    choices = {"simulate": bool(getattr(config, "simulate", True)),
               "jerk_matrix": str(getattr(config, "jerk_matrix", "navsim"))}
    if hasattr(config, "t0_overlap"):  # the JAX scorer's NAVSIM v2 conventions
        choices.update(drop_t0_overlaps=config.t0_overlap == "drop",
                       human_penalty_filter=bool(config.human_penalty_filter),
                       hc_acceleration=config.hc_acceleration, hc_history_dynamics=config.hc_history_dynamics,
                       ec_without_previous=config.ec_without_previous)
    return ReferenceConfig(**choices)
