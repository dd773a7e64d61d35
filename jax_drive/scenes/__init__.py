"""Scenes: hand-built (builders), generated (generator), frame conversion (frames)."""

from jax_drive.scenes.builders import (
    AgentTrack,
    LaneSpec,
    PolygonSpec,
    SceneSizes,
    SceneSpec,
    add_agent,
    add_static,
    agent_track,
    index_scene,
    make_scene,
    scene_to_numpy,
    stack_scenes,
    straight_road,
    straight_road_scene,
)

__all__ = [
    "AgentTrack",
    "LaneSpec",
    "PolygonSpec",
    "SceneSizes",
    "SceneSpec",
    "add_agent",
    "add_static",
    "agent_track",
    "index_scene",
    "make_scene",
    "scene_to_numpy",
    "stack_scenes",
    "straight_road",
    "straight_road_scene",
]

try:  # the generator and frames are optional at import time while they are being built
    from jax_drive.scenes.generator import GeneratorConfig, generate_scenes  # noqa: F401

    __all__ += ["GeneratorConfig", "generate_scenes"]
except ImportError:  # pragma: no cover
    pass
