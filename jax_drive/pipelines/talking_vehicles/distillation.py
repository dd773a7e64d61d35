"""The distilled TalkingVehicles policy: teacher data, the student's fine-tuning and DAgger.

Every stage is kept in the run directory (``distill_data.jsonl``, ``student/``, then
``dagger<r>/data.jsonl`` and ``dagger<r>/student/``) and reused, so a killed run resumes.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os

from tqdm.auto import tqdm

from jax_drive.coop.agent import LanguagePolicy
from jax_drive.coop.learning import episode_specs
from jax_drive.names import TALKING_VEHICLES_METHODS as METHODS
from jax_drive.pipelines.engines import EngineSpec, ModelSpec, load_model, make_engine
from jax_drive.pipelines.talking_vehicles.presets import PROMPT_BUCKETS, Preset
from jax_drive.runinfo import write_json


def distill_method(preset: Preset, run_dir: str, *, progress: bool = True) -> tuple[str, dict]:
    """Builds (or reuses) the distillation data and the student, then runs the preset's DAgger
    rounds; returns the last student's model directory and a summary (data counts, training
    history, each round's student success on its labelled episodes).

    Every stage is kept in ``run_dir`` (``distill_data.jsonl``, ``student/``, then
    ``dagger<r>/data.jsonl`` and ``dagger<r>/student/``) and reused, so a killed run resumes.
    """
    from jax_drive.coop import distill as D

    holdout = episode_specs(preset.scenarios, preset.seeds, max(preset.episodes_for(m) for m in METHODS), "eval")
    data_path = os.path.join(run_dir, "distill_data.jsonl")
    info_path = os.path.join(run_dir, "distill_data_info.json")
    if not os.path.exists(data_path):
        samples, teacher, raw = D.teacher_data(preset.scenarios, preset.distill_seeds, preset.distill_epsilons,
                                               preset.distill_episodes, keep_fraction=preset.distill_keep_fraction)
        D.check_disjoint(samples, holdout)
        write_json(info_path, {"teacher_runs": teacher, "raw_data": raw})
        D.save_samples(samples, data_path)  # last: its existence marks the stage done
    samples = D.load_samples(data_path)
    info: dict = {}
    if os.path.exists(info_path):
        with open(info_path, encoding="utf-8") as f:
            info.update(json.load(f))
    info["data"] = D.data_summary(samples)
    info["examples"] = [s.chat()["messages"] for s in samples[:: max(1, len(samples) // 6)][:6]]
    model_dir = os.path.join(run_dir, "student")
    if not _trained(model_dir):
        model, tokenizer = load_model(ModelSpec(preset.student_model))
        D.train_student(model, tokenizer, samples, preset.student, model_dir, progress=progress)
    info.update(_train_summary(model_dir))
    rounds = []
    for r in range(1, preset.dagger_rounds + 1):
        round_dir = os.path.join(run_dir, f"dagger{r}")
        found, summary = _dagger_data(preset, model_dir, round_dir, r, holdout, progress=progress)
        samples = samples + found
        previous, model_dir = model_dir, os.path.join(round_dir, "student")
        if not _trained(model_dir):
            model, tokenizer = load_student(os.path.join(previous, "model"))
            config = dataclasses.replace(preset.student, sft=dataclasses.replace(
                preset.student.sft, epochs=preset.dagger_epochs, seed=preset.student.sft.seed + r))
            D.train_student(model, tokenizer, samples, config, model_dir, progress=progress)
        rounds.append({**summary, "aggregated_samples": len(samples), **_train_summary(model_dir)})
    if rounds:
        info["dagger"] = rounds
    return os.path.join(model_dir, "model"), info


def _trained(model_dir: str) -> bool:
    return os.path.exists(os.path.join(model_dir, "model", "config.json"))


def _train_summary(model_dir: str) -> dict:
    """Steps, seconds and losses from the SFT trainer's log (also of resumed runs)."""
    metrics = os.path.join(model_dir, "sft", "metrics.jsonl")
    if not os.path.exists(metrics):
        return {}
    with open(metrics, encoding="utf-8") as f:
        history = [json.loads(line) for line in f if line.strip()]
    return {"train_steps": len(history), "train_seconds": float(sum(h["step_seconds"] for h in history)),
            "train_loss": [round(h["loss"], 4) for h in history]}


def _dagger_data(preset: Preset, model_dir: str, round_dir: str, r: int, holdout, *, progress: bool = True):
    """Round ``r``'s teacher-labelled student data (built once, then loaded) and its summary."""
    import jax

    from jax_drive.coop import distill as D

    data_path = os.path.join(round_dir, "data.jsonl")
    info_path = os.path.join(round_dir, "data_info.json")
    if not os.path.exists(data_path):
        model, tokenizer = load_student(os.path.join(model_dir, "model"))
        student = LanguagePolicy(make_engine(local_engine_spec(preset), model, tokenizer), preset.student_agent,
                                 key=jax.random.key(1000 + r), name="distilled")
        # new episodes of the distillation split: after the teacher's and the earlier rounds'
        start = preset.distill_episodes + (r - 1) * preset.dagger_episodes
        specs = episode_specs(preset.scenarios, preset.distill_seeds, preset.dagger_episodes, "distill", start=start)
        bar = tqdm(desc=f"dagger {r} ({len(specs)} episodes)", unit="decision", disable=not progress, leave=False)
        found, results = D.collect_student(student, specs, progress=lambda d: bar.update(1), max_time=preset.max_time)
        bar.close()
        raw = {**D.data_summary(found), "disagreements": int(sum(1 for s in found if s.executed))}
        found = D.select_informative(D.dedupe(found, 1), keep_fraction=preset.distill_keep_fraction)
        D.check_disjoint(found, holdout)
        by_scenario = collections.defaultdict(list)
        for spec, res in zip(specs, results):
            by_scenario[spec.scenario].append(D.episode_success(res))
        os.makedirs(round_dir, exist_ok=True)
        write_json(info_path, {"episodes": len(specs), "student_successes": int(sum(map(D.episode_success, results))),
                           "student_success_by_scenario": {k: int(sum(v)) for k, v in by_scenario.items()},
                           "raw_data": raw})
        D.save_samples(found, data_path)  # last: its existence marks the round's data done
    found = D.load_samples(data_path)
    with open(info_path, encoding="utf-8") as f:
        summary = json.load(f)
    summary["data"] = D.data_summary(found)
    return found, summary


def load_student(model_path: str):
    """(model, tokenizer) of a saved student; a tiny student (tests) keeps its byte tokenizer."""
    return load_model(ModelSpec(model_path))


def local_engine_spec(preset: Preset) -> EngineSpec:
    """The local engine of the LLM agents and the student: fine prompt buckets, ``max_batch`` rows."""
    return EngineSpec(prompt_buckets=PROMPT_BUCKETS, min_gen_bucket=8, max_batch=preset.max_batch)
