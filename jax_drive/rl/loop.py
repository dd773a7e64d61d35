"""The one training loop that SFT and (mt)GRPO share.

A trainer supplies its step, ``step(state) -> StepOutcome`` (the new :class:`RunState`, the
metrics to record, the quantities that must be finite); :func:`train_loop` does the rest the
same way for every trainer: restore on ``resume``, the progress bar, metric records
(``metrics.jsonl`` + TensorBoard), step checkpoints every ``checkpoint_every`` steps and at
the end, the crash-test hook, the non-finite guard, closing everything on the way out and
writing the trained params back into the live model.

Non-finite numbers: a step whose loss, gradient norm (or any quantity the trainer lists in
``StepOutcome.finite``) is NaN or infinite stops the run with :class:`NonFiniteError`
naming the step and the quantity; the last finite state is checkpointed first, so the run
can be resumed once the cause is fixed, and no non-finite checkpoint is ever written. With
``LoopConfig.skip_nonfinite`` (off by default; for long runs, as optax's
``apply_if_finite``) such a step's update is dropped instead: params and optimiser state stay
as they were, the step and data position advance, and the record says ``skipped_nonfinite``.

Several processes (:mod:`jax_drive.distributed.multihost`) run the loop together: every
process steps, guards and checkpoints (a checkpoint is written by all of them), and only
process 0 writes metric records and shows the progress bar; the trainer's step makes its
record the same on every process.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable

from tqdm.auto import tqdm

import jax

from jax_drive.faults import pause_point
from jax_drive.parallel import is_primary, shard_model, shard_params
from jax_drive.rl.checkpoint import Checkpointer, RunState
from jax_drive.rl.logging import MetricsLogger
from jax_drive.rl.optim import OptimConfig, make_optimizer, split_model, write_back


class NonFiniteError(RuntimeError):
    """A training step produced a NaN or infinite loss / gradient."""


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """What the loop needs besides the step.

    Attributes:
      name: the trainer ('sft', 'grpo'): progress-bar label, crash-test points
        (``<name>_step``, ``<name>_checkpoint``).
      total_steps: run until ``state.step`` reaches this.
      checkpoint_every: steps between checkpoints (None: only at the end).
      log_every: steps between metric records (the last step is always recorded).
      skip_nonfinite: drop a non-finite step's update instead of stopping (see module doc).
      live_model: the model is read between steps (the sampler generates the next step's
        rollouts with it): the params are written back into it after every step, not only
        at the end.
    """

    name: str
    total_steps: int
    checkpoint_every: int | None = None
    log_every: int = 1
    skip_nonfinite: bool = False
    live_model: bool = False


@dataclasses.dataclass
class StepOutcome:
    """One step's result.

    Attributes:
      state: the run state after the step (step and data position advanced).
      metrics: the step's record (written when the step is logged); values may be callables
        of no argument, evaluated only for logged steps.
      finite: quantities that must be finite (e.g. loss, grad_norm).
      postfix: progress-bar postfix of logged steps.
    """

    state: RunState
    metrics: dict[str, Any]
    finite: dict[str, float] = dataclasses.field(default_factory=dict)
    postfix: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class TrainResult:
    """What a trainer returns: per-step records and the final run state."""

    history: list[dict]
    state: RunState
    out_dir: str | None = None


def first_nonfinite(values: dict[str, float]) -> tuple[str, float] | None:
    """The first (name, value) that is NaN or infinite, or None."""
    for name, value in values.items():
        value = float(value)
        if not math.isfinite(value):
            return name, value
    return None


def initial_state(model, optim: OptimConfig, mesh, seed: int):
    """A trainer's starting point: the live model's arrays sharded over ``mesh`` (None: one
    device; no full copy stays), its ``optim.trainable`` params split from the rest, and a
    fresh :class:`RunState` (optimiser state sharded like the params, ``rng`` from ``seed``).

    Returns (graphdef, params, rest, state)."""
    shard_model(model, mesh)
    graphdef, params, rest = split_model(model, optim.trainable)
    opt_state = shard_params(make_optimizer(optim).init(params), mesh)
    return graphdef, params, rest, RunState(params=params, opt_state=opt_state, rng=jax.random.key(seed))


def open_checkpointer(out_dir: str | os.PathLike | None, name: str) -> Checkpointer | None:
    """``<out_dir>/checkpoints`` (None without an output directory)."""
    return None if out_dir is None else Checkpointer(os.path.join(out_dir, "checkpoints"), name=name)


def restored(state: RunState, ckpt: Checkpointer | None, resume: bool) -> RunState:
    """The latest checkpoint's state on ``resume`` (``state`` when there is none yet)."""
    if not resume:
        return state
    if ckpt is None:
        raise ValueError("resume needs out_dir")
    return ckpt.restore(state)[0] if ckpt.latest_step() is not None else state


