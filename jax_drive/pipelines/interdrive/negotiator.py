"""CoLMDriver's small-model path: teacher dialogues as SFT data, the LoRA fine-tune, the
held-out decision probe, and the negotiator behind a local engine or a served model.

:func:`sft_examples` runs the driving loop with the rule-based teacher
(:class:`~jax_drive.coop.negotiation.RuleTeacher`: its yield decisions written as short
dialogues, sum-actions JSON and consensus scores, with deliberately wrong first rounds for
part of the groups) on training seeds disjoint from the evaluation seeds and records every
request as a chat example; :func:`finetune` trains LoRA adapters with
:func:`jax_drive.rl.sft.sft_train` and exports them (PEFT format); :func:`make_negotiator`
loads the tuned model behind a ``JaxEngine`` (or any OpenAI-compatible server).
"""

from __future__ import annotations

import collections
import os

import jax
import numpy as np

from jax_drive.coop.negotiation import (
    CONTROL_5HZ,
    LLMNegotiator,
    NegotiatingPolicy,
    RecordingNegotiator,
    RuleTeacher,
    TeacherConfig,
)
from jax_drive.coop.negotiation.prompts import MAX_WORDS
from jax_drive.coop.negotiation.teacher import stated_speed
from jax_drive.coop.runner import run_episodes
from jax_drive.pipelines import engines
from jax_drive.pipelines.interdrive.arms import arm_config, episode_plan
from jax_drive.pipelines.interdrive.presets import Preset, consensus_readout, engine_spec, model_spec
from jax_drive.sampling import SamplingParams
from jax_drive.sampling.grammar import actor_reply_grammar
from jax_drive.sim import metrics as M


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


def consensus_class(example: dict) -> int | None:
    """The score a consensus example's answer states (after snapping), or None."""
    from jax_drive.coop.negotiation.critic import parse_consensus

    score, _ = parse_consensus(example["messages"][-1]["content"])
    return None if score is None else int(round(100 * score))


def balanced_order(classes: list, order: list[int]) -> list[int]:
    """``order`` (indices into ``classes``) re-interleaved so that taking its first n gives
    every class as equal a share as it has examples: round-robin over the classes, each in
    its ``order``; classes with few examples run out and the rest fill the remainder."""
    queues: dict = {}
    for i in order:
        queues.setdefault(classes[i], []).append(i)
    out = []
    for k in range(max((len(q) for q in queues.values()), default=0)):
        out += [q[k] for q in queues.values() if k < len(q)]
    return out


