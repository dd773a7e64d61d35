"""Small hand-built scenes for the scorer's unit tests and benchmarks (numpy -> Scene).

Not a scene generator: a straight two-lane road along +x with optional objects moving at
constant velocity, built directly as :class:`jax_drive.types.Scene` (float32, padded).
"""

from __future__ import annotations

import numpy as np
import jax.numpy as jnp

from jax_drive.types import (
    NUM_HISTORY_STEPS,
    NUM_OBS_STEPS,
    Agents,
    AgentType,
    EgoState,
    MapData,
    Polygons,
    PolygonType,
    Route,
    Scene,
)

LANE_WIDTH = 3.5


def rect_polygon(x0: float, x1: float, y0: float, y1: float, num_vertices: int = 8) -> np.ndarray:
    """(V, 2) counter-clockwise rectangle, padded by repeating the first vertex."""
    ring = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float32)
    pad = np.repeat(ring[:1], num_vertices - 4, axis=0)
    return np.concatenate([ring, pad], 0)


def make_agent(x: float, y: float, heading: float = 0.0, vx: float = 0.0, vy: float = 0.0,
               length: float = 4.5, width: float = 2.0, agent_type: int = AgentType.VEHICLE,
               first_frame: int = 0, last_frame: int = NUM_OBS_STEPS - 1) -> dict:
    """One object moving at constant velocity (vx, vy) from (x, y) at frame 0."""
    return dict(x=x, y=y, heading=heading, vx=vx, vy=vy, length=length, width=width,
                agent_type=int(agent_type), first_frame=first_frame, last_frame=last_frame)


