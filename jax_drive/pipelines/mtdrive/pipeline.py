"""MTDrive end to end: SFT warm start -> RL data curation -> mtGRPO -> multi-turn evaluation.

``run_mtdrive(preset, run_dir)`` runs :data:`STAGES` (MTDrive sections 3.2-3.3), each a
top-level function of the run context (:mod:`jax_drive.pipelines.stages`), and returns the
results dict (written as JSON with plots by ``jax-drive train`` / ``experiments/mtdrive.py``):

  scenes          training scenes and held-out evaluation sets (one per evaluation seed)
                  with their PDM-Closed references;
  eval_untrained  greedy multi-turn evaluation of the untrained policy;
  sft_data        single-turn, 2-turn (constant-velocity first turn + PDM feedback),
                  format-recovery and PDM-understanding QA rows, target the expert trajectory;
  sft             SFT (orbax checkpoints every ``sft.checkpoint_every`` steps);
  sft_load        (``sft_from``) the final SFT policy of an earlier run instead of the two above;
  onpolicy_data   (``sft_onpolicy_scenes`` > 0) the SFT policy answers fresh scenes; its
                  unusable answers become expert and format-recovery rows, SFT rows replayed;
  sft_onpolicy    SFT continues on those rows (from here on "the SFT policy" is the continued one);
  eval_sft        evaluation after SFT;
  eval_sft_unconstrained  (constrained presets) the SFT policy's first answers without the
                  trajectory grammar: the format rate the model learnt;
  rl_curation     RL prompt curation with the SFT policy's first turn;
  rl              mtGRPO (or another advantage variant) on the curated scenes;
  eval_rl         evaluation after RL.
Every evaluation uses the same held-out scenes, greedy decoding and the same references, so
the rows of the results table are comparable. With ``resume=True`` finished stages are
loaded from the journal and SFT / RL continue from their latest step checkpoint, so a killed
run ends with the metrics and weights of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.compile_cache import enable_compile_cache
from jax_drive.data.arrays import rows_from_arrays, rows_to_arrays, tree_from_arrays, tree_to_arrays
from jax_drive.data.builders import BuildConfig
from jax_drive.data.sft import curate, onpolicy_rows, sft_rows
from jax_drive.names import MTDRIVE_POLICIES
from jax_drive.pipelines.engines import load_model, make_engine
from jax_drive.pipelines.journal import RunJournal
from jax_drive.pipelines.mtdrive.presets import Preset, engine_spec, eval_config, model_spec, rl_config
from jax_drive.pipelines.mtdrive.report import budget_card, eval_card, examples, stage_line
from jax_drive.pipelines.mtdrive.runs import (
    final_sft_dir,
    onpolicy_checkpoint_dir,
    restore_policy,
    rl_checkpoint_dir,
    run_identity,
    sft_checkpoint_dir,
    sft_history_of,
)
from jax_drive.pipelines.stages import PolicyRef, RunContext, Stage, StageOutput, Workspace, run_stages
from jax_drive.rl.checkpoint import restore_trainable
from jax_drive.rl.grpo import grpo_train
from jax_drive.rl.logging import read_jsonl
from jax_drive.rl.sft import sft_train
from jax_drive.rollout import PolicyPredictor, compute_reference, evaluate_sets
from jax_drive.scenes import GeneratorConfig, generate_scenes, index_scene, straight_road_scene
from jax_drive.types import Scene

EVAL_SEED_OFFSET = 10_000  # held-out scenes use keys disjoint from the training keys
ONPOLICY_SEED_OFFSET = 20_000  # so do the scenes of on-policy recovery
POLICIES = MTDRIVE_POLICIES  # the policies that can be evaluated
TRANSCRIPT_SCENES = 64  # turn logs kept per evaluation (first held-out set) for examples and plots


# ----------------------------------------------------------------------------- helpers
def load_policy(preset: Preset):
    """(model, tokenizer) with LoRA applied when ``preset.lora_rank > 0``."""
    return load_model(model_spec(preset))


def load_engine(preset: Preset):
    """(model, tokenizer, the in-process :class:`JaxEngine` over that model) for rollouts and
    evaluation; the engine decodes with the model's current weights."""
    model, tokenizer = load_policy(preset)
    return model, tokenizer, make_engine(engine_spec(preset), model, tokenizer)


