"""Talking vehicles trained by reinforcement learning: presets, training seeds, frozen
evaluation on held-out episodes, the summary and its plot.

    jax-drive coop-rl --preset smoke --out runs/coop_rl_smoke [--resume] [--set train.steps=4]

Stages, each resumable in the run directory:

0. **distil** (``start/``, only when the preset's ``distill_episodes`` > 0): the language rule
   teacher drives ``distill`` episodes (disjoint from the evaluation and RL keys), and its
   informative decisions, written in the action grammar's own format (what the trained policy
   will be made to write), fine-tune ``model`` into the start policy (``start/model``);
1. **train** (``seed<s>/``, one per training seed): :func:`jax_drive.coop.rl.coop_grpo_train`
   from the start policy, on episodes of the ``rl`` split in the world ``train.variation``
   (metrics.jsonl, TensorBoard, orbax checkpoints; a killed run continues from its last
   checkpoint with ``--resume``);
2. **evaluate** (``eval/<method>.json``, written when done, read back on resume): frozen
   weights on the held-out episodes (the ``eval`` split of ``eval_seeds``: disjoint from the
   ``rl`` training keys), the protocol of the TalkingVehicles Table 1 (accident-prone and safe
   episodes alternate): ``rule_based`` and ``start`` once (``zero_shot`` too with a
   ``zero_shot_model``), ``grpo`` and
   ``grpo_messages_dropped`` (the trained policy with messages dropped: no agent sends,
   every inbox stays empty) per training seed;
3. **summary** (``results.json``): per method SR / CR mean and standard error over seeds
   (training seeds for trained rows, evaluation seeds for the others), the paired
   difference grpo - start over the same held-out episodes (bootstrap over episodes), the
   learning curves plot.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import numpy as np

from jax_drive.coop.agent import AgentConfig
from jax_drive.coop.distill import StudentConfig
from jax_drive.coop.rl import CoopRLConfig
from jax_drive.names import COOP_RL_PRESETS as PRESET_NAMES
from jax_drive.names import check_names
from jax_drive.rl.loss import LossConfig
from jax_drive.rl.optim import OptimConfig
from jax_drive.rl.sft import SFTConfig
from jax_drive.sim.scenarios import TALKING_VEHICLES
from jax_drive.sim.variations import check_held_out
from jax_drive.stats import BOOTSTRAP_SAMPLES, mean_sem, paired_bootstrap

EVAL_METHODS = ("rule_based", "start", "grpo", "grpo_messages_dropped")
STORY_SCENARIO = "tv_overtake_perception"  # the storyboard's scenario (its first accident-prone held-out episode)


@dataclasses.dataclass(frozen=True)
class Preset:
    """One coop-RL setting.

    Attributes:
      name: preset name.
      model: the start policy's model: a ``load_pretrained`` source (SmolLM2: its zero-shot
        answers under the action grammar), a distilled student's directory
        (:func:`jax_drive.pipelines.talking_vehicles.load_student`), or 'tiny' (a random tiny
        model over the byte tokenizer: tests and the CPU study).
      start: what the start policy is, in words (results).
      lora_rank: LoRA adapters of the trained policy (0: full fine-tuning).
      train: :class:`~jax_drive.coop.rl.CoopRLConfig` (its ``seed`` is replaced by each
        training seed).
      training_seeds: one trained policy per seed.
      eval_seeds, eval_episodes: held-out episodes: ``eval_episodes`` per scenario per seed
        (accident-prone and safe alternate).
      eval_temperature: sampling temperature of the frozen policies (the TalkingVehicles
        protocol's 0.2; training samples at ``train.agent.temperature``).
      eval_max_time: optional cap on evaluation episodes' length, s (None: each scenario's own).
      eval_variations: held-out variations (:mod:`jax_drive.sim.variations`) every policy is
        also evaluated on: the same held-out episodes in a world scaled outside the training
        ranges. Adding one to a finished run only adds evaluations (a resume accepts it). The
        training world (``train.variation``) may be one of them: its held-out episodes are
        then new seeds of the training layouts, not a held-out world (:func:`variation_role`).
      max_batch: rows per sampler call.
      zero_shot_model: None, or a model source (the base model of a distilled start, e.g.
        'smollm2-135m-instruct') whose zero-shot answers, under the start's prompts, grammar
        and decoding, are also evaluated: the ``zero_shot`` row. A start that is not distilled
        is itself the ``zero_shot`` row. Adding it to a finished run only adds evaluations.
      distill_episodes: 0 (``model`` is the start policy) or the language rule teacher's
        episodes per scenario per distillation seed; ``model`` fine-tuned on them is the start
        policy (the ``distilled`` row).
      distill_seeds, distill_epsilons: the teacher's seeds of the ``distill`` split, one
        exploration epsilon each.
      distill_keep_fraction: share of uninformative teacher decisions kept.
      student: the start policy's fine-tuning.
    """

    name: str
    model: str = "smollm2-135m-instruct"
    start: str = "SmolLM2-135M-Instruct zero-shot, compact prompt, action grammar"
    lora_rank: int = 8
    train: CoopRLConfig = CoopRLConfig(scenarios=TALKING_VEHICLES)
    training_seeds: tuple[int, ...] = (0, 1, 2)
    eval_seeds: tuple[int, ...] = (0, 1, 2)
    eval_episodes: int = 4
    eval_temperature: float = 0.2
    eval_max_time: float | None = None
    eval_variations: tuple[str, ...] = ()
    zero_shot_model: str | None = None
    max_batch: int = 128
    distill_episodes: int = 0
    distill_seeds: tuple[int, ...] = (0, 1, 2)
    distill_epsilons: tuple[float, ...] = (0.0, 0.1, 0.2)
    distill_keep_fraction: float = 0.2
    student: StudentConfig = StudentConfig()

    def __post_init__(self):
        if not self.training_seeds or not self.eval_seeds:
            raise ValueError("training_seeds and eval_seeds must each name at least one seed")
        if self.eval_episodes < 1 or self.lora_rank < 0 or self.max_batch < 1:
            raise ValueError("eval_episodes and max_batch must be >= 1, lora_rank >= 0")
        check_held_out(self.eval_variations)
        if self.distill_episodes < 0 or len(self.distill_epsilons) != len(self.distill_seeds):
            raise ValueError("distill_episodes must be >= 0, with one exploration epsilon per distillation seed")
        if not self.eval_temperature >= 0:
            raise ValueError(f"eval_temperature must be >= 0, got {self.eval_temperature}")
        trainable = self.train.optim.trainable
        if (trainable == "lora") != (self.lora_rank > 0):
            raise ValueError(f"train.optim.trainable {trainable!r} does not match lora_rank {self.lora_rank} "
                             "(LoRA needs a rank > 0; full fine-tuning rank 0)")

    def eval_agent(self, communicate: bool = True) -> AgentConfig:
        """The frozen policies' agent settings: the training agent at ``eval_temperature``."""
        return dataclasses.replace(self.train.agent, temperature=self.eval_temperature, communicate=communicate)


