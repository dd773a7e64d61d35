"""Fault injection for crash tests: pause a run at a named point so a test can kill it there.

A test sets ``JAX_DRIVE_PAUSE_AT=<point>@<step>`` (e.g. ``grpo_step@2``) in the environment of
the process it starts (subprocesses, Ray workers and JAX processes inherit it). The plan is
read once, when this module is imported; outside tests it is empty and every point is a
no-op comparison. When the run reaches that point at that step it writes the line
``jax-drive: paused at <point>@<step>`` to stderr and sleeps ``JAX_DRIVE_PAUSE_SECONDS``
(default 600) before going on: the test waits for the line and sends SIGKILL, which hits
the run deterministically inside the window the point marks.

Points:
  sft_step, grpo_step     a training step's work is done in memory but not yet recorded
                          (metrics) or checkpointed (:func:`jax_drive.rl.loop.train_loop`);
  <name>_checkpoint       inside a checkpoint write (``Checkpointer(name=...)``; the trainers
                          use ``sft`` and ``grpo``): the files are in the checkpoint's
                          temporary directory, not yet committed;
  <stage>_marker          inside a pipeline stage-marker write, after the stage's arrays
                          and before its marker (step 0; :mod:`jax_drive.pipelines.journal`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

PAUSE_ENV = "JAX_DRIVE_PAUSE_AT"
SECONDS_ENV = "JAX_DRIVE_PAUSE_SECONDS"


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    """Where to pause (``"<point>@<step>"``, or None: nowhere) and for how long (s)."""

    pause_at: str | None = None
    seconds: float = 600.0

    @classmethod
    def from_env(cls, environ=os.environ) -> "FaultPlan":
        return cls(environ.get(PAUSE_ENV) or None, float(environ.get(SECONDS_ENV, "600")))

    def pause(self, point: str, step: int) -> None:
        """Pauses here when the plan names ``point@step``."""
        if self.pause_at is None or self.pause_at != f"{point}@{int(step)}":
            return
        print(f"jax-drive: paused at {self.pause_at}", file=sys.stderr, flush=True)
        time.sleep(self.seconds)


PLAN = FaultPlan.from_env()


def pause_point(point: str, step: int) -> None:
    """The test hook (see the module docstring); a no-op unless this process's plan names it."""
    PLAN.pause(point, step)
