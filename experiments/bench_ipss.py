"""Benchmark: mtGRPO step time with and without MTDrive's IPSS / IPTC (section 3.4), as they
exist in our single-process trainer (``GRPOConfig.stream_logprobs`` / ``share_prompt_prefix``,
:mod:`jax_drive.rl.streaming`).

MTDrive (veRL, Qwen2.5-VL-7B, 32 GPUs) reports ~1250 s -> ~490 s per step (2.5x): IPSS
(serialising each finished rollout in a thread pool while the others generate) ~1.5x, IPTC
(caching deserialised shared tensors for the log-prob, reference and actor modules) ~1.7x.
Our trainer has no serialisation; what those ideas can move or share here is the pi_old and
pi_ref log-prob pass after the rollout:

- ``plain``: both log-prob passes over the padded batch after the last turn;
- ``iptc``: each group's prompt is run once per model, each row only its suffix;
- ``ipss``: rows that finished at turn j are scored by a worker thread while turn j + 1
  generates (whole rows);
- ``ipss+iptc``: both.

Every variant trains from the same initial weights with the same seeds, so the rollouts (and
the work) are the same. Scenes are straight roads, where a fixed answer (``--finish-early``
rows per group at turn 1) has no violation and ends its rollout, as a trained policy's good
answers do; IPSS has nothing to overlap when every row runs to the last turn. Each variant
first runs untimed (XLA compilation), then ``--repeats`` timed runs of ``--steps`` steps,
interleaved across variants. Also reported: the log-prob pass alone (plain vs shared prompt)
on one rollout.

  python experiments/bench_ipss.py --json OUT                                   # canonical (SmolLM2)
  python experiments/bench_ipss.py --json OUT --model tiny --max-new-tokens 16 --repeats 1   # quick check
"""

from __future__ import annotations

import argparse
import statistics
import time

from tqdm import tqdm

from jax_drive.runinfo import add_output_args, require_min, run_main, run_metadata, script_environment, write_json

script_environment()

VARIANTS = {"plain": (False, False), "iptc": (False, True), "ipss": (True, False), "ipss+iptc": (True, True)}
SPEED = 10.0


def good_answer() -> str:
    """A straight answer along the lane at the ego speed: no violation on a straight road."""
    import numpy as np

    from jax_drive.text import format_trajectory

    return format_trajectory(np.stack([SPEED * 0.5 * np.arange(1, 9), np.zeros(8), np.zeros(8)], -1))


class EarlyFinish:
    """Engine wrapper: at turn 1, rows g < ``forced`` of every group answer ``good_answer()`` (and stop,
    having no violation); every other completion is the policy's own sample."""

    supports_sessions = False

    def __init__(self, inner, tokenizer, group_size: int, forced: int):
        self.inner, self.tok, self.group, self.forced = inner, tokenizer, group_size, forced
        self.text = good_answer()
        self.answer = tuple(tokenizer.encode(self.text) + [tokenizer.eos_token_ids[0]])

    def generate(self, prompts, params, key):
        from jax_drive.sampling import Completion

        out = self.inner.generate(prompts, params, key)
        first_turn = [self.tok.decode(list(p), skip_special_tokens=False).count("<|im_start|>assistant") == 1
                      for p in prompts]
        return [Completion(tuple(p), self.answer, self.text, (0.0,) * len(self.answer), "stop")
                if first and i % self.group < self.forced else c
                for i, (p, c, first) in enumerate(zip(prompts, out, first_turn))]

    def generate_chat(self, conversations, params, key):  # pragma: no cover - protocol only
        raise NotImplementedError


def load(model_name: str, lora_rank: int):
    """(model with LoRA adapters, tokenizer)."""
    if model_name == "tiny":
        from jax_drive.models.tiny import tiny_policy

        model, _, tokenizer = tiny_policy(seed=0, lora_rank=lora_rank)
        return model, tokenizer
    from flax import nnx

    from jax_drive.models import load_pretrained
    from jax_drive.models.lora import apply_lora

    model, _, tokenizer = load_pretrained(model_name)
    apply_lora(model, rank=lora_rank, alpha=2.0 * lora_rank, rngs=nnx.Rngs(1))
    return model, tokenizer


