"""Batched vs per-agent engine calls in the talking-agents loop: agent-decisions per second.

The same E episodes (the six TalkingVehicles scenarios in turn, accident-prone and safe
alternating) run for the same number of decisions with the same language policy twice:

  * batched: ONE ``generate_chat`` call per decision for every live agent of every episode
    (what :class:`~jax_drive.coop.agent.LanguagePolicy` does);
  * per-agent: the same loop whose engine answers each agent with its own ``generate_chat``
    call (:class:`PerAgentEngine`), as a driver that queries the model agent by agent would.

Both paths are warmed up first (one untimed run each, so every shape they use is compiled).
Reported: agent decisions, engine seconds and agent-decisions per second of each path, their
ratio, and the per-agent decision cost (engine wall / agents) of the batched path.

    # canonical (SmolLM2, compact prompts of the distilled policy, E = 16):
    nice -n 10 python experiments/bench_coop.py --episodes 16 --json OUT
    # the distilled student instead of the base model, or the tiny random model (a check):
    python experiments/bench_coop.py --model runs/talking_vehicles/cpu-demo/dagger2/student/model --json OUT
    python experiments/bench_coop.py --model tiny --episodes 4 --decisions 2 --json OUT

Heavy imports (JAX, the models) come after the argument checks: bad values exit 2 at once.
"""

from __future__ import annotations

import argparse
import sys
import time

from jax_drive.runinfo import (add_output_args, command_line, require_min, run_main, run_metadata,
                               script_environment, write_json)

script_environment()


class PerAgentEngine:
    """Wraps an engine: ``generate_chat`` answers each conversation with its own call (keys
    folded in per conversation); ``calls`` counts the inner calls."""

    def __init__(self, engine):
        self.engine = engine
        self.calls = 0

    def generate_chat(self, conversations, params, key):
        import jax

        out = []
        for n, conv in enumerate(conversations):
            out += self.engine.generate_chat([conv], params, jax.random.fold_in(key, n))
            self.calls += 1
        return out


def coop_engine(model, tokenizer, episodes: int):
    """The local engine both coop benchmarks time: TalkingVehicles' prompt buckets, a sampler
    call wide enough for every agent of ``episodes`` episodes."""
    from jax_drive.pipelines.engines import EngineSpec, make_engine
    from jax_drive.pipelines.talking_vehicles.presets import PROMPT_BUCKETS

    spec = EngineSpec(prompt_buckets=PROMPT_BUCKETS, min_gen_bucket=8, max_batch=max(64, 4 * episodes))
    return make_engine(spec, model, tokenizer)


def speedup(faster: float, slower: float) -> float:
    """``faster / slower`` with a zero ``slower`` held off (a path that measured nothing)."""
    return faster / max(slower, 1e-12)


def write_report(report: dict, path: str, command: str, summary: str) -> int:
    """The ending both coop benchmarks share: ``report`` stamped with the run's metadata
    (``command`` reruns it), ``summary`` printed, the JSON written; returns exit code 0."""
    report["meta"] = run_metadata(command=command)
    print(summary)
    write_json(path, report)
    return 0


def run_path(engine, specs, agent_config, decisions: int, seed: int) -> dict:
    """Runs ``specs`` for ``decisions`` decisions with a LanguagePolicy over ``engine``."""
    import jax

    from jax_drive.coop.agent import LanguagePolicy
    from jax_drive.coop.learning import run_specs

    policy = LanguagePolicy(engine, agent_config, key=jax.random.key(seed))
    start = time.perf_counter()
    run_specs(specs, policy, max_time=decisions * 0.5 - 1e-6)
    wall = time.perf_counter() - start
    agents = sum(c.agents for c in policy.calls)
    seconds = sum(c.seconds for c in policy.calls)
    return {"decisions": len(policy.calls), "agent_decisions": agents, "engine_seconds": seconds,
            "loop_seconds": wall, "agent_decisions_per_s": agents / max(seconds, 1e-9),
            "agent_seconds_mean": seconds / max(agents, 1), "agents_per_decision": agents / max(len(policy.calls), 1)}


class Recorder:
    """Wraps an engine; keeps the conversations of its first ``generate_chat`` call."""

    def __init__(self, engine):
        self.engine, self.first = engine, None

    def generate_chat(self, conversations, params, key):
        if self.first is None:
            self.first = (conversations, params, key)
        return self.engine.generate_chat(conversations, params, key)


