"""MTDrive pipeline plumbing on the tiny model: SFT checkpoint reuse, seeds, prompt/caption
consistency between the SFT data and the RL / evaluation rollouts."""

import dataclasses
import os

import jax
import numpy as np
import pytest

from jax_drive.data.builders import BuildConfig, prompt_conversations
from jax_drive.data.sft import filter_by_length
from jax_drive.pipelines.mtdrive import load_policy, load_sft, run_mtdrive
from jax_drive.pipelines.mtdrive.presets import COMPACT_CAPTION, PRESETS, eval_config, rl_config, with_seed
from jax_drive.rl.optim import split_model
from jax_drive.rl.sft import sft_train
from jax_drive.rollout import scene_prompts
from jax_drive.scenes import stack_scenes, straight_road_scene
from jax_drive.text.caption import CaptionConfig
from jax_drive.text.prompts import PromptConfig

SMOKE = PRESETS["smoke"]
DATA = [[{"role": "user", "content": f"plan {i}"},
         {"role": "assistant", "content": "Here is the planning trajectory [PT, (+1.00, 0.0, 0.0)]."}]
        for i in range(4)]


def _lora_leaves(model):
    return [np.asarray(x) for x in jax.tree.leaves(split_model(model, "lora")[1])]


def test_load_sft_restores_the_trained_adapters(tmp_path):
    preset = dataclasses.replace(SMOKE, sft=dataclasses.replace(SMOKE.sft, max_steps=2, batch_size=2))
    model, tok = load_policy(preset)
    sft_train(model, DATA, preset.sft, tokenizer=tok, out_dir=os.path.join(tmp_path, "sft"), progress=False)
    trained = _lora_leaves(model)

    fresh, _ = load_policy(preset)
    before = _lora_leaves(fresh)
    assert any(not np.array_equal(a, b) for a, b in zip(before, trained)), "training did not change the adapters"
    meta = load_sft(fresh, preset, tmp_path)
    assert meta["step"] == 2
    for a, b in zip(_lora_leaves(fresh), trained):
        np.testing.assert_array_equal(a, b)


def test_load_policy_takes_the_training_settings_of_the_preset():
    model, _ = load_policy(dataclasses.replace(SMOKE, frozen_layers=1, remat_layers=False))
    assert (model.config.frozen_layers, model.config.remat_layers) == (1, False)
    assert PRESETS["cpu-demo"].frozen_layers < 30  # SmolLM2 has 30 blocks: some adapters must train


def test_load_sft_without_checkpoint_raises(tmp_path):
    model, _ = load_policy(SMOKE)
    with pytest.raises(FileNotFoundError):
        load_sft(model, SMOKE, tmp_path)


def test_run_mtdrive_rejects_unknown_stage(tmp_path):
    with pytest.raises(ValueError, match="unknown stages"):
        run_mtdrive(SMOKE, tmp_path, evaluate=("after_rl",))


def test_with_seed_sets_every_training_seed():
    p = with_seed(PRESETS["cpu-demo"], 7)
    assert (p.seed, p.sft.seed, p.rl.seed) == (7, 7, 7)
    assert p.eval_seeds == PRESETS["cpu-demo"].eval_seeds  # held-out scenes do not move


def test_rl_and_eval_prompts_match_the_sft_prompts():
    """The RL rollouts and the evaluation must caption scenes exactly as the SFT data does."""
    preset = dataclasses.replace(PRESETS["cpu-demo"], rl=dataclasses.replace(
        PRESETS["cpu-demo"].rl, rollout=dataclasses.replace(PRESETS["cpu-demo"].rl.rollout, caption=CaptionConfig())))
    scenes = stack_scenes([straight_road_scene(scene_id=i, ego_speed=5.0 + i) for i in range(2)])
    sft_prompts = [m[-1]["content"] for m in
                   prompt_conversations(scenes, BuildConfig(prompt=preset.prompt, caption=preset.caption))]
    rl = rl_config(preset, "grpo")
    assert rl.advantage.mode == "grpo"
    assert scene_prompts(scenes, rl.rollout.prompt, rl.rollout.caption) == sft_prompts
    ev = eval_config(preset)
    assert scene_prompts(scenes, ev.prompt, ev.caption) == sft_prompts
    assert ev.sampling.temperature == 0.0 and ev.group_size == 1


