"""Colours (RGB uint8) of the rendered layers; one place for the BEV and the camera."""

from __future__ import annotations

import numpy as np

from jax_drive.types import AgentType

OFFROAD = (92, 116, 78)
ASPHALT = (78, 78, 84)
MARKING = (232, 232, 226)
ROUTE = (64, 118, 196)
EGO = (40, 200, 90)
HISTORY = (40, 190, 250)
SKY = (150, 190, 232)
HORIZON = (176, 196, 214)

AGENT_COLOURS = {
    AgentType.VEHICLE: (214, 58, 48),
    AgentType.PEDESTRIAN: (250, 208, 40),
    AgentType.BICYCLE: (242, 128, 32),
    AgentType.TRAFFIC_CONE: (255, 96, 0),
    AgentType.BARRIER: (196, 196, 70),
    AgentType.CZONE_SIGN: (170, 70, 200),
    AgentType.GENERIC_OBJECT: (150, 150, 150),
}


def agent_palette() -> np.ndarray:
    """(len(AgentType), 3) uint8 colour of each object class, indexed by AgentType."""
    return np.array([AGENT_COLOURS[t] for t in sorted(AGENT_COLOURS)], np.uint8)
