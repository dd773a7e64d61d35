"""The InterDrive report: Table 2 (per arm and background setting), the goal checks, the
probe, SFT and Fig. 5 summaries, and their plots."""

from __future__ import annotations

import json
import os

import numpy as np

from jax_drive.names import INTERDRIVE_ARMS as ARMS
from jax_drive.pipelines.interdrive.arms import ARM_LABELS, BASELINES, LOOP_REVISION, negotiates
from jax_drive.runinfo import InputError, run_metadata, write_json


def _load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _beyond(a, b):
    """a's mean minus its SE is above b's mean plus its SE."""
    return a["mean"] - a["se"] > b["mean"] + b["se"]


def unit_name(arm: str, background: bool) -> str:
    """One arm in one background setting: its file's stem and its key in the report."""
    return f"{arm}__{'bg' if background else 'nobg'}"


def unit_path(ctx, arm: str, background: bool) -> str:
    """Where one arm's evaluation in one background setting is kept."""
    return ctx.path("units", f"{unit_name(arm, background)}.json")


def log_path(unit_file: str) -> str:
    """The negotiation log kept beside the evaluation unit saved at ``unit_file``."""
    return os.path.splitext(unit_file)[0] + ".log.json"


def current_units(ctx, ws) -> dict[tuple[str, bool], dict]:
    """{(arm, background): unit} of the work directory's units made by this run's negotiator
    in today's closed loop (others are left out, and said so)."""
    units = {}
    for name in sorted(os.listdir(ctx.path("units"))):
        if name.endswith(".json") and not name.endswith(".log.json"):
            u = _load(ctx.path("units", name))
            if not ws.made_here(u, negotiates=negotiates(u["arm"])):
                ctx.log(f"left out {name}: made by {ws.origin(u)}, not {ws.negotiator_id()}, closed-loop "
                        f"revision {LOOP_REVISION} (--stage eval runs it again)")
                continue
            units[(u["arm"], bool(u["background"]))] = u
    if not units:
        raise InputError(f"no evaluation units in {ctx.path('units')}: run --stage eval first")
    return units


def table_and_goals(units: dict) -> tuple[dict, dict]:
    """Table 2 ({setting: {arm: aggregate}}) and the goal checks per setting."""
    table, goals = {}, {}
    for bg in (False, True):
        label = "with_background" if bg else "without_background"
        rows = {arm: units[(arm, bg)]["overall"]["aggregate"] for arm in ARMS + BASELINES if (arm, bg) in units}
        if not rows:
            continue
        table[label] = rows
        if all(a in rows for a in ("1_no_negotiation", "2_no_grouping", "5_consensus", "rule_based")):
            full = rows["5_consensus"]
            goals[label] = {
                "DS_5_beyond_1": _beyond(full["DS"], rows["1_no_negotiation"]["DS"]),
                "SR_5_beyond_1": _beyond(full["SR"], rows["1_no_negotiation"]["SR"]),
                "DS_5_beyond_2": _beyond(full["DS"], rows["2_no_grouping"]["DS"]),
                "SR_5_beyond_2": _beyond(full["SR"], rows["2_no_grouping"]["SR"]),
                "SR_5_minus_rule_based_pp": full["SR"]["mean"] - rows["rule_based"]["SR"]["mean"],
                "SR_within_10pp_of_rule_based": abs(full["SR"]["mean"] - rows["rule_based"]["SR"]["mean"]) <= 10.0,
            }
    return table, goals


def background_effect(units: dict) -> dict:
    """Per arm evaluated in both background settings: the types whose DS / SR differ between
    them ({arm: {"types_differing": [...], "of": n}}). A row with none is not affected by this
    simulator's background traffic (a follower behind each ego, not dense traffic)."""
    out = {}
    for arm in sorted({a for a, _ in units}):
        if (arm, False) in units and (arm, True) in units:
            off, on = units[(arm, False)]["per_type"], units[(arm, True)]["per_type"]
            differ = [t for t in off if t in on and any(off[t]["aggregate"][k] != on[t]["aggregate"][k]
                                                         for k in ("DS", "SR"))]
            out[arm] = {"types_differing": differ, "of": len(off)}
    return out


def seed_rows(unit: dict) -> list[dict]:
    """A unit's episodes as one row per (type, evaluation seed): {"tag", "ds", "sr"} (the
    seed's mean over its episodes of that type)."""
    return [{"tag": f"{name}/seed{row['seed']}", "ds": row["DS"], "sr": row["SR"]}
            for name, scores in unit["per_type"].items() for row in scores["per_seed"]]


