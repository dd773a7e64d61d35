"""CoLMDriver's driving loop as a batched :class:`~jax_drive.coop.policy.Policy`.

At every decision (5 Hz control with ``SimConfig(decision_steps=4)``), for every
negotiating vehicle of every live episode:

1. the rule-based intention planner (:mod:`~jax_drive.coop.negotiation.intention`, a
   stand-in for the paper's VLM intention planner) gives a navigation and a speed
   intention and a safety cap;
2. while a negotiation outcome holds for the vehicle (its group's hold time, see
   :mod:`jax_drive.sim.grouping`), the negotiated speed intention replaces the planner's
   (never above the cap);
3. intention-guided waypoints (:func:`jax_drive.sim.actions.intention_waypoints`, one
   jitted call for the batch) are both the command (``Cmd.WAYPOINTS``, followed by the
   simulator's PID controllers) and the plan every vehicle broadcasts;
4. every ``negotiate_every`` decisions (the negotiation's own cadence inside the control
   loop) the grouping step (one jitted call for the batch) finds the groups that negotiate
   now; all of them, across episodes, run their rounds together
   (:func:`~jax_drive.coop.negotiation.negotiate.negotiate`), their outcomes replace the
   members' speed intentions and the waypoints are planned again.

Negotiation messages go onto the episodes' message buses (so they are logged and counted
in bytes) and each member's :class:`~jax_drive.coop.policy.PolicyOutput` info holds the
group's record (conversation, per-round summed intentions, scores and feedback). The
policy also keeps every record in ``log`` (reset when a run starts).
"""

from __future__ import annotations

import copy
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.coop.messages import Message
from jax_drive.coop.negotiation.intention import RuleIntentionPlanner, crossing_lanes
from jax_drive.coop.negotiation.negotiate import GroupTalk, RoundsConfig, negotiate
from jax_drive.coop.negotiation.prompts import MemberInfo, speaking_order
from jax_drive.coop.policy import DecisionBatch, PolicyOutput
from jax_drive.sim.actions import SpeedIntent, batched_intention_waypoints
from jax_drive.sim.grouping import GroupingConfig, GroupState, batched_group_step
from jax_drive.sim.state import Cmd, SimConfig

CONTROL_5HZ = SimConfig(decision_steps=4)  # CoLMDriver: controls every 4 frames of 20 Hz


@dataclasses.dataclass(frozen=True)
class NegotiationConfig:
    """What the driving loop does (one ablation arm).

    Attributes:
      negotiate: False drives with the intention planner alone (Table 2, ID 1).
      grouping: the grouping constants; ``radius`` set = everyone that close talks (ID 2).
      rounds: the rounds and the critic's parts (:class:`RoundsConfig`).
      negotiate_every: decisions between grouping / negotiation checks.
    """

    negotiate: bool = True
    grouping: GroupingConfig = GroupingConfig()
    rounds: RoundsConfig = RoundsConfig()
    negotiate_every: int = 1

    def __post_init__(self):
        if self.negotiate_every < 1:
            raise ValueError("negotiate_every must be >= 1")


@dataclasses.dataclass
class Snapshot:
    """A group as it starts negotiating, with what replanning its members needs: lanes
    (the episode's :class:`~jax_drive.sim.state.LaneGraph` as NumPy), lane, x, y, speed
    (A,) state, nav, intent, cap, stay (A,) intentions. For replaying a negotiation
    outside the driving loop (the convergence study)."""

    group: GroupTalk
    scenario: str
    context: dict

    @classmethod
    def of(cls, g: GroupTalk, batch: DecisionBatch, nav, speed, cap, stay) -> Snapshot:
        e = g.episode
        lanes = jax.tree.map(lambda x: np.asarray(x)[e], batch.scenario.lanes)
        st = {k: np.asarray(getattr(batch.state, k))[e] for k in ("lane", "x", "y", "speed")}
        return cls(group=copy.deepcopy(g), scenario=batch.names[e],
                   context=dict(lanes=lanes, **st, nav=nav[e].copy(), intent=speed[e].copy(), cap=cap[e].copy(),
                                stay=stay[e].copy()))


