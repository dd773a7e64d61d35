"""Evaluating TalkingVehicles policies: batched episodes, their records, CR / SR / TR
summaries over scenarios and seeds, the Table 3 latency figures and the printed tables.

A policy is evaluated on the same held-out episodes as every other method (the ``eval``
split: scenarios x seeds x episodes, accident-prone and safe alternating), one batch per
seed; each seed's chunk of records can be saved and is then loaded, not run again, as long
as the policy, the episodes and the time cap are the same (the chunk's file name carries a
hash of them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence

import numpy as np
from tqdm.auto import tqdm

from jax_drive.coop.agent import LanguagePolicy
from jax_drive.coop.learning import EpisodeSpec, MemoryContext, episode_specs, run_specs
from jax_drive.pipelines.talking_vehicles.presets import Preset
from jax_drive.runinfo import write_json
from jax_drive.sim import metrics as M

TV_KEYS = ("CR", "SR", "TR")


def eval_specs(preset: Preset, method: str, variation: str = "nominal") -> list[EpisodeSpec]:
    """``method``'s evaluation episodes (in a held-out ``variation``: the same episodes, scaled)."""
    return episode_specs(preset.scenarios, preset.seeds, preset.episodes_for(method), "eval", variation=variation)


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


def episode_record(spec: EpisodeSpec, result, failures=None, commands=None) -> dict:
    """JSON record of one evaluated episode (enough to recompute every metric); ``commands``:
    the language policy's decisions by command (None for a policy that keeps no count)."""
    return {"episode": spec.tag, "scenario": spec.scenario, "seed": spec.seed, "index": spec.index,
            "accident_prone": result.accident_prone, "policy": result.policy, "end_time": result.end_time,
            "bytes_sent": result.bytes_sent, "messages_sent": result.messages_sent,
            "outcomes": [dataclasses.asdict(o) for o in result.outcomes], "metrics": result.metrics,
            "parse_failures": dict(failures or {}), "commands": None if commands is None else dict(commands)}


def command_mix(records: Sequence[dict]) -> dict | None:
    """The decisions of the records' language policy by command, summed over episodes, and
    the share that kept the lane and speed (``keep``: a valid answer or the parse-failure
    fallback); None when no record counted commands (rule-based policies, older records)."""
    counted = [r["commands"] for r in records if r.get("commands") is not None]
    if not counted:
        return None
    total: dict[str, int] = {}
    for commands in counted:
        for k, v in commands.items():
            total[k] = total.get(k, 0) + int(v)
    decisions = sum(total.values())
    return {"decisions": decisions, "commands": dict(sorted(total.items(), key=lambda kv: -kv[1])),
            "keep_share": total.get("keep", 0) / decisions if decisions else None}


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
            "command_mix": command_mix(records), "episodes": len(results)}


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
    failures, commands = getattr(policy, "failures", {}), getattr(policy, "commands", None)
    from jax_drive.coop.render import episode_story  # matplotlib only when a storyboard is kept

    return {"records": [episode_record(s, r, failures.get(n), None if commands is None else commands.get(n, {}))
                        for n, (s, r) in enumerate(zip(specs, results))],
            "calls": [dataclasses.asdict(c) for c in getattr(policy, "calls", [])],
            "seconds": time.perf_counter() - start,
            "storyboard": None if pick is None else episode_story(results[pick], specs[pick].tag)}


def chunk_key(identity: dict | None, specs: Sequence[EpisodeSpec], max_time: float | None) -> str:
    """12 hex digits naming one seed's chunk: the policy's identity, the episodes' tags and
    the time cap (anything else would reuse another evaluation's records)."""
    from jax_drive.pipelines.talking_vehicles.identity import digest

    return digest({"policy": identity, "episodes": [s.tag for s in specs], "max_time": max_time})


def evaluate(make_policy: Callable[[], object], specs: Sequence[EpisodeSpec], *, progress: bool = True,
             story: str | None = None, label: str = "", max_time: float | None = None,
             chunk_dir: str | None = None, identity: dict | None = None) -> dict:
    """Evaluates the policy ``make_policy()`` (built only when a chunk has to run) on
    ``specs``, one batch per seed; with ``chunk_dir`` every seed's chunk is saved
    (``<label>_eval_seed<s>_<key>.json``, :func:`chunk_key` of ``identity``, the seed's
    episodes and ``max_time``) and a saved chunk of the same key is loaded, not rerun (a long
    evaluation resumes where it stopped; a changed policy runs again). Returns
    :func:`summarise_records`' summary plus latency, evaluation seconds, the storyboard and
    the chunk keys."""
    specs = list(specs)
    chunks, keys, policy = [], [], None
    for seed in sorted({s.seed for s in specs}):
        part = [s for s in specs if s.seed == seed]
        keys.append(chunk_key(identity, part, max_time))
        path = os.path.join(chunk_dir, f"{label}_eval_seed{seed}_{keys[-1]}.json") if chunk_dir else None
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                chunks.append(json.load(f))
            continue
        policy = policy or make_policy()
        chunk = evaluate_chunk(policy, part, progress=progress, story=story, label=label, max_time=max_time)
        if path:
            write_json(path, chunk | {"policy_identity": identity})
        chunks.append(chunk)
    out = summarise_records([r for c in chunks for r in c["records"]])
    out["eval_seconds"] = float(sum(c["seconds"] for c in chunks))
    out["latency"] = latency_summary([call for c in chunks for call in c["calls"]])
    out["chunk_keys"] = keys
    story_rec = next((c["storyboard"] for c in chunks if c.get("storyboard")), None)
    if story_rec is not None:
        out["storyboard"] = story_rec
    return out