def arm_difference(units: dict, arm: str, reference: str) -> dict:
    """Per background setting where both were evaluated: ``arm`` minus ``reference`` in DS and
    SR, paired over the same (type, seed) episodes, with a 95 % bootstrap interval
    (:func:`~jax_drive.pipelines.coop_rl.paired_difference`)."""
    from jax_drive.pipelines.coop_rl import paired_difference

    out = {}
    for bg in (False, True):
        if (arm, bg) in units and (reference, bg) in units:
            mine, base = seed_rows(units[(arm, bg)]), seed_rows(units[(reference, bg)])
            out["with_background" if bg else "without_background"] = {
                key.upper(): paired_difference({0: mine}, base, key) for key in ("ds", "sr")}
    return out


def critic_in_loop(log: list[dict]) -> dict | None:
    """The consensus critic judged on the negotiations it took part in (an arm's negotiation
    log): per round it scored, whether the replies state an agreement (every conflicting pair
    settled with one side stating a yield, :func:`~jax_drive.coop.negotiation.teacher.stated_settled_pairs`,
    on the teacher's scale and at the feedback threshold, as the critic was trained), the
    critic's mean score per class and the AUC with which it separates them (None when the log
    has no scored round, ``auc`` None when one class is empty)."""
    from jax_drive.coop.negotiation.critic import CriticConfig, parse_consensus, separation_auc
    from jax_drive.coop.negotiation.teacher import consensus_answer, stated_settled_pairs

    threshold = CriticConfig().consensus_feedback_below
    scores, agreed = [], []
    for talk in log:
        pairs = {tuple(sorted(e)) for e in talk["edges"]}
        for scored in talk["rounds"]:
            if scored.get("consensus") is None:
                continue
            replies = {c["vid"]: c["text"] for c in talk["conversation"] if c["round"] == scored["round"]}
            stated, _ = parse_consensus(consensus_answer(stated_settled_pairs(replies, pairs), len(pairs)))
            scores.append(float(scored["consensus"]))
            agreed.append(stated >= threshold)
    if not scores:
        return None
    s, y = np.asarray(scores), np.asarray(agreed, bool)
    both = y.any() and (~y).any()
    return {"rounds": len(s), "agreed": int(y.sum()), "auc": separation_auc(s, y) if both else None,
            "mean_score_agreed": float(s[y].mean()) if y.any() else None,
            "mean_score_others": float(s[~y].mean()) if (~y).any() else None,
            "others_below_threshold": int((s[~y] < threshold).sum())}


def _critics_in_loop(ctx, units: dict) -> dict:
    """{setting: critic_in_loop} of the arms whose negotiation log has consensus scores."""
    out = {}
    for arm, bg in sorted(units):
        path = log_path(unit_path(ctx, arm, bg))
        if os.path.exists(path) and (found := critic_in_loop(_load(path))) is not None:
            out.setdefault("with_background" if bg else "without_background", {})[arm] = found
    return out


def _negotiators_record(ctx, ws, path: str, closed_loop: bool, stale: dict) -> dict | None:
    """The record at ``path`` when this run's negotiator made it (:meth:`made_here`); a record
    another negotiator made is named in ``stale`` instead, so a report never shows it as its own."""
    if not os.path.exists(path):
        return None
    record = _load(path)
    if ws.made_here(record, closed_loop=closed_loop):
        return record
    stale[os.path.relpath(path, ctx.run_dir)] = ws.origin(record)
    return None


def _attach_studies(ctx, ws, report: dict, table: dict) -> None:
    """The SFT data, probe, SFT, negotiation-RL and Fig. 5 records and the plots, where the work
    directory has them; the probe, RL and Fig. 5 records only when this run's negotiator made them
    (the others are listed under ``stale_records`` with who made them)."""
    stale = {}
    if os.path.exists(ctx.path("sft_data.json")):
        report["sft_data"] = _load(ctx.path("sft_data.json"))["info"]
    if (probe := _negotiators_record(ctx, ws, ctx.path("probe.json"), False, stale)) is not None:
        report["probe"] = probe
    if os.path.exists(ctx.path("sft", "summary.json")):
        report["sft"] = _load(ctx.path("sft", "summary.json"))
    if (rl := _negotiators_record(ctx, ws, ctx.path("rl", "summary.json"), False, stale)) is not None:
        report["negotiation_rl"] = rl
    base = os.path.splitext(ctx.option("json"))[0]
    if (study := _negotiators_record(ctx, ws, ctx.path("fig5.json"), True, stale)) is not None:
        report["fig5"] = {k: {kk: vv for kk, vv in v.items() if kk != "scores"} if isinstance(v, dict) else v
                          for k, v in study.items()}
        plot_fig5(study, base + "_fig5.png")
        report["fig5"]["plot"] = base + "_fig5.png"
    if table:
        plot_table(table, base + "_table2.png")
        report["table2_plot"] = base + "_table2.png"
    if os.path.exists(ctx.option("episode_png")):
        report["episode_render"] = ctx.option("episode_png")
    if stale:
        report["stale_records"] = stale


