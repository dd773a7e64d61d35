"""Evaluation over seeds: runs episodes per seed, computes the scenario family's metrics
per seed and aggregates them with mean and standard error across seeds."""

from __future__ import annotations

import jax
import numpy as np
from tqdm import tqdm

from jax_drive.sim import metrics as M, runner, scenarios as S
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


def evaluate(name: str, policy, *, seeds=(0, 1, 2), episodes: int = 10, config: str = "alternate",
             background: bool = False, cfg: SimConfig = SimConfig(), record: bool = False,
             keep_first_trajectory: bool = False, show_progress: bool = False) -> dict:
    """Runs ``episodes`` per seed (one batch per seed) and aggregates.

    Returns a dict with: scenario, family, policy, config, background, per_seed (list of
    metric dicts), aggregate ({metric: {mean, se}}), bytes_per_message, feedback_examples,
    first_episode (EpisodeResult, if kept), transitions (if recorded), results.
    """
    fam = S.family(name)
    keys_m = TV_KEYS if fam == "talking_vehicles" else ID_KEYS
    flags = episode_flags(config, episodes)
    per_seed, all_results, transitions = [], [], []
    bar = tqdm(total=len(list(seeds)), desc=f"{name} [{policy.name}]", disable=not show_progress, leave=False)
    for seed in seeds:
        keys = [jax.random.fold_in(jax.random.key(int(seed)), k) for k in range(episodes)]
        results, trs = runner.run_episodes(name, keys, accident_prone=flags, policy=policy, background=background,
                                           cfg=cfg, record=record, keep_trajectory=keep_first_trajectory)
        for tr in trs:
            tr.episode += 1000 * int(seed)
        transitions.extend(trs)
        all_results.extend(results)
        if fam == "talking_vehicles":
            per_seed.append(M.talking_vehicles_rates([o for r in results for o in r.outcomes]))
        else:
            per_seed.append(M.interdrive_rates([r.metrics for r in results]))
        bar.update(1)
    bar.close()
    sent = sum(r.messages_sent for r in all_results)
    nbytes = sum(r.bytes_sent for r in all_results)
    feedback = []
    for r in all_results:
        for line in r.feedback:
            if line not in feedback:
                feedback.append(line)
    return {
        "scenario": name,
        "family": fam,
        "policy": policy.name,
        "config": config,
        "background": background,
        "episodes_per_seed": episodes,
        "seeds": [int(s) for s in seeds],
        "per_seed": per_seed,
        "aggregate": M.aggregate_seeds(per_seed, keys_m),
        "split": _split(all_results, fam),
        "bytes_per_message": nbytes / sent if sent else 0.0,
        "messages_per_episode": sent / max(len(all_results), 1),
        "feedback_examples": feedback[:6],
        "first_episode": all_results[0] if all_results else None,
        "transitions": transitions,
        "results": all_results,
    }


def _split(results, fam) -> dict:
    """Metrics of accident-prone and safe episodes separately (pooled over seeds)."""
    out = {}
    for label, flag in (("accident_prone", True), ("safe", False)):
        rs = [r for r in results if r.accident_prone == flag]
        if not rs:
            continue
        if fam == "talking_vehicles":
            out[label] = M.talking_vehicles_rates([o for r in rs for o in r.outcomes])
        else:
            out[label] = M.interdrive_rates([r.metrics for r in rs])
    return out


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
    out = {k: v for k, v in report.items() if k not in skip}
    return jsonable(out)


def jsonable(x):
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, float) and x != x:
        return None
    return x
