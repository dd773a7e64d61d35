"""Episode runner: batched JAX physics, one policy call per decision, message buses,
metrics and replay records.

    results, replay = run_episodes("tv_red_light", keys, accident_prone=[...],
                                   policy=RuleBasedPolicy())

At each decision the whole batch is observed in one jitted call, pending messages are
delivered (one decision after sending, within the radius), the policy decides for every
live agent of every live episode in one :meth:`~jax_drive.coop.policy.Policy.decide`
call, and one jitted vmapped decision advances every episode. An episode ends when every
focal reward-eligible agent has arrived or collided, at its time limit, or (InterDrive)
when its unfinished egos have been blocked (< 0.5 m/s) for 30 s.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jax_drive.coop.episodes import STATE_FIELDS, EpisodeBatch
from jax_drive.coop.policy import DecisionBatch, Policy, PolicyOutput
from jax_drive.coop.replay import Transition, label
from jax_drive.sim import metrics as M, scenarios as S
from jax_drive.sim.state import CMD_NAMES, Cmd, Role, SimConfig

BLOCKED_SECONDS = 30.0


@dataclasses.dataclass
class EpisodeResult:
    scenario: str
    accident_prone: bool
    background: bool
    policy: str
    outcomes: list  # AgentOutcome of focal reward-eligible agents
    end_time: float
    bytes_sent: int
    messages_sent: int
    metrics: dict
    trajectory: dict | None = None  # poses (T, A, 4): x, y, heading, present; static view; decision_dt
    message_log: list = dataclasses.field(default_factory=list)  # (t, vid, text)

    @property
    def feedback(self) -> list[str]:
        return [o.feedback() for o in self.outcomes]


def _records(batch: DecisionBatch, out: PolicyOutput) -> list[Transition]:
    """Replay transitions of every present focal agent of the live episodes (captions)."""
    records = []
    for e in map(int, batch.episodes):
        view = batch.views[e]
        sent = {m.sender: m.text for m in out.messages.get(e, [])}
        present = view["valid"] & (view["success_step"] < 0)
        for i in map(int, np.flatnonzero(view["valid"] & (view["role"] == Role.FOCAL) & present)):
            records.append(Transition(
                episode=e, scenario=batch.names[e], step=batch.decision, time=batch.time, agent=i,
                vehicle_id=int(view["vehicle_id"][i]), observation=batch.caption(e, i),
                command=CMD_NAMES[Cmd(int(out.command[e, i]))], target_speed=float(out.target_speed[e, i]),
                message=sent.get(i, ""), others_present=bool(view["visible"][i].any()),
                info=out.info.get((e, i), {})))
    return records


def run_episodes(name, keys, *, accident_prone, policy: Policy, background: bool = False,
                 cfg: SimConfig = SimConfig(), record: bool = False, keep_trajectory: bool = False,
                 progress=None, max_time: float | None = None, variations=None,
                 batch: EpisodeBatch | None = None) -> tuple[list[EpisodeResult], list[Transition]]:
    """Runs one batch of episodes (one per key) of scenario ``name`` (a name, or one
    name per key).

    Args:
      accident_prone: bool or one bool per key.
      policy: a :class:`~jax_drive.coop.policy.Policy` (``name`` and batched ``decide``);
        the baselines of :mod:`jax_drive.coop.baselines` are per-episode policies.
      record: keep replay transitions with captions (slower: text per agent per step).
      keep_trajectory: keep poses for rendering.
      progress: optional callable(n_decisions_done) for progress bars.
      max_time: optional cap on every episode's time limit, s (quick checks).
      variations: None (nominal) or a held-out variation name per key
        (:mod:`jax_drive.sim.variations`).
      batch: an already built batch with the :class:`EpisodeBatch` interface (another
        backend, e.g. :class:`jax_drive.carla.env.CarlaEpisodeBatch`); then ``name``,
        ``keys``, ``accident_prone``, ``background``, ``max_time`` and ``variations`` are taken
        from it.
    Returns: per-episode results (input order) and replay transitions.
    """
    if batch is None:
        keys = list(keys)
        n = len(keys)
        flags = [bool(accident_prone)] * n if np.ndim(accident_prone) == 0 else [bool(f) for f in accident_prone]
        names = [name] * n if isinstance(name, str) else list(name)
        batch = EpisodeBatch(names, keys, flags, background=background, cfg=cfg, max_time=max_time,
                             variations=variations)
    names, flags, background, cfg = batch.names, batch.accident_prone, batch.background, batch.cfg
    n = len(names)
    interdrive = [S.family(nm) == "interdrive" for nm in names]
    eligible = [np.flatnonzero(s["valid"] & s["reward"] & (s["role"] == Role.FOCAL)) for s in batch.statics]
    ended = np.zeros(n, bool)
    end_step = np.zeros(n, np.int64)
    snapshots: list[dict | None] = [None] * n
    transitions: list[Transition] = []
    traj: list[list] = [[] for _ in range(n)]
    max_decisions = int(np.ceil(batch.timeout.max() / cfg.decision_dt))
    for d in range(max_decisions + 1):
        obs = batch.observe()
        st = obs.state
        was_ended = ended.copy()
        for e in np.flatnonzero(~ended):
            el = eligible[e]
            finished = bool(np.all(st["done"][e][el])) if len(el) else True
            blocked = interdrive[e] and bool(np.all(st["done"][e][el] | (
                st["stagnant_steps"][e][el] * cfg.dt >= BLOCKED_SECONDS)))
            if finished or blocked or batch.time >= batch.timeout[e] - 1e-9 or d == max_decisions:
                ended[e] = True
                end_step[e] = int(st["step"][e])
                snapshots[e] = {k: st[k][e].copy() for k in STATE_FIELDS}
        if keep_trajectory:
            for e in np.flatnonzero(~was_ended):
                traj[e].append(np.stack([st["x"][e], st["y"][e], st["heading"][e], st["success_step"][e] < 0], -1))
        if ended.all():
            break
        live = np.flatnonzero(~ended)
        step = batch.decision_batch(obs, live)
        out = policy.decide(step)
        batch.send(step, out)
        if record:
            transitions.extend(_records(step, out))
        batch.advance(out, live)
        if progress is not None:
            progress(d + 1)
    results = []
    for e in range(n):
        snap = dict(snapshots[e], vehicle_id=batch.statics[e]["vehicle_id"], route_length=batch.route_length[e])
        outs = M.agent_outcomes(snap, cfg.dt, int(end_step[e]), eligible[e])
        met = M.interdrive_episode(outs) if interdrive[e] else M.talking_vehicles_rates(outs)
        trajectory = None
        if keep_trajectory:
            trajectory = dict(poses=np.stack(traj[e]), static=batch.statics[e], decision_dt=cfg.decision_dt)
        bus = batch.buses[e]
        results.append(EpisodeResult(
            scenario=names[e], accident_prone=flags[e], background=background, policy=policy.name, outcomes=outs,
            end_time=end_step[e] * cfg.dt, bytes_sent=bus.bytes_sent, messages_sent=bus.messages_sent,
            metrics=met, trajectory=trajectory, message_log=batch.logs[e]))
        if record:
            label([tr for tr in transitions if tr.episode == e], {o.index: o for o in outs})
    return results, transitions