def make_held_out(preset: Preset) -> list[tuple[Scene, np.ndarray]]:
    """[(``preset.eval_scenes`` held-out scenes, their (S, 40, 3) PDM-Closed references) per
    evaluation seed]; independent of the training seed."""
    gen = GeneratorConfig(hard_fraction=preset.hard_fraction)
    held_out = []
    for seed in preset.eval_seeds:
        scenes = generate_scenes(jax.random.key(EVAL_SEED_OFFSET + seed), preset.eval_scenes, gen)
        held_out.append((scenes, np.asarray(compute_reference(scenes))))
    return held_out


def make_scenes(preset: Preset) -> tuple[Scene, list[tuple[Scene, np.ndarray]]]:
    """(training scenes, [(held-out scenes, their (S, 40, 3) references) per evaluation seed])."""
    train = generate_scenes(jax.random.key(preset.seed), preset.train_scenes,
                            GeneratorConfig(hard_fraction=preset.hard_fraction))
    return train, make_held_out(preset)


def build_config(preset: Preset) -> BuildConfig:
    """The SFT data builders' settings: the preset's prompt and caption, the rollouts' format feedback."""
    return BuildConfig(prompt=preset.prompt, caption=preset.caption, format_feedback=eval_config(preset).format_feedback)


def build_sft_data(preset: Preset, train: Scene, tokenizer, key: jax.Array):
    """Tokenised SFT rows of the preset's mix and the data card (:func:`jax_drive.data.sft.sft_rows`)."""
    return sft_rows(train, tokenizer, key, single=preset.sft_single, multi=preset.sft_multi,
                    recovery=preset.sft_recovery, qa_scenes=preset.sft_qa_scenes, build=build_config(preset),
                    train_on=preset.sft.train_on, max_tokens=preset.sft_max_tokens)


def predictor(preset: Preset, engine) -> PolicyPredictor:
    """The policy's greedy first turn, for curation and on-policy recovery (under the
    evaluation's answer grammar: the first answer the RL rollouts will see)."""
    return PolicyPredictor(engine, preset.max_new_tokens, preset.prompt, eval_config(preset).answer_grammar())


def build_onpolicy_data(preset: Preset, engine, tokenizer, replay, key: jax.Array):
    """On-policy recovery rows of the policy in ``engine`` on ``preset.sft_onpolicy_scenes``
    fresh scenes, and their card (:func:`jax_drive.data.sft.onpolicy_rows`)."""
    fresh = generate_scenes(jax.random.key(ONPOLICY_SEED_OFFSET + preset.seed), preset.sft_onpolicy_scenes,
                            GeneratorConfig(hard_fraction=preset.hard_fraction))
    return onpolicy_rows(fresh, predictor(preset, engine), tokenizer, replay, key, build=build_config(preset),
                         format_config=eval_config(preset).format, train_on=preset.sft.train_on,
                         max_tokens=preset.sft_max_tokens)


def curate_scenes(preset: Preset, train: Scene, engine, key: jax.Array) -> tuple[np.ndarray, dict]:
    """RL curation with the policy in ``engine`` over the first ``curation_scenes`` training
    scenes, keeping ``curation_easy_ratio`` easy scenes per hard one: (indices into
    ``train``, statistics)."""
    pool = preset.train_scenes if preset.curation_scenes is None else min(preset.curation_scenes, preset.train_scenes)
    build = BuildConfig(prompt=preset.prompt, caption=preset.caption, easy_ratio=preset.curation_easy_ratio)
    return curate(index_scene(train, np.arange(pool)), predictor(preset, engine), key, build)


def evaluate_policy(engine, tokenizer, held_out, preset: Preset, progress: bool, num_scenes: int | None = None) -> dict:
    """Greedy multi-turn evaluation on every held-out set (:func:`jax_drive.rollout.evaluate_sets`)."""
    return evaluate_sets(engine, tokenizer, held_out, eval_config(preset), seeds=preset.eval_seeds,
                         batch_size=preset.eval_batch, transcripts=TRANSCRIPT_SCENES, num_scenes=num_scenes,
                         progress=progress)


def public_stages(stages: dict[str, dict]) -> dict[str, dict]:
    """Evaluation outcomes without their turn logs and timings (those go elsewhere)."""
    return {name: {k: v for k, v in s.items() if k not in ("transcripts", "seconds", "cpu_seconds")}
            for name, s in stages.items()}