def breakdown(engine, model, tokenizer, specs, agent_config, seed: int, batches=(1, 8, 16, 32)) -> dict:
    """Where a batched decision's time goes: decision 0's prefill (the default: its prompts'
    common prefix once, their own parts packed; the common prefix once, own parts left-padded;
    neither) and decode, and decode milliseconds per step by batch size (random
    60-token prompts, all steps run). Median of 3 after a warm-up."""
    import dataclasses
    import statistics

    import jax
    import numpy as np
    from flax import nnx

    from jax_drive.sampling.sampler import (bucket_size, common_prefix_length, decode, prefill_plan, start_decode,
                                            unique_rows)

    recorder = Recorder(engine)
    run_path(recorder, specs, agent_config, 1, seed)
    conversations, params, key = recorder.first
    prompts = [list(tokenizer.encode(tokenizer.apply_chat_template(c, add_generation_prompt=True)))
               for c in conversations]
    request = engine.request(params.replace(min_new_tokens=params.max_new_tokens))  # every row runs all steps
    graph_and_state, weights = nnx.split(model), engine.decode_weights.get(model)

    def timed(rows, config):
        prefill, steps = [], []
        for _ in range(4):  # the first is a warm-up
            start = time.perf_counter()
            loop, _, _ = start_decode(model, rows, key, request, config, graph_and_state, weights)
            jax.block_until_ready(loop.cache)
            middle = time.perf_counter()
            jax.block_until_ready(decode(model, weights, loop, request, config, graph_and_state).tokens)
            prefill.append(middle - start)
            steps.append(time.perf_counter() - middle)
        return statistics.median(prefill[1:]), statistics.median(steps[1:])

    config = engine.sampler_config
    distinct = unique_rows(prompts)[0]  # the plan start_decode makes for these prompts
    plen = bucket_size(max(map(len, prompts)), config.prompt_buckets, config.min_prompt_bucket, "prompt")
    common, pack = prefill_plan(distinct, plen, config.batch_size(len(distinct)), config)
    width = plen - 1 - common
    packed = timed(prompts, config)
    padded = timed(prompts, dataclasses.replace(config, pack_prompts=False))
    unshared = timed(prompts, dataclasses.replace(config, share_prefix=False, pack_prompts=False))
    rng = np.random.default_rng(seed)
    per_step = {}
    for b in batches:
        _, seconds = timed([list(rng.integers(100, 1000, 60)) for _ in range(b)], engine.sampler_config)
        per_step[str(b)] = round(1e3 * seconds / request.max_new_tokens, 2)
    return {"decision0": {"agents": len(prompts), "prompt_tokens": [len(p) for p in prompts],
                          "distinct_prompts": len(distinct),
                          "common_prefix": {"packed": common, "left_padded": common_prefix_length(prompts)},
                          "packed_bins": None if pack is None else list(pack.ids.shape),
                          "left_padded_columns": [config.batch_size(len(distinct)), width],
                          "own_tokens": sum(len(p) - common - 1 for p in distinct),
                          "prefill_s": {"shared_packed": round(packed[0], 3), "shared_left_padded": round(padded[0], 3),
                                        "unshared_left_padded": round(unshared[0], 3)},
                          "decode_s": round(packed[1], 3), "new_tokens": request.max_new_tokens},
            "decode_ms_per_step_by_batch": per_step}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="load_pretrained source (a distilled student directory works) or 'tiny'")
    parser.add_argument("--episodes", type=int, default=16, help="E, episodes run together")
    parser.add_argument("--decisions", type=int, default=4, help="timed decisions per path")
    parser.add_argument("--style", choices=("compact", "full"), default="compact")
    parser.add_argument("--max-new-tokens", type=int, default=28)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-breakdown", action="store_true",
                        help="skip the breakdown (decision 0's prefill packed, left-padded, unshared; "
                             "decode ms per step by batch)")
    add_output_args(parser, json_required=True)
    args = parser.parse_args(argv)
    require_min(1, episodes=args.episodes, decisions=args.decisions, max_new_tokens=args.max_new_tokens)

    from jax_drive.coop.agent import AgentConfig
    from jax_drive.coop.learning import EpisodeSpec
    from jax_drive.pipelines.engines import ModelSpec, load_model
    from jax_drive.sim.scenarios import TALKING_VEHICLES

    model, tokenizer = load_model(ModelSpec(args.model))
    engine = coop_engine(model, tokenizer, args.episodes)
    config = AgentConfig(style=args.style, max_new_tokens=args.max_new_tokens, temperature=0.2)
    specs = [EpisodeSpec(TALKING_VEHICLES[k % len(TALKING_VEHICLES)], args.seed, k // len(TALKING_VEHICLES), "eval")
             for k in range(args.episodes)]
    per_agent = PerAgentEngine(engine)
    report = {"benchmark": "bench_coop", "model": args.model, "episodes": args.episodes, "decisions": args.decisions,
              "style": args.style, "max_new_tokens": args.max_new_tokens,
              "timing": "engine wall time of the decisions after one untimed warm-up run of each path; "
                        "agent-decisions/s = agents asked / engine seconds"}
    for name, eng in (("batched", engine), ("per_agent", per_agent)):
        if not args.no_progress:
            print(f"warm-up {name}", file=sys.stderr)
        run_path(eng, specs, config, args.decisions, args.seed)
    for name, eng in (("batched", engine), ("per_agent", per_agent)):
        report[name] = run_path(eng, specs, config, args.decisions, args.seed)
        if not args.no_progress:
            print(f"{name}: {report[name]['agent_decisions_per_s']:.2f} agent-decisions/s", file=sys.stderr)
    batched, per_agent = report["batched"], report["per_agent"]
    report["speedup"] = speedup(batched["agent_decisions_per_s"], per_agent["agent_decisions_per_s"])
    if not args.no_breakdown:
        report["breakdown"] = breakdown(engine, model, tokenizer, specs, config, args.seed)
    return write_report(report, args.json, command_line(__file__, argv),
                        f"batched {batched['agent_decisions_per_s']:.2f} vs per-agent "
                        f"{per_agent['agent_decisions_per_s']:.2f} agent-decisions/s: x{report['speedup']:.2f}; "
                        f"batched cost {batched['agent_seconds_mean']:.3f} s per agent decision")


if __name__ == "__main__":
    raise SystemExit(run_main(main))
