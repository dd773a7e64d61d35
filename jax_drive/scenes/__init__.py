"""Scenes: hand-built (builders), generated (generator), frame conversion (frames), files (io)."""

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
from jax_drive.scenes.io import SceneFile, SceneFileError, load_scenes, scene_record, write_scene_file

__all__ = [
    "AgentTrack",
    "GeneratorConfig",
    "LaneSpec",
    "PolygonSpec",
    "SceneFile",
    "SceneFileError",
    "SceneSizes",
    "SceneSpec",
    "add_agent",
    "add_static",
    "agent_track",
    "generate_scenes",
    "index_scene",
    "load_scenes",
    "make_scene",
    "scene_labels",
    "scene_record",
    "scene_to_global",
    "scene_to_numpy",
    "stack_scenes",
    "straight_road",
    "straight_road_scene",
    "to_ego_frame",
    "write_scene_file",
]
