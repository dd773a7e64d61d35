"""The Table 3 ablation's paired comparisons and plot (experiments/ablation_mtgrpo.py) on
hand-made rows: arms against GRPO and SFT per scene and seed, and multi- vs single-turn
reading the single-turn arm at its first answer."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import ablation_mtgrpo as A  # noqa: E402


def _row(first: list[float], final: list[float]) -> dict:
    metric = {k: 0.0 for k in A.METRICS}
    metric.update(pdms_first=sum(first) / len(first), pdms_final=sum(final) / len(final))
    return {"mean": metric, "sem": dict(metric), "pdms_by_budget": [metric["pdms_first"], metric["pdms_final"]],
            "scene_pdms_first": first, "scene_pdms_final": final}


def test_stage_row_keeps_every_held_out_sets_scene_scores_in_order():
    stage = {"mean": {k: 0.0 for k in A.METRICS}, "sem": {k: 0.0 for k in A.METRICS}, "pdms_by_budget": [0.0],
             "per_seed": [{"scene_pdms_first": [0.1], "scene_pdms_final": [0.2]},
                          {"scene_pdms_first": [0.3, 0.4], "scene_pdms_final": [0.5, 0.6]}]}
    row = A.stage_row(stage)
    assert row["scene_pdms_first"] == [0.1, 0.3, 0.4] and row["scene_pdms_final"] == [0.2, 0.5, 0.6]


def test_paired_comparisons_and_the_plot(tmp_path):
    per_seed = {
        "sft": [_row([0.2, 0.2], [0.2, 0.2])] * 2,
        "grpo": [_row([0.3, 0.3], [0.3, 0.3])] * 2,
        "mtgrpo_cross": [_row([0.3, 0.3], [0.5, 0.5])] * 2,
        "single_turn": [_row([0.4, 0.4], [0.9, 0.9])] * 2,  # judged by its first answer, 0.4
    }
    out = A.paired(per_seed)
    assert out["mtgrpo_cross_vs_grpo"]["mean"] == pytest.approx(0.2)
    assert out["mtgrpo_cross_vs_grpo"]["ci95"] == pytest.approx([0.2, 0.2])
    assert out["grpo_vs_sft"]["mean"] == pytest.approx(0.1)
    assert out["single_turn_vs_grpo"]["mean"] == pytest.approx(0.1)
    assert out["multi_vs_single_turn"]["mean"] == pytest.approx(0.1)  # 0.5 (last turn) - 0.4 (turn 1)
    assert "sft_vs_grpo" not in out and (out["grpo_vs_sft"]["units"], out["grpo_vs_sft"]["training_seeds"]) == (2, 2)
    table = {name: A.combine(rows) for name, rows in per_seed.items()}
    A.plot({"table": table, "paired": out, "preset": "tiny", "training_seeds": [0, 1]}, str(tmp_path / "t3.png"))
    assert (tmp_path / "t3.png").stat().st_size > 0


def test_rows_without_scene_scores_are_not_paired():
    rows = [{**_row([0.1], [0.2]), "scene_pdms_first": [], "scene_pdms_final": []}]
    assert A.paired({"sft": rows, "grpo": rows}) == {}


def test_the_single_turn_arm_trains_on_one_turn_and_keeps_the_evaluation():
    from jax_drive.pipelines.mtdrive.presets import PRESETS

    preset = PRESETS["tiny"]
    arm = A.single_turn(preset)
    assert arm.rl.rollout.max_turns == 1 and preset.rl.rollout.max_turns == 3
    assert arm.eval_turns == preset.eval_turns and arm.rl.steps == preset.rl.steps