def _presets() -> dict[str, Preset]:
    tiny_agent = AgentConfig(style="compact", temperature=1.0, constrain_answers=True, max_message_chars=16)
    full = OptimConfig(learning_rate=1e-3, trainable="full")
    return {
        # Tests: the random tiny model, two scenarios, episodes cut at 4 s, two steps, one seed.
        "smoke": Preset(
            name="smoke", model="tiny", start="random tiny model (byte tokenizer), action grammar", lora_rank=0,
            train=CoopRLConfig(agent=tiny_agent, scenarios=TALKING_VEHICLES[:2], group_size=2, groups_per_step=2,
                               steps=2, max_time=4.0, optim=full, minibatch_size=16, max_rows=32, bucket_size=32,
                               checkpoint_every=1),
            training_seeds=(0,), eval_seeds=(0,), eval_episodes=1, eval_max_time=4.0, max_batch=64,
        ),
        # The CPU study: the random tiny model learns to drive the six scenarios from the joint
        # return alone (full episodes, G = 4, one group per scenario per step; 30 steps of
        # ~2,400 decisions, ~30 s each on the 2-core CPU).
        "tiny-study": Preset(
            name="tiny-study", model="tiny", start="random tiny model (byte tokenizer), action grammar", lora_rank=0,
            train=CoopRLConfig(agent=tiny_agent, scenarios=TALKING_VEHICLES, group_size=4, groups_per_step=6,
                               steps=30, optim=full, loss=LossConfig(kl_coef=0.0), minibatch_size=64, max_rows=256,
                               bucket_size=32, checkpoint_every=5),
            training_seeds=(0, 1, 2), eval_seeds=(0, 1, 2), eval_episodes=4, max_batch=128,
        ),
        # The CPU study from a start that can drive: the tiny model fine-tuned on the language
        # rule teacher's decisions (6 episodes per scenario x 3 seeds, epsilon 0 / 0.1 / 0.2),
        # then the tiny-study's RL at 20 steps.
        "tiny-distilled": Preset(
            name="tiny-distilled", model="tiny",
            start="random tiny model distilled from the language rule teacher, action grammar", lora_rank=0,
            train=CoopRLConfig(agent=tiny_agent, scenarios=TALKING_VEHICLES, group_size=4, groups_per_step=6,
                               steps=20, optim=OptimConfig(learning_rate=2e-4, trainable="full"),
                               loss=LossConfig(kl_coef=0.0), minibatch_size=64, max_rows=256, bucket_size=32,
                               checkpoint_every=5),
            training_seeds=(0, 1, 2), eval_seeds=(0, 1, 2), eval_episodes=4, eval_variations=("scale1.3",),
            max_batch=128, distill_episodes=6,
            student=StudentConfig(sft=SFTConfig(optim=full, batch_size=16, epochs=3, max_steps=600,
                                                bucket_size=32, max_length=320, checkpoint_every=100),
                                  min_command_share=0.08),
        ),
        # SmolLM2 on a 2-core CPU: LoRA from its zero-shot answers under the action grammar,
        # the same pipeline at a small scale (one step is ~1,000 decisions).
        "cpu-demo": Preset(
            name="cpu-demo",
            train=CoopRLConfig(scenarios=TALKING_VEHICLES, group_size=4, groups_per_step=2, steps=10,
                               optim=OptimConfig(learning_rate=2e-5), max_rows=128, minibatch_size=32,
                               checkpoint_every=1),
            training_seeds=(0, 1, 2), eval_seeds=(0, 1, 2), eval_episodes=2,
        ),
        # The protocol on an accelerator: G = 8, a group per scenario per step, 200 steps.
        "paper": Preset(
            name="paper",
            train=CoopRLConfig(scenarios=TALKING_VEHICLES, group_size=8, groups_per_step=6, steps=200,
                               optim=OptimConfig(learning_rate=1e-5), max_rows=None, minibatch_size=128,
                               checkpoint_every=10),
            eval_episodes=30, max_batch=512,
        ),
    }


