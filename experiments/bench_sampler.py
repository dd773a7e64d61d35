"""Benchmark: jax-drive's jitted KV-cache sampler vs transformers' `generate` (torch, CPU).

Both decode SmolLM2-135M-Instruct from the same GGUF file (dequantised Q4_1 -> float32),
on the same chat prompts (left-padded batches), greedily, generating exactly the same number
of new tokens (both: EOS masked until max_new_tokens, i.e. min_new_tokens = max_new_tokens),
so both should produce the same tokens (`rows_with_identical_greedy_tokens`).

Reported throughput = batch * new_tokens / wall time of one full `generate` call (prompt
prefill included for both, ~40-token prompts). A warm-up call runs first for each engine and
batch size and is NOT timed (it contains XLA compilation for JAX). We also report the
decode-only rate from the difference between a full run and a 1-new-token run, and the
1-new-token time itself (prefill-dominated).

``--prompt-tokens N`` prefixes every question with driving-scene filler text so that each
prompt has about N tokens (MTDrive's cpu-demo prompts are ~550 tokens in turn 1 and up to
~1,400 in turn 2), which measures the long-context prefill and decode the demo pays for.

  python experiments/bench_sampler.py --json OUT [--quick]
  python experiments/bench_sampler.py --json OUT --prompt-tokens 1280 --batches 8 --new-tokens 168
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from jax_drive.runinfo import (InputError, add_output_args, require_min, run_main, run_metadata,
                               script_environment, wall_times, write_json)

script_environment()

QUESTIONS = [
    "What is the capital of France?",
    "The traffic light 30 m ahead turns yellow. Should I brake?",
    "Describe a safe lane change in two sentences.",
    "A pedestrian steps onto the crossing. What do you do?",
    "Name three causes of traffic jams.",
    "How far is a 2 second gap at 20 m/s?",
    "Explain what a roundabout is.",
    "Should I overtake a cyclist on a narrow road?",
]


FILLER = ("The ego vehicle drives at 9.8 m/s in the right lane of a two-lane road; a car 24 m "
          "ahead brakes gently, a cyclist rides on the shoulder 12 m ahead and a parked van "
          "blocks part of the left lane 40 m ahead. ")


def long_prompt(tokenizer, question: str, target: int) -> list[int]:
    """Chat-templated ids of ``question`` after as many filler sentences as keep the prompt at
    or under ``target`` tokens (at least one)."""
    def ids(repeats: int) -> list[int]:
        content = FILLER * repeats + question
        return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": content}]))

    repeats = 1
    while len(ids(repeats + 1)) <= target:
        repeats += 1
    return ids(repeats)


def time_call(fn, repeats: int) -> float:
    """Median wall seconds of `fn()` over `repeats` runs."""
    return statistics.median(wall_times(fn, repeats))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser, json_required=True)
    parser.add_argument("--quick", action="store_true", help="32 new tokens, 1 timed repeat")
    parser.add_argument("--new-tokens", type=int, default=None, help="default 128 (quick: 32)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 3, quick 1)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="JAX parameter/compute dtype (torch always float32)")
    parser.add_argument("--no-torch", action="store_true", help="skip the transformers peer")
    parser.add_argument("--plot", action="store_true", help="also write a PNG next to the JSON")
    parser.add_argument("--prompt-tokens", type=int, default=None,
                        help="pad each prompt with driving filler text to about this many tokens")
    args = parser.parse_args(argv)
    require_min(1, new_tokens=args.new_tokens, repeats=args.repeats, batches=args.batches,
                prompt_tokens=args.prompt_tokens)
    if max(args.batches) > len(QUESTIONS):
        raise InputError(f"--batches: at most {len(QUESTIONS)} prompts available, got {max(args.batches)}")
    new_tokens = args.new_tokens or (32 if args.quick else 128)
    repeats = args.repeats or (1 if args.quick else 3)

    import jax

    from jax_drive.models import load_pretrained
    from jax_drive.models.loading import smollm2_gguf_path
    from jax_drive.sampling import SamplerConfig, generate_tokens

    model, config, tokenizer = load_pretrained("smollm2-135m-instruct", dtype=args.dtype)
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    prompt_ids = [tokenizer.encode(c) for c in chats]
    if args.prompt_tokens:
        prompt_ids = [long_prompt(tokenizer, q, args.prompt_tokens) for q in QUESTIONS]

    meta = {"benchmark": "bench_sampler"}
    results: dict = {
        "model": "SmolLM2-135M-Instruct (GGUF Q4_1 dequantised)",
        "new_tokens": new_tokens,
        "repeats": repeats,
        "jax_dtype": args.dtype,
        "torch_dtype": "float32",
        "greedy": True,
        "prompt_lengths": [len(p) for p in prompt_ids],
        "prompt_tokens_target": args.prompt_tokens,
        "timing": "median wall time of full generate calls after one untimed warm-up call "
                  "(JAX compilation excluded); throughput = batch*new_tokens/time, prompt "
                  "prefill included; *_decode_only = batch*(new_tokens-1)/(t_full - t_1token)",
    }

    # Long prompts pad to multiples of 128 (as the MTDrive engine does), not to a power of two.
    sampler_config = (SamplerConfig(prompt_buckets=tuple(range(128, 16_385, 128))) if args.prompt_tokens
                      else SamplerConfig())

    def jax_run(batch: int, n: int):
        # same rule as transformers' min_new_tokens: EOS is masked until n tokens exist
        out = generate_tokens(model, prompt_ids[:batch], jax.random.key(0), max_new_tokens=n,
                              min_new_tokens=n, temperature=0.0,
                              stop_token_ids=tokenizer.eos_token_ids,
                              pad_id=tokenizer.pad_token_id, config=sampler_config)
        assert out.lengths.min() == n
        return out

    hf = None
    if not args.no_torch:
        import torch
        import transformers

        meta.update(torch_version=torch.__version__, transformers_version=transformers.__version__,
                    torch_threads=torch.get_num_threads())
        path = smollm2_gguf_path()
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()

        def torch_run(batch: int, n: int):
            rows = prompt_ids[:batch]
            width = max(len(r) for r in rows)
            ids = torch.zeros((batch, width), dtype=torch.long)
            mask = torch.zeros((batch, width), dtype=torch.long)
            for i, r in enumerate(rows):  # left padding, like ours
                ids[i, width - len(r):] = torch.tensor(r)
                mask[i, width - len(r):] = 1
            with torch.inference_mode():
                out = hf.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, pad_token_id=tokenizer.pad_token_id)
            assert out.shape[1] - width == n
            return out

    engines = [("jax", jax_run)] + ([("torch", torch_run)] if hf is not None else [])
    results = {"meta": run_metadata(**meta), **results}  # before any timed call: the machine's load then
    steps = len(args.batches) * len(engines) * (2 + 2 * repeats)
    bar = tqdm(total=steps, desc="bench_sampler", unit="call", disable=args.no_progress)
    agree = {}
    for batch in args.batches:
        outputs = {}
        for name, run in engines:
            bar.set_postfix(engine=name, batch=batch)
            outputs[name] = run(batch, new_tokens)  # warm-up (compilation for JAX)
            run(batch, 1)
            bar.update(2)
            t_full = time_call(lambda: run(batch, new_tokens), repeats)
            bar.update(repeats)
            t_one = time_call(lambda: run(batch, 1), repeats)
            bar.update(repeats)
            results[f"{name}_seconds_b{batch}"] = round(t_full, 4)
            results[f"{name}_seconds_1token_b{batch}"] = round(t_one, 4)
            results[f"{name}_tokens_per_s_b{batch}"] = round(batch * new_tokens / t_full, 2)
            decode = t_full - t_one
            results[f"{name}_decode_only_tokens_per_s_b{batch}"] = (
                round(batch * (new_tokens - 1) / decode, 2) if decode > 0 else None)
        if hf is not None:
            ours = np.asarray(outputs["jax"].tokens)
            theirs = outputs["torch"][:, -new_tokens:].numpy()
            same = (ours == theirs).all(axis=1)
            agree[f"b{batch}"] = int(same.sum())
            results[f"speedup_b{batch}"] = round(
                results[f"jax_tokens_per_s_b{batch}"] / results[f"torch_tokens_per_s_b{batch}"], 3)
            results[f"speedup_decode_only_b{batch}"] = (
                round(results[f"jax_decode_only_tokens_per_s_b{batch}"]
                      / results[f"torch_decode_only_tokens_per_s_b{batch}"], 3)
                if results[f"jax_decode_only_tokens_per_s_b{batch}"]
                and results[f"torch_decode_only_tokens_per_s_b{batch}"] else None)
    bar.close()
    if agree:
        results["rows_with_identical_greedy_tokens"] = agree

    out = Path(write_json(args.json, results))
    print(json.dumps({k: v for k, v in results.items() if "per_s" in k or "speedup" in k}, indent=2))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.2))
        width = 0.38
        xs = np.arange(len(args.batches))
        for k, (name, _) in enumerate(engines):
            vals = [results[f"{name}_tokens_per_s_b{b}"] for b in args.batches]
            ax.bar(xs + (k - 0.5) * width, vals, width, label=name)
        ax.set_xticks(xs, [f"batch {b}" for b in args.batches])
        ax.set_ylabel("generated tokens / s")
        ax.set_title(f"SmolLM2-135M greedy, {new_tokens} new tokens, CPU")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
