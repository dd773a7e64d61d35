"""CoLMDriver on InterDrive: the seed's Table 2 ablation, its Fig. 5 and a rendered episode.

The ablation runs with a fine-tuned SmolLM2 negotiator (or a served model, or the
rule-based teacher), the Fig. 5 convergence study and one rendered episode with its dialogue.

    python experiments/interdrive.py --preset cpu-demo --engine jax --json OUT.json
    python experiments/interdrive.py --preset smoke --work-dir /tmp/id-smoke --json /tmp/id-smoke.json  # check

The ``smoke`` preset (a random tiny model that cannot negotiate, two types, one seed) runs
every stage in a few minutes on a CPU; its numbers mean nothing.

Stages (``--stage``, default ``all``; every stage reuses what an earlier run left in
``--work-dir`` (default ``runs/interdrive-<preset>``, ``-<engine>`` appended for
openai and teacher), so a run can be stopped and started
again, and arms can be run one by one with ``--arms``; evaluation units, the probe, Fig. 5
and the rendering record the negotiator that made them, and those of another one (a
different adapter, or the same one trained on to a larger step budget) are run again, the
old units kept in ``units/stale/``; so are closed-loop results of an earlier
``LOOP_REVISION`` of the simulator and driving loop):

  data    teacher-driven episodes on the training seeds -> SFT chat examples
  sft     LoRA fine-tuning of the preset's model (resumes from its checkpoints; a larger step
          budget in the preset continues the training)
  probe   the tuned negotiator's first-round yield decisions on held-out teacher prompts
          against the teacher's (a minute; says whether hours of evaluation are worth it)
  eval    one unit per (arm or baseline, background setting): arms 1-5 of Table 2 and the
          rule-based and silent baselines on the same episodes
  fig5    negotiation-quality score per round with and without the critic
  render  one accident-prone episode of arm 5 with the dialogue beside the frames
  report  merges everything into --json, with the table, plots and goal checks

``--engine openai --url URL [--served-model NAME]`` negotiates with a served model
(vLLM) instead of the local JAX engine; the SFT stages are then skipped (serve the
fine-tuned adapter). ``--engine teacher`` lets the rule-based teacher (the SFT data's
source, no language model) negotiate: the ceiling the fine-tuned model is trained towards,
in minutes on a CPU. A rule-based intention planner stands in for the paper's VLM
intention planner.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from jax_drive.runinfo import InputError, add_output_args, run_main, run_metadata, write_json

STAGES = ("data", "sft", "probe", "eval", "fig5", "render", "report")


def _bar(args, desc):
    from tqdm import tqdm

    bar = tqdm(desc=desc, unit="decision", disable=args.no_progress, leave=False)
    return bar, (lambda d: bar.update(1))


def _load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class Run:
    """Paths and lazily built pieces of one pipeline run."""

    def __init__(self, args):
        from jax_drive.pipelines import interdrive as I

        self.I, self.args = I, args
        self.preset = I.PRESETS[args.preset]
        suffix = "" if args.engine == "jax" else f"-{args.engine}"  # arms of different negotiators never mix
        self.work = args.work_dir or os.path.join("runs", f"interdrive-{args.preset}{suffix}")
        os.makedirs(os.path.join(self.work, "units"), exist_ok=True)
        self._negotiator = None

    def path(self, *parts):
        return os.path.join(self.work, *parts)

    @property
    def adapter(self):
        return self.args.adapter or self.path("sft", "adapter")

    def negotiator_id(self) -> str:
        """Names the negotiator behind the results (a unit, probe, study or rendering made by
        another one is stale: it is run again, the old unit kept under units/stale/)."""
        if self.args.engine == "teacher":
            return "teacher"
        if self.args.engine == "openai":
            return f"openai {self.args.served_model or self.preset.model} at {self.args.url}"
        if self.args.adapter:
            return f"adapter {os.path.abspath(self.args.adapter)}"
        summary = self.path("sft", "summary.json")
        return f"sft {_load(summary)['steps']} steps" if os.path.exists(summary) else "sft (not trained)"

    def made_here(self, record: dict, negotiates: bool = True, closed_loop: bool = True) -> bool:
        """Whether a result record is this run's: made by its negotiator (when the record's
        arm negotiates) in today's closed loop (``LOOP_REVISION``, when it drove episodes)."""
        same_loop = not closed_loop or record.get("loop_revision", 1) == self.I.LOOP_REVISION
        return same_loop and (not negotiates or record.get("negotiator") == self.negotiator_id())

    def current(self, path: str, negotiates: bool = True, closed_loop: bool = True) -> bool:
        """Whether ``path`` exists and is this run's (:meth:`made_here`)."""
        return os.path.exists(path) and self.made_here(_load(path), negotiates, closed_loop)

    def origin(self, record: dict) -> str:
        """Who made a record, for the messages about stale ones."""
        return (f"{record.get('negotiator') or 'no negotiator'}, closed-loop revision "
                f"{record.get('loop_revision', 1)}")

    def negotiator(self):
        if self._negotiator is None:
            if self.args.engine == "teacher":
                from jax_drive.coop.negotiation import RuleTeacher

                self._negotiator = RuleTeacher()
            elif self.args.engine == "jax":
                if not os.path.isdir(self.adapter):
                    raise InputError(f"no fine-tuned adapter at {self.adapter}: run --stage sft first or pass --adapter")
                self._negotiator = self.I.make_negotiator(self.preset, "jax", adapter_dir=self.adapter)
            else:
                self._negotiator = self.I.make_negotiator(self.preset, "openai", url=self.args.url,
                                                          served_model=self.args.served_model)
        return self._negotiator


