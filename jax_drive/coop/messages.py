"""Message bus (Python side, per episode): TalkingVehicles' in-episode V2V messages.

A message posted by agent i at decision time t is delivered at the next decision
(t + decision period) to every other agent with a transceiver whose distance to the
sender, measured at delivery time, is within ``radius``. Delivered messages stay in the
receiver's inbox while their age (now - send time) is at most ``ttl`` (2 s). Bytes are
counted as UTF-8 length of the text.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Message:
    """One message. ``data`` is an optional structured payload (dict) that rule-based
    agents can read; text agents see only ``text``."""

    sender: int  # agent index
    sender_vid: int
    time: float  # send time, s
    text: str
    data: dict | None = None

    @property
    def nbytes(self) -> int:
        return len(self.text.encode("utf-8"))


class MessageBus:
    """Delivers messages with a one-decision delay within a communication radius."""

    def __init__(self, num_agents: int, radius: float = 100.0, ttl: float = 2.0):
        if radius < 0 or ttl < 0:
            raise ValueError("radius and ttl must be non-negative")
        self.radius = float(radius)
        self.ttl = float(ttl)
        self.num_agents = int(num_agents)
        self._pending: list[Message] = []
        self._inbox: list[list[Message]] = [[] for _ in range(num_agents)]
        self.bytes_sent = 0
        self.messages_sent = 0
        self.bytes_by_agent = np.zeros(num_agents, np.int64)

    def post(self, message: Message) -> None:
        """Queues a message for delivery at the next :meth:`deliver`. Empty text is ignored."""
        if not message.text:
            return
        if not 0 <= message.sender < self.num_agents:
            raise ValueError(f"sender {message.sender} out of range")
        self._pending.append(message)
        self.bytes_sent += message.nbytes
        self.messages_sent += 1
        self.bytes_by_agent[message.sender] += message.nbytes

    def deliver(self, now: float, positions: np.ndarray, transceiver: np.ndarray, present: np.ndarray) -> None:
        """Delivers pending messages and drops expired ones.

        Args: now (s); positions (A, 2) at delivery time; transceiver, present (A,) bool.
        """
        positions = np.asarray(positions, float)
        for msg in self._pending:
            d = np.linalg.norm(positions - positions[msg.sender], axis=-1)
            ok = (d <= self.radius) & np.asarray(transceiver, bool) & np.asarray(present, bool)
            ok[msg.sender] = False
            for j in np.nonzero(ok)[0]:
                self._inbox[j].append(msg)
        self._pending = []
        for j in range(self.num_agents):
            self._inbox[j] = [m for m in self._inbox[j] if now - m.time <= self.ttl + 1e-9]

    def inbox(self, agent: int, now: float) -> list[Message]:
        """Messages currently held by ``agent`` (oldest first)."""
        return [m for m in self._inbox[agent] if now - m.time <= self.ttl + 1e-9]

    def texts(self, agent: int, now: float) -> list[tuple[float, int, str]]:
        """(age_s, sender_vid, text) for the captioner."""
        return [(now - m.time, m.sender_vid, m.text) for m in self.inbox(agent, now)]
