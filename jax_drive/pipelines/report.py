"""MTDrive results formatting: the printed lines and table, the JSON results file."""

from __future__ import annotations

import dataclasses
import os

from jax_drive.rl.atomic import atomic_write_json
from jax_drive.rl.logging import jsonable


def eval_card(preset) -> dict:
    """How the held-out evaluation was run (a :class:`~jax_drive.pipelines.presets.Preset`'s settings)."""
    return {"seeds": list(preset.eval_seeds), "scenes_per_seed": preset.eval_scenes,
            "untrained_scenes_per_seed": min(preset.untrained_eval_scenes or preset.eval_scenes, preset.eval_scenes),
            "turn_budget": preset.eval_turns, "decoding": "greedy", "max_new_tokens": preset.max_new_tokens}


def budget_card(preset, rl) -> dict:
    """The training budget of a preset and its RL config (``GRPOConfig``)."""
    return {"sft_steps": preset.sft.max_steps, "sft_batch": preset.sft.batch_size,
            "sft_lr": preset.sft.optim.learning_rate, "lora_rank": preset.lora_rank,
            "rl_steps": rl.steps, "rl_prompts_per_step": rl.prompts_per_step,
            "rl_group": rl.rollout.group_size, "rl_turns": rl.rollout.max_turns,
            "rl_lr": rl.optim.learning_rate, "kl_coef": rl.loss.kl_coef,
            "rl_minibatch": rl.minibatch_size, "max_context_tokens": preset.max_context_tokens,
            "sft_max_tokens": preset.sft_max_tokens, "caption": dataclasses.asdict(preset.caption)}


def stage_line(name: str, stage: dict) -> str:
    """One printed line per evaluated stage: PDMS by turn budget, format rate, turns used."""
    m = stage["mean"]
    pdms = ", ".join(f"{v:.3f}" for v in stage["pdms_by_budget"])
    return (f"{name}: PDMS by turn budget [{pdms}] (sem of final {stage['sem']['pdms_final']:.3f}), "
            f"format {m['format_rate']:.3f}, turns {m['turns_mean']:.2f}")


def examples(transcripts: list[list[dict]], num_scenes: int = 2, max_chars: int = 600) -> list[list[dict]]:
    """The answers (text, PDMS, format, finish reason, tokens) of every turn of the first
    scenes, from :meth:`jax_drive.rollout.RolloutResult.turn_log` dicts."""
    keys = ("pdms", "format", "finish_reason", "tokens")
    return [[{"text": t["text"][:max_chars], **{k: t[k] for k in keys}} for t in turns]
            for turns in transcripts[:num_scenes]]


def public(results: dict) -> dict:
    """The JSON-serialisable part of the results (drops private in-memory objects)."""
    return {k: v for k, v in results.items() if not k.startswith("_")}


def write_results(results: dict, path: str | os.PathLike) -> None:
    """Writes the public results as JSON (atomically)."""
    atomic_write_json(path, jsonable(public(results)))


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
