"""The CARLA server-pool launcher without CARLA: command lines, port allocation, the health
state machine, and real processes of a stand-in server (tests/fake_carla_server.py, run as
CarlaUE4.sh): readiness polling, restart after a crash and after a hang, process-group
shutdown (the server's own child dies too), giving up after the restart budget."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import sys
import time

import psutil
import pytest

from jax_drive.carla.server import (
    TRANSITIONS,
    Health,
    HealthMonitor,
    ServerCrashed,
    ServerPool,
    ServerSpec,
    allocate_ports,
    port_free,
    server_specs,
    tcp_probe,
    transition,
)
from jax_drive.cli import main as cli_main
from jax_drive.runinfo import InputError

HERE = os.path.dirname(os.path.abspath(__file__))
# The stand-in servers' ports lie below Linux's ephemeral range (32768-60999): a port the
# kernel hands to another test's bind(0) (a server in the other xdist worker) between our
# free-port check and the readiness probe made the ready-timeout test see a "ready" server.


def test_command_line_uses_three_ports_and_the_gpu():
    spec = ServerSpec(index=0, executable="/opt/carla/CarlaUE4.sh", rpc_port=2000, tm_port=8000, gpu=1)
    assert spec.command() == ["/opt/carla/CarlaUE4.sh", "-RenderOffScreen", "-nosound", "-carla-rpc-port=2000",
                              "-carla-streaming-port=2001", "-carla-secondary-port=2002", "-graphicsadapter=1"]
    none = ServerSpec(index=1, executable="x", rpc_port=2004, tm_port=8001, gpu=None, render="none")
    assert none.command()[1] == "-nullrhi" and not any(a.startswith("-graphicsadapter") for a in none.command())
    with pytest.raises(InputError):
        ServerSpec(index=0, executable="x", rpc_port=1, tm_port=2, render="vulkan").command()


def test_allocate_ports_spacing_busy_ports_and_tm_ports():
    busy = {2005, 8001}
    ports = allocate_ports(3, base=2000, stride=4, tm_base=8000, is_free=lambda p: p not in busy)
    assert ports == [(2000, 8000), (2008, 8002), (2012, 8003)]  # 2004's block holds 2005; 8001 taken
    rpc = [r for r, _ in ports]
    assert all(b - a >= 3 for a, b in zip(rpc, rpc[1:]))
    # TM ports never land inside an RPC block
    overlap = allocate_ports(2, base=2000, stride=3, tm_base=2001, is_free=lambda p: True)
    assert overlap == [(2000, 2006), (2003, 2007)]
    with pytest.raises(InputError, match="stride"):
        allocate_ports(2, stride=2)
    with pytest.raises(InputError):
        allocate_ports(0)
    with pytest.raises(InputError, match="no room"):
        allocate_ports(2, base=65530, stride=4, is_free=lambda p: True)


def test_port_free_sees_a_bound_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert not port_free(port)
        assert tcp_probe("127.0.0.1", port)
    assert port_free(port)


def test_health_transitions():
    assert transition(Health.STOPPED, "start") is Health.STARTING
    assert transition(Health.READY, "probe_fail") is Health.UNHEALTHY
    assert transition(Health.UNHEALTHY, "probe_ok") is Health.READY
    assert transition(Health.CRASHED, "restart") is Health.STARTING
    assert all(transition(s, "stop") is Health.STOPPED for s in Health)
    with pytest.raises(ValueError):
        transition(Health.STOPPED, "ready")
    with pytest.raises(ValueError):
        transition(Health.FAILED, "restart")
    # every non-terminal state has a way out, and FAILED is only reached by giving up
    assert {s for s, _ in TRANSITIONS} == set(Health) - {Health.FAILED}
    assert [e for (s, e), t in TRANSITIONS.items() if t is Health.FAILED] == ["give_up"]


def test_health_monitor_policy():
    m = HealthMonitor(max_probe_failures=3, max_restarts=1)
    assert m.on("start") is None and m.on("ready") is None
    assert m.on("probe_fail") is None and m.on("probe_ok") is None  # one miss is forgiven
    assert [m.on("probe_fail") for _ in range(3)] == [None, None, "kill"]
    assert m.on("hung") == "restart" and m.state is Health.CRASHED
    assert m.on("restart") is None and m.restarts == 1 and m.state is Health.STARTING
    assert m.on("exited") == "give_up" and m.state is Health.FAILED


@pytest.fixture
def carla_root(tmp_path, monkeypatch):
    """A CARLA 'install' whose CarlaUE4.sh starts the stand-in server."""
    root = tmp_path / "carla"
    root.mkdir()
    script = root / "CarlaUE4.sh"
    script.write_text(f"#!/bin/sh\n\"{sys.executable}\" \"{HERE}/fake_carla_server.py\" \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    control = tmp_path / "control"
    control.mkdir()
    monkeypatch.setenv("FAKE_CARLA_DIR", str(control))
    return root, control


def _pids(control, port) -> set[int]:
    return {int(p) for name in os.listdir(control) if name.startswith(f"pids_{port}_")
            for p in (control / name).read_text().split()}


def _gone(pids, timeout=10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.05)
    return False


def test_pool_starts_restarts_and_shuts_down_process_groups(carla_root):
    root, control = carla_root
    specs = server_specs(str(root), 2, base_port=23100, stride=4, tm_base_port=23900, gpus=[0, 1])
    pool = ServerPool(specs, probe=tcp_probe, ready_timeout_s=30, poll_s=0.05, max_probe_failures=2, max_restarts=3)
    all_pids: set[int] = set()
    try:
        pool.start()
        assert [s.health.state for s in pool.servers] == [Health.READY, Health.READY]
        assert (control / f"args_{specs[1].rpc_port}").read_text().split("\n") == specs[1].command()[1:]
        assert pool.endpoints() == [("127.0.0.1", s.rpc_port, s.tm_port) for s in specs]
        assert "READY" in pool.table()[0] and f"rpc={specs[0].rpc_port}" in pool.table()[0]
        assert pool.check_once() == []
        first = _pids(control, specs[0].rpc_port)
        assert len(first) == 2  # the server and its child
        all_pids |= first
        # a crash: detected on the next round, restarted in a new process group
        (control / f"crash_{specs[0].rpc_port}").touch()
        time.sleep(0.5)
        events = pool.check_once()
        assert events == [{"index": 0, "action": "restart", "state": "READY", "restarts": 1}]
        assert _gone(first)  # the old child went with its group
        all_pids |= _pids(control, specs[0].rpc_port)
        # a hang: alive but not answering; killed after two failed probes, then restarted
        hang = control / f"hang_{specs[1].rpc_port}"
        hang.touch()
        time.sleep(0.3)
        hang.unlink()  # the hung process stays hung; its restarted successor will answer
        before = _pids(control, specs[1].rpc_port)
        assert pool.check_once() == []  # one failed probe: unhealthy, not yet hung
        assert pool.servers[1].health.state is Health.UNHEALTHY
        events = pool.check_once()  # the second: hung, killed, restarted
        assert events == [{"index": 1, "action": "restart", "state": "READY", "restarts": 1}]
        assert _gone(before)
        all_pids |= _pids(control, specs[1].rpc_port)
    finally:
        pool.shutdown()
    assert [s.health.state for s in pool.servers] == [Health.STOPPED, Health.STOPPED]
    assert _gone(all_pids), "a server or its child outlived the pool"


@contextlib.contextmanager
def _one_server_pool(root, ports: tuple[int, int], ready_timeout_s: float, max_restarts: int):
    """A one-server pool (RPC and Traffic Manager base ports), always shut down."""
    specs = server_specs(str(root), 1, base_port=ports[0], tm_base_port=ports[1])
    pool = ServerPool(specs, probe=tcp_probe, ready_timeout_s=ready_timeout_s, poll_s=0.05, max_restarts=max_restarts)
    try:
        yield pool
    finally:
        pool.shutdown()


def test_pool_gives_up_after_the_restart_budget(carla_root, monkeypatch):
    root, control = carla_root
    monkeypatch.setenv("FAKE_FAIL_START", "1")
    with _one_server_pool(root, (23200, 23950), ready_timeout_s=10, max_restarts=2) as pool:
        with pytest.raises(ServerCrashed, match="did not start"):
            pool.start()
        assert pool.servers[0].health.state is Health.FAILED and pool.servers[0].health.restarts == 2


def test_ready_timeout_kills_the_group(carla_root, monkeypatch):
    root, control = carla_root
    monkeypatch.setenv("FAKE_READY_AFTER", "60")
    with _one_server_pool(root, (23300, 23960), ready_timeout_s=1.0, max_restarts=0) as pool:
        with pytest.raises(ServerCrashed):
            pool.start()
        assert _gone(_pids(control, pool.servers[0].spec.rpc_port))


def test_cli_carla_pool_once_and_bad_input(carla_root, tmp_path, capsys):
    root, control = carla_root
    assert cli_main(["scale-out", "carla-pool", "--carla-root", str(tmp_path / "nowhere")]) == 2
    assert cli_main(["scale-out", "carla-pool", "--carla-root", str(root), "--port-stride", "2"]) == 2
    assert cli_main(["scale-out", "carla-pool", "--carla-root", str(root), "--gpus", "a"]) == 2
    capsys.readouterr()
    out_json = tmp_path / "pool.json"
    code = cli_main(["scale-out", "carla-pool", "--carla-root", str(root), "--servers", "2", "--base-port", "23400",
                     "--tm-base-port", "23970", "--render", "none", "--probe", "tcp", "--ready-timeout", "20",
                     "--max-restarts", "0", "--once", "--json", str(out_json)])
    pids = _pids(control, 23400) | _pids(control, 23404)
    try:
        assert code == 0
        out = capsys.readouterr().out
        assert "server 0 READY" in out and "rpc=23400" in out and "tm=23970" in out and "server 1 READY" in out
        import json

        servers = json.loads(out_json.read_text())["servers"]
        assert [s["rpc_port"] for s in servers] == [23400, 23404] and servers[0]["command"][1] == "-nullrhi"
        assert all(psutil.pid_exists(p) for p in pids)  # --once leaves them running
    finally:
        for p in pids:  # ours: started by this test
            try:
                os.killpg(os.getpgid(p), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert _gone(pids)
