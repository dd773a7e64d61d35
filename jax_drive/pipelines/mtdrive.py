"""MTDrive end to end: SFT warm start -> RL data curation -> mtGRPO -> multi-turn evaluation.

This is jax-drive's main job. ``run_mtdrive(preset, out_dir)`` ties together the scene
generator, the dataset builders, the Flax policy, the jitted sampler, the batched PDM scorer
and the (mt)GRPO trainer, and returns a results dict (written as JSON with plots by
``jax-drive train`` / ``experiments/mtdrive.py``).

Stages (MTDrive sections 3.2-3.3), each recorded in the run directory's journal
(:mod:`jax_drive.pipelines.journal`) when it finishes:
  scenes          training scenes and held-out evaluation scene sets (one per evaluation
                  seed) with their PDM-Closed references;
  eval_untrained  greedy multi-turn evaluation of the untrained policy;
  sft_data        single-turn + 2-turn (constant-velocity first turn + PDM feedback) + mock
                  multi-turn + PDM-understanding QA data, target always the expert
                  trajectory, tokenised;
  sft             SFT (orbax checkpoints every ``sft.checkpoint_every`` steps);
  onpolicy_data   (``sft_onpolicy_scenes`` > 0) the SFT policy answers fresh scenes; its
                  unusable answers become expert and format-recovery rows, with SFT rows
                  replayed beside them;
  sft_onpolicy    SFT continues on those rows (checkpoints in ``sft_onpolicy/``; from here
                  on "the SFT policy" is the continued one);
  eval_sft        evaluation after SFT;
  rl_curation     RL prompt curation with the SFT policy's first turn (categories 1-3);
  rl              mtGRPO (or another advantage variant) on the curated scenes (checkpoints
                  every ``rl.checkpoint_every`` steps);
  eval_rl         evaluation after RL.
With ``resume=True`` a finished stage is loaded from the journal instead of run again, and
SFT / RL continue from their latest step checkpoint, so a killed run ends with the metrics
and weights of an uninterrupted one. Every evaluation uses the same held-out scenes, greedy
decoding and the same PDM-Closed references, so the results table's rows are comparable.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_drive.compile_cache import enable_compile_cache
from jax_drive.data.builders import (
    BuildConfig,
    ConstantVelocityPredictor,
    build_multi,
    build_qa,
    build_recovery,
    build_rl,
    build_self_recovery,
    build_single,
)
from jax_drive.models.image_processing import ProcessedImage
from jax_drive.pipelines.journal import (
    RunJournal,
    ragged_from_arrays,
    ragged_to_arrays,
    tree_from_arrays,
    tree_to_arrays,
)
from jax_drive.pipelines.presets import BUDGET_FIELDS, PRESETS, Preset, eval_config, rl_config, with_seed
from jax_drive.pipelines.report import budget_card, eval_card, examples, stage_line
from jax_drive.rl.batching import TokenRow, chat_samples, tokenize_chat, with_images
from jax_drive.rl.checkpoint import committed_steps, restore_trainable
from jax_drive.rl.grpo import grpo_train
from jax_drive.rl.logging import read_jsonl
from jax_drive.rl.optim import OptimConfig
from jax_drive.rl.sft import sft_train
from jax_drive.rl.weight_sync import connect_trainer
from jax_drive.rollout import compute_reference, evaluate_multiturn, select_scenes, summarize
from jax_drive.rollout.images import prompt_image_inputs
from jax_drive.sampling import JaxEngine, SamplingParams
from jax_drive.sampling.sampler import SamplerConfig
from jax_drive.scenes import GeneratorConfig, generate_scenes, index_scene, straight_road_scene
from jax_drive.text.prompts import PromptConfig
from jax_drive.types import Scene

EVAL_SEED_OFFSET = 10_000  # held-out scenes use keys disjoint from the training keys
ONPOLICY_SEED_OFFSET = 20_000  # so do the scenes of on-policy recovery
STAGES = ("untrained", "sft", "rl")  # the policies that can be evaluated
TRANSCRIPT_SCENES = 64  # turn logs kept per evaluation (first held-out set) for examples and plots
SUMMARY_KEYS = ("pdms_first", "pdms_final", "format_rate", "turns_mean", "final_nc", "final_dac", "final_ttc",
                "final_ep", "final_comfort")


def load_policy(preset: Preset):
    """(model, tokenizer) with LoRA applied when ``preset.lora_rank > 0``."""
    from flax import nnx

    if preset.model == "tiny":
        from jax_drive.models.tiny import tiny_policy

        model, _, tokenizer = tiny_policy(seed=preset.seed, lora_rank=preset.lora_rank or None)
    elif preset.model == "tiny-vlm":
        from jax_drive.models.tiny import tiny_vlm_policy

        model, _, tokenizer = tiny_vlm_policy(seed=preset.seed, lora_rank=preset.lora_rank or None)
    else:
        from jax_drive.models import load_pretrained
        from jax_drive.models.lora import apply_lora

        model, _, tokenizer = load_pretrained(preset.model)
        if preset.lora_rank:
            apply_lora(model, rank=preset.lora_rank, alpha=preset.lora_alpha, rngs=nnx.Rngs(preset.seed + 1))
    model.config = dataclasses.replace(model.config, remat_layers=preset.remat_layers,
                                       frozen_layers=preset.frozen_layers)
    return model, tokenizer


def load_engine(preset: Preset):
    """(model, tokenizer, the in-process :class:`JaxEngine` over that model) for rollouts and
    evaluation; the engine decodes with the model's current weights."""
    model, tokenizer = load_policy(preset)
    buckets = tuple(range(preset.prompt_bucket, 32_768 + 1, preset.prompt_bucket))
    engine = JaxEngine(model, tokenizer, SamplerConfig(prompt_buckets=buckets), max_batch_size=preset.eval_batch,
                       prompt_lookup=preset.prompt_lookup)
    return model, tokenizer, engine


