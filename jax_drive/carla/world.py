"""One CARLA server session: :class:`CarlaWorld`.

Synchronous mode at ``1 / cfg.dt`` Hz (20 Hz: ``fixed_delta_seconds = 0.05``), this
client the only one that ticks; a Traffic Manager on its own port, synchronous too, with a
fixed random seed; the town loaded only when it changes (reloading leaks memory and is
what crashes long CARLA runs). Actors are spawned from :mod:`jax_drive.carla.spawn`
specifications; a collision sensor on every actor reports contacts. Controls go out in one
batch per tick, poses come back from one world snapshot per tick, in the scenario frame.
The scenario's fixed-cycle lights are imposed on the CARLA traffic lights that govern its
stop lines (all lights frozen, states set every tick). :meth:`close` turns synchronous
mode off again, or the server would wait for ticks that never come.

Every CARLA call the backend makes is listed in :data:`CARLA_API` (checked against the
client wheel by the tests). ``carla`` and ``client`` are passed in: the real module and a
``carla.Client``, or a stand-in with the same API.
"""

from __future__ import annotations

import numpy as np

from jax_drive.carla.frames import Anchor, to_carla, to_local, velocity_to_local
from jax_drive.carla.sites import Site, TracedLane, find_anchor, trace_lane
from jax_drive.carla.spawn import SpawnSpec, spawn_plan

CARLA_API = (
    "Client.set_timeout", "Client.get_world", "Client.load_world", "Client.get_trafficmanager",
    "Client.apply_batch", "Client.apply_batch_sync", "Client.get_server_version",
    "World.get_settings", "World.apply_settings", "World.tick", "World.get_map", "World.get_blueprint_library",
    "World.try_spawn_actor", "World.spawn_actor", "World.get_snapshot", "World.get_traffic_lights_from_waypoint",
    "World.freeze_all_traffic_lights",
    "WorldSettings.synchronous_mode", "WorldSettings.fixed_delta_seconds", "WorldSettings.no_rendering_mode",
    "TrafficManager.set_synchronous_mode", "TrafficManager.set_random_device_seed", "TrafficManager.set_desired_speed",
    "TrafficManager.ignore_lights_percentage", "TrafficManager.auto_lane_change", "TrafficManager.set_path",
    "TrafficManager.distance_to_leading_vehicle",
    "Vehicle.set_autopilot", "Vehicle.apply_control", "Vehicle.set_target_velocity", "Vehicle.bounding_box",
    "Vehicle.id", "Vehicle.destroy",
    "Map.get_waypoint", "Map.get_topology", "Map.name",
    "Waypoint.next", "Waypoint.previous", "Waypoint.transform", "Waypoint.lane_width", "Waypoint.is_junction", "Waypoint.get_junction",
    "Waypoint.get_left_lane", "Waypoint.get_right_lane", "Waypoint.lane_id", "Waypoint.lane_type",
    "Junction.id", "Junction.bounding_box", "Junction.get_waypoints",
    "WorldSnapshot.find", "ActorSnapshot.get_transform", "ActorSnapshot.get_velocity",
    "TrafficLight.set_state", "Sensor.listen", "Sensor.stop", "CollisionEvent.other_actor",
    "BlueprintLibrary.find", "ActorBlueprint.set_attribute", "ActorBlueprint.has_attribute",
    "Location", "Rotation", "Transform", "Vector3D", "VehicleControl", "TrafficLightState.Red",
    "TrafficLightState.Yellow", "TrafficLightState.Green", "command.ApplyVehicleControl", "command.DestroyActor",
)
COLLISION_SENSOR = "sensor.other.collision"


class SpawnFailed(ValueError):
    """CARLA refused a spawn (the spot is taken or off the map)."""


