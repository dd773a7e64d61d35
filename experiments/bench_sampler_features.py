"""Micro-benchmark: the sampler's three work-saving features on SmolLM2-135M-Instruct, each
on and off in one run, on the same inputs, with the on/off outputs compared.

1. shared-prefix prefill: ``--prompts`` distinct long chat prompts (a common filler text,
   then each its own question), each sampled ``--group`` times (rows = prompts x group),
   with ``SamplerConfig(share_prefix=True/False)`` (on: each distinct prompt once, and their
   common prefix once; ``pack_prompts`` follows it, so off is the plain prefill); sampled at
   temperature 1 with equal keys (both must draw the same tokens).
2. cross-turn KV reuse: a second turn (a feedback message of about ``--feedback-tokens``
   tokens appended to every row's first turn) by ``Session.extend`` vs ``JaxEngine.generate``
   on the whole context (today's path: re-prefill everything); the first turn is sampled at
   temperature 1 (as MTDrive's G rollouts are, so the rows' contexts differ), the second
   greedy.
3. prompt-lookup speculative decoding on that refinement turn (the feedback asks to restate
   the answer with one change, so the answer repeats the context): ``Session.extend`` with
   and without ``PromptLookup``; greedy (outputs must be identical); forward passes counted.

Timing: median wall time over ``--repeats`` calls after one untimed warm-up (XLA compilation
excluded), plus process CPU time (all threads), which a busy shared machine distorts less.
Only the measured call is timed (turn 1 of a session is re-run untimed before each extend).

  python experiments/bench_sampler_features.py --json OUT [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
from bench_sampler import QUESTIONS, long_prompt  # sibling script (experiments/ is on sys.path when run)
from tqdm import tqdm

from jax_drive.runinfo import (InputError, add_output_args, require_min, run_main, run_metadata,
                               script_environment, write_json)

script_environment()

FEEDBACK = ("PDM Agent: point 5 of your trajectory leaves the drivable area and point 7 comes "
            "within 1.2 m of the car ahead. Keep every other point exactly as it was and write "
            "the whole corrected trajectory again in the same format.")
ANSWER_FORMAT = (" Answer with 8 trajectory points for the next 4 s, each (x, y, heading) with 2 "
                 "decimals, formatted as [PT, (+x.xx, +y.yy, +h.hh), ...].")


def timed(fn, repeats: int, setup=None) -> dict:
    """Median wall and CPU seconds of ``fn(setup())`` over ``repeats`` calls (setup untimed)."""
    walls, cpus = [], []
    for _ in range(repeats):
        arg = setup() if setup is not None else None
        wall, cpu = time.perf_counter(), time.process_time()
        fn(arg)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {"wall_s": round(statistics.median(walls), 4), "cpu_s": round(statistics.median(cpus), 4)}


def speedup(off: dict, on: dict) -> dict:
    return {k: round(off[k] / on[k], 3) if on[k] > 0 else None for k in ("wall_s", "cpu_s")}


def max_logprob_diff(a, b) -> float:
    return max((float(np.abs(np.subtract(x.logprobs, y.logprobs)).max()) if x.logprobs else 0.0)
               for x, y in zip(a, b))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser, json_required=True)
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes to check the script: 2 prompts x 2, ~96-token prompts, "
                             "16 new tokens, 1 repeat")
    parser.add_argument("--prompts", type=int, default=2, help="distinct prompts")
    parser.add_argument("--group", type=int, default=4, help="samples per prompt (G)")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="about this many tokens per prompt")
    parser.add_argument("--new-tokens", type=int, default=96, help="generation budget per turn")
    parser.add_argument("--num-draft", type=int, default=4, help="prompt-lookup drafts per step (K)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per measurement")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.group, args.prompt_tokens, args.new_tokens, args.repeats = 2, 2, 96, 16, 1
    require_min(1, prompts=args.prompts, group=args.group, prompt_tokens=args.prompt_tokens,
                new_tokens=args.new_tokens, num_draft=args.num_draft, repeats=args.repeats)
    if args.prompts > len(QUESTIONS):
        raise InputError(f"--prompts: at most {len(QUESTIONS)}, got {args.prompts}")

    import jax

    from jax_drive.models import load_pretrained
    from jax_drive.sampling import JaxEngine, PromptLookup, SamplerConfig, SamplingParams, generate_tokens

    model, _, tokenizer = load_pretrained("smollm2-135m-instruct")
    prompts = [long_prompt(tokenizer, q + ANSWER_FORMAT, args.prompt_tokens) for q in QUESTIONS[:args.prompts]]
    rows = [p for p in prompts for _ in range(args.group)]
    n = args.new_tokens
    buckets = SamplerConfig(prompt_buckets=tuple(range(64, 16_385, 64)))
    results: dict = {
        "meta": run_metadata(benchmark="bench_sampler_features"),  # before any timed call: the load then
        "model": "SmolLM2-135M-Instruct (GGUF Q4_1 dequantised, float32)",
        "rows": len(rows), "prompts": args.prompts, "group": args.group,
        "prompt_lengths": [len(p) for p in prompts], "new_tokens": n, "repeats": args.repeats,
        "num_draft": args.num_draft,
        "timing": "median over repeats after one untimed warm-up; wall and process CPU seconds",
    }
    bar = tqdm(total=3, desc="bench_sampler_features", unit="feature", disable=args.no_progress)

    # 1. shared-prefix prefill -----------------------------------------------------------
    def sample(share: bool):
        config = SamplerConfig(prompt_buckets=buckets.prompt_buckets, share_prefix=share, pack_prompts=share)
        return generate_tokens(model, rows, jax.random.key(0), max_new_tokens=n, min_new_tokens=n,
                               temperature=1.0, pad_id=tokenizer.pad_token_id, config=config)

    shared, unshared = sample(True), sample(False)  # warm-up
    results["shared_prefix"] = {
        "on": timed(lambda _: sample(True), args.repeats),
        "off": timed(lambda _: sample(False), args.repeats),
        "tokens_identical": bool((shared.tokens == unshared.tokens).all()),
        "max_abs_logprob_diff": float(np.abs(shared.logprobs - unshared.logprobs).max()),
    }
    results["shared_prefix"]["speedup"] = speedup(results["shared_prefix"]["off"], results["shared_prefix"]["on"])
    bar.update()

    # 2. cross-turn KV reuse ---------------------------------------------------------------
    greedy = SamplingParams(max_new_tokens=n, temperature=0.0)
    sampled = SamplingParams(max_new_tokens=n, temperature=1.0)
    plain_engine = JaxEngine(model, tokenizer, buckets)
    lookup_engine = JaxEngine(model, tokenizer, buckets, prompt_lookup=PromptLookup(num_draft=args.num_draft))
    first = plain_engine.generate(rows, sampled, jax.random.key(1))
    feedback = [tokenizer.encode(("" if c.finish_reason == "stop" else "<|im_end|>") + "\n<|im_start|>user\n"
                                 + FEEDBACK + "<|im_end|>\n<|im_start|>assistant\n") for c in first]
    contexts = [list(c.prompt_token_ids) + list(c.token_ids) + f for c, f in zip(first, feedback)]
    results["feedback_tokens"] = [len(f) for f in feedback]

    def start(engine):
        return lambda: engine.start(rows, sampled, jax.random.key(1))[0]

    def extend(session):
        return session.extend(feedback, greedy, jax.random.key(2))

    def regenerate(_):
        return plain_engine.generate(contexts, greedy, jax.random.key(2))

    session, first_again = plain_engine.start(rows, sampled, jax.random.key(1))
    reused, fresh = extend(session), regenerate(None)  # warm-up
    results["kv_reuse"] = {
        "on": timed(extend, args.repeats, setup=start(plain_engine)),
        "off": timed(regenerate, args.repeats),
        "tokens_identical": [c.token_ids for c in reused] == [c.token_ids for c in fresh],
        "max_abs_logprob_diff": max_logprob_diff(reused, fresh),
        "context_tokens": [len(c) for c in contexts],
        "distinct_contexts": len({tuple(c) for c in contexts}),
        "first_turn_identical": [c.token_ids for c in first_again] == [c.token_ids for c in first],
    }
    results["kv_reuse"]["speedup"] = speedup(results["kv_reuse"]["off"], results["kv_reuse"]["on"])
    bar.update()

    # 3. prompt lookup on the refinement turn -----------------------------------------------
    session = start(lookup_engine)()
    drafted = extend(session)  # warm-up
    plain_session = start(plain_engine)()
    extend(plain_session)
    generated = sum(len(c.token_ids) for c in reused)
    results["prompt_lookup"] = {
        "on": timed(extend, args.repeats, setup=start(lookup_engine)),
        "off": results["kv_reuse"]["on"],
        "tokens_identical": [c.token_ids for c in drafted] == [c.token_ids for c in reused],
        "max_abs_logprob_diff": max_logprob_diff(drafted, reused),
        "generated_tokens": generated,
        "forward_passes_on": session.last_decode_steps,
        "forward_passes_off": plain_session.last_decode_steps,
        "second_turn_text_row0": drafted[0].text,
    }
    results["prompt_lookup"]["speedup"] = speedup(results["prompt_lookup"]["off"], results["prompt_lookup"]["on"])
    bar.update()
    bar.close()

    write_json(args.json, results)
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk in ("speedup", "tokens_identical",
                                                                 "max_abs_logprob_diff")}
                      for k, v in results.items() if k in ("shared_prefix", "kv_reuse", "prompt_lookup")},
                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
