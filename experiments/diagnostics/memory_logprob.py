"""Memory of one mtGRPO update with and without a chunked token log-prob.

Compiles (never runs) one jitted mtGRPO optimiser step (clipped policy loss + 0.01 K3 KL,
global-norm clip, AdamW; the trainer's ``make_train_step``) at B x L tokens and reads XLA's
``compiled.memory_analysis()``: temp bytes (the peak of the step's intermediates: activations
kept for the backward pass, gradients, logits) and argument bytes. Three ways to get the
(B, L) log-probs:

* ``full``: ``model(ids)`` logits (B, L, V) float32 -> log_softmax -> gather;
* ``trainer``: ``CausalLM.token_logprobs``, the trainer's path (``head_token_logprobs``:
  ``kernels.token_logprobs`` on the hidden states, chunk_size tokens x a vocabulary chunk per
  logits block, online logsumexp, custom VJP).

Models, random weights (only shapes matter; nothing is allocated): SmolLM2-135M (V 49,152,
D 576, 30 layers) and Qwen2.5-3B's vocabulary and width (V 151,936, D 2048, tied head) with
``--qwen-layers`` decoder layers (the head's share does not depend on the depth), each with
full fine-tuning and with LoRA (rank 8; the head then gets no gradient). The figures are
XLA:CPU's buffer assignment (the backend this runs on); an accelerator's compiler assigns
its own, so compare the variants with each other. Also writes the analytic size of the
float32 (B, L, V) logits tensor.

The ``head`` section isolates the log-prob: the value and gradient of a weighted sum of
the (B, L) log-probs from given hidden states (B, L, D) and a float32 tied head (V, D), with
respect to both (full fine-tuning) or the hidden states only (LoRA), no decoder layers.

Usage:
  python experiments/diagnostics/memory_logprob.py --json OUT [--batch 2 --length 1024 --qwen-layers 2]
      [--sections update,head]
  python experiments/diagnostics/memory_logprob.py --quick --json OUT   # tiny sizes, to check that it runs
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

from tqdm import tqdm

from jax_drive.runinfo import (InputError, add_output_args, require_min, run_main, run_metadata,
                               script_environment, write_json)

script_environment()

VARIANTS = ("full", "trainer")
LORA_RANK = 8


def model_configs(qwen_layers: int, quick: bool) -> dict:
    """SmolLM2-135M (ModelConfig's defaults) and Qwen2.5-3B's shapes with fewer layers."""
    from jax_drive.models import ModelConfig

    smollm2 = ModelConfig()
    qwen = ModelConfig(architecture="qwen2", vocab_size=151936, hidden_size=2048,
                       intermediate_size=11008, num_layers=qwen_layers, num_heads=16,
                       num_kv_heads=2, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6,
                       tie_embeddings=True, attention_bias=True, max_position_embeddings=32768)
    if quick:
        smollm2 = smollm2.replace(num_layers=2)
        qwen = qwen.replace(num_layers=1, vocab_size=15193)
    return {"smollm2-135m": smollm2, f"qwen2.5-3b-vocab-{qwen.num_layers}-layers": qwen}


def logprob_fn(variant: str, chunk_size: int):
    """(model, batch) -> (B, L) log-probs of batch['targets'] by one of the VARIANTS."""
    import jax
    import jax.numpy as jnp

    def fn(model, batch):
        ids, pos, mask, targets = (batch[k] for k in ("input_ids", "positions", "attention_mask", "targets"))
        if variant == "full":
            logits, _ = model(ids, pos, mask)
            return jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
        return model.token_logprobs(ids, pos, mask, targets, chunk_size=chunk_size)
    return fn


def abstract_batch(b: int, l: int) -> dict:
    import jax
    import jax.numpy as jnp

    ints = jax.ShapeDtypeStruct((b, l), jnp.int32)
    floats = jax.ShapeDtypeStruct((b, l), jnp.float32)
    return {"input_ids": ints, "targets": ints, "positions": ints,
            "attention_mask": jax.ShapeDtypeStruct((b, l), jnp.bool_), "loss_mask": floats,
            "old_logp": floats, "ref_logp": floats, "advantages": floats}


def step_memory(config, trainable: str, variant: str, b: int, l: int, chunk_size: int) -> dict:
    """memory_analysis() of one compiled update; weights and optimiser state are abstract."""
    import jax
    from flax import nnx

    from jax_drive.models import CausalLM
    from jax_drive.models.lora import apply_lora
    from jax_drive.rl.loss import LossConfig, policy_loss
    from jax_drive.rl.optim import OptimConfig, make_optimizer, make_train_step, split_model

    def build():
        model = CausalLM(config, rngs=nnx.Rngs(0))
        if trainable == "lora":
            apply_lora(model, rank=LORA_RANK, alpha=2.0 * LORA_RANK, rngs=nnx.Rngs(1))
        return model

    model = nnx.eval_shape(build)
    graphdef, params, rest = split_model(model, trainable)
    tx = make_optimizer(OptimConfig(learning_rate=1e-6, trainable=trainable))
    opt_state = jax.eval_shape(tx.init, params)
    logp = logprob_fn(variant, chunk_size)
    loss_config = LossConfig(kl_coef=0.01)

    def loss_fn(m, batch):
        return policy_loss(logp(m, batch), batch["old_logp"], batch["advantages"], batch["loss_mask"],
                           ref_logp=batch["ref_logp"], config=loss_config)

    step = make_train_step(graphdef, loss_fn, tx)
    start = time.perf_counter()
    compiled = step.lower(params, rest, opt_state, abstract_batch(b, l)).compile()
    analysis = compiled.memory_analysis()
    return {"temp_bytes": int(analysis.temp_size_in_bytes),
            "argument_bytes": int(analysis.argument_size_in_bytes),
            "output_bytes": int(analysis.output_size_in_bytes),
            "alias_bytes": int(analysis.alias_size_in_bytes),
            "compile_s": round(time.perf_counter() - start, 2)}


def head_memory(config, trainable: str, variant: str, b: int, l: int, chunk_size: int) -> dict:
    """memory_analysis() of d/d(hidden[, head]) sum(w * logp) for one way to get logp."""
    import jax
    import jax.numpy as jnp

    from jax_drive.models import head_token_logprobs

    d, v = config.hidden_size, config.vocab_size
    hidden = jax.ShapeDtypeStruct((b, l, d), jnp.float32)
    head = jax.ShapeDtypeStruct((v, d), jnp.float32)  # a tied embedding, as stored
    targets = jax.ShapeDtypeStruct((b, l), jnp.int32)
    weights = jax.ShapeDtypeStruct((b, l), jnp.float32)

    def objective(h, w, t, weight):
        if variant == "full":
            logits = jnp.einsum("bld,vd->blv", h, w)
            logp = jnp.take_along_axis(jax.nn.log_softmax(logits), t[..., None], -1)[..., 0]
        else:
            logp = head_token_logprobs({"embed": w, "lm_head": None}, h, t, chunk_size)
        return jnp.sum(weight * logp)

    argnums = (0, 1) if trainable == "full" else 0
    start = time.perf_counter()
    compiled = jax.jit(jax.value_and_grad(objective, argnums=argnums)).lower(
        hidden, head, targets, weights).compile()
    analysis = compiled.memory_analysis()
    return {"temp_bytes": int(analysis.temp_size_in_bytes),
            "argument_bytes": int(analysis.argument_size_in_bytes),
            "output_bytes": int(analysis.output_size_in_bytes),
            "compile_s": round(time.perf_counter() - start, 2)}


SECTIONS = {"update": step_memory, "head": head_memory}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser, json_required=True)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--qwen-layers", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=256, help="tokens per logits block of the trainer path")
    parser.add_argument("--trainable", choices=("full", "lora", "both"), default="both")
    parser.add_argument("--sections", default="update,head",
                        help=f"comma-separated subset of {tuple(SECTIONS)}")
    parser.add_argument("--quick", action="store_true", help="B=1, L=64, 1-2 layers, 1/10 Qwen vocab")
    args = parser.parse_args(argv)
    sections = [x for x in args.sections.split(",") if x]
    if not sections or any(x not in SECTIONS for x in sections):
        raise InputError(f"--sections must name some of {tuple(SECTIONS)}, got {args.sections!r}")
    require_min(1, batch=args.batch, length=args.length, qwen_layers=args.qwen_layers, chunk_size=args.chunk_size)
    b, l = (1, 64) if args.quick else (args.batch, args.length)
    from kernels import LogprobConfig

    vocab_chunk = LogprobConfig().vocab_chunk
    trainables = ("full", "lora") if args.trainable == "both" else (args.trainable,)
    configs = model_configs(args.qwen_layers, args.quick)
    result: dict = {
        "meta": run_metadata(benchmark="memory_logprob"),
        "batch": b, "length": l, "trainer_token_chunk": args.chunk_size,
        "trainer_vocab_chunk": vocab_chunk, "lora_rank": LORA_RANK,
        "models": {},
    }
    jobs = [(section, name, trainable, variant) for section in sections for name in configs
            for trainable in trainables for variant in VARIANTS]
    for section, name, trainable, variant in tqdm(jobs, desc="memory_logprob", disable=args.no_progress):
        config = configs[name]
        entry = result["models"].setdefault(name, {
            "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
            "num_layers": config.num_layers, "dtype": config.dtype,
            "full_logits_float32_bytes": 4 * b * l * config.vocab_size,
            "trainer_block_float32_bytes": 4 * min(args.chunk_size, b * l)
            * min(vocab_chunk, config.vocab_size),
        })
        entry.setdefault(section, {}).setdefault(trainable, {})[variant] = SECTIONS[section](
            config, trainable, variant, b, l, args.chunk_size)
    for entry in result["models"].values():
        for section, trainable in itertools.product(sections, trainables):
            mem = entry[section][trainable]
            full = mem["full"]["temp_bytes"]
            mem["temp_saved_bytes"] = {v: full - mem[v]["temp_bytes"] for v in VARIANTS[1:]}
            mem["temp_ratio_to_full"] = {v: round(mem[v]["temp_bytes"] / full, 4) for v in VARIANTS[1:]}
    write_json(args.json, result)
    print(json.dumps({k: v for k, v in result.items() if k != "meta"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
