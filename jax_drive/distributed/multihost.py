"""JAX's multi-controller runtime: one program in several processes over one global mesh.

    runtime = initialize()          # from JAX_DRIVE_* (set by `jax-drive scale-out launch`), else one process
    mesh = global_mesh(MeshConfig(data=-1))

Every process runs the same command; :func:`initialize` connects it to the others through
the coordinator (process 0 hosts JAX's coordination service) before JAX touches a device,
and the devices of all processes then form :func:`jax.devices`. What each path does across
processes (rows by process then by device, results gathered to process 0) is in
:mod:`jax_drive.parallel`; launching the processes is :mod:`jax_drive.distributed.launch`.

Where the settings come from, first match wins:
  * explicit arguments;
  * ``JAX_DRIVE_COORDINATOR`` (``host:port``), ``JAX_DRIVE_NUM_PROCESSES``,
    ``JAX_DRIVE_PROCESS_ID`` (our launchers set them; so can any scheduler);
  * ``cluster="auto"`` (or ``JAX_DRIVE_CLUSTER=auto``): JAX's own detection from the
    scheduler's environment (SLURM, Cloud TPU pods, Open MPI; Kubernetes with the
    ``kubernetes`` package), or one named method of JAX's (``slurm``, ``gcetpu``, ``gketpu``,
    ``ompi``, ``mpi4py``);
  * nothing set: one process, no runtime started (the single-process code paths).

Failure: every process sends heartbeats to the coordination service; when one stops for
``heartbeat_timeout_s`` (default 30 s, ``JAX_DRIVE_HEARTBEAT_TIMEOUT_S``), the service tells
every other process, which then aborts with ``The following tasks are unhealthy (stopped
sending heartbeats): <process ids>``, so no collective waits for a dead peer forever.
On CPUs the cross-process collectives run over gloo (TCP).
"""

from __future__ import annotations

import dataclasses
import os

COORDINATOR_ENV = "JAX_DRIVE_COORDINATOR"
NUM_PROCESSES_ENV = "JAX_DRIVE_NUM_PROCESSES"
PROCESS_ID_ENV = "JAX_DRIVE_PROCESS_ID"
CLUSTER_ENV = "JAX_DRIVE_CLUSTER"
HEARTBEAT_ENV = "JAX_DRIVE_HEARTBEAT_TIMEOUT_S"
DEFAULT_HEARTBEAT_S = 30
DEFAULT_INIT_TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class Runtime:
    """Where this process stands: ``process_id`` of ``num_processes``, its own device count
    and the devices of all processes together (1, n, n, n with no runtime)."""

    process_id: int
    num_processes: int
    local_devices: int
    global_devices: int

    @property
    def primary(self) -> bool:
        return self.process_id == 0


def settings_from_env(environ=os.environ) -> tuple[str, int, int] | None:
    """(coordinator, num_processes, process_id) from ``JAX_DRIVE_*``; None when unset.

    Raises ValueError naming the variable when only some are set or one is malformed.
    """
    names = (COORDINATOR_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV)
    values = [environ.get(n) for n in names]
    if not any(values):
        return None
    missing = [n for n, v in zip(names, values) if not v]
    if missing:
        raise ValueError(f"{', '.join(missing)} unset while {', '.join(n for n in names if n not in missing)} is set")
    coordinator, count, index = values
    if ":" not in coordinator:
        raise ValueError(f"{COORDINATOR_ENV} wants host:port, got {coordinator!r}")
    try:
        count, index = int(count), int(index)
    except ValueError:
        raise ValueError(f"{NUM_PROCESSES_ENV} and {PROCESS_ID_ENV} must be integers, got {values[1]!r}, "
                         f"{values[2]!r}") from None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"{PROCESS_ID_ENV}={index} must be in [0, {NUM_PROCESSES_ENV}={count})")
    return coordinator, count, index


def process_env(coordinator: str, num_processes: int, process_id: int) -> dict[str, str]:
    """The variables that make a process join a run (what :func:`settings_from_env` reads)."""
    return {COORDINATOR_ENV: coordinator, NUM_PROCESSES_ENV: str(num_processes), PROCESS_ID_ENV: str(process_id)}


def initialize(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None, *,
               cluster: str | None = None, local_device_ids=None, heartbeat_timeout_s: int | None = None,
               init_timeout_s: int = DEFAULT_INIT_TIMEOUT_S) -> Runtime:
    """Starts (or joins) the multi-controller runtime; see the module docstring.

    Call it first, before any JAX computation (JAX raises otherwise). Calling it again once
    the runtime is up returns the current :class:`Runtime`.

    Args:
      coordinator, num_processes, process_id: explicit settings (all three, or none).
      cluster: "auto" or one of JAX's cluster detection methods (default ``JAX_DRIVE_CLUSTER``).
      local_device_ids: the accelerators this process owns (GPU: one process per GPU).
      heartbeat_timeout_s: a process silent this long counts as dead (default 30 s).
      init_timeout_s: how long to wait for all processes to connect.
    """
    import jax

    if jax.distributed.is_initialized():
        return current()
    explicit = (coordinator, num_processes, process_id)
    if any(v is not None for v in explicit) and any(v is None for v in explicit):
        raise ValueError("pass coordinator, num_processes and process_id together (or none)")
    settings = explicit if coordinator is not None else settings_from_env()
    cluster = cluster or os.environ.get(CLUSTER_ENV) or None
    if settings is None and cluster is None:
        return current()
    if heartbeat_timeout_s is None:
        heartbeat_timeout_s = int(os.environ.get(HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S))
    # gloo is JAX's default for CPU collectives; set it so a changed default cannot leave
    # CPU processes without cross-process collectives
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    options = dict(initialization_timeout=init_timeout_s, heartbeat_timeout_seconds=heartbeat_timeout_s,
                   local_device_ids=local_device_ids)
    if settings is not None:
        address, count, index = settings
        jax.distributed.initialize(address, int(count), int(index), cluster_detection_method="deactivate", **options)
    else:
        jax.distributed.initialize(cluster_detection_method=None if cluster == "auto" else cluster, **options)
    _connect_collectives()
    return current()


def _connect_collectives() -> None:
    """Sets up the cross-process gloo groups of the result gathers while every process is here:
    gloo waits only 30 s for the peers of a group's first collective."""
    import numpy as np

    from jax_drive.parallel import barrier, host_values

    barrier("start")
    host_values(np.int64(0), stack=True)


def current() -> Runtime:
    """This process's :class:`Runtime` (one process when no runtime was started)."""
    import jax

    return Runtime(jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count())


def global_mesh(config=None):
    """The ("data", "fsdp") mesh over every process's devices (default ``MeshConfig(data=-1)``:
    data parallel over all of them); :func:`jax_drive.parallel.make_mesh` with the global device order."""
    from jax_drive.parallel import MeshConfig, make_mesh

    return make_mesh(MeshConfig(data=-1) if config is None else config)


def shutdown() -> None:
    """Leaves the runtime (a no-op without one); after it no collective may run."""
    import jax

    if jax.distributed.is_initialized():
        jax.distributed.shutdown()
