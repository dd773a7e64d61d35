"""A stand-in for a CARLA server, for testing jax_drive.carla without one.

It implements the part of the CARLA 0.9.16 Python API that jax_drive.carla uses (the
names of jax_drive.carla.world.CARLA_API, which the tests check against the real client
wheel) over a town made of lane polylines, with this physics per tick:
  * vehicles under VehicleControl: the JAX core's kinematic bicycle (core.bicycle) with
    acceleration throttle / 0.75 * throttle_accel or -brake_decel * brake, less drag;
  * Traffic Manager vehicles: along their set_path at the desired speed;
  * hand brake: standing still;
  * collision sensors: oriented-box overlap between vehicles (geometry.boxes_overlap_pairwise).
It is not CARLA: no tyres, suspension, junction rules or traffic-light behaviour. A
``crash()`` makes every later call raise the client's time-out RuntimeError.
"""

from __future__ import annotations

import dataclasses
import types

import numpy as np

from jax_drive.geometry import boxes_overlap_pairwise, point_at_arc, polyline_table, project_on_table
from jax_drive.sim import core
from jax_drive.sim.state import SimConfig

CFG = SimConfig()
DIMS = {"vehicle.lincoln.mkz_2020": (4.6, 2.0), "vehicle.mitsubishi.fusorosa": (10.0, 2.6)}


# ------------------------------------------------------------------------------ types
@dataclasses.dataclass
class Location:
    x: float = 0.0
    y: float = 0.0
    z: float = 0.0


Vector3D = Location


@dataclasses.dataclass
class Rotation:
    pitch: float = 0.0
    yaw: float = 0.0
    roll: float = 0.0


@dataclasses.dataclass
class Transform:
    location: Location = dataclasses.field(default_factory=Location)
    rotation: Rotation = dataclasses.field(default_factory=Rotation)


@dataclasses.dataclass
class VehicleControl:
    throttle: float = 0.0
    steer: float = 0.0
    brake: float = 0.0
    hand_brake: bool = False


@dataclasses.dataclass
class BoundingBox:
    extent: Vector3D
    location: Location = dataclasses.field(default_factory=Location)


TrafficLightState = types.SimpleNamespace(Green="Green", Yellow="Yellow", Red="Red")


@dataclasses.dataclass
class ApplyVehicleControl:
    actor_id: int
    control: VehicleControl


@dataclasses.dataclass
class DestroyActor:
    actor_id: int


command = types.SimpleNamespace(ApplyVehicleControl=ApplyVehicleControl, DestroyActor=DestroyActor)


class ServerCrashed(RuntimeError):
    pass


def timeout_error():
    return RuntimeError("time-out of 10000ms while waiting for the simulator, make sure the simulator is ready "
                        "and connected to localhost:2000")


# ------------------------------------------------------------------------------- town
class Town:
    """Lane polylines in CARLA coordinates: each lane {points (N, 2), width, lane_id,
    left, right (lane indices or None)}; ``junction`` (centre (2,), radius) or None."""

    def __init__(self, name: str, lanes: list[dict], junction=None):
        self.name = name
        self.lanes = lanes
        self.tables = [polyline_table(np.asarray(ln["points"], np.float64)) for ln in lanes]
        self.lengths = [float(np.sum(t.seg_len)) for t in self.tables]
        self.junction = junction

    def waypoint(self, lane: int, arc: float) -> Waypoint:
        return Waypoint(self, lane, float(np.clip(arc, 0.0, self.lengths[lane])))

    def get_waypoint(self, location, project_to_road=True, lane_type=None):
        q = np.array([location.x, location.y])
        best = min(range(len(self.lanes)), key=lambda k: abs(float(project_on_table(self.tables[k], q).lateral)))
        return self.waypoint(best, float(project_on_table(self.tables[best], q).arc))

    def get_topology(self):
        pairs = []
        for k in range(len(self.lanes)):
            pairs.append((self.waypoint(k, 0.0), self.waypoint(k, self.lengths[k])))
            if self.junction is not None:
                inside = [a for a in np.arange(0.0, self.lengths[k], 1.0) if self.waypoint(k, a).is_junction]
                if inside:
                    pairs.append((self.waypoint(k, inside[0]), self.waypoint(k, inside[-1])))
        return pairs

    def in_junction(self, xy) -> bool:
        return self.junction is not None and np.hypot(*(np.asarray(xy) - self.junction[0])) < self.junction[1]