def snapshot_waypoints(snapshots: list[Snapshot], sim_cfg: SimConfig = CONTROL_5HZ):
    """A ``waypoints_for`` over copies of the snapshots' groups (``groups[k]`` belongs to
    ``snapshots[k]``): one batched planner call for all of them."""
    index = {id(s.group): s for s in snapshots}

    def waypoints_for(groups, intents):
        rows = []
        for g, chosen in zip(groups, intents):
            ctx = index[id(g)].context
            trial = ctx["intent"].copy()
            for s, v in zip(g.slots, g.vids):
                trial[s] = min(chosen[v], ctx["cap"][s])
            rows.append((ctx, trial, NegotiatingPolicy._navigation(ctx["nav"], ctx["stay"], trial)))
        stack = lambda key: jnp.asarray(np.stack([r[0][key] for r in rows]))  # noqa: E731
        lanes = jax.tree.map(lambda *xs: jnp.asarray(np.stack(xs)), *[r[0]["lanes"] for r in rows])
        wp = np.asarray(batched_intention_waypoints(sim_cfg, lanes, stack("lane"), stack("x"), stack("y"),
                                                    stack("speed"), jnp.asarray(np.stack([r[2] for r in rows])),
                                                    jnp.asarray(np.stack([r[1] for r in rows]))))
        return [wp[k, g.slots] for k, g in enumerate(groups)]

    return waypoints_for