PRESETS = _presets()
check_names("coop-RL presets", PRESETS, PRESET_NAMES)


# ----------------------------------------------------------------------------- models
def start_source(preset: Preset, out_dir: str) -> str:
    """The start policy's model source: ``model``, or the student distilled into ``out_dir``."""
    return os.path.join(out_dir, "start", "model") if preset.distill_episodes else preset.model


def load_policy_model(preset: Preset, source: str | None = None):
    """(model, tokenizer) of the start policy (``source``, default the preset's ``model``; a
    saved student directory loads like any ``load_pretrained`` source), LoRA adapters applied
    when ``lora_rank``."""
    from jax_drive.pipelines.engines import ModelSpec, load_model

    return load_model(ModelSpec(source or preset.model, lora_rank=preset.lora_rank,
                                lora_alpha=2.0 * preset.lora_rank))


def grammar_answers(samples, max_message_chars: int) -> list:
    """The teacher's samples with each answer rewritten as the action grammar writes it
    (``{"command": "...", "message": "..."}``, the message cut to the grammar's cap), so the
    student learns the very strings the trained policy is constrained to."""
    from jax_drive.coop.agent import format_action, parse_action

    out = []
    for s in samples:
        action = parse_action(s.answer)
        out.append(dataclasses.replace(s, answer=format_action(action.command, action.message[:max_message_chars])))
    return out


