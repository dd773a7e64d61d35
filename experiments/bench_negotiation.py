"""Negotiation benchmarks: batched engine calls vs one call per speaker, and the JAX
grouping step vs the same step in vectorised NumPy (and the per-episode Python reference).

    python experiments/bench_negotiation.py --json OUT.json                 # canonical
    python experiments/bench_negotiation.py --json OUT.json --model tiny --groups 4 --rounds 1 \\
        --episodes 16                                                       # quick check

1. Rounds per second: ``--groups`` groups (sizes cycling 2, 3, 2, 4: the InterDrive mix of
   two-vehicle conflicts and larger groups) negotiate ``--rounds`` rounds with the full
   critic (actors, sum actions, consensus; feedback keeps every group talking) through
   :class:`~jax_drive.coop.negotiation.LLMNegotiator` on a JaxEngine: once batched (one
   engine call per request kind and round for all groups) and once with one engine call
   per request (per speaker, per group). Same prompts, greedy decoding; each path runs the
   whole negotiation once untimed first (greedy: the timed run repeats its prompt and batch
   shapes, so it compiles nothing; the JSON records the compile seconds inside the timed
   run to show it). Goal: batched >= 5x.
2. Grouping: :func:`jax_drive.sim.grouping.batched_group_step` (jit, vmapped) for
   ``--episodes`` episodes x ``--vehicles`` vehicles x 20 waypoints, best of ``--repeats``,
   vs the peer :func:`~jax_drive.sim.grouping.group_step_numpy` (the same array program in
   NumPy, vectorised over all episodes in one call), and, for scale, vs
   :func:`~jax_drive.sim.grouping.group_step_reference` (per-episode Python double loops and a
   DFS, called once per episode). Goal: >= 50x over the NumPy peer. Every episode's labels
   of the three agree.
"""

from __future__ import annotations

import argparse
import sys
import time

from jax_drive.runinfo import (CompileClock, add_output_args, command_line, require_min, run_main, run_metadata,
                               wall_times, write_json)


def synthetic_groups(n: int):
    from jax_drive.coop.negotiation import GroupTalk
    from jax_drive.coop.negotiation.prompts import MemberInfo
    from jax_drive.sim.actions import NavIntent, SpeedIntent

    sizes = [2, 3, 2, 4]
    navs = [NavIntent.GO_STRAIGHT, NavIntent.TURN_LEFT, NavIntent.TURN_RIGHT, NavIntent.LANE_LEFT]
    out = []
    for g in range(n):
        size = sizes[g % len(sizes)]
        vids = [201 + k for k in range(size)]
        infos = [MemberInfo(vid=v, x=12.0 * k - 5.0 * g % 7, y=-8.0 * k, heading=0.7 * k, speed=3.0 + k,
                            nav=int(navs[(g + k) % len(navs)])) for k, v in enumerate(vids)]
        out.append(GroupTalk(episode=g, time=2.0, slots=list(range(size)), vids=vids, infos=infos,
                             default={v: int(SpeedIntent.KEEP) for v in vids}, speeds={m.vid: m.speed for m in infos},
                             edges=[(vids[0], vids[1])]))
    return out


def close_waypoints(groups, intents):
    """Members stand 1 m apart: the critic always gives feedback, so every round runs."""
    import numpy as np

    return [np.stack([np.tile([float(k), 0.0], (20, 1)) for k in range(len(g.vids))]) for g in groups]


class PerRequest:
    """The same negotiator, one engine call per request."""

    def __init__(self, inner):
        self.inner, self.name = inner, "per_request"

    def speak(self, requests):
        return [self.inner.speak([r])[0] for r in requests]

    def sum_actions(self, groups):
        return [self.inner.sum_actions([g])[0] for g in groups]

    def consensus(self, groups):
        return [self.inner.consensus([g])[0] for g in groups]


def bench_rounds(args) -> dict:
    from jax_drive.coop.negotiation import LLMNegotiator, RoundsConfig, negotiate
    from jax_drive.sampling import JaxEngine, SamplerConfig

    if args.model == "tiny":
        from jax_drive.models.tiny import tiny_policy

        model, _, tokenizer = tiny_policy(seed=0, lora_rank=None)
    else:
        from jax_drive.models import load_pretrained

        model, _, tokenizer = load_pretrained(args.model)
    engine = JaxEngine(model, tokenizer, SamplerConfig(prompt_buckets=tuple(range(64, 8193, 64))))
    cfg = RoundsConfig(critic=True, consensus=True, max_rounds=args.rounds)
    clock = CompileClock()
    out = {}
    for mode in ("batched", "per_speaker"):
        llm = LLMNegotiator(engine, "compact", actor_tokens=args.actor_tokens, consensus_tokens=args.actor_tokens)
        neg = llm if mode == "batched" else PerRequest(llm)
        negotiate(synthetic_groups(args.groups), neg, close_waypoints, cfg)  # warm-up: the same shapes
        llm.usage = type(llm.usage)()
        groups = synthetic_groups(args.groups)
        compile0, start = clock.seconds, time.perf_counter()
        negotiate(groups, neg, close_waypoints, cfg)
        seconds = time.perf_counter() - start
        rounds = sum(len(g.rounds) for g in groups)
        out[mode] = {"seconds": seconds, "compile_seconds": clock.seconds - compile0, "group_rounds": rounds,
                     "group_rounds_per_s": rounds / seconds,
                     "engine_calls": dict(llm.usage.calls), "prompts": dict(llm.usage.prompts),
                     "prompt_tokens": llm.usage.prompt_tokens, "generated_tokens": llm.usage.generated_tokens}
    out["speedup"] = out["batched"]["group_rounds_per_s"] / out["per_speaker"]["group_rounds_per_s"]
    return out