def _marks_wrong(examples) -> bool:
    """Whether recorded teacher data marks its deliberately wrong actor answers (data recorded
    before the mark would teach them; it is recorded again)."""
    return all("wrong" in e for e in examples if e["kind"] == "actor")


def stage_data(run: Run):
    out = run.path("sft_data.json")
    if os.path.exists(out) and _marks_wrong(_load(out)["examples"]):
        return
    raw = run.path("sft_recorded.json")  # every recorded example: re-selecting needs no new episodes
    saved = _load(raw) if os.path.exists(raw) else None
    if saved is not None and not _marks_wrong(saved["examples"]):
        print(f"{raw} does not mark the teacher's deliberately wrong answers: recording it again")
        saved = None
    if saved is not None:
        examples, info = saved["examples"], saved["info"]
    else:
        bar, tick = _bar(run.args, "teacher episodes")
        examples, info = run.I.sft_examples(run.preset, progress=tick)
        bar.close()
        write_json(raw, {"info": info, "examples": examples})
    chosen = run.I.select_examples(examples, run.preset.sft_counts, max_chars=run.preset.sft_max_chars)
    info["selected"] = {k: sum(e["kind"] == k for e in chosen) for k, _ in run.preset.sft_counts}
    write_json(out, {"info": info, "examples": chosen})
    print(f"sft data: {info['recorded']} recorded, {info['selected']} selected; teacher driving {info['teacher_driving']}")


def _sft_budget(preset, examples) -> dict:
    """The SFT settings a trained adapter is checked against; ``data`` fingerprints the examples."""
    import hashlib

    sft = preset.sft
    data = hashlib.sha256(json.dumps(examples, sort_keys=True).encode()).hexdigest()[:16]
    return {"max_steps": sft.max_steps, "epochs": sft.epochs, "batch_size": sft.batch_size,
            "learning_rate": sft.optim.learning_rate, "lora_rank": preset.lora_rank, "lora_alpha": preset.lora_alpha,
            "data": data}


