"""TalkingVehicles / CoopReflect end to end: every method of the seed's Table 1, the
distilled policy of its generalisation study and the Table 3 latency / bytes rows, on the
batched JAX simulator with a local SmolLM2 (``JaxEngine``) or a vLLM server
(``OpenAIEngine``).

Methods (:data:`METHODS`), each evaluated on the same held-out episodes (the ``eval``
split: scenarios x seeds x episodes, accident-prone and safe alternating), memories frozen:

  * ``rule_based``, ``silent``: the non-language baselines of :mod:`jax_drive.coop.baselines`;
  * ``zero_shot_silent``, ``zero_shot``: LLM agents without / with messages;
  * ``reflection``, ``correction_rag``, ``debrief``: the learning methods of
    :mod:`jax_drive.coop.learning` (learn first on the ``learn`` split, then evaluate);
  * ``central_memory``: the debrief memories of every scenario in one store retrieved by
    observation (generalisation study; needs the debrief run first);
  * ``distilled``: a SmolLM2 fine-tuned on successful talking episodes
    (:mod:`jax_drive.coop.distill`; ``distill`` split) and driven with compact prompts.

:func:`run_method` is restartable: each method writes ``<run_dir>/<method>.json`` (and its
learning checkpoint, distillation data and student model) and a finished method is
loaded, not rerun.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence

import numpy as np
from tqdm.auto import tqdm

from jax_drive.compile_cache import enable_compile_cache
from jax_drive.coop.agent import AgentConfig, LanguagePolicy
from jax_drive.coop.distill import StudentConfig
from jax_drive.coop.memory import MemoryBank
from jax_drive.coop.learning import (
    LEARNING_METHODS,
    EpisodeSpec,
    Lane,
    LearningConfig,
    MemoryContext,
    episode_specs,
    lanes_for,
    run_specs,
)
from jax_drive.rl.optim import OptimConfig
from jax_drive.rl.sft import SFTConfig
from jax_drive.sim import metrics as M
from jax_drive.sim.scenarios import TALKING_VEHICLES

from jax_drive.pipelines.talking_vehicles_names import BASELINES, LLM_METHODS, METHODS, PRESET_NAMES  # noqa: F401
TV_KEYS = ("CR", "SR", "TR")
# Sampler prompt buckets: multiples of 8 up to 128 (the distilled policy's ~40-token
# prompts pad to 40 or 48, not 64), then coarser.
PROMPT_BUCKETS = tuple(range(16, 129, 8)) + (160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 1024, 1536, 2048,
                                            3072, 4096, 8192)


@dataclasses.dataclass(frozen=True)
class Preset:
    """One experiment setting.

    Attributes:
      name: preset name.
      model: the LLM agents' model: a ``load_pretrained`` source ('smollm2-135m-instruct', a
        directory, a GGUF file) or 'tiny' (random tiny model, tests); with engine 'openai'
        the served model name.
      engine: 'jax' (local JaxEngine) or 'openai' (an OpenAI-compatible server, e.g. vLLM).
      base_url: the server of engine 'openai'.
      server_command: how the paper setting expects the server to be started (documentation).
      scenarios, seeds: evaluation and learning lanes.
      eval_episodes: evaluation episodes per scenario per seed of the LLM methods.
      baseline_eval_episodes, student_eval_episodes: the same for rule_based / silent and for
        the distilled policy (cheaper policies get more episodes; the first ``eval_episodes``
        are the LLM methods' episodes; None = ``eval_episodes``).
      agent: prompts and decoding of the LLM agents (full style).
      learning: the learning protocol.
      distill_episodes, distill_seeds, distill_epsilons: teacher episodes per scenario per
        seed of the ``distill`` split, one exploration epsilon per distillation seed.
      distill_keep_fraction: share of uninformative teacher decisions kept
        (:func:`~jax_drive.coop.distill.select_informative`).
      dagger_rounds: DAgger rounds after the first student (0 = none): the latest student
        drives ``dagger_episodes`` new episodes per scenario per distillation seed with the
        teacher labelling every state it visits (:func:`~jax_drive.coop.distill.collect_student`),
        and the student is fine-tuned further for ``dagger_epochs`` on the teacher data plus
        every round's labelled data.
      student_model: base model of the distilled policy (local ``load_pretrained`` source).
      student_path: an already distilled policy (a saved model directory) to evaluate
        instead of distilling one ("" = distil).
      student: its fine-tuning; student_agent: its prompts and decoding (compact style).
      max_batch: rows per sampler call of the local engine (memory bound; one
        ``generate`` call per decision may run several).
      embed_tokens: texts are cut to this many tokens for retrieval embeddings.
      max_time: optional cap on evaluation episodes' length, s (quick checks; None = each
        scenario's own time limit).
    """

    name: str
    model: str = "smollm2-135m-instruct"
    engine: str = "jax"
    base_url: str = "http://localhost:8000/v1"
    server_command: str = ""
    scenarios: tuple[str, ...] = TALKING_VEHICLES
    seeds: tuple[int, ...] = (0, 1, 2)
    eval_episodes: int = 30
    baseline_eval_episodes: int | None = None
    student_eval_episodes: int | None = None
    agent: AgentConfig = AgentConfig()
    learning: LearningConfig = LearningConfig()
    distill_episodes: int = 10
    distill_seeds: tuple[int, ...] = (0, 1, 2)
    distill_epsilons: tuple[float, ...] = (0.0, 0.1, 0.2)
    distill_keep_fraction: float = 0.2
    dagger_rounds: int = 0
    dagger_episodes: int = 3
    dagger_epochs: int = 1
    student_model: str = "smollm2-135m-instruct"
    student_path: str = ""
    student: StudentConfig = StudentConfig()
    student_agent: AgentConfig = AgentConfig(style="compact", max_new_tokens=28)
    max_batch: int = 128
    embed_tokens: int = 192
    max_time: float | None = None

    def __post_init__(self):
        if self.engine not in ("jax", "openai"):
            raise ValueError(f"engine must be 'jax' or 'openai', got {self.engine!r}")
        if len(self.distill_epsilons) != len(self.distill_seeds):
            raise ValueError("one exploration epsilon per distillation seed")
        if min(self.eval_episodes, self.baseline_eval_episodes or 1, self.student_eval_episodes or 1) < 1:
            raise ValueError("evaluation episode counts must be >= 1")
        if self.dagger_rounds < 0 or min(self.dagger_episodes, self.dagger_epochs) < 1:
            raise ValueError("dagger_rounds must be >= 0, dagger_episodes and dagger_epochs >= 1")

    def episodes_for(self, method: str) -> int:
        """Evaluation episodes per scenario per seed of ``method``."""
        extra = {"distilled": self.student_eval_episodes}.get(method, self.baseline_eval_episodes
                                                               if method in BASELINES else None)
        return max(extra or self.eval_episodes, self.eval_episodes)


# The distilled student's training data repeats each rare command up to this share
# (:func:`jax_drive.coop.distill.balance_commands`).
MIN_COMMAND_SHARE = 0.08


def _presets() -> dict[str, Preset]:
    return {
        # Tests and dry runs: random tiny model, two scenarios, one seed, two episodes cut at 6 s
        # (the distillation teacher's episodes run in full).
        "smoke": Preset(
            name="smoke", model="tiny", student_model="tiny", scenarios=TALKING_VEHICLES[:2], seeds=(0,),
            eval_episodes=2, baseline_eval_episodes=2,
            agent=AgentConfig(max_new_tokens=8), student_agent=AgentConfig(style="compact", max_new_tokens=8),
            learning=LearningConfig(max_episodes=1, solved_streak=1, max_resets=0, reflection_tokens=8,
                                    discussion_tokens=8, max_time=6.0),
            distill_episodes=2, distill_seeds=(0,), distill_epsilons=(0.0,),
            student=StudentConfig(sft=SFTConfig(optim=OptimConfig(learning_rate=1e-3, trainable="full"),
                                                batch_size=4, max_steps=2, bucket_size=32, max_length=512)),
            max_batch=64, embed_tokens=64, max_time=6.0,
        ),
        # Sized for the shared 2-core CPU (several helpers' jobs at once; SmolLM2 then gets
        # ~0.3-0.5 cores: ~3-8 s per full-prompt agent decision, ~1-2 s per compact one):
        # the protocol's minimum for the SmolLM2 methods, 2 episodes per scenario per seed (one
        # accident-prone, one safe), no chain of thought, 24-token answers (a JSON command with
        # a short message fits); one learning episode per lane (accident-prone) for reflection /
        # correction / debrief, no reset (a 60-episode trial is out of reach here); rule-based
        # and silent on 10 episodes, the distilled policy on 4. The student: full fine-tuning,
        # 2 epochs, on ~2.6k informative decisions of 108 teacher episodes (3 seeds x 6
        # scenarios x 6, exploration 0 / 0.1 / 0.2), each command repeated up to 8 % of the
        # data (1 epoch without repeats got left lane changes right 0 of 6 times, right ones 1 of 5,
        # on held-out teacher decisions); then two DAgger rounds: the student drives 4 new
        # episodes per scenario per seed with the teacher labelling, and trains 1 more epoch on
        # everything (the student alone pulled out into oncoming traffic it could see, states
        # the teacher's own episodes never reach; one round took CR 20.8 -> 5.6 %, SR 72.9 ->
        # 79.9 %, with red-light timeouts left).
        "cpu-demo": Preset(
            name="cpu-demo", eval_episodes=2, baseline_eval_episodes=10, student_eval_episodes=4,
            agent=AgentConfig(max_new_tokens=24),
            learning=LearningConfig(max_episodes=1, solved_streak=1, max_resets=0, reflection_tokens=128,
                                    discussion_tokens=80),
            distill_episodes=6, distill_seeds=(0, 1, 2), distill_epsilons=(0.0, 0.1, 0.2),
            dagger_rounds=2, dagger_episodes=4,
            student=StudentConfig(sft=SFTConfig(optim=OptimConfig(learning_rate=1e-4, trainable="full"),
                                                batch_size=16, epochs=2, bucket_size=16, max_length=128,
                                                checkpoint_every=20), min_command_share=MIN_COMMAND_SHARE),
        ),
        # The seed's protocol on a GPU: a vLLM-served instruct model as the LLM agents (the seed
        # used gpt-4o-mini), chain of thought on, 60 learning episodes / 20-success streak / 3
        # resets, 30 evaluation episodes x 3 seeds; the distilled SmolLM2 is fine-tuned
        # locally (full, 3 epochs) and evaluated with the JaxEngine.
        "paper": Preset(
            name="paper", model="meta-llama/Llama-3.1-8B-Instruct", engine="openai",
            base_url="http://localhost:8000/v1",
            server_command=("vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 8192 "
                            "--enable-prefix-caching --max-num-seqs 256 --gpu-memory-utilization 0.90 "
                            "--seed 0 --port 8000"),
            eval_episodes=30, baseline_eval_episodes=30,
            agent=AgentConfig(chain_of_thought=True, max_new_tokens=256),
            learning=LearningConfig(),
            distill_episodes=30, distill_seeds=(0, 1, 2), distill_epsilons=(0.0, 0.1, 0.2),
            distill_keep_fraction=0.5,
            student=StudentConfig(sft=SFTConfig(optim=OptimConfig(learning_rate=5e-5, trainable="full"),
                                                batch_size=32, epochs=3, bucket_size=16, max_length=128,
                                                checkpoint_every=200), min_command_share=MIN_COMMAND_SHARE),
            max_batch=512,
        ),
    }


PRESETS = _presets()
assert tuple(PRESETS) == PRESET_NAMES, "talking_vehicles_names.PRESET_NAMES lists the presets"


# ----------------------------------------------------------------------------- engines
def load_local(source: str, seed: int = 0):
    """(model, tokenizer) from a ``load_pretrained`` source or 'tiny'."""
    if source == "tiny":
        from jax_drive.models.tiny import tiny_policy

        model, _, tokenizer = tiny_policy(seed=seed, lora_rank=None)
        return model, tokenizer
    from jax_drive.models import load_pretrained

    model, _, tokenizer = load_pretrained(source)
    return model, tokenizer


def local_engine(model, tokenizer, max_batch: int = 128):
    """A JaxEngine with fine prompt buckets (:data:`PROMPT_BUCKETS`)."""
    from jax_drive.sampling import JaxEngine
    from jax_drive.sampling.sampler import SamplerConfig

    return JaxEngine(model, tokenizer, SamplerConfig(prompt_buckets=PROMPT_BUCKETS, min_gen_bucket=8),
                     max_batch_size=max_batch)


class Engines:
    """Builds and keeps the engines a run needs: the LLM agents' engine (local or
    OpenAI-compatible), its embedder (retrieval) and the distilled student's engine."""

    def __init__(self, preset: Preset):
        self.preset = preset
        self._agent = None
        self._local = None

    def _local_model(self):
        if self._local is None:
            source = self.preset.model if self.preset.engine == "jax" else self.preset.student_model
            self._local = load_local(source)
        return self._local

    def agent(self):
        """The engine of the LLM agents."""
        if self._agent is None:
            if self.preset.engine == "openai":
                from jax_drive.sampling import OpenAIEngine

                self._agent = OpenAIEngine(self.preset.base_url, self.preset.model, max_concurrency=64)
            else:
                self._agent = local_engine(*self._local_model(), self.preset.max_batch)
        return self._agent

    def embedder(self):
        """Mean-pooled hidden states of the local model (the agents' own with engine 'jax')."""
        from jax_drive.coop.memory import Embedder

        model, tokenizer = self._local_model()
        return Embedder(model, tokenizer, max_tokens=self.preset.embed_tokens)


