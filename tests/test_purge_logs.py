"""The store purge takes the purged jobs' log files from the master's log folder too (their
current and previous runs, their restart marks), and no other job's: real SQLite, real files in
tmp_path, a real master for the wiring."""

import time
from pathlib import Path

from gosched import Client
from gosched.api.logs import LogStore
from gosched.api.store_purge import StorePurger
from gosched.common.states import TaskState
from gosched.common.store import Store
from tests.builders import make_job
from tests.store_helpers import T0, finished_jobs, master, stop_in_transaction


def _every_log_file(logs: LogStore, task_id: str) -> None:
    """A task with a log of each kind: two runs of both streams, restarted within each."""
    for stream in ("stdout", "stderr"):
        logs.write(task_id, stream, 0, f"{task_id} run 1 {stream}\n".encode())
    logs.mark_restart(task_id, 1, {"stdout": 4, "stderr": 4})
    logs.reset(task_id)  # run 2: run 1 becomes the previous, with its last process's mark
    for stream in ("stdout", "stderr"):
        logs.write(task_id, stream, 0, f"{task_id} run 2 {stream}\n".encode())
    logs.mark_restart(task_id, 1, {"stdout": 2, "stderr": 2})
    marks = logs._marks_path(task_id)
    marks.with_name(marks.name + ".tmp").write_text("{")  # as a crash midway through a write leaves


def _names(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()}


def test_a_purge_removes_the_purged_jobs_log_files_and_no_other_jobs(tmp_path: Path) -> None:
    db, logs = tmp_path / "gs.db", LogStore(tmp_path / "logs")
    # "a"'s neighbours in file-name order ("a%2F0" < "a-b%2F0" < "a.b%2F0" < "a0%2F0" < "a_b%2F0"),
    # one named like a's quoted task id, one not finished, one finished too late
    ids = ["a", "a-b", "a.b", "a0", "a_b", "a%2F0", "running", "recent"]
    with Store(db) as s:
        s.add_jobs([make_job(j).cpu("1").replicas(2).build() for j in ids], now=T0)
        ended = [j for j in ids if j != "running"]
        s.set_task_states([(f"{j}/{i}", TaskState.CANCELLED) for j in ended for i in (0, 1)], now=T0)
        s.set_task_states([("recent/1", TaskState.CANCELLED)], now=T0 + 50)
    for j in ids:
        for i in (0, 1):
            _every_log_file(logs, f"{j}/{i}")
    kept_before = {n for n in _names(logs.root) if not n.startswith("a%2F0.") and not n.startswith("a%2F1.")}
    assert len(_names(logs.root)) - len(kept_before) == 2 * 7  # each of a's tasks: 7 files

    purger = StorePurger(str(db), 10.0, logs=logs, keep=0, clock=lambda: T0 + 20)
    purged = ["a", "a-b", "a.b", "a0", "a_b", "a%2F0"]
    assert purger.purge_once() == len(purged)
    left = _names(logs.root)
    assert all(logs.size(f"{j}/{i}", "stdout") == 0 for j in purged for i in (0, 1))
    assert {n.split(".")[0] for n in left} == {"running%2F0", "running%2F1", "recent%2F0", "recent%2F1"}
    assert purger.log_files_removed == len(purged) * 2 * 7
    # the others' logs are whole: both runs, marks and all
    assert logs.path("recent/1", "stdout", previous=True).read_bytes() == b"recent/1 run 1 stdout\n"
    assert logs.read("recent/1", "stdout", 0, previous=True) == b"re"  # the process before, in run 2
    assert logs.read("running/0", "stderr", 0) == b"running/0 run 2 stderr\n"[2:]
    assert {n for n in left if n.startswith("recent%2F1.")} == {
        f"recent%2F1.{n}"
        for n in (
            "stdout",
            "stderr",
            "stdout.previous",
            "stderr.previous",
            "restarts",
            "restarts.previous",
            "restarts.tmp",
        )
    }


def test_a_log_file_that_cannot_go_is_logged_and_the_purge_goes_on(tmp_path: Path, caplog: object) -> None:
    db, logs = tmp_path / "gs.db", LogStore(tmp_path / "logs")
    with Store(db) as s:
        finished_jobs(s, {"x": 1, "y": 1})
    logs.write("x/0", "stderr", 0, b"x\n")
    logs.path("x/0", "stdout").mkdir()  # unlink cannot remove it (a directory)
    logs.write("y/0", "stdout", 0, b"y\n")
    purger = StorePurger(str(db), 10.0, logs=logs, keep=0, clock=lambda: T0 + 20)
    assert purger.purge_once() == 2
    assert _names(logs.root) == {"x%2F0.stdout"}  # x's stderr and all of y's went
    assert "some log files of purged job x were not removed" in caplog.text  # type: ignore[attr-defined]
    with Store(db) as s:
        assert s.is_purged("x") and s.is_purged("y")


