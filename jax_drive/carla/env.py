"""The environment contract over CARLA: an episode batch and the PettingZoo environment
(the Ray worker's runner is :class:`jax_drive.distributed.backends.CarlaRunner`).

:class:`CarlaEpisodeBatch` has the interface of :class:`jax_drive.coop.episodes.EpisodeBatch`
(one episode), so :func:`jax_drive.coop.runner.run_episodes` (``batch=``) and
:class:`jax_drive.coop.env.CoopDrivingParallelEnv` run on it unchanged. Its ``state`` is a
:class:`~jax_drive.sim.state.SimState` mirror of the CARLA world in the scenario frame:
every tick the JAX core's own controller (:func:`jax_drive.sim.core.tick_fast`, whose
predicted pose is discarded) turns the latched commands into throttle, brake and steer for
the policy agents; CARLA moves every actor; the measured poses replace the mirror's and
:func:`jax_drive.sim.core.measured_events` finds arrivals, progress, red-light runs,
stagnation and box-overlap collisions, to which the collision sensors' contacts are added.
Observations (visibility, captions), messages and metrics are then the same code as on the
JAX backend. Crashed agents are braked to a halt and arrived ones leave the world, as in
the JAX core.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.carla.sites import Site, build_on_town, site_of
from jax_drive.carla.world import CarlaWorld
from jax_drive.coop.env import CoopDrivingParallelEnv
from jax_drive.coop.episodes import EpisodeBatch
from jax_drive.coop.messages import MessageBus
from jax_drive.coop.policy import PolicyOutput
from jax_drive.geometry import point_at_arc, polyline_table
from jax_drive.sim import core, observe
from jax_drive.sim.state import Behaviour, SimConfig

_latch = jax.jit(core.apply_action, static_argnums=0)
_tables = jax.jit(core.tables)
_controller = jax.jit(core.tick_fast, static_argnums=(0, 6))
_events = jax.jit(core.measured_events, static_argnums=0)
_offroad = jax.jit(core.offroad, static_argnums=0)
_lane_light = jax.jit(core.lane_light)
_light_state = jax.jit(core.light_state)


@jax.jit
def _coords(tab: core.Tables, st):
    return core.lane_coords(tab.cur, jnp.stack([st.x, st.y], -1))


def pedals(cfg: SimConfig, accel: np.ndarray, speed: np.ndarray, steer: np.ndarray):
    """Throttle [0, 0.75], brake {0, 1} and steer [-1, 1] (counter-clockwise positive) that
    the core's longitudinal and lateral controllers chose, recovered from the acceleration
    and road-wheel angle of their tick: the core applies
    ``throttle / 0.75 * throttle_accel - drag * speed`` or ``-brake_decel - drag * speed``."""
    raw = np.asarray(accel, np.float64) + cfg.drag * np.asarray(speed, np.float64)
    brake = raw < -0.5 * cfg.brake_decel
    throttle = np.where(brake, 0.0, np.clip(raw / cfg.throttle_accel * 0.75, 0.0, 0.75))
    return throttle, brake.astype(np.float64), np.clip(np.asarray(steer, np.float64) / cfg.max_steer, -1.0, 1.0)


def _one(tree):
    return jax.tree.map(lambda v: v[None], tree)


class CarlaEpisodeBatch(EpisodeBatch):
    """One episode of scenario ``name`` on a :class:`~jax_drive.carla.world.CarlaWorld`
    (see the module docstring). ``site`` defaults to the scenario's layout's site;
    ``tolerance`` (m) bounds how far the town's lanes may be from the scenario's."""

    def __init__(self, world: CarlaWorld, name: str, key, accident_prone: bool, *, background: bool = False,
                 cfg: SimConfig = SimConfig(), max_time: float | None = None, site: Site | None = None,
                 tolerance: float = 6.0):
        if abs(world.dt - cfg.dt) > 1e-9:
            raise ValueError(f"the world ticks every {world.dt} s but cfg.dt is {cfg.dt} s")
        self.world, self.cfg, self.names = world, cfg, [name]
        self.accident_prone, self.background = [bool(accident_prone)], bool(background)
        anchor = world.site_anchor(site or site_of(name))
        sc = build_on_town(name, key, anchor, world.trace, accident_prone=accident_prone, background=background,
                           cfg=cfg, tolerance=tolerance)
        sizes = world.spawn(sc, anchor)
        length, width = np.asarray(sc.length).copy(), np.asarray(sc.width).copy()
        for slot, (ln, wd) in sizes.items():
            length[slot], width[slot] = ln, wd
        sc = sc.replace(length=jnp.asarray(length, jnp.float32), width=jnp.asarray(width, jnp.float32))
        world.bind_lights(sc, self._stop_points(sc))
        self._sc = sc
        self._st = self._measured(core.reset(cfg, key, sc), world.read(cfg.max_agents))
        self.scenario, self.state = _one(sc), _one(self._st)
        self.statics = observe.static_views(self.scenario, 1)
        self.route_length = np.asarray(sc.route_length)[None]
        self.buses = [MessageBus(cfg.max_agents, cfg.comm_radius, cfg.message_ttl)]
        self.logs = [[]]
        self.timeout = np.asarray(sc.timeout)[None]
        if max_time is not None:
            self.timeout = np.minimum(self.timeout, max_time)
        self.decision = 0

    @staticmethod
    def _stop_points(sc) -> dict[int, np.ndarray]:
        """{light index: (K, 2) stop-line points of the lanes it governs} (scenario frame)."""
        lanes = sc.lanes
        light, valid = np.asarray(lanes.light), np.asarray(lanes.valid)
        table = polyline_table(np.asarray(lanes.points, np.float64))
        out: dict[int, list] = {}
        for lane in np.flatnonzero(valid & (light >= 0)):
            xy, _ = point_at_arc(table.take(int(lane)), np.asarray(float(lanes.stop_arc[lane])))
            out.setdefault(int(light[lane]), []).append(np.asarray(xy))
        return {k: np.stack(v) for k, v in out.items()}

    @staticmethod
    def _measured(st, m: dict):
        """``st`` with the measured poses of the live actors."""
        live = m["live"]
        pick = lambda k: jnp.asarray(np.where(live, m[k], np.asarray(getattr(st, k))), jnp.float32)  # noqa: E731
        return st.replace(x=pick("x"), y=pick("y"), heading=pick("heading"), speed=pick("speed"))

    def advance(self, out: PolicyOutput, episodes) -> None:
        """One decision: latch the commands, then ``decision_steps`` CARLA ticks."""
        cfg, sc, world = self.cfg, self._sc, self.world
        action = jax.tree.map(lambda v: v[0], self.action(out, episodes))
        st = _latch(cfg, sc, self._st, action)
        tab = _tables(sc, st)
        policy = np.asarray(sc.valid) & (np.asarray(sc.behaviour) == Behaviour.POLICY)
        for _ in range(cfg.decision_steps):
            arc, lat = _coords(tab, st)
            ctrl, _, _ = _controller(cfg, sc, st, tab, arc, lat, True)
            t = float(st.step) * cfg.dt
            world.set_lights(np.asarray(_light_state(sc.lights, t)))
            present = np.asarray(sc.valid) & (np.asarray(st.success_step) < 0)
            movers = np.flatnonzero(policy & present & (np.asarray(st.collision_step) < 0))
            throttle, brake, steer = pedals(cfg, np.asarray(ctrl.accel)[movers], np.asarray(st.speed)[movers],
                                            np.asarray(ctrl.steer)[movers])
            world.control(movers, throttle, steer, brake)
            world.tick()
            light = _lane_light(sc, st.lane, t)
            new = self._measured(st, world.read(cfg.max_agents)).replace(
                step=st.step + 1, accel=ctrl.accel, steer=ctrl.steer, lat_err=ctrl.lat_err, lon_err=ctrl.lon_err)
            new, _, _ = _events(cfg, sc, new, arc, light, jnp.asarray(present), tab)
            new = self._add_contacts(st, new, world.pop_collisions())
            crashed = np.flatnonzero((np.asarray(new.collision_step) >= 0) & (np.asarray(st.collision_step) < 0))
            arrived = np.flatnonzero((np.asarray(new.success_step) >= 0) & (np.asarray(st.success_step) < 0))
            world.stop(crashed)
            world.remove(arrived)
            st = new
        moving = (np.asarray(sc.valid) & (np.asarray(st.success_step) < 0) & (np.asarray(st.collision_step) < 0)
                  & (np.asarray(sc.behaviour) != Behaviour.STOPPED))
        off = np.asarray(_offroad(cfg, sc, st, tab)) & moving
        st = st.replace(offroad_steps=st.offroad_steps + cfg.decision_steps * jnp.asarray(off, jnp.int32))
        self._st, self.state = st, _one(st)
        self.decision += 1

    @staticmethod
    def _add_contacts(before, st, contacts):
        """Collision-sensor contacts of this tick as collisions (the first one counts)."""
        if not contacts:
            return st
        step = int(before.step)
        cs, cw = np.asarray(st.collision_step).copy(), np.asarray(st.collision_with).copy()
        present = np.asarray(before.success_step) < 0
        for slot, other in contacts:
            if cs[slot] < 0 and present[slot]:
                cs[slot], cw[slot] = step + 1, other
        done = (cs >= 0) | (np.asarray(st.success_step) >= 0)
        return st.replace(collision_step=jnp.asarray(cs, jnp.int32), collision_with=jnp.asarray(cw, jnp.int32),
                          done=jnp.asarray(done))


class CarlaParallelEnv(CoopDrivingParallelEnv):
    """:class:`~jax_drive.coop.env.CoopDrivingParallelEnv` on a CARLA world: the same
    spaces, observations (structured arrays and captions), messages and rewards."""

    def __init__(self, world: CarlaWorld, scenario: str = "tv_overtake_perception", accident_prone: bool | None = None,
                 background: bool = False, cfg: SimConfig = SimConfig(), max_message_length: int = 256):
        super().__init__(scenario, accident_prone, background, cfg, max_message_length)
        self.world = world

    def _new_batch(self, key, accident_prone: bool) -> EpisodeBatch:
        return CarlaEpisodeBatch(self.world, self.scenario, key, accident_prone, background=self.background,
                                 cfg=self.cfg)

    def close(self):
        self.world.clear()
