"""The SQLite store: round trips, one transaction per call, WAL, submissions (real files in tmp_path)."""

import multiprocessing
import multiprocessing.queues
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gosched.common.job import Job
from gosched.common.node import NodeState
from gosched.common.states import JobState, TaskState
from gosched.common.store import SCHEMA_VERSION, Store, gpus_from_text, gpus_to_text
from tests.builders import make_job, make_node


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "gs.db"


def rich_job(job_id: str = "train", submission: str = "") -> Job:
    job = (
        make_job(job_id)
        .role("ps")
        .cpu("2")
        .mem("8Gi")
        .replicas(2)
        .extended("rdma/hca", 1)
        .group("worker")
        .cpu("4")
        .mem("16Gi")
        .gpus(2)
        .gpu_model("A100", "H100")
        .replicas(3)
        .selector(zone="a")
        .tolerate("gpu", exists=True)
        .priority(100)
        .min_member(4)
        .queue("research")
        .tenant("t1")
        .labels(team="x")
        .deadline(1234.5)
        .disruption_budget(1)
        .submitted(99.0)
        .build()
    )
    return replace(job, submission_id=submission)


def test_jobs_round_trip_with_pending_tasks(db: Path) -> None:
    job = rich_job(submission="sub-1")
    other = make_job("other").cpu("1").build()
    with Store(db) as s:
        s.add_jobs([job, other])
        assert s.get_job("train") == job
        assert s.get_job("missing") is None
        assert s.get_job_state("train") == JobState.PENDING
    with Store(db) as s:
        loaded = s.load_jobs()
    assert [j for j, _ in loaded] == [job, other]
    tasks = loaded[0][1]
    assert tasks == [(i, TaskState.PENDING, None, ()) for i in range(5)]
    assert loaded[1][1] == [(0, TaskState.PENDING, None, ())]


def test_commit_round_trip_and_version(db: Path) -> None:
    job = make_job("j").cpu("1").gpus(1).replicas(3).build()
    with Store(db) as s:
        s.add_jobs([job])
        assert s.load_version() == 0
        s.commit(
            7, [("j/0", "n1", ((3, 1000),)), ("j/1", "n2", ())], [("j/2", TaskState.CANCELLED)], now=50.0
        )
    with Store(db) as s:
        assert s.load_version() == 7
        ((_, tasks),) = s.load_jobs()
        assert tasks == [
            (0, TaskState.BOUND, "n1", ((3, 1000),)),
            (1, TaskState.BOUND, "n2", ()),
            (2, TaskState.CANCELLED, None, ()),
        ]
        bound = s.load_bound()
    assert [(b.job, b.idx, b.state, b.node, b.gpus, b.bound_at) for b in bound] == [
        (job, 0, TaskState.BOUND, "n1", ((3, 1000),), 50.0),
        (job, 1, TaskState.BOUND, "n2", (), 50.0),
    ]


def test_commit_is_one_transaction(db: Path) -> None:
    """Bindings, state changes and the version land together or not at all."""
    job = make_job("j").cpu("1").replicas(2).build()
    with Store(db) as s:
        s.add_jobs([job])
        s.commit(1, [("j/0", "n1", ())], [])
        # the second binding's job is unknown and not given: the whole call rolls back
        with pytest.raises(KeyError):
            s.commit(2, [("j/1", "n1", ()), ("ghost/0", "n1", ())], [("j/0", TaskState.PREEMPTED)])
        assert s.load_version() == 1
        assert s.task_state("j/0") == TaskState.BOUND
        assert s.task_state("j/1") == TaskState.PENDING
        s.commit(3, [("j/1", "n2", ())], [("j/0", TaskState.PREEMPTED)])
    # visible after reopening, and to another connection
    other = sqlite3.connect(db)
    assert other.execute("SELECT task_id, state, node FROM tasks ORDER BY task_id").fetchall() == [
        ("j/0", "preempted", "n1"),
        ("j/1", "bound", "n2"),
    ]
    assert other.execute("SELECT value FROM meta WHERE key = 'version'").fetchone() == (3,)
    other.close()