def distill_start(preset: Preset, out_dir: str, *, progress: bool = True) -> dict:
    """Stage 0: the distilled start policy in ``out_dir/start`` (data, then the student);
    each part reused when present. Returns the data summary and the training history."""
    from jax_drive.coop import distill as D
    from jax_drive.pipelines.engines import ModelSpec, load_model
    from jax_drive.runinfo import write_json

    start_dir = os.path.join(out_dir, "start")
    data_path, info_path = os.path.join(start_dir, "data.jsonl"), os.path.join(start_dir, "data_info.json")
    if not os.path.exists(data_path):
        samples, teacher, raw = D.teacher_data(preset.train.scenarios, preset.distill_seeds, preset.distill_epsilons,
                                               preset.distill_episodes, keep_fraction=preset.distill_keep_fraction)
        samples = grammar_answers(samples, preset.train.agent.max_message_chars)
        D.check_disjoint(samples, eval_specs(preset))
        write_json(info_path, {"teacher_runs": teacher, "raw_data": raw, "data": D.data_summary(samples)})
        D.save_samples(samples, data_path)  # last: its existence marks the data done
    if not os.path.exists(os.path.join(start_dir, "model", "config.json")):
        model, tokenizer = load_model(ModelSpec(preset.model))
        D.train_student(model, tokenizer, D.load_samples(data_path), preset.student, start_dir, progress=progress)
    with open(info_path) as f:
        info = json.load(f)
    return info | {"sft": _history(os.path.join(start_dir, "sft"))}


def make_engine(preset: Preset, model, tokenizer):
    """The local engine every agent shares (fine prompt buckets, ``max_batch`` rows per call)."""
    from jax_drive.pipelines.engines import EngineSpec, make_engine as build
    from jax_drive.pipelines.talking_vehicles.presets import PROMPT_BUCKETS

    return build(EngineSpec(prompt_buckets=PROMPT_BUCKETS, min_gen_bucket=8, max_batch=preset.max_batch),
                 model, tokenizer)


# ----------------------------------------------------------------------------- evaluation
def eval_specs(preset: Preset, variation: str = "nominal"):
    """The held-out episodes: ``eval_episodes`` per scenario per evaluation seed (of a
    held-out ``variation``: the same episodes in a scaled world)."""
    from jax_drive.coop.learning import episode_specs

    return episode_specs(preset.train.scenarios, preset.eval_seeds, preset.eval_episodes, variation=variation)


def evaluate_policy(policy, specs, max_time: float | None, progress: bool = False) -> list[dict]:
    """One row per held-out episode: its tag, scenario, seed, SR / CR (percent over its
    eligible agents) and joint return."""
    from jax_drive.coop.learning import run_specs
    from jax_drive.coop.rl import joint_returns
    from jax_drive.sim import metrics as M

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc=f"evaluate {getattr(policy, 'name', '')}", unit="decision", dynamic_ncols=True)
    tick = (lambda d: bar.update(1)) if bar is not None else None
    results, _ = run_specs(specs, policy, max_time=max_time, progress=tick)
    if bar is not None:
        bar.close()
    returns = joint_returns(results)
    rows = []
    for spec, result, ret in zip(specs, results, returns):
        rates = M.talking_vehicles_rates(result.outcomes)
        rows.append({"tag": spec.tag, "scenario": spec.scenario, "seed": spec.seed, "index": spec.index,
                     "accident_prone": spec.accident_prone, "sr": rates["SR"], "cr": rates["CR"],
                     "return": float(ret), "messages": result.messages_sent})
    return rows


def _cached_story(path: str, engine, preset: Preset, specs) -> dict | None:
    """The storyboard record (:func:`jax_drive.coop.render.episode_story`) of the trained
    policy's first accident-prone held-out episode of :data:`STORY_SCENARIO` (or of the first
    scenario when it is not trained on), computed once."""
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    from jax_drive.coop.agent import LanguagePolicy
    from jax_drive.coop.learning import run_specs
    from jax_drive.coop.render import episode_story

    scenario = STORY_SCENARIO if STORY_SCENARIO in preset.train.scenarios else preset.train.scenarios[0]
    spec = next(s for s in specs if s.scenario == scenario and s.accident_prone)
    results, _ = run_specs([spec], LanguagePolicy(engine, preset.eval_agent(), name="grpo"), keep_trajectory=True,
                           max_time=preset.eval_max_time)
    story = episode_story(results[0], spec.tag)
    _write(path, story)
    return story


