"""Store.purge_finished: a finished job leaves the store (its spec and every task row; its job row
stays as a tombstone, its ids taken for good) once it is older than the cut-off and not among the
newest kept; nothing unfinished ever goes (real SQLite in tmp_path)."""

import sqlite3
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gosched import Client
from gosched.api.errors import AlreadyExists
from gosched.api.store_purge import StorePurger
from gosched.common.errors import AlreadyStored
from gosched.common.states import TERMINAL, JobState, TaskState
from gosched.common.store import RestartRow, Store
from tests.builders import make_job
from tests.store_helpers import T0, finished_jobs, master, stop_in_transaction


def _rows(db: Path, table: str, column: str) -> set[str]:
    with sqlite3.connect(db) as raw:
        return {str(v) for (v,) in raw.execute(f"SELECT {column} FROM {table}")}


def _live_jobs(db: Path) -> set[str]:
    """The ids of the jobs stored and not purged (a purged job's row is a tombstone)."""
    return _rows(db, "jobs WHERE state != 'purged'", "id")


def test_old_finished_jobs_go_with_every_row_and_the_rest_stay(tmp_path: Path) -> None:
    db = tmp_path / "gs.db"
    with Store(db) as s:
        # "a"'s neighbours in key order ("a-b/0" < "a.b/0" < "a/0" < "a0/0" < "a_b/0"): only a's rows go
        ids = ["a", "a-b", "a.b", "a0", "a_b", "old-running", "recent", "failing", "newest"]
        jobs = [make_job(j).cpu("1").replicas(2).build() for j in ids]
        jobs[0] = replace(jobs[0], submission_id="req-a")
        s.add_jobs(jobs, now=T0)
        ended = ["a", "recent", "failing", "newest"]
        s.set_task_states([(f"{j}/{i}", TaskState.CANCELLED) for j in ended for i in (0, 1)], now=T0)
        s.set_task_states([("recent/1", TaskState.CANCELLED)], now=T0 + 50)  # its last change: late
        s.set_task_states([("newest/0", TaskState.CANCELLED)], now=T0 + 90)
        s.set_task_states([], failing=["failing/0"], now=T0)  # being run again: not finished
        s.commit(1, [("old-running/0", "n1", ())], [("old-running/1", TaskState.CANCELLED)], now=T0)
        s.save_restarts([RestartRow("a", 0, 0, 2, "exit code 1", T0, "n1")], now=T0)
        s.set_task_states([], retry_at={"a": T0 + 5})
        # "newest" finished last and is kept (keep=1) however old; "recent" ended after the cut-off
        assert s.purge_finished(before=T0 + 10, keep=1) == 1
        assert s.get_job("a") is None and s.is_purged("a") and not s.is_purged("recent")
        assert s.task_state("a/0") is None
        assert {j.id for j, _ in s.load_jobs()} == set(ids) - {"a"}
        # its ids stay taken: a task id is all an agent, the logs and the restart counts know
        with pytest.raises(AlreadyStored, match="job a finished and was purged from the store"):
            s.add_jobs([make_job("a").cpu("1").build()])
        with pytest.raises(AlreadyStored, match="by job a, which finished and was purged"):
            s.add_jobs([replace(make_job("b").cpu("1").build(), submission_id="req-a")])
    assert "a" not in _rows(db, "task_restarts", "job_id") | _rows(db, "backoffs", "job_id")
    assert _rows(db, "tasks", "task_id") == {f"{j}/{i}" for j in ids if j != "a" for i in (0, 1)}
    with sqlite3.connect(db) as raw:  # a's row: a tombstone of its ids alone
        row = raw.execute("SELECT submission_id, length(spec), state FROM jobs WHERE id = 'a'").fetchall()
    assert row == [("req-a", 0, "purged")]
    with Store(db) as s:
        assert s.purge_finished(before=T0 + 100, keep=0) == 2  # recent and newest; failing stays
        assert {j.id for j, _ in s.load_jobs()} == set(ids) - {"a", "recent", "newest"}
        assert s.purge_finished(before=T0 + 100, keep=0) == 0  # a tombstone is not purged again


def _finished_jobs(s: Store, shape: list[int]) -> None:
    """Jobs j0, j1, ... of these many tasks each, all cancelled at T0."""
    finished_jobs(s, {f"j{k}": n for k, n in enumerate(shape)})


def _transactions(s: Store) -> list[str]:
    """The purge's write transactions as SQLite runs them, from its connection's trace."""
    begun: list[str] = []
    s._conn.set_trace_callback(lambda sql: begun.append(sql) if sql.startswith("BEGIN") else None)
    return begun


def test_a_purge_writes_in_transactions_of_about_its_rows_and_a_big_job_in_several(tmp_path: Path) -> None:
    with Store(tmp_path / "gs.db") as s:
        _finished_jobs(s, [1] * 7 + [10])  # seven of one task, then one of ten
        begun = _transactions(s)
        assert s.purge_finished(before=T0 + 1, keep=0, rows=3) == 8
        # j7 finished last (the newest first, then by id: j7 ties the others at T0 and sorts last)
        # [j7: 10 rows > 3: a tombstone, then 3 + 3 + 3 + 1], [j6 j5 j4], [j3 j2 j1], [j0]
        assert len(begun) == 1 + 4 + 3
        assert s.load_jobs() == []
    assert _rows(tmp_path / "gs.db", "tasks", "task_id") == set()


