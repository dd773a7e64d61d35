"""What a scenario worker runs: backend configurations (small, frozen, picklable; sent to
the actor) and the runners they make inside the worker process.

    backend = JaxBackend(policy="rule_based")
    runner = backend.make()                    # in the worker: imports JAX, builds the policy
    results = runner.run(specs, progress=cb)   # list of EpisodeResult, one per spec

A runner raises :class:`BackendFailure` when its environment is lost (a CARLA server that
crashed or stopped answering): the pool then restarts the worker and retries the episodes.
Any other exception is a failure of those episodes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from jax_drive.compile_cache import enable_compile_cache
from jax_drive.distributed.episodes import EpisodeSpec
from jax_drive.runinfo import InputError
from jax_drive.sim.state import SimConfig


class BackendFailure(RuntimeError):
    """The worker's environment is gone (server crash, lost connection): restart and retry."""


class Runner(Protocol):
    def run(self, specs: Sequence[EpisodeSpec], progress: Callable[[int], None] | None = None) -> list: ...

    def close(self) -> None: ...


def make_policy(policy):
    """A policy from a baseline name (``rule_based``, ``silent``) or a zero-argument factory."""
    from jax_drive.coop.baselines import make_policy as baseline

    if callable(policy):
        return policy()
    try:
        return baseline(policy)
    except ValueError as error:
        raise InputError(str(error)) from error


def policy_label(policy) -> str:
    return policy if isinstance(policy, str) else getattr(policy, "__qualname__", repr(policy))


class Backend:
    """What the backend configurations share: a class-level ``name``, the fields ``policy``
    and ``cfg``, and the worker-side ``runner`` class that :meth:`make` builds from them."""

    name: str
    runner: type

    def describe(self) -> dict:
        """What a results directory's plan records about a backend: name, policy, settings."""
        return {"backend": self.name, "policy": policy_label(self.policy), "cfg": dataclasses.asdict(self.cfg)}

    def make(self) -> Runner:
        """The runner, built inside the worker process."""
        return self.runner(self)


def check_group(specs: Sequence[EpisodeSpec]) -> None:
    if not specs:
        raise InputError("a chunk needs at least one episode")
    if len({s.group for s in specs}) != 1:
        raise InputError("the episodes of one chunk must share background and max_time")


class JaxRunner:
    def __init__(self, backend: JaxBackend):
        if backend.xla_cache_dir:
            # workers share the directory (enable_compile_cache sets the size limit that
            # makes JAX lock around reads and writes)
            enable_compile_cache(backend.xla_cache_dir, min_compile_seconds=backend.xla_cache_min_compile_s)
        self.backend = backend
        self.policy = make_policy(backend.policy)

    def run(self, specs: Sequence[EpisodeSpec], progress: Callable[[int], None] | None = None) -> list:
        from jax_drive.coop.runner import run_episodes

        check_group(specs)
        results, _ = run_episodes(
            [s.scenario for s in specs], [s.key() for s in specs], accident_prone=[s.accident_prone for s in specs],
            policy=self.policy, background=specs[0].background, cfg=self.backend.cfg, max_time=specs[0].max_time,
            progress=progress)
        return results

    def close(self) -> None:
        pass


class CarlaRunner:
    """The :class:`CarlaBackend` runner (:mod:`jax_drive.carla`): connects lazily
    (waiting up to ``connect_timeout_s`` for a restarting server), runs one episode per spec
    and turns lost-server errors into ``BackendFailure`` (the pool restarts and retries)."""

    def __init__(self, backend: CarlaBackend, connect_timeout_s: float = 180.0, carla=None):
        self.backend = backend
        self.connect_timeout_s = connect_timeout_s
        self._carla = carla
        self.policy = make_policy(backend.policy)
        self.world = None  # a jax_drive.carla.world.CarlaWorld once connected

    def _connect(self):
        from jax_drive.carla import carla_module
        from jax_drive.carla.world import CarlaWorld

        if self.world is not None:
            return self.world
        carla = self._carla or carla_module()
        b = self.backend
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            try:
                client = carla.Client(b.host, b.port)
                client.set_timeout(b.timeout_s)
                client.get_server_version()
                self.world = CarlaWorld(client, carla, tm_port=b.tm_port, dt=b.cfg.dt)
                return self.world
            except RuntimeError as error:
                if time.monotonic() > deadline:
                    raise BackendFailure(f"CARLA at {b.host}:{b.port} does not answer: {error}") from error
                time.sleep(2.0)

    def run(self, specs, progress=None) -> list:
        from jax_drive.carla.env import CarlaEpisodeBatch
        from jax_drive.coop.runner import run_episodes

        results = []
        for spec in specs:
            world = self._connect()
            try:
                batch = CarlaEpisodeBatch(world, spec.scenario, spec.key(), spec.accident_prone,
                                          background=spec.background, cfg=self.backend.cfg, max_time=spec.max_time)
                res, _ = run_episodes(None, (), accident_prone=None, policy=self.policy, batch=batch, progress=progress)
                results.extend(res)
            except RuntimeError as error:
                if type(error) is not RuntimeError:  # e.g. XLA's errors: not the server's
                    raise
                # the CARLA client raises plain RuntimeErrors: time-outs, lost connections
                self.world = None
                raise BackendFailure(f"CARLA episode {spec.id} lost the server: {error}") from error
            finally:
                if self.world is not None:
                    self.world.clear()
        return results

    def close(self) -> None:
        if self.world is not None:
            self.world.close()
            self.world = None


@dataclasses.dataclass(frozen=True)
class JaxBackend(Backend):
    """A batch of episodes on the batched JAX core (:func:`jax_drive.coop.runner.run_episodes`).

    Fields: policy (baseline name or zero-argument factory of a batched policy); cfg;
    xla_cache_dir (persistent XLA compilation cache shared by the workers, so a restarted
    worker skips most compilation; None: off); xla_cache_min_compile_s (only programs that
    took at least this long to compile are cached).
    """

    policy: str | Callable = "rule_based"
    cfg: SimConfig = SimConfig()
    xla_cache_dir: str | None = None
    xla_cache_min_compile_s: float = 0.5
    name = "jax"
    runner = JaxRunner


@dataclasses.dataclass(frozen=True)
class CarlaBackend(Backend):
    """One CARLA world per worker (:mod:`jax_drive.carla`), one episode at a time.

    Fields: host, port (the server's RPC port), tm_port (this world's Traffic Manager
    port); policy; cfg (20 Hz ticks, ``decision_steps`` per decision); timeout_s (client
    timeout: a call that waits longer means the server is lost).
    """

    host: str = "localhost"
    port: int = 2000
    tm_port: int = 8000
    policy: str | Callable = "rule_based"
    cfg: SimConfig = SimConfig()
    timeout_s: float = 60.0
    name = "carla"
    runner = CarlaRunner
