"""Rule-based planners: constant velocity, IDM along the route, PDM-Closed."""

from jax_drive.planners.constant_velocity import constant_velocity
from jax_drive.planners.idm import IDMConfig, idm_planner
from jax_drive.planners.pdm_closed import PDMClosedConfig, PDMClosedOutput, pdm_closed

__all__ = ["constant_velocity", "IDMConfig", "idm_planner", "PDMClosedConfig", "PDMClosedOutput", "pdm_closed"]
