"""Ray scenario workers on a local multi-process Ray cluster (two nodes, one per-module
cluster): an undisturbed reference run, a worker SIGKILLed mid-episode, and a driver killed
mid-run and restarted (a real subprocess). Every Ray process started here is checked to be
gone after the module, also when a test fails."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time

import jax
import psutil
import pytest
import ray
from ray.cluster_utils import Cluster

import jax_drive
from jax_drive.coop.runner import EpisodeResult
from jax_drive.distributed.backends import BackendFailure, JaxBackend
from jax_drive.distributed.episodes import EpisodeSpec, plan_episodes, result_part
from jax_drive.distributed.pool import PoolConfig, ScenarioPool
from jax_drive.distributed.store import ResultStore

# the compilation cache tests/conftest.py sets for this process, shared with the workers
XLA_CACHE = jax.config.jax_compilation_cache_dir
SCENARIO, SEEDS, EPISODES = "tv_red_light", (0, 1, 2), 2
SPECS = plan_episodes([SCENARIO], SEEDS, EPISODES)  # N = 6 full-length episodes
IDS = [s.id for s in SPECS]
BACKEND = JaxBackend(xla_cache_dir=XLA_CACHE, xla_cache_min_compile_s=0.0)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(jax_drive.__file__)))


# the fake backend below is defined here: ship it to the workers by value
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class FaultyBackend:
    """A fast stand-in backend whose episodes fail on purpose, by spec index: 1 raises
    BackendFailure once, 2 raises ValueError always, 3 hangs once, 4 kills its own process
    once, 5 raises BackendFailure always; the others succeed. "Once" is kept in marker files
    so that it survives the worker's restart."""

    name = "faulty"

    def __init__(self, marker_dir):
        self.marker_dir = str(marker_dir)

    def describe(self):
        return {"backend": self.name}

    def make(self):
        return self

    def _first_time(self, spec) -> bool:
        path = os.path.join(self.marker_dir, spec.id)
        if os.path.exists(path):
            return False
        open(path, "w").close()
        return True

    def run(self, specs, progress=None):
        out = []
        for spec in specs:
            if spec.index == 1 and self._first_time(spec):
                raise BackendFailure("server lost")
            if spec.index == 2:
                raise ValueError("a bug in this episode")
            if spec.index == 3 and self._first_time(spec):
                time.sleep(600)
            if spec.index == 4 and self._first_time(spec):
                os._exit(1)
            if spec.index == 5:
                raise BackendFailure("this server never comes back")
            out.append(EpisodeResult(scenario=spec.scenario, accident_prone=spec.accident_prone,
                                     background=spec.background, policy="faulty", outcomes=[],
                                     end_time=float(spec.index), bytes_sent=0, messages_sent=0, metrics={"n": 0}))
        return out

    def close(self):
        pass


