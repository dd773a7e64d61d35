"""CoLMDriver's Fig. 5 (negotiation quality per round with and without the critic) and an
episode drawn beside its negotiation dialogue."""

from __future__ import annotations

import collections
import copy

import numpy as np

from jax_drive.coop.negotiation import CONTROL_5HZ, NegotiatingPolicy, RoundsConfig, RuleTeacher, negotiate
from jax_drive.coop.negotiation.policy import snapshot_waypoints
from jax_drive.coop.runner import run_episodes
from jax_drive.pipelines.interdrive.arms import arm_config, episode_plan
from jax_drive.pipelines.interdrive.presets import Preset


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


def render_dialogue(result, log: list[dict], path: str, frames: int = 4, max_lines: int = 30) -> str:
    """PNG: ``frames`` top-down frames of one episode (``keep_trajectory=True``) beside its
    negotiation dialogue (per negotiation: time, members, messages, summed intentions,
    scores, feedback)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from jax_drive.coop.render import as_story, as_written, draw_frame, story_extent, story_label

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
    side.text(0.0, 1.0, as_written("\n".join(lines)), va="top", fontsize=6.5, family="monospace")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)
