"""Store.purge_finished: a finished job leaves the store (every row of it) once it is older than the
cut-off and not among the newest kept; nothing unfinished ever goes (real SQLite in tmp_path)."""

import sqlite3
import time
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gosched import Client
from gosched.api.server import ServerHandle, serve
from gosched.api.store_purge import StorePurger
from gosched.common.config import Settings
from gosched.common.states import TERMINAL, JobState, TaskState
from gosched.common.store import RestartRow, Store
from tests.builders import make_job

T0 = 1_000.0


def _rows(db: Path, table: str, column: str) -> set[str]:
    with sqlite3.connect(db) as raw:
        return {str(v) for (v,) in raw.execute(f"SELECT {column} FROM {table}")}


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
        assert s.find_submission("req-a") is None
        assert s.get_job("a") is None
        assert s.task_state("a/0") is None
        assert {j.id for j, _ in s.load_jobs()} == set(ids) - {"a"}
    assert "a" not in _rows(db, "task_restarts", "job_id") | _rows(db, "backoffs", "job_id")
    assert _rows(db, "tasks", "task_id") == {f"{j}/{i}" for j in ids if j != "a" for i in (0, 1)}
    with Store(db) as s:
        assert s.purge_finished(before=T0 + 100, keep=0) == 2  # recent and newest; failing stays
        assert {j.id for j, _ in s.load_jobs()} == set(ids) - {"a", "recent", "newest"}


def test_a_purge_deletes_in_batches_scans_again_and_counts_every_job(tmp_path: Path) -> None:
    with Store(tmp_path / "gs.db") as s:
        s.add_jobs([make_job(f"j{i}").cpu("1").build() for i in range(7)], now=T0)
        s.set_task_states([(f"j{i}/0", TaskState.CANCELLED) for i in range(7)], now=T0)
        assert s.purge_finished(before=T0 + 1, keep=2, batch=2) == 5
        assert len(s.load_jobs()) == 2
        assert s.purge_finished(before=T0 + 1, keep=2, batch=2) == 0
        # scans of 2 jobs at most, again while one finds 2: all 7 of another store's
    with Store(tmp_path / "gs2.db") as s:
        s.add_jobs([make_job(f"j{i}").cpu("1").build() for i in range(7)], now=T0)
        s.set_task_states([(f"j{i}/0", TaskState.CANCELLED) for i in range(7)], now=T0)
        assert s.purge_finished(before=T0 + 1, keep=0, batch=3, most=2) == 7
        assert s.load_jobs() == []


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


def _master(db: Path, ttl_s: float | None) -> ServerHandle:
    settings = Settings(store_path=str(db), shards=1, finished_job_ttl_s=ttl_s)
    return serve(
        settings, (), grpc_port=0, http_port=None, host="127.0.0.1", runtime="local", wait_ready=True
    )


def test_the_master_purges_a_cancelled_job_of_its_store_and_keeps_serving(tmp_path: Path) -> None:
    """Through a running master (local runtime, real gRPC): a purge run while it serves deletes the
    old finished job's rows, leaves the active one, and the master goes on taking jobs."""
    db = tmp_path / "gs.db"
    handle = _master(db, ttl_s=60.0)
    try:
        assert handle._purger is not None and handle._purger._thread.is_alive()
        with Client(handle.target, timeout=10) as client:
            client.submit({"id": "done", "cpu": 1, "command": "true"})
            client.submit({"id": "waits", "cpu": 1, "command": "true"})  # no node: pends
            client.cancel("done")
            # as the purge an hour on would (keep=0: as if the retention were full)
            later = StorePurger(str(db), 60.0, keep=0, clock=lambda: time.time() + 3_600)
            assert later.purge_once() == 1
            assert _rows(db, "jobs", "id") == {"waits"}
            assert _rows(db, "tasks", "task_id") == {"waits/0"}
            client.submit({"id": "after", "cpu": 1, "command": "true"})
            assert client.get("after").state is JobState.PENDING
        assert _rows(db, "jobs", "id") == {"waits", "after"}
    finally:
        handle.stop()
    assert not handle._purger._thread.is_alive()


def test_no_purger_runs_without_a_ttl_and_one_runs_by_itself_on_its_period(tmp_path: Path) -> None:
    handle = _master(tmp_path / "a.db", ttl_s=None)
    try:
        assert handle._purger is None
    finally:
        handle.stop()
    db = tmp_path / "b.db"
    with Store(db) as s:
        s.add_jobs([make_job("j").cpu("1").build()], now=T0)
        s.set_task_states([("j/0", TaskState.CANCELLED)], now=T0)
    purger = StorePurger(str(db), 1.0, keep=0, first_after_s=0.01, every_s=0.01)
    purger.start()
    try:
        deadline = time.monotonic() + 10
        while purger.rounds < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        purger.stop()
    assert purger.rounds >= 2 and purger.purged == 1
    assert _rows(db, "jobs", "id") == set()