# ----------------------------------------------------------------------------- evaluation
def eval_specs(preset: Preset, method: str) -> list[EpisodeSpec]:
    return episode_specs(preset.scenarios, preset.seeds, preset.episodes_for(method), "eval")


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def latency_summary(calls: Sequence[dict]) -> dict:
    """Table 3 figures from call records (``CallRecord`` fields as dicts): the per-agent
    decision cost (batch wall time / agents in the batch) median and p95 over calls, its
    overall mean (total wall / total agent decisions), batch wall median / p95, agents per
    call and tokens per agent."""
    if not calls:
        return {}
    per_agent = [c["seconds"] / max(c["agents"], 1) for c in calls]
    agents = sum(c["agents"] for c in calls)
    return {
        "calls": len(calls), "agent_decisions": agents,
        "agent_seconds_median": percentile(per_agent, 50), "agent_seconds_p95": percentile(per_agent, 95),
        "agent_seconds_mean": sum(c["seconds"] for c in calls) / max(agents, 1),
        "batch_seconds_median": percentile([c["seconds"] for c in calls], 50),
        "batch_seconds_p95": percentile([c["seconds"] for c in calls], 95),
        "agents_per_call_mean": agents / len(calls),
        "prompt_tokens_per_agent": sum(c["prompt_tokens"] for c in calls) / max(agents, 1),
        "new_tokens_per_agent": sum(c["new_tokens"] for c in calls) / max(agents, 1),
    }