class PolicyPredictor:
    """First-turn predictor backed by a language-model engine (greedy), for RL curation.
    ``prompt``: the prompts' settings; when they hold images (``uses_images``) the scenes'
    camera images go with them (the engine's tokenizer must be an image tokenizer)."""

    name = "policy"

    def __init__(self, engine, max_new_tokens: int, prompt: PromptConfig | None = None):
        self.engine = engine
        self.params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
        self.prompt = prompt

    def __call__(self, scene: Scene, key: jax.Array, prompts: Sequence[list[dict]]) -> list[str]:
        if self.prompt is None or not self.prompt.uses_images:
            return [c.text for c in self.engine.generate_chat(list(prompts), self.params, key)]
        tok = self.engine.tokenizer
        ids = [tok.encode(tok.apply_chat_template(p, add_generation_prompt=True)) for p in prompts]
        ids, images = prompt_image_inputs(tok, scene, self.prompt, None, ids)
        return [c.text for c in self.engine.generate(ids, self.params, key, images=images)]


def sft_checkpoint_dir(run_dir: str | os.PathLike) -> str:
    """Where ``run_mtdrive(preset, run_dir)`` saves the SFT state (orbax)."""
    return os.path.join(os.fspath(run_dir), "sft", "checkpoints")


def rl_checkpoint_dir(run_dir: str | os.PathLike) -> str:
    """Where ``run_mtdrive(preset, run_dir)`` saves the mtGRPO state (orbax)."""
    return os.path.join(os.fspath(run_dir), "rl", "checkpoints")


def onpolicy_checkpoint_dir(run_dir: str | os.PathLike) -> str:
    """Where the on-policy recovery continuation of SFT saves its state (orbax)."""
    return os.path.join(os.fspath(run_dir), "sft_onpolicy", "checkpoints")


def final_sft_dir(run_dir: str | os.PathLike) -> str:
    """The checkpoint directory of a run's final SFT policy: the on-policy continuation's
    when the run has one, else the SFT stage's; a run that loaded its SFT policy from
    another (``sft_from`` in its ``run.json``) and trained none of its own passes the
    question on to that run (e.g. an on-policy stage that found nothing to correct). When
    no run of the lineage has one: the SFT stage's directory of ``run_dir``."""
    for run in sft_lineage(run_dir):
        for checkpoints in (onpolicy_checkpoint_dir(run), sft_checkpoint_dir(run)):
            if committed_steps(checkpoints):
                return checkpoints
    return sft_checkpoint_dir(run_dir)


def sft_lineage(run_dir: str | os.PathLike) -> list[str]:
    """``run_dir``, then the run it took its SFT policy from (``sft_from`` in its
    ``run.json``), then that run's source, ... (each once: runs that name each other end
    the list)."""
    lineage = [os.fspath(run_dir)]
    seen = {os.path.abspath(run_dir)}
    while True:
        try:
            with open(os.path.join(lineage[-1], "run.json")) as f:
                source = json.load(f).get("sft_from")
        except (OSError, ValueError, AttributeError):
            return lineage
        if not isinstance(source, str) or os.path.abspath(source) in seen:
            return lineage
        seen.add(os.path.abspath(source))
        lineage.append(source)


def load_sft(model, preset: Preset, run_dir: str | os.PathLike) -> dict:
    """Loads the trained (LoRA) params of an earlier run's final SFT policy (see
    :func:`final_sft_dir`) into ``model`` in place.

    The checkpoint must come from the same model, LoRA rank and trainable set. Returns the
    checkpoint's meta (step, data position).
    """
    return restore_trainable(model, preset.sft.optim, final_sft_dir(run_dir))


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


