"""InterDrive pipeline: CoLMDriver's Table 2 ablation, its small-model path, the Fig. 5
convergence study and an episode rendering with the dialogue.

Pieces (each a plain function; ``experiments/interdrive.py`` strings them together):

* :data:`PRESETS` (``cpu-demo``, ``paper``) and :data:`ARMS`, the five rows of the seed's
  Table 2: (1) no negotiation, (2) negotiation without grouping (every two negotiating
  vehicles within 50 m talk), (3) + conflict grouping, (4) + the critic's safety /
  efficiency feedback, (5) + the consensus score; next to the rule-based and silent
  baselines of :mod:`jax_drive.coop.baselines`.
* the small-model path: :func:`sft_examples` runs the driving loop with the rule-based
  teacher (:class:`~jax_drive.coop.negotiation.RuleTeacher`; its yield decisions written as
  short dialogues, sum-actions JSON and consensus scores, with deliberately wrong first
  rounds for part of the groups) on training seeds disjoint from the evaluation seeds and
  records every request as a chat example; :func:`finetune` trains LoRA adapters of
  SmolLM2 with :func:`jax_drive.rl.sft.sft_train` and exports them (PEFT format);
  :func:`make_negotiator` loads the tuned model behind a ``JaxEngine`` (or any
  OpenAI-compatible server).
* :func:`evaluate_policy`: the preset's InterDrive episodes for one policy and one
  background setting, summarised per type and over the ten types (mean and standard error
  across seeds of the per-seed average over types), with negotiation statistics.
* :func:`convergence_study`: the seed's Fig. 5, negotiation-quality score per round with
  and without the critic's feedback on the same group situations.
* :func:`render_dialogue`: frames of one episode beside its negotiation dialogue.

A rule-based intention planner stands in for the paper's VLM intention planner
(:mod:`jax_drive.coop.negotiation.intention`): no camera, no VLM.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import os
import time

import jax
import numpy as np

from jax_drive.coop import baselines
from jax_drive.coop.evaluate import summarise
from jax_drive.coop.negotiation import (
    CONTROL_5HZ,
    LLMNegotiator,
    NegotiatingPolicy,
    NegotiationConfig,
    RecordingNegotiator,
    RoundsConfig,
    RuleTeacher,
    TeacherConfig,
    negotiate,
)
from jax_drive.coop.negotiation.policy import snapshot_waypoints
from jax_drive.coop.negotiation.teacher import stated_speed
from jax_drive.coop.runner import run_episodes
from jax_drive.rl.optim import OptimConfig
from jax_drive.rl.sft import SFTConfig
from jax_drive.sampling import SamplingParams
from jax_drive.sim import metrics as M
from jax_drive.sim import scenarios as S
from jax_drive.sim.grouping import GroupingConfig

ARMS = ("1_no_negotiation", "2_no_grouping", "3_grouping", "4_critic_se", "5_consensus")
BASELINES = ("rule_based", "silent")
# Revision of the closed loop the results come from: evaluation units, Fig. 5 studies and
# renderings record it, and experiments/interdrive.py runs those of another revision again.
# 2: a KEEP below 4 m/s becomes FASTER only when a negotiation agreed on it (revision 1
# applied the rule to every intention, the planner's own and its safety cap included).
LOOP_REVISION = 2
ARM_LABELS = {"1_no_negotiation": "(1) no negotiation", "2_no_grouping": "(2) nego, no grouping",
              "3_grouping": "(3) + grouping", "4_critic_se": "(4) + critic S/E", "5_consensus": "(5) + consensus",
              "rule_based": "rule-based", "silent": "silent"}
KEYS = ("DS", "RC", "IS", "SR")


@dataclasses.dataclass(frozen=True)
class Preset:
    """One experiment setting.

    Evaluation: ``types`` x ``backgrounds`` x ``eval_seeds`` x ``episodes_per_seed``
      episodes; ``config`` 'accident' (every episode accident-prone) or 'alternate'.
    Negotiation: prompt ``style``; ``max_rounds`` with a critic, ``rounds_without_critic``
      without; ``radius`` of arm (2); ``negotiate_every`` decisions (5 Hz control);
      ``turns`` 'parallel' (one actor call per round) or 'sequential'.
    Model: ``model`` (load_pretrained source, or 'tiny': a random tiny model); ``actor_tokens`` / ``consensus_tokens``
      generation budgets; greedy decoding at ``temperature`` 0; ``prompt_bucket`` pads
      prompts to a multiple of it; ``engine_batch`` rows per sampler call (None: all).
    Small-model path: teacher episodes on ``train_seeds`` (both backgrounds, alternating
      accident-prone and safe, ``train_episodes_per_seed`` per type) with
      ``corrupt_prob``; ``sft_counts`` examples per kind (each at most ``sft_max_chars``
      characters, which bounds the CPU training time); LoRA ``lora_rank`` / ``lora_alpha``;
      ``sft`` trainer settings.
    Fig. 5: ``convergence_groups`` group situations (first negotiations of evaluation
      episodes, collected with the teacher) negotiated for ``max_rounds`` rounds.
    Probe: ``probe_size`` first-round actor prompts of the teacher data that SFT did not
      select, answered greedily: the tuned negotiator's yield decisions against the
      teacher's, in a minute, before hours of closed-loop evaluation.
    """

    name: str
    style: str = "compact"
    types: tuple[str, ...] = S.INTERDRIVE
    backgrounds: tuple[bool, ...] = (False, True)
    eval_seeds: tuple[int, ...] = (0, 1, 2)
    episodes_per_seed: int = 1
    config: str = "accident"
    max_rounds: int = 3
    rounds_without_critic: int = 1
    radius: float = 50.0
    negotiate_every: int = 1
    turns: str = "parallel"
    model: str = "smollm2-135m-instruct"
    actor_tokens: int = 40
    consensus_tokens: int = 32
    temperature: float = 0.0
    prompt_bucket: int = 64
    engine_batch: int | None = None
    train_seeds: tuple[int, ...] = (100, 101, 102, 103)
    train_episodes_per_seed: int = 2
    corrupt_prob: float = 0.35
    sft_counts: tuple[tuple[str, int], ...] = (("actor", 360), ("sum", 120), ("consensus", 120))
    sft_max_chars: int | None = 1000
    lora_rank: int = 16
    lora_alpha: float = 32.0
    sft: SFTConfig = SFTConfig(optim=OptimConfig(learning_rate=5e-4), batch_size=4, max_steps=300, max_length=768,
                               bucket_size=32, checkpoint_every=10)
    convergence_groups: int = 24
    probe_size: int = 128

    def __post_init__(self):
        overlap = set(self.train_seeds) & set(self.eval_seeds)
        if overlap:
            raise ValueError(f"training and evaluation seeds overlap: {sorted(overlap)}")
        unknown = [t for t in self.types if t not in S.INTERDRIVE]
        if unknown:
            raise ValueError(f"unknown InterDrive types {unknown}")


PRESETS = {
    # Two CPU cores shared with other jobs: SmolLM2-135M + LoRA rank 16, the compact prompts
    # (~110-230 prompt tokens), one accident-prone episode per type, background setting
    # and seed (30 per setting and arm); 600 SFT examples selected, 300 steps of 4 (two
    # epochs, ~48 min at ~9.6 s per step on a quiet CPU). 90 steps (0.6 epoch) left a
    # negotiator that said STOP to all 128 held-out probe prompts (agreement with the teacher
    # 0.50, its majority share) and deadlocked arm 5 (DS 39.3 / SR 26.7 without background);
    # 300 steps: agreement 0.62, STOP in 107 of 128. Arms 2 and 3 (no critic) talk one round,
    # the paper preset three: the CPU budget, so from (3) to (4) the critic adds its extra
    # rounds as well as its feedback.
    "cpu-demo": Preset(name="cpu-demo"),
    # A GPU (vLLM serving Qwen2.5-3B-Instruct, the paper's negotiator size, via --engine
    # openai): the paper-style prompts, four episodes per type and setting and seed
    # alternating accident-prone and safe, three rounds with and without the critic,
    # 20k SFT examples for three epochs at full rank.
    "paper": Preset(name="paper", style="paper", episodes_per_seed=4, config="alternate", rounds_without_critic=3,
                    model="Qwen2.5-3B-Instruct", actor_tokens=64, consensus_tokens=64, prompt_bucket=128,
                    engine_batch=256, train_seeds=tuple(range(100, 140)), train_episodes_per_seed=4,
                    sft_counts=(("actor", 12000), ("sum", 4000), ("consensus", 4000)), sft_max_chars=None,
                    lora_rank=64,
                    lora_alpha=128.0,
                    sft=SFTConfig(optim=OptimConfig(learning_rate=1e-4), batch_size=32, epochs=3, max_length=2048,
                                  bucket_size=64, checkpoint_every=200),
                    convergence_groups=200),
    # A check of every stage in minutes: a random tiny model over the byte tokenizer
    # (it cannot negotiate; its output exercises the parsers' failure paths), two types,
    # one seed, no background traffic, a handful of SFT examples and steps.
    "smoke": Preset(name="smoke", types=("ic_straight_straight", "ic_straight_left"), backgrounds=(False,),
                    eval_seeds=(0,), max_rounds=2, model="tiny", actor_tokens=8, consensus_tokens=8,
                    train_seeds=(100,), train_episodes_per_seed=1,
                    sft_counts=(("actor", 6), ("sum", 3), ("consensus", 3)), lora_rank=4, lora_alpha=8.0,
                    sft=SFTConfig(optim=OptimConfig(learning_rate=1e-3), batch_size=2, max_steps=2, max_length=1536,
                                  bucket_size=64, checkpoint_every=None),
                    convergence_groups=2, probe_size=4),
}


def arm_config(arm: str, preset: Preset) -> NegotiationConfig:
    """The :class:`NegotiationConfig` of one Table 2 row."""
    rounds = dict(max_rounds=preset.max_rounds, rounds_without_critic=preset.rounds_without_critic,
                  turns=preset.turns, style=preset.style)
    grouping = GroupingConfig()
    if arm == "1_no_negotiation":
        return NegotiationConfig(negotiate=False)
    if arm == "2_no_grouping":
        return NegotiationConfig(grouping=dataclasses.replace(grouping, radius=preset.radius),
                                 rounds=RoundsConfig(critic=False, consensus=False, **rounds),
                                 negotiate_every=preset.negotiate_every)
    if arm == "3_grouping":
        return NegotiationConfig(rounds=RoundsConfig(critic=False, consensus=False, **rounds),
                                 negotiate_every=preset.negotiate_every)
    if arm == "4_critic_se":
        return NegotiationConfig(rounds=RoundsConfig(critic=True, consensus=False, **rounds),
                                 negotiate_every=preset.negotiate_every)
    if arm == "5_consensus":
        return NegotiationConfig(rounds=RoundsConfig(critic=True, consensus=True, **rounds),
                                 negotiate_every=preset.negotiate_every)
    raise ValueError(f"unknown arm {arm!r}; choose one of {ARMS}")


# ----------------------------------------------------------------------- episodes
def episode_plan(types, seeds, per_seed: int, config: str) -> tuple[list[str], list, list[bool], list[tuple]]:
    """(names, keys, accident_prone flags, (type, seed, k) tags) of an episode set; keys are
    ``fold_in(key(seed), k)`` as in :mod:`jax_drive.coop.evaluate`."""
    names, keys, flags, tags = [], [], [], []
    for name in types:
        for seed in seeds:
            for k in range(per_seed):
                names.append(name)
                keys.append(jax.random.fold_in(jax.random.key(int(seed)), k))
                flags.append(True if config == "accident" else k % 2 == 0)
                tags.append((name, int(seed), k))
    return names, keys, flags, tags


def make_policy(arm: str, preset: Preset, negotiator=None, keep_snapshots: bool = False):
    """The policy of an arm or baseline (``negotiator`` for arms 2-5)."""
    if arm in BASELINES:
        return baselines.make_policy(arm)
    return NegotiatingPolicy(negotiator if arm != "1_no_negotiation" else None, arm_config(arm, preset),
                             name=arm, keep_snapshots=keep_snapshots)


def negotiation_stats(log: list[dict]) -> dict:
    """Counts, rounds, parse failures and mean scores per round of negotiation records."""
    rounds = [r for rec in log for r in rec["rounds"]]
    by_round = collections.defaultdict(list)
    for rec in log:
        for r in rec["rounds"]:
            by_round[r["round"]].append(r)
    return {
        "negotiations": len(log),
        "messages_cut": sum(rec.get("messages_cut", 0) for rec in log),
        "messages": sum(len(rec.get("conversation", [])) for rec in log),
        "rounds_hist": dict(collections.Counter(len(rec["rounds"]) for rec in log)),
        "group_size_hist": dict(collections.Counter(len(rec["vids"]) for rec in log)),
        "sum_parse": dict(collections.Counter(r["sum_source"] for r in rounds)),
        "sum_missing_rate": float(np.mean([bool(r["sum_missing"]) for r in rounds])) if rounds else None,
        "consensus_unreadable": sum(r.get("consensus_error") is not None for r in rounds),
        "feedback_lines": dict(collections.Counter(f.split(":")[0] for r in rounds for f in r["feedback"])),
        "per_round": {int(k): {key: float(np.mean([x[key] for x in v if x.get(key) is not None]))
                               if any(x.get(key) is not None for x in v) else None
                               for key in ("quality", "safety", "efficiency", "consensus")} | {"n": len(v)}
                      for k, v in sorted(by_round.items())},
    }


def evaluate_policy(policy, preset: Preset, background: bool, *, progress=None, keep_trajectory=False) -> dict:
    """Runs the preset's episodes of one background setting in one batch and summarises.

    Returns {"per_type": {type: coop.evaluate.summarise(...)}, "overall": {"per_seed",
    "aggregate"} (per seed: the average over types of the per-type metric), "negotiation"
    (stats when the policy negotiates), "wall_seconds", "results" (EpisodeResults, tags)}.
    """
    names, keys, flags, tags = episode_plan(preset.types, preset.eval_seeds, preset.episodes_per_seed, preset.config)
    start = time.perf_counter()
    results, _ = run_episodes(names, keys, accident_prone=flags, policy=policy, background=background,
                              cfg=CONTROL_5HZ, keep_trajectory=keep_trajectory, progress=progress)
    wall = time.perf_counter() - start
    by_type: dict = collections.defaultdict(lambda: collections.defaultdict(list))
    for (name, seed, _), r in zip(tags, results):
        by_type[name][seed].append(r)
    per_type = {name: summarise(dict(by_seed), "interdrive") for name, by_seed in by_type.items()}
    per_seed = []
    for seed in preset.eval_seeds:
        rates = [M.interdrive_rates([r.metrics for r in by_type[name][seed]]) for name in preset.types]
        per_seed.append({k: float(np.mean([x[k] for x in rates])) for k in KEYS} | {"seed": int(seed)})
    out = {"per_type": per_type, "overall": {"per_seed": per_seed, "aggregate": M.aggregate_seeds(per_seed, KEYS)},
           "episodes": len(results), "wall_seconds": wall, "results": (results, tags)}
    if isinstance(policy, NegotiatingPolicy):
        out["negotiation"] = negotiation_stats(policy.log)
        usage = getattr(policy.negotiator, "usage", None)
        if usage is not None:
            out["engine"] = dataclasses.asdict(usage)
    return out


# ------------------------------------------------------------------ small model
def sft_examples(preset: Preset, *, progress=None) -> tuple[list[dict], dict]:
    """Chat examples from teacher-driven episodes on the training seeds (both background
    settings, alternating accident-prone and safe); returns (examples, info)."""
    teacher = RecordingNegotiator(RuleTeacher(TeacherConfig(corrupt_prob=preset.corrupt_prob, seed=1)), preset.style)
    policy = NegotiatingPolicy(teacher, arm_config("5_consensus", preset), name="teacher")
    names, keys, flags, _ = episode_plan(preset.types, preset.train_seeds, preset.train_episodes_per_seed,
                                         "alternate")
    outcomes = {}
    for bg in (False, True):
        results, _ = run_episodes(names, keys, accident_prone=flags, policy=policy, background=bg, cfg=CONTROL_5HZ,
                                  progress=progress)
        outcomes["with_background" if bg else "without_background"] = M.interdrive_rates([r.metrics for r in results])
    info = {"train_seeds": list(preset.train_seeds), "episodes": 2 * len(names), "teacher_driving": outcomes,
            "recorded": dict(collections.Counter(e["kind"] for e in teacher.examples))}
    return teacher.examples, info


def select_examples(examples: list[dict], counts, seed: int = 0, max_chars: int | None = None) -> list[dict]:
    """Up to ``counts`` examples per kind, distinct prompts of at most ``max_chars``
    characters, half of the actor examples (when available) from later rounds (after a
    first round, mostly with the critic's feedback). Actor answers the teacher gave
    deliberately wrong (``wrong``) are left out: they exist for the critic's examples
    and for the recovery after its feedback, not to be imitated."""
    rng = np.random.default_rng(seed)
    chosen = []
    for kind, n in counts:
        seen, pool = set(), []
        for e in examples:
            key = e["messages"][-2]["content"]
            size = sum(len(m["content"]) for m in e["messages"])
            if (e["kind"] == kind and not e.get("wrong") and key not in seen
                    and (max_chars is None or size <= max_chars)):
                seen.add(key)
                pool.append(e)
        order = list(rng.permutation(len(pool)))
        if kind == "actor":
            late = [i for i in order if pool[i]["round"] > 0]
            first = late[: n // 2]
            order = first + [i for i in order if i not in set(first)]
        chosen += [pool[i] for i in order[:n]]
    return [chosen[i] for i in rng.permutation(len(chosen))]


def probe_examples(recorded: list[dict], selected: list[dict], n: int, seed: int = 0) -> list[dict]:
    """Up to ``n`` first-round actor examples of the recorded teacher data whose prompts SFT
    did not select (distinct prompts, a fixed random order), none deliberately wrong. Their
    episodes are the training seeds' (held-out prompts, not held-out scenarios)."""
    seen = {e["messages"][-2]["content"] for e in selected}
    pool, prompts = [], set()
    for e in recorded:
        prompt = e["messages"][-2]["content"]
        if (e["kind"] == "actor" and e["round"] == 0 and not e.get("wrong") and prompt not in seen
                and prompt not in prompts):
            prompts.add(prompt)
            pool.append(e)
    order = np.random.default_rng(seed).permutation(len(pool))
    return [pool[i] for i in order[:n]]


def decision_agreement(targets: list[str], answers: list[str]) -> dict:
    """The speed intentions stated in ``answers`` against those in the teacher's ``targets``
    (:func:`~jax_drive.coop.negotiation.teacher.stated_speed`; 'NONE' when a reply states none).

    Returns {"n", "agreement" (same class), "yield_agreement" (both yield, STOP or SLOWER, or
    both do not), "majority" (the share of the teacher's most common class: what always
    answering it would score), "teacher" / "model" class counts, "confusion"
    {"TEACHER>MODEL": count}}.
    """
    if len(targets) != len(answers):
        raise ValueError(f"{len(targets)} targets but {len(answers)} answers")
    if not targets:
        raise ValueError("no examples to compare")
    want = [stated_speed(t) or "NONE" for t in targets]
    got = [stated_speed(a) or "NONE" for a in answers]
    yields = ("STOP", "SLOWER")
    n = len(want)
    return {"n": n, "agreement": sum(a == b for a, b in zip(want, got)) / n,
            "yield_agreement": sum((a in yields) == (b in yields) for a, b in zip(want, got)) / n,
            "majority": collections.Counter(want).most_common(1)[0][1] / n,
            "teacher": dict(collections.Counter(want)), "model": dict(collections.Counter(got)),
            "confusion": dict(collections.Counter(f"{a}>{b}" for a, b in zip(want, got)))}


def decision_probe(engine, examples: list[dict], preset: Preset) -> dict:
    """Greedy replies of ``engine`` (one ``generate_chat`` call) to the examples' prompts,
    scored by :func:`decision_agreement` against the teacher's replies; plus a few
    (teacher, model) reply pairs."""
    params = SamplingParams(max_new_tokens=preset.actor_tokens, temperature=0.0)
    outs = engine.generate_chat([e["messages"][:-1] for e in examples], params, jax.random.key(0))
    targets = [e["messages"][-1]["content"] for e in examples]
    report = decision_agreement(targets, [o.text for o in outs])
    report["examples"] = [{"teacher": t, "model": o.text} for t, o in zip(targets[:6], outs)]
    return report


def load_model(preset: Preset, adapter_dir: str | None = None, lora: bool = False):
    """(model, tokenizer): the preset's base model, with a trained adapter or fresh LoRA."""
    from flax import nnx

    from jax_drive.models import load_pretrained
    from jax_drive.models.export import load_peft
    from jax_drive.models.lora import apply_lora, remove_lora

    if preset.model == "tiny":
        from jax_drive.models.tiny import tiny_policy

        model, _, tokenizer = tiny_policy(seed=0, lora_rank=None)
    else:
        model, _, tokenizer = load_pretrained(preset.model)
    if lora:  # training: recompute decoder blocks in the backward pass (much less memory)
        model.config = dataclasses.replace(model.config, remat_layers=True)
    if adapter_dir is not None:
        remove_lora(load_peft(model, adapter_dir), merge=True)  # inference: fold the adapter in
    elif lora:
        apply_lora(model, rank=preset.lora_rank, alpha=preset.lora_alpha, rngs=nnx.Rngs(1))
    return model, tokenizer


def finetune(preset: Preset, examples: list[dict], out_dir: str, *, progress: bool = True) -> dict:
    """LoRA SFT of the preset's model on ``examples`` (resumes from ``out_dir``'s
    checkpoints); exports the adapter to ``out_dir/adapter``. Returns a summary of the whole
    run (read from its metrics file, so a resumed run reports every step)."""
    from jax_drive.models.export import export_peft
    from jax_drive.rl.logging import read_jsonl
    from jax_drive.rl.sft import sft_train

    adapter = os.path.join(out_dir, "adapter")
    model, tokenizer = load_model(preset, lora=True)
    data = [{"messages": e["messages"]} for e in examples]
    result = sft_train(model, data, preset.sft, tokenizer=tokenizer, out_dir=os.path.join(out_dir, "sft"),
                       resume=True, progress=progress)
    export_peft(model, adapter, base_model_name=preset.model)
    metrics = os.path.join(out_dir, "sft", "metrics.jsonl")
    history = read_jsonl(metrics) if os.path.exists(metrics) else result.history
    losses = [h["loss"] for h in history if "loss" in h]
    return {"adapter": adapter, "steps": int(result.state.step), "examples": len(data),
            "loss_first": losses[0] if losses else None, "loss_last_10": float(np.mean(losses[-10:])) if losses else None,
            "seconds": float(sum(h.get("step_seconds", 0.0) for h in history))}


def make_negotiator(preset: Preset, engine: str = "jax", *, adapter_dir: str | None = None, url: str | None = None,
                    served_model: str | None = None) -> LLMNegotiator:
    """The LLM negotiator: 'jax' (local model + adapter) or 'openai' (a server at ``url``)."""
    if engine == "jax":
        from jax_drive.sampling import JaxEngine, SamplerConfig

        model, tokenizer = load_model(preset, adapter_dir)
        buckets = tuple(range(preset.prompt_bucket, 8192 + 1, preset.prompt_bucket))
        backend = JaxEngine(model, tokenizer, SamplerConfig(prompt_buckets=buckets), max_batch_size=preset.engine_batch)
    elif engine == "openai":
        from jax_drive.sampling import OpenAIEngine

        if not url:
            raise ValueError("--engine openai needs a server url")
        backend = OpenAIEngine(url, served_model or preset.model, max_concurrency=64)
    else:
        raise ValueError(f"unknown engine {engine!r}; choose 'jax' or 'openai'")
    return LLMNegotiator(backend, preset.style, actor_tokens=preset.actor_tokens,
                         consensus_tokens=preset.consensus_tokens, temperature=preset.temperature, name=engine)


# ------------------------------------------------------------------------ Fig. 5
def collect_situations(preset: Preset, limit: int, *, background: bool = False, progress=None) -> list:
    """Group situations as negotiation starts (the first negotiation of each group label
    per episode), from teacher-driven evaluation episodes; at most ``limit``, spread over
    the types."""
    policy = NegotiatingPolicy(RuleTeacher(), arm_config("5_consensus", preset), name="collect", keep_snapshots=True)
    names, keys, flags, _ = episode_plan(preset.types, preset.eval_seeds, preset.episodes_per_seed, preset.config)
    run_episodes(names, keys, accident_prone=flags, policy=policy, background=background, cfg=CONTROL_5HZ,
                 progress=progress)
    by_type, seen = collections.defaultdict(list), set()
    for snap in policy.snapshots:
        key = (snap.scenario, snap.group.episode, tuple(snap.group.vids))
        if key not in seen:
            seen.add(key)
            by_type[snap.scenario].append(snap)
    chosen, k = [], 0
    while len(chosen) < limit and any(k < len(v) for v in by_type.values()):
        chosen += [v[k] for v in by_type.values() if k < len(v)][: limit - len(chosen)]
        k += 1
    return chosen


def _fresh(snap):
    g = copy.deepcopy(snap.group)
    g.done, g.conversation, g.rounds, g.feedback, g.intents, g.scratch = False, [], [], [], {}, {}
    return g


def convergence_study(negotiator, preset: Preset, situations: list) -> dict:
    """Negotiation-quality score (3 consensus + 5 safety + 2 efficiency) per round on the same
    situations with the critic's feedback (stopping early; a stopped group keeps its last
    score in later rounds) and without it (all rounds, no feedback). All groups of a
    condition negotiate together (one engine call per request kind and round)."""
    out = {}
    conditions = {"with_critic": RoundsConfig(critic=True, consensus=True, max_rounds=preset.max_rounds,
                                              turns=preset.turns, style=preset.style),
                  "without_critic": RoundsConfig(critic=False, consensus=False, log_consensus=True,
                                                 rounds_without_critic=preset.max_rounds, turns=preset.turns,
                                                 style=preset.style)}
    for label, cfg in conditions.items():
        copies = [copy.copy(s) for s in situations]
        for c in copies:
            c.group = _fresh(c)
        groups = [c.group for c in copies]
        negotiate(groups, negotiator, snapshot_waypoints(copies), cfg)
        scores = np.full((len(groups), preset.max_rounds), np.nan)
        for i, g in enumerate(groups):
            q = [r["quality"] for r in g.rounds]
            scores[i, :len(q)] = q
            scores[i, len(q):] = q[-1] if q else np.nan
        out[label] = {"scores": scores.tolist(), "mean": np.nanmean(scores, 0).tolist(),
                      "se": (np.nanstd(scores, 0, ddof=1) / np.sqrt(max(len(groups), 1))).tolist(),
                      "rounds_used": dict(collections.Counter(len(g.rounds) for g in groups)),
                      "examples": [g.record() for g in groups[:3]]}
    out["situations"] = [{"scenario": s.scenario, "vids": s.group.vids, "time": s.group.time} for s in situations]
    return out


# ---------------------------------------------------------------------- rendering
def render_dialogue(result, log: list[dict], path: str, frames: int = 4, max_lines: int = 30) -> str:
    """PNG: ``frames`` top-down frames of one episode (``keep_trajectory=True``) beside its
    negotiation dialogue (per negotiation: time, members, messages, summed intentions,
    scores, feedback)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from jax_drive.coop.render import as_story, draw_frame, story_extent, story_label

    story = as_story(result)
    dt = story["decision_dt"]
    last = len(story["poses"]) - 1
    times = [rec["time"] for rec in log] or [0.0]
    picks = sorted(set(np.linspace(0, last, frames).astype(int).tolist()
                       + [min(int(t / dt), last) for t in times[:2]]))[:frames + 2]
    fig = Figure(figsize=(4.0 * len(picks) + 7.0, 5.0))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(picks) + 1, gridspec_kw={"width_ratios": [3] * len(picks) + [5]})
    extent = story_extent(story, 12.0)
    for ax, k in zip(axes[:-1], picks):
        draw_frame(ax, story, k, extent, trail_alpha=0.5)
        ax.set_title(f"t = {k * dt:.1f} s", fontsize=9)
        ax.tick_params(labelsize=6)
    side = axes[-1]
    side.axis("off")
    lines = [story_label(story),
             "Outcomes: " + "; ".join(f"{o.vehicle_id} {o.outcome}" for o in result.outcomes), ""]
    for rec in log:
        lines.append(f"[t={rec['time']:.1f} s] group {rec['vids']}")
        for r in rec["rounds"]:
            for m in rec["conversation"]:
                if m["round"] == r["round"]:
                    lines.append(f"  r{r['round'] + 1} {m['vid']}: {m['text']}")
            cons = "" if r.get("consensus") is None else f" C={r['consensus']:.2f}"
            lines.append(f"   -> {r['intents']}  S={r['safety']:.2f} E={r['efficiency']:.2f}{cons}"
                         f" Q={r['quality']:.1f}")
            for f in r["feedback"]:
                lines.append(f"   critic: {f[:80]}")
    if len(lines) > max_lines:
        lines = lines[:max_lines - 1] + [f"... ({len(lines) - max_lines + 1} more lines)"]
    side.text(0.0, 1.0, "\n".join(lines), va="top", fontsize=6.5, family="monospace")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)