def stage_sft(run: Run):
    """Trains until the preset's budget is spent: a run trained with fewer steps continues from
    its checkpoints (the same as an uninterrupted run); other changed settings need a new
    work directory."""
    out = run.path("sft", "summary.json")
    if run.args.engine != "jax" or run.args.adapter:
        return
    data = _load(run.path("sft_data.json"))
    budget = _sft_budget(run.preset, data["examples"])
    if os.path.exists(out):
        before = _load(out).get("budget")  # None: written before budgets were recorded
        if before == budget:
            return
        def settings(b):  # everything but the step budget
            return {k: v for k, v in b.items() if k not in ("max_steps", "epochs")}

        if before is not None and settings(before) != settings(budget):
            raise InputError(f"{run.path('sft')} was trained with {before}, the preset and data now say {budget}: "
                             "only the step budget may change; use a new --work-dir")
    summary = run.I.finetune(run.preset, data["examples"], run.path("sft"), progress=not run.args.no_progress)
    summary["budget"] = budget
    write_json(out, summary)
    print(f"sft: {summary['steps']} steps, loss {summary['loss_first']:.3f} -> {summary['loss_last_10']:.3f}")


def stage_probe(run: Run, required: bool):
    out = run.path("probe.json")
    if run.current(out, closed_loop=False) or run.args.engine == "teacher":
        return
    if not all(os.path.exists(run.path(name)) for name in ("sft_recorded.json", "sft_data.json")):
        if required:
            raise InputError(f"no teacher data in {run.work}: run --stage data first")
        return
    recorded, selected = _load(run.path("sft_recorded.json")), _load(run.path("sft_data.json"))
    examples = run.I.probe_examples(recorded["examples"], selected["examples"], run.preset.probe_size)
    if not examples:
        raise InputError(f"no held-out first-round actor prompts in {run.path('sft_recorded.json')}")
    report = run.I.decision_probe(run.negotiator().engine, examples, run.preset)
    report["negotiator"] = run.negotiator_id()
    write_json(out, report)
    print(f"probe: {report['n']} held-out first-round decisions, agreement with the teacher {report['agreement']:.2f} "
          f"(always answering the teacher's most common one: {report['majority']:.2f}); model {report['model']}")


def _negotiates(I, arm: str) -> bool:
    return arm not in I.BASELINES and arm != "1_no_negotiation"


def _unit_path(run, arm, bg):
    return run.path("units", f"{arm}__{'bg' if bg else 'nobg'}.json")


def stage_eval(run: Run):
    from jax_drive.coop.evaluate import jsonable

    I = run.I
    for bg in run.backgrounds:
        for arm in run.arms:
            out = _unit_path(run, arm, bg)
            needs_llm = _negotiates(I, arm)
            if run.current(out, negotiates=needs_llm):
                continue
            if os.path.exists(out):  # another negotiator's or closed loop's unit: keep it aside, run again
                stale = run.path("units", "stale", time.strftime("%Y%m%dT%H%M%S"))
                os.makedirs(stale, exist_ok=True)
                for path in (out, out.replace(".json", ".log.json")):
                    if os.path.exists(path):
                        os.replace(path, os.path.join(stale, os.path.basename(path)))
            policy = I.make_policy(arm, run.preset, run.negotiator() if needs_llm else None)
            if needs_llm:
                if hasattr(run.negotiator(), "usage"):
                    run.negotiator().usage = type(run.negotiator().usage)()  # per-unit engine counts
            bar, tick = _bar(run.args, f"{arm} {'bg' if bg else 'no bg'}")
            report = I.evaluate_policy(policy, run.preset, bg, progress=tick)
            bar.close()
            results, tags = report.pop("results")
            report["episodes_detail"] = [{"type": t[0], "seed": t[1], "k": t[2], "accident_prone": r.accident_prone,
                                          **{k: r.metrics[k] for k in ("DS", "RC", "IS")},
                                          "success": r.metrics["success"], "end_time": r.end_time,
                                          "outcomes": [o.outcome for o in r.outcomes]}
                                         for t, r in zip(tags, results)]
            if hasattr(policy, "log"):
                write_json(out.replace(".json", ".log.json"), jsonable(policy.log))
            write_json(out, jsonable(dict(report, arm=arm, background=bg,
                                          negotiator=run.negotiator_id() if needs_llm else None,
                                          loop_revision=I.LOOP_REVISION)))
            agg = report["overall"]["aggregate"]
            print(f"{arm:18s} {'bg' if bg else 'no bg':6s} DS {agg['DS']['mean']:6.1f} ± {agg['DS']['se']:4.1f}  "
                  f"SR {agg['SR']['mean']:6.1f} ± {agg['SR']['se']:4.1f}  ({report['wall_seconds']:.0f} s)")


