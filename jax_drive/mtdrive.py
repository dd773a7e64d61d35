"""MTDrive end to end: SFT warm start -> RL data curation -> mtGRPO -> multi-turn evaluation.

This is jax-drive's main job. ``run_mtdrive(preset)`` ties together the scene generator,
the dataset builders, the Flax policy, the jitted sampler, the batched PDM scorer and the
(mt)GRPO trainer, and returns a results dict (also written as JSON with plots by the
experiment script and the ``jax-drive train`` command).

Stages (MTDrive sections 3.2-3.3):
  0. generate training scenes and held-out evaluation scene sets (one per evaluation seed);
  1. evaluate the untrained policy (greedy, multi-turn, up to ``max_turns``);
  2. SFT on single-turn + 2-turn (constant-velocity first turn + PDM feedback) + mock
     multi-turn + PDM-understanding QA data, target always the expert trajectory;
  3. evaluate after SFT;
  4. RL prompt curation with the SFT policy's first turn (categories 1-3);
  5. mtGRPO (or another advantage variant) on the curated scenes;
  6. evaluate after RL.
Every evaluation uses the same held-out scenes, greedy decoding and the same PDM-Closed
references, so the three rows of the results table are comparable.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jax_drive.data.builders import BuildConfig, ConstantVelocityPredictor, build_multi, build_qa, build_rl, build_single
from jax_drive.rl.advantages import AdvantageConfig
from jax_drive.rl.checkpoint import Checkpointer, RunState
from jax_drive.rl.grpo import GRPOConfig, evaluate_multiturn, grpo_train, select_scenes
from jax_drive.rl.loss import LossConfig
from jax_drive.rl.optim import OptimConfig, make_optimizer, split_model, write_back
from jax_drive.rl.batching import as_conversations, tokenize_chat
from jax_drive.rl.sft import SFTConfig, sft_train
from jax_drive.rollout import RolloutConfig, summarize
from jax_drive.rollout.multiturn import compute_reference
from jax_drive.sampling import JaxEngine, SamplingParams
from jax_drive.sampling.sampler import SamplerConfig
from jax_drive.scenes import GeneratorConfig, generate_scenes
from jax_drive.text.caption import CaptionConfig
from jax_drive.text.prompts import PromptConfig
from jax_drive.types import Scene

TEXT_PROMPT = PromptConfig(perception="text", image_placeholder=False)
# Byte-level smoke-test models need short prompts: no scene description.
NO_PERCEPTION = PromptConfig(perception="none", image_placeholder=False)
EVAL_SEED_OFFSET = 10_000  # held-out scenes use keys disjoint from the training keys
STAGES = ("untrained", "sft", "rl")
# Compact caption for the CPU demo: 3 nearest objects within 40 m, 2 route stations (0, 30 m).
# The planning prompt is then ~550 SmolLM2 tokens instead of ~800 (default caption).
COMPACT_CAPTION = CaptionConfig(max_agents=3, radius=40.0, num_stations=2, station_spacing=30.0)


@dataclasses.dataclass(frozen=True)
class Preset:
    """One experiment setting. Defaults of ``paper`` follow MTDrive section 4.

    model: ``load_pretrained`` source ('smollm2-135m-instruct', a safetensors dir, a GGUF
      file) or 'tiny' (random tiny model + byte tokenizer, for smoke tests).
    lora_rank, lora_alpha: LoRA adapters (rank 0 = full fine-tuning).
    train_scenes: generated training scenes (SFT data and RL prompts are drawn from them).
    eval_scenes, eval_seeds: held-out scenes per evaluation seed.
    sft_single / sft_multi / sft_qa_scenes: scenes used per SFT data kind.
    sft: SFT trainer settings. rl: mtGRPO trainer settings.
    max_new_tokens: generation budget per turn (an 8-point answer is about 90 tokens).
    eval_turns: turn budget at evaluation.
    prompt: planning prompt (default: text-only, the scene captioned in item 1).
    caption: scene caption options (SFT data, RL rollouts and evaluation share them).
    seed: training scenes, LoRA init, SFT data order and RL sampling (see :func:`with_seed`).
    prompt_bucket: the sampler pads prompts to a multiple of this (fewer wasted prefill
      tokens than powers of two; each new length compiles once).
    eval_batch: scenes per evaluation rollout call (and the engine's max batch).
    untrained_eval_scenes: the untrained policy is evaluated on the first k scenes of each
      held-out set (None = all); it answers out of format, so every answer runs to
      ``max_new_tokens`` and this stage is the most expensive one per scene.
    curation_scenes: RL curation runs the SFT policy on the first k training scenes (None = all).
    sft_max_tokens: SFT samples longer than this are left out (None = keep all, truncated at
      ``sft.max_length``); bounds the memory of the (B, H, L, L) attention saved for backward.
    max_context_tokens: RL and evaluation rollouts stop before a turn whose context would
      exceed this (``RolloutConfig.max_context_tokens``).
    remat_layers: recompute decoder blocks in the backward pass (``ModelConfig.remat_layers``);
      on by default: SmolLM2 full fine-tuning at B=2, L=1024 peaked at 4.9 GB instead of
      12.1 GB and ran faster, not slower, on this CPU (``experiments/bench_train.py``).
    """

    name: str
    model: str = "smollm2-135m-instruct"
    lora_rank: int = 16
    lora_alpha: float = 32.0
    train_scenes: int = 256
    eval_scenes: int = 32
    eval_seeds: tuple[int, ...] = (0, 1, 2)
    sft_single: int = 128
    sft_multi: int = 128
    sft_qa_scenes: int = 16
    sft: SFTConfig = SFTConfig()
    rl: GRPOConfig = GRPOConfig()
    max_new_tokens: int = 112
    eval_turns: int = 3
    hard_fraction: float = 0.3
    prompt: PromptConfig = TEXT_PROMPT
    caption: CaptionConfig = CaptionConfig()
    seed: int = 0
    prompt_bucket: int = 128
    eval_batch: int = 16
    untrained_eval_scenes: int | None = None
    curation_scenes: int | None = None
    sft_max_tokens: int | None = None
    max_context_tokens: int = 11_500
    remat_layers: bool = True


def with_seed(preset: Preset, seed: int) -> Preset:
    """The preset with every training seed (scenes, LoRA init, SFT order, RL) set to ``seed``;
    the held-out evaluation scenes do not depend on it."""
    return dataclasses.replace(preset, seed=seed, sft=dataclasses.replace(preset.sft, seed=seed),
                               rl=dataclasses.replace(preset.rl, seed=seed))


def _rollout(group: int, turns: int, max_new_tokens: int, temperature: float,
             prompt: PromptConfig = TEXT_PROMPT, caption: CaptionConfig = CaptionConfig()) -> RolloutConfig:
    # Below T = 1 the trainer scores at T (GRPOConfig.logprob_temperature), so the sampler
    # reports the log-probs of the distribution it drew from.
    mode = "raw" if temperature in (0.0, 1.0) else "processed"
    return RolloutConfig(
        group_size=group,
        max_turns=turns,
        sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, logprobs_mode=mode),
        prompt=prompt,
        caption=caption,
    )


def _presets() -> dict[str, Preset]:
    cpu_rl = GRPOConfig(
        rollout=_rollout(group=4, turns=3, max_new_tokens=112, temperature=1.0),
        advantage=AdvantageConfig(mode="mtgrpo_cross"),
        loss=LossConfig(kl_coef=0.01),
        optim=OptimConfig(learning_rate=2e-5),
        prompts_per_step=4,
        minibatch_size=16,
        ppo_epochs=1,
        steps=8,
        bucket_size=64,
        checkpoint_every=None,
    )
    return {
        "smoke": Preset(
            name="smoke", model="tiny", lora_rank=4, lora_alpha=8.0, train_scenes=16, eval_scenes=4,
            eval_seeds=(0,), sft_single=8, sft_multi=8, sft_qa_scenes=2,
            sft=SFTConfig(optim=OptimConfig(learning_rate=1e-3), batch_size=4, max_steps=2, bucket_size=64,
                          max_length=2048),
            rl=dataclasses.replace(cpu_rl, rollout=_rollout(2, 2, 24, 1.0, NO_PERCEPTION), prompts_per_step=2,
                                   minibatch_size=4, steps=1),
            max_new_tokens=24, eval_turns=2, prompt=NO_PERCEPTION,
        ),
        # Sized for ~20 min on 2 CPU cores (SmolLM2 forward ~135-250 tokens/s, LoRA training
        # ~30-90 tokens/s, decode ~30-70 tokens/s at batch 8): compact caption (~550-token
        # prompt), 168 new tokens (an 8-point answer is ~140-170 SmolLM2 tokens), 2 turns with
        # contexts up to 1408 tokens, 8 SFT steps of 2 sequences (<= 1280 tokens) at a high LoRA
        # lr, 2 mtGRPO steps of 1 prompt x G 4 without the KL term (beta = 0: two small updates
        # cannot drift far, and it saves the reference forward pass). RL samples at T = 0.6:
        # at T = 1 (and in one run at 0.7) every sample of the briefly tuned 135M model was out
        # of format (all rewards equal, zero gradient); groups without signal skip the update
        # (drop_degenerate_groups). 5 held-out scenes per seed pool into two batches of 8.
        "cpu-demo": Preset(
            name="cpu-demo", lora_rank=8, lora_alpha=16.0, train_scenes=96, eval_scenes=5, eval_seeds=(0, 1, 2),
            sft_single=32, sft_multi=64, sft_qa_scenes=1,
            sft=SFTConfig(optim=OptimConfig(learning_rate=1e-3), batch_size=2, max_steps=8, bucket_size=128),
            rl=dataclasses.replace(
                cpu_rl, rollout=_rollout(4, 2, 168, 0.6, TEXT_PROMPT, COMPACT_CAPTION), prompts_per_step=1,
                drop_degenerate_groups=True,
                minibatch_size=2, steps=2, optim=OptimConfig(learning_rate=5e-5), recompute_old_logprobs=False,
                loss=LossConfig(kl_coef=0.0), bucket_size=128),
            max_new_tokens=168, eval_turns=2, caption=COMPACT_CAPTION, eval_batch=8, untrained_eval_scenes=1,
            curation_scenes=4, sft_max_tokens=1280, max_context_tokens=1408,
        ),
        "paper": Preset(
            name="paper", model="Qwen2.5-VL-3B-Instruct", lora_rank=0, train_scenes=100_000, eval_scenes=12_146,
            eval_seeds=(0,), sft_single=100_000, sft_multi=100_000, sft_qa_scenes=10_000,
            sft=SFTConfig(optim=OptimConfig(learning_rate=4e-5, trainable="full"), batch_size=128, epochs=4),
            rl=GRPOConfig(rollout=_rollout(8, 6, 256, 1.0), prompts_per_step=32, minibatch_size=128, steps=300,
                          optim=OptimConfig(learning_rate=1e-6, trainable="full")),
            max_new_tokens=256, eval_turns=6,
        ),
    }


PRESETS = _presets()


def _index(tree, idx):
    return jax.tree_util.tree_map(lambda x: x[np.asarray(idx)], tree)


def load_policy(preset: Preset):
    """(model, tokenizer) with LoRA applied when ``preset.lora_rank > 0``."""
    from flax import nnx

    if preset.model == "tiny":
        from jax_drive.models.tiny import tiny_policy

        model, _, tokenizer = tiny_policy(seed=preset.seed, lora_rank=preset.lora_rank or None)
    else:
        from jax_drive.models import load_pretrained
        from jax_drive.models.lora import apply_lora

        model, _, tokenizer = load_pretrained(preset.model)
        if preset.lora_rank:
            apply_lora(model, rank=preset.lora_rank, alpha=preset.lora_alpha, rngs=nnx.Rngs(preset.seed + 1))
    model.config = dataclasses.replace(model.config, remat_layers=preset.remat_layers)
    return model, tokenizer


class PolicyPredictor:
    """First-turn predictor backed by a language-model engine (greedy), for RL curation."""

    name = "policy"

    def __init__(self, engine, max_new_tokens: int):
        self.engine = engine
        self.params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)

    def __call__(self, scene: Scene, key: jax.Array, prompts: Sequence[list[dict]]) -> list[str]:
        return [c.text for c in self.engine.generate_chat(list(prompts), self.params, key)]


def eval_config(preset: Preset) -> RolloutConfig:
    """Greedy multi-turn evaluation rollouts (one per scene, ``eval_turns`` turns)."""
    config = _rollout(group=1, turns=preset.eval_turns, max_new_tokens=preset.max_new_tokens, temperature=0.0,
                      prompt=preset.prompt, caption=preset.caption)
    return dataclasses.replace(config, max_context_tokens=preset.max_context_tokens)


def rl_config(preset: Preset, advantage: str | None = None) -> GRPOConfig:
    """The preset's RL settings with its prompt / caption (so RL prompts match the SFT data)."""
    config = preset.rl
    rollout = dataclasses.replace(config.rollout, prompt=preset.prompt, caption=preset.caption,
                                  max_context_tokens=preset.max_context_tokens)
    config = dataclasses.replace(config, rollout=rollout)
    if advantage is not None:
        config = dataclasses.replace(config, advantage=dataclasses.replace(config.advantage, mode=advantage))
    return config


def _eval_all(engine, tokenizer, held_out: list[tuple[Scene, np.ndarray]], preset: Preset, progress: bool,
              num_scenes: int | None = None) -> dict:
    """Greedy multi-turn evaluation on every held-out set (its first ``num_scenes`` scenes when
    given): per-seed summaries, their mean and standard error.

    The sets are pooled into one rollout call (``preset.eval_batch`` scenes per batch), so
    the sampler's power-of-two batch padding is paid once, not per set; decoding is greedy,
    so the result does not depend on the PRNG key."""
    config = eval_config(preset)
    sets = []
    for scenes, refs in held_out:
        if num_scenes is not None:
            idx = np.arange(min(num_scenes, len(refs)))
            scenes, refs = _index(scenes, idx), refs[idx]
        sets.append((scenes, np.asarray(refs)))
    pooled = jax.tree_util.tree_map(lambda *a: np.concatenate([np.asarray(x) for x in a]), *[s for s, _ in sets])
    _, result = evaluate_multiturn(engine, tokenizer, pooled, config, jax.random.key(0),
                                   references=np.concatenate([r for _, r in sets]),
                                   batch_size=preset.eval_batch, progress=progress)
    per_seed, results, start = [], [], 0
    for seed, (_, refs) in zip(preset.eval_seeds, sets):
        part = select_scenes(result, np.arange(start, start + len(refs)))
        start += len(refs)
        per_seed.append({"seed": seed, "scenes": int(len(refs)), **summarize(part)})
        results.append(part)
    keys = ("pdms_first", "pdms_final", "format_rate", "turns_mean", "final_nc", "final_dac", "final_ttc",
            "final_ep", "final_comfort")
    mean = {k: float(np.mean([s[k] for s in per_seed])) for k in keys}
    sem = {k: float(np.std([s[k] for s in per_seed], ddof=1) / np.sqrt(len(per_seed))) if len(per_seed) > 1 else 0.0
           for k in keys}
    by_budget = np.mean([s["pdms_by_budget"] for s in per_seed], axis=0).tolist()
    return {"mean": mean, "sem": sem, "pdms_by_budget": by_budget, "per_seed": per_seed, "_results": results}


def filter_by_length(rows: Sequence, kinds: Sequence[str], max_tokens: int | None) -> tuple[list, dict]:
    """Keeps the token rows of at most ``max_tokens`` tokens (all when None).

    Returns (kept rows, {"max_tokens": ..., kind: number kept per kind}). Raises when
    nothing is left.
    """
    if len(rows) != len(kinds):
        raise ValueError(f"{len(rows)} rows but {len(kinds)} kinds")
    keep = [i for i, r in enumerate(rows) if max_tokens is None or len(r) <= max_tokens]
    if not keep:
        raise ValueError(f"no SFT sample has at most {max_tokens} tokens")
    counts = {k: sum(kinds[i] == k for i in keep) for k in dict.fromkeys(kinds)}
    return [rows[i] for i in keep], {"max_tokens": max_tokens, **counts}


def stage_line(name: str, stage: dict) -> str:
    """One printed line per evaluated stage: PDMS by turn budget, format rate, turns used."""
    m = stage["mean"]
    pdms = ", ".join(f"{v:.3f}" for v in stage["pdms_by_budget"])
    return (f"{name}: PDMS by turn budget [{pdms}] (sem of final {stage['sem']['pdms_final']:.3f}), "
            f"format {m['format_rate']:.3f}, turns {m['turns_mean']:.2f}")


def _examples(result, num_scenes: int = 2, max_chars: int = 600) -> list[list[dict]]:
    """The answers (text, PDMS, format, finish reason) of every turn of the first scenes."""
    return [[{"text": t.text[:max_chars], "pdms": t.pdms, "format": t.format, "finish_reason": t.finish_reason,
              "tokens": t.num_tokens} for t in turns] for turns in result.turns[:num_scenes]]


def sft_checkpoint_dir(run_dir: str | os.PathLike) -> str:
    """Where ``run_mtdrive(preset, run_dir)`` saves the SFT state (orbax)."""
    return os.path.join(os.fspath(run_dir), "sft", "checkpoints")


def load_sft(model, preset: Preset, run_dir: str | os.PathLike) -> dict:
    """Loads the trained (LoRA) params of an earlier run's SFT stage into ``model`` in place.

    The checkpoint must come from the same model, LoRA rank and trainable set. Returns the
    checkpoint's meta (step, data position).
    """
    _, params, _ = split_model(model, preset.sft.optim.trainable)
    tx = make_optimizer(preset.sft.optim)
    template = RunState(params=params, opt_state=tx.init(params), rng=jax.random.key(preset.sft.seed))
    ckpt = Checkpointer(sft_checkpoint_dir(run_dir))
    try:
        state, meta = ckpt.restore(template)
    finally:
        ckpt.close()
    write_back(model, state.params)
    return meta


def _read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_mtdrive(preset: Preset, out_dir: str | os.PathLike, *, advantage: str | None = None,
                skip_rl: bool = False, sft_from: str | os.PathLike | None = None,
                evaluate: Sequence[str] = STAGES, progress: bool = True, log=None) -> dict[str, Any]:
    """Runs the whole pipeline; returns the results dict (without writing it).

    Args:
      preset: experiment settings.
      out_dir: SFT / RL metrics and checkpoints go to ``out_dir/sft`` and ``out_dir/rl``.
      advantage: overrides the preset's advantage estimator ('grpo', 'mtgrpo_intra', 'mtgrpo_cross').
      skip_rl: stop after SFT (and its evaluation).
      sft_from: an earlier run directory of the same preset: its SFT checkpoint is loaded
        instead of training (the SFT stage is not repeated, e.g. across ablation variants).
      evaluate: the stages evaluated on the held-out scenes (subset of 'untrained', 'sft', 'rl').
    """
    log = log or (lambda msg: print(msg, flush=True))
    unknown = set(evaluate) - set(STAGES)
    if unknown:
        raise ValueError(f"unknown stages {sorted(unknown)}; choose from {STAGES}")
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name):
        nonlocal clock
        now = time.perf_counter()
        timings[name] = round(now - clock, 2)
        clock = now

    gen = GeneratorConfig(hard_fraction=preset.hard_fraction)
    train = generate_scenes(jax.random.key(preset.seed), preset.train_scenes, gen)
    held_out = []
    for seed in preset.eval_seeds:
        scenes = generate_scenes(jax.random.key(EVAL_SEED_OFFSET + seed), preset.eval_scenes, gen)
        held_out.append((scenes, np.asarray(compute_reference(scenes))))
    lap("scenes")

    model, tokenizer = load_policy(preset)
    buckets = tuple(range(preset.prompt_bucket, 32_768 + 1, preset.prompt_bucket))
    engine = JaxEngine(model, tokenizer, SamplerConfig(prompt_buckets=buckets), max_batch_size=preset.eval_batch)
    lap("load")

    stages: dict[str, Any] = {}
    if "untrained" in evaluate:
        k = preset.untrained_eval_scenes
        log(f"[{preset.name}] evaluating the untrained policy on {len(preset.eval_seeds)} x "
            f"{min(k or preset.eval_scenes, preset.eval_scenes)} held-out scenes")
        stages["untrained"] = _eval_all(engine, tokenizer, held_out, preset, progress, num_scenes=k)
        log(f"[{preset.name}] " + stage_line("untrained", stages["untrained"]))
        lap("eval_untrained")

    build = BuildConfig(prompt=preset.prompt, caption=preset.caption)
    key = jax.random.key(preset.seed + 1)
    k_multi, k_qa, k_rl = jax.random.split(key, 3)
    data_card: dict = {}
    if sft_from is None:
        n1, n2 = preset.sft_single, preset.sft_multi
        single = build_single(_index(train, np.arange(0, n1) % preset.train_scenes), build)
        multi, multi_stats = build_multi(_index(train, np.arange(n1, n1 + n2) % preset.train_scenes),
                                         ConstantVelocityPredictor(), k_multi, build)
        qa, qa_counts = build_qa(_index(train, np.arange(preset.sft_qa_scenes)), k_qa, build)
        data_card = {"single": len(single), "multi": len(multi), "qa": len(qa), "multi_stats": multi_stats,
                     "qa_counts": qa_counts}
        rows = [tokenize_chat(tokenizer, m, preset.sft.train_on) for m in as_conversations(single + multi + qa)]
        kinds = ["single"] * len(single) + ["multi"] * len(multi) + ["qa"] * len(qa)
        sft_data, data_card["kept"] = filter_by_length(rows, kinds, preset.sft_max_tokens)
        log(f"[{preset.name}] SFT data: {len(single)} single, {len(multi)} multi-turn, {len(qa)} QA"
            + f"; kept {data_card['kept']}")
        lap("sft_data")
        sft = sft_train(model, sft_data, preset.sft, tokenizer=tokenizer, out_dir=os.path.join(out_dir, "sft"),
                        progress=progress)
        sft_history = sft.history
        lap("sft")
    else:
        meta = load_sft(model, preset, sft_from)
        sft_history = _read_jsonl(os.path.join(os.fspath(sft_from), "sft", "metrics.jsonl"))
        data_card = {"sft_from": os.fspath(sft_from), "sft_steps": int(meta["step"])}
        log(f"[{preset.name}] loaded the SFT checkpoint of {sft_from} (step {meta['step']})")
        lap("sft_load")
    if "sft" in evaluate:
        stages["sft"] = _eval_all(engine, tokenizer, held_out, preset, progress)
        log(f"[{preset.name}] " + stage_line("after SFT", stages["sft"]))
        lap("eval_sft")

    rl_history: list[dict] = []
    curation: dict = {}
    if not skip_rl:
        predictor = PolicyPredictor(engine, preset.max_new_tokens)
        pool = preset.train_scenes if preset.curation_scenes is None else min(preset.curation_scenes,
                                                                              preset.train_scenes)
        candidates = _index(train, np.arange(pool))
        records, curation = build_rl(candidates, predictor, k_rl, build)
        chosen = np.array([r["scene_id"] for r in records], dtype=np.int64)
        scene_ids = np.asarray(candidates.scene_id)
        index = np.flatnonzero(np.isin(scene_ids, chosen)) if len(chosen) else np.arange(pool)
        log(f"[{preset.name}] RL curation kept {len(index)} of {pool} scenes: {curation.get('category_counts')}")
        lap("rl_curation")
        rl = grpo_train(model, tokenizer, _index(candidates, index), rl_config(preset, advantage), engine=engine,
                        out_dir=os.path.join(out_dir, "rl"), progress=progress)
        rl_history = rl.history
        lap("rl")
        if "rl" in evaluate:
            stages["rl"] = _eval_all(engine, tokenizer, held_out, preset, progress)
            log(f"[{preset.name}] " + stage_line(f"after RL ({rl_config(preset, advantage).advantage.mode})", stages["rl"]))
            lap("eval_rl")

    rl_cfg = rl_config(preset, advantage)
    results = {
        "preset": preset.name,
        "model": preset.model,
        "seed": preset.seed,
        "advantage": rl_cfg.advantage.mode if not skip_rl else None,
        "eval": {"seeds": list(preset.eval_seeds), "scenes_per_seed": preset.eval_scenes,
                 "untrained_scenes_per_seed": min(preset.untrained_eval_scenes or preset.eval_scenes,
                                                  preset.eval_scenes),
                 "turn_budget": preset.eval_turns, "decoding": "greedy", "max_new_tokens": preset.max_new_tokens},
        "budget": {"sft_steps": preset.sft.max_steps, "sft_batch": preset.sft.batch_size,
                   "sft_lr": preset.sft.optim.learning_rate, "lora_rank": preset.lora_rank,
                   "rl_steps": rl_cfg.steps, "rl_prompts_per_step": rl_cfg.prompts_per_step,
                   "rl_group": rl_cfg.rollout.group_size, "rl_turns": rl_cfg.rollout.max_turns,
                   "rl_lr": rl_cfg.optim.learning_rate, "kl_coef": rl_cfg.loss.kl_coef,
                   "rl_minibatch": rl_cfg.minibatch_size, "max_context_tokens": preset.max_context_tokens,
                   "sft_max_tokens": preset.sft_max_tokens,
                   "caption": dataclasses.asdict(preset.caption)},
        "stages": {name: {k: v for k, v in s.items() if not k.startswith("_")} for name, s in stages.items()},
        "sft_history": sft_history,
        "rl_history": rl_history,
        "data_card": data_card,
        "rl_curation": curation,
        "timings_s": timings,
        "examples": {name: _examples(s["_results"][0]) for name, s in stages.items()},
        "_rollouts": {name: s["_results"] for name, s in stages.items()},
        "_held_out": held_out,
    }
    return results