class EmptyAnswers:
    """An engine whose every answer is empty text. A :class:`LanguagePolicy` over it takes the
    parse-failure fallback (``keep``, no message) at every decision: what an LLM row scores
    when none of its answers parses, on the same rows of agents."""

    def generate_chat(self, conversations, params, key):
        from jax_drive.sampling.engine import Completion

        return [Completion((), (), "", (), "stop") for _ in conversations]


def fallback_policy(communicate: bool) -> LanguagePolicy:
    """The keep-only reference of an LLM method that does (or does not) communicate."""
    from jax_drive.coop.agent import AgentConfig

    return LanguagePolicy(EmptyAnswers(), AgentConfig(communicate=communicate), name="keep_only")


def same_outcomes(result: dict, reference: dict, keys: Sequence[str] = TV_KEYS) -> dict:
    """Scenario by scenario and seed by seed, whether ``result``'s CR / SR / TR equal
    ``reference``'s (two :func:`summarise_records` summaries of the same episodes):
    {"scenarios": {name: bool}, "all": bool}."""
    def per_seed(summary, name):
        return {p["seed"]: tuple(p[k] for k in keys) for p in summary["scenarios"][name]["per_seed"]}

    names = sorted(set(result["scenarios"]) | set(reference["scenarios"]))
    same = {n: n in result["scenarios"] and n in reference["scenarios"]
            and per_seed(result, n) == per_seed(reference, n) for n in names}
    return {"scenarios": same, "all": all(same.values())}


def _cell(aggregate: dict, key: str) -> str:
    """One table cell: an aggregate's mean ± SE of ``key``."""
    return f"{aggregate[key]['mean']:5.1f}±{aggregate[key]['se']:4.1f}"


def scores_as_keep(result: dict) -> bool:
    """Whether a result (or one variation's block) scores what the keep-only fallback scores on
    every scenario and seed (its ``keep_fallback["all"]``)."""
    return bool((result.get("keep_fallback") or {}).get("all"))


def by_variation(result: dict) -> dict[str, dict]:
    """{"nominal": result, <variation>: its block, ...}: a method's result in every setting it holds."""
    return {"nominal": result} | result.get("variations", {})


def table_rows(results: dict[str, dict], scenarios: Sequence[str], keys: Sequence[str] = ("CR", "SR")) -> str:
    """Plain-text table of ``keys`` (CR, SR and optionally TR): one row per method (mean ± SE
    over seeds), scenarios then the average. A method whose result carries
    ``keep_fallback["all"]`` (it scores what the keep-only fallback scores on every scenario
    and seed) is marked ``=keep``."""
    width = 12 * len(keys)
    head = f"{'method':24s}" + "".join(f"{s.replace('tv_', ''):>{width}s}" for s in [*scenarios, 'average'])
    lines = [head, " " * 24 + "".join(f"{k:>12s}" for k in keys) * (len(scenarios) + 1)]
    for method, r in results.items():
        cells = []
        for agg in [r["scenarios"][s]["aggregate"] for s in scenarios] + [r["average"]["aggregate"]]:
            cells += [_cell(agg, k) for k in keys]
        name = method + (" =keep" if scores_as_keep(r) else "")
        lines.append(f"{name:24s}" + "".join(f"{c:>12s}" for c in cells))
    return "\n".join(lines)


def variation_rows(results: dict[str, dict], keys: Sequence[str] = ("CR", "SR")) -> str:
    """Plain-text table of the average ``keys`` (mean ± SE over seeds) per method at nominal
    and in each held-out variation its result holds (``variations``); ``=keep`` marks a cell
    that equals the keep-only fallback on every scenario and seed."""
    names = ["nominal"] + sorted({v for r in results.values() for v in r.get("variations", {})})
    width = 12 * len(keys) + 6
    lines = [f"{'method':24s}" + "".join(f"{n:>{width}s}" for n in names),
             " " * 24 + ("      " + "".join(f"{k:>12s}" for k in keys)) * len(names)]
    for method, r in results.items():
        blocks = by_variation(r)
        cells = ""
        for n in names:
            block = blocks.get(n)
            if block is None:
                cells += f"{'-':>{width}s}"
                continue
            agg = block["average"]["aggregate"]
            mark = "=keep" if scores_as_keep(block) else ""
            cells += f"{mark:>6s}" + "".join(_cell(agg, k).rjust(12) for k in keys)
        lines.append(f"{method:24s}" + cells)
    return "\n".join(lines)