def test_commit_stores_a_job_it_is_given_when_missing(db: Path) -> None:
    job = make_job("late").cpu("1").replicas(2).build()
    with Store(db) as s:
        s.commit(4, [("late/1", "n1", ())], [], jobs={"late": job})
        assert s.get_job("late") == job
    with Store(db) as s:
        ((_, tasks),) = s.load_jobs()
    assert tasks == [(0, TaskState.PENDING, None, ()), (1, TaskState.BOUND, "n1", ())]


def test_wal_mode_and_schema(db: Path) -> None:
    with Store(db) as s:
        assert s.journal_mode == "wal"
        assert s.schema_version == SCHEMA_VERSION
        assert s._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # persistent in the file
    raw.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION + 1,))
    raw.commit()
    raw.close()
    with pytest.raises(RuntimeError, match="newer"):
        Store(db)


def test_find_submission_and_duplicates(db: Path) -> None:
    a = replace(make_job("a").cpu("1").build(), submission_id="req-1")
    with Store(db) as s:
        assert s.find_submission("req-1") is None
        assert s.find_submission("") is None
        s.add_jobs([a, make_job("b").cpu("1").build()])
        assert s.find_submission("req-1") == "a"
        with pytest.raises(ValueError, match="already used"):
            s.add_jobs([make_job("c").build(), replace(make_job("d").build(), submission_id="req-1")])
        with pytest.raises(ValueError, match="already stored"):
            s.add_jobs([make_job("a").build()])
        with pytest.raises(ValueError, match="job e is given twice"):
            s.add_jobs([make_job("e").build(), make_job("e").build()])
        # nothing of a refused call was stored
        assert [j.id for j, _ in s.load_jobs()] == ["a", "b"]
    with Store(db) as s:
        assert s.find_submission("req-1") == "a"


def test_set_task_states_and_job_state(db: Path) -> None:
    with Store(db) as s:
        s.add_jobs([make_job("j").cpu("1").replicas(2).build()])
        s.commit(1, [("j/0", "n1", ((0, 500),))], [])
        s.set_task_states([("j/0", TaskState.RUNNING), ("j/1", TaskState.SCHEDULED)])
        assert s.task_state("j/0") == TaskState.RUNNING
        assert [b.state for b in s.load_bound()] == [TaskState.RUNNING]
        s.set_task_states([("j/0", TaskState.PREEMPTED)])
        s.set_task_states([("j/0", TaskState.PENDING), ("j/1", TaskState.PENDING)])
        ((_, tasks),) = s.load_jobs()
        assert tasks == [(0, TaskState.PENDING, None, ()), (1, TaskState.PENDING, None, ())]
        assert s.task_attempt("j/0") == 1  # requeued once
        assert s.task_attempt("j/1") == 1  # scheduled -> pending: a new attempt too
        assert s.load_bound() == []
        s.set_job_state("j", JobState.RUNNING)
        assert s.get_job_state("j") == JobState.RUNNING


def test_task_nodes_keep_where_an_ended_task_ran(db: Path) -> None:
    with Store(db) as s:
        s.add_jobs([make_job("j").cpu("1").replicas(4).build()])
        s.commit(1, [("j/0", "n1", ((2, 1000),)), ("j/1", "n2", ()), ("j/2", "n3", ())], [])
        s.set_task_states(
            [("j/0", TaskState.SUCCEEDED), ("j/1", TaskState.FAILED), ("j/2", TaskState.PENDING)]
        )
        # ended tasks keep their node and GPUs; a requeued one and one never placed have none
        assert s.task_nodes(["j/0", "j/1", "j/2", "j/3", "nope/0"]) == {
            "j/0": ("n1", ((2, 1000),)),
            "j/1": ("n2", ()),
        }
        many = [f"j/{i % 4}" for i in range(1200)]  # past one IN (...) chunk
        assert set(s.task_nodes(many)) == {"j/0", "j/1"}


