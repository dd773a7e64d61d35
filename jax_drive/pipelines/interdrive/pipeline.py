"""CoLMDriver on InterDrive end to end: Table 2, Fig. 5 and a rendered episode, as stages.

``run_interdrive(preset, work_dir, ...)`` runs :data:`STAGES` (each a top-level function of
the run context, :mod:`jax_drive.pipelines.stages`):

  data    teacher-driven episodes on the training seeds -> SFT chat examples
  sft     LoRA fine-tuning of the preset's model (resumes from its checkpoints; a larger step
          budget in the preset continues the training)
  probe   the tuned negotiator's first-round yield decisions on held-out teacher prompts
          against the teacher's (a minute; says whether hours of evaluation are worth it)
  rl      (when the preset's ``rl.steps`` > 0) mtGRPO of the negotiator from its SFT start, per
          training seed; the start and each trained actor evaluated under arm (5) with the
          preset's RL critic on the same episodes, paired
  eval    one unit per (arm or baseline, background setting): arms 1-5 of Table 2 and the
          rule-based and silent baselines on the same episodes
  fig5    negotiation-quality score per round with and without the critic
  render  one accident-prone episode of arm 5 with the dialogue beside the frames
  report  merges everything into the results JSON, with the table, plots and goal checks

Every stage keeps its results in the work directory and reuses them: evaluation units, the
probe, Fig. 5 and the rendering record the negotiator that made them (:meth:`InterDriveWorkspace.negotiator_id`)
and the closed-loop revision (:data:`~jax_drive.pipelines.interdrive.arms.LOOP_REVISION`);
those made by another one are run again, the old units kept in ``units/stale/``.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import time

from jax_drive.names import INTERDRIVE_ARMS, INTERDRIVE_STAGES, check_names
from jax_drive.pipelines.interdrive import arms as A
from jax_drive.pipelines.interdrive import convergence as C
from jax_drive.pipelines.interdrive import negotiator as N
from jax_drive.pipelines.interdrive.presets import Preset
from jax_drive.pipelines.interdrive.report import log_path, report, unit_path
from jax_drive.pipelines.journal import Laps
from jax_drive.pipelines.stages import RunContext, Stage, StageOutput, Workspace, run_stages
from jax_drive.runinfo import InputError, run_metadata, write_json

STAGE_NAMES = INTERDRIVE_STAGES
NEGOTIATORS = ("jax", "openai", "teacher")


def load(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def progress_bar(ctx: RunContext, desc: str):
    """(tqdm bar, per-decision callback) for a driving loop."""
    from tqdm import tqdm

    bar = tqdm(desc=desc, unit="decision", disable=not ctx.progress, leave=False)
    return bar, (lambda d: bar.update(1))


class InterDriveWorkspace(Workspace):
    """The negotiator of a run, built on first use: the fine-tuned local model (``engine``
    'jax'), a served model ('openai') or the rule-based teacher ('teacher')."""

    def __init__(self, ctx: RunContext):
        super().__init__()
        self.ctx = ctx

    @property
    def adapter(self) -> str:
        return self.ctx.option("adapter") or self.ctx.path("sft", "adapter")

    def negotiator(self):
        return self.get("negotiator", self._build)

    def _build(self):
        ctx, engine = self.ctx, self.ctx.option("engine")
        if engine == "teacher":
            from jax_drive.coop.negotiation import RuleTeacher

            return RuleTeacher()
        if engine == "jax":
            if not os.path.isdir(self.adapter):
                raise InputError(f"no fine-tuned adapter at {self.adapter}: run --stage sft first or pass --adapter")
            return N.make_negotiator(ctx.preset, "jax", adapter_dir=self.adapter,
                                     critic_adapter=ctx.option("critic_adapter"))
        return N.make_negotiator(ctx.preset, "openai", url=ctx.option("url"), served_model=ctx.option("served_model"),
                                 critic_adapter=ctx.option("critic_adapter"))

    def negotiator_id(self) -> str:
        """Names the negotiator behind the results (a unit, probe, study or rendering made by
        another one is stale); a separate consensus critic is named after the actor."""
        critic = self.ctx.option("critic_adapter")
        actor = self._actor_id()
        return actor if not critic else f"{actor} + critic adapter {os.path.abspath(critic)}"

    def _actor_id(self) -> str:
        ctx, engine = self.ctx, self.ctx.option("engine")
        if engine == "teacher":
            return "teacher"
        if engine == "openai":
            return f"openai {ctx.option('served_model') or ctx.preset.model} at {ctx.option('url')}"
        if ctx.option("adapter"):
            return f"adapter {os.path.abspath(ctx.option('adapter'))}"
        summary = ctx.path("sft", "summary.json")
        return f"sft {load(summary)['steps']} steps" if os.path.exists(summary) else "sft (not trained)"

    def made_here(self, record: dict, negotiates: bool = True, closed_loop: bool = True) -> bool:
        """Whether a result record is this run's: made by its negotiator (when the record's
        arm negotiates) in today's closed loop (when it drove episodes)."""
        same_loop = not closed_loop or record.get("loop_revision", 1) == A.LOOP_REVISION
        return same_loop and (not negotiates or record.get("negotiator") == self.negotiator_id())

    def current(self, path: str, negotiates: bool = True, closed_loop: bool = True) -> bool:
        """Whether ``path`` exists and is this run's (:meth:`made_here`)."""
        return os.path.exists(path) and self.made_here(load(path), negotiates, closed_loop)

    def origin(self, record: dict) -> str:
        """Who made a record, for the messages about stale ones."""
        return (f"{record.get('negotiator') or 'no negotiator'}, closed-loop revision "
                f"{record.get('loop_revision', 1)}")