def episode_record(spec: EpisodeSpec, result, failures=None) -> dict:
    """JSON record of one evaluated episode (enough to recompute every metric)."""
    return {"episode": spec.tag, "scenario": spec.scenario, "seed": spec.seed, "index": spec.index,
            "accident_prone": result.accident_prone, "policy": result.policy, "end_time": result.end_time,
            "bytes_sent": result.bytes_sent, "messages_sent": result.messages_sent,
            "outcomes": [dataclasses.asdict(o) for o in result.outcomes], "metrics": result.metrics,
            "parse_failures": dict(failures or {})}


def result_from_record(record: dict):
    """The :class:`~jax_drive.coop.runner.EpisodeResult` of an :func:`episode_record`."""
    from jax_drive.coop.runner import EpisodeResult
    from jax_drive.sim.metrics import AgentOutcome

    return EpisodeResult(scenario=record["scenario"], accident_prone=record["accident_prone"], background=False,
                         policy=record["policy"], outcomes=[AgentOutcome(**o) for o in record["outcomes"]],
                         end_time=record["end_time"], bytes_sent=record["bytes_sent"],
                         messages_sent=record["messages_sent"], metrics=record["metrics"])


def summarise_records(records: Sequence[dict]) -> dict:
    """Per scenario: CR / SR / TR per seed, mean ± SE across seeds, accident-prone / safe
    split, bytes per message; the average over scenarios (per seed, then mean ± SE across
    seeds); parse failures summed over episodes."""
    from jax_drive.coop.evaluate import summarise

    results = [result_from_record(r) for r in records]
    groups: dict[str, dict[int, list]] = {}
    for record, result in zip(records, results):
        groups.setdefault(record["scenario"], {}).setdefault(record["seed"], []).append(result)
    scenarios = {name: summarise(by_seed, "talking_vehicles") for name, by_seed in groups.items()}
    per_seed = []
    for seed in sorted({r["seed"] for r in records}):
        rows = [next(p for p in scen["per_seed"] if p["seed"] == seed) for scen in scenarios.values()]
        per_seed.append({k: float(np.mean([r[k] for r in rows])) for k in TV_KEYS} | {"seed": seed})
    sent = sum(r.messages_sent for r in results)
    counts: dict[str, int] = {}
    for record in records:
        for k, v in record["parse_failures"].items():
            counts[k] = counts.get(k, 0) + int(v)
    return {"scenarios": scenarios, "average": {"per_seed": per_seed,
                                                 "aggregate": M.aggregate_seeds(per_seed, TV_KEYS)},
            "bytes_per_message": sum(r.bytes_sent for r in results) / sent if sent else 0.0,
            "messages_per_episode": sent / max(len(results), 1), "parse_failures": counts,
            "episodes": len(results)}


