"""The small-model presets answer under grammars by default, with budgets that hold them; the
paper presets keep the papers' free answers; the smoke reference's override turns it off."""

from __future__ import annotations

import pytest
from smoke_reference import UNCONSTRAINED

from jax_drive.configs import override
from jax_drive.models.tiny import tiny_policy
from jax_drive.pipelines.interdrive import presets as ID
from jax_drive.pipelines.mtdrive import presets as MT
from jax_drive.pipelines.talking_vehicles import presets as TV
from jax_drive.sampling import JaxEngine
from jax_drive.sampling.grammar import GrammarError, actor_reply_grammar, check_budget, consensus_grammar
from jax_drive.sampling.grammar.rows import engine_grammar


@pytest.fixture(scope="module")
def engine():
    """The smoke presets' engine: the tiny model over the byte tokenizer; grammars compile as
    the pipelines compile them (``engine_grammar``: the engine's cache, its stop ids)."""
    model, _, tokenizer = tiny_policy(seed=0, lora_rank=None)
    return JaxEngine(model, tokenizer)


def test_which_presets_constrain():
    assert {n for n, p in MT.PRESETS.items() if p.constrain_answers} == {"smoke", "smoke-vlm", "tiny", "cpu-demo",
                                                                          "cpu-study"}
    assert {n for n, p in TV.PRESETS.items() if p.agent.constrain_answers} == {"smoke", "cpu-demo"}
    assert {n for n, p in ID.PRESETS.items() if p.constrain_answers} == {"smoke", "tiny-rl", "cpu-demo"}
    for name, preset in MT.PRESETS.items():  # evaluation, curation and RL rollouts follow the preset
        assert MT.eval_config(preset).constrain_answers == MT.rl_config(preset).rollout.constrain_answers == \
            preset.constrain_answers, name


def test_mtdrive_curation_predicts_under_the_evaluation_grammar():
    from jax_drive.pipelines.mtdrive.pipeline import predictor

    for name in ("smoke", "paper"):
        preset = MT.PRESETS[name]
        grammar = predictor(preset, engine=None).params.grammar
        assert grammar == MT.eval_config(preset).answer_grammar() and (grammar is None) == (name == "paper")


def test_mtdrive_smoke_budgets_hold_the_trajectory_grammar(engine):
    for name in ("smoke", "smoke-vlm", "tiny"):  # the tiny-1m model has the same byte tokenizer
        preset = MT.PRESETS[name]
        compiled = engine_grammar(engine, MT.eval_config(preset).answer_grammar())
        check_budget(compiled, MT.eval_config(preset).sampling.max_new_tokens)
        check_budget(compiled, MT.rl_config(preset).rollout.sampling.max_new_tokens)
        with pytest.raises(GrammarError):  # the unconstrained budget could not hold it
            check_budget(compiled, UNCONSTRAINED["mtdrive"]["max_new_tokens"])


def test_talking_vehicles_smoke_budget_comes_from_the_grammar(engine):
    from jax_drive.coop.agent import LanguagePolicy

    agent = TV.PRESETS["smoke"].agent
    policy = LanguagePolicy(engine, agent)
    shortest = engine_grammar(engine, agent.answer_grammar()).min_tokens
    assert policy.sampling.grammar == agent.answer_grammar() and shortest == 32  # {"command": "go", "message": ""}
    # + the longest command's 15 extra characters ("change lane right") + the message cap + the stop token
    assert policy.sampling.max_new_tokens == shortest + 15 + agent.max_message_chars + 1 == 64


def test_interdrive_smoke_budgets_hold_the_negotiation_grammars(engine):
    from jax_drive.coop.negotiation.prompts import MAX_WORDS

    preset = ID.PRESETS["smoke"]
    check_budget(engine_grammar(engine, actor_reply_grammar(MAX_WORDS)), preset.actor_tokens)
    consensus = engine_grammar(engine, consensus_grammar())
    check_budget(consensus, preset.consensus_tokens)
    with pytest.raises(GrammarError):
        check_budget(consensus, UNCONSTRAINED["interdrive"]["consensus_tokens"])


def test_the_smoke_reference_override_is_the_unconstrained_setting():
    mt = override(MT.PRESETS["smoke"], UNCONSTRAINED["mtdrive"])
    assert not mt.constrain_answers and MT.rl_config(mt).rollout.answer_grammar() is None
    assert mt.max_new_tokens == MT.rl_config(mt).rollout.sampling.max_new_tokens == 24
    assert not override(TV.PRESETS["smoke"], UNCONSTRAINED["talking_vehicles"]).agent.constrain_answers
    interdrive = override(ID.PRESETS["smoke"], UNCONSTRAINED["interdrive"])
    assert not interdrive.constrain_answers and interdrive.consensus_tokens == 8


def test_the_sft_policys_unconstrained_format_is_measured_without_the_grammar(engine):
    """The constrained presets also evaluate the SFT policy's first answers without the
    trajectory grammar: the random model then writes no usable trajectory (format 0), while
    under the grammar every answer is in format."""
    from jax_drive.pipelines.mtdrive.pipeline import (constrained_sft_eval, evaluate_policy, make_held_out,
                                                      unconstrained_format)
    from jax_drive.pipelines.stages import RunContext

    preset = MT.PRESETS["smoke"]
    held_out = make_held_out(preset)
    free = unconstrained_format(engine, engine.tokenizer, held_out, preset, progress=False)
    assert free["format_rate"] == 0.0 and free["sem"] == 0.0
    assert free["per_seed"] == [{"seed": 0, "scenes": preset.eval_scenes, "format_rate": 0.0}]
    assert evaluate_policy(engine, engine.tokenizer, held_out, preset, progress=False)["mean"]["format_rate"] == 1.0
    ctx = lambda p, evaluate=("sft",): RunContext(p, "unused", {"evaluate": evaluate})  # noqa: E731
    assert constrained_sft_eval(ctx(preset))
    assert not constrained_sft_eval(ctx(MT.PRESETS["paper"]))  # free answers: nothing extra to measure
    assert not constrained_sft_eval(ctx(preset, ("rl",)))