# ----------------------------------------------------------------------------- stages
def make_scenes(preset: Preset) -> tuple[Scene, list[tuple[Scene, np.ndarray]]]:
    """(training scenes, [(held-out scenes, their (S, 40, 3) references) per evaluation seed])."""
    train = generate_scenes(jax.random.key(preset.seed), preset.train_scenes,
                            GeneratorConfig(hard_fraction=preset.hard_fraction))
    return train, make_held_out(preset)


def make_held_out(preset: Preset) -> list[tuple[Scene, np.ndarray]]:
    """[(``preset.eval_scenes`` held-out scenes, their (S, 40, 3) PDM-Closed references) per
    evaluation seed]; independent of the training seed."""
    gen = GeneratorConfig(hard_fraction=preset.hard_fraction)
    held_out = []
    for seed in preset.eval_seeds:
        scenes = generate_scenes(jax.random.key(EVAL_SEED_OFFSET + seed), preset.eval_scenes, gen)
        held_out.append((scenes, np.asarray(compute_reference(scenes))))
    return held_out


def build_sft_data(preset: Preset, train: Scene, tokenizer, key: jax.Array) -> tuple[list[TokenRow], dict]:
    """Tokenised SFT rows (single-turn, multi-turn, QA; filtered by length) and the data card."""
    build = BuildConfig(prompt=preset.prompt, caption=preset.caption,
                        format_feedback=eval_config(preset).format_feedback)
    k_multi, k_qa = jax.random.split(key)
    n1, n2, n3 = preset.sft_single, preset.sft_multi, preset.sft_recovery
    single = build_single(index_scene(train, np.arange(0, n1) % preset.train_scenes), build)
    multi, multi_stats = build_multi(index_scene(train, np.arange(n1, n1 + n2) % preset.train_scenes),
                                     ConstantVelocityPredictor(), k_multi, build)
    # recovery scenes follow the multi-turn ones; their key is new so that the other kinds
    # (and runs without recovery rows) stay as they were
    recovery_scenes = index_scene(train, np.arange(n1 + n2, n1 + n2 + n3) % preset.train_scenes)
    recovery, recovery_counts = build_recovery(recovery_scenes, jax.random.fold_in(key, 3), build) if n3 else ([], {})
    qa, qa_counts = build_qa(index_scene(train, np.arange(preset.sft_qa_scenes)), k_qa, build)
    card = {"single": len(single), "multi": len(multi), "qa": len(qa), "multi_stats": multi_stats,
            "qa_counts": qa_counts}
    if n3:
        card.update(recovery=len(recovery), recovery_counts=recovery_counts)
    records = single + multi + recovery + qa
    kinds = ["single"] * len(single) + ["multi"] * len(multi) + ["recovery"] * len(recovery) + ["qa"] * len(qa)
    kept, card["kept"] = filter_by_length(tokenize_records(records, tokenizer, preset.sft.train_on), kinds,
                                          preset.sft_max_tokens)
    return kept, card


def tokenize_records(records: Sequence[dict], tokenizer, train_on: str) -> list[TokenRow]:
    """Builder records -> SFT rows (a record's own ``train_on`` wins over ``train_on``)."""
    processed: dict[int, Any] = {}  # one preprocessing per camera frame: the rows of a scene share it
    return [with_images(tokenize_chat(tokenizer, m, own),
                        [processed.setdefault(id(im), tokenizer.preprocess([im])[0]) for im in r.get("images", ())],
                        tokenizer)
            for (m, own), r in zip(chat_samples(records, train_on), records)]


def build_onpolicy_data(preset: Preset, engine, tokenizer, replay: Sequence[TokenRow],
                        key: jax.Array) -> tuple[list[TokenRow], dict]:
    """On-policy recovery rows (see ``Preset.sft_onpolicy_scenes``) and their card.

    The policy in ``engine`` answers the first turn of ``preset.sft_onpolicy_scenes`` fresh
    scenes greedily; each unusable answer gives an expert row and a recovery row
    (:func:`jax_drive.data.builders.build_self_recovery`); as many rows drawn from
    ``replay`` (the SFT data; with ``key``) follow, so the continuation keeps the rest.
    Empty rows when every answer is usable.
    """
    rollout = eval_config(preset)
    scenes = generate_scenes(jax.random.key(ONPOLICY_SEED_OFFSET + preset.seed), preset.sft_onpolicy_scenes,
                             GeneratorConfig(hard_fraction=preset.hard_fraction))
    build = BuildConfig(prompt=preset.prompt, caption=preset.caption, format_feedback=rollout.format_feedback)
    k_answer, k_replay = jax.random.split(key)
    records, stats = build_self_recovery(scenes, PolicyPredictor(engine, preset.max_new_tokens, preset.prompt),
                                         k_answer, build, rollout.format)
    if not records:  # every answer was usable: nothing to continue on
        return [], {**stats, "kept": {}, "replay": 0}
    rows, kept = filter_by_length(tokenize_records(records, tokenizer, preset.sft.train_on),
                                  [r["kind"] for r in records], preset.sft_max_tokens)
    pick = np.sort(np.asarray(jax.random.permutation(k_replay, len(replay)))[:len(rows)])
    return rows + [replay[int(i)] for i in pick], {**stats, "kept": kept, "replay": len(pick)}


