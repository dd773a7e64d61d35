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
from jax_drive.scenes.frames import scene_to_global, to_ego_frame
from jax_drive.scenes.generator import GeneratorConfig, generate_scenes, scene_labels

__all__ = [
    "AgentTrack",
    "GeneratorConfig",
    "LaneSpec",
    "PolygonSpec",
    "SceneSizes",
    "SceneSpec",
    "add_agent",
    "add_static",
    "agent_track",
    "generate_scenes",
    "index_scene",
    "make_scene",
    "scene_labels",
    "scene_to_global",
    "scene_to_numpy",
    "stack_scenes",
    "straight_road",
    "straight_road_scene",
    "to_ego_frame",
]