@dataclasses.dataclass
class Junction:
    town: Town
    id: int = 0

    @property
    def bounding_box(self):
        c = self.town.junction[0]
        return BoundingBox(extent=Vector3D(self.town.junction[1], self.town.junction[1], 1.0),
                           location=Location(float(c[0]), float(c[1]), 0.0))

    def get_waypoints(self, lane_type=None):
        out = []
        for pair in self.town.get_topology():
            if pair[0].is_junction:
                out.append(pair)
        return out


class Waypoint:
    def __init__(self, town: Town, lane: int, arc: float):
        self.town, self.lane, self.arc = town, lane, arc
        xy, heading = point_at_arc(town.tables[lane], np.asarray(arc))
        self.xy = np.asarray(xy, np.float64)
        self.transform = Transform(Location(float(self.xy[0]), float(self.xy[1]), 0.0),
                                   Rotation(yaw=float(np.degrees(heading))))
        info = town.lanes[lane]
        self.lane_width = info["width"]
        self.lane_id = info["lane_id"]
        self.road_id = info.get("road_id", 0)
        self.lane_type = "Driving"
        self.is_junction = town.in_junction(self.xy)

    def _step(self, d: float):
        """Waypoints d metres on (negative: back) on every lane passing here in this direction."""
        out = []
        yaw = np.radians(self.transform.rotation.yaw)
        for k, table in enumerate(self.town.tables):
            p = project_on_table(table, self.xy)
            if abs(float(p.lateral)) > 0.05 or np.cos(float(p.heading) - yaw) < 0.99:
                continue
            arc = float(p.arc) + d
            if -1e-6 <= arc <= self.town.lengths[k] + 1e-6:
                out.append(self.town.waypoint(k, arc))
        return out

    def next(self, d):
        return self._step(d)

    def previous(self, d):
        return self._step(-d)

    def _neighbour(self, side):
        k = self.town.lanes[self.lane][side]
        if k is None:
            return None
        return self.town.waypoint(k, float(project_on_table(self.town.tables[k], self.xy).arc))

    def get_left_lane(self):
        return self._neighbour("left")

    def get_right_lane(self):
        return self._neighbour("right")

    def get_junction(self):
        return Junction(self.town)


# ----------------------------------------------------------------------------- actors
class Blueprint:
    def __init__(self, bp_id: str):
        self.id = bp_id
        self.attributes = {"role_name": ""}

    def has_attribute(self, name):
        return name in self.attributes

    def set_attribute(self, name, value):
        self.attributes[name] = value


class BlueprintLibrary:
    def find(self, bp_id):
        if bp_id not in DIMS and bp_id != "sensor.other.collision":
            raise IndexError(bp_id)
        return Blueprint(bp_id)