def test_a_big_jobs_logs_go_with_its_tombstone_all_its_tasks(tmp_path: Path) -> None:
    """A job of more task rows than a transaction deletes: every task's logs go, whichever
    transaction takes its rows."""
    db, logs = tmp_path / "gs.db", LogStore(tmp_path / "logs")
    with Store(db) as s:
        finished_jobs(s, {"big": 12})
        for i in range(12):
            logs.write(f"big/{i}", "stdout", 0, b"out\n")
        gone: list[tuple[str, int]] = []
        assert s.purge_finished(before=T0 + 1, keep=0, rows=5, on_purged=gone.extend) == 1
    assert gone == [("big", 12)]
    purger = StorePurger(str(db), 10.0, logs=logs, keep=0)
    purger._remove_logs(gone)
    assert _names(logs.root) == set()


def test_the_masters_purger_removes_the_logs_it_keeps(tmp_path: Path) -> None:
    """Wired by serve: the master's own purger removes from the master's own log folder."""
    db = tmp_path / "gs.db"
    handle = master(db, ttl_s=60.0)
    try:
        logs = LogStore(tmp_path / "gs.db.logs")  # the master's log folder (beside the store)
        with Client(handle.target, timeout=10) as client:
            client.submit({"id": "done", "cpu": 1, "command": "true"})
            client.submit({"id": "waits", "cpu": 1, "command": "true"})  # no node: pends
            client.cancel("done")
            logs.write("done/0", "stdout", 0, b"done's output\n")
            logs.write("waits/0", "stdout", 0, b"an earlier run's output\n")
            purger = handle._purger
            assert purger is not None
            purger.keep, purger.clock = 0, lambda: time.time() + 3_600  # as the purge an hour on
            assert purger.purge_once() == 1
        assert _names(logs.root) == {"waits%2F0.stdout"}
    finally:
        handle.stop()


def test_a_job_run_again_between_the_purges_scan_and_its_transaction_keeps_its_logs(
    tmp_path: Path,
) -> None:
    """The candidates come from a snapshot; a job marked to run again before the transaction
    stays, and so do its logs (they are the previous run's of its next)."""
    db, logs = tmp_path / "gs.db", LogStore(tmp_path / "logs")
    with Store(db) as s:
        finished_jobs(s, {"again": 1, "gone": 1})
    for j in ("again", "gone"):
        logs.write(f"{j}/0", "stdout", 0, b"out\n")
    with Store(db) as s:
        begun: list[str] = []

        def trace(sql: str) -> None:  # after the scan, before the purge's first transaction
            if sql.startswith("BEGIN") and not begun:
                begun.append(sql)
                with Store(db) as other:
                    other.set_task_states([], failing=["again/0"], now=T0)

        s._conn.set_trace_callback(trace)
        gone: list[tuple[str, int]] = []

        def remove(jobs: list[tuple[str, int]]) -> None:
            gone.extend(jobs)
            for job_id, tasks in jobs:
                logs.remove_job(job_id, tasks)

        assert s.purge_finished(before=T0 + 1, keep=0, on_purged=remove) == 1
    assert gone == [("gone", 1)]
    assert _names(logs.root) == {"again%2F0.stdout"}


def test_a_big_job_a_crash_left_half_deleted_has_its_tasks_logs_taken_by_the_next_purge(
    tmp_path: Path,
) -> None:
    """Its rows go in key order ("big/0", "big/1", "big/10", ...): the purge that takes the rest
    hands over every task id up to the highest index left, not only as many as the rows left."""
    db, logs = tmp_path / "gs.db", LogStore(tmp_path / "logs")
    with Store(db) as s:
        finished_jobs(s, {"big": 12})
        for i in range(12):
            logs.write(f"big/{i}", "stdout", 0, b"out\n")
        stop = stop_in_transaction(s, 2)  # the purge ends in its second transaction
        # as a master that died before its logs went: no on_purged
        assert s.purge_finished(before=T0 + 1, keep=0, rows=5, stop=stop) == 1
        s._conn.set_trace_callback(None)
        gone: list[tuple[str, int]] = []
        assert s.purge_finished(before=T0 + 1, keep=0, rows=5, on_purged=gone.extend) == 0
    assert gone == [("big", 10)]  # rows big/3 .. big/9 were left
    StorePurger(str(db), 10.0, logs=logs)._remove_logs(gone)
    assert _names(logs.root) == {"big%2F10.stdout", "big%2F11.stdout"}  # their rows went before
