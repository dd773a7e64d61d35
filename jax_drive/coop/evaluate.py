"""Evaluation over seeds: runs episodes per seed, computes the scenario family's metrics
per seed and aggregates them with mean and standard error across seeds."""

from __future__ import annotations

import jax
import numpy as np
from tqdm import tqdm

from jax_drive.coop.runner import EpisodeResult, run_episodes
from jax_drive.sim import metrics as M, scenarios as S
from jax_drive.sim.state import SimConfig

TV_KEYS = ("CR", "SR", "TR")
ID_KEYS = ("DS", "RC", "IS", "SR")


def episode_flags(config: str, episodes: int) -> list[bool]:
    """accident-prone flags: 'alternate' (accident-prone first), 'accident' or 'safe'."""
    if config == "alternate":
        return [k % 2 == 0 for k in range(episodes)]
    if config in ("accident", "accident_prone"):
        return [True] * episodes
    if config == "safe":
        return [False] * episodes
    raise ValueError(f"unknown config {config!r}")


def rates(results: list[EpisodeResult], family: str) -> dict[str, float]:
    """The family's metrics over episodes: CR / SR / TR over agent-episodes
    (TalkingVehicles) or the means of DS / RC / IS / SR over tests (InterDrive)."""
    if family == "talking_vehicles":
        return M.talking_vehicles_rates([o for r in results for o in r.outcomes])
    return M.interdrive_rates([r.metrics for r in results])


def summarise(by_seed: dict[int, list[EpisodeResult]], family: str) -> dict:
    """Metrics of one scenario and policy from its episodes per seed: per_seed (metric
    dicts with their seed), aggregate ({metric: {mean, se}} across seeds), split
    (accident-prone and safe episodes pooled over seeds), bytes_per_message,
    messages_per_episode and up to six distinct feedback lines."""
    per_seed = [dict(rates(rs, family), seed=int(seed)) for seed, rs in sorted(by_seed.items())]
    results = [r for rs in by_seed.values() for r in rs]
    split = {}
    for label, flag in (("accident_prone", True), ("safe", False)):
        chosen = [r for r in results if r.accident_prone == flag]
        if chosen:
            split[label] = rates(chosen, family)
    sent = sum(r.messages_sent for r in results)
    return {
        "per_seed": per_seed,
        "aggregate": M.aggregate_seeds(per_seed, TV_KEYS if family == "talking_vehicles" else ID_KEYS),
        "split": split,
        "bytes_per_message": sum(r.bytes_sent for r in results) / sent if sent else 0.0,
        "messages_per_episode": sent / max(len(results), 1),
        "feedback_examples": sorted({line for r in results for line in r.feedback})[:6],
    }


def evaluate(name: str, policy, *, seeds=(0, 1, 2), episodes: int = 10, config: str = "alternate",
             background: bool = False, cfg: SimConfig = SimConfig(), record: bool = False,
             keep_first_trajectory: bool = False, show_progress: bool = False) -> dict:
    """Runs ``episodes`` per seed (one batch per seed) and aggregates.

    Returns a dict with: scenario, family, policy, config, background, episodes_per_seed,
    seeds, the fields of :func:`summarise`, first_episode (EpisodeResult), transitions
    (if recorded) and results.
    """
    family = S.family(name)
    flags = episode_flags(config, episodes)
    seeds = [int(s) for s in seeds]
    by_seed, transitions = {}, []
    for seed in tqdm(seeds, desc=f"{name} [{policy.name}]", disable=not show_progress, leave=False):
        keys = [jax.random.fold_in(jax.random.key(seed), k) for k in range(episodes)]
        results, trs = run_episodes(name, keys, accident_prone=flags, policy=policy, background=background,
                                    cfg=cfg, record=record, keep_trajectory=keep_first_trajectory)
        for tr in trs:
            tr.episode += 1000 * seed
        transitions.extend(trs)
        by_seed[seed] = results
    results = [r for s in seeds for r in by_seed[s]]
    return {
        "scenario": name,
        "family": family,
        "policy": policy.name,
        "config": config,
        "background": background,
        "episodes_per_seed": episodes,
        "seeds": seeds,
        **summarise(by_seed, family),
        "first_episode": results[0] if results else None,
        "transitions": transitions,
        "results": results,
    }


def table(reports: list[dict]) -> str:
    """Metric table (mean ± standard error over seeds) for reports of one family."""
    if not reports:
        return ""
    keys = TV_KEYS if reports[0]["family"] == "talking_vehicles" else ID_KEYS
    rows = [(f"{r['scenario']} [{r['policy']}{', bg' if r['background'] else ''}]", r["aggregate"]) for r in reports]
    return M.format_table(rows, keys)


def to_json(report: dict) -> dict:
    """JSON-safe subset of a report."""
    skip = ("first_episode", "transitions", "results")
    return jsonable({k: v for k, v in report.items() if k not in skip})


def jsonable(x):
    """Plain Python (lists, floats, ints; NaN as None) of nested dicts, lists and NumPy scalars."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return jsonable(x.item())
    if isinstance(x, float) and x != x:
        return None
    return x