def _ping(handle, timeout=120.0) -> dict:
    """A worker's ping, waiting while Ray restarts it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ray.get(handle.ping.remote(), timeout=timeout)
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _wait_gone(pids, timeout=20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if psutil.pid_exists(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    return alive


@pytest.fixture(scope="module")
def cluster():
    """A head and a worker node (2 logical CPUs each) and this process connected to them."""
    worker_pids: list[int] = []
    cl = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    node_pids: list[int] = []
    try:
        cl.add_node(num_cpus=2)
        node_pids = [i.process.pid for n in cl.list_all_nodes() for infos in n.all_processes.values() for i in infos]
        ray.init(address=cl.address, logging_level="WARNING", log_to_driver=False)
        yield {"address": cl.address, "worker_pids": worker_pids}
    finally:
        ray.shutdown()
        cl.shutdown()
        left = _wait_gone(node_pids + worker_pids)
        for pid in left:  # ours: started by this cluster
            os.kill(pid, signal.SIGKILL)
        assert not left, f"Ray processes left running: {left}"


@pytest.fixture(scope="module")
def pool(cluster):
    """Two workers spread over the two nodes, started once for the module."""
    p = ScenarioPool(BACKEND, PoolConfig(num_workers=2, chunk_size=2, max_restarts=2, health_interval_s=1.0))
    try:
        infos = p.start()
        cluster["worker_pids"].extend(i["pid"] for i in infos)
        yield p
    finally:
        p.shutdown()


@pytest.fixture(scope="module")
def reference(pool, tmp_path_factory):
    """Records of an undisturbed run of SPECS, by episode id."""
    store = ResultStore(tmp_path_factory.mktemp("reference"))
    summary = pool.run(SPECS, store, show_progress=False)
    assert summary.complete and summary.worker_deaths == 0 and summary.duplicates == 0
    return {r["episode_id"]: r for r in store.records()}


def test_reference_run_uses_both_nodes(pool, reference):
    assert list(reference) == IDS
    assert len({s.info["node_id"] for s in pool.slots}) == 2  # SPREAD: one worker per node
    assert {r["meta"]["attempt"] for r in reference.values()} == {1}
    outcomes = {o["outcome"] for r in reference.values() for o in r["outcomes"]}
    assert outcomes <= {"success", "collision", "timeout"} and outcomes


def test_sigkill_worker_mid_episode(cluster, pool, reference, tmp_path):
    store = ResultStore(tmp_path / "fault")
    killed: dict = {}

    def kill_one_mid_episode():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            for slot in list(pool.slots):
                try:
                    status = ray.get(slot.handle.status.remote(), timeout=5)
                except Exception:  # noqa: BLE001 - restarting or busy; try the next one
                    continue
                running = status["running"]
                if running and running["decisions"] >= 2:
                    os.kill(status["pid"], signal.SIGKILL)
                    killed.update(pid=status["pid"], worker=status["index"], ids=running["ids"],
                                  decisions=running["decisions"])
                    return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_one_mid_episode, daemon=True)
    killer.start()
    summary = pool.run(SPECS, store, show_progress=False)
    killer.join(timeout=10)
    assert killed, "no worker was caught mid-episode"
    assert summary.complete and not summary.failed
    assert summary.worker_deaths == 1 and summary.retried_chunks >= 1 and summary.recorded == len(IDS)
    # every episode recorded once, each the same as in the undisturbed run
    assert sorted(store.ids()) == sorted(IDS)
    events = store.events()
    recorded = collections.Counter(e["episode"] for e in events if e["event"] == "recorded")
    assert recorded == collections.Counter(IDS)
    for episode_id in IDS:
        assert result_part(store.get(episode_id)) == result_part(reference[episode_id]), episode_id
    # the killed chunk died mid-run and was recorded from its second attempt, by another process
    died = [e for e in events if e["event"] == "worker_died"]
    assert len(died) == 1 and died[0]["episodes"] == killed["ids"]
    for episode_id in killed["ids"]:
        meta = store.get(episode_id)["meta"]
        assert meta["attempt"] == 2 and meta["pid"] != killed["pid"]
    # Ray restarted the killed actor (a new process that knows it is a restart)
    info = _ping(pool.slots[killed["worker"]].handle)
    cluster["worker_pids"].append(info["pid"])
    assert info["pid"] != killed["pid"] and info["restarted"] is True
    assert not psutil.pid_exists(killed["pid"]) or psutil.Process(killed["pid"]).status() == psutil.STATUS_ZOMBIE


def test_failure_paths_retry_restart_or_report(cluster, tmp_path):
    """BackendFailure and a process exit restart the worker and retry; a hung chunk is
    killed at the task timeout and retried; a plain exception fails its episode; an episode
    that always fails is given up after max_attempts. Each success is recorded once."""
    (tmp_path / "markers").mkdir()
    specs = [EpisodeSpec("fake", 0, k, False) for k in range(7)]
    config = PoolConfig(num_workers=2, chunk_size=1, max_restarts=-1, max_attempts=2, task_timeout_s=4.0,
                        health_interval_s=0.5, cpus_per_worker=0.5)
    store = ResultStore(tmp_path / "store")
    with ScenarioPool(FaultyBackend(tmp_path / "markers"), config) as pool:
        cluster["worker_pids"].extend(s.info["pid"] for s in pool.slots)
        summary = pool.run(specs, store, show_progress=False)
        cluster["worker_pids"].extend(_ping(s.handle)["pid"] for s in pool.slots)  # restarted ones too
    ok = ["fake-s0-e0-safe", "fake-s0-e1-safe", "fake-s0-e3-safe", "fake-s0-e4-safe", "fake-s0-e6-safe"]
    assert sorted(store.ids()) == ok
    assert sorted(summary.failed) == ["fake-s0-e2-safe", "fake-s0-e5-safe"]
    assert "ValueError: a bug in this episode" in summary.failed["fake-s0-e2-safe"]
    assert "gave up after 2 attempts" in summary.failed["fake-s0-e5-safe"]
    events = store.events()
    kinds = collections.Counter(e["event"] for e in events)
    assert kinds["recorded"] == len(ok) and kinds["duplicate"] == 0
    assert kinds["backend_failure"] == 3  # e1 once, e5 twice
    assert kinds["worker_unresponsive"] >= 1 and kinds["worker_died"] >= 2  # e3 (killed at the timeout), e4
    assert kinds["episode_error"] == 1 and kinds["gave_up"] == 1
    attempts = {i: store.get(i)["meta"]["attempt"] for i in ok}
    assert attempts == {"fake-s0-e0-safe": 1, "fake-s0-e1-safe": 2, "fake-s0-e3-safe": 2, "fake-s0-e4-safe": 2,
                        "fake-s0-e6-safe": 1}


def test_driver_killed_and_restarted_resumes_without_duplicates(cluster, reference, tmp_path):
    results = tmp_path / "driver"
    cmd = [sys.executable, "-m", "jax_drive.cli", "scale-out", "run", "--scenario", SCENARIO,
           "--seeds", str(len(SEEDS)), "--episodes", str(EPISODES), "--workers", "2", "--chunk-size", "1",
           "--address", cluster["address"], "--results", str(results), "--no-progress",
           *(["--xla-cache", XLA_CACHE] if XLA_CACHE else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and first.poll() is None:
            if (results / "episodes").is_dir() and ResultStore(results).ids():
                break
            time.sleep(0.02)
        assert first.poll() is None, "the first driver ended before it could be killed:\n" + first.stdout.read().decode()
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=30)
        first.stdout.close()
    partial = ResultStore(results).ids()
    assert 1 <= len(partial) < len(IDS)
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"recorded {len(IDS) - len(partial)} (already {len(partial)}) of {len(IDS)}" in second.stdout
    store = ResultStore(results)
    assert sorted(store.ids()) == sorted(IDS)
    events = store.events()
    starts = [e for e in events if e["event"] == "run_start"]
    assert [s["already_recorded"] for s in starts] == [0, len(partial)]
    recorded = collections.Counter(e["episode"] for e in events if e["event"] == "recorded")
    assert recorded == collections.Counter(IDS)  # once each over both drivers
    assert not [e for e in events if e["event"] == "duplicate"]
    for episode_id in IDS:
        record = store.get(episode_id)
        cluster["worker_pids"].append(record["meta"]["pid"])
        assert result_part(record) == result_part(reference[episode_id]), episode_id
