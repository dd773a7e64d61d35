"""A test hook for crash tests: pause a run at a named point so a test can kill it there.

Set ``JAX_DRIVE_PAUSE_AT=<point>@<step>`` (e.g. ``grpo_step@2``) in a run's environment.
When the run reaches that point at that step it writes the line
``jax-drive: paused at <point>@<step>`` to stderr and sleeps for
``JAX_DRIVE_PAUSE_SECONDS`` (default 600) before going on. A test waits for the line and
sends SIGKILL, which hits the run deterministically inside the window the point marks.
Unset (always, outside tests), a point costs one environment lookup.

Points:
  sft_step, grpo_step     inside a training step: the step's work is done in memory but
                          not yet recorded (metrics) or checkpointed;
  <name>_checkpoint       inside a checkpoint write (``Checkpointer(name=...)``; the trainers
                          use ``sft`` and ``grpo``): the files are on disk in the
                          checkpoint's temporary directory, not yet committed;
  <stage>_marker          inside a pipeline stage-marker write, after the stage's arrays
                          and before its marker (step 0; :mod:`jax_drive.pipelines.journal`).
"""

from __future__ import annotations

import os
import sys
import time

PAUSE_ENV = "JAX_DRIVE_PAUSE_AT"
SECONDS_ENV = "JAX_DRIVE_PAUSE_SECONDS"


def pause_point(point: str, step: int) -> None:
    """Pauses here when ``JAX_DRIVE_PAUSE_AT`` names ``point@step`` (a test hook; see module doc)."""
    wanted = os.environ.get(PAUSE_ENV)
    if not wanted or wanted != f"{point}@{int(step)}":
        return
    print(f"jax-drive: paused at {wanted}", file=sys.stderr, flush=True)
    time.sleep(float(os.environ.get(SECONDS_ENV, "600")))
