"""jax_drive.distributed without Ray: episode specs and ids, chunking, the result store
(first write wins, atomic publication, resume checks, the journal), records, the JAX
runner against the in-process evaluation of the same seeds, and the `scale-out` CLI's
input checks and status report."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from jax_drive.cli import main as cli_main
from jax_drive.coop import evaluate
from jax_drive.coop.baselines import RuleBasedPolicy
from jax_drive.distributed.backends import JaxBackend
from jax_drive.distributed.episodes import (
    EpisodeSpec,
    chunk_specs,
    episode_record,
    plan_episodes,
    result_of,
    result_part,
    summarise_records,
)
from jax_drive.distributed.store import TMP_MARK, ResultStore
from jax_drive.distributed.worker import ScenarioWorker
from jax_drive.runinfo import InputError


def test_plan_matches_evaluate_keys_and_flags():
    specs = plan_episodes(["tv_red_light", "ic_straight_left"], [3, 4], 3, config="alternate")
    assert len(specs) == 12 and len({s.id for s in specs}) == 12
    s = specs[4]  # tv_red_light, seed 4, episode 1
    assert (s.scenario, s.seed, s.index, s.accident_prone) == ("tv_red_light", 4, 1, False)
    assert s.id == "tv_red_light-s4-e1-safe"
    want = jax.random.fold_in(jax.random.key(4), 1)
    assert np.array_equal(jax.random.key_data(s.key()), jax.random.key_data(want))
    assert [x.accident_prone for x in specs[:3]] == evaluate.episode_flags("alternate", 3)
    assert EpisodeSpec("tv_left_turn", 0, 2, True, True, 12.5).id == "tv_left_turn-s0-e2-ap-bg-t12.5"
    assert EpisodeSpec.from_json(s.to_json()) == s


@pytest.mark.parametrize("call", [
    lambda: plan_episodes(["no_such"], [0], 1),
    lambda: plan_episodes(["tv_red_light"], [0], 0),
    lambda: plan_episodes(["tv_red_light"], [0], 2, config="sometimes"),
    lambda: plan_episodes(["tv_red_light"], [], 2),
    lambda: EpisodeSpec("Bad/Name", 0, 0, True),
    lambda: EpisodeSpec("tv_red_light", -1, 0, True),
    lambda: EpisodeSpec("tv_red_light", 0, 0, True, max_time=0.0),
    lambda: chunk_specs([], 0),
])
def test_bad_plans_raise_input_error(call):
    with pytest.raises(InputError):
        call()


def test_chunks_share_background_and_time_cap():
    specs = plan_episodes(["tv_red_light"], [0], 5) + plan_episodes(["tv_red_light"], [0], 3, background=True)
    chunks = chunk_specs(specs, 2)
    assert [len(c) for c in chunks] == [2, 2, 1, 2, 1]
    assert all(len({s.group for s in c}) == 1 for c in chunks)
    assert [s for c in chunks for s in c] == specs  # order kept within each group


def _record(episode_id="tv_red_light-s0-e0-ap", value=1.0):
    return {"episode_id": episode_id, "value": value}


def test_store_first_write_wins_and_resume(tmp_path):
    store = ResultStore(tmp_path)
    assert store.plan(["a", "b"], {"backend": "jax"}) is False
    assert store.put(_record("a", 1.0)) is True
    assert store.put(_record("a", 2.0)) is False  # a second result of the same episode is not recorded
    assert store.get("a")["value"] == 1.0 and store.ids() == {"a"}
    assert not [n for n in os.listdir(tmp_path / "episodes") if TMP_MARK in n]
    # a driver killed mid-write leaves a temporary file: ignored, and removed on reopening;
    # the file of a writer that still runs (here: this process) is kept, so that a reader
    # opening the store during a live run cannot pull a record from under its driver
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(gone.stdout)
    host = socket.gethostname().replace("-", "_")
    partial = '{"episode_id": "b", "val'
    (tmp_path / "episodes" / f"b{TMP_MARK}{host}-{dead_pid}-0").write_text(partial)
    (tmp_path / "episodes" / f"b{TMP_MARK}123-0").write_text(partial)  # an older name form
    live = tmp_path / "episodes" / f"b{TMP_MARK}{host}-{os.getpid()}-7"
    live.write_text(partial)
    other_host = tmp_path / "episodes" / f"b{TMP_MARK}elsewhere-{dead_pid}-0"
    other_host.write_text(partial)
    assert ResultStore(tmp_path).ids() == {"a"}
    assert sorted(n for n in os.listdir(tmp_path / "episodes") if TMP_MARK in n) == sorted([live.name, other_host.name])
    live.unlink()
    other_host.unlink()
    reopened = ResultStore(tmp_path)
    assert reopened.plan(["a", "b"], {"backend": "jax"}) is True  # resume
    assert reopened.records() == [store.get("a")]  # plan order, recorded only
    with pytest.raises(InputError, match="different run"):
        reopened.plan(["a", "c"], {"backend": "jax"})
    with pytest.raises(InputError, match="different run"):
        reopened.plan(["a", "b"], {"backend": "carla"})
    with pytest.raises(InputError, match="duplicate"):
        ResultStore(tmp_path / "other").plan(["a", "a"], {})
    for bad in ("", "../x", "x/y", ".hidden", f"a{TMP_MARK}1"):
        with pytest.raises(InputError):
            store.path(bad)


def test_store_put_loses_a_race_without_overwriting(tmp_path, monkeypatch):
    """Two writers of one id: the one that links second gets False and the file keeps the first."""
    store = ResultStore(tmp_path)
    real_exists = os.path.exists
    final = store.path("a")
    # the second writer's existence check passes (the first has not published yet) ...
    monkeypatch.setattr(os.path, "exists", lambda p: False if p == final else real_exists(p))
    assert store.put(_record("a", 1.0)) is True
    assert store.put(_record("a", 2.0)) is False  # ... and its link onto the taken name fails
    monkeypatch.undo()
    assert store.get("a")["value"] == 1.0


def test_journal_skips_a_torn_last_line(tmp_path):
    store = ResultStore(tmp_path)
    store.log("recorded", episode="a")
    with open(store.journal_path, "a") as f:
        f.write('{"event": "recor')
    assert store.events() == [{"event": "recorded", "episode": "a"}]
    store.log("run_start", planned=2)  # the next writer's event survives the torn line
    assert store.events() == [{"event": "recorded", "episode": "a"}, {"event": "run_start", "planned": 2}]


def test_repair_journal_logs_records_a_killed_driver_published_but_did_not_log(tmp_path):
    store = ResultStore(tmp_path)
    for name in ("a", "b", "c"):
        assert store.put(_record(name, 1.0))
    store.log("recorded", episode="a")  # b and c: killed between put and log
    assert store.repair_journal() == ["b", "c"]
    assert store.repair_journal() == []  # idempotent
    recorded = [e for e in store.events() if e["event"] == "recorded"]
    assert [(e["episode"], e.get("recovered", False)) for e in recorded] == [("a", False), ("b", True), ("c", True)]


@pytest.fixture(scope="module")
def evaluated():
    """The in-process evaluation of two seeds x two episodes of tv_red_light (rule-based)."""
    return evaluate.evaluate("tv_red_light", RuleBasedPolicy(), seeds=(0, 1), episodes=2)


def test_worker_records_equal_in_process_evaluation(evaluated):
    """The JAX runner in a worker, with chunks that mix seeds, gives every episode exactly
    the result of `evaluate` for the same seeds; the aggregate metrics agree too."""
    specs = plan_episodes(["tv_red_light"], (0, 1), 2)
    worker = ScenarioWorker(JaxBackend(), worker_index=0)
    chunks = [(specs[0], specs[3]), (specs[2], specs[1])]
    records = {r["episode_id"]: r for c in chunks for r in worker.run(c)}
    assert worker.ping()["episodes_done"] == 4 and worker.status()["running"] is None
    for spec, expected in zip(specs, evaluated["results"]):
        got = result_of(records[spec.id])
        assert got.accident_prone == expected.accident_prone
        assert got.end_time == pytest.approx(expected.end_time, abs=1e-9)
        assert got.metrics == expected.metrics
        assert [(o.vehicle_id, o.outcome, o.time) for o in got.outcomes] == [
            (o.vehicle_id, o.outcome, o.time) for o in expected.outcomes]
        assert [o.progress for o in got.outcomes] == pytest.approx([o.progress for o in expected.outcomes], abs=1e-6)
        assert got.messages_sent == expected.messages_sent and got.bytes_sent == expected.bytes_sent
    (report,) = summarise_records(records[s.id] for s in specs)
    assert report["aggregate"] == evaluate.jsonable(evaluated["aggregate"])
    assert report["per_seed"] == evaluate.jsonable(evaluated["per_seed"])


def test_record_round_trip_is_json(evaluated):
    spec = plan_episodes(["tv_red_light"], (0,), 1)[0]
    result = evaluated["results"][0]
    record = json.loads(json.dumps(episode_record(spec, result, {"pid": 1})))
    back = result_of(record)
    assert back.outcomes == result.outcomes and back.metrics == result.metrics
    assert back.message_log == [tuple(m) for m in record["message_log"]]
    assert len(back.message_log) == len(result.message_log) and back.message_log[0][2] == result.message_log[0][2]
    assert "meta" not in result_part(record) and result_part(record)["episode_id"] == spec.id


@pytest.mark.parametrize("argv", [
    ["--scenario", "no_such"],
    ["--scenario", "tv_red_light", "--episodes", "0"],
    ["--scenario", "tv_red_light", "--seeds", "0"],
    ["--scenario", "tv_red_light", "--backend", "carla"],
    ["--scenario", "tv_red_light", "--backend", "carla", "--carla", "localhost:2000"],
    ["--scenario", "tv_red_light", "--carla", "localhost:2000:8000"],
])
def test_cli_run_rejects_bad_input_before_starting_ray(argv, tmp_path, capsys):
    try:
        code = cli_main(["scale-out", "run", "--results", str(tmp_path / "r"), *argv])
    except SystemExit as stop:  # argparse's own refusals (a scenario it does not list)
        code = stop.code
    assert code == 2
    assert "error:" in capsys.readouterr().err
    import ray

    assert not ray.is_initialized()


def test_cli_status_reports_progress_and_metrics(evaluated, tmp_path, capsys):
    specs = plan_episodes(["tv_red_light"], (0, 1), 2)
    store = ResultStore(tmp_path)
    store.plan([s.id for s in specs], {"backend": "jax"})
    for spec, result in list(zip(specs, evaluated["results"]))[:3]:
        store.put(episode_record(spec, result))
    out_json = tmp_path / "status.json"
    assert cli_main(["scale-out", "status", "--results", str(tmp_path), "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "3 of 4 planned episodes recorded" in out and "tv_red_light [rule_based]" in out
    data = json.loads(out_json.read_text())
    assert data["recorded"] == 3 and data["reports"][0]["episodes"] == 3 and "meta" in data
    assert cli_main(["scale-out", "status", "--results", str(tmp_path / "missing")]) == 2
