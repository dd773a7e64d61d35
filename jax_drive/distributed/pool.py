"""A pool of scenario workers (Ray actors) that runs a plan of episodes to completion.

    init_ray()                                   # local: this machine's cores
    with ScenarioPool(JaxBackend(), PoolConfig(num_workers=2)) as pool:
        summary = pool.run(plan_episodes(["tv_red_light"], range(3), 8), ResultStore("runs/x"))

Scheduling: the episodes not yet in the store are cut into chunks (one batch each) and
handed to idle workers. Health: every worker is pinged every ``health_interval_s`` (the
actor answers while it runs, ``max_concurrency=2``); a ping that does not return within
``ping_timeout_s``, or a chunk that runs past ``task_timeout_s``, gets the actor killed
with ``ray.kill(no_restart=False)`` so Ray restarts it. Failures: Ray restarts a dead actor
up to ``max_restarts`` times (``__init__`` runs again); the chunk it was running raises
``RayActorError`` (calls are not retried by Ray, ``max_task_retries=0``) and goes back to the
front of the queue, up to ``max_attempts`` runs in all; a runner's
:class:`~jax_drive.distributed.backends.BackendFailure` (a lost CARLA server) is handled the
same way; any other exception fails those episodes (reported, not recorded, so a later run
retries them). A worker whose restarts are spent is dropped; with none left the run stops
(the store keeps what was recorded). Every result goes through
:meth:`~jax_drive.distributed.store.ResultStore.put`, so each episode is recorded once.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import time
from collections.abc import Sequence

from tqdm import tqdm

from jax_drive.configs import at_least
from jax_drive.distributed.backends import BackendFailure
from jax_drive.distributed.episodes import EpisodeSpec, chunk_specs
from jax_drive.distributed.store import ResultStore
from jax_drive.distributed.worker import ScenarioWorker
from jax_drive.runinfo import InputError, sigterm_exits


def init_ray(address: str | None = None, num_cpus: int | None = None, **kwargs) -> dict:
    """Starts or joins Ray and returns the cluster's resources.

    ``address`` None or ``"local"``: a new local Ray instance with ``num_cpus`` (default: this
    machine's cores), even when ``RAY_ADDRESS`` or a ``ray start`` session names another;
    Ray's ``local_mode`` is gone, this is a real multi-process instance.
    ``"auto"`` or ``"HOST:PORT"``: join a cluster started with ``ray start --head`` (and
    ``ray start --address=HOST:PORT`` on the other nodes). Does nothing when Ray is up.
    """
    import ray

    if not ray.is_initialized():
        options = dict(logging_level="WARNING", **kwargs)
        if address in (None, "local"):
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, **options)
        else:
            ray.init(address=address, **options)
    return dict(ray.cluster_resources())


@contextlib.contextmanager
def ray_session(address: str | None = None, **kwargs):
    """:func:`init_ray` for the block, yielding the cluster's resources. A Ray instance this
    call started is shut down when the block ends, also by SIGTERM (then ``SystemExit(143)``)
    or Ctrl-C, so no Ray helper processes outlive the driver; a joined cluster is left running."""
    import ray

    started = not ray.is_initialized() and address in (None, "local")
    resources = init_ray(address, **kwargs)
    try:
        with sigterm_exits():  # after ray.init, whose core replaces the SIGTERM handler
            yield resources
    finally:
        if started:
            ray.shutdown()


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """Pool settings.

    Fields: num_workers (actors); chunk_size (episodes per call, one batch: 4 fills the JAX
    runner's bucket, use 1 for CARLA); max_restarts (Ray restarts per actor, -1 forever);
    max_attempts (runs of one chunk before its episodes are reported failed);
    cpus_per_worker (Ray CPUs each actor holds while alive); resources (extra Ray resources
    per actor, e.g. {"carla": 1} on nodes started with ``--resources``); task_timeout_s
    (None: no limit); health_interval_s, ping_timeout_s (liveness pings); start_timeout_s
    (waiting for the workers' first ping); poll_s (driver loop period).
    """

    num_workers: int = 2
    chunk_size: int = 4
    max_restarts: int = 3
    max_attempts: int = 3
    cpus_per_worker: float = 1.0
    resources: dict | None = None
    task_timeout_s: float | None = None
    health_interval_s: float = 10.0
    ping_timeout_s: float = 60.0
    start_timeout_s: float = 600.0
    poll_s: float = 0.1

    def __post_init__(self):
        at_least(self, 1, "num_workers", "chunk_size", "max_attempts", error=InputError)
        if self.max_restarts < -1:
            raise InputError("max_restarts must be >= -1 (-1: restart forever)")


@dataclasses.dataclass
class RunSummary:
    """What one :meth:`ScenarioPool.run` did (counts are episodes unless named otherwise)."""

    planned: int
    already_recorded: int
    recorded: int = 0
    duplicates: int = 0
    retried_chunks: int = 0
    worker_deaths: int = 0
    failed: dict = dataclasses.field(default_factory=dict)  # episode id -> error text
    wall_s: float = 0.0

    @property
    def complete(self) -> bool:
        return self.already_recorded + self.recorded == self.planned

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "complete": self.complete,
                "episodes_per_s": self.recorded / self.wall_s if self.wall_s > 0 else None}


@dataclasses.dataclass
class _Slot:
    """The driver's view of one worker."""

    index: int
    handle: object
    state: str = "starting"  # starting | idle | busy | recovering | dead
    task: object = None  # ObjectRef of the running chunk
    chunk: tuple = ()
    attempt: int = 0
    task_since: float = 0.0
    ping: object = None  # ObjectRef of the outstanding ping
    ping_since: float = 0.0
    next_ping: float = 0.0
    info: dict = dataclasses.field(default_factory=dict)


class ScenarioPool:
    """Scenario workers as Ray actors; see the module docstring.

    Args:
      backends: one backend configuration for every worker, or one per worker (e.g. a
        :class:`~jax_drive.distributed.backends.CarlaBackend` per server).
      config: :class:`PoolConfig` (``num_workers`` is taken from ``backends`` when a list).
    """

    def __init__(self, backends, config: PoolConfig = PoolConfig()):
        if isinstance(backends, Sequence):
            backends = list(backends)
            config = dataclasses.replace(config, num_workers=len(backends))
        else:
            backends = [backends] * config.num_workers
        if not backends:
            raise InputError("need at least one backend")
        self.backends = backends
        self.config = config
        self.slots: list[_Slot] = []

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> list[dict]:
        """Creates the actors and waits for each one's first ping (its ``__init__`` done)."""
        import ray

        cfg = self.config
        remote = ray.remote(ScenarioWorker)
        for i, backend in enumerate(self.backends):
            handle = remote.options(
                num_cpus=cfg.cpus_per_worker, resources=cfg.resources or {}, max_restarts=cfg.max_restarts,
                max_task_retries=0, max_concurrency=2, scheduling_strategy="SPREAD",
            ).remote(backend, i)
            self.slots.append(_Slot(index=i, handle=handle))
        infos = ray.get([s.handle.ping.remote() for s in self.slots], timeout=cfg.start_timeout_s)
        now = time.monotonic()
        for slot, info in zip(self.slots, infos):
            slot.state, slot.info, slot.next_ping = "idle", info, now + cfg.health_interval_s
        return infos

    def shutdown(self) -> None:
        """Kills every actor (no restart)."""
        import ray

        for slot in self.slots:
            try:
                ray.kill(slot.handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.slots = []

    def __enter__(self) -> ScenarioPool:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ---------------------------------------------------------------------- run
    def run(self, specs: Sequence[EpisodeSpec], store: ResultStore, *, description: dict | None = None,
            show_progress: bool = True) -> RunSummary:
        """Runs every episode of ``specs`` that ``store`` does not hold yet; returns a
        :class:`RunSummary`. The plan (ids, ``description``, default: the backend's) is
        written to the store, or checked against it when resuming."""
        import ray

        specs = list(specs)
        ids = [s.id for s in specs]
        store.plan(ids, description if description is not None else self.backends[0].describe())
        store.repair_journal()
        done = store.ids()
        todo = [s for s in specs if s.id not in done]
        if todo and not self.slots:
            self.start()
        summary = RunSummary(planned=len(specs), already_recorded=len(specs) - len(todo))
        store.log("run_start", planned=len(specs), already_recorded=summary.already_recorded,
                  workers=len(self.slots), pid=os.getpid())
        queue = collections.deque((chunk, 1) for chunk in chunk_specs(todo, self.config.chunk_size))
        bar = tqdm(total=len(specs), initial=summary.already_recorded, desc="episodes", disable=not show_progress)
        t0 = time.perf_counter()
        try:
            while queue or any(s.state == "busy" for s in self.slots):
                self._dispatch(queue)
                self._ping_due()
                refs = [s.task for s in self.slots if s.state == "busy"] + [s.ping for s in self.slots if s.ping]
                if not refs:
                    if all(s.state == "dead" for s in self.slots):
                        raise RuntimeError(f"all {len(self.slots)} workers are dead (restarts spent); "
                                           f"{summary.recorded} episodes recorded this run, rerun to resume")
                    time.sleep(self.config.poll_s)
                    continue
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.config.poll_s, fetch_local=False)
                for ref in ready:
                    self._handle(ref, queue, store, summary, bar)
                self._check_timeouts(store)
        finally:
            bar.close()
            summary.wall_s = time.perf_counter() - t0
            store.log("run_end", **{k: v for k, v in summary.to_json().items() if k != "failed"},
                      failed=sorted(summary.failed))
        return summary

    # ------------------------------------------------------------------ helpers
    def _dispatch(self, queue) -> None:
        for slot in self.slots:
            if slot.state == "idle" and queue:
                chunk, attempt = queue.popleft()
                slot.task = slot.handle.run.remote(chunk, attempt)
                slot.state, slot.chunk, slot.attempt, slot.task_since = "busy", chunk, attempt, time.monotonic()

    def _send_ping(self, slot: _Slot) -> None:
        slot.ping, slot.ping_since = slot.handle.ping.remote(), time.monotonic()

    def _ping_due(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.state in ("idle", "busy", "recovering") and slot.ping is None and now >= slot.next_ping:
                self._send_ping(slot)

    def _find(self, ref):
        for slot in self.slots:
            if slot.task is not None and ref == slot.task:
                return slot, "task"
            if slot.ping is not None and ref == slot.ping:
                return slot, "ping"
        return None, None

    def _handle(self, ref, queue, store: ResultStore, summary: RunSummary, bar) -> None:
        import ray

        slot, kind = self._find(ref)
        if slot is None:
            return
        if kind == "ping":
            slot.ping = None
            try:
                info = ray.get(ref)
            except ray.exceptions.ActorDiedError as error:
                if slot.state != "busy":  # a busy worker's task fails too and is retried first
                    self._dead(slot, store, error)
                return
            except ray.exceptions.RayActorError:  # unavailable for now: restarting
                slot.next_ping = time.monotonic() + 0.5
                if slot.state == "busy":
                    return
                slot.state = "recovering"
                return
            slot.info = info
            slot.next_ping = time.monotonic() + self.config.health_interval_s
            if slot.state == "recovering":
                slot.state = "idle"
                store.log("worker_ready", worker=slot.index, pid=info.get("pid"), restarted=info.get("restarted"))
            return
        chunk, attempt = slot.chunk, slot.attempt
        slot.task, slot.chunk = None, ()
        try:
            records = ray.get(ref)
        except ray.exceptions.RayActorError as error:
            summary.worker_deaths += 1
            store.log("worker_died", worker=slot.index, pid=slot.info.get("pid"), episodes=[s.id for s in chunk],
                      attempt=attempt, error=type(error).__name__)
            self._retry(queue, chunk, attempt, store, summary, type(error).__name__)
            self._recover(slot, restart=False)
            return
        except ray.exceptions.RayTaskError as error:
            cause = getattr(error, "cause", None)
            text = f"{type(cause).__name__ if cause else 'RayTaskError'}: {str(cause or error)[:500]}"
            if isinstance(cause, BackendFailure):
                store.log("backend_failure", worker=slot.index, episodes=[s.id for s in chunk], error=text)
                self._retry(queue, chunk, attempt, store, summary, text)
                self._recover(slot, restart=True)
                return
            store.log("episode_error", worker=slot.index, episodes=[s.id for s in chunk], error=text)
            for spec in chunk:
                summary.failed[spec.id] = text
            slot.state = "idle"
            return
        slot.state = "idle"
        for record in records:
            if store.put(record):
                summary.recorded += 1
                bar.update(1)
                store.log("recorded", episode=record["episode_id"], worker=slot.index, attempt=attempt)
            else:
                summary.duplicates += 1
                store.log("duplicate", episode=record["episode_id"], worker=slot.index, attempt=attempt)

    def _retry(self, queue, chunk, attempt, store: ResultStore, summary: RunSummary, reason: str) -> None:
        ids = [s.id for s in chunk]
        if attempt < self.config.max_attempts:
            queue.appendleft((chunk, attempt + 1))
            summary.retried_chunks += 1
            store.log("retry", episodes=ids, attempt=attempt + 1)
        else:
            for i in ids:
                summary.failed[i] = f"gave up after {attempt} attempts: {reason}"
            store.log("gave_up", episodes=ids, attempts=attempt)

    def _recover(self, slot: _Slot, restart: bool) -> None:
        """Marks ``slot`` as recovering (pinged until its restarted actor answers);
        ``restart`` kills the process first so that Ray restarts it."""
        import ray

        if restart:
            try:
                ray.kill(slot.handle, no_restart=False)
            except Exception:  # noqa: BLE001 - already gone
                pass
        slot.state, slot.ping, slot.next_ping = "recovering", None, time.monotonic() + 0.2

    def _dead(self, slot: _Slot, store: ResultStore, error) -> None:
        slot.state, slot.task, slot.ping = "dead", None, None
        store.log("worker_dead", worker=slot.index, error=type(error).__name__)

    def _check_timeouts(self, store: ResultStore) -> None:
        now = time.monotonic()
        cfg = self.config
        for slot in self.slots:
            late_task = (slot.state == "busy" and cfg.task_timeout_s is not None
                         and now - slot.task_since > cfg.task_timeout_s)
            late_ping = slot.ping is not None and slot.state != "recovering" and now - slot.ping_since > cfg.ping_timeout_s
            if late_task or late_ping:
                store.log("worker_unresponsive", worker=slot.index, reason="task timeout" if late_task else "ping timeout")
                import ray

                ray.kill(slot.handle, no_restart=False)  # the running task then fails and is retried
                slot.ping, slot.next_ping, slot.task_since = None, now + 0.5, now