def rows_to_arrays(rows: Sequence[TokenRow]) -> dict[str, np.ndarray]:
    """SFT rows as journal arrays: ids and weights, and their images stored once each (rows
    of a scene share their processed camera image)."""
    arrays = {**ragged_to_arrays("ids", [r.ids for r in rows]), **ragged_to_arrays("weight", [r.weight for r in rows])}
    pool: dict[int, Any] = {}  # id -> image, in first-seen order
    for r in rows:
        for im in r.images:
            pool.setdefault(id(im), im)
    if pool:
        index = {key: i for i, key in enumerate(pool)}
        arrays.update(ragged_to_arrays("pixels", [im.pixel_values.reshape(-1) for im in pool.values()]))
        arrays["image_grid"] = np.stack([np.asarray(im.grid_thw, np.int64) for im in pool.values()])
        arrays.update(ragged_to_arrays("row_images", [np.asarray([index[id(im)] for im in r.images], np.int64)
                                                      for r in rows]))
    return arrays


def rows_from_arrays(arrays: dict[str, np.ndarray]) -> list[TokenRow]:
    """Inverse of :func:`rows_to_arrays`."""
    ids, weight = ragged_from_arrays("ids", arrays), ragged_from_arrays("weight", arrays)
    if "image_grid" not in arrays:
        return [TokenRow(i, w) for i, w in zip(ids, weight)]
    pool = [ProcessedImage(p.reshape(int(np.prod(g)), -1).astype(np.float32), g)
            for p, g in zip(ragged_from_arrays("pixels", arrays), arrays["image_grid"])]
    return [TokenRow(i, w, tuple(pool[k] for k in idx))
            for i, w, idx in zip(ids, weight, ragged_from_arrays("row_images", arrays))]


def curate(preset: Preset, train: Scene, engine, key: jax.Array) -> tuple[np.ndarray, dict]:
    """RL prompt curation with the current policy's greedy first turn: (indices into the
    candidate pool = the first ``curation_scenes`` training scenes, curation statistics)."""
    pool = preset.train_scenes if preset.curation_scenes is None else min(preset.curation_scenes,
                                                                          preset.train_scenes)
    candidates = index_scene(train, np.arange(pool))
    records, curation = build_rl(candidates, PolicyPredictor(engine, preset.max_new_tokens, preset.prompt), key,
                                 BuildConfig(prompt=preset.prompt, caption=preset.caption,
                                             easy_ratio=preset.curation_easy_ratio))
    chosen = np.array([r["scene_id"] for r in records], dtype=np.int64)
    scene_ids = np.asarray(candidates.scene_id)
    index = np.flatnonzero(np.isin(scene_ids, chosen)) if len(chosen) else np.arange(pool)
    return index, curation


def evaluate_policy(engine, tokenizer, held_out: list[tuple[Scene, np.ndarray]], preset: Preset, progress: bool,
                    num_scenes: int | None = None) -> dict:
    """Greedy multi-turn evaluation on every held-out set (its first ``num_scenes`` scenes when
    given): per-seed summaries, their mean and standard error, PDMS by turn budget, and the
    turn logs of the first set's first ``TRANSCRIPT_SCENES`` scenes.

    The sets are pooled into one rollout call (``preset.eval_batch`` scenes per batch), so
    the sampler's power-of-two batch padding is paid once, not per set; decoding is greedy,
    so the result does not depend on the PRNG key."""
    sets = []
    for scenes, refs in held_out:
        if num_scenes is not None:
            idx = np.arange(min(num_scenes, len(refs)))
            scenes, refs = index_scene(scenes, idx), refs[idx]
        sets.append((scenes, np.asarray(refs)))
    pooled = jax.tree.map(lambda *a: np.concatenate([np.asarray(x) for x in a]), *[s for s, _ in sets])
    _, result = evaluate_multiturn(engine, tokenizer, pooled, eval_config(preset), jax.random.key(0),
                                   references=np.concatenate([r for _, r in sets]),
                                   batch_size=preset.eval_batch, progress=progress)
    per_seed, start = [], 0
    for seed, (_, refs) in zip(preset.eval_seeds, sets):
        part = select_scenes(result, np.arange(start, start + len(refs)))
        start += len(refs)
        per_seed.append({"seed": seed, "scenes": int(len(refs)), **summarize(part)})
    mean = {k: float(np.mean([s[k] for s in per_seed])) for k in SUMMARY_KEYS}
    sem = {k: float(np.std([s[k] for s in per_seed], ddof=1) / np.sqrt(len(per_seed))) if len(per_seed) > 1 else 0.0
           for k in SUMMARY_KEYS}
    by_budget = np.mean([s["pdms_by_budget"] for s in per_seed], axis=0).tolist()
    first = min(len(sets[0][1]), TRANSCRIPT_SCENES)
    return {"mean": mean, "sem": sem, "pdms_by_budget": by_budget, "per_seed": per_seed,
            "transcripts": [result.turn_log(s) for s in range(first)]}