def train_loop(model, state: RunState, step: Callable[[RunState], StepOutcome], config: LoopConfig, *,
               ckpt: Checkpointer | None, out_dir: str | os.PathLike | None = None, resume: bool = False,
               progress: bool = True, on_step: Callable[[RunState, dict], None] | None = None) -> TrainResult:
    """Runs ``step`` from ``state`` until ``config.total_steps``; see the module docstring.

    Args:
      model: the live nnx model; receives the trained params at the end.
      state: the run state to start from (already :func:`restored` on resume).
      step: the trainer's step.
      ckpt: the run's checkpointer (:func:`open_checkpointer`; None: no checkpoints); closed here.
      out_dir: metrics.jsonl and tb/ (None: nothing written).
      resume: the run continues: metric records after ``state.step`` are dropped first.
      on_step: called after every step with the new state and its record ({} when not
        logged), before the step's checkpoint.
    Raises:
      NonFiniteError (see the module docstring).
    """
    primary = is_primary()  # the one process that writes records
    logger = MetricsLogger(out_dir if primary else None, resume_from=state.step if resume else None)
    bar = tqdm(total=config.total_steps, initial=state.step, desc=config.name, disable=not (progress and primary),
               dynamic_ncols=True)
    try:
        if config.live_model:
            write_back(model, state.params)  # the first step's rollouts use the restored policy
        while state.step < config.total_steps:
            outcome = step(state)
            pause_point(f"{config.name}_step", outcome.state.step)
            state = _guarded(state, outcome, config, ckpt)
            if config.live_model:
                write_back(model, state.params)
            record: dict = {}
            if state.step % config.log_every == 0 or state.step == config.total_steps:
                metrics = {k: v() if callable(v) else v for k, v in outcome.metrics.items()}
                if state is not outcome.state:
                    metrics["skipped_nonfinite"] = 1.0
                record = logger.log(state.step, metrics)
                if outcome.postfix:
                    bar.set_postfix(outcome.postfix)
            bar.update(1)
            if on_step is not None:
                on_step(state, record)
            if ckpt is not None and config.checkpoint_every and state.step % config.checkpoint_every == 0:
                ckpt.save(state)
        if ckpt is not None and state.step not in ckpt.all_steps():
            ckpt.save(state)
    finally:
        bar.close()
        logger.close()
        if ckpt is not None:
            ckpt.close()
    write_back(model, state.params)
    return TrainResult(history=logger.history, state=state, out_dir=None if out_dir is None else os.fspath(out_dir))


def _guarded(before: RunState, outcome: StepOutcome, config: LoopConfig, ckpt: Checkpointer | None) -> RunState:
    """The state to continue from: the step's, or (non-finite) ``before`` advanced without its
    update when skipping; otherwise stops with :class:`NonFiniteError` after checkpointing
    ``before``."""
    bad = first_nonfinite(outcome.finite)
    if bad is None:
        return outcome.state
    after = outcome.state
    if config.skip_nonfinite:
        return dataclasses.replace(before, rng=after.rng, step=after.step, data_position=after.data_position)
    where = "no checkpoint directory"
    if ckpt is not None:
        if before.step not in ckpt.all_steps():
            ckpt.save(before)
        where = f"the last finite state is checkpoint {before.step} in {ckpt.directory} (resume continues from it)"
    name, value = bad
    raise NonFiniteError(f"{config.name} step {after.step}: {name} is {value} (non-finite); {where}")