def test_compact_caption_shortens_the_prompt():
    scenes = stack_scenes([straight_road_scene(scene_id=0, ego_speed=8.0)])
    text = PromptConfig(perception="text", image_placeholder=False)
    full = scene_prompts(scenes, text)[0]
    compact = scene_prompts(scenes, text, COMPACT_CAPTION)[0]
    assert len(compact) < len(full)
    assert "30 m:" in compact and "10 m:" not in compact


def test_filter_by_length_keeps_short_rows_and_counts_kinds():
    rows = [np.zeros(n) for n in (5, 12, 8, 20, 3)]
    kinds = ["single", "multi", "multi", "multi", "qa"]
    kept, card = filter_by_length(rows, kinds, 10)
    assert [len(r) for r in kept] == [5, 8, 3]
    assert card == {"max_tokens": 10, "single": 1, "multi": 1, "qa": 1}
    assert len(filter_by_length(rows, kinds, None)[0]) == 5
    with pytest.raises(ValueError):
        filter_by_length(rows, kinds, 2)


def test_recovery_rows_join_the_sft_data_and_train_only_the_correction():
    """``sft_recovery`` adds format-recovery rows without changing the other rows, and their
    loss covers the corrected answer only, never the malformed one."""
    from jax_drive.pipelines.mtdrive import build_sft_data
    from jax_drive.rollout import FORMAT_FEEDBACK
    from jax_drive.scenes import generate_scenes
    from jax_drive.text.codec import parse_trajectory

    preset = dataclasses.replace(SMOKE, sft_recovery=3)
    train = generate_scenes(jax.random.key(0), preset.train_scenes)
    _, tok = load_policy(preset)
    rows, card = build_sft_data(preset, train, tok, jax.random.key(1))
    plain, plain_card = build_sft_data(dataclasses.replace(preset, sft_recovery=0), train, tok, jax.random.key(1))
    assert card["recovery"] == 3 and card["kept"]["recovery"] == 3 and "recovery" not in plain_card
    text = [tok.decode(r.ids.tolist(), skip_special_tokens=False) for r in rows]
    recovery = [i for i, t in enumerate(text) if FORMAT_FEEDBACK in t]
    assert len(recovery) == 3
    others = [r for i, r in enumerate(rows) if i not in recovery]
    assert len(others) == len(plain)
    for a, b in zip(others, plain):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.weight, b.weight)
    for i in recovery:
        trained = tok.decode(rows[i].ids[rows[i].weight > 0].tolist(), skip_special_tokens=True)
        after = text[i].split(FORMAT_FEEDBACK)[1]
        assert trained.strip() and trained.strip() in after  # only the answer after the feedback
        assert parse_trajectory(trained).ok
        before = text[i].split(FORMAT_FEEDBACK)[0]
        assert "[PT" in before or "Here is the planning trajectory (" in before  # the malformed answer is there