# (row, baseline row, what their difference measures): Table 1's questions
METHOD_PAIRS = (("zero_shot", "zero_shot_silent", "communication"),
                ("reflection", "zero_shot", "reflection"),
                ("debrief", "zero_shot", "debrief"),
                ("debrief", "reflection", "debrief over reflection"))


def seed_scenario_matrix(result: dict, key: str) -> np.ndarray:
    """(seeds, scenarios) of a summary's ``key`` (CR / SR / TR), seeds and scenarios sorted."""
    scenarios = sorted(result["scenarios"])
    seeds = sorted(p["seed"] for p in result["scenarios"][scenarios[0]]["per_seed"])
    by = {(n, p["seed"]): p[key] for n in scenarios for p in result["scenarios"][n]["per_seed"]}
    return np.array([[by[(n, s)] for n in scenarios] for s in seeds], np.float64)


def method_differences(results: dict[str, dict], pairs=METHOD_PAIRS, keys: Sequence[str] = ("SR", "CR"),
                       variation: str = "nominal") -> dict:
    """Whether communication, reflection and debrief change anything: for each pair of rows
    both present (both evaluated in ``variation``), the paired difference of each ``key`` over
    the same episodes (row minus baseline per seed and scenario; mean and the hierarchical
    bootstrap 95 % interval of :func:`jax_drive.stats.paired_bootstrap`, seeds then scenarios,
    since the learning methods learn per seed). {label: {"row", "baseline", key: {...}}}."""
    from jax_drive.stats import paired_bootstrap

    def summary(method: str) -> dict | None:
        result = results.get(method)
        if result is None or variation == "nominal":
            return result
        return result.get("variations", {}).get(variation)

    out = {}
    for row, base, label in pairs:
        mine, theirs = summary(row), summary(base)
        if mine is not None and theirs is not None:
            out[label] = {"row": row, "baseline": base} | {
                k: paired_bootstrap(seed_scenario_matrix(mine, k) - seed_scenario_matrix(theirs, k),
                                    resample_seeds=True) for k in keys}
    return out


def difference_lines(differences: dict) -> str:
    """One line per :func:`method_differences` entry: mean and interval per metric, in points."""
    lines = []
    for label, d in differences.items():
        cells = [f"{k} {d[k]['mean']:+.1f} [{d[k]['ci95'][0]:+.1f}, {d[k]['ci95'][1]:+.1f}]"
                 for k in d if k not in ("row", "baseline")]
        lines.append(f"{label} ({d['row']} - {d['baseline']}): " + "; ".join(cells))
    return "\n".join(lines)


def keep_percent(mix: dict | None) -> str:
    """A command mix's keep share in percent, '-' where none was counted."""
    return "-" if not mix or mix.get("keep_share") is None else f"{100 * mix['keep_share']:.1f}"


def mix_text(mix: dict | None, top: int = 3) -> str:
    """A command mix's ``top`` most frequent commands with their shares, e.g. ``go 62, stop 20, keep 18``."""
    if not mix or not mix.get("decisions"):
        return "-"
    return ", ".join(f"{k} {100 * v / mix['decisions']:.0f}" for k, v in list(mix["commands"].items())[:top])


def table3_rows(results: dict[str, dict]) -> str:
    """Table 3-style rows: per method, decision latency both ways (s): a batch's wall time
    divided by its agents (median / p95 over calls: amortised cost, not what an agent waits)
    and a decision step's wall time (median / p95: what every agent of the step waits), then
    agents per call, bytes per message, parse failures (every kind, cut-off answers
    included), the share of decisions that were ``keep`` and the most frequent commands
    (language policies, in percent)."""
    lines = [f"{'method':18s}{'batch/agents med':>17s}{'p95':>8s}{'step med':>10s}{'p95':>8s}{'agents/call':>13s}"
             f"{'bytes/msg':>11s}{'failures':>10s}{'keep %':>8s}  command mix %"]
    for method, r in results.items():
        lat = r.get("latency") or {}
        fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"{method:18s}{fmt(lat.get('agent_seconds_median')):>17s}{fmt(lat.get('agent_seconds_p95')):>8s}"
                     f"{fmt(lat.get('batch_seconds_median')):>10s}{fmt(lat.get('batch_seconds_p95')):>8s}"
                     f"{lat.get('agents_per_call_mean', 0):>13.1f}{r['bytes_per_message']:>11.1f}"
                     f"{sum(r.get('parse_failures', {}).values()):>10d}"
                     f"{keep_percent(r.get('command_mix')):>8s}  {mix_text(r.get('command_mix'))}")
    return "\n".join(lines)
