"""Scenes and poses shared by the PDM scorer tests, built with :mod:`jax_drive.scenes.builders`.

A straight two-lane road along +x (lane 0: y in [-1.75, 1.75], the ego's lane and on the
route; lane 1 to its left), x from -50 to 200 m, padded to one small layout so that every
test file compiles the scorer once.
"""

from __future__ import annotations

import numpy as np

from jax_drive.scenes.builders import AgentTrack, LaneSpec, PolygonSpec, SceneSizes, SceneSpec, rectangle, straight_road
from jax_drive.scenes.builders import add_agent, add_static
from jax_drive.types import NUM_OBS_STEPS, OBS_DT, AgentType

SIZES = SceneSizes(num_agents=8, num_drivable=4, drivable_vertices=8, num_lanes=6, lane_vertices=8,
                   centerline_points=24, route_points=64)


def moving_agent(x: float, y: float, heading: float = 0.0, vx: float = 0.0, vy: float = 0.0,
                 length: float = 4.5, width: float = 2.0, agent_type: int = AgentType.VEHICLE,
                 first_frame: int = 0, last_frame: int = NUM_OBS_STEPS - 1) -> AgentTrack:
    """An object at (x, y) at frame 0 moving at constant velocity (vx, vy), whatever its heading."""
    t = np.arange(NUM_OBS_STEPS) * OBS_DT
    valid = (np.arange(NUM_OBS_STEPS) >= first_frame) & (np.arange(NUM_OBS_STEPS) <= last_frame)
    return AgentTrack(x=x + vx * t, y=y + vy * t, heading=np.full(NUM_OBS_STEPS, heading),
                      vx=np.full(NUM_OBS_STEPS, vx), vy=np.full(NUM_OBS_STEPS, vy), length=length,
                      width=width, height=1.5, agent_type=int(agent_type), valid=valid)


def road_scene(agents=(), speed: float = 10.0, ego_accel: float = 0.0,
               red_light_frames: tuple[int, int] | None = None, scene_id: int = 0, **spec_fields):
    """The two-lane road with ``agents`` (AgentTrack); ``red_light_frames`` (first, last):
    an on-route lane connector on lane 0 at x in [30, 40] is red in those frames;
    ``spec_fields``: SceneSpec fields to set (history_*, expert, expert_valid, ...)."""
    spec = straight_road(num_lanes=2, ego_lane=0, length_behind=50.0, length_ahead=200.0,
                         ego_speed=speed, ego_accel=ego_accel)
    spec.agents.extend(agents)
    for name, value in spec_fields.items():
        setattr(spec, name, value)
    if red_light_frames is not None:
        red = np.zeros(NUM_OBS_STEPS, bool)
        red[red_light_frames[0]: red_light_frames[1] + 1] = True
        xs = np.linspace(30.0, 40.0, 16)
        spec.lanes.append(LaneSpec(vertices=rectangle(30.0, 40.0, -1.75, 1.75),
                                   centerline=np.stack([xs, np.zeros(16)], -1), kind=1, on_route=True,
                                   red_light=red))
    return spec.build(scene_id=scene_id, sizes=SIZES)


def straight_poses(speed: float, num: int = 8, dt: float = 0.5, accel: float = 0.0,
                   lateral: float = 0.0) -> np.ndarray:
    """(num, 3) poses along +x at constant acceleration, with an optional final lateral
    offset reached linearly (the heading follows the path direction)."""
    t = np.arange(1, num + 1) * dt
    x = speed * t + 0.5 * accel * t**2
    y = lateral * t / t[-1]
    h = np.arctan2(np.gradient(y, x), 1.0) if lateral else np.zeros_like(x)
    return np.stack([x, y, h], -1).astype(np.float32)


def braking_poses(v0: float, stop_at: float) -> np.ndarray:
    """(8, 3) constant deceleration from v0 to a stop after ``stop_at`` metres (then standing)."""
    a = v0**2 / (2 * stop_at)
    t = np.arange(1, 9) * 0.5
    tt = np.minimum(t, v0 / a)
    x = v0 * tt - 0.5 * a * tt**2
    return np.stack([x, np.zeros(8), np.zeros(8)], -1).astype(np.float32)


def notch_spec() -> SceneSpec:
    """One lane y in [-1.75, 1.75] at 4 m/s whose drivable area has a notch x in [10.6, 11.0],
    y > 1.0; a cone beside the rear axle at t0 (y = 1.3) and a parked car ahead at x = 16.9:
    one NC, one DAC and one TTC violation for a proposal that stops at x = 8 m."""
    spec = straight_road(num_lanes=1, ego_lane=0, ego_speed=4.0)
    notch = np.array(
        [[-50, -1.75], [150, -1.75], [150, 1.75], [11.0, 1.75], [11.0, 1.0], [10.6, 1.0], [10.6, 1.75], [-50, 1.75]]
    )
    spec.drivable = [PolygonSpec(notch)]
    add_static(spec, 0.0, 1.3, agent_type=int(AgentType.TRAFFIC_CONE))
    add_agent(spec, 16.9, 0.3, speed=0.0)
    return spec
