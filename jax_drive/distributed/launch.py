"""Starting a multi-process run: N local processes, or one process per host of a Ray cluster.

    report = launch_local(["jax-drive", "scale-out", "job", "sft", ...], processes=2, devices_per_process=4)
    report = launch_ray(command, hosts=4, address="HEAD_IP:6379")
    sys.exit(report.returncode)

Both run the same command in every process with the variables of
:func:`jax_drive.distributed.multihost.process_env` set (coordinator, process count and id;
on CPUs ``XLA_FLAGS=--xla_force_host_platform_device_count=K`` gives each process K
devices), stream each process's output with a ``[i]`` prefix, and supervise: when a process
fails (non-zero exit, a signal, a Ray actor or node lost), the others fail on their own within
the runtime's heartbeat timeout (:mod:`jax_drive.distributed.multihost`); any still running
after ``grace_s`` are stopped. The :class:`LaunchReport` names the process that failed first,
how, and what the others said about it; its ``returncode`` is non-zero after any failure.

On Ray, one actor per host (a placement group with one bundle per host, ``STRICT_SPREAD`` by
default) starts the command as a child process in the driver's working directory (every
node holds the same installation at the same path), so placement, node loss and actor
death are Ray's to report.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, TextIO

from jax_drive.distributed.multihost import DEFAULT_HEARTBEAT_S, HEARTBEAT_ENV, process_env

DEVICE_FLAG = "--xla_force_host_platform_device_count"
TAIL_LINES = 40
# what a survivor's coordination agent prints when the service lost a peer
UNHEALTHY = re.compile(r"tasks are unhealthy|heartbeat|Terminating process because", re.IGNORECASE)


@dataclasses.dataclass
class ProcessExit:
    """How one process ended: ``returncode`` (negative: killed by that signal; None: still
    running when the launcher stopped it), its host and pid, and its last output lines."""

    process: int
    returncode: int | None
    pid: int | None = None
    host: str = "localhost"
    tail: list[str] = dataclasses.field(default_factory=list)
    note: str = ""

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    def describe(self) -> str:
        if self.note:
            how = self.note
        elif self.returncode is None:
            how = "was stopped by the launcher"
        elif self.returncode < 0:
            how = f"was killed by {signal.Signals(-self.returncode).name}"
        else:
            how = f"exited with status {self.returncode}"
        return f"process {self.process} (pid {self.pid} on {self.host}) {how}"


@dataclasses.dataclass
class LaunchReport:
    """The processes' exits (by process id), the first failure (None: all succeeded), wall time."""

    exits: list[ProcessExit]
    first_failure: ProcessExit | None
    wall_s: float

    @property
    def returncode(self) -> int:
        return 0 if self.first_failure is None and not any(e.failed for e in self.exits) else 1

    def summary(self) -> str:
        if self.returncode == 0:
            return f"jax-drive launch: all {len(self.exits)} processes finished ({self.wall_s:.1f} s)"
        lines = [f"jax-drive launch: FAILED after {self.wall_s:.1f} s: {self.first_failure.describe()} first"]
        for e in self.exits:
            if e is self.first_failure:
                continue
            lines.append(f"  then {e.describe()}" if e.failed else f"  {e.describe()}")
            lines += [f"    [{e.process}] {line}" for line in e.tail if UNHEALTHY.search(line)][:3]
        lines.append(f"  last output of process {self.first_failure.process}:")
        lines += [f"    [{self.first_failure.process}] {line}" for line in self.first_failure.tail[-8:]]
        return "\n".join(lines)


