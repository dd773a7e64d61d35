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

    python experiments/bench_sim.py --json OUT
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from tqdm import tqdm

from jax_drive.runinfo import (add_output_args, command_line, require_min, run_main, run_metadata,
                               script_environment, write_json)

script_environment(cpu=False)


def bench_jax(episodes: int, decisions: int, repeats: int, cfg, show_progress: bool = True) -> dict:
    import jax
    import jax.numpy as jnp

    from jax_drive.sim import core, scenarios as S

    keys = [jax.random.key(k) for k in range(episodes)]
    items = [S.build("tv_highway_merge", k, accident_prone=bool(i % 2), background=True, cfg=cfg)
             for i, k in enumerate(tqdm(keys, desc="build scenarios", leave=False, disable=not show_progress))]
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
    for _ in tqdm(range(repeats), desc="jax rollouts", leave=False, disable=not show_progress):
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


def bench_highway_env(steps: int, show_progress: bool = True) -> dict:
    import gymnasium as gym
    import highway_env  # noqa: F401  (registers the envs)

    env = gym.make("merge-v0")
    env.unwrapped.configure({"simulation_frequency": 20, "policy_frequency": 2})
    env.reset(seed=0)
    ticks_per_step = 20 // 2
    agent_steps, total = 0, 0.0
    for _ in tqdm(range(steps), desc="highway-env steps", leave=False, disable=not show_progress):
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
    add_output_args(parser, json_required=True)
    args = parser.parse_args(argv)
    require_min(1, episodes=args.episodes, decisions=args.decisions, repeats=args.repeats,
                highway_steps=args.highway_steps)
    import jax

    from jax_drive.sim.state import SimConfig

    meta = run_metadata(benchmark="bench_sim", command=command_line(__file__, argv))
    hw = bench_highway_env(args.highway_steps, not args.no_progress)
    jx = bench_jax(args.episodes, args.decisions, args.repeats, SimConfig(), not args.no_progress)
    out = {
        "meta": meta,
        "jax_agent_steps_per_s": jx["agent_steps_per_s"],
        "highway_env_agent_steps_per_s": hw["agent_steps_per_s"],
        "speedup": jx["agent_steps_per_s"] / hw["agent_steps_per_s"],
        "jax": jx,
        "highway_env": hw,
        "jax_policy": "GO at cruise speed for policy agents, IDM for background agents",
        "device": str(jax.devices()[0]),
    }
    print(json.dumps({k: out[k] for k in ("jax_agent_steps_per_s", "highway_env_agent_steps_per_s", "speedup")},
                     indent=2))
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
