"""PettingZoo ParallelEnv conformance (pettingzoo's own parallel_api_test), episode
semantics, the Gymnasium single-agent wrapper and the `jax-drive sim` CLI."""

import pytest
from pettingzoo.test import parallel_api_test

from jax_drive.coop.env import CoopDrivingParallelEnv, SingleAgentEnv
from jax_drive.sim.state import Cmd


def test_parallel_api_conformance():
    env = CoopDrivingParallelEnv("tv_overtake_perception")
    parallel_api_test(env, num_cycles=12)


def test_episode_rewards_captions_and_messages():
    env = CoopDrivingParallelEnv("tv_red_light", accident_prone=True)
    obs, infos = env.reset(seed=0)
    assert set(obs) == set(env.agents) and len(env.agents) == 2  # the car and the talking truck
    car = next(a for a in env.agents if infos[a]["vehicle_id"] == 109)
    truck = next(a for a in env.agents if infos[a]["vehicle_id"] == 117)
    assert infos[car]["caption"].startswith("You are Vehicle 109")
    assert "Traffic light ahead is green" in infos[car]["caption"]
    total = {a: 0.0 for a in env.agents}
    for k in range(60):
        acts = {a: {"command": Cmd.GO, "message": "hold on, a car is running the red light" if a == truck else ""}
                for a in env.agents}
        obs, rew, term, trunc, infos = env.step(acts)
        for a, r in rew.items():
            total[a] += r
        if k == 0:
            assert infos[car]["messages"] and infos[car]["messages"][0][1] == 117
            assert "Messages received" in infos[car]["caption"]
        if not env.agents:
            break
    # driving straight on without listening meets the red-light runner
    assert total[car] == -1.0 and total[truck] == 0.0
    assert not env.agents


def test_gymnasium_single_agent_wrapper():
    from gymnasium.utils.env_checker import check_env

    env = SingleAgentEnv("tv_highway_merge", agent_rank=1, accident_prone=False)  # the highway car
    check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=1)
    assert obs.shape == env.observation_space.shape and "caption" in info
    done, steps, ret = False, 0, 0.0
    while not done and steps < 80:
        obs, r, term, trunc, info = env.step(Cmd.GO)
        ret += r
        done = term or trunc
        steps += 1
    assert done and ret == 1.0


def test_cli_sim_run_prints_table_and_renders(tmp_path, capsys, monkeypatch):
    from jax_drive.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["sim", "run", "--scenario", "tv_highway_exit", "--episodes", "1"]) == 0
    assert list(tmp_path.iterdir()) == []  # nothing written without --plot / --json / --replay
    png, js = tmp_path / "ep.png", tmp_path / "m.json"
    rc = main(["sim", "run", "--scenario", "tv_highway_exit", "--policy", "rule_based", "--episodes", "2",
               "--plot", str(png), "--json", str(js)])
    out = capsys.readouterr().out
    assert rc == 0 and "CR" in out and "SR" in out and "tv_highway_exit" in out
    assert png.stat().st_size > 10_000
    import json

    data = json.loads(js.read_text())
    assert data["aggregate"]["CR"]["mean"] == 0.0 and data["aggregate"]["SR"]["mean"] == 100.0
    assert data["meta"]["command"] == "sim run"
    with pytest.raises(SystemExit) as stop:  # argparse refuses a scenario it does not list
        main(["sim", "run", "--scenario", "bogus"])
    assert stop.value.code == 2