def free_port(host: str = "") -> int:
    """A TCP port nothing listens on now (bound and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def with_device_count(xla_flags: str, count: int) -> str:
    """``xla_flags`` with the CPU device count set to ``count`` (an earlier value replaced)."""
    kept = [f for f in xla_flags.split() if not f.startswith(DEVICE_FLAG)]
    return " ".join(kept + [f"{DEVICE_FLAG}={int(count)}"])


def child_env(coordinator: str, processes: int, index: int, *, devices_per_process: int | None = None,
              heartbeat_s: int | None = None, env: dict | None = None, base: dict | None = None) -> dict[str, str]:
    """The environment of process ``index``: ``base`` (default this one's) + ``env`` + the
    runtime's variables (+ the CPU device count, + the heartbeat timeout)."""
    out = dict(os.environ if base is None else base)
    out.update(env or {})
    out.update(process_env(coordinator, processes, index))
    if devices_per_process:
        out["XLA_FLAGS"] = with_device_count(out.get("XLA_FLAGS", ""), devices_per_process)
    if heartbeat_s:
        out[HEARTBEAT_ENV] = str(int(heartbeat_s))
    return out


def default_grace_s(heartbeat_s: int | None) -> float:
    """How long the others may take to fail on their own: the heartbeat timeout plus 30 s."""
    return float(heartbeat_s or int(os.environ.get(HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S))) + 30.0


class _Printer:
    """Writes prefixed lines from several threads (one line at a time) and keeps a tail per process."""

    def __init__(self, out: TextIO, processes: int):
        self.out, self.lock = out, threading.Lock()
        self.tails = [collections.deque(maxlen=TAIL_LINES) for _ in range(processes)]

    def line(self, process: int | None, text: str) -> None:
        text = text.rstrip("\n")
        if process is not None:
            self.tails[process].append(text)
        with self.lock:
            self.out.write((f"[{process}] {text}" if process is not None else text) + "\n")
            self.out.flush()

    def pump(self, process: int, stream) -> threading.Thread:
        def run():
            for text in stream:
                self.line(process, text)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread


def supervise(poll: Callable[[], dict[int, ProcessExit]], stop: Callable[[], None], processes: int, grace_s: float,
              poll_s: float = 0.2) -> tuple[dict[int, ProcessExit], ProcessExit | None]:
    """Polls until every process has ended; after the first failure, waits ``grace_s`` for the
    rest to end on their own, then calls ``stop``. ``poll()`` returns the exits seen so far.
    Returns (exits by process, the first failure or None)."""
    first, deadline = None, None
    while True:
        exits = poll()
        if first is None:
            failed = [e for e in exits.values() if e.failed]
            if failed:
                first = failed[0]
                deadline = time.monotonic() + grace_s
        if len(exits) == processes:
            return exits, first
        if deadline is not None and time.monotonic() > deadline:
            stop()
            deadline = float("inf")
        time.sleep(poll_s)


# ----------------------------------------------------------------------------- local
def launch_local(command: list[str], processes: int, *, devices_per_process: int | None = None,
                 env: dict | None = None, heartbeat_s: int | None = None, grace_s: float | None = None,
                 port: int | None = None, out: TextIO = sys.stdout) -> LaunchReport:
    """Runs ``command`` in ``processes`` local processes of one run (process 0 is the
    coordinator, on ``127.0.0.1:port``, a free port by default); see the module docstring."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    coordinator = f"127.0.0.1:{port or free_port('127.0.0.1')}"
    printer = _Printer(out, processes)
    start = time.monotonic()
    procs, pumps = [], []
    try:
        for i in range(processes):
            penv = child_env(coordinator, processes, i, devices_per_process=devices_per_process,
                             heartbeat_s=heartbeat_s, env=env)
            proc = subprocess.Popen(command, env=penv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    bufsize=1, start_new_session=True, errors="replace")
            procs.append(proc)
            printer.line(None, f"jax-drive launch: process {i} of {processes} pid {proc.pid} "
                               f"(coordinator {coordinator}): {shlex.join(command)}")
            pumps.append(printer.pump(i, proc.stdout))
        exits: dict[int, ProcessExit] = {}
        stopped: set[int] = set()

        def poll() -> dict[int, ProcessExit]:
            for i, proc in enumerate(procs):
                if i not in exits and proc.poll() is not None:
                    pumps[i].join(timeout=5)
                    note = "was stopped by the launcher" if i in stopped else ""
                    exits[i] = ProcessExit(i, proc.returncode, proc.pid, tail=list(printer.tails[i]), note=note)
            return exits

        def stop() -> None:
            for i, proc in enumerate(procs):
                if proc.poll() is None:
                    printer.line(None, f"jax-drive launch: stopping process {i} (pid {proc.pid})")
                    stopped.add(i)
                    _kill_group(proc)

        exits, first = supervise(poll, stop, processes, default_grace_s(heartbeat_s) if grace_s is None else grace_s)
    except BaseException:
        for proc in procs:
            _kill_group(proc)
        raise
    report = LaunchReport([exits[i] for i in range(processes)], first, time.monotonic() - start)
    printer.line(None, report.summary())
    return report


def _kill_group(proc: subprocess.Popen, wait_s: float = 5.0) -> None:
    """SIGTERM to the process's group, SIGKILL if it is still there after ``wait_s``
    (JAX's preemption handler catches SIGTERM)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass


# ----------------------------------------------------------------------------- Ray
def launch_ray(command: list[str], hosts: int, *, address: str | None = None, devices_per_process: int | None = None,
               env: dict | None = None, heartbeat_s: int | None = None, grace_s: float | None = None,
               cpus_per_host: float = 1.0, placement: str = "STRICT_SPREAD", place_timeout_s: float = 120.0,
               out: TextIO = sys.stdout) -> LaunchReport:
    """Runs ``command`` once per host of a Ray cluster (see the module docstring).

    Args:
      hosts: processes, one Ray actor each, placed by a placement group of ``hosts`` bundles
        of ``cpus_per_host`` CPUs with strategy ``placement`` (STRICT_SPREAD: one per node;
        SPREAD or PACK allow several on one node).
      address: the cluster (``HOST:PORT``, ``auto``); None or ``local``: a local Ray instance.
      env: extra variables for every process (the actors' own environment is the base).
    Raises RuntimeError when the bundles cannot be placed within ``place_timeout_s``.
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from jax_drive.distributed.pool import init_ray

    if hosts < 1:
        raise ValueError(f"hosts must be >= 1, got {hosts}")
    init_ray(address)
    group = placement_group([{"CPU": cpus_per_host}] * hosts, strategy=placement)
    printer = _Printer(out, hosts)
    start = time.monotonic()
    actors = []
    try:
        ready, _ = ray.wait([group.ready()], timeout=place_timeout_s)
        if not ready:
            raise RuntimeError(f"Ray could not place {hosts} hosts x {cpus_per_host:g} CPUs ({placement}) within "
                               f"{place_timeout_s:g} s; cluster: {ray.cluster_resources()}")
        remote = ray.remote(HostProcess)
        actors = [remote.options(num_cpus=cpus_per_host, max_concurrency=2,
                                 scheduling_strategy=PlacementGroupSchedulingStrategy(group, i)).remote()
                  for i in range(hosts)]
        places = ray.get([a.where.remote() for a in actors])
        coordinator = f"{places[0][0]}:{ray.get(actors[0].free_port.remote())}"
        calls = {}
        for i, actor in enumerate(actors):
            # the device count joins the node's own XLA_FLAGS on the actor's side (run)
            penv = child_env(coordinator, hosts, i, heartbeat_s=heartbeat_s, env=env, base={})
            printer.line(None, f"jax-drive launch: process {i} of {hosts} on {places[i][0]} (Ray node "
                               f"{places[i][1][:12]}, coordinator {coordinator}): {shlex.join(command)}")
            calls[actor.run.remote(command, penv, os.getcwd(), i, devices_per_process)] = i
        exits: dict[int, ProcessExit] = {}
        stopped: set[int] = set()

        def poll() -> dict[int, ProcessExit]:
            done, _ = ray.wait([c for c, i in calls.items() if i not in exits], num_returns=1, timeout=0)
            for call in done:
                i = calls[call]
                try:
                    found = ray.get(call)
                    note = "was stopped by the launcher" if i in stopped else ""
                    exits[i] = ProcessExit(i, found["returncode"], found["pid"], places[i][0], found["tail"], note)
                except ray.exceptions.RayError as error:  # the actor or its node is gone
                    exits[i] = ProcessExit(i, -int(signal.SIGKILL), None, places[i][0],
                                           note=f"was lost with its Ray actor ({type(error).__name__}: "
                                                f"{str(error).splitlines()[0][:200]})")
            return exits

        def stop() -> None:
            for call, i in calls.items():
                if i not in exits:
                    printer.line(None, f"jax-drive launch: stopping process {i} on {places[i][0]}")
                    stopped.add(i)
                    actors[i].stop.remote()

        exits, first = supervise(poll, stop, hosts, default_grace_s(heartbeat_s) if grace_s is None else grace_s)
    finally:
        for actor in actors:
            ray.kill(actor)
        remove_placement_group(group)
    report = LaunchReport([exits[i] for i in range(hosts)], first, time.monotonic() - start)
    printer.line(None, report.summary())
    return report


class HostProcess:
    """A Ray actor that runs one process of the run on its node (used by :func:`launch_ray`;
    ``max_concurrency=2`` so ``stop`` is served while ``run`` waits)."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None

    def where(self) -> tuple[str, str]:
        """(node IP, Ray node id)."""
        import ray

        return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()

    def free_port(self) -> int:
        return free_port()

    def run(self, command: list[str], env: dict, cwd: str, index: int, devices_per_process: int | None = None) -> dict:
        """Runs the command to its end (output to this actor's stdout, which Ray forwards to the
        driver) and returns its return code, pid and last lines. ``env`` is added to this
        node's environment; the CPU device count is added to the node's ``XLA_FLAGS``."""
        tail = collections.deque(maxlen=TAIL_LINES)
        full = {**os.environ, **env}
        if devices_per_process:
            full["XLA_FLAGS"] = with_device_count(full.get("XLA_FLAGS", ""), devices_per_process)
        self._proc = subprocess.Popen(command, env=full, cwd=cwd, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True,
                                      errors="replace")
        for line in self._proc.stdout:
            tail.append(line.rstrip("\n"))
            print(f"[{index}] {tail[-1]}", flush=True)
        return {"returncode": self._proc.wait(), "pid": self._proc.pid, "tail": list(tail)}

    def stop(self) -> None:
        if self._proc is not None:
            _kill_group(self._proc)