def _cached(path: str, compute) -> list[dict]:
    """The rows in ``path`` when a finished evaluation wrote them, else ``compute()`` written there."""
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)["rows"]
    rows = compute()
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"rows": rows}, f)
    os.replace(tmp, path)  # a killed evaluation leaves no file that looks finished
    return rows


# ----------------------------------------------------------------------------- statistics
def method_summary(rows_by_seed: dict[int, list[dict]]) -> dict:
    """SR / CR of a method: each seed's mean over its held-out episodes, then the mean and
    standard error over seeds."""
    per_seed = {s: {k: float(np.mean([r[k] for r in rows])) for k in ("sr", "cr")} for s, rows in rows_by_seed.items()}
    return {"sr": mean_sem([v["sr"] for v in per_seed.values()]), "cr": mean_sem([v["cr"] for v in per_seed.values()]),
            "seeds": len(per_seed), "per_seed": per_seed}


def paired_difference(trained: dict[int, list[dict]], reference, key: str, seed: int = 0) -> dict:
    """Mean of ``trained - reference`` over training seeds and held-out episodes (the same
    episodes, matched by tag), with a 95 % percentile bootstrap interval that resamples the
    episodes (every training seed kept, so the seeds' spread stays in each resample).

    ``reference``: one list of rows for every seed (an untrained policy) or {seed: rows} (the
    same seed's other policy)."""
    def values(rows):
        return {r["tag"]: r[key] for r in rows}

    tags = sorted(values(next(iter(trained.values()))))
    diffs = []
    for s, rows in trained.items():
        mine, base = values(rows), values(reference[s] if isinstance(reference, dict) else reference)
        diffs.append([mine[t] - base[t] for t in tags])
    out = paired_bootstrap(diffs, seed)
    return {"mean": out["mean"], "ci95": out["ci95"], "episodes": out["units"], "training_seeds": out["training_seeds"],
            "interval": f"percentile bootstrap over episodes, {BOOTSTRAP_SAMPLES} resamples"}


# ----------------------------------------------------------------------------- the run
class RunDirError(ValueError):
    """The run directory holds another run (or a run with another preset)."""


def preset_record(preset: Preset) -> dict:
    """The preset as JSON (what a run directory records, and resumes only with)."""
    return json.loads(json.dumps(dataclasses.asdict(preset), default=str))


# Fields whose change only adds evaluations to a run: a resume accepts it (and records it).
EVAL_ONLY_FIELDS = ("eval_variations", "zero_shot_model")


def check_run_dir(preset: Preset, out_dir: str, resume: bool) -> None:
    """Records the preset in a new run directory; refuses a directory that holds a run unless
    ``resume``, and a resume with a preset other than the recorded one (up to
    :data:`EVAL_ONLY_FIELDS`, whose new values are recorded). A field the record lacks (a run
    recorded before the field existed) ran with the field's default."""
    path, record = os.path.join(out_dir, "preset.json"), preset_record(preset)
    if os.path.exists(path):
        if not resume:
            raise RunDirError(f"{out_dir} already holds a run: --resume continues it, or choose another --out")
        with open(path) as f:
            recorded = preset_record(Preset(name=preset.name)) | json.load(f)
        changed = sorted(k for k in set(recorded) | set(record)
                         if recorded.get(k) != record.get(k) and k not in EVAL_ONLY_FIELDS)
        if changed:
            raise RunDirError(f"{out_dir} was run with another preset (fields differ: {', '.join(changed)}); "
                              "resume it with the same preset and --set values")
        if recorded == record:
            return
    os.makedirs(out_dir, exist_ok=True)
    _write(path, record)


def train_seed(preset: Preset, seed: int, out_dir: str, *, resume: bool, progress: bool,
               source: str | None = None):
    """Trains (or finishes / restores) one training seed from ``source`` (default the
    preset's model); returns (model, tokenizer, history)."""
    from jax_drive.coop.rl import coop_grpo_train

    model, tokenizer = load_policy_model(preset, source)
    config = dataclasses.replace(preset.train, seed=int(seed))
    done = os.path.isdir(os.path.join(out_dir, "checkpoints"))
    result = coop_grpo_train(model, tokenizer, config, engine=make_engine(preset, model, tokenizer), out_dir=out_dir,
                             resume=resume or done, progress=progress)
    return model, tokenizer, _history(out_dir) or result.history