def _scene_arrays(train: Scene, held_out: list[tuple[Scene, np.ndarray]]) -> dict[str, np.ndarray]:
    arrays = tree_to_arrays("train", train)
    for i, (scenes, refs) in enumerate(held_out):
        arrays.update(tree_to_arrays(f"held_out{i}", scenes))
        arrays[f"held_out{i}/reference"] = np.asarray(refs)
    return arrays


def _scenes_from_arrays(arrays: dict[str, np.ndarray], num_sets: int):
    template = straight_road_scene()
    load = lambda prefix: jax.tree.map(jnp.asarray, tree_from_arrays(prefix, arrays, template))  # noqa: E731
    return load("train"), [(load(f"held_out{i}"), arrays[f"held_out{i}/reference"]) for i in range(num_sets)]


def public_stages(stages: dict[str, dict]) -> dict[str, dict]:
    """Evaluation outcomes without their turn logs and timings (those go elsewhere)."""
    return {name: {k: v for k, v in s.items() if k not in ("transcripts", "seconds", "cpu_seconds")}
            for name, s in stages.items()}


def run_identity(preset: Preset, advantage: str | None, sft_from: str | os.PathLike | None) -> dict:
    """What a resumed run must share with the run it continues (everything that changes results)."""
    return {"pipeline": "mtdrive", "preset": dataclasses.asdict(preset), "advantage": advantage,
            "sft_from": None if sft_from is None else os.path.abspath(os.fspath(sft_from))}


