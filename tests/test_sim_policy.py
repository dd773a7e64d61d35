"""The batched policy interface of jax_drive.coop: one decide call per decision for every
live agent of every episode, waypoints from a JAX-side planner, per-agent records in the
replay, and the layer boundary (jax_drive.sim never imports jax_drive.coop)."""

import ast
import functools
import importlib
import pathlib

import jax
import numpy as np

import jax_drive.sim
from jax_drive.coop.baselines import RuleBasedPolicy
from jax_drive.coop.episodes import EpisodeBatch
from jax_drive.coop.policy import PolicyOutput
from jax_drive.coop.replay import load_jsonl, save_jsonl
from jax_drive.coop.runner import run_episodes
from jax_drive.sim import actions as A, scenarios as S
from jax_drive.sim.state import Behaviour, Cmd, Role, SimConfig

CFG = SimConfig()


class Counting:
    """Wraps a policy and records what every call saw."""

    def __init__(self, inner):
        self.inner, self.name, self.calls = inner, inner.name, []

    def decide(self, batch):
        self.calls.append((batch.decision, batch.episodes.tolist(), {tuple(map(int, r)) for r in batch.agents}))
        out = self.inner.decide(batch)
        for e, i in batch.agents:
            out.info[(int(e), int(i))] = {"decision": batch.decision}
        return out


def test_one_decide_call_per_decision_for_every_live_agent(tmp_path):
    names = ["tv_red_light", "tv_highway_merge", "ic_straight_left"]
    keys = [jax.random.key(k) for k in range(3)]
    policy = Counting(RuleBasedPolicy())
    results, records = run_episodes(names, keys, accident_prone=[True, False, True], policy=policy, record=True,
                                    max_time=6.0)
    ends = [round(r.end_time / CFG.decision_dt) for r in results]  # decision at which each episode ended
    assert [c[0] for c in policy.calls] == list(range(max(ends)))  # one call per decision, no more
    for d, episodes, agents in policy.calls:
        assert episodes == [e for e in range(3) if ends[e] > d]
        assert {e for e, _ in agents} == set(episodes)
    # at the start every valid focal agent of every episode is live (stopped talkers included)
    scenarios = [S.build(n, k, accident_prone=f) for n, k, f in zip(names, keys, [True, False, True])]
    expected = {(e, int(i)) for e, sc in enumerate(scenarios)
                for i in np.flatnonzero(np.asarray(sc.valid) & (np.asarray(sc.role) == Role.FOCAL))}
    assert policy.calls[0][2] == expected
    # the policy's per-agent info lands in the replay records and survives JSONL
    assert records and all(t.info == {"decision": t.step} for t in records if (t.episode, t.agent) in expected)
    save_jsonl(records, tmp_path / "r.jsonl")
    assert [t.info for t in load_jsonl(tmp_path / "r.jsonl")] == [t.info for t in records]


@functools.partial(jax.jit, static_argnums=0)
def _keep_lane_waypoints(cfg, scenario, state):
    """KEEP-speed intention waypoints along every agent's lane, vmapped over episodes."""
    nav = jax.numpy.full(state.lane.shape, A.NavIntent.FOLLOW_LANE)
    intent = jax.numpy.full(state.lane.shape, A.SpeedIntent.KEEP)
    return jax.vmap(lambda sc, st, n, i: A.intention_waypoints(cfg, sc.lanes, st.lane, st.x, st.y, st.speed, n, i))(
        scenario, state, nav, intent)


def test_waypoints_from_a_jax_side_planner_drive_the_batch():
    keys = [jax.random.key(k) for k in range(2)]
    batch = EpisodeBatch(["tv_highway_merge"] * 2, keys, [False, False], cfg=CFG)
    x0 = np.asarray(batch.state.x)
    for _ in range(6):
        step = batch.decision_batch(batch.observe(), [0, 1])
        out = PolicyOutput.keep(step)
        out.command[:] = Cmd.WAYPOINTS
        out.waypoints = np.asarray(_keep_lane_waypoints(CFG, step.scenario, step.state))
        batch.send(step, out)
        batch.advance(out, [0, 1])
    st = jax.tree.map(np.asarray, batch.state)
    policy_agents = np.asarray(batch.scenario.valid) & (np.asarray(batch.scenario.behaviour) == Behaviour.POLICY)
    live = policy_agents[:2] & (st.success_step[:2] < 0)
    assert live.any()
    # latched on the live episodes only (padding rows got KEEP), and followed: 3 s forward,
    # on the road, at least as fast as KEEP's floor of 4 m/s
    assert np.all(st.command[:2][live] == Cmd.WAYPOINTS) and not np.any(st.command[2:] == Cmd.WAYPOINTS)
    np.testing.assert_allclose(st.waypoints[:2][live], out.waypoints[:2][live])
    assert np.all(st.x[:2][live] - x0[:2][live] > 3.0 * 4.0 * 0.8)
    assert np.all(st.offroad_steps[:2][live] == 0) and np.all(st.collision_step[:2][live] < 0)


def test_render_import_leaves_the_matplotlib_backend_alone():
    import matplotlib

    from jax_drive.coop import render

    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        importlib.reload(render)
        assert matplotlib.get_backend().lower() == "svg"
    finally:
        matplotlib.use(before)


def test_sim_core_never_imports_the_orchestration_layer():
    sim_dir = pathlib.Path(jax_drive.sim.__file__).parent
    for path in sim_dir.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith("jax_drive.coop") for n in names), f"{path.name} imports {names}"