def test_onpolicy_recovery_continues_sft_on_the_policys_own_failures(tmp_path):
    """``sft_onpolicy_scenes``: the SFT policy (the tiny random model: every answer unusable)
    answers fresh scenes; each failure gives an expert row and a recovery row, as many SFT
    rows are replayed, SFT continues for ``sft_onpolicy_steps`` steps, and the continued
    adapters become the run's SFT policy (``final_sft_dir`` / ``load_sft``). A resumed run
    loads both stages from the journal. With free answers (the smoke reference's unconstrained
    setting): under the smoke preset's trajectory grammar every answer is usable and on-policy
    recovery has nothing to recover."""
    from smoke_reference import UNCONSTRAINED

    from jax_drive.configs import override
    from jax_drive.pipelines.mtdrive import final_sft_dir, onpolicy_checkpoint_dir, sft_checkpoint_dir
    from jax_drive.rl.checkpoint import restore_trainable

    free = override(SMOKE, UNCONSTRAINED["mtdrive"])
    preset = dataclasses.replace(free, sft_onpolicy_scenes=3, sft_onpolicy_steps=3)
    out = tmp_path / "run"
    result = run_mtdrive(preset, out, skip_rl=True, evaluate=(), progress=False, log=lambda msg: None)
    card = result["sft_onpolicy"]["card"]
    assert (card["scenes"], card["unusable"]) == (3, 3) and len(card["scene_ids"]) == 3
    kept = sum(v for k, v in card["kept"].items() if k != "max_tokens")
    assert kept == 6 and card["replay"] == 6  # one replayed SFT row per on-policy row
    assert [r["step"] for r in result["sft_onpolicy"]["history"]] == [1, 2, 3]
    assert result["budget"]["sft_onpolicy_scenes"] == 3
    assert final_sft_dir(out) == onpolicy_checkpoint_dir(out)

    continued, _ = load_policy(preset)
    assert load_sft(continued, preset, out)["step"] == 3  # the SFT stage itself ran 2 steps
    before, _ = load_policy(preset)
    restore_trainable(before, preset.sft.optim, sft_checkpoint_dir(out))
    assert any(not np.array_equal(a, b) for a, b in zip(_lora_leaves(before), _lora_leaves(continued)))

    again = run_mtdrive(preset, out, skip_rl=True, evaluate=(), resume=True, progress=False, log=lambda msg: None)
    assert {"onpolicy_data", "sft_onpolicy"} <= set(again["resumed_stages"])
    assert again["sft_onpolicy"] == result["sft_onpolicy"]

    # a later run that reuses this one's SFT policy gets the continued adapters, and can
    # continue them once more on its own collection (the replay rows are rebuilt)
    reuse = run_mtdrive(preset, tmp_path / "reuse", sft_from=out, skip_rl=True, evaluate=(), progress=False,
                        log=lambda msg: None)
    assert reuse["data_card"]["sft_steps"] == 3 and reuse["sft_onpolicy"]["card"]["replay"] == 6
    assert reuse["data_card"]["sft_checkpoint"] == onpolicy_checkpoint_dir(out)
    assert final_sft_dir(tmp_path / "reuse") == onpolicy_checkpoint_dir(tmp_path / "reuse")
    # one more link: "reuse" trained no SFT stage itself, so the SFT loss curve comes from "run"
    third = run_mtdrive(dataclasses.replace(preset, sft_onpolicy_scenes=0), tmp_path / "third",
                        sft_from=tmp_path / "reuse", skip_rl=True, evaluate=(), progress=False, log=lambda msg: None)
    assert third["data_card"]["sft_checkpoint"] == onpolicy_checkpoint_dir(tmp_path / "reuse")
    assert third["sft_history"] == result["sft_history"] and len(result["sft_history"]) == 2


class _AnswerEngine:
    """Chat engine double for PolicyPredictor: answers prompt i with ``answers[i % len(answers)]``."""

    def __init__(self, answers):
        self.answers = answers

    def generate_chat(self, conversations, params, key):
        return [type("C", (), {"text": self.answers[i % len(self.answers)]})() for i in range(len(conversations))]


def test_onpolicy_data_collects_only_unusable_answers_and_replays_as_many():
    """``build_onpolicy_data``: usable first answers give nothing (no rows, nothing replayed);
    each unusable one gives an expert and a recovery row, followed by as many replayed rows."""
    from jax_drive.pipelines.mtdrive.pipeline import build_onpolicy_data

    preset = dataclasses.replace(SMOKE, sft_onpolicy_scenes=3, sft_max_tokens=None)
    _, tok = load_policy(preset)
    good = "Here is the planning trajectory [PT, " + ", ".join(f"(+{i + 1}.00, 0.00, 0.00)" for i in range(8)) + "]."
    replay = [f"replay {i}" for i in range(10)]  # stands for SFT rows: only picked, never read

    rows, card = build_onpolicy_data(preset, _AnswerEngine([good]), tok, replay, jax.random.key(0))
    assert rows == [] and (card["scenes"], card["unusable"], card["replay"]) == (3, 0, 0)

    rows, card = build_onpolicy_data(preset, _AnswerEngine([good, "I would drive on."]), tok, replay,
                                     jax.random.key(0))
    assert card["unusable"] == 1 and card["replay"] == 2 and len(rows) == 4
    assert all(isinstance(r, str) and r.startswith("replay") for r in rows[2:])
    assert not any(isinstance(r, str) for r in rows[:2])  # the two new rows are tokenised rows


def test_onpolicy_recovery_is_off_by_default_and_validated():
    assert PRESETS["cpu-demo"].sft_onpolicy_scenes == 0 and SMOKE.sft_onpolicy_scenes == 0
    with pytest.raises(ValueError, match="sft_onpolicy_scenes must be >= 0"):
        dataclasses.replace(SMOKE, sft_onpolicy_scenes=-1)
    with pytest.raises(ValueError, match="sft_onpolicy_steps >= 1"):
        dataclasses.replace(SMOKE, sft_onpolicy_steps=0)
