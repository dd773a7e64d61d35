"""MTDrive results formatting: the printed lines and table, the JSON results file."""

from __future__ import annotations

import dataclasses
import math
import os

from jax_drive.rl.atomic import atomic_write_json
from jax_drive.rl.logging import jsonable
from jax_drive.stats import mean_sem, paired_bootstrap


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


def scene_differences(runs: list[dict], high: tuple[str, str], low: tuple[str, str]) -> list[list[float]] | None:
    """(training seeds, held-out scenes) matrix of ``high - low``, each a (stage, key) whose
    per-scene scores the evaluation kept (``scene_<key>`` in every held-out set); None when a
    run lacks them (results written before per-scene scores were kept)."""
    matrix = []
    for run in runs:
        row: list[float] = []
        for a, b in zip(run["stages"][high[0]]["per_seed"], run["stages"][low[0]]["per_seed"]):
            x, y = a.get(f"scene_{high[1]}"), b.get(f"scene_{low[1]}")
            if x is None or y is None or len(x) != len(y):
                return None
            row.extend(float(u) - float(v) for u, v in zip(x, y))
        matrix.append(row)
    if len({len(r) for r in matrix}) != 1:
        return None  # runs evaluated on different held-out sets cannot be paired
    return matrix


def _paired_goal(diffs, gain_sem: tuple[float, float]) -> dict:
    """A gain goal: met when the paired 95 % interval over held-out scenes and training seeds
    lies above 0; without per-scene scores of both stages on the same scenes (older results,
    an untrained policy evaluated on fewer scenes) the gain must beat its standard error."""
    if diffs is None:
        gain, sem = gain_sem
        return {"gain": gain, "sem": sem, "rule": "gain > standard error (no per-scene scores on the same scenes)",
                "met": gain > sem + TIE_TOLERANCE}
    paired = paired_bootstrap(diffs, resample_seeds=True)
    return {"gain": paired["mean"], "ci95": paired["ci95"], "scenes": paired["units"],
            "training_seeds": paired["training_seeds"], "rule": "95 % interval above 0 (" + paired["interval"] + ")",
            "met": paired["ci95"][0] > TIE_TOLERANCE}


# A gain must beat its standard error by more than float32 rounding: with one seed (or
# held-out set) gaining x and the others exactly 0, mean and sem are both x / n, and which
# side of the tie the rounding falls on must not decide a goal.
TIE_TOLERANCE = 1e-6


def quality_goals(runs: list[dict]) -> dict:
    """The cpu-demo quality goals for results dicts of one preset (one training seed each):

    * ``format_after_sft_ge_0.95``: mean SFT format rate >= 0.95 (under the preset's decoding;
      ``format_after_sft_unconstrained`` reports, without a goal, the SFT policy's first
      answers decoded without the trajectory grammar when the run measured them);
    * ``last_turn_above_first`` (RL, else SFT): PDMS after the last turn minus turn 1;
    * ``rl_above_sft``: last-turn PDMS of RL minus SFT;
    * ``sft_above_untrained``: the same for SFT against the untrained policy.
    Gains are paired per held-out scene and training seed and met when their 95 % hierarchical
    percentile bootstrap interval (training seeds, then scenes;
    :func:`jax_drive.stats.paired_bootstrap`) lies above 0. Results
    without per-scene scores fall back to "gain above its standard error" (per training
    seed; a single run: per held-out set), and the goal's ``rule`` says so. The untrained
    policy may be evaluated on fewer scenes; its goal then uses that rule too. Goals whose
    stages are missing are left out."""
    if not runs:
        raise ValueError("no runs given")
    have = [s for s in ("untrained", "sft", "rl") if all(s in r.get("stages", {}) for r in runs)]

    def across(stage: str, key: str) -> tuple[float, float]:
        if len(runs) > 1:
            m = mean_sem([r["stages"][stage]["mean"][key] for r in runs])
            return m["mean"], m["sem"]
        return runs[0]["stages"][stage]["mean"][key], runs[0]["stages"][stage]["sem"][key]

    goals: dict = {}
    if "sft" in have:
        value = across("sft", "format_rate")[0]
        goals["format_after_sft_ge_0.95"] = {"value": value, "met": value >= 0.95}
    if all(r.get("sft_unconstrained") for r in runs):
        free = mean_sem([r["sft_unconstrained"]["format_rate"] for r in runs])
        goals["format_after_sft_unconstrained"] = {"value": free["mean"], "sem": free["sem"], "met": None}
    final = "rl" if "rl" in have else "sft" if "sft" in have else None
    if final:
        if len(runs) > 1:
            gains = [r["stages"][final]["mean"]["pdms_final"] - r["stages"][final]["mean"]["pdms_first"] for r in runs]
        else:
            gains = [s["pdms_final"] - s["pdms_first"] for s in runs[0]["stages"][final]["per_seed"]]
        m = mean_sem(gains)
        diffs = scene_differences(runs, (final, "pdms_final"), (final, "pdms_first"))
        goals["last_turn_above_first"] = {"stage": final, **_paired_goal(diffs, (m["mean"], m["sem"]))}
    for name, low, high in (("rl_above_sft", "sft", "rl"), ("sft_above_untrained", "untrained", "sft")):
        if low in have and high in have:
            (a, sem_a), (b, sem_b) = across(low, "pdms_final"), across(high, "pdms_final")
            diffs = scene_differences(runs, (high, "pdms_final"), (low, "pdms_final"))
            goal = _paired_goal(diffs, (b - a, math.hypot(sem_a, sem_b)))
            if "sem" in goal:
                goal["combined_sem"] = goal.pop("sem")
            goals[name] = goal
    return goals


def goals_lines(goals: dict) -> str:
    """One printed line per goal of :func:`quality_goals`."""
    lines = []
    for name, g in goals.items():
        verdict = "reported" if g["met"] is None else "met" if g["met"] else "NOT met"
        if "value" in g:
            lines.append(f"{name}: {g['value']:.3f} ({verdict})")
        elif "ci95" in g:
            lo, hi = g["ci95"]
            lines.append(f"{name}: gain {g['gain']:+.3f}, 95 % interval [{lo:+.3f}, {hi:+.3f}] over "
                         f"{g['scenes']} scenes x {g['training_seeds']} seeds ({verdict})")
        else:
            err = g.get("sem", g.get("combined_sem"))
            lines.append(f"{name}: gain {g['gain']:+.3f} vs standard error {err:.3f} ({verdict})")
    return "\n".join(lines)
