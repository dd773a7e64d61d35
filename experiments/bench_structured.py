"""Benchmark: structured generation on SmolLM2-135M-Instruct (CPU), every peer in the same run.

Four measurements (docs/structured.md):

* compile: seconds to compile each project format (outlines-core's vocabulary of the tokenizer,
  built once, reported apart), with and without canonical literal spellings (goal <= 2 s);
* mask overhead: seconds per decode step at batch 16 with the trajectory grammar's mask against
  the same loop unconstrained (no stop ids, so every row runs every step), decode only (the
  prefill excluded), ``--repeats`` interleaved timings after a compiling warm-up, medians
  (goal <= 10 %);
* jump-forward: MTDrive trajectories (canonical literals) and TalkingVehicles action JSON
  answers, decoded with and without jump-forward (``JaxEngine(jump_forward=K)``) at batch 1
  (one answer per call, ``--answers`` calls) and batch 16 (one call): forward passes per
  generated token and decode seconds per answer (goal: >= 30 % fewer passes on trajectories and
  less wall time per answer);
* canonical literals: the probability mass the canonical-spelling restriction removes. Answers
  are sampled under the exact grammar (every spelling); at each answer position whose prefix both
  automata accept, the mass of the tokens the exact mask allows and the canonical mask does not
  (under the exact masked policy) is summed; also the share of answers that left the canonical
  automaton.

  python experiments/bench_structured.py --json OUT [--repeats 3] [--answers 4] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from jax_drive.runinfo import add_output_args, require_min, run_main, run_metadata, script_environment, write_json  # noqa: E402

script_environment()

ACTION_PROMPT = ("You drive the car (vehicle 3) on a two-lane road at 12 m/s. A truck ahead in your lane stopped at "
                 "a red light; vehicle 7 behind you says it will overtake. Decide your next command and message. "
                 'Answer with JSON: {"command": <go | stop | slow down | speed up | change lane left | change lane '
                 'right | keep>, "message": <a short message to the other vehicles>}.')


def chat_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                          add_generation_prompt=True))


def trajectory_prompt(tokenizer) -> list[int]:
    """The cpu-demo's first planning prompt of one generated evaluation scene."""
    import jax

    from jax_drive.pipelines.mtdrive.presets import PRESETS, TEXT_PROMPT
    from jax_drive.rollout import scene_prompts
    from jax_drive.scenes import GeneratorConfig, generate_scenes

    scenes = generate_scenes(jax.random.key(7), 1, GeneratorConfig(hard_fraction=0.3))
    return chat_ids(tokenizer, scene_prompts(scenes, TEXT_PROMPT, PRESETS["cpu-demo"].caption)[0])


def timed_decode(engine, prompt: list[int], params, key) -> dict:
    """One sampler call of ``params.n`` rows of ``prompt`` (grammar, jump-forward as the engine
    and params say): decode seconds (prefill excluded), loop steps, tokens per row."""
    import jax
    from flax import nnx

    from jax_drive.sampling.decode import decode
    from jax_drive.sampling.sampler import start_decode

    rows = [list(prompt)] * params.n
    config = engine.sampler_config
    request = engine.constrained(engine.request(params), params.row_grammars(1) * params.n,
                                 config.batch_size(len(rows)))
    weights = engine.decode_weights.get(engine.model)
    loop, n, _ = start_decode(engine.model, rows, key, request, config, nnx.split(engine.model), weights)
    jax.block_until_ready(loop.cache)
    start, cpu = time.perf_counter(), time.process_time()
    out = decode(engine.model, weights, loop, request, config)
    lengths, steps = jax.device_get((out.lengths, out.step))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"seconds": seconds, "cpu_seconds": cpu, "steps": int(steps), "lengths": [int(x) for x in lengths[:n]]}


def compile_times(tokenizer) -> dict:
    from jax_drive.coop.agent import COMMANDS
    from jax_drive.coop.negotiation.prompts import MAX_WORDS
    from jax_drive.sampling.grammar import (GrammarCompiler, action_grammar, actor_reply_grammar, consensus_grammar,
                                            sum_actions_grammar, trajectory_grammar)

    compiler = GrammarCompiler(tokenizer)
    start = time.perf_counter()
    compiler.outlines_vocabulary  # built once per tokenizer, before the first grammar
    out = {"outlines_vocabulary_seconds": round(time.perf_counter() - start, 3), "formats": {}}
    formats = {"trajectory": trajectory_grammar(), "action_80_chars": action_grammar(tuple(COMMANDS), 80),
               "actor_reply": actor_reply_grammar(MAX_WORDS), "sum_actions_3": sum_actions_grammar([201, 202, 203]),
               "consensus": consensus_grammar()}
    for name, grammar in formats.items():
        for canonical in (False, True):
            cpu = time.process_time()
            compiled = compiler.compile(grammar.canonical(canonical))
            out["formats"][name + ("_canonical" if canonical else "")] = {
                "seconds": round(compiled.compile_seconds, 3), "cpu_seconds": round(time.process_time() - cpu, 3),
                "states": compiled.num_states,
                "classes": compiled.num_classes, "min_tokens": compiled.min_tokens, "max_tokens": compiled.max_tokens}
    out["slowest_seconds"] = max(f["seconds"] for f in out["formats"].values())
    out["slowest_cpu_seconds"] = max(f["cpu_seconds"] for f in out["formats"].values())
    return out


