"""Benchmark: agent-steps per second of the batched JAX simulator on the highway-merge
scenario against Farama's highway-env running its multi-vehicle merge (merge-v0) on the
same CPU.

One agent-step = one real (non-padding) vehicle advanced by one simulation tick. JAX:
``episodes`` merge episodes (with background traffic, alternating accident-prone and
safe, padded to the default 20 agent slots) vmapped and rolled out under one jitted
``lax.scan`` of :func:`jax_drive.sim.core.batched_rollout`, the same physics, events and
off-road checks as the tests and the runner use; policy agents get GO at their cruise
speed every decision (the silent baseline's low-level command), background agents run
IDM; 20 Hz ticks. Timed: the device rollout only (scenarios are built and transferred
before; the result is waited for with ``block_until_ready``). highway-env: merge-v0 with
simulation_frequency 20 and policy_frequency 2 (the same 0.05 s tick and 0.5 s
decision), IDLE actions, resetting when an episode ends; agent-steps = vehicles on the
road x ticks.

    python experiments/bench_sim.py --json experiments/results/bench_sim.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from jax_drive.sim import core, scenarios as S
from jax_drive.sim.state import SimConfig


def bench_jax(episodes: int, decisions: int, repeats: int, cfg: SimConfig) -> dict:
    keys = [jax.random.key(k) for k in range(episodes)]
    items = [S.build("tv_highway_merge", k, accident_prone=bool(i % 2), background=True, cfg=cfg)
             for i, k in enumerate(tqdm(keys, desc="build scenarios", leave=False))]
    sc = jax.tree.map(lambda *x: jnp.stack(x), *items)
    st0 = core.batched_reset(cfg, jnp.stack(keys), sc)
    act = core.go_action(cfg, sc)
    acts = jax.tree.map(lambda v: jnp.broadcast_to(v, (decisions,) + v.shape).swapaxes(0, 1), act)

    @jax.jit
    def run(sc, st, acts):
        return core.batched_rollout(cfg, sc, st, acts)

    t0 = time.perf_counter()
    jax.block_until_ready(run(sc, st0, acts))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in tqdm(range(repeats), desc="jax rollouts", leave=False):
        t0 = time.perf_counter()
        final = jax.block_until_ready(run(sc, st0, acts))
        times.append(time.perf_counter() - t0)
    agents = int(np.asarray(sc.valid).sum())
    ticks = decisions * cfg.decision_steps
    best = min(times)
    return {
        "episodes": episodes,
        "agents_total": agents,
        "agents_per_episode": agents / episodes,
        "ticks": ticks,
        "seconds_best": best,
        "seconds_all": times,
        "compile_seconds": compile_s,
        "agent_steps_per_s": agents * ticks / best,
        "collisions": int((np.asarray(final.collision_step) >= 0).sum()),
    }


def bench_highway_env(steps: int) -> dict:
    import gymnasium as gym
    import highway_env  # noqa: F401  (registers the envs)

    env = gym.make("merge-v0")
    env.unwrapped.configure({"simulation_frequency": 20, "policy_frequency": 2})
    env.reset(seed=0)
    ticks_per_step = 20 // 2
    agent_steps, total = 0, 0.0
    for _ in tqdm(range(steps), desc="highway-env steps", leave=False):
        n = len(env.unwrapped.road.vehicles)
        t0 = time.perf_counter()
        _, _, term, trunc, _ = env.step(1)  # IDLE
        total += time.perf_counter() - t0
        agent_steps += n * ticks_per_step
        if term or trunc:
            env.reset()
    env.close()
    return {"env": "merge-v0", "steps": steps, "ticks_per_step": ticks_per_step, "agent_steps": agent_steps,
            "seconds": total, "agent_steps_per_s": agent_steps / total}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--decisions", type=int, default=20, help="decisions per rollout (10 ticks each)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--highway-steps", type=int, default=100)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    cfg = SimConfig()
    hw = bench_highway_env(args.highway_steps)
    jx = bench_jax(args.episodes, args.decisions, args.repeats, cfg)
    out = {
        "jax_agent_steps_per_s": jx["agent_steps_per_s"],
        "highway_env_agent_steps_per_s": hw["agent_steps_per_s"],
        "speedup": jx["agent_steps_per_s"] / hw["agent_steps_per_s"],
        "jax": jx,
        "highway_env": hw,
        "jax_policy": "GO at cruise speed for policy agents, IDM for background agents",
        "device": str(jax.devices()[0]),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "load_average": os.getloadavg(),
        "command": "python experiments/bench_sim.py " + " ".join(argv or []),
    }
    print(json.dumps({k: out[k] for k in ("jax_agent_steps_per_s", "highway_env_agent_steps_per_s", "speedup")},
                     indent=2))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
