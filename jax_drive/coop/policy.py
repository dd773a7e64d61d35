"""The policy interface of cooperative episodes: one call per decision for every live agent
of every episode of a batch.

    class MyPolicy:
        name = "mine"

        def decide(self, batch: DecisionBatch) -> PolicyOutput:
            prompts = [batch.caption(e, i) for e, i in batch.agents]   # all agents, all episodes
            answers = engine.generate(prompts)                         # one call
            out = PolicyOutput.keep(batch)
            for (e, i), answer in zip(batch.agents, answers):
                out.command[e, i], out.target_speed[e, i] = ...
                out.messages.setdefault(e, []).append(Message(...))
                out.info[(e, i)] = {"prompt": ..., "answer": ...}        # kept in the replay record
            return out

:class:`DecisionBatch` carries both sides of the simulator: NumPy views per episode and the
message buses (for Python-side and language policies) and the batched JAX scenario and
state (for JAX-side planners, e.g. intention waypoints or conflict grouping vmapped over
episodes). :class:`PolicyOutput` holds commands, target speeds, optional waypoints (for
``Cmd.WAYPOINTS``), messages and per-agent records. Policies that reason about one
episode at a time subclass :class:`EpisodePolicy` and implement ``act``.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

from jax_drive.coop.messages import Message, MessageBus
from jax_drive.sim import observe
from jax_drive.sim.state import Cmd, Role, Scenario, SimConfig, SimState


@dataclasses.dataclass
class DecisionBatch:
    """Every live agent of every live episode at one decision.

    Fields:
      cfg: the simulator settings.
      decision: decision index d; time: d x ``cfg.decision_dt`` s (the same in every episode).
      scenario, state: the whole batch as JAX pytrees, leading axis B (live, ended and
        padding episodes; index them with the episode numbers below).
      names: scenario name of each episode (E <= B).
      episodes: (n,) int, the live episodes, ascending.
      views: {episode: NumPy view} (:func:`jax_drive.sim.observe.numpy_view`).
      buses: {episode: MessageBus}, already delivered for this decision.
      agents: (N, 2) int (episode, slot) of every live agent, episode-major: focal, valid
        and not done (arrived or collided). A stopped focal vehicle is live too: its
        commands are ignored, its messages are sent.
    """

    cfg: SimConfig
    decision: int
    time: float
    scenario: Scenario
    state: SimState
    names: list[str]
    episodes: np.ndarray
    views: dict[int, dict]
    buses: dict[int, MessageBus]
    agents: np.ndarray = dataclasses.field(init=False)

    def __post_init__(self):
        rows = []
        for e in self.episodes:
            v = self.views[e]
            live = np.flatnonzero(v["valid"] & (v["role"] == Role.FOCAL) & ~v["done"])
            rows.append(np.stack([np.full(len(live), e), live], -1))
        self.agents = np.concatenate(rows).astype(np.int64) if rows else np.zeros((0, 2), np.int64)

    @property
    def size(self) -> int:
        """B, the leading axis of ``scenario``, ``state`` and :class:`PolicyOutput` arrays."""
        return int(self.scenario.valid.shape[0])

    def inbox(self, episode: int, agent: int) -> list[Message]:
        """Messages ``agent`` of ``episode`` holds now (oldest first)."""
        return self.buses[episode].inbox(agent, self.time)

    def inboxes(self, episode: int) -> list[list[Message]]:
        """Inbox of every agent slot of ``episode``."""
        return [self.inbox(episode, i) for i in range(self.cfg.max_agents)]

    def caption(self, episode: int, agent: int) -> str:
        """Text observation of ``agent``: what it sees, its task and its received messages."""
        view = self.views[episode]
        return observe.caption(view, agent, self.buses[episode].texts(agent, self.time),
                               observe.task_text(view, agent))


@dataclasses.dataclass
class PolicyOutput:
    """A policy's answer for a batch; rows of episodes that are not live are ignored.

    Fields:
      command: (B, A) int32 :class:`~jax_drive.sim.state.Cmd` (KEEP by default).
      target_speed: (B, A) float32 m/s for GO (<= 0: the lane speed limit).
      waypoints: (B, A, W, 2) float32 world-frame waypoints 0.2 s apart for
        ``Cmd.WAYPOINTS``, or None when no agent follows waypoints.
      messages: {episode: [Message]} sent now, delivered at the next decision.
      info: {(episode, agent): dict} kept in that agent's replay record of this decision
        (prompt, raw answer, parse failures, latency, token counts, ...).
    """

    command: np.ndarray
    target_speed: np.ndarray
    waypoints: np.ndarray | None = None
    messages: dict[int, list[Message]] = dataclasses.field(default_factory=dict)
    info: dict[tuple[int, int], dict] = dataclasses.field(default_factory=dict)

    @classmethod
    def keep(cls, batch: DecisionBatch) -> PolicyOutput:
        """KEEP for every agent, no messages."""
        shape = (batch.size, batch.cfg.max_agents)
        return cls(command=np.full(shape, Cmd.KEEP, np.int32), target_speed=np.zeros(shape, np.float32))


class Policy(Protocol):
    """Anything with a ``name`` and a batched ``decide``."""

    name: str

    def decide(self, batch: DecisionBatch) -> PolicyOutput: ...


class EpisodePolicy:
    """Base of policies that reason about one episode at a time (the rule-based baselines).

    Subclasses implement ``act(view, inboxes) -> (command (A,), target_speed (A,),
    messages)`` over one episode's NumPy view and every slot's inbox; :meth:`decide` calls
    it for each live episode in order.
    """

    name = "episode"

    def act(self, view: dict, inboxes: list[list[Message]]):
        raise NotImplementedError

    def decide(self, batch: DecisionBatch) -> PolicyOutput:
        out = PolicyOutput.keep(batch)
        for e in batch.episodes:
            command, speed, messages = self.act(batch.views[e], batch.inboxes(e))
            out.command[e], out.target_speed[e] = command, speed
            out.messages[e] = list(messages)
        return out