# ----------------------------------------------------------------------------- pipeline
def run_mtdrive(preset: Preset, out_dir: str | os.PathLike, *, advantage: str | None = None,
                skip_rl: bool = False, sft_from: str | os.PathLike | None = None,
                evaluate: Sequence[str] = STAGES, resume: bool = False, progress: bool = True,
                log=None, engine_url: str | None = None, engine_model: str | None = None) -> dict[str, Any]:
    """Runs the whole pipeline; returns the results dict (without writing it).

    Args:
      preset: experiment settings.
      out_dir: the run directory: journal (``run.json``, ``stages/``), SFT / RL metrics and
        checkpoints (``sft/``, ``rl/``).
      advantage: overrides the preset's advantage estimator ('grpo', 'mtgrpo_intra', 'mtgrpo_cross').
      skip_rl: stop after SFT (and its evaluation).
      sft_from: an earlier run directory of the same preset: its SFT checkpoint is loaded
        instead of training (the SFT stage is not repeated, e.g. across ablation variants).
      evaluate: the stages evaluated on the held-out scenes (subset of 'untrained', 'sft', 'rl').
      resume: continue the run in ``out_dir`` (finished stages are loaded, SFT / RL continue
        from their latest checkpoint). Without it, ``out_dir`` must not hold a run.
      progress: tqdm bars. log: callable(str) for progress lines (default print).
      engine_url: RL rollouts are generated by the OpenAI-compatible server at this URL
        (``jax-drive serve`` or vLLM serving the preset's base model), which gets the policy
        after every step (:func:`jax_drive.rl.weight_sync.connect_trainer`; exports in
        ``rl/weight_sync``). None: the in-process sampler. ``engine_model``: the server's
        name of the base model (default: the first it lists).
    Raises:
      ValueError for an unknown stage or an image preset with ``engine_url``;
      :class:`jax_drive.pipelines.journal.RunDirError` when ``out_dir`` cannot be used as asked.
    """
    enable_compile_cache()
    log = log or (lambda msg: print(msg, flush=True))
    unknown = set(evaluate) - set(STAGES)
    if unknown:
        raise ValueError(f"unknown stages {sorted(unknown)}; choose from {STAGES}")
    if engine_url is not None and preset.prompt.uses_images:
        raise ValueError(f"preset {preset.name!r} prompts with images; remote rollouts (engine_url) are text only")
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    journal = RunJournal(out_dir, run_identity(preset, advantage, sft_from), resume)
    rl_cfg = rl_config(preset, advantage)
    sft_dir, rl_dir = os.path.join(out_dir, "sft"), os.path.join(out_dir, "rl")
    stage = journal.stage

    def run_scenes():
        train, held_out = make_scenes(preset)
        return (train, held_out), {}, _scene_arrays(train, held_out)

    (train, held_out), _ = stage("scenes", run_scenes,
                                 lambda record, arrays: _scenes_from_arrays(arrays, len(preset.eval_seeds)))

    model, tokenizer, engine = load_engine(preset)
    journal.lap("load")
    holding = "untrained"  # the weights the model holds; others are loaded only for stages that run
    # where "the SFT policy" is; an on-policy continuation in this run moves it
    sft_source = sft_checkpoint_dir(out_dir) if sft_from is None else final_sft_dir(sft_from)

    def hold(weights: str) -> None:
        nonlocal holding
        if holding != weights:
            if weights == "sft":
                restore_trainable(model, preset.sft.optim, sft_source)
            else:
                restore_trainable(model, rl_cfg.optim, rl_checkpoint_dir(out_dir))
            holding = weights

    def evaluation(policy: str, title: str, num_scenes: int | None = None) -> dict:
        def run():
            hold(policy)
            return None, evaluate_policy(engine, tokenizer, held_out, preset, progress, num_scenes), None

        outcome, _ = stage(f"eval_{policy}", run)
        log(f"[{preset.name}] " + stage_line(title, outcome))
        return outcome

    stages: dict[str, dict] = {}
    if "untrained" in evaluate:
        k = min(preset.untrained_eval_scenes or preset.eval_scenes, preset.eval_scenes)
        log(f"[{preset.name}] evaluating the untrained policy on {len(preset.eval_seeds)} x {k} held-out scenes")
        stages["untrained"] = evaluation("untrained", "untrained", preset.untrained_eval_scenes)

    k_data, k_rl = jax.random.split(jax.random.key(preset.seed + 1))
    if sft_from is None:
        def run_sft_data():
            rows, card = build_sft_data(preset, train, tokenizer, k_data)
            return rows, {"data_card": card}, rows_to_arrays(rows)

        sft_rows, record = stage("sft_data", run_sft_data, lambda record, arrays: rows_from_arrays(arrays))
        data_card = record["data_card"]
        recovery = f"{data_card['recovery']} recovery, " if data_card.get("recovery") else ""
        log(f"[{preset.name}] SFT data: {data_card['single']} single, {data_card['multi']} multi-turn, "
            f"{recovery}{data_card['qa']} QA; kept {data_card['kept']}")

        def run_sft():
            nonlocal holding
            result = sft_train(model, sft_rows, preset.sft, tokenizer=tokenizer, out_dir=sft_dir, resume=resume,
                               progress=progress)
            holding = "sft"
            return None, {"steps": int(result.state.step)}, None

        stage("sft", run_sft)
        sft_history = read_jsonl(os.path.join(sft_dir, "metrics.jsonl"))
    else:
        meta = restore_trainable(model, preset.sft.optim, sft_source)
        holding = "sft"
        # the loss curve of the SFT stage, from whichever run of the lineage trained it
        histories = [os.path.join(run, "sft", "metrics.jsonl") for run in sft_lineage(sft_from)]
        sft_history = next((read_jsonl(h) for h in histories if os.path.exists(h)), [])
        data_card = {"sft_from": os.fspath(sft_from), "sft_checkpoint": os.fspath(sft_source),
                     "sft_steps": int(meta["step"])}  # the step of that checkpoint
        log(f"[{preset.name}] loaded the SFT policy of {sft_from} ({os.path.relpath(sft_source)}, step {meta['step']})")
        journal.lap("sft_load")

    onpolicy: dict = {}
    if preset.sft_onpolicy_scenes:
        def run_onpolicy_data():
            hold("sft")
            replay = sft_rows if sft_from is None else build_sft_data(preset, train, tokenizer, k_data)[0]
            rows, card = build_onpolicy_data(preset, engine, tokenizer, replay, jax.random.fold_in(k_data, 7))
            return rows, {"card": card}, rows_to_arrays(rows) if rows else None

        onpolicy_rows, record = stage("onpolicy_data", run_onpolicy_data,
                                      lambda record, arrays: rows_from_arrays(arrays) if arrays else [])
        card = record["card"]
        onpolicy = {"card": card}
        log(f"[{preset.name}] on-policy recovery: {card['unusable']} of {card['scenes']} fresh scenes answered "
            f"unusably -> {len(onpolicy_rows)} rows ({card['replay']} replayed)")
        if onpolicy_rows:
            def run_onpolicy_sft():
                hold("sft")
                config = dataclasses.replace(preset.sft, max_steps=preset.sft_onpolicy_steps)
                result = sft_train(model, onpolicy_rows, config, tokenizer=tokenizer,
                                   out_dir=os.path.join(out_dir, "sft_onpolicy"), resume=resume, progress=progress)
                return None, {"steps": int(result.state.step)}, None

            stage("sft_onpolicy", run_onpolicy_sft)
            sft_source, holding = onpolicy_checkpoint_dir(out_dir), "stale"  # reloaded when next needed
            onpolicy["history"] = read_jsonl(os.path.join(out_dir, "sft_onpolicy", "metrics.jsonl"))
    if "sft" in evaluate:
        stages["sft"] = evaluation("sft", "after SFT")

    rl_history: list[dict] = []
    curation: dict = {}
    if not skip_rl:
        def run_curation():
            hold("sft")
            index, stats = curate(preset, train, engine, k_rl)
            refs = np.asarray(compute_reference(index_scene(train, index)))
            return (index, refs), {"index": index.tolist(), "curation": stats}, {"references": refs}

        (index, rl_refs), record = stage("rl_curation", run_curation, lambda record, arrays: (
            np.asarray(record["index"], np.int64), arrays["references"]))
        curation = record["curation"]
        log(f"[{preset.name}] RL curation kept {len(index)} scenes: {curation.get('category_counts')}")

        def run_rl():
            nonlocal holding
            hold("sft")  # also the reference policy of the KL term
            rl_engine, on_step = engine, None
            if engine_url is not None:  # the server gets the policy now and after every step
                rl_engine = connect_trainer(engine_url, model, tokenizer, rl_cfg.optim.trainable,
                                            os.path.join(rl_dir, "weight_sync"), engine_model)
                on_step = rl_engine.on_step
            result = grpo_train(model, tokenizer, index_scene(train, index), rl_cfg, engine=rl_engine,
                                references=rl_refs, out_dir=rl_dir, resume=resume, progress=progress,
                                on_step=on_step)
            holding = "rl"
            if engine_url is not None:
                gaps = [r.logprob_gap for r in rl_engine.history if r.logprob_gap is not None]
                log(f"[{preset.name}] RL rollouts on {engine_url}: {len(rl_engine.history)} pushes "
                    f"({rl_engine.served_model}), served-vs-trainer log-prob gap <= "
                    f"{max(gaps) if gaps else float('nan'):.1e} (rl/weight_sync/history.jsonl)")
            return None, {"steps": int(result.state.step)}, None

        stage("rl", run_rl)
        rl_history = read_jsonl(os.path.join(rl_dir, "metrics.jsonl"))
        if "rl" in evaluate:
            stages["rl"] = evaluation("rl", f"after RL ({rl_cfg.advantage.mode})")

    return {
        "preset": preset.name,
        "model": preset.model,
        "seed": preset.seed,
        "advantage": rl_cfg.advantage.mode if not skip_rl else None,
        "eval": eval_card(preset),
        "budget": budget_card(preset, rl_cfg),
        "stages": public_stages(stages),
        "sft_history": sft_history,
        "rl_history": rl_history,
        "data_card": data_card,
        "rl_curation": curation,
        "sft_onpolicy": onpolicy,
        "timings_s": journal.timings,
        "cpu_timings_s": journal.cpu_timings,
        "resumed_stages": journal.resumed,
        "examples": {name: examples(s["transcripts"]) for name, s in stages.items()},
        "_transcripts": {name: s["transcripts"] for name, s in stages.items()},
        "_held_out": held_out,
    }


