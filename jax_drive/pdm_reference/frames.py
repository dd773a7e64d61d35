"""Float64 numpy placement of an ego-frame scene into a global (e.g. UTM-sized) frame, for
testing that scores do not depend on where the scene lies. Independent of
``jax_drive.scenes.frames`` on purpose."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _points(xy: np.ndarray, origin: np.ndarray) -> np.ndarray:
    c, s = math.cos(origin[2]), math.sin(origin[2])
    x, y = xy[..., 0], xy[..., 1]
    return np.stack([origin[0] + c * x - s * y, origin[1] + s * x + c * y], -1)


def scene_to_global(scene_np: Any, origin) -> Any:
    """Moves a single, ego-frame numpy scene so the t0 ego rear axle sits at ``origin``.

    Args:
      scene_np: Scene with numpy leaves, no batch dims, ego frame.
      origin: (3,) [x, y, heading] of the ego at t0 in the global frame.
    Returns: the Scene with agent boxes, map polygons, centrelines and the route in the
      global frame (float64). Velocities stay in the ego frame (only their magnitude is
      used by the scorer); ego state, history and expert stay ego-relative.
    """
    origin = np.asarray(origin, np.float64)
    ag = scene_np.agents
    x = np.asarray(ag.x, np.float64)
    y = np.asarray(ag.y, np.float64)
    xy = _points(np.stack([x, y], -1), origin)
    agents = ag.replace(x=xy[..., 0], y=xy[..., 1], heading=np.asarray(ag.heading, np.float64) + origin[2])
    m = scene_np.map
    new_map = m.replace(
        drivable=m.drivable.replace(vertices=_points(np.asarray(m.drivable.vertices, np.float64), origin)),
        lanes=m.lanes.replace(vertices=_points(np.asarray(m.lanes.vertices, np.float64), origin)),
        lane_centerlines=_points(np.asarray(m.lane_centerlines, np.float64), origin),
    )
    route = scene_np.route.replace(points=_points(np.asarray(scene_np.route.points, np.float64), origin))
    return scene_np.replace(agents=agents, map=new_map, route=route)