def _history(out_dir: str) -> list[dict]:
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(preset: Preset, out_dir: str, *, resume: bool = False, progress: bool = True,
        only_seed: int | None = None) -> dict | None:
    """Every stage of the module docstring; returns the results (also ``<out_dir>/results.json``).

    ``only_seed``: train and evaluate that training seed only (with the untrained rows) and
    return None; a later call without it reads everything back and summarises. Seeds can so
    run in separate processes or machines, and a long study never holds one process's compiled
    programs for all seeds (XLA:CPU maps each compiled kernel into memory; a process that has
    compiled thousands of them can run out of memory mappings)."""
    if only_seed is not None and only_seed not in preset.training_seeds:
        raise ValueError(f"seed {only_seed} is not one of the preset's training seeds {list(preset.training_seeds)}")
    from jax_drive.coop.agent import LanguagePolicy
    from jax_drive.coop.baselines import make_policy

    check_run_dir(preset, out_dir, resume)
    os.makedirs(os.path.join(out_dir, "eval"), exist_ok=True)
    variations = ("nominal",) + preset.eval_variations

    def evaluate(name: str, policy_fn) -> dict[str, list[dict]]:
        """{variation: rows}; the policy is built once, when an evaluation is not on disk yet."""
        policy = functools.cache(policy_fn)
        return {v: _cached(_eval_path(out_dir, name, v), lambda v=v: evaluate_policy(
            policy(), eval_specs(preset, v), preset.eval_max_time, progress)) for v in variations}

    rows = {"rule_based": {0: evaluate("rule_based", lambda: make_policy("rule_based"))}}
    distilled = distill_start(preset, out_dir, progress=progress) if preset.distill_episodes else None
    source = start_source(preset, out_dir)

    def start_policy():
        model, tokenizer = load_policy_model(preset, source)
        return LanguagePolicy(make_engine(preset, model, tokenizer), preset.eval_agent(), name="start")

    rows["start"] = {0: evaluate("start", start_policy)}
    if preset.zero_shot_model is not None:
        rows["zero_shot"] = {0: evaluate("zero_shot", lambda: zero_shot_policy(preset))}
    rows["grpo"], rows["grpo_messages_dropped"], curves, story = {}, {}, {}, None
    for seed in preset.training_seeds if only_seed is None else (only_seed,):
        seed_dir = os.path.join(out_dir, f"seed{seed}")
        model, tokenizer, history = train_seed(preset, seed, seed_dir, resume=resume, progress=progress,
                                               source=source)
        curves[seed] = [{k: r.get(k) for k in ("step", "return_mean", "sr", "cr", "kl", "parse_failures",
                                               "message_chars_mean")} for r in history]
        engine = make_engine(preset, model, tokenizer)
        rows["grpo"][seed] = evaluate(f"grpo_seed{seed}", lambda: LanguagePolicy(engine, preset.eval_agent(),
                                                                                 name="grpo"))
        rows["grpo_messages_dropped"][seed] = evaluate(
            f"grpo_messages_dropped_seed{seed}",
            lambda: LanguagePolicy(engine, preset.eval_agent(communicate=False), name="grpo_messages_dropped"))
        if seed == preset.training_seeds[0]:
            story = _cached_story(os.path.join(out_dir, "eval", "storyboard.json"), engine, preset,
                                  eval_specs(preset))
    if only_seed is not None:
        return None
    by_variation = {v: {m: {s: r[v] for s, r in seeds.items()} for m, seeds in rows.items()} for v in variations}
    results = summarise(preset, by_variation.pop("nominal"), curves, distilled)
    results["variations"] = {v: {"role": variation_role(preset, v)} | comparison(
        preset, r, starts_distilled(preset, distilled)) | {"rows": _rows_record(r)} for v, r in by_variation.items()}
    results["storyboard"] = story
    _write(os.path.join(out_dir, "results.json"), results)
    return results


TRAINING_WORLD, HELD_OUT_WORLD = "training world, held-out episodes", "held-out variation"