def public(results: dict) -> dict:
    """The JSON-serialisable part of the results (drops private rollout objects)."""
    return {k: v for k, v in results.items() if not k.startswith("_")}


def write_results(results: dict, path: str | os.PathLike) -> None:
    with open(path, "w") as f:
        json.dump(public(results), f, indent=2, default=float)


def results_table(results: dict) -> str:
    """Plain-text table: PDMS by turn budget and final sub-scores per stage."""
    lines = []
    stages = results["stages"]
    if not stages:
        return "(no stage evaluated)"
    turns = len(next(iter(stages.values()))["pdms_by_budget"])
    head = f"{'stage':<10}" + "".join(f"{'PDMS@' + str(j + 1):>9}" for j in range(turns)) + \
        f"{'format':>8}{'turns':>7}{'NC':>7}{'DAC':>7}{'TTC':>7}{'EP':>7}{'C':>7}"
    lines.append(head)
    for name, s in stages.items():
        m = s["mean"]
        lines.append(f"{name:<10}" + "".join(f"{v:>9.3f}" for v in s["pdms_by_budget"]) +
                     f"{m['format_rate']:>8.3f}{m['turns_mean']:>7.2f}{m['final_nc']:>7.3f}{m['final_dac']:>7.3f}"
                     f"{m['final_ttc']:>7.3f}{m['final_ep']:>7.3f}{m['final_comfort']:>7.3f}")
    return "\n".join(lines)