def stage_fig5(run: Run):
    out = run.path("fig5.json")
    if run.current(out):
        return
    bar, tick = _bar(run.args, "situations")
    situations = run.I.collect_situations(run.preset, run.preset.convergence_groups, progress=tick)
    bar.close()
    start = time.perf_counter()
    study = run.I.convergence_study(run.negotiator(), run.preset, situations)
    study["wall_seconds"] = time.perf_counter() - start
    study["negotiator"], study["loop_revision"] = run.negotiator_id(), run.I.LOOP_REVISION
    write_json(out, study)
    print("fig5 quality per round: with critic", np.round(study["with_critic"]["mean"], 2),
          "without", np.round(study["without_critic"]["mean"], 2))


def stage_render(run: Run, png: str):
    if os.path.exists(png) and run.current(run.path("render_log.json")):
        return
    import jax

    from jax_drive.coop.runner import run_episodes

    name = run.args.render_type
    policy = run.I.make_policy("5_consensus", run.preset, run.negotiator())
    key = jax.random.fold_in(jax.random.key(int(run.preset.eval_seeds[0])), 0)
    results, _ = run_episodes([name], [key], accident_prone=[True], policy=policy, cfg=run.I.CONTROL_5HZ,
                              keep_trajectory=True)
    run.I.render_dialogue(results[0], policy.log, png)
    write_json(run.path("render_log.json"), {"scenario": name, "metrics": results[0].metrics, "log": policy.log,
                                             "negotiator": run.negotiator_id(), "loop_revision": run.I.LOOP_REVISION})


def _beyond(a, b):
    """a's mean minus its SE is above b's mean plus its SE."""
    return a["mean"] - a["se"] > b["mean"] + b["se"]


def stage_report(run: Run, png_episode: str):
    I = run.I
    units = {}
    for name in sorted(os.listdir(run.path("units"))):
        if name.endswith(".json") and not name.endswith(".log.json"):
            u = _load(run.path("units", name))
            if not run.made_here(u, negotiates=_negotiates(I, u["arm"])):
                print(f"left out {name}: made by {run.origin(u)}, not {run.negotiator_id()}, closed-loop "
                      f"revision {I.LOOP_REVISION} (--stage eval runs it again)")
                continue
            units[(u["arm"], bool(u["background"]))] = u
    if not units:
        raise InputError(f"no evaluation units in {run.path('units')}: run --stage eval first")
    table, goals = {}, {}
    for bg in (False, True):
        label = "with_background" if bg else "without_background"
        rows = {arm: units[(arm, bg)]["overall"]["aggregate"] for arm in I.ARMS + I.BASELINES if (arm, bg) in units}
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
    report = {
        "meta": run_metadata(command="python experiments/interdrive.py " + " ".join(run.args.argv)),
        "preset": run.args.preset, "engine": run.args.engine, "negotiator": run.negotiator_id(),
        "note": "A rule-based intention planner stands in for the paper's VLM intention planner.",
        "episodes": {"types": list(run.preset.types), "seeds": list(run.preset.eval_seeds),
                     "per_seed": run.preset.episodes_per_seed, "config": run.preset.config},
        "table2": table, "goals": goals,
        "units": {f"{arm}__{'bg' if bg else 'nobg'}": {k: u.get(k) for k in
                                                       ("per_type", "overall", "negotiation", "engine",
                                                        "wall_seconds", "episodes", "negotiator")}
                  for (arm, bg), u in sorted(units.items())},
    }
    for name in ("sft_data.json",):
        if os.path.exists(run.path(name)):
            report["sft_data"] = _load(run.path(name))["info"]
    if os.path.exists(run.path("probe.json")):
        report["probe"] = _load(run.path("probe.json"))
    if os.path.exists(run.path("sft", "summary.json")):
        report["sft"] = _load(run.path("sft", "summary.json"))
    base = os.path.splitext(run.args.json)[0]
    if os.path.exists(run.path("fig5.json")):
        study = _load(run.path("fig5.json"))
        report["fig5"] = {k: {kk: vv for kk, vv in v.items() if kk != "scores"} if isinstance(v, dict) else v
                          for k, v in study.items()}
        plot_fig5(study, base + "_fig5.png")
        report["fig5"]["plot"] = base + "_fig5.png"
    if table:
        plot_table(table, base + "_table2.png")
        report["table2_plot"] = base + "_table2.png"
    if os.path.exists(png_episode):
        report["episode_render"] = png_episode
    write_json(run.args.json, report)
    print(markdown_table(table))
    print(json.dumps(goals, indent=1))


