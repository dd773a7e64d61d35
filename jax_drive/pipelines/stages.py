"""Pipelines as data: an ordered tuple of named stages over an immutable run context.

A pipeline (MTDrive, TalkingVehicles, InterDrive) is a tuple of :class:`Stage` values. Each
stage is a plain top-level function ``(RunContext, Workspace) -> StageOutput``; the runner
(:func:`run_stages`) skips stages whose ``when`` is false, loads a stage the journal already
holds instead of running it, records the stage when it finishes, and hands the next stage a
new context that also holds this stage's value. So a killed run resumes at the first
unfinished stage, and the order of a pipeline can be read on one screen:

    MTDRIVE = (Stage("scenes", scenes, restore=restore_scenes),
               Stage("eval_untrained", eval_untrained, when=evaluates("untrained")), ...)

What stays mutable lives in the :class:`Workspace` (the loaded model and engines, built on
first use). The context says which weights the next stage works with as a value
(:class:`PolicyRef`: a name and the checkpoint holding them); ``Workspace.hold`` loads them
into the model only when it holds others.
"""

from __future__ import annotations

import dataclasses
import os
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jax_drive.pipelines.journal import Journal


@dataclasses.dataclass(frozen=True)
class PolicyRef:
    """Which weights: ``name`` ('untrained', 'sft', 'rl', ...) and the checkpoint directory
    holding them (None: the weights the model was loaded with), restored with ``optim``'s
    trainable set."""

    name: str
    checkpoint: str | None = None
    optim: Any = None


UNTRAINED = PolicyRef("untrained")


@dataclasses.dataclass(frozen=True)
class RunContext:
    """Everything a stage reads; a stage never changes it, the runner makes the next one.

    Attributes:
      preset: the pipeline's preset (a frozen dataclass).
      run_dir: the run directory.
      options: run options that are not preset fields (e.g. ``advantage``, ``sft_from``).
      values: what finished stages produced, by stage name.
      records: their journal records, by stage name.
      policy: the weights the next stage works with.
      resume: the run continues an earlier one in ``run_dir``.
      progress: show progress bars.
      log: progress lines (callable of one string).
    """

    preset: Any
    run_dir: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    values: Mapping[str, Any] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    records: Mapping[str, dict] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    policy: PolicyRef = UNTRAINED
    resume: bool = False
    progress: bool = True
    log: Callable[[str], None] = print

    def path(self, *parts: str) -> str:
        return os.path.join(self.run_dir, *parts)

    def option(self, name: str, default: Any = None) -> Any:
        return self.options.get(name, default)

    def has(self, stage: str) -> bool:
        """Whether ``stage`` finished in this run (ran or loaded)."""
        return stage in self.values

    def after(self, stage: str, value: Any, record: dict, policy: PolicyRef | None) -> "RunContext":
        """The context after ``stage`` finished with ``value`` (and moved the policy, when given)."""
        return dataclasses.replace(
            self, values=types.MappingProxyType({**self.values, stage: value}),
            records=types.MappingProxyType({**self.records, stage: record}),
            policy=self.policy if policy is None else policy)


@dataclasses.dataclass(frozen=True)
class StageOutput:
    """What a stage produced: its value (for later stages), its JSON record (journaled) and
    the arrays stored beside the record (restored with the stage's ``restore``)."""

    value: Any = None
    record: dict = dataclasses.field(default_factory=dict)
    arrays: dict | None = None


def always(ctx: RunContext) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Stage:
    """One named step of a pipeline.

    Attributes:
      name: its journal name (unique in the pipeline).
      run: ``(ctx, workspace) -> StageOutput``.
      restore: ``(record, arrays) -> value`` of a stage loaded from the journal; None: the
        loaded value is its record.
      when: whether the stage applies to this run (a false ``when`` skips it, and it gets no
        journal entry).
      journaled: recorded in the journal, and loaded from it on resume; False: run every time
        (e.g. loading weights), timed as a lap.
      policy: ``ctx -> PolicyRef`` the stage leaves the run with (applied whether it ran or
        was loaded); None: the policy does not move.
    """

    name: str
    run: Callable[[RunContext, "Workspace"], StageOutput]
    restore: Callable[[dict, dict], Any] | None = None
    when: Callable[[RunContext], bool] = always
    journaled: bool = True
    policy: Callable[[RunContext], PolicyRef] | None = None


class Workspace:
    """The run's mutable resources, built on first use, and the weights its model holds.

    ``load`` builds ``(model, tokenizer, engine)`` (the pipeline's engine factory);
    ``restore(model, policy)`` loads a :class:`PolicyRef`'s checkpoint into the model.
    Pipelines that need other resources (embedders, a student model, a negotiator) keep
    them in :attr:`extra` by name (:meth:`get`).
    """

    def __init__(self, load: Callable[[], tuple[Any, Any, Any]] | None = None,
                 restore: Callable[[Any, PolicyRef], Any] | None = None):
        self._load = load
        self._restore = restore
        self._model = None
        self.holding: PolicyRef = UNTRAINED
        self.extra: dict[str, Any] = {}

    def _loaded(self):
        if self._model is None:
            if self._load is None:
                raise RuntimeError("this pipeline's workspace loads no model")
            self._model = self._load()
        return self._model

    @property
    def model(self):
        return self._loaded()[0]

    @property
    def tokenizer(self):
        return self._loaded()[1]

    @property
    def engine(self):
        return self._loaded()[2]

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def hold(self, policy: PolicyRef) -> None:
        """Makes the model hold ``policy``'s weights (restored only when it holds others)."""
        if policy == self.holding:
            return
        if policy.checkpoint is None:
            raise ValueError(f"cannot go back to the {policy.name!r} weights once the model holds "
                             f"{self.holding.name!r}")
        self._restore(self.model, policy)
        self.holding = policy

    def trained(self, policy: PolicyRef) -> None:
        """The model was trained in place and now holds ``policy``'s weights."""
        self.holding = policy

    def get(self, name: str, build: Callable[[], Any]) -> Any:
        """The resource ``name``, built by ``build()`` on first use."""
        if name not in self.extra:
            self.extra[name] = build()
        return self.extra[name]


def run_stages(stages: Sequence[Stage], ctx: RunContext, workspace: Workspace, journal: Journal,
               after: Callable[[str, Any], None] | None = None) -> RunContext:
    """Runs (or loads) every applicable stage in order; returns the final context.
    ``after(name, value)`` is called when each stage finished (ran or loaded)."""
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise ValueError(f"stage names repeat: {names}")
    for stage in stages:
        if not stage.when(ctx):
            continue
        if stage.journaled:
            value, record = journal.stage(stage.name, lambda s=stage: _as_tuple(s.run(ctx, workspace)),
                                          stage.restore)
        else:
            out = stage.run(ctx, workspace)
            value, record = out.value, out.record
            journal.lap(stage.name)
        ctx = ctx.after(stage.name, value, record, None if stage.policy is None else stage.policy(ctx))
        if after is not None:
            after(stage.name, value)
    return ctx


def _as_tuple(out: StageOutput) -> tuple[Any, dict, dict | None]:
    if not isinstance(out, StageOutput):
        raise TypeError(f"a stage returns a StageOutput, got {type(out).__name__}")
    return out.value, out.record, out.arrays
