"""Killing a real run at a fault-injection point (:mod:`jax_drive.faults`) for crash tests."""

from __future__ import annotations

import os
import signal
import subprocess

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_env(out, pause: str | None = None) -> dict:
    """The environment of a run in directory ``out`` (a path) started by a crash test: the
    checkout on PYTHONPATH, the CPU, and ``pause`` (``<point>@<step>``) as the fault plan.
    The runs of one test compile the same programs: they share the session's XLA cache, or one
    of their own beside ``out`` (a run is only killed while paused at a hook, never mid-compile)."""
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false")
    cache = jax.config.jax_compilation_cache_dir or str(out.parent / "xla_cache")
    env.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    env.pop("JAX_DRIVE_PAUSE_AT", None)
    if pause:
        env["JAX_DRIVE_PAUSE_AT"] = pause
    return env


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