# ----------------------------------------------------------------------------- re-evaluation
def run_preset(run_dir: str | os.PathLike) -> tuple[Preset, dict]:
    """The preset a finished run evaluated with, and its ``run.json`` identity.

    The preset is rebuilt from the recorded name and seed; the fields the budget flags
    change (:data:`~jax_drive.pipelines.presets.BUDGET_FIELDS`) only shaped training, so
    they keep the base preset's values, and every other field must equal the record.
    Raises:
      ValueError when ``run_dir`` holds no run, names an unknown preset, or its record
      differs from the preset in a field that is not a budget field (the preset changed since).
    """
    path = os.path.join(os.fspath(run_dir), "run.json")
    try:
        with open(path) as f:
            identity = json.load(f)
    except (OSError, ValueError) as error:
        raise ValueError(f"{os.fspath(run_dir)} holds no MTDrive run ({path}: {error})") from None
    recorded = identity.get("preset") if isinstance(identity, dict) else None
    if identity.get("pipeline") != "mtdrive" or not isinstance(recorded, dict):
        raise ValueError(f"{path} is not the journal of an MTDrive run")
    if recorded.get("name") not in PRESETS:
        raise ValueError(f"{path}: unknown preset {recorded.get('name')!r}; choose from {sorted(PRESETS)}")
    preset = with_seed(PRESETS[recorded["name"]], int(recorded["seed"]))
    mine = json.loads(json.dumps(dataclasses.asdict(preset), default=str))
    differ = sorted(k for k in set(mine) | set(recorded)
                    if k not in BUDGET_FIELDS and mine.get(k) != recorded.get(k))
    if differ:
        raise ValueError(f"{path}: the run's preset differs from today's {preset.name!r} in {differ}; "
                         "its policies cannot be rebuilt for evaluation")
    return preset, identity