def bench_grouping(args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jax_drive.sim.grouping import (GroupingConfig, GroupState, batched_group_step, group_step_numpy,
                                        group_step_reference)

    rng = np.random.default_rng(0)
    b, a, w = args.episodes, args.vehicles, 20
    start = rng.uniform(-25, 25, (b, a, 2))
    heading = rng.uniform(-np.pi, np.pi, (b, a))
    speed = rng.uniform(0, 8, (b, a))
    t = 0.2 * np.arange(1, w + 1)
    wp = (start[:, :, None] + (speed[..., None] * t)[..., None]
          * np.stack([np.cos(heading), np.sin(heading)], -1)[:, :, None]).astype(np.float32)
    pos = wp[:, :, 0]
    live = rng.uniform(size=(b, a)) > 0.1
    cfg = GroupingConfig()
    state = GroupState.empty((b, a))
    args_j = (jnp.asarray(wp), jnp.asarray(pos), jnp.asarray(live), state, jnp.float32(0.0))
    np_state = jax.tree.map(np.asarray, state)

    def best(call, repeats: int) -> float:
        return min(wall_times(call, repeats))

    jax.block_until_ready(batched_group_step(cfg, *args_j))  # compile
    jax_s = best(lambda: jax.block_until_ready(batched_group_step(cfg, *args_j)), args.repeats)
    numpy_s = best(lambda: group_step_numpy(cfg, wp, pos, live, np_state, 0.0), args.repeats)
    ref_state = {"label": np.full(a, -1), "hold_until": np.full(a, -np.inf), "last_negotiation": np.full(a, -np.inf)}
    loops = [group_step_reference(cfg, wp[e], pos[e], live[e], ref_state, 0.0)[0]["label"] for e in range(b)]
    loop_s = best(lambda: [group_step_reference(cfg, wp[e], pos[e], live[e], ref_state, 0.0) for e in range(b)],
                  max(1, args.repeats // 5))
    got, _ = batched_group_step(cfg, *args_j)
    vectorised, _ = group_step_numpy(cfg, wp, pos, live, np_state, 0.0)
    return {"episodes": b, "vehicles": a, "waypoints": w, "jax_seconds": jax_s,
            "numpy_vectorised_seconds": numpy_s, "speedup_vs_numpy_vectorised": numpy_s / jax_s,
            "python_loop_seconds": loop_s, "speedup_vs_python_loop": loop_s / jax_s,
            "labels_agree": bool(np.array_equal(np.asarray(got.label), vectorised.label)
                                 and np.array_equal(np.asarray(got.label), np.stack(loops))),
            "mean_group_size": float(np.asarray(got.size)[live].mean())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="'tiny' or a load_pretrained source")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--actor-tokens", type=int, default=24)
    parser.add_argument("--episodes", type=int, default=1024)
    parser.add_argument("--vehicles", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-engine", action="store_true", help="only the grouping benchmark")
    add_output_args(parser, json_required=True)
    args = parser.parse_args(argv)
    require_min(1, groups=args.groups, rounds=args.rounds, actor_tokens=args.actor_tokens, episodes=args.episodes,
                vehicles=args.vehicles, repeats=args.repeats)
    report = {"meta": run_metadata(command=command_line(__file__, argv))}
    report["grouping"] = bench_grouping(args)
    g = report["grouping"]
    print(f"grouping {args.episodes} x {args.vehicles}: jax {g['jax_seconds'] * 1e3:.2f} ms, vectorised numpy "
          f"{g['numpy_vectorised_seconds'] * 1e3:.2f} ms ({g['speedup_vs_numpy_vectorised']:.1f}x), per-episode "
          f"python loops {g['python_loop_seconds'] * 1e3:.1f} ms ({g['speedup_vs_python_loop']:.0f}x), labels agree: "
          f"{g['labels_agree']}")
    if not args.no_engine:
        report["rounds"] = bench_rounds(args)
        r = report["rounds"]
        print(f"rounds: batched {r['batched']['group_rounds_per_s']:.2f}/s, per speaker "
              f"{r['per_speaker']['group_rounds_per_s']:.2f}/s, {r['speedup']:.1f}x")
    report["goals"] = {"grouping_ge_50x_vs_numpy": g["speedup_vs_numpy_vectorised"] >= 50}
    if "rounds" in report:
        report["goals"]["rounds_ge_5x"] = report["rounds"]["speedup"] >= 5
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
