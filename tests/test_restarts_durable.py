"""Restart counts reported by node agents outlive the master: saved in the store (one transaction per
batch of reports), loaded back at a start for the tasks' current attempts only, and a store of the
previous schema gains their table when opened. Real SQLite files in tmp_path throughout."""

import logging
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gosched import Client
from gosched.api.service import SchedulerService, TaskRestarts
from gosched.common.config import QueueConfig, Settings
from gosched.common.job import task_id
from gosched.common.states import JobState, TaskState
from gosched.common.store import SCHEMA_VERSION, RestartRow, Store
from gosched.proto.v1 import types_pb2 as pb
from gosched.runtime.local_control import LocalControl
from gosched.runtime.simulation import sim_nodes
from tests.builders import make_job
from tests.test_agent_gateway import ScriptedAgent, start_master, wait_for

ENDED_AT = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
SAID = "task 0 restarted 2 times by its agent, the latest after OOM killed at 2023-11-14 22:13:20 UTC"


# -- the store ---------------------------------------------------------------------------------------
def begins(store: Store) -> list[str]:
    """Records the transactions `store` opens from now on."""
    seen: list[str] = []
    store._conn.set_trace_callback(lambda sql: seen.append(sql) if sql.startswith("BEGIN") else None)
    return seen


def test_a_batch_of_restart_reports_is_one_transaction_and_outlives_the_store(tmp_path: Path) -> None:
    db = tmp_path / "gs.db"
    with Store(db) as s:
        s.add_jobs([make_job("j").cpu("1").replicas(40).build()])
        rows = [RestartRow("j", i, 0, i + 1, f"exit code {i}", ENDED_AT + i, "n1") for i in range(40)]
        opened = begins(s)
        s.save_restarts(rows)
        assert len(opened) == 1
        s.save_restarts([RestartRow("j", 3, 0, 9, "OOM killed", ENDED_AT + 99, "n2")])  # replaces
    with Store(db) as s:
        loaded = s.load_restarts()
    assert len(loaded) == 40
    assert {r.idx: r for r in loaded}[3] == RestartRow("j", 3, 0, 9, "OOM killed", ENDED_AT + 99, "n2")
    assert loaded[-1].idx == 3  # saved last: the most recent, last (the in-memory cap's order)


def test_a_task_placed_anew_leaves_its_old_attempts_restarts_behind(tmp_path: Path) -> None:
    db = tmp_path / "gs.db"
    with Store(db) as s:
        s.add_jobs([make_job("j").cpu("1").replicas(2).build()])
        s.commit(1, [("j/0", "n1", ()), ("j/1", "n1", ())], [])
        s.save_restarts(
            [RestartRow("j", 0, 0, 2, "exit code 1", ENDED_AT, "n1"), RestartRow("j", 1, 0, 5, "", 0.0, "n1")]
        )
        s.set_task_states([("j/0", TaskState.PENDING)])  # requeued: attempt 1
        assert s.task_attempt("j/0") == 1
        assert [(r.idx, r.restarts) for r in s.load_restarts()] == [(1, 5)]
        # the old attempt's row is gone, not merely hidden
        assert s._conn.execute("SELECT idx FROM task_restarts").fetchall() == [(1,)]
        s.save_restarts([RestartRow("j", 1, 1, 1, "", 0.0, "n1")])  # a late report of a newer attempt
        s.save_restarts([RestartRow("j", 1, 0, 6, "", 0.0, "n1")])  # then the old attempt's: kept out
        assert s._conn.execute("SELECT attempt, restarts FROM task_restarts").fetchall() == [(1, 1)]


# The schema of version 2, as the code before the restart counts created it.
SCHEMA_2 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL) WITHOUT ROWID;
CREATE TABLE jobs (id TEXT PRIMARY KEY, submission_id TEXT UNIQUE, spec BLOB NOT NULL,
    submit_time REAL NOT NULL, state TEXT NOT NULL);
CREATE TABLE tasks (task_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, idx INTEGER NOT NULL,
    state TEXT NOT NULL, node TEXT, gpus TEXT NOT NULL DEFAULT '', attempt INTEGER NOT NULL DEFAULT 0,
    bound_at REAL, updated REAL NOT NULL, reason TEXT NOT NULL DEFAULT '') WITHOUT ROWID;
