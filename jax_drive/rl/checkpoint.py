"""Checkpoints of a training run, committed atomically.

A checkpoint holds the trainable params, the optimizer state, the PRNG key (as its raw
``key_data``), the step and the data position, so ``resume`` continues a killed run exactly.

Layout: ``<dir>/<step>/state`` (orbax ``StandardCheckpointHandler``) and
``<dir>/<step>/meta.json`` (step, data_position, any extra run info). A save writes
everything into ``<dir>/<step>.partial`` and then renames it to ``<dir>/<step>`` (one
``os.replace``), so a run killed during a save leaves at most a ``.partial`` directory,
which is never read and is removed when the directory is opened again. Restoring needs a
target tree of the same structure (the freshly initialised state of the run being
resumed), which fixes shapes, dtypes and the optax / nnx pytree node types.

Several processes (:mod:`jax_drive.distributed.multihost`) save together: every process
writes the shards it holds into the same ``<step>.partial`` on a shared filesystem, process 0
writes ``meta.json``, and after a barrier process 0 alone renames the directory (and prunes
old steps), so the commit happens once; a second barrier keeps every process from reading the
directory before it is committed. A checkpoint restores into any mesh and process count:
orbax reads each process's shards of the target's shardings.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any

import jax
import orbax.checkpoint as ocp

import numpy as np

from jax_drive.rl.atomic import atomic_write_json
from jax_drive.faults import pause_point
from jax_drive.parallel import barrier, is_primary
from jax_drive.rl.optim import make_optimizer, split_model, write_back

PARTIAL_SUFFIX = ".partial"


# ----------------------------------------------------------------------------- run state
@dataclasses.dataclass
class RunState:
    """Everything that evolves during training (host-side holder, not a pytree).

    Attributes:
      params: trainable nnx.State. opt_state: optax state. rng: a typed PRNG key.
      step: completed optimiser steps (trainer steps). data_position: items consumed so far.
    """

    params: Any
    opt_state: Any
    rng: jax.Array
    step: int = 0
    data_position: int = 0


def committed_steps(directory: str | os.PathLike) -> list[int]:
    """The steps of the committed checkpoints in ``directory``, ascending ([] if none)."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(e) for e in os.listdir(directory)
                  if e.isdigit() and os.path.isfile(os.path.join(directory, e, "meta.json")))


def _tree(state: RunState) -> dict:
    # the key as host data: one value for every process (each holds its own device copy)
    return {"params": state.params, "opt_state": state.opt_state, "rng": np.asarray(jax.random.key_data(state.rng))}


class Checkpointer:
    """Synchronous, atomically committed checkpoints of a :class:`RunState`; keeps the
    newest ``max_to_keep``.

    ``name`` labels the test hook point inside each save (``<name>_checkpoint``, see
    :mod:`jax_drive.faults`).
    """

    def __init__(self, directory: str | os.PathLike, max_to_keep: int = 3, name: str = "run"):
        if max_to_keep < 1:
            raise ValueError("max_to_keep must be >= 1")
        self.directory = os.path.abspath(os.fspath(directory))
        self.max_to_keep = max_to_keep
        self.name = name
        os.makedirs(self.directory, exist_ok=True)
        if is_primary():
            for entry in os.listdir(self.directory):  # left by a run killed during a save
                if entry.endswith(PARTIAL_SUFFIX):
                    shutil.rmtree(os.path.join(self.directory, entry))
        barrier(f"checkpoint-open:{self.name}")
        self._orbax = ocp.Checkpointer(ocp.StandardCheckpointHandler())

    def all_steps(self) -> list[int]:
        """Committed steps, ascending."""
        return committed_steps(self.directory)

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def save(self, state: RunState, extra: dict | None = None) -> None:
        """Writes the state of ``state.step`` (replacing a committed one of the same step)."""
        step = int(state.step)
        final = os.path.join(self.directory, str(step))
        partial = final + PARTIAL_SUFFIX
        primary = is_primary()
        if primary:
            if os.path.exists(partial):
                shutil.rmtree(partial)
            os.makedirs(partial)
        barrier(f"checkpoint-begin:{self.name}:{step}")
        self._orbax.save(os.path.join(partial, "state"), args=ocp.args.StandardSave(_tree(state)))
        meta = {"step": step, "data_position": int(state.data_position)}
        if extra:
            meta["extra"] = extra
        if primary:
            atomic_write_json(os.path.join(partial, "meta.json"), meta)
        pause_point(f"{self.name}_checkpoint", step)
        barrier(f"checkpoint-written:{self.name}:{step}")
        if primary:
            if os.path.exists(final):
                shutil.rmtree(final)
            os.replace(partial, final)
            for old in self.all_steps()[:-self.max_to_keep]:
                shutil.rmtree(os.path.join(self.directory, str(old)))
        barrier(f"checkpoint-committed:{self.name}:{step}")

    def restore(self, target: RunState, step: int | None = None) -> tuple[RunState, dict]:
        """Restore into the structure of ``target``; returns (state, meta). Raises if none."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        path = os.path.join(self.directory, str(step))
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _tree(target))
        tree = self._orbax.restore(os.path.join(path, "state"), args=ocp.args.StandardRestore(abstract))
        with open(os.path.join(path, "meta.json")) as f:
            meta = json.load(f)
        rng = jax.random.wrap_key_data(tree["rng"], impl=jax.random.key_impl(target.rng))
        state = RunState(params=tree["params"], opt_state=tree["opt_state"], rng=rng,
                         step=int(meta["step"]), data_position=int(meta["data_position"]))
        return state, meta

    def close(self) -> None:
        self._orbax.close()


def restore_trainable(model, optim, directory: str | os.PathLike) -> dict:
    """Loads the trainable params of the latest checkpoint in ``directory`` into ``model`` in
    place (the checkpoint must come from the same model, LoRA rank and ``optim.trainable``).

    Args:
      model: the nnx model. optim: the run's :class:`jax_drive.rl.optim.OptimConfig`.
    Returns:
      the checkpoint's meta (step, data position). Raises FileNotFoundError if none.
    """
    if not committed_steps(directory):
        raise FileNotFoundError(f"no checkpoint in {os.fspath(directory)}")
    _, params, _ = split_model(model, optim.trainable)
    template = RunState(params=params, opt_state=make_optimizer(optim).init(params), rng=jax.random.key(0))
    ckpt = Checkpointer(directory)
    try:
        state, meta = ckpt.restore(template)
    finally:
        ckpt.close()
    write_back(model, state.params)
    return meta
