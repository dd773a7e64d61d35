"""A batch of cooperative episodes: the batched JAX core plus one message bus per episode.

    batch = EpisodeBatch(names, keys, accident_prone)
    obs = batch.observe()                       # one jitted call for all episodes
    step = batch.decision_batch(obs, live)      # delivers messages, builds the views
    out = policy.decide(step)                   # one call for every live agent
    batch.send(step, out)                       # messages onto the buses
    batch.advance(out, live)                    # one jitted batched decision

The runner (:mod:`jax_drive.coop.runner`) adds termination, metrics and replay records on
top; the PettingZoo environment (:mod:`jax_drive.coop.env`) drives a batch of one.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.coop.messages import MessageBus
from jax_drive.coop.policy import DecisionBatch, PolicyOutput
from jax_drive.sim import core, observe, scenarios as S
from jax_drive.sim.state import Action, Cmd, SimConfig

# Batches are padded to a multiple of BUCKET episodes so compiled shapes are reused.
BUCKET = 4
# State fields copied to NumPy at every decision (the views' and the runner's).
STATE_FIELDS = observe.VIEW_STATE + (
    "collision_with", "red_runs", "offroad_steps", "progress", "stagnant_steps", "step")


@dataclasses.dataclass(frozen=True)
class Observation:
    """NumPy copy of a batch at one decision: ``state`` {field: (B, ...)} for
    :data:`STATE_FIELDS`, and :func:`jax_drive.sim.observe.observe_batch`'s ``visible``
    (B, A, A), ``lane_arc`` (B, A) and ``light`` (B, A)."""

    state: dict
    visible: np.ndarray
    lane_arc: np.ndarray
    light: np.ndarray


class EpisodeBatch:
    """E episodes (one per key) advanced together; see the module docstring.

    Args:
      names: a scenario name per episode; keys: a PRNG key per episode;
      accident_prone: a bool per episode; background: add background traffic;
      max_time: optional cap on every episode's time limit, s.
      variations: None (all nominal) or one held-out variation name per key
        (:data:`jax_drive.sim.variations.VARIATIONS`).
    Attributes: scenario, state (B >= E, padded by repeating the last episode); statics
      (E NumPy static views); buses (E message buses); logs (E lists of (t, vid, text));
      timeout (E,) s; decision (index of the next decision).
    """

    def __init__(self, names, keys, accident_prone, *, background: bool = False, cfg: SimConfig = SimConfig(),
                 max_time: float | None = None, variations=None):
        names, keys, flags = list(names), list(keys), [bool(f) for f in accident_prone]
        variations = ["nominal"] * len(keys) if variations is None else list(variations)
        if not keys or len(names) != len(keys) or len(flags) != len(keys) or len(variations) != len(keys):
            raise ValueError("need at least one episode, and one scenario name, accident_prone flag and variation "
                             "per key")
        self.cfg, self.names, self.accident_prone, self.background = cfg, names, flags, background
        n = len(keys)
        items = [S.build(nm, k, accident_prone=f, background=background, cfg=cfg, variation=v)
                 for nm, k, f, v in zip(names, keys, flags, variations)]
        size = max(BUCKET, -(-n // BUCKET) * BUCKET)
        items += [items[-1]] * (size - n)
        self.scenario = jax.tree.map(lambda *xs: jnp.stack(xs), *items)
        self.state = core.batched_reset(cfg, jnp.stack(keys + [keys[-1]] * (size - n)), self.scenario)
        self.statics = observe.static_views(self.scenario, n)
        self.route_length = np.asarray(self.scenario.route_length)[:n]
        self.buses = [MessageBus(cfg.max_agents, cfg.comm_radius, cfg.message_ttl) for _ in range(n)]
        self.logs: list[list] = [[] for _ in range(n)]
        self.timeout = np.asarray(self.scenario.timeout)[:n]
        if max_time is not None:
            self.timeout = np.minimum(self.timeout, max_time)
        self.decision = 0

    @property
    def time(self) -> float:
        """Seconds since the start of every episode."""
        return self.decision * self.cfg.decision_dt

    def observe(self) -> Observation:
        """NumPy copy of the current decision (one jitted call for the whole batch)."""
        visible, lane_arc, light = (np.asarray(v) for v in observe.observe_batch(self.cfg, self.scenario, self.state))
        state = {k: np.asarray(getattr(self.state, k)) for k in STATE_FIELDS}
        return Observation(state=state, visible=visible, lane_arc=lane_arc, light=light)

    def decision_batch(self, obs: Observation, episodes) -> DecisionBatch:
        """Delivers pending messages of ``episodes`` and returns their :class:`DecisionBatch`."""
        t = self.time
        views, buses = {}, {}
        for e in map(int, episodes):
            view = observe.numpy_view(self.statics[e], obs.state, e, obs.visible, obs.lane_arc, obs.light, t)
            present = view["valid"] & (view["success_step"] < 0)
            self.buses[e].deliver(t, np.stack([view["x"], view["y"]], -1), view["transceiver"], present)
            views[e], buses[e] = view, self.buses[e]
        return DecisionBatch(cfg=self.cfg, decision=self.decision, time=t, scenario=self.scenario, state=self.state,
                             names=self.names, episodes=np.asarray(sorted(views), np.int64), views=views, buses=buses)

    def send(self, batch: DecisionBatch, out: PolicyOutput) -> None:
        """Posts the messages of the live episodes of ``batch`` and logs them."""
        for e in batch.episodes:
            for m in out.messages.get(int(e), []):
                self.buses[e].post(m)
                self.logs[e].append((batch.time, m.sender_vid, m.text))

    def advance(self, out: PolicyOutput, episodes) -> None:
        """One batched decision: ``out``'s rows for ``episodes``, KEEP for every other row."""
        self.state = core.batched_step(self.cfg, self.scenario, self.state, self.action(out, episodes))
        self.decision += 1

    def action(self, out: PolicyOutput, episodes) -> Action:
        """The batched :class:`~jax_drive.sim.state.Action` of ``out``'s rows for
        ``episodes`` and KEEP for every other row."""
        b, a = out.command.shape
        live = np.zeros(b, bool)
        live[np.asarray(episodes, np.int64)] = True
        command = np.where(live[:, None], out.command, Cmd.KEEP)
        speed = np.where(live[:, None], out.target_speed, 0.0)
        shape = (b, a, self.cfg.num_waypoints, 2)
        waypoints = np.zeros(shape, np.float32) if out.waypoints is None else np.where(
            live[:, None, None, None], out.waypoints, 0.0)
        return Action(command=jnp.asarray(command, jnp.int32), target_speed=jnp.asarray(speed, jnp.float32),
                      waypoints=jnp.asarray(waypoints, jnp.float32))
