"""Spawn specifications: what to create in CARLA for each agent of a scenario.

Who drives (from :class:`~jax_drive.sim.state.Behaviour`):
  * POLICY agents (the focal egos): our controller (the JAX core's PID over the policy's
    commands) sends ``VehicleControl`` every tick.
  * IDM agents (background traffic, potential colliders): CARLA's Traffic Manager, told
    the agent's lane path (``set_path``), its cruise speed and whether it runs red lights.
  * STOPPED agents (the stopped truck, queued vehicles): hand brake on.
Trucks spawn as a long vehicle blueprint, cars as a sedan; the simulator then uses each
actor's real bounding box.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jax_drive.carla.frames import Anchor, to_carla, velocity_to_carla
from jax_drive.geometry import point_at_arc, polyline_table, project_on_table
from jax_drive.sim.state import Behaviour, Role

CAR_BLUEPRINT = "vehicle.lincoln.mkz_2020"
TRUCK_BLUEPRINT = "vehicle.mitsubishi.fusorosa"  # ~10 m long, like the scenarios' trucks
DRIVERS = {Behaviour.POLICY: "policy", Behaviour.IDM: "traffic_manager", Behaviour.STOPPED: "parked"}


@dataclasses.dataclass(frozen=True)
class SpawnSpec:
    """One actor to spawn (CARLA coordinates).

    Fields: slot (agent index), vehicle_id (shown in text), blueprint, role_name
    ("hero" for focal agents), x, y, z, yaw (deg), velocity (vx, vy) m/s, driver
    (policy | traffic_manager | parked), cruise_speed m/s, obeys_lights, path (K, 2): the
    lane ahead for the Traffic Manager (empty for others).
    """

    slot: int
    vehicle_id: int
    blueprint: str
    role_name: str
    x: float
    y: float
    z: float
    yaw: float
    velocity: tuple[float, float]
    driver: str
    cruise_speed: float
    obeys_lights: bool
    path: np.ndarray


def spawn_plan(scenario, anchor: Anchor, *, z_offset: float = 0.5, path_spacing: float = 5.0) -> list[SpawnSpec]:
    """Spawn specifications of every valid agent of one unbatched scenario (scenario frame),
    placed by ``anchor``; ``z_offset`` lifts spawns off the road (CARLA drops them)."""
    sc = {k: np.asarray(v) for k, v in scenario.items() if k not in ("lanes", "lights")}
    table = polyline_table(np.asarray(scenario.lanes.points, np.float64))
    out = []
    for i in map(int, np.flatnonzero(sc["valid"])):
        xy = np.array([sc["x"][i], sc["y"][i]], np.float64)
        heading = float(sc["heading"][i])
        (cx, cy), yaw = to_carla(anchor, xy, heading)
        v = float(sc["speed"][i])
        vx, vy = velocity_to_carla(anchor, v * np.array([np.cos(heading), np.sin(heading)]))
        driver = DRIVERS[Behaviour(int(sc["behaviour"][i]))]
        path = np.zeros((0, 2))
        if driver == "traffic_manager":
            lane = table.take(int(sc["lane"][i]))
            start = float(project_on_table(lane, xy, extrapolate=True).arc)
            arcs = np.arange(start + path_spacing, float(np.sum(lane.seg_len)), path_spacing)
            if len(arcs):
                path = to_carla(anchor, np.asarray(point_at_arc(lane, arcs)[0]))
        out.append(SpawnSpec(
            slot=i, vehicle_id=int(sc["vehicle_id"][i]), blueprint=TRUCK_BLUEPRINT if sc["kind"][i] else CAR_BLUEPRINT,
            role_name="hero" if sc["role"][i] == Role.FOCAL else "background", x=float(cx), y=float(cy),
            z=float(anchor.z + z_offset), yaw=float(yaw), velocity=(float(vx), float(vy)), driver=driver,
            cruise_speed=float(sc["cruise_speed"][i]), obeys_lights=bool(sc["obeys_lights"][i]), path=path))
    return out