def mask_overhead(model, tokenizer, prompt, repeats: int, batch: int) -> dict:
    import jax

    from jax_drive.sampling import JaxEngine, SamplingParams
    from jax_drive.sampling.grammar import trajectory_grammar

    engine = JaxEngine(model, tokenizer)
    grammar = trajectory_grammar().canonical()
    constrained = SamplingParams(max_new_tokens=176, n=batch, grammar=grammar)
    free = SamplingParams(max_new_tokens=136, n=batch, stop_token_ids=())  # every row runs every step
    runs: dict[str, list] = {"constrained": [], "unconstrained": []}
    for name, params in (("constrained", constrained), ("unconstrained", free)):  # warm-up: compile
        timed_decode(engine, prompt, params, jax.random.key(100))
    for r in range(repeats):
        for name, params in (("constrained", constrained), ("unconstrained", free)):
            runs[name].append(timed_decode(engine, prompt, params, jax.random.key(r)))
    per_step = {name: statistics.median(x["seconds"] / x["steps"] for x in rs) for name, rs in runs.items()}
    cpu_step = {name: statistics.median(x["cpu_seconds"] / x["steps"] for x in rs) for name, rs in runs.items()}
    return {"batch": batch, "repeats": repeats,
            "seconds_per_step": {k: round(v, 5) for k, v in per_step.items()},
            "cpu_seconds_per_step": {k: round(v, 5) for k, v in cpu_step.items()},
            "steps": {k: [x["steps"] for x in rs] for k, rs in runs.items()},
            "overhead": round(per_step["constrained"] / per_step["unconstrained"] - 1.0, 4),
            "overhead_cpu": round(cpu_step["constrained"] / cpu_step["unconstrained"] - 1.0, 4)}


def jump_forward(model, tokenizer, prompts: dict, answers: int, batches: list[int], max_forced: int) -> dict:
    import jax

    from jax_drive.coop.agent import COMMANDS
    from jax_drive.sampling import JaxEngine, SamplingParams
    from jax_drive.sampling.grammar import action_grammar, trajectory_grammar

    grammars = {"trajectory": (trajectory_grammar().canonical(), 176),
                "action": (action_grammar(tuple(COMMANDS), 80).canonical(), 96)}
    engines = {"plain": JaxEngine(model, tokenizer), "jump_forward": JaxEngine(model, tokenizer, jump_forward=max_forced)}
    out: dict = {"max_forced": max_forced}
    for fmt, (grammar, budget) in grammars.items():
        out[fmt] = {}
        for batch in batches:
            calls = answers if batch == 1 else 1
            row: dict = {}
            for name, engine in engines.items():
                params = SamplingParams(max_new_tokens=budget, n=batch, grammar=grammar)
                timed_decode(engine, prompts[fmt], params, jax.random.key(99))  # warm-up: compile
                runs = [timed_decode(engine, prompts[fmt], params, jax.random.key(c)) for c in range(calls)]
                tokens = sum(sum(r["lengths"]) for r in runs)
                longest = sum(max(r["lengths"]) for r in runs)
                steps = sum(r["steps"] for r in runs)
                seconds = sum(r["seconds"] for r in runs)
                cpu = sum(r["cpu_seconds"] for r in runs)
                row[name] = {"answers": calls * batch, "tokens": tokens, "passes": steps,
                             "passes_per_token": round(steps / longest, 4),
                             "seconds_per_answer": round(seconds / (calls * batch), 4),
                             "cpu_seconds_per_answer": round(cpu / (calls * batch), 4),
                             "seconds_per_pass": round(seconds / steps, 5)}
            plain, jump = row["plain"], row["jump_forward"]
            row["fewer_passes"] = round(1 - jump["passes_per_token"] / plain["passes_per_token"], 4)
            row["wall_ratio"] = round(jump["seconds_per_answer"] / plain["seconds_per_answer"], 4)
            row["cpu_ratio"] = round(jump["cpu_seconds_per_answer"] / plain["cpu_seconds_per_answer"], 4)
            out[fmt][f"batch_{batch}"] = row
    return out