def grpo_config(args, stream: bool, share: bool) -> GRPOConfig:
    """MTDrive's trainer defaults (recomputed pi_old, K3 KL 0.01) at a CPU size."""
    from jax_drive.pipelines.mtdrive.presets import COMPACT_CAPTION, TEXT_PROMPT
    from jax_drive.rl.advantages import AdvantageConfig
    from jax_drive.rl.grpo import GRPOConfig
    from jax_drive.rl.loss import LossConfig
    from jax_drive.rl.optim import OptimConfig
    from jax_drive.rollout import RolloutConfig
    from jax_drive.sampling import SamplingParams

    rollout = RolloutConfig(group_size=args.group, max_turns=args.turns, prompt=TEXT_PROMPT, caption=COMPACT_CAPTION,
                            sampling=SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0))
    return GRPOConfig(rollout=rollout, advantage=AdvantageConfig(mode="mtgrpo_cross"), loss=LossConfig(kl_coef=0.01),
                      optim=OptimConfig(learning_rate=1e-5), prompts_per_step=args.scenes,
                      minibatch_size=args.scenes * args.group, ppo_epochs=1, steps=args.steps,
                      bucket_size=args.bucket, recompute_old_logprobs=True, checkpoint_every=None,
                      stream_logprobs=stream, share_prompt_prefix=share, seed=args.seed)


def run_variant(model, tokenizer, start, scenes, references, args, name: str) -> list[dict]:
    """One training run of ``args.steps`` steps from the initial weights; per-step timings."""
    from jax_drive.rl.grpo import grpo_train
    from jax_drive.rl.optim import copy_tree, write_back
    from jax_drive.sampling import JaxEngine

    write_back(model, copy_tree(start))
    stream, share = VARIANTS[name]
    engine = EarlyFinish(JaxEngine(model, tokenizer), tokenizer, args.group, args.finish_early)
    result = grpo_train(model, tokenizer, scenes, grpo_config(args, stream, share), engine=engine,
                        references=references, progress=False)
    return [{"step_seconds": r["rollout_seconds"] + r["update_seconds"], "rollout_seconds": r["rollout_seconds"],
             "update_seconds": r["update_seconds"], "turns_mean": r["turns_mean"],
             "generated_tokens": r["generated_tokens"], "padded_length": r["padded_length"],
             "loss": r["loss"], "logprob_seconds": r.get("logprob_seconds"),
             "logprob_wait_seconds": r.get("logprob_wait_seconds")} for r in result.history]