class Vehicle:
    def __init__(self, world, actor_id, bp, transform):
        self.world, self.id, self.type_id = world, actor_id, bp.id
        length, width = DIMS[bp.id]
        self.bounding_box = BoundingBox(extent=Vector3D(length / 2, width / 2, 1.0))
        self.x, self.y = transform.location.x, -transform.location.y  # right-handed inside
        self.heading = -np.radians(transform.rotation.yaw)
        self.speed = 0.0
        self.control = VehicleControl()
        self.autopilot = False
        self.path = None
        self.desired = None
        self.alive = True

    def set_target_velocity(self, v):
        self.speed = float(np.hypot(v.x, v.y))

    def apply_control(self, control):
        self.control = control

    def set_autopilot(self, on, port=8000):
        self.autopilot = bool(on)

    def destroy(self):
        self.alive = False

    def step(self, dt):
        if self.control.hand_brake:
            self.speed = 0.0
            return
        if self.autopilot and self.path is not None:
            self.speed = self.desired if self.desired is not None else self.speed
            table = polyline_table(self.path)
            arc = float(project_on_table(table, np.array([self.x, self.y]), extrapolate=True).arc)
            (x, y), h = point_at_arc(table, np.asarray(arc + self.speed * dt))
            self.x, self.y, self.heading = float(x), float(y), float(h)
            return
        c = self.control
        if c.brake > 0:
            accel = -CFG.brake_decel * c.brake - CFG.drag * self.speed
        else:
            accel = c.throttle / 0.75 * CFG.throttle_accel - CFG.drag * self.speed
        length = 2.0 * self.bounding_box.extent.x
        x, y, h, v = core.bicycle(self.x, self.y, self.heading, self.speed, accel, -c.steer * CFG.max_steer,
                                  length, dt)
        self.x, self.y, self.heading, self.speed = float(x), float(y), float(h), float(v)

    def snapshot(self):
        return ActorSnapshot(Transform(Location(self.x, -self.y, 0.0), Rotation(yaw=float(-np.degrees(self.heading)))),
                             Vector3D(self.speed * np.cos(self.heading), -self.speed * np.sin(self.heading), 0.0))


@dataclasses.dataclass
class ActorSnapshot:
    transform: Transform
    velocity: Vector3D

    def get_transform(self):
        return self.transform

    def get_velocity(self):
        return self.velocity


class Sensor:
    def __init__(self, actor_id, parent):
        self.id, self.parent, self.callback, self.alive = actor_id, parent, None, True

    def listen(self, callback):
        self.callback = callback

    def stop(self):
        self.callback = None


@dataclasses.dataclass
class CollisionEvent:
    actor: Vehicle
    other_actor: Vehicle
    frame: int


class Snapshot:
    def __init__(self, world):
        self.frame = world.frame
        self._snaps = {a.id: a.snapshot() for a in world.vehicles.values() if a.alive}

    def find(self, actor_id):
        return self._snaps.get(actor_id)


class Settings:
    synchronous_mode = False
    fixed_delta_seconds = None
    no_rendering_mode = False


class TrafficManager:
    def __init__(self, server, port):
        self.server, self.port, self.sync, self.seed = server, port, False, None

    def set_synchronous_mode(self, on):
        self.server.check()
        self.sync = on

    def set_random_device_seed(self, seed):
        self.seed = seed

    def set_desired_speed(self, actor, kmh):
        actor.desired = kmh / 3.6

    def ignore_lights_percentage(self, actor, pct):
        actor.ignore_lights = pct

    def auto_lane_change(self, actor, on):
        pass

    def distance_to_leading_vehicle(self, actor, d):
        pass

    def set_path(self, actor, locations):
        pts = np.array([[actor.x, actor.y]] + [[p.x, -p.y] for p in locations], np.float64)
        actor.path = pts


