"""PettingZoo ParallelEnv and a single-agent Gymnasium wrapper over the batched JAX core:
the environment contract of cooperative driving (other backends implement the same).

Agents are the focal vehicles of a scenario (slot names ``agent_<k>``; the stopped truck
of the perception scenarios is an agent too: it can only talk). Each step is one
decision period (0.5 s by default).

* observation: the structured array of :func:`jax_drive.sim.observe.structured`
  (``OBS_SIZE`` floats); the caption text, received messages and vehicle id are in
  ``infos[agent]``.
* action: ``{"command": Discrete(7), "message": Text}`` where the command indexes
  GO, STOP, SLOW_DOWN, SPEED_UP, LANE_LEFT, LANE_RIGHT, KEEP; GO uses the agent's task
  speed. A bare int is accepted as a command without a message.
* reward: +1 on arrival, -1 on collision, 0 otherwise (stagnation until the time limit).

The episode is an :class:`~jax_drive.coop.episodes.EpisodeBatch` of one; ``decision``
holds the current :class:`~jax_drive.coop.policy.DecisionBatch`, so batched policies can
drive some agents (as :class:`SingleAgentEnv` does with its baseline).
"""

from __future__ import annotations

import gymnasium
import jax
import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from jax_drive.coop.episodes import EpisodeBatch
from jax_drive.coop.messages import Message
from jax_drive.coop.policy import PolicyOutput
from jax_drive.sim import observe, scenarios as S
from jax_drive.sim.state import Behaviour, Cmd, Role, SimConfig

NUM_COMMANDS = 7  # Cmd.GO .. Cmd.KEEP


class CoopDrivingParallelEnv(ParallelEnv):
    """Multi-agent cooperative driving (one episode at a time)."""

    metadata = {"name": "jax_drive_coop_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, scenario: str = "tv_overtake_perception", accident_prone: bool | None = None,
                 background: bool = False, cfg: SimConfig = SimConfig(), max_message_length: int = 256):
        S.family(scenario)
        self.scenario = scenario
        self.accident_prone = accident_prone
        self.background = background
        self.cfg = cfg
        self.max_message_length = max_message_length
        self.possible_agents = [f"agent_{k}" for k in range(cfg.max_agents)]
        self._obs_space = spaces.Box(-np.inf, np.inf, (observe.OBS_SIZE,), np.float32)
        self._act_space = spaces.Dict({"command": spaces.Discrete(NUM_COMMANDS),
                                       "message": spaces.Text(max_length=max_message_length)})
        self.agents: list[str] = []
        self._episode = 0
        self._seed = 0

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    @property
    def static(self) -> dict:
        """Static NumPy view of the current episode."""
        return self.batch.statics[0]

    def slot(self, agent: str) -> int:
        """Vehicle slot of an agent name."""
        return self._slots[agent]

    # ----------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._seed, self._episode = int(seed), 0
        key = jax.random.fold_in(jax.random.key(self._seed), self._episode)
        ap = self.accident_prone if self.accident_prone is not None else bool(self._episode % 2 == 0)
        self._episode += 1
        self.batch = self._new_batch(key, ap)
        s = self.static
        self._slots = {f"agent_{k}": int(k) for k in np.flatnonzero(s["valid"] & (s["role"] == Role.FOCAL))}
        self.agents = list(self._slots)
        self._rewarded: set[str] = set()
        return self._observe(self.batch.observe())

    def _new_batch(self, key, accident_prone: bool) -> EpisodeBatch:
        """The batch of one episode (another backend overrides this, e.g. CARLA)."""
        return EpisodeBatch([self.scenario], [key], [accident_prone], background=self.background, cfg=self.cfg)

    def _observe(self, obs):
        self.decision = self.batch.decision_batch(obs, [0])
        arrays = np.asarray(observe.structured_batch(self.cfg, self.batch.scenario, self.batch.state,
                                                     obs.visible))[0]
        observations, infos = {}, {}
        for name in self.agents:
            i = self._slots[name]
            observations[name] = arrays[i].astype(np.float32)
            infos[name] = {"vehicle_id": int(self.static["vehicle_id"][i]), "caption": self.decision.caption(0, i),
                           "messages": self.decision.buses[0].texts(i, self.decision.time)}
        return observations, infos

    def step(self, actions: dict):
        out = PolicyOutput.keep(self.decision)
        for name, act in actions.items():
            if name not in self._slots:
                raise KeyError(f"unknown or finished agent {name!r}")
            i = self._slots[name]
            command, message = (act, "") if np.ndim(act) == 0 and not isinstance(act, dict) else (
                act.get("command", Cmd.KEEP), act.get("message", ""))
            command = int(command)
            if not 0 <= command < NUM_COMMANDS:
                raise ValueError(f"command {command} out of range [0, {NUM_COMMANDS})")
            out.command[0, i] = command
            out.target_speed[0, i] = self.static["cruise_speed"][i]
            if message and self.static["transceiver"][i]:
                out.messages.setdefault(0, []).append(Message(
                    sender=i, sender_vid=int(self.static["vehicle_id"][i]), time=self.decision.time,
                    text=str(message)[: self.max_message_length]))
        self.batch.send(self.decision, out)
        self.batch.advance(out, [0])
        obs = self.batch.observe()
        st = {k: v[0] for k, v in obs.state.items()}
        eligible = self.static["valid"] & self.static["reward"] & (self.static["role"] == Role.FOCAL)
        all_done = bool(np.all(st["done"][eligible])) if eligible.any() else True
        timeout = bool(self.batch.time >= self.batch.timeout[0] - 1e-9)
        rewards, terms, truncs = {}, {}, {}
        for name in self.agents:
            i = self._slots[name]
            r = 0.0
            if name not in self._rewarded and self.static["reward"][i]:
                if st["collision_step"][i] >= 0:
                    r = -1.0
                    self._rewarded.add(name)
                elif st["success_step"][i] >= 0:
                    r = 1.0
                    self._rewarded.add(name)
            rewards[name] = r
            own_done = bool(st["done"][i]) if self.static["behaviour"][i] == Behaviour.POLICY else all_done
            terms[name] = own_done or all_done
            truncs[name] = timeout and not terms[name]
        observations, infos = self._observe(obs)
        self.agents = [n for n in self.agents if not (terms[n] or truncs[n])]
        return observations, rewards, terms, truncs, infos

    def state(self):
        return jax.tree.map(np.asarray, self.batch.state)

    def close(self):
        pass


