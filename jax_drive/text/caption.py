"""Text scene descriptions for policies without vision.

A caption lists, in the ego rear-axle frame at t0 (x forward, y left, metres, radians):

* the ego speed and acceleration and the speed limit;
* the route centreline ahead: pose (x, y, heading) every ``station_spacing`` metres;
* the drivable area across the route at those stations: how far it reaches to the right
  and to the left of the route point (``off the drivable area`` when the route point is
  outside it);
* red traffic lights on route lane connectors at t0 and their distance along the route;
* the nearest objects present at t0, as ``(x, y, z, l, w, h, heading, name)`` boxes (the
  PDM feedback's object format) with their speed.

The map facts are computed for the whole batch in one jitted call
(:func:`map_facts`); the text is then written per scene on the host. Nothing about the
expert future is used.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive import geometry
from jax_drive.text.codec import format_point
from jax_drive.text.feedback import format_box
from jax_drive.types import Scene


@dataclasses.dataclass(frozen=True)
class CaptionConfig:
    """Caption options.

    max_agents: at most this many objects, nearest first (default 8).
    radius: objects farther than this from the ego at t0 are left out (default 50 m).
    min_x: objects whose centre is behind this longitudinal offset (ego frame, metres) are
      left out, e.g. -5.0 keeps what is ahead of or beside the ego (default None: all).
    num_stations, station_spacing: route stations 0, 10, .., 40 m ahead of the ego's
      projection on the route (defaults 5 and 10 m).
    lateral_half_width, lateral_step: the drivable extent is sampled across the route up to
      15 m each side every 0.25 m (reported extents are lower bounds within one step).
    red_light_range: report red lights up to this far along the route (default 80 m).
    """

    max_agents: int = 8
    radius: float = 50.0
    min_x: float | None = None
    num_stations: int = 5
    station_spacing: float = 10.0
    lateral_half_width: float = 15.0
    lateral_step: float = 0.25
    red_light_range: float = 80.0


def _route_pose_at(points, valid, s):
    """Pose (..., S, 3) at arc lengths s (..., S) along a padded route (..., R, 2)."""
    cum = geometry.polyline_arc_lengths(points, valid)  # (..., R)

    def interp(s_, c, p):
        return jnp.stack([jnp.interp(s_, c, p[:, 0]), jnp.interp(s_, c, p[:, 1])], -1)

    flat_s = s.reshape((-1,) + s.shape[-1:])
    flat_c = cum.reshape((-1,) + cum.shape[-1:])
    flat_p = points.reshape((-1,) + points.shape[-2:])
    at = jax.vmap(interp)(flat_s, flat_c, flat_p)
    ahead = jax.vmap(interp)(flat_s + 0.5, flat_c, flat_p)
    behind = jax.vmap(interp)(flat_s - 0.5, flat_c, flat_p)
    tangent = ahead - behind
    heading = jnp.arctan2(tangent[..., 1], tangent[..., 0])
    pose = jnp.concatenate([at, heading[..., None]], -1)
    return pose.reshape(s.shape + (3,)), cum[..., -1]


@functools.partial(jax.jit, static_argnums=1)
def map_facts(scene: Scene, config: CaptionConfig = CaptionConfig()) -> dict[str, jax.Array]:
    """Route stations, drivable extents and red lights for a batch of scenes.

    Returns a dict of arrays with the scene's batch dims (...):
      station_pose (..., S, 3), station_valid (..., S) bool (the route reaches it),
      station_on_road (..., S) bool, left_extent / right_extent (..., S) metres,
      red_distance (..., L) along-route distance of each lane, red (..., L) bool: a route
      lane connector with a red light at t0 within range.
    """
    route, rvalid = scene.route.points, scene.route.valid
    origin = jnp.zeros(route.shape[:-2] + (1, 2), route.dtype)
    s0, _ = geometry.project_on_polyline(origin, route, rvalid)  # (..., 1)
    offsets = jnp.arange(config.num_stations) * config.station_spacing
    s = s0 + offsets  # (..., S)
    pose, total = _route_pose_at(route, rvalid, s)
    station_valid = s <= total[..., None] + 1e-3

    n_side = int(round(config.lateral_half_width / config.lateral_step))
    lateral = jnp.arange(-n_side, n_side + 1) * config.lateral_step  # (J,)
    normal = jnp.stack([-jnp.sin(pose[..., 2]), jnp.cos(pose[..., 2])], -1)  # (..., S, 2) left
    samples = pose[..., None, :2] + lateral[:, None] * normal[..., None, :]  # (..., S, J, 2)
    shape = samples.shape
    flat = samples.reshape(shape[:-3] + (-1, 2))
    drv = scene.map.drivable
    inside = geometry.points_in_polygons(flat, drv.vertices, drv.valid).any(-1)
    inside = inside.reshape(shape[:-1])  # (..., S, J)
    left_run = jnp.cumprod(inside[..., n_side:], axis=-1).sum(-1)
    right_run = jnp.cumprod(inside[..., n_side::-1], axis=-1).sum(-1)
    on_road = inside[..., n_side]
    left_extent = jnp.maximum(left_run - 1, 0) * config.lateral_step
    right_extent = jnp.maximum(right_run - 1, 0) * config.lateral_step

    lanes = scene.map.lanes
    first = scene.map.lane_centerlines[..., 0, :]  # (..., L, 2)
    arc, _ = geometry.project_on_polyline(first, route, rvalid)  # (..., L)
    red_distance = arc - s0
    red = (
        lanes.valid
        & lanes.on_route
        & (lanes.kind == 1)
        & scene.map.red_light[..., 0]
        & (red_distance > -5.0)
        & (red_distance < config.red_light_range)
    )
    return dict(
        station_pose=pose,
        station_valid=station_valid,
        station_on_road=on_road,
        left_extent=left_extent,
        right_extent=right_extent,
        red_distance=red_distance,
        red=red,
    )


def _f(value: float) -> str:
    return f"{round(float(value), 2) + 0.0:.2f}"


def caption_text(scene: Scene, facts: dict[str, np.ndarray], config: CaptionConfig = CaptionConfig()) -> str:
    """The caption of ONE scene (no batch dims; numpy or jax leaves) from its map facts."""
    ego = scene.ego
    speed = float(np.hypot(*np.asarray(ego.velocity)))
    accel = float(np.asarray(ego.acceleration)[0])
    lines = [
        f"- Ego: speed {_f(speed)} m/s, longitudinal acceleration {_f(accel)} m/s^2; "
        f"speed limit {_f(np.asarray(scene.map.speed_limit))} m/s."
    ]
    valid = np.asarray(facts["station_valid"], bool)
    pose = np.asarray(facts["station_pose"])
    if valid.any():
        stations = [
            f"{int(round(i * config.station_spacing))} m: {format_point(pose[i])}"
            for i in range(len(valid))
            if valid[i]
        ]
        lines.append("- Route centreline ahead (x, y, heading): " + ", ".join(stations) + ".")
        extents = []
        for i in range(len(valid)):
            if not valid[i]:
                continue
            where = f"at {int(round(i * config.station_spacing))} m"
            if not bool(facts["station_on_road"][i]):
                extents.append(f"{where} the route point is off the drivable area")
            else:
                extents.append(
                    f"{where} from {_f(facts['right_extent'][i])} m right to "
                    f"{_f(facts['left_extent'][i])} m left"
                )
        lines.append("- Drivable area across the route: " + "; ".join(extents) + ".")
    else:
        lines.append("- No route ahead.")
    red = np.asarray(facts["red"], bool)
    if red.any():
        dist = np.asarray(facts["red_distance"])[red]
        lines.append(f"- Red traffic light on the route {_f(max(float(dist.min()), 0.0))} m ahead.")
    else:
        lines.append("- No red traffic light on the route ahead.")
    agents = scene.agents
    present = np.asarray(agents.valid)[:, 0]
    x, y = np.asarray(agents.x)[:, 0], np.asarray(agents.y)[:, 0]
    dist = np.hypot(x, y)
    near = present & (dist <= config.radius)
    if config.min_x is not None:
        near &= x >= config.min_x
    keep = np.flatnonzero(near)
    keep = keep[np.argsort(dist[keep], kind="stable")][: config.max_agents]
    if len(keep):
        lines.append("- Objects (x, y, z, l, w, h, heading, name) and speed:")
        for i in keep:
            box = [
                x[i], y[i], np.asarray(agents.z)[i, 0], np.asarray(agents.length)[i],
                np.asarray(agents.width)[i], np.asarray(agents.height)[i], np.asarray(agents.heading)[i, 0],
            ]
            v = float(np.hypot(np.asarray(agents.vx)[i, 0], np.asarray(agents.vy)[i, 0]))
            lines.append(f"  {format_box(box, np.asarray(agents.agent_type)[i])} at {_f(v)} m/s")
    else:
        lines.append(f"- No objects within {int(config.radius)} m.")
    return "\n".join(lines)


def caption_scenes(scene: Scene, config: CaptionConfig = CaptionConfig()) -> list[str]:
    """Captions of a batch of scenes (one leading batch dim): N strings."""
    facts = jax.device_get(map_facts(scene, config))
    host = jax.device_get(scene)
    n = int(np.asarray(host.command).shape[0])
    return [
        caption_text(
            jax.tree.map(lambda a: a[i], host),
            {k: v[i] for k, v in facts.items()},
            config,
        )
        for i in range(n)
    ]