CREATE INDEX tasks_by_job ON tasks (job_id, idx);
CREATE TABLE nodes (name TEXT PRIMARY KEY, spec BLOB NOT NULL, state TEXT NOT NULL);
INSERT INTO meta VALUES ('schema_version', 2);
INSERT INTO tasks (task_id, job_id, idx, state, node, attempt, updated, reason)
    VALUES ('old/0', 'old', 0, 'running', 'n1', 2, 1, ''), ('old/1', 'old', 1, 'failed', 'n1', 0, 1, 'oom');
"""


def test_a_store_of_schema_version_2_gains_the_restarts_table(tmp_path: Path) -> None:
    db = tmp_path / "gs.db"
    raw = sqlite3.connect(db)
    raw.executescript(SCHEMA_2)
    raw.close()
    with Store(db) as s:
        assert s.schema_version == SCHEMA_VERSION == 6
        assert s.task_attempt("old/0") == 2  # the old rows are kept
        assert s.load_failures() == {"old": "task 1 failed: oom"}
        assert s.load_restarts() == []
        s.save_restarts([RestartRow("old", 0, 2, 4, "exit code 1", ENDED_AT, "n1")])
        assert s.load_retried() == {}  # the failing column (schema version 6) starts unmarked
    with Store(db) as s:  # opened again: migrated once, the row still there
        assert s.schema_version == 6
        assert s.load_restarts() == [RestartRow("old", 0, 2, 4, "exit code 1", ENDED_AT, "n1")]


# -- the service over the same store file --------------------------------------------------------------
@contextmanager
def running_service(db: Path) -> Iterator[SchedulerService]:
    """A SchedulerService on a local control plane over the store at `db`, as a master builds it."""
    settings = Settings(store_path=str(db), shards=1)
    service = SchedulerService(
        lambda: LocalControl(settings, sim_nodes(2), db),
        queues=[QueueConfig(name="default")],
        store_path=db,
    )
    service.start()
    try:
        assert service.wait_ready(30)
        yield service
    finally:
        service.stop()


def bind_all(service: SchedulerService, job_id: str, replicas: int) -> None:
    """Step the control plane until every task of the job is placed."""
    deadline = time.monotonic() + 15
    while True:
        with service.lock:
            service.control.step()
            states = service.get(job_id).tasks
        if all(t.state is TaskState.BOUND for t in states) and len(states) == replicas:
            return
        assert time.monotonic() < deadline, states
        time.sleep(0.02)


Said = tuple[int] | tuple[int, str, float, str]  # count, and how the latest ended, when, where


def report(service: SchedulerService, job_id: str, said: dict[int, Said]) -> None:
    """As the gateway's tick hands over restart reports: with each task's current attempt."""
    with service.lock:
        attempts = service.control.task_attempts([task_id(job_id, i) for i in said])
        service.note_restarts(
            {(tid := task_id(job_id, i)): TaskRestarts(attempts[tid], *what) for i, what in said.items()}
        )


def restarts_of(service: SchedulerService, job_id: str) -> list[int]:
    return [t.restarts for t in service.get(job_id).tasks]


def test_a_restarted_service_shows_the_counts_of_the_current_attempts(tmp_path: Path) -> None:
    db = tmp_path / "gs.db"
    with running_service(db) as service:
        service.submit(make_job("svc").cpu("1").replicas(2).build())
        bind_all(service, "svc", 2)
        report(service, "svc", {0: (1, "exit code 1", ENDED_AT - 30, "sim-00000")})
        report(service, "svc", {0: (2, "OOM killed", ENDED_AT, "sim-00000"), 1: (1,)})
        assert restarts_of(service, "svc") == [2, 1]
    with running_service(db) as service:  # a new master process would do just this
        task = service.get("svc").tasks[0]
        assert (task.restarts, task.last_restart_reason, task.last_restart_time) == (
            2,
            "OOM killed",
            ENDED_AT,
        )
        assert restarts_of(service, "svc") == [2, 1]
        assert f"{SAID} (on sim-00000)" in service.explain("svc")[1]
        with service.lock:
            service.control.lost(["svc/0"])  # placed anew: a new attempt, counted from 0
        assert restarts_of(service, "svc") == [0, 1]
    with running_service(db) as service:  # and the old attempt's count does not come back
        assert restarts_of(service, "svc") == [0, 1]
        bind_all(service, "svc", 2)
        report(service, "svc", {0: (1, "exit code 1", ENDED_AT + 60, "sim-00000")})
    with running_service(db) as service:  # the new attempt's own count does
        assert restarts_of(service, "svc") == [1, 1]


def test_the_counts_loaded_back_are_those_kept_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past RESTARTS_KEPT tasks the jobs noted longest ago are forgotten: after a restart as before."""
    monkeypatch.setattr("gosched.api.service.RESTARTS_KEPT", 2)
    db = tmp_path / "gs.db"
    names = ["a", "b", "c"]
    with running_service(db) as service:
        service.submit_many([make_job(n).cpu("1").build() for n in names])
        for n in names:
            bind_all(service, n, 1)
        for n in names:  # one tick each, in this order
            report(service, n, {0: (3,)})
        before = [restarts_of(service, n) for n in names]
    assert before == [[0], [3], [3]]
    with running_service(db) as service:
        assert [restarts_of(service, n) for n in names] == before
    with Store(db) as s:  # the store keeps every row for as long as the job
        assert [r.job_id for r in s.load_restarts()] == names