class World:
    def __init__(self, server, town: Town):
        self.server, self.town = server, town
        self.settings = Settings()
        self.vehicles: dict[int, Vehicle] = {}
        self.sensors: dict[int, Sensor] = {}
        self.frame = 0
        self._touching: set = set()
        self.ticks = 0

    def get_settings(self):
        self.server.check()
        s = Settings()
        s.__dict__.update(self.settings.__dict__)
        return s

    def apply_settings(self, settings):
        self.server.check()
        self.settings = settings

    def get_map(self):
        return self.town

    def get_blueprint_library(self):
        return BlueprintLibrary()

    def try_spawn_actor(self, bp, transform):
        self.server.check()
        length, width = DIMS[bp.id]
        q = np.array([transform.location.x, -transform.location.y])
        for v in self.vehicles.values():  # a spot already taken: CARLA returns None
            if v.alive and np.hypot(v.x - q[0], v.y - q[1]) < 1.0:
                return None
        actor = Vehicle(self, self.server.next_id(), bp, transform)
        self.vehicles[actor.id] = actor
        return actor

    def spawn_actor(self, bp, transform, attach_to=None):
        self.server.check()
        sensor = Sensor(self.server.next_id(), attach_to)
        self.sensors[sensor.id] = sensor
        return sensor

    def get_snapshot(self):
        self.server.check()
        return Snapshot(self)

    def get_traffic_lights_from_waypoint(self, wp, distance):
        return []

    def freeze_all_traffic_lights(self, on):
        pass

    def tick(self):
        self.server.check()
        if not self.settings.synchronous_mode:
            raise RuntimeError("tick() in asynchronous mode")
        dt = self.settings.fixed_delta_seconds
        live = [v for v in self.vehicles.values() if v.alive]
        for v in live:
            v.step(dt)
        self.frame += 1
        self.ticks += 1
        if len(live) > 1:
            x = np.array([v.x for v in live])
            y = np.array([v.y for v in live])
            h = np.array([v.heading for v in live])
            ln = np.array([2 * v.bounding_box.extent.x for v in live])
            wd = np.array([2 * v.bounding_box.extent.y for v in live])
            overlap = np.asarray(boxes_overlap_pairwise(x, y, h, ln, wd))
            touching = {(live[i].id, live[j].id) for i, j in zip(*np.nonzero(overlap)) if i != j}
            for a, b in touching - self._touching:
                for s in self.sensors.values():
                    if s.callback is not None and s.parent is not None and s.parent.id == a:
                        s.callback(CollisionEvent(self.vehicles[a], self.vehicles[b], self.frame))
            self._touching = touching
        return self.frame


class Server:
    """The fake server: towns by name, one world, a crash switch."""

    def __init__(self, towns: dict[str, Town], current: str):
        self.towns = towns
        self.world = World(self, towns[current])
        self._id = 100
        self.crashed = False
        self.loads = 0
        self.tms: dict[int, TrafficManager] = {}

    def next_id(self):
        self._id += 1
        return self._id

    def check(self):
        if self.crashed:
            raise timeout_error()

    def crash(self):
        self.crashed = True


class Client:
    def __init__(self, server: Server):
        self.server = server
        self.timeout = None

    def set_timeout(self, seconds):
        self.timeout = seconds

    def get_server_version(self):
        self.server.check()
        return "0.9.16-fake"

    def get_world(self):
        self.server.check()
        return self.server.world

    def load_world(self, town):
        self.server.check()
        self.server.loads += 1
        self.server.world = World(self.server, self.server.towns[town])
        return self.server.world

    def get_trafficmanager(self, port):
        self.server.check()
        return self.server.tms.setdefault(port, TrafficManager(self.server, port))

    def apply_batch(self, commands):
        self.server.check()
        w = self.server.world
        for c in commands:
            if isinstance(c, ApplyVehicleControl):
                w.vehicles[c.actor_id].apply_control(c.control)

    def apply_batch_sync(self, commands):
        self.server.check()
        w = self.server.world
        for c in commands:
            if isinstance(c, DestroyActor):
                if c.actor_id in w.vehicles:
                    w.vehicles.pop(c.actor_id).destroy()
                w.sensors.pop(c.actor_id, None)
        return []


def module(server: Server):
    """A stand-in for the ``carla`` module whose ``Client(host, port)`` reaches ``server``."""
    return types.SimpleNamespace(
        Client=lambda host, port: Client(server), Location=Location, Rotation=Rotation, Transform=Transform,
        Vector3D=Vector3D, VehicleControl=VehicleControl, TrafficLightState=TrafficLightState, command=command)