def test_a_big_jobs_rows_left_by_a_crash_are_taken_by_the_next_purge(tmp_path: Path) -> None:
    db = tmp_path / "gs.db"
    with Store(db) as s:
        _finished_jobs(s, [5])
        stop = stop_in_transaction(s, 2)
        assert s.purge_finished(before=T0 + 1, keep=0, rows=2, stop=stop) == 1  # stopped midway
        assert s.is_purged("j0") and 0 < len(_rows(db, "tasks", "task_id")) < 5
        assert s.load_jobs() == []  # ended rows of no job: nothing a restart reads
        assert s.purge_finished(before=T0 + 1, keep=0, rows=2) == 0  # a tombstone, not counted again
    assert _rows(db, "tasks", "task_id") == set()


def test_a_set_stop_purges_nothing_more(tmp_path: Path) -> None:
    with Store(tmp_path / "gs.db") as s:
        _finished_jobs(s, [1, 1])
        stop = threading.Event()
        stop.set()
        assert s.purge_finished(before=T0 + 1, keep=0, stop=stop) == 0
        assert len(s.load_jobs()) == 2


# Per task: its state, whether it is marked failing, and its last change (seconds after T0).
_TASK = st.tuples(st.sampled_from(list(TaskState)), st.booleans(), st.integers(0, 9))


@settings(max_examples=60, deadline=None)
@given(
    jobs=st.lists(st.lists(_TASK, min_size=1, max_size=3), min_size=1, max_size=8),
    cut=st.integers(0, 10),
    keep=st.integers(0, 4),
)
def test_a_purge_deletes_exactly_the_old_finished_jobs_past_the_newest_kept(
    tmp_path_factory: object, jobs: list[list[tuple[TaskState, bool, int]]], cut: int, keep: int
) -> None:
    """Against a model: finished (all tasks terminal, none failing), the newest `keep` of those by
    their last change spared, the rest purged if that change came before the cut-off."""
    db = tmp_path_factory.mktemp("purge") / "gs.db"  # type: ignore[attr-defined]
    with Store(db) as s:
        s.add_jobs([make_job(f"j{n}").cpu("1").replicas(len(tasks)).build() for n, tasks in enumerate(jobs)])
        with sqlite3.connect(db) as raw:  # any row the store could hold, written straight
            raw.executemany(
                "UPDATE tasks SET state = ?, failing = ?, updated = ? WHERE task_id = ?",
                [
                    (state.value, 0 if failing else -1, T0 + at, f"j{n}/{i}")
                    for n, tasks in enumerate(jobs)
                    for i, (state, failing, at) in enumerate(tasks)
                ],
            )
        finished = sorted(
            (
                (max(at for _, _, at in tasks), f"j{n}")
                for n, tasks in enumerate(jobs)
                if all(state in TERMINAL and not failing for state, failing, _ in tasks)
            ),
            reverse=True,
        )
        expected = {jid for done, jid in finished[keep:] if done < cut}
        assert s.purge_finished(before=T0 + cut, keep=keep) == len(expected)
        assert {j.id for j, _ in s.load_jobs()} == {f"j{n}" for n in range(len(jobs))} - expected


def test_the_master_purges_a_cancelled_job_of_its_store_and_keeps_serving(tmp_path: Path) -> None:
    """Through a running master (local runtime, real gRPC): a purge run while it serves takes the
    old finished job's rows, leaves the active one, and the master goes on taking jobs; restarted,
    it still refuses the purged job's id."""
    db = tmp_path / "gs.db"
    handle = master(db, ttl_s=60.0)
    try:
        assert handle._purger is not None and handle._purger._thread.is_alive()
        with Client(handle.target, timeout=10) as client:
            client.submit({"id": "done", "cpu": 1, "command": "true"})
            client.submit({"id": "waits", "cpu": 1, "command": "true"})  # no node: pends
            client.cancel("done")
            # as the purge an hour on would (keep=0: as if the retention were full)
            later = StorePurger(str(db), 60.0, keep=0, clock=lambda: time.time() + 3_600)
            assert later.purge_once() == 1
            assert _live_jobs(db) == {"waits"}
            assert _rows(db, "tasks", "task_id") == {"waits/0"}
            client.submit({"id": "after", "cpu": 1, "command": "true"})
            assert client.get("after").state is JobState.PENDING
        assert _live_jobs(db) == {"waits", "after"}
    finally:
        handle.stop()
    assert not handle._purger._thread.is_alive()
    again = master(db, ttl_s=60.0)
    try:
        with Client(again.target, timeout=10) as client:
            assert {j.id for j in client.list()} == {"waits", "after"}
            with pytest.raises(AlreadyExists, match="job done finished and was purged from the store"):
                client.submit({"id": "done", "cpu": 1, "command": "true"})
    finally:
        again.stop()


def test_no_purger_runs_without_a_ttl_and_one_runs_by_itself_on_its_period(tmp_path: Path) -> None:
    handle = master(tmp_path / "a.db", ttl_s=None)
    try:
        assert handle._purger is None
    finally:
        handle.stop()
    db = tmp_path / "b.db"
    with Store(db) as s:
        finished_jobs(s, {"j": 1})
    purger = StorePurger(str(db), 1.0, keep=0, first_after_s=0.01, every_s=0.01)
    purger.start()
    try:
        deadline = time.monotonic() + 10
        while purger.rounds < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        purger.stop()
    assert purger.rounds >= 2 and purger.purged == 1
    assert _live_jobs(db) == set()
