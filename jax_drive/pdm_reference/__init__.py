"""Independent reference PDM scorer (numpy + shapely + scipy, NAVSIM v1.1 semantics).

Slow by design (Python loops over steps and objects, one proposal at a time): it is the
oracle for :mod:`jax_drive.pdm` in tests and the peer in ``experiments/bench_pdm.py``.
It shares no code with :mod:`jax_drive.pdm`.
"""

from jax_drive.pdm_reference.config import ReferenceConfig, as_reference_config
from jax_drive.pdm_reference.frames import scene_to_global
from jax_drive.pdm_reference.geometry import ego_coords, scene_to_numpy
from jax_drive.pdm_reference.scorer import (
    ReferenceScorer,
    comfort_checks,
    score_proposal_reference,
    simulate_trajectory,
)
from jax_drive.pdm_reference.simulation import interpolate_poses, simulate

__all__ = [
    "ReferenceScorer",
    "ReferenceConfig",
    "as_reference_config",
    "comfort_checks",
    "ego_coords",
    "interpolate_poses",
    "scene_to_global",
    "scene_to_numpy",
    "score_proposal_reference",
    "simulate",
    "simulate_trajectory",
]