def evaluate_chunk(policy, specs: Sequence[EpisodeSpec], *, progress: bool = True, story: str | None = None,
                   label: str = "", max_time: float | None = None) -> dict:
    """Runs ``specs`` in ONE batch with ``policy``: {records, calls, seconds, storyboard}.
    ``story``: the scenario whose first accident-prone episode of the chunk is kept."""
    specs = list(specs)
    if isinstance(policy, LanguagePolicy):
        policy.reset()
    context = getattr(policy, "context", None)
    if isinstance(context, MemoryContext):
        context.specs = specs
    pick = next((n for n, s in enumerate(specs) if s.scenario == story and s.accident_prone), None)
    bar = tqdm(desc=f"eval [{label or policy.name}] ({len(specs)} episodes)", unit="decision", disable=not progress,
               leave=False)
    start = time.perf_counter()
    results, _ = run_specs(specs, policy, keep_trajectory=pick is not None, progress=lambda d: bar.update(1),
                           max_time=max_time)
    bar.close()
    failures = getattr(policy, "failures", {})
    from jax_drive.coop.render import episode_story  # matplotlib only when a storyboard is kept

    return {"records": [episode_record(s, r, failures.get(n)) for n, (s, r) in enumerate(zip(specs, results))],
            "calls": [dataclasses.asdict(c) for c in getattr(policy, "calls", [])],
            "seconds": time.perf_counter() - start,
            "storyboard": None if pick is None else episode_story(results[pick], specs[pick].tag)}