def reevaluate(run_dir: str | os.PathLike, out_dir: str | os.PathLike, eval_scenes: int, *,
               evaluate: Sequence[str] = ("sft", "rl"), resume: bool = False, progress: bool = True,
               log=None) -> dict[str, Any]:
    """Evaluates a finished run's policies again on ``eval_scenes`` held-out scenes per
    evaluation seed (a larger test set than the run's own, e.g. to shrink its standard
    errors); returns a results dict of the run's schema (training records copied from its
    ``results.json``, ``stages`` / ``eval`` / ``examples`` new, ``reevaluation`` saying
    what was loaded). Same greedy evaluation as :func:`run_mtdrive`: with the run's own
    number of scenes it reproduces the run's evaluation.

    Args:
      run_dir: a run of :func:`run_mtdrive` that wrote ``results.json``.
      out_dir: the journal of this re-evaluation (one stage per policy; ``resume`` loads
        finished ones).
      evaluate: policies to evaluate: 'untrained', 'sft' (the run's final SFT policy,
        :func:`final_sft_dir`), 'rl' (its last mtGRPO checkpoint).
    Raises:
      ValueError for a bad ``eval_scenes`` / stage or a run that cannot be rebuilt
      (:func:`run_preset`); FileNotFoundError when a policy's checkpoint is missing;
      :class:`jax_drive.pipelines.journal.RunDirError` when ``out_dir`` cannot be used.
    """
    log = log or (lambda msg: print(msg, flush=True))
    if isinstance(eval_scenes, bool) or not isinstance(eval_scenes, (int, np.integer)) or eval_scenes < 1:
        raise ValueError(f"eval_scenes must be an integer >= 1, got {eval_scenes!r}")
    unknown = set(evaluate) - set(STAGES)
    if unknown or not evaluate:
        raise ValueError(f"stages to evaluate must be a non-empty subset of {STAGES}, got {list(evaluate)}")
    run_dir = os.fspath(run_dir)
    preset, identity = run_preset(run_dir)
    try:
        with open(os.path.join(run_dir, "results.json")) as f:
            before = json.load(f)
    except (OSError, ValueError) as error:
        raise ValueError(f"{run_dir} has no readable results.json (an unfinished run?): {error}") from None
    recorded = identity["preset"]
    optims = {"sft": OptimConfig(**recorded["sft"]["optim"]), "rl": OptimConfig(**recorded["rl"]["optim"])}
    sources = {"sft": final_sft_dir(run_dir), "rl": rl_checkpoint_dir(run_dir)}
    for policy in set(evaluate) - {"untrained"}:
        if not committed_steps(sources[policy]):
            raise FileNotFoundError(f"{run_dir}: no {policy.upper()} checkpoint in {sources[policy]}")
    preset = dataclasses.replace(preset, eval_scenes=int(eval_scenes))
    journal = RunJournal(out_dir, {"pipeline": "mtdrive_reevaluate", "run": os.path.abspath(run_dir),
                                   "eval_scenes": int(eval_scenes), "evaluate": list(evaluate)}, resume)
    held_out = make_held_out(preset)
    model, tokenizer, engine = load_engine(preset)
    journal.lap("load")
    stages, checkpoints = {}, {}
    for policy in [s for s in STAGES if s in evaluate]:
        def run(policy=policy):
            meta = {"step": 0}
            if policy != "untrained":
                meta = restore_trainable(model, optims[policy], sources[policy])
            outcome = evaluate_policy(engine, tokenizer, held_out, preset, progress)
            return None, {**outcome, "checkpoint": {"dir": sources.get(policy), "step": int(meta["step"])}}, None

        outcome, _ = journal.stage(f"eval_{policy}", run)
        checkpoints[policy] = outcome.pop("checkpoint")
        stages[policy] = outcome
        log(f"[{preset.name}] " + stage_line(f"{policy} ({len(held_out)} x {eval_scenes} scenes)", outcome))
    return {
        **before,
        "eval": eval_card(preset),
        "stages": public_stages(stages),
        "examples": {name: examples(s["transcripts"]) for name, s in stages.items()},
        "timings_s": journal.timings,
        "cpu_timings_s": journal.cpu_timings,
        "resumed_stages": journal.resumed,
        "reevaluation": {"run": run_dir, "eval_before": before.get("eval"),
                         "checkpoints": checkpoints},
        "_transcripts": {name: s["transcripts"] for name, s in stages.items()},
        "_held_out": held_out,
    }
