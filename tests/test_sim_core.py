"""Dynamics, controllers, lights, collisions, off-road and batching of the JAX simulator."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_drive.sim import actions as A, core, lanes as L, layouts, scenarios as S
from jax_drive.sim.state import Behaviour, Cmd, Light, Lights, Role, SimConfig

CFG = SimConfig()


def _road(n_agents_fn, lights=None, lanes_fn=None):
    """A straight two-lane road along x (lane 0 at y=0, lane 1 at y=3.5) plus agents."""
    b = layouts.Builder(CFG)
    l0 = b.lane(L.straight([-50, 0], [450, 0]), light=0 if lights else -1, stop_xy=(100.0, 0.0) if lights else None)
    l1 = b.lane(L.straight([-50, 3.5], [450, 3.5]))
    b.neighbours(l0, left=l1)
    b.neighbours(l1, right=l0)
    if lights:
        b.light(*lights)
    n_agents_fn(b, l0, l1)
    return b.build(timeout=60.0, accident_prone=False, scenario_id=0)


def _policy_agent(lane, arc, speed, **kw):
    return layouts.Agent(lane=lane, arc=arc, speed=speed, role=Role.FOCAL, reward=True, behaviour=Behaviour.POLICY,
                    cruise=kw.pop("cruise", speed), **kw)


def _run(sc, commands, decisions, target=0.0):
    st = core.reset(CFG, jax.random.key(0), sc)
    act = A.command_action(CFG, jnp.asarray(commands), jnp.full((CFG.max_agents,), target))
    keep = A.command_action(CFG, jnp.full((CFG.max_agents,), Cmd.KEEP))
    out = [st]
    for d in range(decisions):
        st = core.step(CFG, sc, st, act if d == 0 else keep)
        out.append(st)
    return out


def _cmds(**by_index):
    c = np.full(CFG.max_agents, Cmd.KEEP)
    for k, v in by_index.items():
        c[int(k[1:])] = v
    return c


def test_pid_step_matches_hand_formula():
    window = jnp.array([0.1, 0.2, 0.3, 0.4, 0.5])
    out, new = core.pid_step(window, jnp.array(0.9), (1.0, 0.2, 0.1))
    np.testing.assert_allclose(new, [0.2, 0.3, 0.4, 0.5, 0.9])
    expect = 1.0 * 0.9 + 0.2 * np.mean([0.2, 0.3, 0.4, 0.5, 0.9]) + 0.1 * (0.9 - 0.5)
    np.testing.assert_allclose(out, expect, rtol=1e-6)


def test_bicycle_straight_and_turn_radius():
    x, y, h, v = core.bicycle(0.0, 0.0, 0.0, 10.0, 0.0, 0.0, 5.0, 0.1)
    np.testing.assert_allclose([x, y, h, v], [1.0, 0.0, 0.0, 10.0], atol=1e-6)
    # constant steer: yaw rate = v / wheelbase * tan(steer)
    steer, length, dt = 0.2, 5.0, 0.01
    state = (0.0, 0.0, 0.0, 5.0)
    for _ in range(100):
        state = core.bicycle(*state[:3], state[3], 0.0, steer, length, dt)
    np.testing.assert_allclose(state[2], 5.0 / (0.6 * length) * np.tan(steer) * 1.0, rtol=1e-3)
    # speed never negative under braking
    _, _, _, v = core.bicycle(0.0, 0.0, 0.0, 0.5, -10.0, 0.0, 5.0, 0.1)
    assert float(v) == 0.0


def test_light_cycle():
    lights = Lights(green=jnp.array([10.0]), yellow=jnp.array([3.0]), red=jnp.array([7.0]),
                    offset=jnp.array([0.0]), valid=jnp.array([True]))
    got = [int(core.light_state(lights, jnp.array(t))[0]) for t in (0.0, 9.9, 10.5, 13.5, 19.9, 20.1)]
    assert got == [Light.GREEN, Light.GREEN, Light.YELLOW, Light.RED, Light.RED, Light.GREEN]


def test_go_tracks_target_speed_and_stop_stops():
    sc = _road(lambda b, l0, l1: b.add(_policy_agent(l0, 50.0, 0.0, cruise=8.0)))
    states = _run(sc, _cmds(a0=Cmd.GO), 30, target=8.0)
    v = np.array([float(s.speed[0]) for s in states])
    assert abs(v[-1] - 8.0) < 0.5 and v.max() < 8.0 * 1.15
    assert abs(float(states[-1].y[0])) < 0.2  # stays in lane
    # STOP from 8 m/s
    st = states[-1]
    st = core.step(CFG, sc, st, A.command_action(CFG, _cmds(a0=Cmd.STOP)))
    for _ in range(8):
        st = core.step(CFG, sc, st, A.command_action(CFG, _cmds(a0=Cmd.KEEP)))
    assert float(st.speed[0]) < 0.05


def test_lane_change_left_converges_without_large_overshoot():
    sc = _road(lambda b, l0, l1: b.add(_policy_agent(l0, 50.0, 8.0, cruise=8.0)))
    states = _run(sc, _cmds(a0=Cmd.LANE_LEFT), 16)
    ys = np.array([float(s.y[0]) for s in states])
    assert int(states[-1].lane[0]) == 1
    assert abs(ys[-1] - 3.5) < 0.15  # in the left lane after 8 s
    assert ys.max() < 3.5 + 0.6
    assert np.all(np.array([float(s.offroad_steps[0]) for s in states]) == 0)


def test_idm_follower_stops_behind_stopped_truck():
    def agents(b, l0, l1):
        b.add(layouts.Agent(lane=l0, arc=150.0, speed=0.0, behaviour=Behaviour.STOPPED, size=layouts.TRUCK, cruise=0.0))
        b.add(layouts.Agent(lane=l0, arc=60.0, speed=12.0, cruise=12.0))

    sc = _road(agents)
    states = _run(sc, _cmds(), 40)
    last = states[-1]
    assert int(last.collision_step[1]) == -1
    gap = float(last.x[0] - last.x[1]) - (layouts.TRUCK[0] + layouts.CAR[0]) / 2
    assert 0.5 < gap < 8.0 and float(last.speed[1]) < 0.3


def test_go_follows_leader_and_red_light_stop_vs_runner():
    def agents(b, l0, l1):
        b.add(_policy_agent(l0, 100.0, 8.0, cruise=8.0))  # obeys the light at x = 100 (arc 150)
        b.add(layouts.Agent(lane=l0, arc=60.0, speed=8.0, cruise=8.0, obeys=False))  # runner, behind

    sc = _road(agents, lights=(0.0, 0.0, 1e4))  # always red
    states = _run(sc, _cmds(a0=Cmd.GO), 30, target=8.0)
    last = states[-1]
    front = float(last.x[0]) + layouts.CAR[0] / 2
    assert front <= 100.0 + 0.5 and float(last.speed[0]) < 0.2
    assert int(last.red_runs[0]) == 0
    # the runner does not stop for the light but does not hit the stopped car either
    assert int(last.collision_step[1]) == -1 and int(last.red_runs[1]) == 0
    # free runner crosses the line on red and is counted
    sc2 = _road(lambda b, l0, l1: b.add(layouts.Agent(lane=l0, arc=100.0, speed=8.0, cruise=8.0, obeys=False)),
                lights=(0.0, 0.0, 1e4))
    assert int(_run(sc2, _cmds(), 16)[-1].red_runs[0]) == 1


def test_head_on_collision_is_detected_for_both():
    def agents(b, l0, l1):
        b.add(_policy_agent(l0, 100.0, 8.0, cruise=8.0))
        rev = b.lane(L.straight([450, 0], [-50, 0]))
        b.add(layouts.Agent(lane=rev, arc=b.arc(rev, (160.0, 0.0)), speed=8.0, cruise=8.0, role=Role.COLLIDER))

    sc = _road(agents)
    st = _run(sc, _cmds(a0=Cmd.GO), 20, target=8.0)[-1]
    assert int(st.collision_step[0]) > 0 and int(st.collision_step[0]) == int(st.collision_step[1])
    assert int(st.collision_with[0]) == 1 and int(st.collision_with[1]) == 0
    assert bool(st.done[0]) and float(st.speed[0]) == 0.0


def test_arrival_and_route_progress():
    sc = _road(lambda b, l0, l1: b.add(_policy_agent(l0, 50.0, 10.0, cruise=10.0, goal_arc=150.0)))
    states = _run(sc, _cmds(a0=Cmd.GO), 24, target=10.0)
    st = states[-1]
    assert int(st.success_step[0]) > 0
    np.testing.assert_allclose(float(st.progress[0]), float(sc.route_length[0]))
    # before arrival, progress is the distance driven from the start (not the lane arc)
    np.testing.assert_allclose(float(sc.route_length[0]), 100.0, atol=0.5)
    mid = states[4]
    np.testing.assert_allclose(float(mid.progress[0]), float(mid.x[0] - sc.x[0]), atol=0.3)


def test_waypoints_follow_and_offroad_detected():
    sc = _road(lambda b, l0, l1: b.add(_policy_agent(l0, 50.0, 5.0, cruise=5.0)))
    st = core.reset(CFG, jax.random.key(0), sc)
    # waypoints veering 30 m to the right (off every lane), 6 m/s
    t = 0.2 * np.arange(1, CFG.num_waypoints + 1)
    wp = np.zeros((CFG.max_agents, CFG.num_waypoints, 2), np.float32)
    wp[0, :, 0] = float(st.x[0]) + 6.0 * t
    wp[0, :, 1] = -1.5 * 6.0 * t
    act = A.command_action(CFG, _cmds(a0=Cmd.WAYPOINTS)).replace(waypoints=jnp.asarray(wp))
    for _ in range(8):
        st = core.step(CFG, sc, st, act)
    assert int(st.offroad_steps[0]) > 0
    assert float(st.y[0]) < -8.0


def test_intention_retime_matches_constant_acceleration():
    s = A.retime(jnp.array([8.0, 2.0, 6.0, 6.0]), jnp.array([A.SpeedIntent.STOP, A.SpeedIntent.KEEP,
                                                                A.SpeedIntent.KEEP, A.SpeedIntent.FASTER]))
    t = 0.2 * np.arange(1, 21)
    stop = np.where(t < 0.8, 8.0 * t - 5.0 * t**2, 3.2)  # stops after 0.8 s and 3.2 m
    np.testing.assert_allclose(s[0], stop, atol=1e-4)
    # KEEP holds the speed at any speed (the 4 m/s rule is the negotiation's, not the planner's)
    np.testing.assert_allclose(s[1], 2.0 * t, atol=1e-4)
    np.testing.assert_allclose(s[2], 6.0 * t, atol=1e-4)
    # FASTER: +3 m/s^2 from 6 m/s, capped at 8 m/s after 2/3 s
    t_sat = 2.0 / 3.0
    faster = np.where(t < t_sat, 6.0 * t + 1.5 * t**2, 6.0 * t_sat + 1.5 * t_sat**2 + 8.0 * (t - t_sat))
    np.testing.assert_allclose(s[3], faster, atol=1e-4)


def test_intention_waypoints_drive_the_vehicle():
    sc = _road(lambda b, l0, l1: b.add(_policy_agent(l0, 50.0, 6.0, cruise=6.0)))
    st = core.reset(CFG, jax.random.key(0), sc)
    nav = jnp.full((CFG.max_agents,), A.NavIntent.LANE_LEFT)
    intent = jnp.full((CFG.max_agents,), A.SpeedIntent.KEEP)
    for _ in range(12):
        act = A.intention_action(CFG, sc.lanes, st, nav, intent)
        st = core.step(CFG, sc, st, act)
    assert abs(float(st.y[0]) - 3.5) < 0.6  # moved onto the left lane's path
    assert abs(float(st.speed[0]) - 6.0) < 1.0


def test_batched_step_matches_single_episodes():
    keys = [jax.random.key(k) for k in range(4)]
    scs = [S.build("tv_highway_exit", k, accident_prone=k_i % 2 == 0) for k_i, k in enumerate(keys)]
    batch = jax.tree.map(lambda *x: jnp.stack(x), *scs)
    st_b = core.batched_reset(CFG, jnp.stack(keys), batch)
    act_b = core.go_action(CFG, batch)
    for _ in range(3):
        st_b = core.batched_step(CFG, batch, st_b, act_b)
    for e in (0, 3):
        st = core.reset(CFG, keys[e], scs[e])
        act = core.go_action(CFG, scs[e])
        for _ in range(3):
            st = core.step(CFG, scs[e], st, act)
        np.testing.assert_allclose(np.asarray(st_b.x[e]), np.asarray(st.x), atol=1e-3)
        np.testing.assert_allclose(np.asarray(st_b.speed[e]), np.asarray(st.speed), atol=1e-3)


def test_rollout_scan_equals_repeated_steps():
    sc = S.build("tv_red_light", jax.random.key(3))
    st0 = core.reset(CFG, jax.random.key(3), sc)
    act = core.go_action(CFG, sc)
    acts = jax.tree.map(lambda v: jnp.stack([v] * 3), act)
    final, traj = jax.jit(lambda s, q, a: core.rollout(CFG, s, q, a))(sc, st0, acts)
    st = st0
    for _ in range(3):
        st = core.step(CFG, sc, st, act)
    np.testing.assert_allclose(np.asarray(final.x), np.asarray(st.x), atol=1e-3)
    assert traj.x.shape == (3, CFG.max_agents)


def test_reset_rejects_nothing_but_builder_rejects_oversize():
    b = layouts.Builder(CFG)
    lane = b.lane(L.straight([0, 0], [100, 0]))
    for k in range(CFG.max_agents + 1):
        b.add(layouts.Agent(lane=lane, arc=5.0 * k, speed=0.0))
    with pytest.raises(ValueError, match="too large"):
        b.build(timeout=10.0, accident_prone=False, scenario_id=0)


@pytest.mark.parametrize("name", ["tv_highway_merge", "lc_highway_change", "ic_chaos"])
def test_batched_fast_path_matches_general_single_episode_path(name):
    """The batched driver (fast path when possible) and the single-episode step (always
    the general path) agree on every event over lane changes, merges and collisions."""
    keys = [jax.random.key(k) for k in range(2)]
    scs = [S.build(name, k, accident_prone=i == 0, background=True) for i, k in enumerate(keys)]
    batch = jax.tree.map(lambda *x: jnp.stack(x), *scs)
    st_b = core.batched_reset(CFG, jnp.stack(keys), batch)
    go = core.go_action(CFG, batch)
    left = go.replace(command=jnp.where(batch.goal_lane != batch.lane, Cmd.LANE_LEFT, go.command))
    if name == "tv_highway_merge":
        assert not bool(jax.vmap(lambda s, q: core.tables(s, q).overflow)(batch, st_b).any())
    singles = [core.reset(CFG, k, s) for k, s in zip(keys, scs)]
    for d in range(24):
        act = left if d in (8, 9) else go
        st_b = core.batched_step(CFG, batch, st_b, act)
        singles = [core.step(CFG, s, q, jax.tree.map(lambda v: v[e], act)) for e, (s, q) in
                   enumerate(zip(scs, singles))]
    for e, st in enumerate(singles):
        for f in ("x", "y", "speed", "progress"):
            np.testing.assert_allclose(np.asarray(getattr(st_b, f)[e]), np.asarray(getattr(st, f)), atol=1e-2)
        for f in ("lane", "collision_step", "collision_with", "success_step", "offroad_steps", "red_runs"):
            np.testing.assert_array_equal(np.asarray(getattr(st_b, f)[e]), np.asarray(getattr(st, f)))
    events = sum(int((np.asarray(getattr(q, f)) >= 0).sum()) for q in singles for f in ("collision_step", "success_step"))
    assert events > 0 or name == "tv_highway_merge"