def _keys(preset: Preset) -> tuple[jax.Array, jax.Array]:
    """(SFT data key, RL key) of the training seed."""
    return jax.random.split(jax.random.key(preset.seed + 1))


def _sft_policy(ctx: RunContext) -> PolicyRef:
    source = sft_checkpoint_dir(ctx.run_dir) if ctx.option("sft_from") is None else final_sft_dir(ctx.option("sft_from"))
    return PolicyRef("sft", source, ctx.preset.sft.optim)


def _rl_policy(ctx: RunContext) -> PolicyRef:
    return PolicyRef("rl", rl_checkpoint_dir(ctx.run_dir), rl_config(ctx.preset, ctx.option("advantage")).optim)


def _evaluation(ctx: RunContext, ws: Workspace, title: str, num_scenes: int | None = None) -> StageOutput:
    ws.hold(ctx.policy)
    outcome = evaluate_policy(ws.engine, ws.tokenizer, ctx.values["scenes"][1], ctx.preset, ctx.progress, num_scenes)
    ctx.log(f"[{ctx.preset.name}] " + stage_line(title, outcome))
    return StageOutput(outcome, outcome)


def evaluates(policy: str):
    return lambda ctx: policy in ctx.option("evaluate", POLICIES)


def trains_sft(ctx: RunContext) -> bool:
    return ctx.option("sft_from") is None


def reuses_sft(ctx: RunContext) -> bool:
    return ctx.option("sft_from") is not None


def recovers_onpolicy(ctx: RunContext) -> bool:
    return bool(ctx.preset.sft_onpolicy_scenes)


def has_onpolicy_rows(ctx: RunContext) -> bool:
    return recovers_onpolicy(ctx) and bool(ctx.values.get("onpolicy_data"))


def trains_rl(ctx: RunContext) -> bool:
    return not ctx.option("skip_rl", False)


# ----------------------------------------------------------------------------- stages
def scenes(ctx: RunContext, ws: Workspace) -> StageOutput:
    train, held_out = make_scenes(ctx.preset)
    arrays = tree_to_arrays("train", train)
    for i, (held, refs) in enumerate(held_out):
        arrays.update(tree_to_arrays(f"held_out{i}", held))
        arrays[f"held_out{i}/reference"] = np.asarray(refs)
    return StageOutput((train, held_out), {}, arrays)


def restore_scenes(record: dict, arrays: dict) -> tuple[Scene, list]:
    template = straight_road_scene()
    load = lambda prefix: jax.tree.map(jnp.asarray, tree_from_arrays(prefix, arrays, template))  # noqa: E731
    num_sets = sum(1 for k in arrays if k.startswith("held_out") and k.endswith("/reference"))
    return load("train"), [(load(f"held_out{i}"), arrays[f"held_out{i}/reference"]) for i in range(num_sets)]


def eval_untrained(ctx: RunContext, ws: Workspace) -> StageOutput:
    return _evaluation(ctx, ws, "untrained", ctx.preset.untrained_eval_scenes)


def sft_data(ctx: RunContext, ws: Workspace) -> StageOutput:
    rows, card = build_sft_data(ctx.preset, ctx.values["scenes"][0], ws.tokenizer, _keys(ctx.preset)[0])
    recovery = f"{card['recovery']} recovery, " if card.get("recovery") else ""
    ctx.log(f"[{ctx.preset.name}] SFT data: {card['single']} single, {card['multi']} multi-turn, "
            f"{recovery}{card['qa']} QA; kept {card['kept']}")
    return StageOutput(rows, {"data_card": card}, rows_to_arrays(rows))


def sft(ctx: RunContext, ws: Workspace) -> StageOutput:
    result = sft_train(ws.model, ctx.values["sft_data"], ctx.preset.sft, tokenizer=ws.tokenizer, out_dir=ctx.path("sft"),
                       resume=ctx.resume, progress=ctx.progress)
    ws.trained(_sft_policy(ctx))
    return StageOutput(None, {"steps": int(result.state.step)})


