"""Batched JAX PDM scorer (NAVSIM v1.1 PDMS and v2 EPDMS).

Public API: PDMConfig, interpolate_poses, simulate_states, EgoTrajectory, score_proposals,
score_candidates, PDMResult, Violations, two_frame_extended_comfort, with_extended_comfort.
"""

from jax_drive.pdm.comfort import two_frame_extended_comfort
from jax_drive.pdm.config import PDMConfig
from jax_drive.pdm.interpolate import interpolate_poses
from jax_drive.pdm.scorer import PDMResult, Violations, score_candidates, score_proposals, with_extended_comfort
from jax_drive.pdm.tracker import EgoTrajectory, simulate_states

__all__ = [
    "PDMConfig",
    "interpolate_poses",
    "simulate_states",
    "EgoTrajectory",
    "score_proposals",
    "score_candidates",
    "PDMResult",
    "Violations",
    "two_frame_extended_comfort",
    "with_extended_comfort",
]