def equal_shares(labels: list, n: int, seed: int = 0) -> list[int]:
    """Indices into ``labels`` of ``n`` picks giving every distinct label an equal share (the
    first ``n % k`` labels, in sorted order, one more); each label's indices in a fixed random
    order, repeated when the label has fewer than its share; the picks shuffled."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    groups: dict = {}
    for i, label in enumerate(labels):
        groups.setdefault(label, []).append(i)
    if not groups:
        return []
    rng = np.random.default_rng(seed)
    picks = []
    for j, label in enumerate(sorted(groups, key=repr)):
        share = n // len(groups) + (j < n % len(groups))
        order = rng.permutation(groups[label])
        picks += [int(order[k % len(order)]) for k in range(share)]
    return [picks[i] for i in rng.permutation(len(picks))]


def select_examples(examples: list[dict], counts, seed: int = 0, max_chars: int | None = None,
                    consensus_scores=None) -> list[dict]:
    """Up to ``counts`` examples per kind, distinct prompts of at most ``max_chars``
    characters, half of the actor examples (when available) from later rounds (after a
    first round, mostly with the critic's feedback). Actor answers the teacher gave
    deliberately wrong (``wrong``) are left out: they exist for the critic's examples
    and for the recovery after its feedback, not to be imitated. Consensus examples are
    chosen class-balanced over the score they state (equal shares per score as far as
    each has examples); with ``consensus_scores`` their scores are first snapped to the
    nearest allowed value (the critic's answer space)."""
    from jax_drive.coop.negotiation.consensus import snap_answer

    if consensus_scores:
        examples = [dict(e, messages=e["messages"][:-1] + [{"role": "assistant", "content": snap_answer(
            e["messages"][-1]["content"], consensus_scores)}]) if e["kind"] == "consensus" else e for e in examples]
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
        if kind == "consensus":
            order = balanced_order([consensus_class(e) for e in pool], order)
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


def critic_probe_examples(recorded: list[dict], selected: list[dict], n: int, seed: int = 0) -> list[dict]:
    """Up to ``n`` consensus examples of the recorded teacher data whose prompts SFT did not
    select (distinct prompts), as many where the teacher saw agreement as where it did not
    (:func:`ended_in_agreement`), in a fixed random order."""
    seen = {e["messages"][-2]["content"] for e in selected}
    pool, prompts = [], set()
    for e in recorded:
        prompt = e["messages"][-2]["content"]
        if e["kind"] == "consensus" and prompt not in seen and prompt not in prompts and consensus_class(e) is not None:
            prompts.add(prompt)
            pool.append(e)
    order = [int(i) for i in np.random.default_rng(seed).permutation(len(pool))]
    return [pool[i] for i in balanced_order([ended_in_agreement(e) for e in pool], order)[:n]]


def ended_in_agreement(example: dict) -> bool:
    """Whether the teacher judged a consensus example's conversation an agreement: its score
    (every conflicting pair settled with exactly one side yielding, or no conflict) is at
    least the critic's consensus threshold (80)."""
    from jax_drive.coop.negotiation.critic import CriticConfig

    return (consensus_class(example) or 0) >= 100 * CriticConfig().consensus_feedback_below


def critic_discrimination(negotiator, examples: list[dict]) -> dict:
    """How well the critic's consensus score separates the examples' agreements from the
    rest (:func:`~jax_drive.coop.negotiation.critic.separation_auc`), from one
    ``consensus_answers`` call: the score it reads out (the expected score under the
    'expected' read-out) and, where the answer also states a sampled number, that number's.
    Returns {"n", "agreed", "auc", "auc_sampled", "mean_agreed", "mean_not", "unreadable",
    "readout", "examples" (a few)}."""
    from jax_drive.coop.negotiation.critic import parse_consensus, separation_auc

    if not examples:
        raise ValueError("no consensus examples to probe")
    answers = negotiator.consensus_answers([e["messages"][:-1] for e in examples])
    agreed = np.asarray([ended_in_agreement(e) for e in examples], bool)
    scores = np.asarray([(parse_consensus(a)[0] if parse_consensus(a)[0] is not None else np.nan) for a in answers])
    readouts = getattr(negotiator, "last_readouts", None) or []
    sampled = [parse_consensus(r)[0] for r in getattr(negotiator, "last_sampled", [])] if readouts else []
    unreadable = int(np.isnan(scores).sum())
    filled = np.nan_to_num(scores, nan=0.0)  # an unreadable score counts as no consensus, as in the loop

    def auc(values):
        try:
            return separation_auc(values, agreed)
        except ValueError:
            return None

    return {"n": len(examples), "agreed": int(agreed.sum()), "readout": getattr(negotiator, "consensus_readout", None),
            "auc": auc(filled), "auc_sampled": auc(np.nan_to_num(np.asarray(sampled, float), nan=0.0))
            if len(sampled) == len(examples) else None,
            "mean_agreed": float(filled[agreed].mean()) if agreed.any() else None,
            "mean_not": float(filled[~agreed].mean()) if (~agreed).any() else None, "unreadable": unreadable,
            "examples": [{"teacher": e["messages"][-1]["content"], "critic": a} for e, a in zip(examples[:4], answers)]}


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
    grammar = actor_reply_grammar(MAX_WORDS) if preset.constrain_answers else None  # the closed loop's replies
    params = SamplingParams(max_new_tokens=preset.actor_tokens, temperature=0.0, grammar=grammar)
    outs = engine.generate_chat([e["messages"][:-1] for e in examples], params, jax.random.key(0))
    targets = [e["messages"][-1]["content"] for e in examples]
    report = decision_agreement(targets, [o.text for o in outs])
    report["examples"] = [{"teacher": t, "model": o.text} for t, o in zip(targets[:6], outs)]
    return report


def load_model(preset: Preset, adapter_dir: str | None = None, lora: bool = False):
    """(model, tokenizer): the preset's base model, with a trained adapter or fresh LoRA."""
    return engines.load_model(model_spec(preset, adapter_dir, lora))


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
                    served_model: str | None = None, critic_adapter: str | None = None) -> LLMNegotiator:
    """The LLM negotiator: 'jax' (local model + adapter) or 'openai' (a server at ``url``);
    with ``critic_adapter`` the consensus critic is the preset's local model with that
    adapter (e.g. :mod:`~jax_drive.pipelines.interdrive.critic`'s critic-only fine-tune)."""
    if engine not in engines.ENGINE_KINDS:
        raise ValueError(f"unknown engine {engine!r}; choose 'jax' or 'openai'")
    if engine == "openai" and not url:
        raise ValueError("--engine openai needs a server url")
    if engine == "openai":
        backend = engines.make_engine(engine_spec(preset, url, served_model))
    else:
        backend = engines.make_engine(engine_spec(preset), *load_model(preset, adapter_dir))
    critic = None if critic_adapter is None else engines.make_engine(engine_spec(preset),
                                                                     *load_model(preset, critic_adapter))
    return LLMNegotiator(backend, preset.style, actor_tokens=preset.actor_tokens,
                         consensus_tokens=preset.consensus_tokens, temperature=preset.temperature, name=engine,
                         constrain_answers=preset.constrain_answers, consensus_scores=preset.consensus_scores,
                         consensus_readout=consensus_readout(preset, "jax" if critic_adapter else engine),
                         critic_engine=critic)