def sft_load(ctx: RunContext, ws: Workspace) -> StageOutput:
    policy = _sft_policy(ctx)
    meta = restore_trainable(ws.model, policy.optim, policy.checkpoint)
    ws.trained(policy)
    source = ctx.option("sft_from")
    ctx.log(f"[{ctx.preset.name}] loaded the SFT policy of {source} ({os.path.relpath(policy.checkpoint)}, "
            f"step {meta['step']})")
    card = {"sft_from": os.fspath(source), "sft_checkpoint": os.fspath(policy.checkpoint), "sft_steps": int(meta["step"])}
    return StageOutput(None, {"data_card": card})


def onpolicy_data(ctx: RunContext, ws: Workspace) -> StageOutput:
    preset = ctx.preset
    ws.hold(ctx.policy)
    replay = ctx.values["sft_data"] if trains_sft(ctx) else build_sft_data(preset, ctx.values["scenes"][0],
                                                                         ws.tokenizer, _keys(preset)[0])[0]
    rows, card = build_onpolicy_data(preset, ws.engine, ws.tokenizer, replay, jax.random.fold_in(_keys(preset)[0], 7))
    ctx.log(f"[{preset.name}] on-policy recovery: {card['unusable']} of {card['scenes']} fresh scenes answered "
            f"unusably -> {len(rows)} rows ({card['replay']} replayed)")
    return StageOutput(rows, {"card": card}, rows_to_arrays(rows) if rows else None)


def restore_onpolicy_data(record: dict, arrays: dict) -> list:
    return rows_from_arrays(arrays) if arrays else []


def sft_onpolicy(ctx: RunContext, ws: Workspace) -> StageOutput:
    ws.hold(ctx.policy)
    config = dataclasses.replace(ctx.preset.sft, max_steps=ctx.preset.sft_onpolicy_steps)
    result = sft_train(ws.model, ctx.values["onpolicy_data"], config, tokenizer=ws.tokenizer,
                       out_dir=ctx.path("sft_onpolicy"), resume=ctx.resume, progress=ctx.progress)
    ws.trained(_onpolicy_policy(ctx))
    return StageOutput(None, {"steps": int(result.state.step)})


def _onpolicy_policy(ctx: RunContext) -> PolicyRef:
    return PolicyRef("sft", onpolicy_checkpoint_dir(ctx.run_dir), ctx.preset.sft.optim)


def eval_sft(ctx: RunContext, ws: Workspace) -> StageOutput:
    return _evaluation(ctx, ws, "after SFT")


def unconstrained_format(engine, tokenizer, held_out, preset: Preset, progress: bool) -> dict:
    """The policy's first answers on every held-out scene decoded without the trajectory
    grammar (greedy): its format rate is what the model learnt, which the grammar hides.
    Returns {"format_rate", "sem", "per_seed": [{"seed", "scenes", "format_rate"}]}."""
    config = dataclasses.replace(eval_config(preset), constrain_answers=False, max_turns=1)
    outcome = evaluate_sets(engine, tokenizer, held_out, config, seeds=preset.eval_seeds,
                            batch_size=preset.eval_batch, transcripts=0, progress=progress)
    return {"format_rate": outcome["mean"]["format_rate"], "sem": outcome["sem"]["format_rate"],
            "per_seed": [{k: s[k] for k in ("seed", "scenes", "format_rate")} for s in outcome["per_seed"]]}


def eval_sft_unconstrained(ctx: RunContext, ws: Workspace) -> StageOutput:
    ws.hold(ctx.policy)
    outcome = unconstrained_format(ws.engine, ws.tokenizer, ctx.values["scenes"][1], ctx.preset, ctx.progress)
    ctx.log(f"[{ctx.preset.name}] after SFT, first answers without the grammar: format rate "
            f"{outcome['format_rate']:.3f} +- {outcome['sem']:.3f}")
    return StageOutput(outcome, outcome)


def constrained_sft_eval(ctx: RunContext) -> bool:
    return evaluates("sft")(ctx) and ctx.preset.constrain_answers


def rl_curation(ctx: RunContext, ws: Workspace) -> StageOutput:
    preset, train = ctx.preset, ctx.values["scenes"][0]
    ws.hold(ctx.policy)
    index, stats = curate_scenes(preset, train, ws.engine, _keys(preset)[1])
    refs = np.asarray(compute_reference(index_scene(train, index)))
    ctx.log(f"[{preset.name}] RL curation kept {len(index)} scenes: {stats.get('category_counts')}")
    return StageOutput((index, refs), {"index": index.tolist(), "curation": stats}, {"references": refs})