# ----------------------------------------------------------------------------- stages
def _marks_wrong(examples) -> bool:
    """Whether recorded teacher data marks its deliberately wrong actor answers (data recorded
    before the mark would teach them; it is recorded again)."""
    return all("wrong" in e for e in examples if e["kind"] == "actor")


def selection_rule(preset: Preset) -> dict:
    """How SFT examples are selected from the recorded teacher data (data selected by another
    rule is selected again, from the recording)."""
    return {"consensus": "class-balanced", "consensus_scores": list(preset.consensus_scores)}


def data(ctx: RunContext, ws: InterDriveWorkspace) -> StageOutput:
    out = ctx.path("sft_data.json")
    if (os.path.exists(out) and _marks_wrong(load(out)["examples"])
            and load(out)["info"].get("selection") == selection_rule(ctx.preset)):
        return StageOutput()
    raw = ctx.path("sft_recorded.json")  # every recorded example: re-selecting needs no new episodes
    saved = load(raw) if os.path.exists(raw) else None
    if saved is not None and not _marks_wrong(saved["examples"]):
        ctx.log(f"{raw} does not mark the teacher's deliberately wrong answers: recording it again")
        saved = None
    if saved is not None:
        examples, info = saved["examples"], saved["info"]
    else:
        bar, tick = progress_bar(ctx, "teacher episodes")
        examples, info = N.sft_examples(ctx.preset, progress=tick)
        bar.close()
        write_json(raw, {"info": info, "examples": examples})
    chosen = N.select_examples(examples, ctx.preset.sft_counts, max_chars=ctx.preset.sft_max_chars,
                               consensus_scores=ctx.preset.consensus_scores)
    info["selected"] = {k: sum(e["kind"] == k for e in chosen) for k, _ in ctx.preset.sft_counts}
    info["selection"] = selection_rule(ctx.preset)
    info["consensus_targets"] = {str(k): v for k, v in sorted(collections.Counter(
        N.consensus_class(e) for e in chosen if e["kind"] == "consensus").items(), key=lambda kv: str(kv[0]))}
    write_json(out, {"info": info, "examples": chosen})
    ctx.log(f"sft data: {info['recorded']} recorded, {info['selected']} selected; "
            f"teacher driving {info['teacher_driving']}")
    return StageOutput()


def sft_budget(preset: Preset, examples) -> dict:
    """The SFT settings a trained adapter is checked against; ``data`` fingerprints the examples."""
    sft = preset.sft
    fingerprint = hashlib.sha256(json.dumps(examples, sort_keys=True).encode()).hexdigest()[:16]
    return {"max_steps": sft.max_steps, "epochs": sft.epochs, "batch_size": sft.batch_size,
            "learning_rate": sft.optim.learning_rate, "lora_rank": preset.lora_rank, "lora_alpha": preset.lora_alpha,
            "data": fingerprint}


def sft(ctx: RunContext, ws: InterDriveWorkspace) -> StageOutput:
    """Trains until the preset's budget is spent: an adapter trained with fewer steps continues
    from its checkpoints; other changed settings need a new work directory."""
    out = ctx.path("sft", "summary.json")
    budget = sft_budget(ctx.preset, load(ctx.path("sft_data.json"))["examples"])
    if os.path.exists(out):
        before = load(out).get("budget")  # None: written before budgets were recorded
        if before == budget:
            return StageOutput()
        settings = lambda b: {k: v for k, v in b.items() if k not in ("max_steps", "epochs")}  # noqa: E731
        if before is not None and settings(before) != settings(budget):
            raise InputError(f"{ctx.path('sft')} was trained with {before}, the preset and data now say {budget}: "
                             "only the step budget may change; use a new --work-dir")
    summary = N.finetune(ctx.preset, load(ctx.path("sft_data.json"))["examples"], ctx.path("sft"),
                         progress=ctx.progress)
    summary["budget"] = budget
    write_json(out, summary)
    ctx.log(f"sft: {summary['steps']} steps, loss {summary['loss_first']:.3f} -> {summary['loss_last_10']:.3f}")
    return StageOutput()


