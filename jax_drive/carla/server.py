"""CARLA server processes: port allocation, command lines, readiness, process-group
shutdown, a health state machine and a pool that restarts crashed servers.

A CARLA 0.9.x server takes three consecutive ports from ``-carla-rpc-port=N``: N (RPC),
N+1 (streaming), N+2 (secondary); each world also needs a Traffic Manager port of its
own. :func:`allocate_ports` hands out RPC ports ``stride`` (>= 3) apart and TM ports
from a separate base, skipping any port that is taken (probed by binding it).

Each server runs in its own process group (``start_new_session``): CarlaUE4.sh starts the
real binary as a child, so shutdown signals the whole group (SIGTERM, then SIGKILL after
a grace period), which is how no server outlives the pool. Servers crash in long runs
(segfaults after some thousand resets, memory growth per map load), so the pool polls
each: a server whose process exited, or that failed ``max_probe_failures`` probes in a
row (hung), is killed and started again, up to ``max_restarts`` times.

Health states (:class:`Health`; :data:`TRANSITIONS` is the whole machine)::

    STOPPED --start--> STARTING --ready--> READY <--probe_ok-- UNHEALTHY
    STARTING --exited|timeout--> CRASHED   READY --probe_fail--> UNHEALTHY
    READY|UNHEALTHY --exited|hung--> CRASHED --restart--> STARTING
    CRASHED --give_up--> FAILED            any --stop--> STOPPED
"""

from __future__ import annotations

import dataclasses
import enum
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence

from jax_drive.runinfo import InputError

PORTS_PER_SERVER = 3  # RPC, streaming, secondary


