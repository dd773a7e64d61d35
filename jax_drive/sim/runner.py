"""Episode runner: batched JAX physics + Python-side policies, message bus, captioner,
metrics and replay records.

    results, replay = run_episodes("tv_red_light", keys, accident_prone=[...],
                                   policy=RuleBasedPolicy())

At each decision the whole batch is observed in one jitted call (visibility, lane arcs,
lights), each episode's policy acts on a NumPy view, messages are delivered one decision
later within the radius, and one jitted vmapped :func:`~jax_drive.sim.core.step`
advances every episode. An episode ends when every focal reward-eligible agent has
arrived or collided, at its time limit, or (InterDrive) when its unfinished egos have
been blocked (< 0.5 m/s) for 30 s.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.sim import core, lanes as lanes_lib, metrics as M, observe, scenarios as S
from jax_drive.sim.messages import MessageBus
from jax_drive.sim.replay import Transition, label
from jax_drive.sim.state import CMD_NAMES, Action, Cmd, Role, Scenario, SimConfig, SimState

BLOCKED_SECONDS = 30.0
BUCKET = 4


@functools.partial(jax.jit, static_argnums=0)
def observe_batch(cfg: SimConfig, sc: Scenario, st: SimState):
    """Visibility (E, A, A), arc along the current lane (E, A), light state (E, A)."""

    def one(s, q):
        vis = observe._visibility(cfg, s, q)
        arc, _, _ = lanes_lib.project(s.lanes.points[q.lane], jnp.stack([q.x, q.y], -1))
        light = core.lane_light(s, q.lane, q.step * cfg.dt)
        return vis, arc, light

    return jax.vmap(one)(sc, st)


def scenario_view(sc_np: dict, e: int) -> dict:
    """Static NumPy fields of episode ``e`` used by policies and the captioner."""
    g = lambda k: sc_np[k][e]  # noqa: E731
    lanes = sc_np["lanes"]
    return {
        "valid": g("valid"), "behaviour": g("behaviour"), "role": g("role"), "reward": g("reward"),
        "transceiver": g("transceiver"), "vehicle_id": g("vehicle_id"), "kind": g("kind"), "length": g("length"),
        "width": g("width"), "cruise_speed": g("cruise_speed"), "goal_lane": g("goal_lane"), "goal_arc": g("goal_arc"),
        "lc_arc": g("lc_arc"), "lc_end_arc": g("lc_end_arc"), "init_lane": g("lane"),
        "lane_points": lanes["points"][e], "lane_left": lanes["left"][e], "lane_right": lanes["right"][e],
        "lane_label": lanes["label"][e], "lane_maneuver": lanes["maneuver"][e], "lane_light": lanes["light"][e],
        "stop_arc": lanes["stop_arc"][e], "speed_limit": lanes["speed_limit"][e],
    }


def numpy_view(static: dict, st_np: dict, e: int, vis, arc, light, t: float) -> dict:
    view = dict(static)
    for k in ("x", "y", "heading", "speed", "lane", "done", "success_step", "collision_step"):
        view[k] = st_np[k][e]
    view.update(visible=vis[e], lane_arc=arc[e], light=light[e], t=t)
    return view


def task_text(view: dict, i: int) -> str:
    """Natural-language task of a focal agent."""
    if view["behaviour"][i] != 0:
        return "You are stopped and cannot move; help the other vehicles with messages."
    lane, goal = int(view["lane"][i]), int(view["goal_lane"][i])
    dist = max(float(view["goal_arc"][i] - view["lane_arc"][i]), 0.0) if lane == goal else None
    text = "Reach your destination along your route without collisions"
    if goal != lane:
        side = "left" if view["lane_left"][lane] == goal else "right" if view["lane_right"][lane] == goal else None
        text += f"; you must change to the lane on your {side}" if side else "; return to your lane after passing"
    elif dist is not None:
        text += f", {dist:.0f} m ahead"
    return text + "."


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
    trajectory: dict | None = None  # x, y, heading (T, A) + static fields, for rendering
    message_log: list = dataclasses.field(default_factory=list)  # (t, vid, text)

    @property
    def feedback(self) -> list[str]:
        return [o.feedback() for o in self.outcomes]


def _actions(cfg: SimConfig, cmds: np.ndarray, speeds: np.ndarray) -> Action:
    e, a = cmds.shape
    return Action(command=jnp.asarray(cmds, jnp.int32), target_speed=jnp.asarray(speeds, jnp.float32),
                  waypoints=jnp.zeros((e, a, cfg.num_waypoints, 2), jnp.float32))


def run_episodes(name, keys, *, accident_prone, policy, background: bool = False,
                 cfg: SimConfig = SimConfig(), record: bool = False, keep_trajectory: bool = False,
                 progress=None, max_time: float | None = None) -> tuple[list[EpisodeResult], list[Transition]]:
    """Runs one batch of episodes (one per key) of scenario ``name`` (a name, or one
    name per key).

    Args:
      accident_prone: bool or one bool per key.
      policy: object with ``act(view, inboxes) -> (cmd (A,), speed (A,), messages)`` and
        ``name``; see :mod:`jax_drive.sim.baselines`.
      record: keep replay transitions with captions (slower: text per agent per step).
      keep_trajectory: keep poses for rendering.
      progress: optional callable(n_decisions_done) for progress bars.
      max_time: optional cap on every episode's time limit, s (quick checks).
    Returns: per-episode results (input order) and replay transitions.
    """
    keys = list(keys)
    n = len(keys)
    flags = [bool(accident_prone)] * n if np.ndim(accident_prone) == 0 else [bool(f) for f in accident_prone]
    names = [name] * n if isinstance(name, str) else list(name)
    if len(names) != n or len(flags) != n:
        raise ValueError("need one scenario name and one accident_prone flag per key")
    items = [S.build(nm, k, accident_prone=f, background=background, cfg=cfg) for nm, k, f in zip(names, keys, flags)]
    # pad the batch to a multiple of BUCKET episodes so compiled shapes are reused
    size = max(BUCKET, -(-n // BUCKET) * BUCKET)
    items += [items[-1]] * (size - n)
    sc = jax.tree.map(lambda *xs: jnp.stack(xs), *items)
    st = core.batched_reset(cfg, jnp.stack(keys + [keys[-1]] * (size - n)), sc)
    sc_np = {k: np.asarray(getattr(sc, k)) for k in sc.keys() if k not in ("lanes", "lights")}
    sc_np["lanes"] = {k: np.asarray(v) for k, v in sc.lanes.items()}
    statics = [scenario_view(sc_np, e) for e in range(n)]
    buses = [MessageBus(cfg.max_agents, cfg.comm_radius, cfg.message_ttl) for _ in range(n)]
    interdrive = [S.family(nm) == "interdrive" for nm in names]
    timeout = np.asarray(sc.timeout)
    if max_time is not None:
        timeout = np.minimum(timeout, max_time)
    eligible = [np.nonzero(s["valid"] & s["reward"] & (s["role"] == Role.FOCAL))[0] for s in statics]
    ended = np.zeros(size, bool)
    ended[n:] = True  # padding
    end_step = np.zeros(n, np.int64)
    snapshots: list[dict | None] = [None] * n
    transitions: list[Transition] = []
    logs: list[list] = [[] for _ in range(n)]
    traj = [[] for _ in range(n)] if keep_trajectory else None
    max_decisions = int(np.ceil(timeout[:n].max() / cfg.decision_dt))
    fields = ("x", "y", "heading", "speed", "lane", "done", "success_step", "collision_step", "collision_with",
              "red_runs", "offroad_steps", "progress", "stagnant_steps", "step")
    for d in range(max_decisions + 1):
        st_np = {k: np.asarray(getattr(st, k)) for k in fields}
        t = d * cfg.decision_dt
        vis, arc, light = (np.asarray(v) for v in observe_batch(cfg, sc, st))
        # termination
        was_ended = ended.copy()
        for e in range(n):
            if ended[e]:
                continue
            el = eligible[e]
            finished = bool(np.all(st_np["done"][e][el])) if len(el) else True
            blocked = interdrive[e] and bool(np.all(st_np["done"][e][el] | (
                st_np["stagnant_steps"][e][el] * cfg.dt >= BLOCKED_SECONDS)))
            if finished or blocked or t >= timeout[e] - 1e-9 or d == max_decisions:
                ended[e] = True
                end_step[e] = int(st_np["step"][e])
                snapshots[e] = {k: st_np[k][e].copy() for k in fields}
        if keep_trajectory:
            for e in range(n):
                if not was_ended[e]:
                    traj[e].append(np.stack([st_np["x"][e], st_np["y"][e], st_np["heading"][e],
                                             st_np["success_step"][e] < 0], -1))
        if ended[:n].all():
            break
        cmds = np.full((size, cfg.max_agents), Cmd.KEEP, np.int32)
        speeds = np.zeros((size, cfg.max_agents), np.float32)
        for e in range(n):
            if ended[e]:
                continue
            view = numpy_view(statics[e], st_np, e, vis, arc, light, t)
            present = statics[e]["valid"] & (st_np["success_step"][e] < 0)
            buses[e].deliver(t, np.stack([view["x"], view["y"]], -1), statics[e]["transceiver"], present)
            inboxes = [buses[e].inbox(i, t) for i in range(cfg.max_agents)]
            c, s, msgs = policy.act(view, inboxes)
            cmds[e], speeds[e] = c, s
            sent = {}
            for m in msgs:
                buses[e].post(m)
                logs[e].append((t, m.sender_vid, m.text))
                sent[m.sender] = m.text
            if record:
                focal = np.nonzero(statics[e]["valid"] & (statics[e]["role"] == Role.FOCAL) & present)[0]
                for i in focal:
                    transitions.append(Transition(
                        episode=e, scenario=names[e], step=d, time=t, agent=int(i),
                        vehicle_id=int(statics[e]["vehicle_id"][i]),
                        observation=observe.caption(view, int(i), buses[e].texts(int(i), t), task_text(view, int(i))),
                        command=CMD_NAMES[Cmd(int(c[i]))], target_speed=float(s[i]), message=sent.get(int(i), ""),
                        others_present=bool(view["visible"][i].any())))
        st = core.batched_step(cfg, sc, st, _actions(cfg, cmds, speeds))
        if progress is not None:
            progress(d + 1)
    results = []
    for e in range(n):
        snap = dict(snapshots[e])
        snap.update(vehicle_id=statics[e]["vehicle_id"], route_length=sc_np["route_length"][e])
        outs = M.agent_outcomes(snap, cfg.dt, int(end_step[e]), eligible[e])
        if interdrive[e]:
            met = M.interdrive_episode(outs)
        else:
            met = M.talking_vehicles_rates(outs)
        trajectory = None
        if keep_trajectory:
            trajectory = dict(poses=np.stack(traj[e]), static=statics[e], decision_dt=cfg.decision_dt)
        results.append(EpisodeResult(
            scenario=names[e], accident_prone=flags[e], background=background, policy=policy.name, outcomes=outs,
            end_time=end_step[e] * cfg.dt, bytes_sent=buses[e].bytes_sent, messages_sent=buses[e].messages_sent,
            metrics=met, trajectory=trajectory, message_log=logs[e]))
        if record:
            ep = [tr for tr in transitions if tr.episode == e]
            label(ep, {o.index: o for o in outs})
    return results, transitions