def test_a_store_of_the_first_schema_is_brought_up_to_date(db: Path) -> None:
    raw = sqlite3.connect(db)
    raw.executescript(
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL) WITHOUT ROWID;
        CREATE TABLE tasks (task_id TEXT PRIMARY KEY, job_id TEXT NOT NULL, idx INTEGER NOT NULL,
            state TEXT NOT NULL, node TEXT, gpus TEXT NOT NULL DEFAULT '', attempt INTEGER NOT NULL DEFAULT 0,
            bound_at REAL, updated REAL NOT NULL) WITHOUT ROWID;
        INSERT INTO meta VALUES ('schema_version', 1);
        INSERT INTO tasks (task_id, job_id, idx, state, node, updated)
            VALUES ('old/0', 'old', 0, 'failed', 'n1', 1);
        """
    )
    raw.close()
    with Store(db) as s:
        assert s.schema_version == SCHEMA_VERSION == 6
        assert s.load_failures() == {}  # the old row is kept, with no reason
        assert s.task_nodes(["old/0"]) == {"old/0": ("n1", ())}
        s.add_jobs([make_job("j").cpu("1").replicas(2).build()])
        s.set_task_states([("j/1", TaskState.FAILED)], reasons={"j/1": "exit code 3 (on n1)"})
        assert s.load_failures() == {"j": "task 1 failed: exit code 3 (on n1)"}
        s.set_task_states([], retry_at={"j": 1500.0})  # a failed task's backoff (schema version 5)
        s.set_task_states([], retry_at={"j": 2000.0})  # a later one replaces it
        assert s.load_retry_at(1000.0) == {"j": 2000.0} and s.load_retry_at(2000.0) == {}


def test_a_marked_failure_counts_at_a_restart_only_if_its_task_left_its_node(db: Path) -> None:
    """begin_retries marks the failure with the task's attempt; the binder's write moves the task
    to a new attempt; on_retried counts and unmarks. A restart (load_retried) between the last two
    counts a marked failure whose task moved on, and drops the mark of one that did not."""
    with Store(db) as s:
        s.add_jobs([make_job("j").cpu("1").replicas(3).build()])
        s.commit(1, [(f"j/{i}", "n1", ()) for i in range(3)], [])  # bound
        s.set_task_states([], failing=["j/0", "j/1", "j/2"])
        s.set_task_states([("j/0", TaskState.PENDING), ("j/2", TaskState.PENDING)])  # the binder's write
        s.set_task_states([], retried=["j/2"])  # on_retried's count, for j/2 only
        assert s.load_retried() == {"j/0": 1, "j/2": 1}  # j/1 never left its node
        s.set_task_states([("j/1", TaskState.PENDING)])  # a later release does not count its old mark
        assert s.load_retried() == {"j/0": 1, "j/2": 1}
    with Store(db) as s:
        s.set_task_states([], failing=["j/0"])
        s.set_task_states([], settled=["j/0"])  # not run again after all
        s.commit(2, [("j/0", "n1", ())], [])
        s.set_task_states([("j/0", TaskState.PENDING)])
        assert s.load_retried() == {"j/0": 1, "j/2": 1}


def test_nodes_round_trip(db: Path) -> None:
    n1 = (
        make_node("n1")
        .gpus(4, nvlink_pairs=True)
        .label(zone="a")
        .taint("gpu")
        .extended("rdma/hca", 2)
        .build()
    )
    n2 = make_node("n2").cpu("8").build()
    with Store(db) as s:
        s.upsert_nodes([n1, n2], version=2)
        s.upsert_nodes([replace(n1, state=NodeState.CORDONED)], version=3)
        assert s.load_version() == 3
    with Store(db) as s:
        assert s.load_nodes() == [replace(n1, state=NodeState.CORDONED), n2]
        stored_state = s._conn.execute("SELECT state FROM nodes WHERE name = 'n1'").fetchone()[0]
        assert stored_state == "cordoned"
        s.add_jobs([make_job("j").cpu("1").build()])
        s.commit(4, [("j/0", "n2", ())], [])
        s.remove_node("n2", version=5, state_changes=[("j/0", TaskState.PENDING)])
    with Store(db) as s:
        assert s.load_nodes() == [replace(n1, state=NodeState.CORDONED)]
        assert s.load_version() == 5
        assert s.task_state("j/0") == TaskState.PENDING


def test_gpu_text() -> None:
    assert gpus_to_text(()) == ""
    assert gpus_from_text("") == ()
    pairs = ((0, 1000), (7, 250))
    assert gpus_from_text(gpus_to_text(pairs)) == pairs


def _open_store(path: str, go: Any, results: "multiprocessing.queues.Queue[str]") -> None:
    go.wait()
    try:
        Store(path)
        results.put("ok")
    except Exception as error:  # reported to the parent, which asserts on it
        results.put(repr(error))


def test_processes_opening_a_fresh_store_at_once_all_succeed(tmp_path: Path) -> None:
    # The dispatcher and binder actors open the same new file together. Switching it to WAL can
    # deadlock on the lock upgrade, which SQLite answers with "locked" at once, without waiting.
    ctx = multiprocessing.get_context("fork")
    failures: list[str] = []
    for attempt in range(20):
        path = str(tmp_path / f"s{attempt}.db")
        results = ctx.Queue()
        go = ctx.Event()
        openers = [ctx.Process(target=_open_store, args=(path, go, results)) for _ in range(6)]
        for p in openers:
            p.start()
        go.set()
        outcomes = [results.get(timeout=60) for _ in openers]
        for p in openers:
            p.join()
        failures += [o for o in outcomes if o != "ok"]
    assert failures == []


def test_add_jobs_writes_its_rows_and_encodes_before_taking_the_write_lock(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gosched.common.store as store_module

    encode_many = store_module.encode_many
    in_tx: list[bool] = []
    with Store(db) as s:

        def watched(jobs: Any) -> list[bytes]:
            in_tx.append(s._conn.in_transaction)
            return encode_many(jobs)

        monkeypatch.setattr(store_module, "encode_many", watched)
        jobs = [rich_job("a", submission="sub-a"), make_job("b").cpu("1").build()]
        s.add_jobs(jobs, now=7.0)
        assert in_tx == [False]  # the binder's writer waits on that lock: no encoding under it
        rows = s._conn.execute(
            "SELECT id, submission_id, submit_time, state FROM jobs ORDER BY rowid"
        ).fetchall()
        assert rows == [("a", "sub-a", 99.0, "pending"), ("b", None, 0.0, "pending")]
        tasks = s._conn.execute("SELECT task_id, job_id, idx, state, updated FROM tasks ORDER BY job_id, idx")
        assert tasks.fetchall() == [
            *((f"a/{i}", "a", i, "pending", 7.0) for i in range(5)),
            ("b/0", "b", 0, "pending", 7.0),
        ]
        assert [job for job, _ in s.load_jobs()] == jobs


def test_tasks_have_no_index_by_job_and_restart_rows_find_theirs_by_key(db: Path) -> None:
    # Each index on tasks is one more B-tree insert per task submitted; nothing reads through
    # (job_id, idx) but the pruning of restart rows, which finds its task by task_id instead.
    with Store(db) as s:
        s._conn.execute("CREATE INDEX tasks_by_job ON tasks (job_id, idx)")  # as stores before had
    with Store(db) as s:
        indexes = s._conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'tasks'"
        )
        assert [name for (name,) in indexes] == []
        from gosched.common.store import _PRUNE_RESTARTS

        plan = " ".join(str(row[-1]) for row in s._conn.execute("EXPLAIN QUERY PLAN " + _PRUNE_RESTARTS))
        assert "SEARCH t USING PRIMARY KEY (task_id=?)" in plan
