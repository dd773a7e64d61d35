"""Benchmark: our Flax SmolLM2-135M-Instruct vs transformers (torch, CPU) on the same GGUF.

Measures, in one run and on the same prompts:
  * load time of the GGUF (ours: gguf dequantise + stack; transformers: its GGUF loader),
  * prefill forward time (B x L tokens, logits) after compilation, median of repeats,
    float32 and bfloat16 for ours, float32 for torch, and the max |logit difference|,
  * `token_logprobs` (chunked, never a float32 (B, L, V) tensor) vs full-logits log-softmax:
    time and the size of the largest float32 logits block each needs.

Usage:
  python experiments/bench_models.py --json OUT [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from bench_sampler import time_call  # sibling script (experiments/ is on sys.path when run)
from tqdm import tqdm

from jax_drive.runinfo import add_output_args, require_min, run_main, run_metadata, script_environment, write_results

script_environment()


def _median_time(fn, repeats):
    fn()  # warm-up / compile
    return time_call(fn, repeats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="B=2, L=64, 2 repeats, chunk 32")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk", type=int, default=256)
    add_output_args(parser, json_required=True)
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.length, args.repeats, args.chunk = 2, 64, 2, 32
    require_min(1, batch=args.batch, length=args.length, repeats=args.repeats, chunk=args.chunk)
    import jax
    import jax.numpy as jnp

    from jax_drive.models import load_pretrained, positions_from_mask
    from jax_drive.models.loading import smollm2_gguf_path
    from jax_drive.models.transformer import forward_logits, forward_token_logprobs

    b, l = args.batch, args.length
    steps = tqdm(total=7, desc="bench_models", disable=args.no_progress)
    result: dict = {"meta": run_metadata(benchmark="bench_models"),
                    "batch": b, "length": l, "repeats": args.repeats}

    start = time.perf_counter()
    model, config, tokenizer = load_pretrained("smollm2-135m-instruct")
    result["ours_load_s"] = time.perf_counter() - start
    steps.update()

    import torch
    import transformers

    result["meta"].update(torch_version=torch.__version__, transformers_version=transformers.__version__)
    path = smollm2_gguf_path()
    start = time.perf_counter()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    result["torch_load_s"] = time.perf_counter() - start
    steps.update()

    rng = np.random.default_rng(0)
    ids = rng.integers(3, config.vocab_size, size=(b, l)).astype(np.int32)
    mask = np.ones((b, l), bool)
    jids, jmask = jnp.asarray(ids), jnp.asarray(mask)
    pos = positions_from_mask(jmask)
    params = model.arrays()

    def ours_fwd(p=params, c=config):
        return forward_logits(p, c, jids, pos, jmask, None, jnp.int32(0))[0].block_until_ready()

    result["ours_prefill_f32_s"] = _median_time(ours_fwd, args.repeats)
    steps.update()
    bf_config = config.replace(dtype="bfloat16")
    bf_params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    result["ours_prefill_bf16_s"] = _median_time(lambda: ours_fwd(bf_params, bf_config),
                                                 args.repeats)
    steps.update()

    tids = torch.tensor(ids, dtype=torch.long)

    def torch_fwd():
        with torch.no_grad():
            return hf(tids).logits

    result["torch_prefill_f32_s"] = _median_time(torch_fwd, args.repeats)
    result["max_abs_logit_diff_f32"] = float(np.abs(np.asarray(ours_fwd()) - torch_fwd().numpy()).max())
    result["max_abs_logit_diff_bf16_vs_torch_f32"] = float(
        np.abs(np.asarray(ours_fwd(bf_params, bf_config)) - torch_fwd().numpy()).max())
    steps.update()

    targets = jnp.roll(jids, -1, axis=1)
    chunked = jax.jit(lambda p: forward_token_logprobs(p, config, jids, pos, jmask, targets,
                                                       args.chunk))
    full = jax.jit(lambda p: jnp.take_along_axis(
        jax.nn.log_softmax(forward_logits(p, config, jids, pos, jmask, None, jnp.int32(0))[0]),
        targets[..., None], -1)[..., 0])
    result["token_logprobs_chunked_s"] = _median_time(
        lambda: chunked(params).block_until_ready(), args.repeats)
    steps.update()
    result["token_logprobs_full_s"] = _median_time(
        lambda: full(params).block_until_ready(), args.repeats)
    result["token_logprobs_max_diff"] = float(jnp.abs(chunked(params) - full(params)).max())
    result["largest_logits_block_mb_chunked"] = min(args.chunk, b * l) * config.vocab_size * 4 / 2**20
    result["largest_logits_block_mb_full"] = b * l * config.vocab_size * 4 / 2**20
    steps.update()
    steps.close()
    for key in ("ours_prefill_f32_s", "ours_prefill_bf16_s", "torch_prefill_f32_s"):
        result[key.replace("_s", "_tokens_per_s")] = b * l / result[key]
    return write_results(args.json, result, {k: v for k, v in result.items() if k != "meta"})


if __name__ == "__main__":
    sys.exit(run_main(main))