def markdown_table(table: dict) -> str:
    from jax_drive.pipelines.interdrive import ARM_LABELS

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

    from jax_drive.pipelines.interdrive import ARM_LABELS

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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-demo", help="cpu-demo (default), paper or smoke "
                        "(jax_drive.pipelines.interdrive.PRESETS)")
    parser.add_argument("--engine", choices=("jax", "openai", "teacher"), default="jax",
                        help="negotiator: the fine-tuned local model, a served model, or the rule-based teacher")
    parser.add_argument("--url", default=None, help="OpenAI-compatible server (with --engine openai)")
    parser.add_argument("--served-model", default=None, help="model name on the server (default: the preset's)")
    parser.add_argument("--adapter", default=None, help="use this PEFT adapter instead of training one")
    parser.add_argument("--stage", choices=STAGES + ("all",), default="all")
    parser.add_argument("--arms", default=None, help="comma-separated Table 2 arms / baselines to evaluate "
                        "(default: all of 1_no_negotiation .. 5_consensus, rule_based, silent)")
    parser.add_argument("--background", choices=("off", "on", "both"), default="both")
    parser.add_argument("--work-dir", default=None,
                        help="run directory (default runs/interdrive-<preset>, -<engine> appended unless jax)")
    parser.add_argument("--render-type", default="ic_straight_left", help="InterDrive type of the rendered episode")
    add_output_args(parser, json_required=True)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.engine == "openai" and not args.url:  # checks that need no heavy import come first
        raise InputError("--engine openai needs --url")
    if args.adapter is not None and not os.path.isdir(args.adapter):
        raise InputError(f"--adapter {args.adapter} is not a directory")

    from jax_drive.pipelines.interdrive import ARMS, BASELINES, PRESETS
    from jax_drive.sim import scenarios as S

    if args.preset not in PRESETS:
        raise InputError(f"unknown preset {args.preset!r}; choose from {', '.join(sorted(PRESETS))}")
    arms = [a.strip() for a in (args.arms or ",".join(ARMS + BASELINES)).split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS + BASELINES]
    if unknown or not arms:
        raise InputError(f"unknown arms {unknown}; choose from {', '.join(ARMS + BASELINES)}")
    if args.render_type not in S.INTERDRIVE:
        raise InputError(f"--render-type must be an InterDrive type, got {args.render_type!r}")
    run = Run(args)
    run.arms = arms
    run.backgrounds = {"off": (False,), "on": (True,), "both": (False, True)}[args.background]
    run.backgrounds = tuple(b for b in run.backgrounds if b in run.preset.backgrounds)
    png_episode = os.path.splitext(args.json)[0] + "_episode.png"
    stages = STAGES if args.stage == "all" else (args.stage,)
    if "data" in stages and args.engine == "jax" and not args.adapter:
        stage_data(run)
    if "sft" in stages:
        stage_sft(run)
    if "probe" in stages:
        stage_probe(run, required=args.stage == "probe")
    if "eval" in stages:
        stage_eval(run)
    if "fig5" in stages:
        stage_fig5(run)
    if "render" in stages:
        stage_render(run, png_episode)
    if "report" in stages:
        stage_report(run, png_episode)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
