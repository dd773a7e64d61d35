"""Evaluate a finished MTDrive run's policies again on a larger held-out set.

``reevaluate(run_dir, out_dir, eval_scenes)`` rebuilds the run's preset
(:func:`~jax_drive.pipelines.mtdrive.runs.run_preset`), loads its final SFT and last RL
checkpoints and runs the pipeline's evaluation stages on ``eval_scenes`` scenes per held-out
set, in a journal of its own (resumable). The held-out generator is prefix-stable, so each
set starts with the run's own scenes; with the run's own number of scenes it reproduces the
run's evaluation exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from jax_drive.pipelines.journal import RunJournal
from jax_drive.pipelines.mtdrive.pipeline import POLICIES, evaluate_policy, loaded_engine, make_held_out, public_stages
from jax_drive.pipelines.mtdrive.report import eval_card, examples, stage_line
from jax_drive.pipelines.mtdrive.runs import final_sft_dir, restore_policy, rl_checkpoint_dir, run_preset
from jax_drive.pipelines.stages import PolicyRef, RunContext, Stage, StageOutput, Workspace, run_stages
from jax_drive.rl.checkpoint import committed_steps
from jax_drive.rl.optim import OptimConfig


def recorded_policies(run_dir: str, recorded: dict) -> dict[str, PolicyRef]:
    """The run's final SFT and RL policies, restored with the optimiser settings it recorded."""
    return {"untrained": PolicyRef("untrained"),
            "sft": PolicyRef("sft", final_sft_dir(run_dir), OptimConfig(**recorded["sft"]["optim"])),
            "rl": PolicyRef("rl", rl_checkpoint_dir(run_dir), OptimConfig(**recorded["rl"]["optim"]))}


def reevaluation(policy: PolicyRef, ctx: RunContext, ws: Workspace) -> StageOutput:
    """Loads ``policy`` and evaluates it (a stage of :func:`reevaluate`)."""
    meta = {"step": 0}
    if policy.checkpoint is not None:
        meta = restore_policy(ws.model, policy)
        ws.trained(policy)
    outcome = evaluate_policy(ws.engine, ws.tokenizer, ctx.option("held_out"), ctx.preset, ctx.progress)
    record = {**outcome, "checkpoint": {"dir": policy.checkpoint, "step": int(meta["step"])}}
    return StageOutput(record, record)


def reevaluation_stages(policies: dict[str, PolicyRef], evaluate: Sequence[str]) -> tuple[Stage, ...]:
    """One evaluation stage per policy asked for, in the pipeline's order."""
    return tuple(Stage(f"eval_{p}", functools.partial(reevaluation, policies[p])) for p in POLICIES if p in evaluate)


def finished_results(run_dir: str) -> dict:
    """The run's results.json (ValueError for an unfinished run)."""
    try:
        with open(os.path.join(run_dir, "results.json")) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise ValueError(f"{run_dir} has no readable results.json (an unfinished run?): {error}") from None


def reevaluate(run_dir: str | os.PathLike, out_dir: str | os.PathLike, eval_scenes: int, *,
               evaluate: Sequence[str] = ("sft", "rl"), resume: bool = False, progress: bool = True,
               log=None) -> dict[str, Any]:
    """Evaluates a finished run's policies again on ``eval_scenes`` held-out scenes per
    evaluation seed (e.g. to shrink its standard errors); returns a results dict of the run's
    schema (training records copied from its ``results.json``; ``stages`` / ``eval`` /
    ``examples`` new; ``reevaluation`` says what was loaded).

    Args:
      run_dir: a run of :func:`~jax_drive.pipelines.mtdrive.run_mtdrive` that wrote ``results.json``.
      out_dir: the journal of this re-evaluation (one stage per policy; ``resume`` loads finished ones).
      evaluate: 'untrained', 'sft' (the run's final SFT policy) and / or 'rl' (its last mtGRPO checkpoint).
    Raises:
      ValueError for a bad ``eval_scenes`` / stage or a run that cannot be rebuilt;
      FileNotFoundError when a policy's checkpoint is missing;
      :class:`jax_drive.pipelines.journal.RunDirError` when ``out_dir`` cannot be used.
    """
    log = log or (lambda msg: print(msg, flush=True))
    run_dir = os.fspath(run_dir)
    if isinstance(eval_scenes, bool) or not isinstance(eval_scenes, (int, np.integer)) or eval_scenes < 1:
        raise ValueError(f"eval_scenes must be an integer >= 1, got {eval_scenes!r}")
    if set(evaluate) - set(POLICIES) or not evaluate:
        raise ValueError(f"stages to evaluate must be a non-empty subset of {POLICIES}, got {list(evaluate)}")
    preset, identity = run_preset(run_dir)
    before = finished_results(run_dir)
    policies = recorded_policies(run_dir, identity["preset"])
    for name in set(evaluate) - {"untrained"}:
        if not committed_steps(policies[name].checkpoint):
            raise FileNotFoundError(f"{run_dir}: no {name.upper()} checkpoint in {policies[name].checkpoint}")
    preset = dataclasses.replace(preset, eval_scenes=int(eval_scenes))
    journal = RunJournal(out_dir, {"pipeline": "mtdrive_reevaluate", "run": os.path.abspath(run_dir),
                                   "eval_scenes": int(eval_scenes), "evaluate": list(evaluate)}, resume)
    held_out = make_held_out(preset)
    ctx = RunContext(preset, os.fspath(out_dir), {"held_out": held_out}, resume=resume, progress=progress, log=log)
    ws = Workspace(lambda: loaded_engine(preset, journal), restore_policy)
    ws.model  # noqa: B018  (loaded before the first stage, as the run's own evaluation did)
    ctx = run_stages(reevaluation_stages(policies, evaluate), ctx, ws, journal)
    stages, checkpoints = {}, {}
    for name in [p for p in POLICIES if p in evaluate]:
        outcome = dict(ctx.values[f"eval_{name}"])
        checkpoints[name] = outcome.pop("checkpoint")
        stages[name] = outcome
        log(f"[{preset.name}] " + stage_line(f"{name} ({len(held_out)} x {eval_scenes} scenes)", outcome))
    return {**before, "eval": eval_card(preset), "stages": public_stages(stages),
            "examples": {name: examples(s["transcripts"]) for name, s in stages.items()},
            "timings_s": journal.timings, "cpu_timings_s": journal.cpu_timings, "resumed_stages": journal.resumed,
            "reevaluation": {"run": run_dir, "eval_before": before.get("eval"), "checkpoints": checkpoints},
            "_transcripts": {name: s["transcripts"] for name, s in stages.items()}, "_held_out": held_out}