def logprob_pass(model, tokenizer, start, scenes, references, args) -> dict:
    """The pi_old + pi_ref log-prob pass alone on one rollout: plain batch vs shared prompts."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jax_drive.rl.grpo import _compiled, batch_logprobs, build_train_batch
    from jax_drive.rl.optim import copy_tree, split_model, write_back
    from jax_drive.rl.streaming import RowLogprobs, StreamConfig
    from jax_drive.rollout import run_rollouts
    from jax_drive.sampling import JaxEngine

    write_back(model, copy_tree(start))
    cfg = grpo_config(args, False, False)
    engine = EarlyFinish(JaxEngine(model, tokenizer), tokenizer, args.group, args.finish_early)
    result = run_rollouts(engine, tokenizer, scenes, jax.random.key(args.seed), cfg.rollout, reference=references)
    graphdef, params, rest = split_model(model, "lora")
    ref = copy_tree(params)
    _, logp_fn = _compiled(graphdef, cfg.loss, cfg.chunk_size, cfg.optim, cfg.logprob_temperature)
    batch = build_train_batch(result, np.zeros(result.pdms.shape, np.float32), 0, cfg.bucket_size)
    arrays = {k: jnp.asarray(v) for k, v in batch.items()}
    rows = batch["input_ids"].shape[0]

    def plain():
        for p in (params, ref):
            jax.block_until_ready(batch_logprobs(logp_fn, p, rest, arrays, rows))

    def shared():
        scorer = RowLogprobs(graphdef, rest, {"old": params, "ref": ref},
                             StreamConfig(background=False, share_prefix=True, group_size=args.group,
                                          bucket_size=cfg.bucket_size, chunk_size=cfg.chunk_size), logp_fn)
        scorer.submit(range(len(result.rows)), result.rows)
        scorer.results()

    out = {"rows": rows, "padded_length": int(batch["input_ids"].shape[1]),
           "real_tokens": int(batch["attention_mask"].sum()),
           "prompt_tokens": int(sum(int((t.turn_ids >= 0).argmax()) for t in result.rows))}
    for label, fn in (("plain", plain), ("shared_prompt", shared)):
        fn()  # compile
        times = []
        for _ in range(max(1, args.repeats)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[f"{label}_seconds"] = statistics.median(times)
    out["speedup"] = out["plain_seconds"] / out["shared_prompt_seconds"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="'smollm2-135m-instruct' or 'tiny'")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--scenes", type=int, default=1, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="G rollouts per prompt")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--finish-early", type=int, default=4, help="rows per group that end at turn 1")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per variant")
    parser.add_argument("--bucket", type=int, default=64, help="padded lengths are multiples of this")
    parser.add_argument("--seed", type=int, default=0)
    add_output_args(parser, json_required=True)
    args = parser.parse_args(argv)
    require_min(1, lora_rank=args.lora_rank, scenes=args.scenes, group=args.group, turns=args.turns,
                max_new_tokens=args.max_new_tokens, steps=args.steps, repeats=args.repeats, bucket=args.bucket)
    require_min(0, finish_early=args.finish_early)
    if args.finish_early > args.group:
        parser.error("--finish-early must lie in [0, --group]")

    import numpy as np  # heavy imports only after the arguments are checked

    from jax_drive.rl.optim import copy_tree, split_model
    from jax_drive.scenes import stack_scenes, straight_road_scene

    meta = run_metadata(benchmark="bench_ipss")  # before any timed call
    model, tokenizer = load(args.model, args.lora_rank)
    _, start, _ = split_model(model, "lora")
    start = copy_tree(start)
    scenes = stack_scenes([straight_road_scene(scene_id=i, ego_speed=SPEED) for i in range(args.scenes)])
    t = 0.1 * np.arange(1, 41)
    references = np.broadcast_to(np.stack([SPEED * t, np.zeros(40), np.zeros(40)], -1),
                                 (args.scenes, 40, 3)).astype(np.float32)

    runs = {name: [] for name in VARIANTS}
    warmup = {}
    total = len(VARIANTS) * (1 + args.repeats)
    with tqdm(total=total, desc="bench_ipss", disable=args.no_progress) as bar:
        for name in VARIANTS:  # untimed: compilation
            t0 = time.perf_counter()
            run_variant(model, tokenizer, start, scenes, references, args, name)
            warmup[name] = time.perf_counter() - t0
            bar.update(1)
        for _ in range(args.repeats):
            for name in VARIANTS:
                runs[name].extend(run_variant(model, tokenizer, start, scenes, references, args, name))
                bar.update(1)
    summary = {}
    for name, steps in runs.items():
        summary[name] = {k: statistics.mean(s[k] for s in steps)
                         for k in ("step_seconds", "rollout_seconds", "update_seconds")}
        if steps[0]["logprob_seconds"] is not None:  # streamed / shared: scoring vs waiting
            for k in ("logprob_seconds", "logprob_wait_seconds"):
                summary[name][k] = statistics.mean(s[k] for s in steps)
        summary[name]["steps_timed"] = len(steps)
    base = summary["plain"]["step_seconds"]
    ratios = {name: base / s["step_seconds"] for name, s in summary.items()}
    payload = {
        "benchmark": "ipss_iptc_step_time",
        "settings": {**vars(args), "variants": {k: dict(zip(("stream_logprobs", "share_prompt_prefix"), v))
                                                for k, v in VARIANTS.items()}},
        "summary": summary,
        "step_time_ratio_vs_plain": ratios,
        "same_work": {name: [(s["turns_mean"], s["generated_tokens"]) for s in steps] for name, steps in runs.items()},
        "logprob_pass": logprob_pass(model, tokenizer, start, scenes, references, args),
        "warmup_seconds": warmup,
        "runs": runs,
        "meta": meta,
    }
    print(f"step time (s): " + ", ".join(f"{k} {v['step_seconds']:.2f}" for k, v in summary.items()))
    print(f"ratio plain / variant: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    lp = payload["logprob_pass"]
    print(f"log-prob pass alone: plain {lp['plain_seconds']:.2f} s, shared prompt {lp['shared_prompt_seconds']:.2f} s "
          f"({lp['speedup']:.2f}x; {lp['prompt_tokens']} of {lp['real_tokens']} row tokens are prompt)")
    write_json(args.json, payload)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