def restore_curation(record: dict, arrays: dict) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(record["index"], np.int64), arrays["references"]


def rl(ctx: RunContext, ws: Workspace) -> StageOutput:
    preset, url = ctx.preset, ctx.option("engine_url")
    config = rl_config(preset, ctx.option("advantage"))
    ws.hold(ctx.policy)  # also the reference policy of the KL term
    index, refs = ctx.values["rl_curation"]
    engine, on_step = ws.engine, None
    if url is not None:  # the server gets the policy now and after every step
        from jax_drive.rl.weight_sync import connect_trainer

        engine = connect_trainer(url, ws.model, ws.tokenizer, config.optim.trainable,
                                 ctx.path("rl", "weight_sync"), ctx.option("engine_model"))
        on_step = engine.on_step
    result = grpo_train(ws.model, ws.tokenizer, index_scene(ctx.values["scenes"][0], index), config, engine=engine,
                        references=refs, out_dir=ctx.path("rl"), resume=ctx.resume, progress=ctx.progress,
                        on_step=on_step)
    ws.trained(_rl_policy(ctx))
    if url is not None:
        gaps = [r.logprob_gap for r in engine.history if r.logprob_gap is not None]
        ctx.log(f"[{preset.name}] RL rollouts on {url}: {len(engine.history)} pushes ({engine.served_model}), "
                f"served-vs-trainer log-prob gap <= {max(gaps) if gaps else float('nan'):.1e} "
                "(rl/weight_sync/history.jsonl)")
    return StageOutput(None, {"steps": int(result.state.step)})


def eval_rl(ctx: RunContext, ws: Workspace) -> StageOutput:
    return _evaluation(ctx, ws, f"after RL ({rl_config(ctx.preset, ctx.option('advantage')).advantage.mode})")


STAGES = (
    Stage("scenes", scenes, restore=restore_scenes),
    Stage("eval_untrained", eval_untrained, when=evaluates("untrained")),
    Stage("sft_data", sft_data, restore=lambda record, arrays: rows_from_arrays(arrays), when=trains_sft),
    Stage("sft", sft, when=trains_sft, policy=_sft_policy),
    Stage("sft_load", sft_load, when=reuses_sft, journaled=False, policy=_sft_policy),
    Stage("onpolicy_data", onpolicy_data, restore=restore_onpolicy_data, when=recovers_onpolicy),
    Stage("sft_onpolicy", sft_onpolicy, when=has_onpolicy_rows, policy=_onpolicy_policy),
    Stage("eval_sft", eval_sft, when=evaluates("sft")),
    Stage("eval_sft_unconstrained", eval_sft_unconstrained, when=constrained_sft_eval),
    Stage("rl_curation", rl_curation, restore=restore_curation, when=trains_rl),
    Stage("rl", rl, when=trains_rl, policy=_rl_policy),
    Stage("eval_rl", eval_rl, when=lambda ctx: trains_rl(ctx) and evaluates("rl")(ctx)),
)


# ----------------------------------------------------------------------------- pipeline
def check_options(preset: Preset, evaluate: Sequence[str], engine_url: str | None) -> None:
    """Raises ValueError for an unknown stage to evaluate or an image preset with ``engine_url``."""
    unknown = set(evaluate) - set(POLICIES)
    if unknown:
        raise ValueError(f"unknown stages {sorted(unknown)}; choose from {POLICIES}")
    if engine_url is not None and preset.prompt.uses_images:
        raise ValueError(f"preset {preset.name!r} prompts with images; remote rollouts (engine_url) are text only")


