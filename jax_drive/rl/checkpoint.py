"""Orbax checkpoints of a training run: trainable params, optimizer state, step, PRNG key and
data position, so ``--resume`` continues a killed run exactly.

Layout: ``<dir>/<step>/state`` (orbax StandardSave of ``{'params', 'opt_state', 'rng'}``) and
``<dir>/<step>/meta`` (JSON: step, data_position, any extra run info). The PRNG key is stored
as its raw ``key_data`` (uint32) and re-wrapped on restore. Restoring needs a target tree of
the same structure (the freshly initialised state of the run being resumed), which fixes
shapes, dtypes and the optax / nnx pytree node types.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import orbax.checkpoint as ocp


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


def _tree(state: RunState) -> dict:
    return {"params": state.params, "opt_state": state.opt_state, "rng": jax.random.key_data(state.rng)}


class Checkpointer:
    """Thin wrapper over ``ocp.CheckpointManager`` (synchronous saves, keeps ``max_to_keep``)."""

    def __init__(self, directory: str | os.PathLike, max_to_keep: int = 3):
        self.directory = os.path.abspath(os.fspath(directory))
        os.makedirs(self.directory, exist_ok=True)
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=False)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, state: RunState, extra: dict | None = None) -> None:
        meta = {"step": int(state.step), "data_position": int(state.data_position)}
        if extra:
            meta["extra"] = extra
        self._manager.save(
            int(state.step),
            args=ocp.args.Composite(state=ocp.args.StandardSave(_tree(state)), meta=ocp.args.JsonSave(meta)),
            force=True,
        )
        self._manager.wait_until_finished()

    def restore(self, target: RunState, step: int | None = None) -> tuple[RunState, dict]:
        """Restore into the structure of ``target``; returns (state, meta). Raises if none."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _tree(target))
        out = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
        )
        tree, meta = out["state"], out["meta"]
        rng = jax.random.wrap_key_data(tree["rng"], impl=jax.random.key_impl(target.rng))
        state = RunState(params=tree["params"], opt_state=tree["opt_state"], rng=rng,
                         step=int(meta["step"]), data_position=int(meta["data_position"]))
        return state, dict(meta)

    def close(self) -> None:
        self._manager.close()