def probe(ctx: RunContext, ws: InterDriveWorkspace) -> StageOutput:
    out = ctx.path("probe.json")
    if ws.current(out, closed_loop=False) and "critic" in load(out):
        return StageOutput()
    if not all(os.path.exists(ctx.path(name)) for name in ("sft_recorded.json", "sft_data.json")):
        if ctx.option("stage") == "probe":
            raise InputError(f"no teacher data in {ctx.run_dir}: run --stage data first")
        return StageOutput()
    recorded, selected = load(ctx.path("sft_recorded.json")), load(ctx.path("sft_data.json"))
    examples = N.probe_examples(recorded["examples"], selected["examples"], ctx.preset.probe_size)
    if not examples:
        raise InputError(f"no held-out first-round actor prompts in {ctx.path('sft_recorded.json')}")
    result = N.decision_probe(ws.negotiator().engine, examples, ctx.preset)
    result["negotiator"] = ws.negotiator_id()
    held_out = N.critic_probe_examples(recorded["examples"], selected["examples"], ctx.preset.probe_size)
    result["critic"] = N.critic_discrimination(ws.negotiator(), held_out) if held_out else None
    write_json(out, result)
    ctx.log(f"probe: {result['n']} held-out first-round decisions, agreement with the teacher "
            f"{result['agreement']:.2f} (always answering the teacher's most common one: {result['majority']:.2f}); "
            f"model {result['model']}")
    if result["critic"]:
        ctx.log(f"critic: AUC {result['critic']['auc']} separating {result['critic']['agreed']} agreements from "
                f"{result['critic']['n'] - result['critic']['agreed']} others ({result['critic']['readout']} score)")
    return StageOutput()


def rl_record(ctx: RunContext, ws: InterDriveWorkspace, path: str, settings: dict, trained: bool = True) -> dict | None:
    """The evaluation record at ``path`` when it is this run's (negotiator, closed loop,
    backgrounds, RL settings and, for a ``trained`` actor, step budget), else None; settings a
    seed's training depends on that changed are refused (its checkpoints are another run's)."""
    from jax_drive.pipelines.interdrive import rl as R

    if not os.path.exists(path):
        return None
    record = load(path)
    if R.seed_settings(record.get("rl", {})) != R.seed_settings(settings):
        raise InputError(f"{path} was made with rl settings {record.get('rl')}, the preset now says {settings}: "
                         "only rl.steps (and rl.seeds) may change; use a new --work-dir")
    same = (ws.made_here(record) and record["backgrounds"] == list(ctx.option("backgrounds"))
            and (not trained or record["rl"]["steps"] == settings["steps"]))
    return record if same else None


