"""Benchmark: one mtGRPO update, our JAX trainer vs transformers + torch (CPU), SmolLM2-135M.

Both sides run the same update on the same fixed batch (B rows x L tokens, the last 3/4 of
each row "generated" and carrying loss, a random per-row advantage), full fine-tuning:

  1. log-probs of the batch under the current policy (pi_old, no gradient);
  2. log-probs under the frozen reference (a copy of the initial weights, no gradient);
  3. clipped policy loss + 0.01 * K3 KL (seq-mean-token-mean), gradient;
  4. global-norm clip 1.0 and an AdamW step (lr 1e-6).

Ours: ``jax_drive.rl.grpo`` (jitted step, vocab-chunked ``token_logprobs``). Torch:
``LlamaForCausalLM`` loaded from our own safetensors export of the same weights, full logits
+ log_softmax, ``torch.optim.AdamW``. The first update of each side is a warm-up (compile);
the reported time is the median of the next ``--repeats`` updates. Also checks that both
sides' first-pass log-probs agree.

Writes JSON with jax_tokens_per_s, torch_tokens_per_s, speedup, peak_rss_gb.

Usage:
  python experiments/bench_train.py [--quick] [--batch 4 --length 256] --json OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from jax_drive.runinfo import (InputError, add_output_args, require_min, run_main, run_metadata,
                               script_environment, write_results)

script_environment()


def fixed_batch(b: int, l: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(b, l + 1)).astype(np.int32)
    gen_start = l // 4
    mask = np.zeros((b, l), np.float32)
    mask[:, gen_start:] = 1.0
    return {
        "input_ids": ids[:, :-1],
        "targets": ids[:, 1:],
        "positions": np.tile(np.arange(l, dtype=np.int32), (b, 1)),
        "attention_mask": np.ones((b, l), bool),
        "loss_mask": mask,
        "advantages": np.repeat(rng.normal(size=(b, 1)).astype(np.float32), l, axis=1),
    }


def _median(fn, repeats, bar):
    fn()  # warm-up / compile
    bar.update(1)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        bar.update(1)
    return statistics.median(times), times


def run_jax(model, batch, repeats, bar, chunk):
    import jax
    import jax.numpy as jnp

    from jax_drive.rl.grpo import GRPOConfig, _compiled
    from jax_drive.rl.loss import LossConfig
    from jax_drive.rl.optim import OptimConfig, copy_tree, make_optimizer, split_model

    cfg = GRPOConfig(loss=LossConfig(kl_coef=0.01), optim=OptimConfig(learning_rate=1e-6, trainable="full"),
                     chunk_size=chunk)
    graphdef, params, rest = split_model(model, "full")
    ref = copy_tree(params)
    tx = make_optimizer(cfg.optim)
    state = {"params": params, "opt": tx.init(params)}
    step_fn, logp_fn = _compiled(graphdef, cfg.loss, cfg.chunk_size, cfg.optim, cfg.logprob_temperature)
    data = {k: jnp.asarray(v) for k, v in batch.items()}
    model_keys = ("input_ids", "targets", "positions", "attention_mask")
    first = {}

    def update():
        sub = {k: data[k] for k in model_keys}
        old = logp_fn(state["params"], rest, sub)
        ref_logp = logp_fn(ref, rest, sub)
        full = dict(data, old_logp=old, ref_logp=ref_logp)
        p, o, loss, metrics = step_fn(state["params"], rest, state["opt"], full)
        jax.block_until_ready((p, o, loss))
        state["params"], state["opt"] = p, o
        first.setdefault("old", np.asarray(old))
        first.setdefault("loss", float(loss))

    median, times = _median(update, repeats, bar)
    return median, times, first


def run_torch(hf_dir, batch, repeats, bar, threads):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    policy = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    reference.eval()
    policy.train()
    for p in reference.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-6, weight_decay=0.01)
    ids = torch.from_numpy(batch["input_ids"].astype(np.int64))
    targets = torch.from_numpy(batch["targets"].astype(np.int64))
    attn = torch.from_numpy(batch["attention_mask"].astype(np.int64))
    mask = torch.from_numpy(batch["loss_mask"])
    adv = torch.from_numpy(batch["advantages"])
    first = {}

    def logp(model):
        logits = model(input_ids=ids, attention_mask=attn).logits.float()
        return torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]

    def update():
        with torch.no_grad():
            old = logp(policy)
            ref = logp(reference)
        new = logp(policy)
        ratio = torch.exp(torch.clamp(new - old, -20, 20))
        pg = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2))
        d = torch.clamp(ref - new, -20, 20)
        kl = torch.clamp(torch.exp(d) - d - 1, -10, 10)
        per_tok = pg + 0.01 * kl
        loss = ((per_tok * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        first.setdefault("old", old.numpy().copy())
        first.setdefault("loss", float(loss.detach()))

    median, times = _median(update, repeats, bar)
    return median, times, first


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--quick", action="store_true", help="B=2, L=128, 2 repeats")
    parser.add_argument("--no-torch", action="store_true", help="skip the transformers + torch peer")
    parser.add_argument("--remat-layers", action="store_true",
                        help="recompute decoder blocks in the backward pass (ModelConfig.remat_layers)")
    add_output_args(parser, json_required=True)
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.length, args.repeats = 2, 128, 2
    require_min(1, batch=args.batch, length=args.length, repeats=args.repeats, chunk=args.chunk,
                threads=args.threads)

    from jax_drive.models import load_pretrained
    from jax_drive.models.export import save_safetensors
    from jax_drive.rl.logging import peak_rss_gb

    bar = tqdm(total=2 * (args.repeats + 1) + 1, desc="bench_train", disable=args.no_progress)
    t0 = time.perf_counter()
    try:
        model, config, _ = load_pretrained(args.model, dtype="float32")
    except (FileNotFoundError, ValueError) as error:
        raise InputError(f"--model: {error}") from None
    if args.remat_layers:
        model.config = dataclasses.replace(config, remat_layers=True)
    load_s = time.perf_counter() - t0
    bar.update(1)
    batch = fixed_batch(args.batch, args.length, config.vocab_size)
    tokens = int(batch["attention_mask"].sum())
    result = {
        "meta": run_metadata(benchmark="bench_train", host=platform.node()),
        "model": args.model, "batch": args.batch, "length": args.length, "tokens_per_update": tokens,
        "repeats": args.repeats, "update": "old logp + ref logp + clipped loss/K3 KL + grad + clip + AdamW, full fine-tuning",
        "load_seconds": load_s, "remat_layers": args.remat_layers,
    }
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(tmp) / "hf"
        if not args.no_torch:
            save_safetensors(model, hf_dir)  # the same weights for torch, exported before any update
        j_med, j_times, j_first = run_jax(model, batch, args.repeats, bar, args.chunk)
        result.update(jax_seconds_per_update=j_med, jax_times=j_times, jax_tokens_per_s=tokens / j_med,
                      jax_first_loss=j_first["loss"])
        if not args.no_torch:
            t_med, t_times, t_first = run_torch(str(hf_dir), batch, args.repeats, bar, args.threads)
            m = batch["loss_mask"] > 0
            result.update(torch_seconds_per_update=t_med, torch_times=t_times, torch_tokens_per_s=tokens / t_med,
                          torch_first_loss=t_first["loss"], speedup=t_med / j_med,
                          max_abs_logp_diff=float(np.abs(j_first["old"][m] - t_first["old"][m]).max()),
                          torch_threads=args.threads)
        else:
            result.update(torch_tokens_per_s=None, speedup=None)
    bar.close()
    result["peak_rss_gb"] = peak_rss_gb()
    return write_results(args.json, result,
                         {k: result[k] for k in ("jax_tokens_per_s", "torch_tokens_per_s", "speedup", "peak_rss_gb")})


if __name__ == "__main__":
    sys.exit(run_main(main))
