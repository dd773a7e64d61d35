"""On-disk result store: one JSON file per episode id, first write wins, resumable.

Layout of a results directory::

    DIR/plan.json           the run's plan: episode ids in order and a description
                            (backend, policy, ...); a resumed run must match it
    DIR/episodes/<id>.json  one record per episode (see :mod:`jax_drive.distributed.episodes`)
    DIR/journal.jsonl       one line per event: recorded, duplicate, retry, worker_died, ...
                            (a record published by a driver killed before it logged it
                            gets its ``recorded`` event, marked ``recovered``, at the next run)

A record is written to a temporary file in ``episodes/``, flushed and fsynced, then
published with ``os.link`` onto its final name, which fails if the name exists: the first
result of an episode is kept and a second is reported as a duplicate, also when two
drivers race. A reader never sees a partial record (the link is atomic), and a driver
killed mid-write leaves only a temporary file. Temporary files are named after their
writer (host and pid); opening the store removes those of writers on this host that
have exited, and never one whose writer still runs (a ``status`` reader opened during a
live run must not pull a record from under its driver).
"""

from __future__ import annotations

import itertools
import json
import os
import socket
from collections.abc import Iterable

from jax_drive.runinfo import InputError, write_json

TMP_MARK = ".tmp-"


def _tmp_writer(name: str) -> tuple[str, int] | None:
    """(host, pid) of the writer of temporary file ``name``; None for a name of another form."""
    parts = name.split(TMP_MARK, 1)[1].rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def _stale_tmp(name: str, host: str) -> bool:
    """Whether temporary file ``name`` was left by a writer that has exited: one of this
    host whose pid is gone, or one of an unknown form. Files of other hosts are kept
    (their writers cannot be checked from here; readers ignore them anyway)."""
    writer = _tmp_writer(name)
    if writer is None:
        return True
    return writer[0] == host and not _process_alive(writer[1])


class ResultStore:
    """Episode records under ``root`` (created if missing); see the module docstring."""

    def __init__(self, root: str | os.PathLike):
        self.root = os.fspath(root)
        self.episode_dir = os.path.join(self.root, "episodes")
        os.makedirs(self.episode_dir, exist_ok=True)
        self._counter = itertools.count()
        self._host = socket.gethostname().replace("-", "_")
        for name in os.listdir(self.episode_dir):  # leftovers of a driver killed mid-write
            if TMP_MARK in name and _stale_tmp(name, self._host):
                try:
                    os.unlink(os.path.join(self.episode_dir, name))
                except FileNotFoundError:  # another opener removed it first
                    pass

    # ------------------------------------------------------------------------ plan
    @property
    def plan_path(self) -> str:
        return os.path.join(self.root, "plan.json")

    def plan(self, episode_ids: list[str], description: dict) -> bool:
        """Writes the plan of a new run, or checks that a resumed run has the same one.

        Returns True when the plan already existed (a resume). Raises :class:`InputError`
        when the directory holds a different run.
        """
        plan = {"episode_ids": list(episode_ids), "description": description}
        if len(set(plan["episode_ids"])) != len(plan["episode_ids"]):
            raise InputError("duplicate episode ids in the plan")
        if os.path.exists(self.plan_path):
            with open(self.plan_path, encoding="utf-8") as f:
                old = json.load(f)
            if old != json.loads(json.dumps(plan)):
                raise InputError(f"{self.root} holds a different run (plan.json differs); use a new results "
                                 "directory or the same episodes, backend and policy")
            return True
        write_json(self.plan_path, plan)
        return False

    def planned_ids(self) -> list[str]:
        """Episode ids of the plan, in order ([] without a plan)."""
        if not os.path.exists(self.plan_path):
            return []
        with open(self.plan_path, encoding="utf-8") as f:
            return json.load(f)["episode_ids"]

    # --------------------------------------------------------------------- records
    def path(self, episode_id: str) -> str:
        if not episode_id or "/" in episode_id or episode_id.startswith(".") or TMP_MARK in episode_id:
            raise InputError(f"bad episode id {episode_id!r}")
        return os.path.join(self.episode_dir, f"{episode_id}.json")

    def put(self, record: dict) -> bool:
        """Records ``record`` under ``record['episode_id']`` unless that id is already
        recorded. Returns True when written, False for a duplicate (the first is kept)."""
        final = self.path(record["episode_id"])
        if os.path.exists(final):
            return False
        writer = f"{self._host}-{os.getpid()}-{next(self._counter)}"
        tmp = os.path.join(self.episode_dir, f"{record['episode_id']}{TMP_MARK}{writer}")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f, indent=1)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, final)  # atomic create-if-absent
            except FileExistsError:
                return False
            self._fsync_dir()
            return True
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _fsync_dir(self) -> None:
        fd = os.open(self.episode_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def ids(self) -> set[str]:
        """Ids of the recorded episodes."""
        return {n[:-5] for n in os.listdir(self.episode_dir) if n.endswith(".json") and TMP_MARK not in n}

    def get(self, episode_id: str) -> dict:
        with open(self.path(episode_id), encoding="utf-8") as f:
            return json.load(f)

    def records(self, episode_ids: Iterable[str] | None = None) -> list[dict]:
        """Records of ``episode_ids`` (default: the plan's, else all) that are recorded, in that order."""
        done = self.ids()
        order = list(episode_ids) if episode_ids is not None else (self.planned_ids() or sorted(done))
        return [self.get(i) for i in order if i in done]

    # --------------------------------------------------------------------- journal
    @property
    def journal_path(self) -> str:
        return os.path.join(self.root, "journal.jsonl")

    def log(self, event: str, **fields) -> None:
        """Appends one event line to the journal (flushed; one writer: the driver)."""
        with open(self.journal_path, "a+b") as f:
            # A torn last line (a killed writer) must not swallow this event.
            torn = f.tell() > 0 and os.pread(f.fileno(), 1, f.tell() - 1) != b"\n"
            f.write((("\n" if torn else "") + json.dumps({"event": event, **fields}) + "\n").encode())
            f.flush()

    def repair_journal(self) -> list[str]:
        """Logs a ``recorded`` event (marked ``recovered``) for every stored episode the
        journal does not name: a driver killed between publishing a record and logging it
        leaves such an episode. Returns the repaired ids, sorted."""
        logged = {e.get("episode") for e in self.events() if e["event"] == "recorded"}
        missing = sorted(self.ids() - logged)
        for episode_id in missing:
            self.log("recorded", episode=episode_id, recovered=True)
        return missing

    def events(self) -> list[dict]:
        """Journal events in order; a torn last line (a driver killed mid-write) is skipped."""
        if not os.path.exists(self.journal_path):
            return []
        out = []
        with open(self.journal_path, encoding="utf-8") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return out