def report(ctx, ws) -> dict:
    """Merges the work directory's results into the report JSON (written to the ``json`` option,
    plots beside it), prints Table 2 and the goal checks; returns the report."""
    units = current_units(ctx, ws)
    table, goals = table_and_goals(units)
    result = {
        "meta": run_metadata(command=ctx.option("command")),
        "preset": ctx.preset.name, "engine": ctx.option("engine"), "negotiator": ws.negotiator_id(),
        "note": "A rule-based intention planner stands in for the paper's VLM intention planner.",
        "episodes": {"types": list(ctx.preset.types), "seeds": list(ctx.preset.eval_seeds),
                     "per_seed": ctx.preset.episodes_per_seed, "config": ctx.preset.config},
        "table2": table, "goals": goals,
        "row_labels": {arm: ARM_LABELS[arm] for arm in ARMS + BASELINES},
        "background_effect": background_effect(units),
        # what the consensus critic adds to the critic's safety / efficiency feedback (Table 2, 5 - 4)
        "consensus_effect": arm_difference(units, "5_consensus", "4_critic_se"),
        # does the critic separate the agreements of the negotiations it judged in the loop?
        "critic_in_loop": _critics_in_loop(ctx, units),
        "units": {unit_name(arm, bg): {k: u.get(k) for k in ("per_type", "overall", "negotiation", "engine",
                                                               "wall_seconds", "episodes", "negotiator")}
                  for (arm, bg), u in sorted(units.items())},
    }
    os.makedirs(os.path.dirname(os.path.abspath(ctx.option("json"))), exist_ok=True)  # the plots go beside it
    _attach_studies(ctx, ws, result, table)
    write_json(ctx.option("json"), result)
    ctx.log(markdown_table(table))
    ctx.log(json.dumps(goals, indent=1))
    for setting, diff in result["consensus_effect"].items():
        ctx.log(f"arm 5 - arm 4 ({setting}): " + ", ".join(
            f"{k} {d['mean']:+.1f} [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}]" for k, d in diff.items()))
    for setting, arms in result["critic_in_loop"].items():
        for arm, found in arms.items():
            ctx.log(f"critic in the loop ({arm}, {setting}): {found['agreed']} of {found['rounds']} scored rounds state "
                    f"an agreement; AUC {found['auc']}")
    return result


def markdown_table(table: dict) -> str:
    lines = []
    for label, rows in table.items():
        lines += [f"\n{label.replace('_', ' ')}\n", "| ID | DS | RC | IS | SR |", "|---|---|---|---|---|"]
        for arm, agg in rows.items():
            cells = [f"{agg[k]['mean']:.1f} ± {agg[k]['se']:.1f}" if k != "IS" else
                     f"{agg[k]['mean']:.3f} ± {agg[k]['se']:.3f}" for k in ("DS", "RC", "IS", "SR")]
            lines.append(f"| {ARM_LABELS[arm]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_fig5(study: dict, path: str):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for label, colour, dx in (("without_critic", "tab:orange", -0.08), ("with_critic", "tab:blue", 0.08)):
        scores = np.asarray(study[label]["scores"], float)
        rounds = np.arange(1, scores.shape[1] + 1)
        for r in range(scores.shape[1]):
            col = scores[:, r][np.isfinite(scores[:, r])]
            ax.scatter(np.full(len(col), rounds[r] + dx) + np.random.default_rng(r).uniform(-0.03, 0.03, len(col)),
                       col, s=8, color=colour, alpha=0.35)
        ax.errorbar(rounds + dx, study[label]["mean"], yerr=study[label]["se"], color=colour, marker="o", capsize=3,
                    label=label.replace("_", " "))
    ax.set_xticks(rounds)
    ax.set_xlabel("negotiation round")
    ax.set_ylabel("quality = 3 consensus + 5 safety + 2 efficiency")
    ax.set_title(f"Negotiation quality per round ({len(study['situations'])} groups)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_table(table: dict, path: str):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6 * len(table), 4))
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(1, len(table)))
    for ax, (label, rows) in zip(axes, table.items()):
        names = list(rows)
        x = np.arange(len(names))
        for j, (metric, colour) in enumerate((("DS", "tab:blue"), ("SR", "tab:green"))):
            ax.bar(x + (j - 0.5) * 0.38, [rows[n][metric]["mean"] for n in names], 0.38,
                   yerr=[rows[n][metric]["se"] for n in names], color=colour, label=metric, capsize=2)
        ax.set_xticks(x, [ARM_LABELS[n] for n in names], rotation=30, ha="right", fontsize=7)
        ax.set_title(f"InterDrive, ten types averaged ({label.replace('_', ' ')})", fontsize=9)
        ax.set_ylim(0, 105)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
