"""Killing a real run at a fault-injection point (:mod:`jax_drive.faults`) for crash tests."""

from __future__ import annotations

import os
import signal
import subprocess


def kill_when_paused(command: list[str], env: dict, cwd: str, point: str, log_path) -> None:
    """Runs ``command`` (``env`` names ``point`` in JAX_DRIVE_PAUSE_AT) until it reports being
    paused at ``point``, then SIGKILLs it there; its output goes to ``log_path``."""
    log = open(log_path, "w")
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=log, stderr=subprocess.PIPE, text=True)
    paused = False
    try:
        for line in proc.stderr:
            log.write(line)
            if line.startswith(f"jax-drive: paused at {point}"):
                os.kill(proc.pid, signal.SIGKILL)
                paused = True
                break
    finally:
        proc.wait(timeout=900)
        log.close()
    assert paused, f"the run never reached {point} (exit {proc.returncode}); see {log_path}"
    assert proc.returncode == -signal.SIGKILL