def test_a_report_the_store_cannot_take_is_still_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "gs.db"
    with running_service(db) as service, caplog.at_level(logging.ERROR):
        service.submit(make_job("svc").cpu("1").build())
        bind_all(service, "svc", 1)
        with service.lock:
            broken = service._store
            assert broken is not None
            broken.close()  # every write fails from now on (sqlite3.ProgrammingError)
            report(service, "svc", {0: (4,)})  # logged, not raised into the gateway's tick
            assert restarts_of(service, "svc") == [4]
            service._store = None  # closed already
    assert any("saving restart counts failed" in r.getMessage() for r in caplog.records)


# -- a real master restart, through the path the gateway's restart tests use ---------------------------
def test_a_restarted_master_still_shows_a_services_restarts(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    first = start_master(db)
    agent = ScriptedAgent(first.target, "s1")
    agent.keep_beating()
    try:
        with Client(first.target, timeout=10) as client:
            job = client.submit({"id": "svc", "kind": "service", "cpu": "1", "command": "exit 1"})
            tid = agent.launches.get(timeout=10).task_id
            agent.report(tid, pb.TASK_STATE_RUNNING)
            wait_for("running", lambda: client.get(job).state is JobState.RUNNING)
            agent.restarted(tid, 1, 1, "exit code 1", ENDED_AT - 30)
            agent.restarted(tid, 2, 137, "OOM killed", ENDED_AT)
            wait_for("two restarts", lambda: client.get(job).tasks[0].restarts == 2)
    finally:
        agent.close()
        first.stop()
    second = start_master(db)  # the agent is still backing off: its node keeps its tasks meanwhile
    try:
        with Client(second.target, timeout=10) as client:
            task = client.get(job).tasks[0]
            assert (task.state, task.restarts, task.last_restart_reason, task.last_restart_time) == (
                TaskState.RUNNING,
                2,
                "OOM killed",
                ENDED_AT,
            )
            assert f"{SAID} (on s1)" in client.explain(job)
            with second.service.lock:
                second.service.control.lost([tid])  # placed anew: counted from 0
            assert client.get(job).tasks[0].restarts == 0
    finally:
        second.stop()
    third = start_master(db)
    try:
        with Client(third.target, timeout=10) as client:
            assert client.get(job).tasks[0].restarts == 0
    finally:
        third.stop()


def test_counts_the_store_cannot_load_leave_the_scheduler_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Restart counts are for show: a store that cannot give them back (locked past the busy
    timeout, say) must not keep the master from starting."""
    db = tmp_path / "gs.db"
    with running_service(db) as service:
        service.submit(make_job("svc").cpu("1").build())
        bind_all(service, "svc", 1)
        report(service, "svc", {0: (2,)})

    def locked(self: Store, limit: int | None = None) -> list[RestartRow]:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(Store, "load_restarts", locked)
    with caplog.at_level(logging.WARNING), running_service(db) as service:
        assert service.ready
        assert restarts_of(service, "svc") == [0]  # not loaded, and said so
        assert service._store is None
    assert any("restart counts not loaded" in r.getMessage() for r in caplog.records)
