"""PettingZoo ParallelEnv and a single-agent Gymnasium wrapper over the batched JAX core.

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
"""

from __future__ import annotations

import functools

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from jax_drive.sim import core, observe, runner, scenarios as S
from jax_drive.sim.messages import Message, MessageBus
from jax_drive.sim.state import Behaviour, Cmd, Role, SimConfig

NUM_COMMANDS = 7  # Cmd.GO .. Cmd.KEEP


@functools.partial(jax.jit, static_argnums=0)
def _obs(cfg, sc, st):
    vis, arc, light = runner.observe_batch(cfg, sc, st)
    arrays = observe.structured_batch(cfg, sc, st, vis)
    return vis, arc, light, arrays


class CoopDrivingParallelEnv(ParallelEnv):
    """Multi-agent cooperative driving (one episode at a time, batch of one)."""

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

    # ----------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._seed, self._episode = int(seed), 0
        key = jax.random.fold_in(jax.random.key(self._seed), self._episode)
        ap = self.accident_prone if self.accident_prone is not None else bool(self._episode % 2 == 0)
        self._episode += 1
        one = S.build(self.scenario, key, accident_prone=ap, background=self.background, cfg=self.cfg)
        # replicated to the runner's batch bucket so the compiled batched functions are shared
        self.sc = jax.tree.map(lambda v: jnp.stack([v] * runner.BUCKET), one)
        self.st = core.batched_reset(self.cfg, jnp.stack([key] * runner.BUCKET), self.sc)
        sc_np = {k: np.asarray(getattr(self.sc, k)) for k in self.sc.keys() if k not in ("lanes", "lights")}
        sc_np["lanes"] = {k: np.asarray(v) for k, v in self.sc.lanes.items()}
        self.static = runner.scenario_view(sc_np, 0)
        self.timeout = float(one.timeout)
        s = self.static
        focal = np.nonzero(s["valid"] & (s["role"] == Role.FOCAL))[0]
        self._slots = {f"agent_{k}": int(k) for k in focal}
        self.agents = list(self._slots)
        self.bus = MessageBus(self.cfg.max_agents, self.cfg.comm_radius, self.cfg.message_ttl)
        self.t = 0.0
        self._rewarded: set[str] = set()
        obs, infos = self._observe()
        return obs, infos

    def _observe(self):
        vis, arc, light, arrays = _obs(self.cfg, self.sc, self.st)
        st_np = {k: np.asarray(getattr(self.st, k)) for k in
                 ("x", "y", "heading", "speed", "lane", "done", "success_step", "collision_step")}
        self.view = runner.numpy_view(self.static, st_np, 0, np.asarray(vis), np.asarray(arc), np.asarray(light), self.t)
        present = self.static["valid"] & (st_np["success_step"][0] < 0)
        self.bus.deliver(self.t, np.stack([self.view["x"], self.view["y"]], -1), self.static["transceiver"], present)
        arrays = np.asarray(arrays)[0]
        obs, infos = {}, {}
        for name in self.agents:
            i = self._slots[name]
            obs[name] = arrays[i].astype(np.float32)
            infos[name] = {
                "vehicle_id": int(self.static["vehicle_id"][i]),
                "caption": observe.caption(self.view, i, self.bus.texts(i, self.t), runner.task_text(self.view, i)),
                "messages": self.bus.texts(i, self.t),
            }
        return obs, infos

    def step(self, actions: dict):
        a = self.cfg.max_agents
        cmds = np.full((runner.BUCKET, a), Cmd.KEEP, np.int32)
        speeds = np.zeros((runner.BUCKET, a), np.float32)
        for name, act in actions.items():
            if name not in self._slots:
                raise KeyError(f"unknown or finished agent {name!r}")
            i = self._slots[name]
            command, message = (act, "") if np.ndim(act) == 0 and not isinstance(act, dict) else (
                act.get("command", Cmd.KEEP), act.get("message", ""))
            command = int(command)
            if not 0 <= command < NUM_COMMANDS:
                raise ValueError(f"command {command} out of range [0, {NUM_COMMANDS})")
            cmds[0, i] = command
            speeds[0, i] = self.static["cruise_speed"][i]
            if message and self.static["transceiver"][i]:
                self.bus.post(Message(sender=i, sender_vid=int(self.static["vehicle_id"][i]), time=self.t,
                                      text=str(message)[: self.max_message_length]))
        self.st = core.batched_step(self.cfg, self.sc, self.st, runner._actions(self.cfg, cmds, speeds))
        self.t += self.cfg.decision_dt
        st = jax.tree.map(lambda v: np.asarray(v)[0], self.st)
        eligible = self.static["valid"] & self.static["reward"] & (self.static["role"] == Role.FOCAL)
        all_done = bool(np.all(st.done[eligible])) if eligible.any() else True
        timeout = self.t >= self.timeout - 1e-9
        rewards, terms, truncs = {}, {}, {}
        for name in self.agents:
            i = self._slots[name]
            r = 0.0
            if name not in self._rewarded and self.static["reward"][i]:
                if st.collision_step[i] >= 0:
                    r = -1.0
                    self._rewarded.add(name)
                elif st.success_step[i] >= 0:
                    r = 1.0
                    self._rewarded.add(name)
            rewards[name] = r
            own_done = bool(st.done[i]) if self.static["behaviour"][i] == Behaviour.POLICY else all_done
            terms[name] = own_done or all_done
            truncs[name] = timeout and not terms[name]
        obs, infos = self._observe()
        self.agents = [n for n in self.agents if not (terms[n] or truncs[n])]
        return obs, rewards, terms, truncs, infos

    def state(self):
        return jax.tree.map(np.asarray, self.st)

    def close(self):
        pass


class SingleAgentEnv(gymnasium.Env):
    """Gymnasium view of one focal agent; the other focal agents follow ``others``
    (a baseline policy, rule-based by default). Action: Discrete command index."""

    metadata = {"render_modes": []}

    def __init__(self, scenario: str = "tv_highway_merge", agent_rank: int = 0, others: str = "rule_based",
                 accident_prone: bool | None = None, background: bool = False, cfg: SimConfig = SimConfig()):
        from jax_drive.sim.baselines import make_policy

        self.env = CoopDrivingParallelEnv(scenario, accident_prone, background, cfg)
        self.agent_rank = agent_rank
        self.others = make_policy(others)
        self.observation_space = spaces.Box(-np.inf, np.inf, (observe.OBS_SIZE,), np.float32)
        self.action_space = spaces.Discrete(NUM_COMMANDS)

    def _me(self):
        movers = [n for n in self.env.agents if self.env.static["behaviour"][self.env._slots[n]] == Behaviour.POLICY]
        return movers[min(self.agent_rank, len(movers) - 1)]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        obs, infos = self.env.reset(seed=seed)
        self.me = self._me()
        return obs[self.me], infos[self.me]

    def step(self, action):
        view = self.env.view
        inboxes = [self.env.bus.inbox(i, self.env.t) for i in range(self.env.cfg.max_agents)]
        cmd, _, msgs = self.others.act(view, inboxes)
        for m in msgs:
            if m.sender != self.env._slots[self.me]:
                self.env.bus.post(m)
        actions = {n: int(cmd[self.env._slots[n]]) for n in self.env.agents}
        actions[self.me] = int(action)
        obs, rew, term, trunc, infos = self.env.step(actions)
        return obs[self.me], rew[self.me], term[self.me], trunc[self.me], infos[self.me]