def run_mtdrive(preset: Preset, out_dir: str | os.PathLike, *, advantage: str | None = None,
                skip_rl: bool = False, sft_from: str | os.PathLike | None = None,
                evaluate: Sequence[str] = POLICIES, resume: bool = False, progress: bool = True,
                log=None, engine_url: str | None = None, engine_model: str | None = None) -> dict[str, Any]:
    """Runs :data:`STAGES`; returns the results dict (without writing it).

    Args:
      preset: experiment settings.
      out_dir: the run directory (:mod:`jax_drive.pipelines.mtdrive.runs`).
      advantage: overrides the preset's advantage estimator ('grpo', 'mtgrpo_intra', 'mtgrpo_cross').
      skip_rl: stop after SFT (and its evaluation).
      sft_from: an earlier run directory of the same preset: its final SFT policy is loaded
        instead of training one (e.g. across ablation variants).
      evaluate: the policies evaluated on the held-out scenes (subset of 'untrained', 'sft', 'rl').
      resume: continue the run in ``out_dir``; without it, ``out_dir`` must not hold a run.
      progress: tqdm bars. log: callable(str) for progress lines (default print).
      engine_url: RL rollouts are generated by the OpenAI-compatible server at this URL
        (``jax-drive serve`` or vLLM serving the preset's base model), which gets the policy
        after every step (:func:`jax_drive.rl.weight_sync.connect_trainer`). None: the
        in-process sampler. ``engine_model``: the server's name of the base model.
    Raises:
      ValueError for an unknown stage or an image preset with ``engine_url``;
      :class:`jax_drive.pipelines.journal.RunDirError` when ``out_dir`` cannot be used as asked.
    """
    enable_compile_cache()
    check_options(preset, evaluate, engine_url)
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    journal = RunJournal(out_dir, run_identity(preset, advantage, sft_from), resume)
    options = {"advantage": advantage, "skip_rl": skip_rl, "sft_from": sft_from, "evaluate": tuple(evaluate),
               "engine_url": engine_url, "engine_model": engine_model}
    ctx = RunContext(preset, out_dir, options, resume=resume, progress=progress,
                     log=log or (lambda msg: print(msg, flush=True)))
    if "untrained" in evaluate:
        k = min(preset.untrained_eval_scenes or preset.eval_scenes, preset.eval_scenes)
        ctx.log(f"[{preset.name}] evaluating the untrained policy on {len(preset.eval_seeds)} x {k} held-out scenes")
    ws = Workspace(lambda: loaded_engine(preset, journal), restore_policy)
    ctx = run_stages(STAGES, ctx, ws, journal)
    return mtdrive_results(ctx, journal)


def loaded_engine(preset: Preset, journal: RunJournal):
    """:func:`load_engine`, timed as the journal's ``load`` lap."""
    loaded = load_engine(preset)
    journal.lap("load")
    return loaded


def mtdrive_results(ctx: RunContext, journal: RunJournal) -> dict[str, Any]:
    """The results dict of a finished run (what ``results.json`` holds, plus private keys
    with the turn logs and held-out scenes for plots)."""
    preset = ctx.preset
    stages = {p: ctx.values[f"eval_{p}"] for p in POLICIES if ctx.has(f"eval_{p}")}
    rl_cfg = rl_config(preset, ctx.option("advantage"))
    onpolicy: dict = {}
    if ctx.has("onpolicy_data"):
        onpolicy = {"card": ctx.records["onpolicy_data"]["card"]}
        if ctx.has("sft_onpolicy"):
            onpolicy["history"] = read_jsonl(ctx.path("sft_onpolicy", "metrics.jsonl"))
    if ctx.has("sft"):
        sft_history, data_card = read_jsonl(ctx.path("sft", "metrics.jsonl")), ctx.records["sft_data"]["data_card"]
    else:
        sft_history, data_card = sft_history_of(ctx.option("sft_from")), ctx.records["sft_load"]["data_card"]
    return {
        "preset": preset.name,
        "model": preset.model,
        "seed": preset.seed,
        "advantage": rl_cfg.advantage.mode if trains_rl(ctx) else None,
        "eval": eval_card(preset),
        "budget": budget_card(preset, rl_cfg),
        "stages": public_stages(stages),
        "sft_history": sft_history,
        "rl_history": read_jsonl(ctx.path("rl", "metrics.jsonl")) if ctx.has("rl") else [],
        "data_card": data_card,
        "rl_curation": ctx.records["rl_curation"]["curation"] if ctx.has("rl_curation") else {},
        "sft_unconstrained": ctx.values["eval_sft_unconstrained"] if ctx.has("eval_sft_unconstrained") else None,
        "sft_onpolicy": onpolicy,
        "timings_s": journal.timings,
        "cpu_timings_s": journal.cpu_timings,
        "resumed_stages": journal.resumed,
        "examples": {name: examples(s["transcripts"]) for name, s in stages.items()},
        "_transcripts": {name: s["transcripts"] for name, s in stages.items()},
        "_held_out": ctx.values["scenes"][1],
    }