def canonical_effect(model, tokenizer, prompts: dict, samples: int) -> dict:
    """Mass the canonical restriction removes, on answers sampled under the exact grammar."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jax_drive.coop.agent import COMMANDS
    from jax_drive.sampling import JaxEngine, SamplingParams
    from jax_drive.sampling.grammar import action_grammar, advance, allowed_tokens, trajectory_grammar

    engine = JaxEngine(model, tokenizer)
    stops = tuple(tokenizer.eos_token_ids)
    out = {}
    for fmt, grammar, budget in (("trajectory", trajectory_grammar(), 176),
                                 ("action", action_grammar(tuple(COMMANDS), 80), 96)):
        answers = engine.generate([prompts[fmt]], SamplingParams(max_new_tokens=budget, n=samples, grammar=grammar),
                                  jax.random.key(5))
        exact, _, _ = engine.grammars.tables([grammar], stops)
        canon, _, _ = engine.grammars.tables([grammar.canonical()], stops)
        removed, left = [], 0
        for c in answers:
            ids = list(c.token_ids)
            seq = jnp.asarray([prompts[fmt] + ids])
            logits = model(seq)[0][0, len(prompts[fmt]) - 1:-1]
            s_exact, s_canon = 0, 0
            for t, token in enumerate(ids):
                if s_canon < 0:
                    break
                rem = budget - t
                a_exact = allowed_tokens(exact, 0, s_exact, rem)
                a_canon = allowed_tokens(canon, 0, s_canon, rem)
                p = jax.nn.softmax(jnp.where(a_exact, logits[t], -1e30))
                removed.append(float(jnp.sum(jnp.where(a_exact & ~a_canon, p, 0.0))))
                s_exact = int(advance(exact, 0, s_exact, token))
                s_canon = int(advance(canon, 0, s_canon, token))
            left += int(s_canon < 0)
        out[fmt] = {"answers": samples, "positions": len(removed),
                    "removed_mass_mean": float(np.mean(removed)), "removed_mass_max": float(np.max(removed)),
                    "answers_outside_canonical": int(left)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser, json_required=True)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved timings of the mask overhead")
    parser.add_argument("--answers", type=int, default=4, help="answers (calls) per format at batch 1")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-forced", type=int, default=7, help="jump-forward's K (forced tokens per pass)")
    parser.add_argument("--samples", type=int, default=8, help="answers of the canonical-literals measurement")
    parser.add_argument("--quick", action="store_true", help="1 repeat, 1 answer, 2 samples (checks the script)")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.answers, args.samples = 1, 1, 2
    require_min(1, repeats=args.repeats, answers=args.answers, batch=args.batch, max_forced=args.max_forced,
                samples=args.samples)

    from jax_drive.models import load_pretrained

    model, _, tokenizer = load_pretrained("smollm2-135m-instruct", dtype="float32")
    prompts = {"trajectory": trajectory_prompt(tokenizer), "action": chat_ids(tokenizer, ACTION_PROMPT)}
    results = {"meta": run_metadata(benchmark="bench_structured"),
               "workload": {"model": "SmolLM2-135M-Instruct (untrained, float32)", "temperature": 1.0,
                            "batch": args.batch, "prompt_tokens": {k: len(v) for k, v in prompts.items()},
                            "max_forced": args.max_forced}}
    results["compile"] = compile_times(tokenizer)
    print(json.dumps(results["compile"], indent=1), flush=True)
    results["mask_overhead"] = mask_overhead(model, tokenizer, prompts["trajectory"], args.repeats, args.batch)
    print(json.dumps(results["mask_overhead"], indent=1), flush=True)
    results["jump_forward"] = jump_forward(model, tokenizer, prompts, args.answers, [1, args.batch], args.max_forced)
    print(json.dumps(results["jump_forward"], indent=1), flush=True)
    results["canonical_literals"] = canonical_effect(model, tokenizer, prompts, args.samples)
    traj = results["jump_forward"]["trajectory"]
    results["goals"] = {
        "compile_at_most_2s": results["compile"]["slowest_seconds"] <= 2.0,
        "compile_at_most_2_cpu_seconds": results["compile"]["slowest_cpu_seconds"] <= 2.0,
        "mask_overhead_at_most_10pct": results["mask_overhead"]["overhead"] <= 0.10,
        "trajectory_30pct_fewer_passes": {b: traj[b]["fewer_passes"] >= 0.30 for b in traj},
        "trajectory_less_wall_per_answer": {b: traj[b]["wall_ratio"] < 1.0 for b in traj},
    }
    results["meta"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    write_json(args.json, results)
    print(json.dumps({k: results[k] for k in ("canonical_literals", "goals")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