def rl(ctx: RunContext, ws: InterDriveWorkspace) -> StageOutput:
    """Evaluates the SFT start and trains and evaluates every training seed (records reused
    while current), then writes ``rl/summary.json`` and ``<json>_rl.json`` / ``_rl.png`` beside
    the report: DS / SR of sft and mtgrpo, the paired difference, curves."""
    from jax_drive.pipelines.interdrive import rl as R

    backgrounds, preset = ctx.option("backgrounds"), ctx.preset
    settings = json.loads(json.dumps(R.settings_record(preset)))
    stamp = {"negotiator": ws.negotiator_id(), "loop_revision": A.LOOP_REVISION, "rl": settings,
             "backgrounds": list(backgrounds)}
    critic = R.make_critic(preset, ws.negotiator)
    start_path = ctx.path("rl", "start.json")
    if rl_record(ctx, ws, start_path, settings, trained=False) is None:
        bar, tick = progress_bar(ctx, "rl: the SFT start's evaluation")
        write_json(start_path, dict(stamp, rows=R.evaluate_start(preset, ws.adapter, critic, backgrounds, tick)))
        bar.close()
    trained = {}
    for seed in preset.rl.seeds:
        out = os.path.join(R.seed_dir(ctx.run_dir, seed), "eval.json")
        if rl_record(ctx, ws, out, settings) is None:
            bar, tick = progress_bar(ctx, f"rl seed {seed}: evaluation")
            record = R.train_seed(preset, seed, ws.adapter, critic, R.seed_dir(ctx.run_dir, seed), backgrounds,
                                  progress=ctx.progress, tick=tick)
            bar.close()
            write_json(out, dict(record, **stamp))
        trained[seed] = load(out)["rows"]
    result = dict(R.summary(load(start_path)["rows"], trained), negotiator=ws.negotiator_id(), rl=settings,
                  curves=R.curves(ctx.run_dir, preset.rl.seeds), meta=run_metadata(command=ctx.option("command")))
    if ws.current(ctx.path("probe.json"), closed_loop=False):  # what the start says, on held-out teacher prompts
        result["start_probe"] = {k: load(ctx.path("probe.json")).get(k) for k in ("n", "agreement", "majority", "model")}
    base = os.path.splitext(ctx.option("json"))[0] + "_rl"  # beside the report: <json>_rl.json / .png
    result["plot"] = R.plot(result, base + ".png")
    write_json(ctx.path("rl", "summary.json"), result)
    write_json(base + ".json", result)
    diff = result["mtgrpo_vs_sft"]
    ctx.log(f"rl: DS sft {result['sft']['ds']['mean']:.1f} -> mtgrpo {result['mtgrpo']['ds']['mean']:.1f} "
            f"(paired {diff['ds_diff']['mean']:+.1f}, 95 % CI {diff['ds_diff']['ci95'][0]:+.1f} .. "
            f"{diff['ds_diff']['ci95'][1]:+.1f}); SR {result['sft']['sr']['mean']:.1f} -> "
            f"{result['mtgrpo']['sr']['mean']:.1f}")
    return StageOutput()


def _set_aside(ctx: RunContext, out: str) -> None:
    """Moves another negotiator's (or closed loop's) unit and its log to ``units/stale/<time>``."""
    stale = ctx.path("units", "stale", time.strftime("%Y%m%dT%H%M%S"))
    os.makedirs(stale, exist_ok=True)
    for path in (out, log_path(out)):
        if os.path.exists(path):
            os.replace(path, os.path.join(stale, os.path.basename(path)))


def evaluation_unit(ctx: RunContext, ws: InterDriveWorkspace, arm: str, background: bool) -> None:
    """Evaluates one arm in one background setting and writes its unit (and negotiation log)."""
    from jax_drive.coop.evaluate import jsonable

    out, talks = unit_path(ctx, arm, background), A.negotiates(arm)
    if ws.current(out, negotiates=talks):
        return
    if os.path.exists(out):
        _set_aside(ctx, out)
    policy = A.make_policy(arm, ctx.preset, ws.negotiator() if talks else None)
    if talks and hasattr(ws.negotiator(), "usage"):
        ws.negotiator().usage = type(ws.negotiator().usage)()  # per-unit engine counts
    bar, tick = progress_bar(ctx, f"{arm} {'bg' if background else 'no bg'}")
    result = A.evaluate_policy(policy, ctx.preset, background, progress=tick)
    bar.close()
    result["episodes_detail"] = A.episodes_detail(*result.pop("results"))
    if hasattr(policy, "log"):
        write_json(log_path(out), jsonable(policy.log))
    write_json(out, jsonable(dict(result, arm=arm, background=background,
                                  negotiator=ws.negotiator_id() if talks else None, loop_revision=A.LOOP_REVISION)))
    agg = result["overall"]["aggregate"]
    ctx.log(f"{arm:18s} {'bg' if background else 'no bg':6s} DS {agg['DS']['mean']:6.1f} ± {agg['DS']['se']:4.1f}  "
            f"SR {agg['SR']['mean']:6.1f} ± {agg['SR']['se']:4.1f}  ({result['wall_seconds']:.0f} s)")


def evaluate(ctx: RunContext, ws: InterDriveWorkspace) -> StageOutput:
    os.makedirs(ctx.path("units"), exist_ok=True)
    for background in ctx.option("backgrounds"):
        for arm in ctx.option("arms"):
            evaluation_unit(ctx, ws, arm, background)
    return StageOutput()


def fig5(ctx: RunContext, ws: InterDriveWorkspace) -> StageOutput:
    import numpy as np

    out = ctx.path("fig5.json")
    if ws.current(out):
        return StageOutput()
    bar, tick = progress_bar(ctx, "situations")
    situations = C.collect_situations(ctx.preset, ctx.preset.convergence_groups, progress=tick)
    bar.close()
    start = time.perf_counter()
    study = C.convergence_study(ws.negotiator(), ctx.preset, situations)
    study["wall_seconds"] = time.perf_counter() - start
    study["negotiator"], study["loop_revision"] = ws.negotiator_id(), A.LOOP_REVISION
    write_json(out, study)
    ctx.log(f"fig5 quality per round: with critic {np.round(study['with_critic']['mean'], 2)} "
            f"without {np.round(study['without_critic']['mean'], 2)}")
    return StageOutput()


