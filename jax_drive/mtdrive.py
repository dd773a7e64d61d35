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
from jax_drive.rl.grpo import GRPOConfig, evaluate_multiturn, grpo_train
from jax_drive.rl.loss import LossConfig
from jax_drive.rl.optim import OptimConfig
from jax_drive.rl.sft import SFTConfig, sft_train
from jax_drive.rollout import RolloutConfig
from jax_drive.rollout.multiturn import compute_reference
from jax_drive.sampling import JaxEngine, SamplingParams
from jax_drive.scenes import GeneratorConfig, generate_scenes
from jax_drive.text.prompts import PromptConfig
from jax_drive.types import Scene

TEXT_PROMPT = PromptConfig(perception="text", image_placeholder=False)
# Byte-level smoke-test models need short prompts: no scene description.
NO_PERCEPTION = PromptConfig(perception="none", image_placeholder=False)
EVAL_SEED_OFFSET = 10_000  # held-out scenes use keys disjoint from the training keys


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
    seed: int = 0


def _rollout(group: int, turns: int, max_new_tokens: int, temperature: float,
             prompt: PromptConfig = TEXT_PROMPT) -> RolloutConfig:
    return RolloutConfig(
        group_size=group,
        max_turns=turns,
        sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature),
        prompt=prompt,
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
        "cpu-demo": Preset(
            name="cpu-demo",
            sft=SFTConfig(optim=OptimConfig(learning_rate=1e-3), batch_size=8, max_steps=40, bucket_size=64),
            rl=cpu_rl,
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
        from jax_drive.rl.tiny import tiny_policy

        model, _, tokenizer = tiny_policy(seed=preset.seed, lora_rank=preset.lora_rank or None)
        return model, tokenizer
    from jax_drive.models import load_pretrained
    from jax_drive.models.lora import apply_lora

    model, _, tokenizer = load_pretrained(preset.model)
    if preset.lora_rank:
        apply_lora(model, rank=preset.lora_rank, alpha=preset.lora_alpha, rngs=nnx.Rngs(preset.seed + 1))
    return model, tokenizer


class PolicyPredictor:
    """First-turn predictor backed by a language-model engine (greedy), for RL curation."""

    name = "policy"

    def __init__(self, engine, max_new_tokens: int):
        self.engine = engine
        self.params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)

    def __call__(self, scene: Scene, key: jax.Array, prompts: Sequence[list[dict]]) -> list[str]:
        return [c.text for c in self.engine.generate_chat(list(prompts), self.params, key)]


def _eval_all(engine, tokenizer, held_out: list[tuple[Scene, np.ndarray]], preset: Preset, progress: bool) -> dict:
    """Greedy multi-turn evaluation on every held-out set: per-seed summaries and their mean."""
    config = _rollout(group=1, turns=preset.eval_turns, max_new_tokens=preset.max_new_tokens, temperature=0.0,
                      prompt=preset.prompt)
    per_seed, results = [], []
    for seed, (scenes, refs) in zip(preset.eval_seeds, held_out):
        summary, result = evaluate_multiturn(engine, tokenizer, scenes, config, jax.random.key(seed),
                                             references=refs, batch_size=16, progress=progress)
        per_seed.append({"seed": seed, **summary})
        results.append(result)
    keys = ("pdms_first", "pdms_final", "format_rate", "turns_mean", "final_nc", "final_dac", "final_ttc",
            "final_ep", "final_comfort")
    mean = {k: float(np.mean([s[k] for s in per_seed])) for k in keys}
    sem = {k: float(np.std([s[k] for s in per_seed], ddof=1) / np.sqrt(len(per_seed))) if len(per_seed) > 1 else 0.0
           for k in keys}
    by_budget = np.mean([s["pdms_by_budget"] for s in per_seed], axis=0).tolist()
    return {"mean": mean, "sem": sem, "pdms_by_budget": by_budget, "per_seed": per_seed, "_results": results}


def run_mtdrive(preset: Preset, out_dir: str | os.PathLike, *, advantage: str | None = None,
                skip_rl: bool = False, progress: bool = True, log=print) -> dict[str, Any]:
    """Runs the whole pipeline; returns the results dict (without writing it)."""
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
    engine = JaxEngine(model, tokenizer, max_batch_size=16)
    lap("load")

    stages: dict[str, Any] = {}
    log(f"[{preset.name}] evaluating the untrained policy on {len(preset.eval_seeds)} x {preset.eval_scenes} held-out scenes")
    stages["untrained"] = _eval_all(engine, tokenizer, held_out, preset, progress)
    lap("eval_untrained")

    build = BuildConfig(prompt=preset.prompt)
    key = jax.random.key(preset.seed + 1)
    k_multi, k_qa, k_rl = jax.random.split(key, 3)
    n1, n2 = preset.sft_single, preset.sft_multi
    single = build_single(_index(train, np.arange(0, n1)), build)
    multi, multi_stats = build_multi(_index(train, np.arange(n1, n1 + n2) % preset.train_scenes),
                                     ConstantVelocityPredictor(), k_multi, build)
    qa, qa_counts = build_qa(_index(train, np.arange(preset.sft_qa_scenes)), k_qa, build)
    sft_data = single + multi + qa
    data_card = {"single": len(single), "multi": len(multi), "qa": len(qa), "multi_stats": multi_stats,
                 "qa_counts": qa_counts}
    log(f"[{preset.name}] SFT data: {len(single)} single, {len(multi)} multi-turn, {len(qa)} QA")
    lap("sft_data")
    sft = sft_train(model, sft_data, preset.sft, tokenizer=tokenizer, out_dir=os.path.join(out_dir, "sft"),
                    progress=progress)
    lap("sft")
    stages["sft"] = _eval_all(engine, tokenizer, held_out, preset, progress)
    lap("eval_sft")

    rl_history: list[dict] = []
    curation: dict = {}
    if not skip_rl:
        predictor = PolicyPredictor(engine, preset.max_new_tokens)
        records, curation = build_rl(train, predictor, k_rl, build)
        chosen = np.array([r["scene_id"] for r in records], dtype=np.int64)
        scene_ids = np.asarray(train.scene_id)
        index = np.flatnonzero(np.isin(scene_ids, chosen)) if len(chosen) else np.arange(preset.train_scenes)
        log(f"[{preset.name}] RL curation kept {len(index)} of {preset.train_scenes} scenes: {curation.get('category_counts')}")
        lap("rl_curation")
        rl_config = preset.rl
        if advantage is not None:
            rl_config = dataclasses.replace(rl_config, advantage=dataclasses.replace(rl_config.advantage, mode=advantage))
        rl = grpo_train(model, tokenizer, _index(train, index), rl_config, engine=engine,
                        out_dir=os.path.join(out_dir, "rl"), progress=progress)
        rl_history = rl.history
        lap("rl")
        stages["rl"] = _eval_all(engine, tokenizer, held_out, preset, progress)
        lap("eval_rl")

    results = {
        "preset": preset.name,
        "model": preset.model,
        "advantage": (advantage or preset.rl.advantage.mode) if not skip_rl else None,
        "eval": {"seeds": list(preset.eval_seeds), "scenes_per_seed": preset.eval_scenes,
                 "turn_budget": preset.eval_turns, "decoding": "greedy"},
        "stages": {name: {k: v for k, v in s.items() if not k.startswith("_")} for name, s in stages.items()},
        "sft_history": sft.history,
        "rl_history": rl_history,
        "data_card": data_card,
        "rl_curation": curation,
        "timings_s": timings,
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