def straight_scene(agents: list[dict] = (), speed: float = 10.0, max_agents: int = 8,
                   road_length: float = 200.0, route: bool = True, num_lanes: int = 2,
                   extra_drivable: list[np.ndarray] = (), red_light_frames: tuple[int, int] | None = None,
                   intersection: tuple[float, float] | None = None, ego_accel: float = 0.0,
                   num_lane_polys: int = 6, num_drivable: int = 4, history: bool = True) -> Scene:
    """Two lanes along +x (lane 0: y in [-1.75, 1.75], on route; lane 1 to its left).

    Args:
      agents: dicts from :func:`make_agent`.
      speed: ego speed at t0 (m/s), heading 0 at the origin.
      route: give a route along y = 0 (False: an all-invalid, degenerate route).
      extra_drivable: extra drivable polygons (V=8 vertices each).
      red_light_frames: (first, last) frames where an on-route lane connector ahead at
        x in [30, 40] is red (the connector sits on lane 0).
      intersection: (x0, x1) an intersection polygon across the road.
    Returns: an unbatched Scene.
    """
    f = NUM_OBS_STEPS
    n = max_agents
    t = np.arange(f, dtype=np.float32) * 0.1
    ax = {k: np.zeros((n, f), np.float32) for k in ("x", "y", "z", "heading", "vx", "vy")}
    size = {k: np.ones((n,), np.float32) for k in ("length", "width", "height")}
    atype = np.zeros((n,), np.int32)
    valid = np.zeros((n, f), bool)
    for i, a in enumerate(agents):
        ax["x"][i] = a["x"] + a["vx"] * t
        ax["y"][i] = a["y"] + a["vy"] * t
        ax["heading"][i] = a["heading"]
        ax["vx"][i] = a["vx"]
        ax["vy"][i] = a["vy"]
        size["length"][i] = a["length"]
        size["width"][i] = a["width"]
        size["height"][i] = 1.5
        atype[i] = a["agent_type"]
        valid[i, a["first_frame"]: a["last_frame"] + 1] = True
    x0, x1 = -50.0, road_length
    half = LANE_WIDTH / 2
    lanes = [rect_polygon(x0, x1, -half + k * LANE_WIDTH, half + k * LANE_WIDTH) for k in range(num_lanes)]
    lane_kind = [0] * num_lanes
    lane_route = [True] + [False] * (num_lanes - 1)
    centre = [np.stack([np.linspace(x0, x1, 16), np.full(16, k * LANE_WIDTH)], -1) for k in range(num_lanes)]
    red = np.zeros((num_lane_polys, f), bool)
    if red_light_frames is not None:
        lanes.append(rect_polygon(30.0, 40.0, -half, half))
        lane_kind.append(1)
        lane_route.append(True)
        centre.append(np.stack([np.linspace(30, 40, 16), np.zeros(16)], -1))
        red[len(lanes) - 1, red_light_frames[0]: red_light_frames[1] + 1] = True
    nl = len(lanes)
    assert nl <= num_lane_polys
    lane_v = np.zeros((num_lane_polys, 8, 2), np.float32)
    lane_v[:nl] = np.stack(lanes)
    lane_valid = np.arange(num_lane_polys) < nl
    kinds = np.zeros(num_lane_polys, np.int32)
    kinds[:nl] = lane_kind
    on_route = np.zeros(num_lane_polys, bool)
    on_route[:nl] = lane_route
    cl = np.zeros((num_lane_polys, 16, 2), np.float32)
    cl[:nl] = np.stack(centre)
    cl_valid = np.zeros((num_lane_polys, 16), bool)
    cl_valid[:nl] = True

    drv = [rect_polygon(x0, x1, -half, half + (num_lanes - 1) * LANE_WIDTH)]
    dkind = [int(PolygonType.ROADBLOCK)]
    if intersection is not None:
        drv.append(rect_polygon(intersection[0], intersection[1], -half, half + (num_lanes - 1) * LANE_WIDTH))
        dkind.append(int(PolygonType.INTERSECTION))
    for p in extra_drivable:
        drv.append(np.asarray(p, np.float32))
        dkind.append(int(PolygonType.ROADBLOCK))
    nd = len(drv)
    assert nd <= num_drivable
    drv_v = np.zeros((num_drivable, 8, 2), np.float32)
    drv_v[:nd] = np.stack(drv)
    dk = np.zeros(num_drivable, np.int32)
    dk[:nd] = dkind

    r = np.stack([np.linspace(-20.0, x1, 32), np.zeros(32)], -1).astype(np.float32)
    rv = np.full(32, route)

    ht = (np.arange(NUM_HISTORY_STEPS, dtype=np.float32) - (NUM_HISTORY_STEPS - 1)) * 0.1
    hist = np.zeros((NUM_HISTORY_STEPS, 3), np.float32)
    if history:
        hist[:, 0] = speed * ht
    hv = np.zeros((NUM_HISTORY_STEPS, 2), np.float32)
    hv[:, 0] = speed
    ego = EgoState(velocity=jnp.asarray([speed, 0.0], jnp.float32),
                   acceleration=jnp.asarray([ego_accel, 0.0], jnp.float32),
                   steering_angle=jnp.asarray(0.0, jnp.float32), history_poses=jnp.asarray(hist),
                   history_velocity=jnp.asarray(hv),
                   history_acceleration=jnp.zeros((NUM_HISTORY_STEPS, 2), jnp.float32))
    agents_dc = Agents(**{k: jnp.asarray(v) for k, v in ax.items()},
                       **{k: jnp.asarray(v) for k, v in size.items()},
                       agent_type=jnp.asarray(atype), valid=jnp.asarray(valid))
    mp = MapData(
        drivable=Polygons(vertices=jnp.asarray(drv_v), valid=jnp.asarray(np.arange(num_drivable) < nd),
                          kind=jnp.asarray(dk), on_route=jnp.zeros(num_drivable, bool)),
        lanes=Polygons(vertices=jnp.asarray(lane_v), valid=jnp.asarray(lane_valid),
                       kind=jnp.asarray(kinds), on_route=jnp.asarray(on_route)),
        lane_centerlines=jnp.asarray(cl), lane_centerline_valid=jnp.asarray(cl_valid),
        red_light=jnp.asarray(red), speed_limit=jnp.asarray(15.0, jnp.float32))
    return Scene(ego=ego, agents=agents_dc, map=mp,
                 route=Route(points=jnp.asarray(r), valid=jnp.asarray(rv)),
                 command=jnp.asarray(1, jnp.int32), expert=jnp.zeros((8, 3), jnp.float32),
                 scene_id=jnp.asarray(0, jnp.int32))


def straight_poses(speed: float, num: int = 8, dt: float = 0.5, accel: float = 0.0,
                   lateral: float = 0.0) -> np.ndarray:
    """(num, 3) poses along +x at constant acceleration, optional final lateral offset
    reached linearly (heading follows the path direction)."""
    t = np.arange(1, num + 1) * dt
    x = speed * t + 0.5 * accel * t**2
    y = lateral * t / t[-1]
    h = np.arctan2(np.gradient(y, x), 1.0) if lateral else np.zeros_like(x)
    return np.stack([x, y, h], -1).astype(np.float32)


def stack_scenes(scenes: list[Scene]) -> Scene:
    """Stacks unbatched scenes along a new leading axis."""
    import jax

    return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *scenes)