class CarlaWorld:
    """A CARLA server session for episodes (see the module docstring).

    Args:
      client: ``carla.Client`` (timeout already set); carla: the ``carla`` module.
      tm_port: this world's Traffic Manager port (one per server: a second manager on a
        port in use becomes a client of the first).
      dt: simulation step, s (``SimConfig.dt``); seed: Traffic Manager seed.
      no_rendering: CARLA's no-rendering mode (no cameras are used).
    """

    def __init__(self, client, carla, *, tm_port: int = 8000, dt: float = 0.05, seed: int = 0,
                 no_rendering: bool = True):
        self.client, self.carla, self.dt = client, carla, float(dt)
        self.world = client.get_world()
        self.tm = client.get_trafficmanager(int(tm_port))
        self.tm_port = int(tm_port)
        self.no_rendering = no_rendering
        self.tm.set_random_device_seed(int(seed))
        self._map = self.world.get_map()
        self._anchors: dict = {}
        self.anchor: Anchor | None = None
        self.actors: dict[int, object] = {}  # slot -> actor
        self.sensors: list = []
        self._slot_of: dict[int, int] = {}  # actor id -> slot
        self._contacts: list[tuple[int, int]] = []
        self._lights: dict[int, list] = {}  # our light index -> CARLA traffic lights
        self._set_sync(True)

    # ------------------------------------------------------------------ settings
    def _set_sync(self, on: bool) -> None:
        settings = self.world.get_settings()
        settings.synchronous_mode = on
        settings.fixed_delta_seconds = self.dt if on else None
        settings.no_rendering_mode = self.no_rendering and on
        self.world.apply_settings(settings)
        self.tm.set_synchronous_mode(on)

    def load(self, town: str) -> None:
        """Loads ``town`` unless it is the current map (then nothing is reloaded)."""
        if not self._map.name.endswith(town):
            self.clear()
            self.world = self.client.load_world(town)
            self._map = self.world.get_map()
            self._lights = {}
            self._set_sync(True)

    def site_anchor(self, site: Site) -> Anchor:
        """The anchor of ``site`` on its town (loaded if needed; found once and cached)."""
        self.load(site.town)
        key = (site.town, site.kind, site.anchor, site.near)
        if key not in self._anchors:
            self._anchors[key] = find_anchor(self._map, site, location=self.carla.Location)
        return self._anchors[key]

    def trace(self, points: np.ndarray) -> TracedLane:
        """The current town's lane along ``points`` (P, 2) CARLA x, y."""
        return trace_lane(self._map, points, location=self.carla.Location)

    # -------------------------------------------------------------------- actors
    def spawn(self, scenario, anchor: Anchor) -> dict[int, tuple[float, float]]:
        """Spawns every valid agent of ``scenario`` (unbatched, scenario frame), ticks once
        (the episode's clock starts after it) and starts their drivers; returns {slot: (length, width)} of the spawned actors' bounding boxes."""
        carla = self.carla
        self.clear()
        self.anchor = anchor
        library = self.world.get_blueprint_library()
        plan = spawn_plan(scenario, anchor)
        sizes = {}
        for spec in plan:
            bp = library.find(spec.blueprint)
            if bp.has_attribute("role_name"):
                bp.set_attribute("role_name", spec.role_name)
            transform = carla.Transform(carla.Location(x=spec.x, y=spec.y, z=spec.z), carla.Rotation(yaw=spec.yaw))
            actor = self.world.try_spawn_actor(bp, transform)
            if actor is None:
                self.clear()
                raise SpawnFailed(f"CARLA refused to spawn vehicle {spec.vehicle_id} ({spec.blueprint}) at "
                                  f"({spec.x:.1f}, {spec.y:.1f}, yaw {spec.yaw:.0f})")
            self.actors[spec.slot] = actor
            self._slot_of[actor.id] = spec.slot
            extent = actor.bounding_box.extent
            sizes[spec.slot] = (2.0 * float(extent.x), 2.0 * float(extent.y))
            sensor = self.world.spawn_actor(library.find(COLLISION_SENSOR), carla.Transform(), attach_to=actor)
            sensor.listen(self._on_collision)
            self.sensors.append(sensor)
        self.world.tick()  # the actors exist (at rest): now they take velocities and drivers
        for spec in plan:
            self._start_driver(spec)
        return sizes

    def _start_driver(self, spec: SpawnSpec) -> None:
        carla, actor = self.carla, self.actors[spec.slot]
        actor.set_target_velocity(carla.Vector3D(x=spec.velocity[0], y=spec.velocity[1], z=0.0))
        if spec.driver == "parked":
            actor.apply_control(carla.VehicleControl(brake=1.0, hand_brake=True))
        elif spec.driver == "traffic_manager":
            actor.set_autopilot(True, self.tm_port)
            self.tm.set_desired_speed(actor, 3.6 * spec.cruise_speed)  # km/h
            self.tm.ignore_lights_percentage(actor, 0.0 if spec.obeys_lights else 100.0)
            self.tm.auto_lane_change(actor, False)
            if len(spec.path):
                self.tm.set_path(actor, [carla.Location(x=float(x), y=float(y), z=spec.z) for x, y in spec.path])

    def _on_collision(self, event) -> None:
        """Sensor callback (runs on the client's stream thread): records (slot, other slot or -1)."""
        slot = self._slot_of.get(event.actor.id)
        if slot is not None:
            self._contacts.append((slot, self._slot_of.get(event.other_actor.id, -1)))

    def pop_collisions(self) -> list[tuple[int, int]]:
        """Contacts reported since the last call: (slot, other slot or -1 for anything else)."""
        contacts, self._contacts = self._contacts, []
        return contacts

    def control(self, slots, throttle, steer, brake) -> None:
        """One VehicleControl per slot (our steer is counter-clockwise: CARLA's is flipped)."""
        carla = self.carla
        batch = [carla.command.ApplyVehicleControl(self.actors[s].id, carla.VehicleControl(
            throttle=float(t), steer=float(-st), brake=float(b))) for s, t, st, b in zip(slots, throttle, steer, brake)
            if s in self.actors]
        if batch:
            self.client.apply_batch(batch)

    def stop(self, slots) -> None:
        """Brakes ``slots`` to a halt and takes them from the Traffic Manager (crashed agents
        stay where they are, as in the JAX core)."""
        for s in slots:
            actor = self.actors.get(int(s))
            if actor is not None:
                actor.set_autopilot(False, self.tm_port)
                actor.apply_control(self.carla.VehicleControl(throttle=0.0, brake=1.0, hand_brake=True))

    def remove(self, slots) -> None:
        """Destroys ``slots`` (agents that arrived leave the world, as in the JAX core)."""
        ids = []
        for s in slots:
            actor = self.actors.pop(int(s), None)
            if actor is not None:
                ids.append(actor.id)
        if ids:
            self.client.apply_batch_sync([self.carla.command.DestroyActor(i) for i in ids])

    def tick(self) -> int:
        """Advances the world by one step; returns the frame number."""
        return self.world.tick()

    def read(self, num_agents: int) -> dict[str, np.ndarray]:
        """Poses of the spawned agents in the scenario frame: x, y, heading, speed (A,)
        and ``live`` (A,) bool (NaN / False for slots without an actor)."""
        out = {k: np.full(num_agents, np.nan) for k in ("x", "y", "heading", "speed")}
        live = np.zeros(num_agents, bool)
        snapshot = self.world.get_snapshot()
        slots, xy, yaw, vel = [], [], [], []
        for slot, actor in self.actors.items():
            snap = snapshot.find(actor.id)
            if snap is None:
                continue
            tr, v = snap.get_transform(), snap.get_velocity()
            slots.append(slot)
            xy.append((tr.location.x, tr.location.y))
            yaw.append(tr.rotation.yaw)
            vel.append((v.x, v.y))
        if slots:
            idx = np.asarray(slots)
            local, heading = to_local(self.anchor, np.asarray(xy), np.asarray(yaw))
            out["x"][idx], out["y"][idx], out["heading"][idx] = local[:, 0], local[:, 1], heading
            out["speed"][idx] = np.linalg.norm(velocity_to_local(self.anchor, np.asarray(vel)), axis=-1)
            live[idx] = True
        out["live"] = live
        return out

    # -------------------------------------------------------------------- lights
    def bind_lights(self, scenario, stop_points: dict[int, np.ndarray]) -> None:
        """Finds, for each of our lights, the CARLA traffic lights governing its stop lines
        ({light index: (K, 2) stop points, scenario frame}), and freezes the world's lights
        so that only :meth:`set_lights` changes them."""
        self._lights = {}
        for k, points in stop_points.items():
            found = {}
            for p in to_carla(self.anchor, np.asarray(points, np.float64).reshape(-1, 2)):
                wp = self._map.get_waypoint(self.carla.Location(x=float(p[0]), y=float(p[1]), z=self.anchor.z))
                for tl in self.world.get_traffic_lights_from_waypoint(wp, 15.0) if wp is not None else ():
                    found[tl.id] = tl
            self._lights[k] = list(found.values())
        if self._lights:
            self.world.freeze_all_traffic_lights(True)

    def set_lights(self, states) -> None:
        """Sets the bound CARLA lights to our states (K,) (0 green, 1 yellow, 2 red)."""
        names = ("Green", "Yellow", "Red")
        for k, lights in self._lights.items():
            state = getattr(self.carla.TrafficLightState, names[int(states[k])])
            for tl in lights:
                tl.set_state(state)

    # ------------------------------------------------------------------- cleanup
    def clear(self) -> None:
        """Destroys every actor and sensor of the current episode."""
        for sensor in self.sensors:
            sensor.stop()
        ids = [s.id for s in self.sensors] + [a.id for a in self.actors.values()]
        if ids:
            self.client.apply_batch_sync([self.carla.command.DestroyActor(i) for i in ids])
        self.sensors, self.actors, self._slot_of, self._contacts = [], {}, {}, []

    def close(self) -> None:
        """Clears the episode and hands the server back in asynchronous mode."""
        try:
            self.clear()
        finally:
            if self._lights:
                self.world.freeze_all_traffic_lights(False)
            self._set_sync(False)