class NegotiatingPolicy:
    """See the module docstring.

    Args:
      negotiator: a :class:`~jax_drive.coop.negotiation.negotiate.Negotiator` (LLM or teacher);
        may be None when ``cfg.negotiate`` is False.
      cfg: :class:`NegotiationConfig`; sim_cfg: the simulator settings of the run.
      name: the policy name in results.
    """

    def __init__(self, negotiator, cfg: NegotiationConfig = NegotiationConfig(), sim_cfg: SimConfig = CONTROL_5HZ,
                 name: str = "colmdriver", keep_snapshots: bool = False):
        if cfg.negotiate and negotiator is None:
            raise ValueError("a negotiating policy needs a negotiator")
        self.negotiator, self.cfg, self.sim_cfg, self.name = negotiator, cfg, sim_cfg, name
        self.planner = RuleIntentionPlanner(sim_cfg)
        self.log: list[dict] = []
        self.keep_snapshots = keep_snapshots
        self.snapshots: list[Snapshot] = []
        self._shape = None

    def reset(self, b: int, a: int) -> None:
        self._shape = (b, a)
        self.state = GroupState.empty((b, a))
        self.held = np.full((b, a), int(SpeedIntent.KEEP), np.int32)
        self.crossing: dict[int, np.ndarray] = {}
        self.log = []
        self.snapshots = []

    # ------------------------------------------------------------------ helpers
    def _waypoints(self, batch: DecisionBatch, nav: np.ndarray, speed: np.ndarray) -> np.ndarray:
        st = batch.state
        wp = batched_intention_waypoints(self.sim_cfg, batch.scenario.lanes, st.lane, st.x, st.y, st.speed,
                                         jnp.asarray(nav, jnp.int32), jnp.asarray(speed, jnp.int32))
        return np.asarray(wp)

    def _plan(self, batch: DecisionBatch):
        b, a = self._shape
        nav = np.zeros((b, a), np.int32)
        free = np.full((b, a), int(SpeedIntent.KEEP), np.int32)
        cap = np.full((b, a), int(SpeedIntent.FASTER), np.int32)
        stay = np.zeros((b, a), np.int32)
        live = np.zeros((b, a), bool)
        for e in map(int, batch.episodes):
            view = batch.views[e]
            if e not in self.crossing:
                self.crossing[e] = crossing_lanes(view)
            it = self.planner.plan(view, self.crossing[e])
            nav[e], free[e], cap[e], stay[e] = it.nav, it.speed, it.cap, it.stay
            live[e, it.egos] = True
        return nav, free, cap, stay, live

    @staticmethod
    def _navigation(nav, stay, speed) -> np.ndarray:
        """A vehicle that yields (STOP / SLOWER) postpones a lane change it has not started."""
        return np.where(speed <= int(SpeedIntent.SLOWER), stay, nav).astype(np.int32)

    def _effective(self, t: float, free, cap, live) -> np.ndarray:
        held = np.asarray(self.state.holding(jnp.float32(t))) & live
        return np.where(held, np.minimum(self.held, cap), free).astype(np.int32)

    def _groups(self, batch: DecisionBatch, grouping, nav, speed) -> list[GroupTalk]:
        neg = np.asarray(grouping.negotiate)
        labels = np.asarray(grouping.label)
        edge = np.asarray(grouping.edge)
        talks = []
        for e in map(int, batch.episodes):
            view = batch.views[e]
            for lab in np.unique(labels[e][neg[e]]):
                slots = np.flatnonzero(neg[e] & (labels[e] == lab))
                infos = [MemberInfo(vid=int(view["vehicle_id"][i]), x=float(view["x"][i]), y=float(view["y"][i]),
                                    heading=float(view["heading"][i]), speed=float(view["speed"][i]),
                                    nav=int(nav[e, i])) for i in slots]
                order = speaking_order(infos)
                slots = [int(slots[k]) for k in order]
                infos = [infos[k] for k in order]
                vids = [m.vid for m in infos]
                edges = [(vids[p], vids[q]) for p in range(len(slots)) for q in range(p + 1, len(slots))
                         if edge[e, slots[p], slots[q]]]
                talks.append(GroupTalk(episode=e, time=batch.time, slots=slots, vids=vids, infos=infos,
                                       default={m.vid: int(speed[e, s]) for m, s in zip(infos, slots)},
                                       speeds={m.vid: m.speed for m in infos}, edges=edges, view=view))
        return talks

    # ------------------------------------------------------------------ Policy
    def decide(self, batch: DecisionBatch) -> PolicyOutput:
        b, a = batch.size, batch.cfg.max_agents
        if batch.decision == 0 or self._shape != (b, a):
            self.reset(b, a)
        t = batch.time
        nav, free, cap, stay, live = self._plan(batch)
        speed = self._effective(t, free, cap, live)
        wp = self._waypoints(batch, self._navigation(nav, stay, speed), speed)
        talks: list[GroupTalk] = []
        if self.cfg.negotiate and batch.decision % self.cfg.negotiate_every == 0 and live.any():
            pos = jnp.stack([batch.state.x, batch.state.y], -1)
            grouping, new_state = batched_group_step(self.cfg.grouping, jnp.asarray(wp), pos, jnp.asarray(live),
                                                     self.state, jnp.float32(t))
            talks = self._groups(batch, grouping, nav, speed)
            if talks and self.keep_snapshots:
                self.snapshots += [Snapshot.of(g, batch, nav, speed, cap, stay) for g in talks]
            if talks:
                def waypoints_for(groups, intents):
                    trial = speed.copy()
                    for g, chosen in zip(groups, intents):
                        for s, v in zip(g.slots, g.vids):
                            trial[g.episode, s] = min(chosen[v], cap[g.episode, s])
                    planned = self._waypoints(batch, self._navigation(nav, stay, trial), trial)
                    return [planned[g.episode, g.slots] for g in groups]

                negotiate(talks, self.negotiator, waypoints_for, self.cfg.rounds, self.sim_cfg.waypoint_dt)
                for g in talks:
                    for s, v in zip(g.slots, g.vids):
                        self.held[g.episode, s] = g.intents.get(v, g.default[v])
            self.state = new_state
            if talks:
                speed = self._effective(t, free, cap, live)
                wp = self._waypoints(batch, self._navigation(nav, stay, speed), speed)
        out = PolicyOutput.keep(batch)
        out.command[live] = int(Cmd.WAYPOINTS)
        out.waypoints = wp.astype(np.float32)
        for g in talks:
            rec = dict(g.record(), scenario=batch.names[g.episode], decision=batch.decision)
            self.log.append(rec)
            msgs = out.messages.setdefault(g.episode, [])
            slot_of = dict(zip(g.vids, g.slots))
            for _, vid, text in g.conversation:
                msgs.append(Message(sender=slot_of[vid], sender_vid=vid, time=t, text=text))
            for s in g.slots:
                out.info[(g.episode, s)] = {"negotiation": rec}
        return out
