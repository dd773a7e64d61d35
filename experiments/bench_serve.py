"""Benchmark: rollout tokens/s through `jax-drive serve` vs the in-process JaxEngine, and vs
llama.cpp's OpenAI-compatible server (llama-cpp-python) on the same model.

One "rollout call" generates ``--batch`` completions (one per chat prompt, as a rollout turn
does) of exactly ``--max-new-tokens`` tokens each (EOS masked: ``min_new_tokens`` =
``max_new_tokens`` everywhere, so every back end produces the same number of tokens).
Throughput = batch * max_new_tokens / wall time of one call, median over ``--repeats``
calls after one untimed warm-up call (XLA compilation for JAX, model load for llama.cpp).

- ``jax_engine``: ``JaxEngine.generate`` in this process: one sampler call for the batch.
- ``serve``: `jax-drive serve` in a subprocess on 127.0.0.1, driven by ``OpenAIEngine``
  (one HTTP request per row, ``--batch`` in flight, batched by the server into sampler
  calls; its /health counts are reported as ``rows_per_engine_call``), with every limit
  off (0) and no API key: the server as it was before limits existed. The goal of issue 19
  is ``serve_overhead`` = 1 - serve / jax_engine <= 0.15 at batch 8.
- ``serve_limits``: the same server with its default limits and an API key (what a
  deployment runs); ``limits_overhead`` = 1 - serve_limits / serve. Both servers parse off
  the event loop and watch for hang-ups (not switchable), so this measures the limits and
  the key check, not the thread pool.
- ``serve_requests`` / ``serve_stream``: the limits-on server again, driven by the official
  ``openai`` client (``--batch`` concurrent completions requests, one row each, token-id
  prompts), without and with ``stream=true``, in the same server process: per request its
  latency (send to last token) and, streamed, its time to first token (send to the first
  chunk with tokens); per call tokens/s. ``ttft_over_latency`` = median streamed time to
  first token / median non-streamed latency; ``stream_over_requests`` = streamed tokens/s /
  non-streamed tokens/s (the cost of the chunked decode's one-step first chunk and of the
  events).
- ``llama_cpp``: llama-cpp-python's server (``--llama-threads`` threads) on the same GGUF
  (Q4_1 weights; ours dequantise them to float32), same client. It serves one request at a
  time (no batching), so its rate is per-stream.

  python experiments/bench_serve.py --json OUT                       # canonical (SmolLM2)
  python experiments/bench_serve.py --json OUT --model tiny --batch 2 --max-new-tokens 8 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_sampler import QUESTIONS  # the same chat prompts as the sampler bench (sibling script)
from tqdm import tqdm

from jax_drive.runinfo import (InputError, add_output_args, require_min, run_main, run_metadata,
                               script_environment, write_results)

script_environment()


def chat_prompts(tokenizer, batch: int) -> list[list[int]]:
    """``batch`` chat-templated token-id prompts (questions cycled)."""
    out = []
    for i in range(batch):
        messages = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        out.append(tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True)))
    return out


def time_calls(generate, prompts, params, repeats: int, label: str, show_progress: bool) -> dict:
    """Warm-up call, then ``repeats`` timed calls; tokens/s from the median time."""
    import jax

    start = time.perf_counter()
    first = generate(prompts, params, jax.random.key(0))
    warmup_s = time.perf_counter() - start
    times, tokens = [], []
    for r in tqdm(range(repeats), desc=label, leave=False, disable=not show_progress):
        start = time.perf_counter()
        out = generate(prompts, params, jax.random.key(r + 1))
        times.append(time.perf_counter() - start)
        tokens.append(sum(c.num_tokens for c in out))
    median = statistics.median(times)
    return {
        "warmup_s": warmup_s,
        "call_s": times,
        "median_call_s": median,
        "tokens_per_call": tokens,
        "tokens_per_s": statistics.median(tokens) / median,
        "warmup_tokens": sum(c.num_tokens for c in first),
    }


def server_counts(base_url: str, api_key: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with urllib.request.urlopen(urllib.request.Request(base_url + "/health", headers=headers), timeout=10) as answer:
        return json.loads(answer.read())


LIMITS_OFF = ["--max-body-bytes", "0", "--max-request-rows", "0", "--max-prompt-tokens", "0",
              "--max-tokens-limit", "0", "--request-timeout", "0", "--max-queued-rows", "0"]
BENCH_KEY = "bench-serve-key"


def time_requests(base_url: str, api_key: str | None, prompts, max_new_tokens: int, repeats: int, stream: bool,
                  label: str, show_progress: bool) -> dict:
    """One warm-up call and ``repeats`` timed calls of ``len(prompts)`` concurrent requests
    through the ``openai`` client (see the module docstring)."""
    import concurrent.futures

    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key=api_key or "none", max_retries=0, timeout=1800)

    def one(prompt, seed) -> dict:
        kwargs = dict(model="policy", prompt=prompt, max_tokens=max_new_tokens, temperature=1.0, seed=seed,
                      extra_body={"min_tokens": max_new_tokens})
        start = time.perf_counter()
        first, tokens = None, 0
        if stream:
            for chunk in client.completions.create(**kwargs, stream=True):
                new = sum(len(c.model_extra.get("token_ids") or ()) for c in chunk.choices)
                if new and first is None:
                    first = time.perf_counter() - start
                tokens += new
        else:
            tokens = len(client.completions.create(**kwargs).choices[0].model_extra["token_ids"])
        latency = time.perf_counter() - start
        return {"ttft_s": latency if first is None else first, "latency_s": latency, "tokens": tokens}

    calls = []
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        for r in tqdm(range(repeats + 1), desc=label, leave=False, disable=not show_progress):
            start = time.perf_counter()
            rows = list(pool.map(one, prompts, [r * len(prompts) + i for i in range(len(prompts))]))
            calls.append({"call_s": time.perf_counter() - start, "rows": rows})
    timed = calls[1:]  # the first call is the warm-up
    ttft = [row["ttft_s"] for call in timed for row in call["rows"]]
    latency = [row["latency_s"] for call in timed for row in call["rows"]]
    tokens = [sum(row["tokens"] for row in call["rows"]) for call in timed]
    call_s = [call["call_s"] for call in timed]
    return {
        "stream": stream,
        "warmup_s": calls[0]["call_s"],
        "call_s": call_s,
        "tokens_per_call": tokens,
        "tokens_per_s": statistics.median(tokens) / statistics.median(call_s),
        "ttft_s": ttft,
        "median_ttft_s": statistics.median(ttft),
        "max_ttft_s": max(ttft),
        "latency_s": latency,
        "median_latency_s": statistics.median(latency),
    }


def time_server(args, source: str, tokenizer, prompts, params, label: str, extra: list[str],
                api_key: str | None, requests: bool = False) -> dict:
    """``time_calls`` through a `jax-drive serve` subprocess started with ``extra`` flags; with
    ``requests``, then ``time_requests`` without and with streaming on the same server
    (under "requests" / "stream")."""
    from jax_drive.sampling import OpenAIEngine
    from jax_drive.serve.launch import free_port, server_process

    port = free_port()
    command = [sys.executable, "-m", "jax_drive.cli", "serve", "--model", source,
               "--served-model-name", "policy", "--port", str(port),
               "--max-batch-rows", str(max(args.batch, 1)), "--max-wait-ms", str(args.max_wait_ms), *extra]
    env = dict(os.environ, JAX_DRIVE_API_KEY=api_key) if api_key else {
        k: v for k, v in os.environ.items() if k != "JAX_DRIVE_API_KEY"}
    progress = not args.no_progress
    print(f"jax-drive serve ({label}) ...", file=sys.stderr)
    with server_process(command, port, "policy", f"bench-{label}", env=env, api_key=api_key) as server:
        client = OpenAIEngine(server.base_url, "policy", api_key, tokenizer=tokenizer,
                              max_concurrency=args.batch, timeout_s=1800)
        result = time_calls(client.generate, prompts, params, args.repeats, label, progress)
        if requests:
            for name, stream in (("requests", False), ("stream", True)):
                result[name] = time_requests(server.base_url, api_key, prompts, args.max_new_tokens, args.repeats,
                                             stream, f"{label}-{name}", progress)
        counts = server_counts(server.base_url, api_key)
    result["server_counts"] = counts
    result["rows_per_engine_call"] = counts["rows"] / max(1, counts["engine_calls"])
    result["server_flags"] = extra + (["JAX_DRIVE_API_KEY=<set>"] if api_key else [])
    return result


def tiny_checkpoint(out_dir: Path) -> str:
    """A tiny random Llama + byte-level tokenizer saved as an HF directory."""
    from jax_drive.models.export import save_safetensors
    from jax_drive.models.tiny import tiny_policy

    model, _, tokenizer = tiny_policy(lora_rank=None)
    save_safetensors(model, out_dir, tokenizer=tokenizer)
    return str(out_dir)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser, json_required=True)
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="'smollm2-135m-instruct' (default), 'tiny' (random, no llama.cpp), "
                        "or an HF dir / .gguf")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-wait-ms", type=float, default=20.0,
                        help="jax-drive serve's batching wait")
    parser.add_argument("--llama-threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp peer")
    args = parser.parse_args(argv)
    require_min(1, batch=args.batch, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                llama_threads=args.llama_threads)
    require_min(0, max_wait_ms=args.max_wait_ms)
    with tempfile.TemporaryDirectory(prefix="bench_serve-") as workdir:
        return run(args, Path(workdir))


def run(args: argparse.Namespace, workdir: Path) -> int:
    from jax_drive.models import load_pretrained
    from jax_drive.sampling import JaxEngine, OpenAIEngine, SamplingParams
    from jax_drive.serve.launch import free_port, llama_cpp_command, server_process

    source = tiny_checkpoint(workdir / "tiny") if args.model == "tiny" else args.model
    try:
        model, _, tokenizer = load_pretrained(source)
    except (FileNotFoundError, ValueError) as error:
        raise InputError(f"--model: {error}") from None
    prompts = chat_prompts(tokenizer, args.batch)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens,
                            temperature=1.0)
    results: dict = {}
    meta = run_metadata(benchmark="bench_serve")  # before any timed call: the machine's load then
    progress = not args.no_progress

    print("in-process JaxEngine ...", file=sys.stderr)
    results["jax_engine"] = time_calls(JaxEngine(model, tokenizer).generate, prompts, params,
                                       args.repeats, "jax_engine", progress)
    del model

    results["serve"] = time_server(args, source, tokenizer, prompts, params, "serve", LIMITS_OFF, None)
    results["serve_limits"] = time_server(args, source, tokenizer, prompts, params, "serve_limits", [], BENCH_KEY,
                                          requests=True)
    results["serve_requests"] = results["serve_limits"].pop("requests")
    results["serve_stream"] = results["serve_limits"].pop("stream")

    gguf = None
    if not args.no_llama_cpp:
        from jax_drive.models.loading import resolve_source

        path = resolve_source(source) if args.model != "tiny" else None
        gguf = str(path) if path is not None and path.suffix == ".gguf" else None
    if gguf is not None:
        port = free_port()
        print("llama.cpp server ...", file=sys.stderr)
        with server_process(llama_cpp_command(gguf, port, args.llama_threads), port,
                            "smollm2-135m-instruct", "bench-llama-cpp") as server:
            client = OpenAIEngine(server.base_url, server.model, tokenizer=tokenizer,
                                  max_concurrency=args.batch, timeout_s=1800)
            results["llama_cpp"] = time_calls(client.generate, prompts, params, args.repeats,
                                              "llama_cpp", progress)
    else:
        results["llama_cpp"] = {"skipped": "needs a .gguf model (and not --no-llama-cpp)"}

    jax_rate = results["jax_engine"]["tokens_per_s"]
    serve_rate = results["serve"]["tokens_per_s"]
    limits_rate = results["serve_limits"]["tokens_per_s"]
    summary = {
        "serve_over_jax_engine": serve_rate / jax_rate,
        "serve_overhead": 1.0 - serve_rate / jax_rate,
        "goal_serve_overhead_at_most": 0.15,
        "serve_limits_over_jax_engine": limits_rate / jax_rate,
        "limits_overhead": 1.0 - limits_rate / serve_rate,
        "median_ttft_s": results["serve_stream"]["median_ttft_s"],
        "median_latency_s": results["serve_requests"]["median_latency_s"],
        "ttft_over_latency": results["serve_stream"]["median_ttft_s"] / results["serve_requests"]["median_latency_s"],
        "stream_over_requests": results["serve_stream"]["tokens_per_s"] / results["serve_requests"]["tokens_per_s"],
    }
    if "tokens_per_s" in results["llama_cpp"]:
        summary["serve_over_llama_cpp"] = serve_rate / results["llama_cpp"]["tokens_per_s"]
    report = {
        "meta": meta,
        "config": vars(args) | {"prompt_tokens": [len(p) for p in prompts]},
        "results": results,
        "summary": summary,
    }
    return write_results(args.json, report, summary)


if __name__ == "__main__":
    sys.exit(run_main(main))