def evaluate(make_policy: Callable[[], object], specs: Sequence[EpisodeSpec], *, progress: bool = True,
             story: str | None = None, label: str = "", max_time: float | None = None,
             chunk_dir: str | None = None) -> dict:
    """Evaluates the policy ``make_policy()`` (built only when a chunk has to run) on
    ``specs``, one batch per seed; with ``chunk_dir`` every seed's chunk is saved
    (``<label>_eval_seed<s>.json``) and a saved chunk is loaded, not rerun (a long evaluation
    resumes where it stopped). Returns :func:`summarise_records`' summary plus latency,
    evaluation seconds and the storyboard."""
    specs = list(specs)
    chunks, policy = [], None
    for seed in sorted({s.seed for s in specs}):
        part = [s for s in specs if s.seed == seed]
        path = os.path.join(chunk_dir, f"{label}_eval_seed{seed}.json") if chunk_dir else None
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                chunks.append(json.load(f))
            continue
        policy = policy or make_policy()
        chunk = evaluate_chunk(policy, part, progress=progress, story=story, label=label, max_time=max_time)
        if path:
            _write(path, chunk)
        chunks.append(chunk)
    out = summarise_records([r for c in chunks for r in c["records"]])
    out["eval_seconds"] = float(sum(c["seconds"] for c in chunks))
    out["latency"] = latency_summary([call for c in chunks for call in c["calls"]])
    story_rec = next((c["storyboard"] for c in chunks if c.get("storyboard")), None)
    if story_rec is not None:
        out["storyboard"] = story_rec
    return out


def _json_path(run_dir: str, name: str) -> str:
    return os.path.join(run_dir, f"{name}.json")


def _write(path: str, payload: dict) -> None:
    from jax_drive.runinfo import write_json

    write_json(path, payload)


