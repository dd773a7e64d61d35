"""The scenario worker: one backend runner (a JAX batch or one CARLA world) in one process.

As a Ray actor it is created with ``max_concurrency=2`` so that :meth:`ScenarioWorker.ping`
and :meth:`ScenarioWorker.status` answer while :meth:`ScenarioWorker.run` works: a ping that
does not come back means the process is stuck or gone. It works without Ray too (the
benchmark's in-process peer, tests).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

from jax_drive.distributed.episodes import EpisodeSpec, episode_record


def _runtime() -> dict:
    """Node id and whether this process is a restart of the actor (empty outside an actor)."""
    import sys
    import warnings

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return {}
    ctx = ray.get_runtime_context()
    if ctx.get_actor_id() is None:
        return {"node_id": ctx.get_node_id()}
    with warnings.catch_warnings():  # Ray's own property reads a deprecated attribute
        warnings.simplefilter("ignore")
        restarted = bool(ctx.was_current_actor_reconstructed)
    return {"node_id": ctx.get_node_id(), "restarted": restarted}


class ScenarioWorker:
    """Runs chunks of episodes with ``backend.make()``'s runner and returns their records."""

    def __init__(self, backend, worker_index: int = 0):
        self.index = int(worker_index)
        self.backend_name = backend.name
        self.runner = backend.make()
        self.started = time.time()
        self.episodes_done = 0
        self._lock = threading.Lock()
        self._running: dict | None = None
        self.runtime = _runtime()  # asked once: Ray answers from the GCS

    def ping(self) -> dict:
        """Who and where this worker is: index, pid, node_id, restarted, episodes_done."""
        with self._lock:
            done = self.episodes_done
        return {"index": self.index, "pid": os.getpid(), "episodes_done": done, **self.runtime}

    def status(self) -> dict:
        """:meth:`ping` plus the chunk being run: ``running`` = {ids, decisions, since} or None."""
        with self._lock:
            running = None if self._running is None else dict(self._running)
        return {**self.ping(), "running": running}

    def _progress(self, decisions: int) -> None:
        with self._lock:
            if self._running is not None:
                self._running["decisions"] = int(decisions)

    def run(self, specs: Sequence[EpisodeSpec], attempt: int = 1) -> list[dict]:
        """Runs one chunk (specs sharing background and time cap); one record per spec."""
        specs = list(specs)
        with self._lock:
            self._running = {"ids": [s.id for s in specs], "decisions": 0, "since": time.time()}
        t0 = time.perf_counter()
        try:
            results = self.runner.run(specs, progress=self._progress)
        finally:
            with self._lock:
                self._running = None
        wall = time.perf_counter() - t0
        meta = {"backend": self.backend_name, "worker": self.index, "pid": os.getpid(), "attempt": int(attempt),
                "chunk_size": len(specs), "chunk_wall_s": round(wall, 4), **self.runtime}
        with self._lock:
            self.episodes_done += len(specs)
        return [episode_record(s, r, meta) for s, r in zip(specs, results)]

    def close(self) -> None:
        self.runner.close()