class SingleAgentEnv(gymnasium.Env):
    """Gymnasium view of one focal agent; the other focal agents follow ``others``
    (a baseline policy, rule-based by default). Action: Discrete command index."""

    metadata = {"render_modes": []}

    def __init__(self, scenario: str = "tv_highway_merge", agent_rank: int = 0, others: str = "rule_based",
                 accident_prone: bool | None = None, background: bool = False, cfg: SimConfig = SimConfig()):
        from jax_drive.coop.baselines import make_policy

        self.env = CoopDrivingParallelEnv(scenario, accident_prone, background, cfg)
        self.agent_rank = agent_rank
        self.others = make_policy(others)
        self.observation_space = spaces.Box(-np.inf, np.inf, (observe.OBS_SIZE,), np.float32)
        self.action_space = spaces.Discrete(NUM_COMMANDS)

    def _me(self):
        movers = [n for n in self.env.agents if self.env.static["behaviour"][self.env.slot(n)] == Behaviour.POLICY]
        return movers[min(self.agent_rank, len(movers) - 1)]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        obs, infos = self.env.reset(seed=seed)
        self.me = self._me()
        return obs[self.me], infos[self.me]

    def step(self, action):
        out = self.others.decide(self.env.decision)
        mine = self.env.slot(self.me)
        actions = {n: int(out.command[0, self.env.slot(n)]) for n in self.env.agents}
        actions[self.me] = int(action)
        # the others' messages go out with this step's own (none from the learner)
        self.env.batch.send(self.env.decision, PolicyOutput(
            command=out.command, target_speed=out.target_speed,
            messages={0: [m for m in out.messages.get(0, []) if m.sender != mine]}))
        obs, rew, term, trunc, infos = self.env.step(actions)
        return obs[self.me], rew[self.me], term[self.me], trunc[self.me], infos[self.me]