def variation_role(preset: Preset, variation: str) -> str:
    """What an evaluated world is to the trained policies: the training world's evaluation
    episodes are held-out seeds of the layouts they trained on; any other scaled world is held out."""
    return TRAINING_WORLD if variation == preset.train.variation else HELD_OUT_WORLD


def zero_shot_policy(preset: Preset):
    """``zero_shot_model`` answering as the start policy does (prompts, grammar, decoding)."""
    from jax_drive.coop.agent import LanguagePolicy
    from jax_drive.pipelines.engines import ModelSpec, load_model

    model, tokenizer = load_model(ModelSpec(preset.zero_shot_model))
    return LanguagePolicy(make_engine(preset, model, tokenizer), preset.eval_agent(), name="zero_shot")


def _eval_path(out_dir: str, name: str, variation: str) -> str:
    return os.path.join(out_dir, "eval", name + ("" if variation == "nominal" else f"@{variation}") + ".json")


def _rows_record(rows: dict[str, dict[int, list[dict]]]) -> dict:
    return {m: {str(s): r for s, r in v.items()} for m, v in rows.items()}


def comparison(preset: Preset, rows: dict[str, dict[int, list[dict]]], distilled: bool = False) -> dict:
    """On one set of held-out episodes: the per-method summary (untrained rows: one "seed"
    per evaluation seed; ``distilled``: the start is the distilled policy, its row also named
    so; else the start is the zero-shot policy, also named so, unless a ``zero_shot`` row was
    evaluated), grpo - start and messages dropped - grpo paired differences."""
    untrained = [m for m in ("rule_based", "zero_shot", "start") if m in rows]
    by_eval_seed = {m: {s: [r for r in rows[m][0] if r["seed"] == s] for s in preset.eval_seeds} for m in untrained}
    summary = {m: method_summary(by_eval_seed[m]) for m in by_eval_seed}
    summary |= {m: method_summary(rows[m]) for m in ("grpo", "grpo_messages_dropped")}
    if distilled:
        summary["distilled"] = summary["start"] | {"same_as": "start"}
    elif "zero_shot" not in summary:
        summary["zero_shot"] = summary["start"] | {"same_as": "start"}
    start = rows["start"][0]
    return {"summary": summary,
            "grpo_vs_start": {"sr_diff": paired_difference(rows["grpo"], start, "sr"),
                              "cr_diff": paired_difference(rows["grpo"], start, "cr")},
            "messages_dropped_vs_grpo": {k: paired_difference(rows["grpo_messages_dropped"], rows["grpo"], k[:2])
                                         for k in ("sr_diff", "cr_diff")}}


def starts_distilled(preset: Preset, distilled: dict | None) -> bool:
    """Whether the start policy is a distilled student: distilled in this run (``distilled``,
    its record) or a saved student's directory given as the preset's ``model``."""
    return distilled is not None or os.path.isdir(preset.model)


def summarise(preset: Preset, rows: dict[str, dict[int, list[dict]]], curves: dict,
              distilled: dict | None = None) -> dict:
    """The results on the nominal held-out episodes: preset, :func:`comparison`, the
    per-episode rows and the learning curves; with a distilled start (``distilled``: its data
    and training record) or a saved student's directory as the preset's ``model`` (the
    TalkingVehicles distilled student), its row is also the ``distilled`` row."""
    compared = comparison(preset, rows, starts_distilled(preset, distilled))
    not_run = {}
    if not starts_distilled(preset, distilled):
        not_run["distilled"] = ("needs the TalkingVehicles distilled student (experiments/talking_vehicles.py "
                                "--method distilled); pass its directory as the preset's model to start from it")
    elif "zero_shot" not in rows:
        start = (f"{preset.model!r} distilled from the language rule teacher" if distilled is not None
                 else f"the student saved in {preset.model} ({preset.start})")
        not_run["zero_shot"] = (f"the start policy is {start}; its base model's zero-shot answers are not evaluated "
                                "(zero_shot_model names a model whose zero-shot answers are then evaluated)")
    return {"preset": preset_record(preset), "start_policy": preset.start, "role": variation_role(preset, "nominal"),
            **compared, "not_run": not_run,
            "distillation": distilled, "rows": _rows_record(rows), "curves": {str(s): c for s, c in curves.items()}}