def learn_method(preset: Preset, method: str, engines: Engines, run_dir: str, *, progress: bool = True,
                 max_rounds: int | None = None) -> tuple[list[Lane], MemoryBank, list[dict]]:
    """Runs (or resumes) a learning method, one seed's lanes at a time, each checkpointed
    after every round in ``<run_dir>/<method>_learning_seed<s>.json``; returns every lane,
    the merged memories and the post-episode LLM call records."""
    import jax

    from jax_drive.coop.learning import Learner, load_state, save_state

    embedder = engines.embedder() if method == "correction_rag" else None
    merged, all_lanes, calls = MemoryBank(), [], []
    for seed in preset.seeds:
        path = _json_path(run_dir, f"{method}_learning_seed{seed}")
        if os.path.exists(path):
            lanes, bank, extra = load_state(path)
        else:
            lanes, bank, extra = lanes_for(preset.scenarios, [seed]), MemoryBank(), {}
        if not all(l.done for l in lanes):
            learner = Learner(method, engines.agent(), bank, preset.learning, preset.agent, embedder,
                              key=jax.random.key(1000 + seed))
            learner.llm_calls = list(extra.get("llm_calls", []))
            learner.learn(lanes, progress=progress, max_rounds=max_rounds,
                          log=lambda r, ls: save_state(path, ls, bank, {"llm_calls": learner.llm_calls}))
            extra["llm_calls"] = learner.llm_calls
            save_state(path, lanes, bank, extra)
        merged.agents.update(bank.agents)
        merged.corrections.update(bank.corrections)
        all_lanes += lanes
        calls += extra.get("llm_calls", [])
    return all_lanes, merged, calls


