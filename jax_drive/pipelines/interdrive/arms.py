"""The rows of CoLMDriver's Table 2 and how one policy is evaluated on InterDrive.

Arms (:data:`ARMS`): (1) no negotiation, (2) negotiation without grouping (every two
negotiating vehicles within ``radius`` talk), (3) + conflict grouping, (4) + the critic's
safety / efficiency feedback, (5) + the consensus score; beside them the rule-based and
silent baselines of :mod:`jax_drive.coop.baselines`. The ``rule_based`` row (labelled
"V2V rule driver") is a command-level driver that reads the other vehicles' shared state
over V2V: it never negotiates, so it is not the negotiation loop with a rule negotiator
(that is ``--engine teacher``). A
rule-based intention planner stands in for the paper's VLM intention planner
(:mod:`jax_drive.coop.negotiation.intention`): no camera, no VLM.
"""

from __future__ import annotations

import collections
import dataclasses
import time

import jax
import numpy as np

from jax_drive.coop import baselines
from jax_drive.coop.evaluate import summarise
from jax_drive.coop.negotiation import CONTROL_5HZ, NegotiatingPolicy, NegotiationConfig, RoundsConfig
from jax_drive.coop.runner import run_episodes
from jax_drive.names import BASELINES, INTERDRIVE_ARMS as ARMS
from jax_drive.pipelines.interdrive.presets import Preset
from jax_drive.sim import metrics as M
from jax_drive.sim.grouping import GroupingConfig

# Revision of the closed loop the results come from: evaluation units, Fig. 5 studies and
# renderings record it, and the pipeline runs those of another revision again.
LOOP_REVISION = 2
ARM_LABELS = {"1_no_negotiation": "(1) no negotiation", "2_no_grouping": "(2) nego, no grouping",
              "3_grouping": "(3) + grouping", "4_critic_se": "(4) + critic S/E", "5_consensus": "(5) + consensus",
              "rule_based": "V2V rule driver (no negotiation)", "silent": "silent"}
KEYS = ("DS", "RC", "IS", "SR")
# Table 2 as data: per negotiating arm (conflict grouping, critic feedback, consensus score)
ARM_SETTINGS = {"2_no_grouping": (False, False, False), "3_grouping": (True, False, False),
                "4_critic_se": (True, True, False), "5_consensus": (True, True, True)}


def arm_config(arm: str, preset: Preset) -> NegotiationConfig:
    """The :class:`NegotiationConfig` of one Table 2 row."""
    if arm == "1_no_negotiation":
        return NegotiationConfig(negotiate=False)
    if arm not in ARM_SETTINGS:
        raise ValueError(f"unknown arm {arm!r}; choose one of {ARMS}")
    grouped, critic, consensus = ARM_SETTINGS[arm]
    grouping = GroupingConfig() if grouped else GroupingConfig(radius=preset.radius)
    rounds = RoundsConfig(critic=critic, consensus=consensus, max_rounds=preset.max_rounds,
                          rounds_without_critic=preset.rounds_without_critic, turns=preset.turns, style=preset.style)
    return NegotiationConfig(grouping=grouping, rounds=rounds, negotiate_every=preset.negotiate_every)


def negotiates(arm: str) -> bool:
    """Whether the arm talks (needs a negotiator)."""
    return arm in ARM_SETTINGS


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


def episodes_detail(results, tags) -> list[dict]:
    """One record per episode of :func:`evaluate_policy`'s ``results``: its (type, seed, k),
    configuration, DS / RC / IS, success, end time and the agents' outcomes."""
    return [{"type": t[0], "seed": t[1], "k": t[2], "accident_prone": r.accident_prone,
             **{k: r.metrics[k] for k in ("DS", "RC", "IS")}, "success": r.metrics["success"],
             "end_time": r.end_time, "outcomes": [o.outcome for o in r.outcomes]} for t, r in zip(tags, results)]


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