def render(ctx: RunContext, ws: InterDriveWorkspace) -> StageOutput:
    png = ctx.option("episode_png")
    if os.path.exists(png) and ws.current(ctx.path("render_log.json")):
        return StageOutput()
    import jax

    from jax_drive.coop.runner import run_episodes

    name = ctx.option("render_type")
    policy = A.make_policy("5_consensus", ctx.preset, ws.negotiator())
    key = jax.random.fold_in(jax.random.key(int(ctx.preset.eval_seeds[0])), 0)
    results, _ = run_episodes([name], [key], accident_prone=[True], policy=policy, cfg=A.CONTROL_5HZ,
                              keep_trajectory=True)
    C.render_dialogue(results[0], policy.log, png)
    write_json(ctx.path("render_log.json"), {"scenario": name, "metrics": results[0].metrics, "log": policy.log,
                                             "negotiator": ws.negotiator_id(), "loop_revision": A.LOOP_REVISION})
    return StageOutput()


def write_report(ctx: RunContext, ws: InterDriveWorkspace) -> StageOutput:
    return StageOutput(report(ctx, ws))


def selected(stage: str):
    return lambda ctx: ctx.option("stage") in ("all", stage)


def records_teacher_data(ctx: RunContext) -> bool:
    return selected("data")(ctx) and ctx.option("engine") == "jax" and not ctx.option("adapter")


def trains(ctx: RunContext) -> bool:
    return selected("sft")(ctx) and ctx.option("engine") == "jax" and not ctx.option("adapter")


def trains_rl(ctx: RunContext) -> bool:
    if ctx.option("stage") == "rl" and (ctx.preset.rl.steps < 1 or ctx.option("engine") != "jax"):
        raise InputError("--stage rl trains the local negotiator: it needs --engine jax and rl.steps >= 1 "
                         "(e.g. --set rl.steps=10)")
    return selected("rl")(ctx) and ctx.option("engine") == "jax" and ctx.preset.rl.steps > 0


def probes(ctx: RunContext) -> bool:
    return selected("probe")(ctx) and ctx.option("engine") != "teacher"


STAGES = (
    Stage("data", data, when=records_teacher_data, journaled=False),
    Stage("sft", sft, when=trains, journaled=False),
    Stage("probe", probe, when=probes, journaled=False),
    Stage("rl", rl, when=trains_rl, journaled=False),
    Stage("eval", evaluate, when=selected("eval"), journaled=False),
    Stage("fig5", fig5, when=selected("fig5"), journaled=False),
    Stage("render", render, when=selected("render"), journaled=False),
    Stage("report", write_report, when=selected("report"), journaled=False),
)
check_names("InterDrive stages", [s.name for s in STAGES], STAGE_NAMES)


def run_interdrive(preset: Preset, work_dir: str, *, engine: str = "jax", stage: str = "all", arms=None,
                   backgrounds=(False, True), url: str | None = None, served_model: str | None = None,
                   adapter: str | None = None, critic_adapter: str | None = None,
                   render_type: str = "ic_straight_left", json_path: str, command: str = "", progress: bool = True,
                   log=print) -> RunContext:
    """Runs the selected stages (``stage``: one of :data:`STAGE_NAMES` or 'all'); the report
    is written to ``json_path`` (plots beside it). ``critic_adapter``: the consensus critic
    is the local model with this adapter (engines 'jax' and 'openai'). Returns the final context."""
    if critic_adapter is not None and engine == "teacher":
        raise InputError("a critic adapter replaces an LLM negotiator's critic: use it with engine 'jax' or 'openai'")
    arms = list(arms or INTERDRIVE_ARMS + A.BASELINES)
    options = {"engine": engine, "stage": stage, "arms": arms, "url": url, "served_model": served_model,
               "adapter": adapter, "critic_adapter": critic_adapter, "render_type": render_type, "json": json_path,
               "command": command,
               "backgrounds": tuple(b for b in backgrounds if b in preset.backgrounds),
               "episode_png": os.path.splitext(json_path)[0] + "_episode.png"}
    os.makedirs(os.path.join(work_dir, "units"), exist_ok=True)
    ctx = RunContext(preset, work_dir, options, progress=progress, log=log)
    return run_stages(STAGES, ctx, InterDriveWorkspace(ctx), Laps())
