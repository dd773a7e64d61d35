"""MTDrive results formatting: the printed lines and table, the JSON results file."""

from __future__ import annotations

import dataclasses
import math
import os

from jax_drive.rl.atomic import atomic_write_json
from jax_drive.rl.logging import jsonable


def eval_card(preset) -> dict:
    """How the held-out evaluation was run (a :class:`~jax_drive.pipelines.mtdrive.presets.Preset`'s settings)."""
    return {"seeds": list(preset.eval_seeds), "scenes_per_seed": preset.eval_scenes,
            "untrained_scenes_per_seed": min(preset.untrained_eval_scenes or preset.eval_scenes, preset.eval_scenes),
            "turn_budget": preset.eval_turns, "decoding": "greedy", "max_new_tokens": preset.max_new_tokens,
            "constrained_answers": preset.constrain_answers}


def budget_card(preset, rl) -> dict:
    """The training budget of a preset and its RL config (``GRPOConfig``)."""
    return {"sft_steps": preset.sft.max_steps, "sft_batch": preset.sft.batch_size,
            "sft_lr": preset.sft.optim.learning_rate, "lora_rank": preset.lora_rank,
            "rl_steps": rl.steps, "rl_prompts_per_step": rl.prompts_per_step,
            "rl_group": rl.rollout.group_size, "rl_turns": rl.rollout.max_turns,
            "rl_lr": rl.optim.learning_rate, "kl_coef": rl.loss.kl_coef,
            "rl_improvement_weight": rl.rollout.improvement_weight,
            "rl_minibatch": rl.minibatch_size, "curation_scenes": preset.curation_scenes,
            "curation_easy_ratio": preset.curation_easy_ratio,
            "max_context_tokens": preset.max_context_tokens,
            "sft_max_tokens": preset.sft_max_tokens, "sft_recovery": preset.sft_recovery,
            "sft_onpolicy_scenes": preset.sft_onpolicy_scenes, "sft_onpolicy_steps": preset.sft_onpolicy_steps,
            "frozen_layers": preset.frozen_layers,
            "caption": dataclasses.asdict(preset.caption)}


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


def mean_sem(values) -> tuple[float, float]:
    """(mean, standard error with the n - 1 convention; 0 for a single value)."""
    values = [float(v) for v in values]
    n = len(values)
    if not n:
        raise ValueError("mean_sem of no values")
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


# A gain must beat its standard error by more than float32 rounding: with one seed (or
# held-out set) gaining x and the others exactly 0, mean and sem are both x / n, and which
# side of the tie the rounding falls on must not decide a goal.
TIE_TOLERANCE = 1e-6


def quality_goals(runs: list[dict]) -> dict:
    """The cpu-demo quality goals of issue 18 for results dicts of one preset (one training
    seed each; a single run is judged across its held-out sets instead of across seeds):

    * ``format_after_sft_ge_0.95``: mean SFT format rate >= 0.95;
    * ``last_turn_above_first`` (RL, else SFT): PDMS after the last turn minus turn 1, paired
      per training seed (single run: per held-out set), above its standard error;
    * ``rl_above_sft``: last-turn PDMS of RL minus SFT above the combined standard error
      (root sum of squares of the two stages' sems);
    * ``sft_above_untrained`` (a single run's learning check; also across seeds): the same
      rule for SFT against the untrained policy.
    Goals whose stages are missing are left out; a gain equal to its standard error (within
    ``TIE_TOLERANCE``) is not met."""
    if not runs:
        raise ValueError("no runs given")
    have = [s for s in ("untrained", "sft", "rl") if all(s in r.get("stages", {}) for r in runs)]

    def across(stage: str, key: str) -> tuple[float, float]:
        if len(runs) > 1:
            return mean_sem([r["stages"][stage]["mean"][key] for r in runs])
        return runs[0]["stages"][stage]["mean"][key], runs[0]["stages"][stage]["sem"][key]

    goals: dict = {}
    if "sft" in have:
        value = across("sft", "format_rate")[0]
        goals["format_after_sft_ge_0.95"] = {"value": value, "met": value >= 0.95}
    final = "rl" if "rl" in have else "sft" if "sft" in have else None
    if final:
        if len(runs) > 1:
            gains = [r["stages"][final]["mean"]["pdms_final"] - r["stages"][final]["mean"]["pdms_first"] for r in runs]
        else:
            gains = [s["pdms_final"] - s["pdms_first"] for s in runs[0]["stages"][final]["per_seed"]]
        gain, sem = mean_sem(gains)
        goals["last_turn_above_first"] = {"stage": final, "gain": gain, "sem": sem, "met": gain > sem + TIE_TOLERANCE}
    for name, low, high in (("rl_above_sft", "sft", "rl"), ("sft_above_untrained", "untrained", "sft")):
        if low in have and high in have:
            (a, sem_a), (b, sem_b) = across(low, "pdms_final"), across(high, "pdms_final")
            combined = math.hypot(sem_a, sem_b)
            goals[name] = {"gain": b - a, "combined_sem": combined, "met": b - a > combined + TIE_TOLERANCE}
    return goals


def goals_lines(goals: dict) -> str:
    """One printed line per goal of :func:`quality_goals`."""
    lines = []
    for name, g in goals.items():
        verdict = "met" if g["met"] else "NOT met"
        if "value" in g:
            lines.append(f"{name}: {g['value']:.3f} ({verdict})")
        else:
            err = g.get("sem", g.get("combined_sem"))
            lines.append(f"{name}: gain {g['gain']:+.3f} vs standard error {err:.3f} ({verdict})")
    return "\n".join(lines)
