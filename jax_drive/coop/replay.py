"""Replay records: every decision of every focal agent, retro-labelled with the episode's
outcome (TalkingVehicles / CoopReflect replay buffer).

Sampling weight (seed Eq. 1):
  w = 1 + 2 [other agents present] + 5 max(2 - seconds to collision, 0)
        + 10 [action contributed to collision] + 0.1 [stagnation] x timestep
        + 2 [action contributed to stagnation],
normalised over the buffer by :func:`sampling_probabilities`.

"Contributed to collision": the agent later collides, the decision is within 2 s of the
collision and its command was not a braking one (stop / slow down). "Contributed to
stagnation": the agent stagnated and the command was stop or slow down.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from jax_drive.sim.metrics import COLLISION, TIMEOUT, AgentOutcome

BRAKING = ("stop", "slow down")


@dataclasses.dataclass
class Transition:
    episode: int
    scenario: str
    step: int  # decision index
    time: float  # s
    agent: int
    vehicle_id: int
    observation: str
    command: str
    target_speed: float
    message: str
    others_present: bool
    next_observation: str = ""
    # retro labels
    outcome: str = ""
    reward: float = 0.0
    feedback: str = ""
    time_to_collision: float | None = None
    contributed_to_collision: bool = False
    stagnation: bool = False
    contributed_to_stagnation: bool = False
    responses: list = dataclasses.field(default_factory=list)  # messages other agents sent next
    info: dict = dataclasses.field(default_factory=dict)  # the policy's record (PolicyOutput.info)

    def weight(self) -> float:
        w = 1.0 + 2.0 * self.others_present
        if self.time_to_collision is not None:
            w += 5.0 * max(2.0 - self.time_to_collision, 0.0)
        w += 10.0 * self.contributed_to_collision
        w += 0.1 * self.stagnation * self.step
        w += 2.0 * self.contributed_to_stagnation
        return w

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["weight"] = self.weight()
        return d


def label(transitions: list[Transition], outcomes: dict[int, AgentOutcome]) -> None:
    """Fills the retro labels in place from per-agent outcomes (keyed by agent index) and
    links each transition's next observation and the other agents' next messages."""
    by_agent: dict[int, list[Transition]] = {}
    for tr in transitions:
        by_agent.setdefault(tr.agent, []).append(tr)
    by_step: dict[int, list[Transition]] = {}
    for tr in transitions:
        by_step.setdefault(tr.step, []).append(tr)
    for agent, seq in by_agent.items():
        seq.sort(key=lambda t: t.step)
        for a, b in zip(seq[:-1], seq[1:]):
            a.next_observation = b.observation
        out = outcomes.get(agent)
        for tr in seq:
            tr.responses = [(o.vehicle_id, o.message) for o in by_step.get(tr.step + 1, []) if o.agent != agent and o.message]
            if out is None:
                continue
            tr.outcome, tr.reward, tr.feedback = out.outcome, out.reward, out.feedback()
            if out.outcome == COLLISION and out.time >= tr.time:
                tr.time_to_collision = out.time - tr.time
                tr.contributed_to_collision = tr.time_to_collision <= 2.0 and tr.command not in BRAKING
            tr.stagnation = out.outcome == TIMEOUT
            tr.contributed_to_stagnation = tr.stagnation and tr.command in BRAKING


def sampling_probabilities(transitions: list[Transition]) -> np.ndarray:
    """Normalised Eq. 1 weights (N,)."""
    w = np.array([t.weight() for t in transitions], float)
    if w.size == 0:
        return w
    return w / w.sum()


def sample_batch(transitions: list[Transition], rng: np.random.Generator, batch: int = 4) -> list[Transition]:
    """Batch context sampling without replacement (CoopReflect uses batch 4)."""
    if not transitions:
        return []
    p = sampling_probabilities(transitions)
    idx = rng.choice(len(transitions), size=min(batch, len(transitions)), replace=False, p=p)
    return [transitions[i] for i in idx]


def save_jsonl(transitions: list[Transition], path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for tr in transitions:
            f.write(json.dumps(tr.to_json()) + "\n")


def load_jsonl(path) -> list[Transition]:
    out = []
    fields = {f.name for f in dataclasses.fields(Transition)}
    with open(path, encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            out.append(Transition(**{k: v for k, v in d.items() if k in fields}))
    return out