def _write(path: str, payload: dict) -> None:
    from jax_drive.runinfo import write_json

    write_json(path, payload)


def plot_curves(results: dict, path: str) -> str:
    """Training return and SR per step, one line per training seed, beside the held-out SR and
    CR of each method (bars with standard errors; one bar per variation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    for seed, curve in results["curves"].items():
        steps = [c["step"] for c in curve]
        axes[0].plot(steps, [c["return_mean"] for c in curve], label=f"seed {seed}")
        axes[1].plot(steps, [c["sr"] for c in curve], label=f"seed {seed}")
    axes[0].set(xlabel="trainer step", ylabel="joint return (training groups)", title="return")
    axes[1].set(xlabel="trainer step", ylabel="SR % (training groups)", title="success while training")
    for ax in axes[:2]:
        ax.legend(fontsize=8)
    names = [m for m, row in results["summary"].items() if "same_as" not in row]  # one bar per policy
    blocks = {"nominal": results} | results.get("variations", {})
    sets = {_world_label(v, b): b["summary"] for v, b in blocks.items()}
    width = 0.8 / len(sets)
    for ax, key in zip(axes[2:], ("sr", "cr")):
        for k, (label, summary) in enumerate(sets.items()):
            shown = [m for m in names if m in summary]
            x = np.array([names.index(m) for m in shown]) + (k - (len(sets) - 1) / 2) * width
            ax.bar(x, [summary[m][key]["mean"] for m in shown], width, yerr=[summary[m][key]["sem"] for m in shown],
                   capsize=3, label=label)
        ax.set_xticks(range(len(names)), [_label(results, m) for m in names], rotation=20, ha="right", fontsize=8)
        ax.set(ylabel=f"{key.upper()} % (held-out episodes)", title=f"frozen evaluation: {key.upper()}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _world_label(variation: str, block: dict) -> str:
    """A world's legend entry: its name, and 'training world' where the policies trained."""
    return variation + (" (training world)" if block.get("role") == TRAINING_WORLD else "")


def _label(results: dict, method: str) -> str:
    """The method's name, with the rows that are the same policy ("start = distilled")."""
    same = [m for m, row in results["summary"].items() if row.get("same_as") == method]
    return " = ".join([method] + same)


def summary_table(results: dict) -> str:
    """Methods x (SR, CR, seeds) and the paired differences, as text: the nominal held-out
    episodes, then each evaluated variation, each titled with its role (:func:`variation_role`)."""
    lines = []
    blocks = [("nominal", results)] + list(results.get("variations", {}).items())
    for title, block in blocks:
        title += f": {block['role']}" if "role" in block else ""  # older results have no roles
        lines.append(f"{'method (' + title + ')':32s} {'SR %':>14s} {'CR %':>14s} seeds")
        for name, row in block["summary"].items():
            sr, cr = row["sr"], row["cr"]
            lines.append(f"{name:32s} {sr['mean']:7.1f} ± {sr['sem']:4.1f} {cr['mean']:7.1f} ± {cr['sem']:4.1f} "
                         f"{row['seeds']:5d}")
        for label, key in (("grpo - start", "grpo_vs_start"), ("messages dropped - grpo", "messages_dropped_vs_grpo")):
            for name, diff in block[key].items():
                lines.append(f"{label} {name}: {diff['mean']:+.1f} (95 % CI {diff['ci95'][0]:+.1f} .. "
                             f"{diff['ci95'][1]:+.1f}; {diff['episodes']} episodes x {diff['training_seeds']} seeds)")
    return "\n".join(lines)


def write_plots(results: dict, prefix: str) -> list[str]:
    """``<prefix>curves.png`` (:func:`plot_curves`) and ``<prefix>storyboard.png`` (the trained
    policy's storyboard episode with its messages)."""
    from jax_drive.coop.render import render_storyboard

    written = [plot_curves(results, prefix + "curves.png")]
    if results.get("storyboard"):
        fig = render_storyboard(results["storyboard"], title=f"trained (grpo) policy: {results['storyboard']['episode']}")
        fig.savefig(prefix + "storyboard.png", dpi=110)
        written.append(prefix + "storyboard.png")
    return written