def lane_summary(lanes: Sequence[Lane]) -> dict:
    return {"lanes": [{"scenario": l.scenario, "seed": l.seed, "episodes": l.episodes, "resets": l.resets,
                       "solved": l.solved, "successes": int(sum(h["success"] for h in l.history))} for l in lanes],
            "episodes": int(sum(l.episodes for l in lanes)), "solved": int(sum(l.solved for l in lanes))}


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
        samples, teacher = [], []
        for seed, eps in zip(preset.distill_seeds, preset.distill_epsilons):
            specs = episode_specs(preset.scenarios, [seed], preset.distill_episodes, "distill")
            found, results = D.collect_teacher(specs, epsilon=eps, seed=seed)
            samples += found
            teacher.append({"seed": seed, "epsilon": eps, "episodes": len(results),
                            "successful": int(sum(D.episode_success(r) for r in results))})
        raw = D.data_summary(samples)
        samples = D.select_informative(D.dedupe(samples, 1), keep_fraction=preset.distill_keep_fraction)
        D.check_disjoint(samples, holdout)
        _write(info_path, {"teacher_runs": teacher, "raw_data": raw})
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
        model, tokenizer = load_local(preset.student_model)
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
        student = LanguagePolicy(local_engine(model, tokenizer, preset.max_batch), preset.student_agent,
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
        _write(info_path, {"episodes": len(specs), "student_successes": int(sum(map(D.episode_success, results))),
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
    from jax_drive.models import load_pretrained

    model, _, tokenizer = load_pretrained(model_path)
    return model, tokenizer


def run_method(preset: Preset, method: str, run_dir: str, *, engines: Engines | None = None,
               progress: bool = True, force: bool = False, story: str = "tv_overtake_perception") -> dict:
    """Runs (or loads the finished result of) one method; writes ``<run_dir>/<method>.json``."""
    from jax_drive.coop import baselines
    from jax_drive.runinfo import run_metadata

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    os.makedirs(run_dir, exist_ok=True)
    path = _json_path(run_dir, method)
    if os.path.exists(path) and not force:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    engines = engines or Engines(preset)
    specs = eval_specs(preset, method)
    start = time.perf_counter()
    extra: dict = {}
    if method in BASELINES:
        def make_policy():
            return baselines.make_policy(method)
    elif method in ("zero_shot", "zero_shot_silent"):
        def make_policy():
            agent = dataclasses.replace(preset.agent, communicate=method == "zero_shot")
            return LanguagePolicy(engines.agent(), agent, name=method)
    elif method in LEARNING_METHODS:
        lanes, bank, calls = learn_method(preset, method, engines, run_dir, progress=progress)
        extra["learning"] = lane_summary(lanes) | {"llm_calls": calls}
        extra["memory_examples"] = {k: {"knowledge": m.knowledge, "strategy": m.strategy, "versions": m.versions}
                                    for k, m in list(sorted(bank.agents.items()))[:4]}

        def make_policy():
            rag = method == "correction_rag"
            context = MemoryContext(bank, "rag" if rag else "memory", engines.embedder() if rag else None,
                                    preset.learning.rag_examples)
            return LanguagePolicy(engines.agent(), preset.agent, context=context, name=method)
    elif method == "central_memory":
        from jax_drive.coop.memory import central_memory

        if not all(os.path.exists(_json_path(run_dir, f"debrief_learning_seed{s}")) for s in preset.seeds):
            raise FileNotFoundError(f"central_memory needs the debrief run in {run_dir} first")
        _, bank, _ = learn_method(preset, "debrief", engines, run_dir, progress=progress)
        extra["central_entries"] = sum(len(m.observations) or 1 for m in bank.agents.values()
                                       if m.knowledge or m.strategy)

        def make_policy():
            embedder = engines.embedder()
            context = MemoryContext(bank, "central", embedder, central=central_memory(bank, embedder))
            return LanguagePolicy(engines.agent(), preset.agent, context=context, name=method)
    else:  # distilled
        if preset.student_path:
            model_path = preset.student_path
        else:
            model_path, extra["distill"] = distill_method(preset, run_dir, progress=progress)

        def make_policy():
            model, tokenizer = load_student(model_path)
            return LanguagePolicy(local_engine(model, tokenizer, preset.max_batch), preset.student_agent,
                                  name="distilled")
    result = evaluate(make_policy, specs, progress=progress, story=story, label=method, max_time=preset.max_time,
                      chunk_dir=run_dir)
    payload = {"method": method, "preset": preset.name, "model": preset.student_model if method == "distilled"
               else (None if method in BASELINES else preset.model), "engine": None if method in BASELINES else
               ("jax" if method == "distilled" else preset.engine), "episodes_per_seed": preset.episodes_for(method),
               "seeds": list(preset.seeds), **extra, **result, "wall_seconds": time.perf_counter() - start,
               "meta": run_metadata()}
    _write(path, payload)
    return payload


def table_rows(results: dict[str, dict], scenarios: Sequence[str]) -> str:
    """Plain-text CR / SR table: one row per method (mean ± SE over seeds), scenarios then
    the average."""
    head = f"{'method':18s}" + "".join(f"{s.replace('tv_', ''):>24s}" for s in scenarios) + f"{'average':>24s}"
    lines = [head, " " * 18 + "".join(f"{'CR':>12s}{'SR':>12s}" for _ in range(len(scenarios) + 1))]
    for method, r in results.items():
        cells = []
        for agg in [r["scenarios"][s]["aggregate"] for s in scenarios] + [r["average"]["aggregate"]]:
            cells += [f"{agg[k]['mean']:5.1f}±{agg[k]['se']:4.1f}" for k in ("CR", "SR")]
        lines.append(f"{method:18s}" + "".join(f"{c:>12s}" for c in cells))
    return "\n".join(lines)


def table3_rows(results: dict[str, dict]) -> str:
    """Table 3-style rows: per method, decision latency (per-agent cost median / p95, s) and
    bytes per message."""
    lines = [f"{'method':18s}{'latency median':>16s}{'p95':>8s}{'batch median':>14s}{'agents/call':>13s}"
             f"{'bytes/msg':>11s}"]
    for method, r in results.items():
        lat = r.get("latency") or {}
        fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"{method:18s}{fmt(lat.get('agent_seconds_median')):>16s}{fmt(lat.get('agent_seconds_p95')):>8s}"
                     f"{fmt(lat.get('batch_seconds_median')):>14s}{lat.get('agents_per_call_mean', 0):>13.1f}"
                     f"{r['bytes_per_message']:>11.1f}")
    return "\n".join(lines)


def run(preset: Preset, methods: Sequence[str], run_dir: str, *, progress: bool = True, force: bool = False,
        on_method: Callable[[str, dict], None] | None = None) -> dict[str, dict]:
    """Runs methods in order (sharing engines); returns {method: result}."""
    enable_compile_cache()
    engines = Engines(preset)
    out = {}
    for method in methods:
        out[method] = run_method(preset, method, run_dir, engines=engines, progress=progress, force=force)
        if on_method is not None:
            on_method(method, out[method])
    return out