class Health(enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    UNHEALTHY = "unhealthy"
    CRASHED = "crashed"
    FAILED = "failed"


H = Health
# each state's events and where they lead, one state a row
_EDGES: dict[Health, dict[str, Health]] = {
    H.STOPPED: {"start": H.STARTING},
    H.STARTING: {"ready": H.READY, "exited": H.CRASHED, "timeout": H.CRASHED},
    H.READY: {"probe_ok": H.READY, "probe_fail": H.UNHEALTHY, "exited": H.CRASHED},
    H.UNHEALTHY: {"probe_ok": H.READY, "probe_fail": H.UNHEALTHY, "exited": H.CRASHED, "hung": H.CRASHED},
    H.CRASHED: {"restart": H.STARTING, "give_up": H.FAILED},
}
TRANSITIONS: dict[tuple[Health, str], Health] = {
    (state, event): after for state, edges in _EDGES.items() for event, after in edges.items()}


def transition(state: Health, event: str) -> Health:
    """The next state; ``stop`` from any state gives STOPPED; anything else not in
    :data:`TRANSITIONS` raises ValueError."""
    if event == "stop":
        return H.STOPPED
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise ValueError(f"no transition from {state.name} on {event!r}") from None


@dataclasses.dataclass
class HealthMonitor:
    """The state of one server with the pool's policy: ``max_probe_failures`` failed
    probes in a row make a hung server; ``max_restarts`` restarts, then FAILED.
    :meth:`on` returns the action the pool must take: None, "restart", "kill" (hung:
    kill, then report ``exited``) or "give_up"."""

    max_probe_failures: int = 3
    max_restarts: int = 10
    state: Health = H.STOPPED
    probe_failures: int = 0
    restarts: int = 0
    history: list = dataclasses.field(default_factory=list)

    def on(self, event: str) -> str | None:
        self.state = transition(self.state, event)
        self.history.append((event, self.state.name))
        if event == "restart":
            self.restarts += 1
        if event == "probe_fail":
            self.probe_failures += 1
            if self.probe_failures >= self.max_probe_failures:
                return "kill"
        elif event in ("probe_ok", "ready", "start", "stop"):
            self.probe_failures = 0
        if self.state is H.CRASHED:
            if self.restarts >= self.max_restarts:
                self.state = transition(self.state, "give_up")
                self.history.append(("give_up", self.state.name))
                return "give_up"
            return "restart"
        return None


# ---------------------------------------------------------------------------- ports
def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when ``port`` can be bound on ``host`` now (TCP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def allocate_ports(n: int, *, base: int = 2000, stride: int = 4, tm_base: int = 8000,
                   is_free: Callable[[int], bool] = port_free, limit: int = 65535) -> list[tuple[int, int]]:
    """(rpc_port, tm_port) for ``n`` servers: RPC ports ``base``, ``base + stride``, ...
    whose three ports are all free, TM ports from ``tm_base`` up, free and outside every
    server's RPC block."""
    if n < 1:
        raise InputError(f"need at least one server, got {n}")
    if stride < PORTS_PER_SERVER:
        raise InputError(f"servers need {PORTS_PER_SERVER} ports each: stride must be >= {PORTS_PER_SERVER}, got {stride}")
    rpc: list[int] = []
    port = base
    while len(rpc) < n:
        if port + PORTS_PER_SERVER - 1 > limit:
            raise InputError(f"no room for {n} servers from port {base}")
        if all(is_free(p) for p in range(port, port + PORTS_PER_SERVER)):
            rpc.append(port)
        port += stride
    taken = {p for r in rpc for p in range(r, r + PORTS_PER_SERVER)}
    tm: list[int] = []
    port = tm_base
    while len(tm) < n:
        if port > limit:
            raise InputError(f"no room for {n} Traffic Manager ports from {tm_base}")
        if port not in taken and is_free(port):
            tm.append(port)
        port += 1
    return list(zip(rpc, tm))


# ----------------------------------------------------------------------- one server
@dataclasses.dataclass(frozen=True)
class ServerSpec:
    """One server: its executable, ports, GPU (None: the default adapter) and rendering
    (``offscreen``: -RenderOffScreen, needs a GPU; ``none``: -nullrhi, no cameras)."""

    index: int
    executable: str
    rpc_port: int
    tm_port: int
    gpu: int | None = 0
    render: str = "offscreen"
    host: str = "127.0.0.1"
    extra_args: tuple[str, ...] = ()

    def command(self) -> list[str]:
        if self.render not in ("offscreen", "none"):
            raise InputError(f"render must be offscreen or none, got {self.render!r}")
        cmd = [self.executable, "-RenderOffScreen" if self.render == "offscreen" else "-nullrhi", "-nosound",
               f"-carla-rpc-port={self.rpc_port}", f"-carla-streaming-port={self.rpc_port + 1}",
               f"-carla-secondary-port={self.rpc_port + 2}"]
        if self.gpu is not None:
            cmd.append(f"-graphicsadapter={self.gpu}")
        return cmd + list(self.extra_args)

    def describe(self) -> dict:
        return {"index": self.index, "host": self.host, "rpc_port": self.rpc_port, "streaming_port": self.rpc_port + 1,
                "secondary_port": self.rpc_port + 2, "tm_port": self.tm_port, "gpu": self.gpu, "render": self.render,
                "command": self.command()}


def server_specs(carla_root: str, n: int, *, base_port: int = 2000, stride: int = 4, tm_base_port: int = 8000,
                 gpus: Sequence[int] = (0,), render: str = "offscreen", executable: str = "CarlaUE4.sh",
                 is_free: Callable[[int], bool] = port_free) -> list[ServerSpec]:
    """Specs of ``n`` servers of the CARLA install at ``carla_root``, GPUs round-robin."""
    path = os.path.join(carla_root, executable)
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise InputError(f"no executable {path} (give --carla-root, the directory holding {executable})")
    gpus = list(gpus) or [None]
    ports = allocate_ports(n, base=base_port, stride=stride, tm_base=tm_base_port, is_free=is_free)
    return [ServerSpec(index=i, executable=path, rpc_port=rpc, tm_port=tm, gpu=gpus[i % len(gpus)], render=render)
            for i, (rpc, tm) in enumerate(ports)]


def tcp_probe(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def carla_probe(host: str, port: int, timeout: float = 5.0) -> bool:
    """True when a CARLA server answers ``get_server_version`` on host:port (a TCP probe
    when the client is not installed)."""
    try:
        import carla
    except ImportError:
        return tcp_probe(host, port, timeout)
    try:
        client = carla.Client(host, port)
        client.set_timeout(timeout)
        client.get_server_version()
        return True
    except RuntimeError:
        return False


class ServerCrashed(RuntimeError):
    """A server exited, or did not become ready in time."""


class CarlaServer:
    """One CARLA server process (its own process group) and its health."""

    def __init__(self, spec: ServerSpec, *, probe: Callable[[str, int], bool] = carla_probe,
                 ready_timeout_s: float = 180.0, poll_s: float = 1.0, max_probe_failures: int = 3,
                 max_restarts: int = 10, log_dir: str | None = None, popen=subprocess.Popen):
        self.spec, self.probe, self.ready_timeout_s, self.poll_s = spec, probe, ready_timeout_s, poll_s
        self.health = HealthMonitor(max_probe_failures=max_probe_failures, max_restarts=max_restarts)
        self.log_dir, self.popen = log_dir, popen
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def launch(self) -> None:
        """Starts the process in a new process group (output to ``log_dir`` if given)."""
        out = subprocess.DEVNULL
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            out = open(os.path.join(self.log_dir, f"carla_{self.spec.index}_{self.spec.rpc_port}.log"), "ab")
        try:
            self.process = self.popen(self.spec.command(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()

    def start(self) -> None:
        self.launch()
        self.health.on("start")

    def wait_ready(self) -> None:
        """Polls until the server answers; raises :class:`ServerCrashed` when it exits or
        ``ready_timeout_s`` passes (the process group is then killed)."""
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if self.process.poll() is not None:
                self.health.on("exited")
                raise ServerCrashed(f"server {self.spec.index} (port {self.spec.rpc_port}) exited with "
                                    f"{self.process.returncode} while starting")
            if self.probe(self.spec.host, self.spec.rpc_port):
                self.health.on("ready")
                return
            if time.monotonic() > deadline:
                self.kill()
                self.health.on("timeout")
                raise ServerCrashed(f"server {self.spec.index} (port {self.spec.rpc_port}) not ready after "
                                    f"{self.ready_timeout_s:.0f} s")
            time.sleep(self.poll_s)

    def check(self) -> str | None:
        """One health check (process alive? answers?); returns the monitor's action."""
        if self.process is None or self.process.poll() is not None:
            return self.health.on("exited")
        action = self.health.on("probe_ok" if self.probe(self.spec.host, self.spec.rpc_port) else "probe_fail")
        if action == "kill":  # hung: kill it, then it has exited
            self.kill()
            return self.health.on("hung")
        return action

    def kill(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the process group, SIGKILL after ``grace_s``; waits for the process."""
        if self.process is None:
            return
        pgid = self.process.pid  # a new session: the group id is the launcher's pid, even after it exited
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while _group_alive(pgid) and time.monotonic() < deadline:
                self.process.poll()  # reap the launcher if it is ours
                time.sleep(0.05)
            if not _group_alive(pgid):
                break
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=5.0)

    def restart(self) -> None:
        """Kills what is left, launches again and waits until ready (CRASHED -> STARTING)."""
        self.kill()
        self.health.on("restart")
        self.launch()
        self.wait_ready()

    def recover(self) -> bool:
        """After a crash: restarts until ready (True) or the restart budget is spent (False)."""
        while self.health.state is H.CRASHED:
            try:
                self.restart()
                return True
            except ServerCrashed:
                continue
        return False

    def stop(self) -> None:
        self.kill()
        self.health.on("stop")


def _group_alive(pgid: int) -> bool:
    """True while a process of group ``pgid`` other than an unreaped zombie exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # signal 0 also reaches zombies: look closer where /proc allows
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[2]) == pgid and fields[0] != "Z":
                    return True
        return False
    except OSError:
        return True


class ServerPool:
    """Several :class:`CarlaServer` s: start all, supervise (restart crashed or hung ones),
    shut all down. Extra keyword arguments go to each :class:`CarlaServer`."""

    def __init__(self, specs: Sequence[ServerSpec], **server_kwargs):
        if not specs:
            raise InputError("need at least one server")
        self.servers = [CarlaServer(spec, **server_kwargs) for spec in specs]

    def start(self) -> None:
        """Launches every server, then waits for each to be ready (a failed start is
        retried within its restart budget; ServerCrashed when that is spent)."""
        for server in self.servers:
            server.start()
        for server in self.servers:
            try:
                server.wait_ready()
            except ServerCrashed:
                if not server.recover():
                    raise ServerCrashed(f"server {server.spec.index} did not start "
                                        f"({server.health.restarts} restarts)") from None

    def check_once(self) -> list[dict]:
        """One health round; restarts crashed or hung servers. Returns the events:
        {index, action, state, restarts} for every server that needed an action."""
        events = []
        for server in self.servers:
            if server.health.state in (H.FAILED, H.STOPPED):
                continue
            action = server.check()
            if action is None:
                continue
            if action == "restart" and not server.recover():
                action = "give_up"
            events.append({"index": server.spec.index, "action": action, "state": server.health.state.name,
                           "restarts": server.health.restarts})
        return events

    def supervise(self, report: Callable[[str], None] = print, interval_s: float = 5.0,
                  should_stop: Callable[[], bool] = lambda: False) -> None:
        """Health rounds every ``interval_s`` until ``should_stop()`` (or Ctrl-C)."""
        while not should_stop():
            for event in self.check_once():
                report(f"server {event['index']}: {event['action']} -> {event['state']} "
                       f"(restarts {event['restarts']})")
            if all(s.health.state is H.FAILED for s in self.servers):
                raise ServerCrashed("every server has failed (restarts spent)")
            time.sleep(interval_s)

    def table(self) -> list[str]:
        return [f"server {s.spec.index} {s.health.state.name:9s} rpc={s.spec.rpc_port} (streaming "
                f"{s.spec.rpc_port + 1}, secondary {s.spec.rpc_port + 2}) tm={s.spec.tm_port} gpu={s.spec.gpu} "
                f"pid={s.pid}" for s in self.servers]

    def describe(self) -> list[dict]:
        return [{**s.spec.describe(), "state": s.health.state.name, "pid": s.pid, "restarts": s.health.restarts}
                for s in self.servers]

    def endpoints(self) -> list[tuple[str, int, int]]:
        """(host, rpc_port, tm_port) per server: one ``CarlaBackend`` each for the Ray pool."""
        return [(s.spec.host, s.spec.rpc_port, s.spec.tm_port) for s in self.servers]

    def detach(self) -> None:
        """Forgets the processes (they keep running; :meth:`shutdown` then does nothing)."""
        for server in self.servers:
            server.process = None
        self.servers = []

    def shutdown(self) -> None:
        for server in self.servers:
            server.stop()
