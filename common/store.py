"""The durable store: jobs, their tasks, nodes and the binder's version, in SQLite (WAL).

Shared by the dispatcher (it stores accepted jobs and dispatcher-side task states) and the binder
(it stores bindings and every task state change it makes). Every method is one transaction and
writes its rows in batches (executemany); nothing commits row by row.

Tables:
    meta(key PK, value)            schema_version, version (the binder's change-log version)
    jobs(id PK, submission_id UNIQUE NULL, spec BLOB, submit_time, state)
    tasks(task_id PK "job/index", job_id, idx, state, node, gpus, attempt, bound_at, updated,
          reason: why it failed, as its agent told it)
    nodes(name PK, spec BLOB, state)
    task_restarts((job_id, idx) PK, attempt, restarts, last_reason, last_time, node, noted)
                                   what a task's node agent said of restarting it, in one attempt
                                   (schema version 3); `noted`: when the master took it
    backoffs(job_id PK, retry_at)  when a failed task's backoff ends, in unix time: the job is not
                                   queued before (schema version 5); a row per job that failed
                                   once, not a column every job's row would carry

Specs are encoded with gosched.common.codec. A task's GPUs are stored as text "0:1000,3:500".
"""

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import chain, repeat
from operator import add, attrgetter, itemgetter
from pathlib import Path
from typing import Any, NamedTuple, Self

from gosched.common.codec import decode, decode_job, encode, encode_many
from gosched.common.errors import AlreadyStored
from gosched.common.job import Job, split_task_id
from gosched.common.node import Node
from gosched.common.states import HOLDS_RESOURCES, LEGAL, TERMINAL, JobState, TaskState

SCHEMA_VERSION = 6
# One row per task, replaced by each report: the agent's count is its run's total so far.
_RESTARTS_TABLE = """
CREATE TABLE IF NOT EXISTS task_restarts (
    job_id      TEXT NOT NULL,
    idx         INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    restarts    INTEGER NOT NULL,
    last_reason TEXT NOT NULL DEFAULT '',
    last_time   REAL NOT NULL DEFAULT 0,
    node        TEXT NOT NULL DEFAULT '',
    noted       REAL NOT NULL,
    PRIMARY KEY (job_id, idx)
) WITHOUT ROWID
"""
_BACKOFFS_TABLE = """
CREATE TABLE IF NOT EXISTS backoffs (
    job_id   TEXT PRIMARY KEY,
    retry_at REAL NOT NULL
) WITHOUT ROWID
"""
# Steps that bring a store of an older schema up to the next version, by the version they reach.
_MIGRATIONS = {
    2: "ALTER TABLE tasks ADD COLUMN reason TEXT NOT NULL DEFAULT ''",
    3: _RESTARTS_TABLE,  # _SCHEMA created it already (IF NOT EXISTS): kept as the step's record
    4: "ALTER TABLE tasks ADD COLUMN failures INTEGER NOT NULL DEFAULT 0",
    5: _BACKOFFS_TABLE,  # as 3
    6: "ALTER TABLE tasks ADD COLUMN failing INTEGER NOT NULL DEFAULT -1",
}

Gpus = tuple[tuple[int, int], ...]
# (idx, state, node or None, gpus) of one task, as load_jobs returns them.
TaskRow = tuple[int, TaskState, str | None, Gpus]

# Run statement by statement, split at ";" (see _create_schema): no ";" in its comments.
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS jobs (
    id            TEXT PRIMARY KEY,
    submission_id TEXT UNIQUE,
    spec          BLOB NOT NULL,
    submit_time   REAL NOT NULL,
    state         TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tasks (
    task_id  TEXT PRIMARY KEY,
    job_id   TEXT NOT NULL,
    idx      INTEGER NOT NULL,
    state    TEXT NOT NULL,
    node     TEXT,
    gpus     TEXT NOT NULL DEFAULT '',
    attempt  INTEGER NOT NULL DEFAULT 0,
    bound_at REAL,
    updated  REAL NOT NULL,
    reason   TEXT NOT NULL DEFAULT '',
    failures INTEGER NOT NULL DEFAULT 0, -- failures run again (Job.max_retries), over all attempts
    failing  INTEGER NOT NULL DEFAULT -1 -- the attempt whose failure is being run again, not counted yet
) WITHOUT ROWID;
-- No index on (job_id, idx): it cost a B-tree insert per task submitted. The loads read every
-- row anyway (load_jobs and load_bound, sorted by SQLite), the rest finds a task by task_id.
DROP INDEX IF EXISTS tasks_by_job;
CREATE TABLE IF NOT EXISTS nodes (
    name  TEXT PRIMARY KEY,
    spec  BLOB NOT NULL,
    state TEXT NOT NULL
);
{_RESTARTS_TABLE};
{_BACKOFFS_TABLE}
"""

_INSERT_JOB = "INSERT INTO jobs (id, submission_id, spec, submit_time, state) VALUES (?, ?, ?, ?, ?)"
# A job without a submission id: the column keeps its default, NULL (see _job_rows).
_INSERT_JOB_UNNAMED = "INSERT INTO jobs (id, spec, submit_time, state) VALUES (?, ?, ?, ?)"
# Every task row written at submission is pending: the state is in the statement, not bound per row.
_INSERT_TASK = (
    "INSERT INTO tasks (task_id, job_id, idx, state, updated) "
    f"VALUES (?, ?, ?, '{TaskState.PENDING.value}', ?)"
)
# _INSERT_JOB's values, or _INSERT_JOB_UNNAMED's
JobRow = tuple[str, str | None, bytes | bytearray, float, str] | tuple[str, bytes | bytearray, float, str]
_ID, _SUBMISSION, _SUBMIT_TIME = attrgetter("id"), attrgetter("submission_id"), attrgetter("submit_time")
_GROUPS, _REPLICAS = attrgetter("groups"), attrgetter("replicas")
_FIRST = itemgetter(0)
# The pending task rows of the single-task jobs stored past rowid ?2, updated at ?1: the rows
# _INSERT_TASK would write, task_id(job, 0) being "job/0" (see _insert_rows). Jobs of more tasks
# take rows bound from Python: a recursive CTE joined to the jobs cost a fifth more per job of 10.
_INSERT_TASKS_OF_ONE = (
    "INSERT INTO tasks (task_id, job_id, idx, state, updated) "
    f"SELECT id || '/0', id, 0, '{TaskState.PENDING.value}', ?1 FROM jobs WHERE rowid > ?2"
)

# Task rows a purge_finished transaction deletes (about; at most where a job has more).
PURGE_ROWS = 5_000
# jobs.state of a purged job's row: a tombstone, its spec gone, its ids taken for good.
PURGED = "purged"
_LIVE_JOB_IDS = f"SELECT id FROM jobs WHERE state != '{PURGED}' ORDER BY rowid"
_LIVE_JOB_SPECS = f"SELECT id, spec FROM jobs WHERE state != '{PURGED}' ORDER BY rowid"
_TAKEN_FOR_GOOD = "ids stay taken (finished_job_ttl_s)"
_TOMBSTONE = f"UPDATE jobs SET spec = X'', state = '{PURGED}' WHERE id = ? AND state != '{PURGED}'"
_TERMINAL_LIST = ",".join(f"'{s.value}'" for s in sorted(TERMINAL, key=lambda s: s.value))
# The task rows of a job ({0}), by the primary key: tasks has no job_id index (see _SCHEMA), a job's
# task ids are "job/idx", the key range ["job/", "job0") ("0" follows "/"), and no job id holds a "/".
_TASKS_OF = "task_id >= {0} || '/' AND task_id < {0} || '0'"
_DELETE_SOME_TASKS = (
    f"DELETE FROM tasks WHERE task_id IN (SELECT task_id FROM tasks WHERE {_TASKS_OF.format('?1')} LIMIT ?2)"
)
# A task row whose job has not finished: not ended, or being run again.
_NOT_ENDED = f"state NOT IN ({_TERMINAL_LIST}) OR failing >= 0"
# A task row that keeps its job from a purge: not ended, being run again, or changed at ? or later.
_NOT_ENDED_BY = f"({_NOT_ENDED} OR updated >= ?)"
# Of the finished jobs (every task in a terminal state, none marked failing) past the ?1 that
# finished last, those whose last task change came before ?2, with their task rows' count and the
# highest of their task indexes plus one (the task ids the master's logs may hold: 0.. that).
_FINISHED_BEFORE = (
    "SELECT job_id, n, tasks FROM (SELECT job_id, MAX(updated) AS done, COUNT(*) AS n, "
    "MAX(idx) + 1 AS tasks FROM tasks "
    f"GROUP BY job_id HAVING SUM({_NOT_ENDED}) = 0 "
    "ORDER BY done DESC, job_id DESC LIMIT -1 OFFSET ?1) WHERE done < ?2"
)

def _stopped(stop: threading.Event | None) -> bool:
    return stop is not None and stop.is_set()


class TasksOfEach(NamedTuple):
    """The task rows of jobs that all have `n` tasks (1: the one shape _job_rows makes), pending,
    updated at `t`: _insert_rows writes them."""

    n: int
    t: float


TaskInsert = tuple[str, str, int, float]  # _INSERT_TASK's values


def _may_move(target: TaskState) -> str:
    """SQL test that the stored state may move to `target` (LEGAL), `target` included. Written as
    ORs, not `state IN (...)`: SQLite builds an IN list of more than two constants into a temporary
    B-tree on each run of the statement, and executemany runs it once per row."""
    sources = sorted({s.value for s, to in LEGAL.items() if target in to} | {target.value})
    return "(" + " OR ".join(f"state = '{v}'" for v in sources) + ")"


# Two writers change task states, the dispatcher and the binder (its writer process a moment
# behind): each write applies only where the stored state may legally move to the new one, so the
# later of two racing writes never undoes a final word. A cancel the dispatcher stored is not
# turned back into a binding or an eviction the binder made before it heard of the cancel, nor an
# eviction into "running" by an agent's late report.
_BIND = (
    "UPDATE tasks SET state = 'bound', node = ?, gpus = ?, bound_at = ?, updated = ? "
    f"WHERE task_id = ? AND {_may_move(TaskState.BOUND)}"
)
# _BIND for a batch holding no GPUs (every binding of CPU-only work): no GPU text to make and bind
# per row. Its rows are (node, time, task id).
_BIND_NO_GPUS = (
    "UPDATE tasks SET state = 'bound', node = ?1, gpus = '', bound_at = ?2, updated = ?2 "
    f"WHERE task_id = ?3 AND {_may_move(TaskState.BOUND)}"
)
_gpus_of = itemgetter(2)
# Tasks taken off their node and not bound since (see Store.load_down).
_DOWN_TASKS = (
    "SELECT job_id, task_id FROM tasks"
    " WHERE state = 'preempted' OR (state IN ('pending', 'bound') AND attempt > 0)"
)
# Back to pending (requeued): a new attempt, no node. Other states keep the node for the record.
_LEGAL_SQL = "CASE ?1 " + " ".join(f"WHEN '{t.value}' THEN {_may_move(t)}" for t in TaskState) + " END"
_SET_STATE = f"""
UPDATE tasks SET
    attempt  = attempt + (state != 'pending' AND ?1 = 'pending'),
    node     = CASE WHEN ?1 = 'pending' THEN NULL ELSE node END,
    gpus     = CASE WHEN ?1 = 'pending' THEN '' ELSE gpus END,
    bound_at = CASE WHEN ?1 = 'pending' THEN NULL ELSE bound_at END,
    state    = ?1,
    updated  = ?2
WHERE task_id = ?3 AND {_LEGAL_SQL}
"""
_SET_REASON = "UPDATE tasks SET reason = ? WHERE task_id = ?"
# A failure to be run again is marked with its attempt first (Dispatcher.begin_retries), then
# counted (on_retried): a restart between the binder's write that takes the task off its node (a
# new attempt) and the count still counts it (Store.load_retried).
_MARK_FAILING = "UPDATE tasks SET failing = attempt WHERE task_id = ?"
_COUNT_FAILURE = "UPDATE tasks SET failures = failures + 1, failing = -1 WHERE task_id = ?"
_CLEAR_FAILING = "UPDATE tasks SET failing = -1 WHERE task_id = ? AND failing >= 0"
# At a restart: the marked failures whose task left its node (a later attempt) were run again, and
# count; the others never left it (the binder's write did not happen) and are dropped.
_COUNT_INTERRUPTED = (
    "UPDATE tasks SET failures = failures + 1, failing = -1 WHERE failing >= 0 AND attempt > failing"
)
_DROP_INTERRUPTED = "UPDATE tasks SET failing = -1 WHERE failing >= 0"
_SET_RETRY_AT = (
    "INSERT INTO backoffs (job_id, retry_at) VALUES (?, ?) "
    "ON CONFLICT (job_id) DO UPDATE SET retry_at = excluded.retry_at"
)
_SET_META = (
    "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
_UPSERT_NODE = (
    "INSERT INTO nodes (name, spec, state) VALUES (?, ?, ?) "
    "ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, state = excluded.state"
)
# A late report of an older attempt never replaces the current attempt's row.
_SAVE_RESTARTS = """
INSERT INTO task_restarts (job_id, idx, attempt, restarts, last_reason, last_time, node, noted)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (job_id, idx) DO UPDATE SET
    attempt = excluded.attempt, restarts = excluded.restarts, last_reason = excluded.last_reason,
    last_time = excluded.last_time, node = excluded.node, noted = excluded.noted
WHERE excluded.attempt >= task_restarts.attempt
"""
# Rows whose task has moved on to a later attempt (or is not stored): never current again. The
# task's row is found by its key, task_id "job/index" (common.job.task_id).
_PRUNE_RESTARTS = """
DELETE FROM task_restarts WHERE NOT EXISTS (
    SELECT 1 FROM tasks t
    WHERE t.task_id = task_restarts.job_id || '/' || task_restarts.idx AND t.attempt = task_restarts.attempt
)
"""
_CHUNK = 500  # ids per "IN (...)" query, below SQLite's host-parameter limit


# One binder batch as commit_many takes it: (version, bound (task id, node, GPUs), state changes
# (task id, state or its value), time).
StoredBatch = tuple[int, Sequence[tuple[str, str, Gpus]], Sequence[tuple[str, TaskState | str]], float]


class BoundTask(NamedTuple):
    """A task holding resources (bound or running), with its job: what the binder recovers."""

    job: Job
    idx: int
    state: TaskState
    node: str
    gpus: Gpus
    bound_at: float


class RestartRow(NamedTuple):
    """What a task's node agent said about restarting its process, within one attempt of the task."""

    job_id: str
    idx: int
    attempt: int
    restarts: int
    last_reason: str
    last_time: float  # when the process behind the latest restart ended (the agent's clock)
    node: str


def _task_rows(c: sqlite3.Connection, columns: str, ids: Sequence[str]) -> Iterator[tuple[Any, ...]]:
    """`SELECT columns FROM tasks` for many task ids, in chunks below SQLite's parameter limit."""
    ids = list(ids)
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        marks = ",".join("?" * len(chunk))
        yield from c.execute(f"SELECT {columns} FROM tasks WHERE task_id IN ({marks})", chunk)


def gpus_to_text(gpus: Gpus) -> str:
    text = _GPU_TEXT.get(gpus)
    if text is None:
        text = ",".join(f"{g}:{m}" for g, m in gpus)
        if len(_GPU_TEXT) < _GPU_TEXT_MAX:
            _GPU_TEXT[gpus] = text
    return text


# The text of GPU sets written lately: every binding writes one, and a cluster's tasks hold few
# distinct sets (most none, the rest one or a few whole GPUs), so formatting each is waste.
_GPU_TEXT: dict[Gpus, str] = {(): ""}
_GPU_TEXT_MAX = 4096


def gpus_from_text(text: str) -> Gpus:
    if not text:
        return ()
    out = []
    for pair in text.split(","):
        g, _, m = pair.partition(":")
        out.append((int(g), int(m)))
    return tuple(out)


def _switch_to_wal(conn: sqlite3.Connection, timeout_s: float) -> str:
    """Set WAL mode, retrying while another process does the same on a fresh file.

    Two connections switching a new file at once can deadlock on the lock upgrade; SQLite then
    answers "database is locked" at once instead of waiting in the busy handler, so we wait here.
    """
    deadline = time.monotonic() + timeout_s
    pause = 0.005
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


class Store:
    """One SQLite connection in WAL mode; safe to share between threads (calls are serialised)."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = str(path)
        self._lock = threading.RLock()
        # isolation_level=None: no implicit transactions; each method opens its own (BEGIN IMMEDIATE).
        self._conn = sqlite3.connect(
            self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        c = self._conn
        self.journal_mode = _switch_to_wal(c, busy_timeout_s)
        # FULL: a commit is on disk when it returns, power loss included (NORMAL in WAL mode may
        # lose the last commits then): an accepted job is never lost, and no launch goes out for a
        # binding a crash could take back. The binder's writer commits in groups, so it pays
        # one sync per group.
        c.execute("PRAGMA synchronous=FULL")
        c.execute("PRAGMA foreign_keys=OFF")
        c.execute("PRAGMA temp_store=MEMORY")
        c.execute("PRAGMA cache_size=-65536")  # 64 MiB page cache
        self._create_schema()

    # -- plumbing ---------------------------------------------------------------------------------
    def _create_schema(self) -> None:
        with self._tx() as c:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    c.execute(statement)
            row = c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                c.execute(_SET_META, ("schema_version", SCHEMA_VERSION))
                return
            found = int(row[0])
            if found > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.path}: store schema version {found} is newer than this code's ({SCHEMA_VERSION})"
                )
            for version in range(found + 1, SCHEMA_VERSION + 1):
                c.execute(_MIGRATIONS[version])
                c.execute(_SET_META, ("schema_version", version))

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: BEGIN IMMEDIATE ... COMMIT, rolled back on any error."""
        with self._lock:
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                yield c
            except BaseException:
                c.execute("ROLLBACK")
                raise
            c.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0])

    # -- jobs -------------------------------------------------------------------------------------
    def add_jobs(self, jobs: Sequence[Job], *, now: float | None = None) -> None:
        """Store new jobs and one pending task row per replica, all or nothing.

        A job id already stored (or twice in `jobs`), or a submission id already used, raises
        AlreadyStored and stores nothing."""
        if not jobs:
            return
        t = time.time() if now is None else now
        job_rows, task_rows = self._job_rows(jobs, t)
        try:
            with self._tx() as c:
                self._insert_rows(c, job_rows, task_rows, if_missing=False)
        except sqlite3.IntegrityError as exc:
            field, why, job_id = self._conflicts(jobs) or ("id", str(exc), "")
            raise AlreadyStored(field, f"cannot store jobs: {why}", job_id) from exc

    def _conflicts(self, jobs: Sequence[Job]) -> tuple[str, str, str] | None:
        """What makes `jobs` clash with the stored ones (or with each other): (field, message,
        the job's id)."""
        seen_ids: set[str] = set()
        seen_subs: set[str] = set()
        for j in jobs:
            if j.id in seen_ids:
                return "id", f"job {j.id} is given twice", j.id
            if self.is_purged(j.id):
                return "id", f"job {j.id} finished and was purged from the store: {_TAKEN_FOR_GOOD}", j.id
            if self.get_job_state(j.id) is not None:
                return "id", f"job {j.id} is already stored", j.id
            seen_ids.add(j.id)
            if j.submission_id:
                first = self.find_submission(j.submission_id)
                if j.submission_id in seen_subs or first is not None:
                    why = f"submission id {j.submission_id!r} of job {j.id} is already used"
                    if first is not None and self.is_purged(first):
                        why += f" (by job {first}, which finished and was purged: {_TAKEN_FOR_GOOD})"
                    return "submission_id", why, j.id
                seen_subs.add(j.submission_id)
        return None

    @staticmethod
    def _job_rows(jobs: Sequence[Job], t: float) -> tuple[list[JobRow], Iterable[TaskInsert] | TasksOfEach]:
        """The rows _insert_rows writes for new jobs: made before the transaction, so that the
        write lock (which the binder's writer waits on) is not held while the specs are encoded.

        Made by C maps, not per job in Python. The specs go as bytearrays and, when no job has a
        submission id, the rows leave that column out (NULL, its default): SQLite's module binds
        a str, int, float or bytearray as it is, but looks up an adapter for bytes and None,
        raising and clearing two AttributeErrors each time (about half as dear as the insert)."""
        job_state = JobState.PENDING.value
        ids = list(map(_ID, jobs))
        specs = map(bytearray, encode_many(jobs))
        subs = list(map(_SUBMISSION, jobs))
        job_rows: list[JobRow]
        if any(subs):
            job_rows = [
                (jid, sub or None, spec, st, job_state)
                for jid, sub, spec, st in zip(ids, subs, specs, map(_SUBMIT_TIME, jobs), strict=True)
            ]
        else:
            job_rows = list(zip(ids, specs, map(_SUBMIT_TIME, jobs), repeat(job_state)))
        # Task counts by groups tuple: a call's jobs mostly share one (the dispatcher interns them).
        groups = list(map(_GROUPS, jobs))
        total = {
            k: sum(map(_REPLICAS, g)) for k, g in dict(zip(map(id, groups), groups, strict=True)).items()
        }
        counts = list(map(total.__getitem__, map(id, groups)))
        if counts.count(1) == len(counts):  # single-task jobs: their rows are made in SQL
            return job_rows, TasksOfEach(1, t)
        suffixes = [f"/{i}" for i in range(max(counts, default=0))]  # task_id(jid, i) = jid + "/i"
        job_col = list(chain.from_iterable(map(repeat, ids, counts)))
        idx_col = list(chain.from_iterable(map(range, counts)))
        tids = map(add, job_col, map(suffixes.__getitem__, idx_col))
        return job_rows, zip(tids, job_col, idx_col, repeat(t))

    @staticmethod
    def _insert_rows(
        c: sqlite3.Connection,
        job_rows: list[JobRow],
        task_rows: Iterable[TaskInsert] | TasksOfEach,
        *,
        if_missing: bool,
    ) -> None:
        """Job rows and their pending task rows; with if_missing, rows already there are kept.
        Job rows of 4 values leave the submission id out (see _job_rows)."""
        job_sql = _INSERT_JOB if not job_rows or len(job_rows[0]) == 5 else _INSERT_JOB_UNNAMED
        if if_missing:
            job_sql = job_sql.replace("INSERT", "INSERT OR IGNORE")
        task_sql = _INSERT_TASK.replace("INSERT", "INSERT OR IGNORE") if if_missing else _INSERT_TASK
        if not isinstance(task_rows, TasksOfEach):
            c.executemany(job_sql, job_rows)
            c.executemany(task_sql, task_rows)
            return
        n, t = task_rows
        if not if_missing:
            # The jobs' rows get rowids past the largest there (SQLite takes max + 1 until it
            # reaches 2**63 - 1): their task rows are made from them in one statement, without
            # a row bound from Python per task.
            (last,) = c.execute("SELECT coalesce(max(rowid), 0) FROM jobs").fetchone()
            c.executemany(job_sql, job_rows)
            cur = c.execute(_INSERT_TASKS_OF_ONE, (t, last))
            if cur.rowcount == n * len(job_rows):
                return
            task_sql = _INSERT_TASK.replace("INSERT", "INSERT OR IGNORE")  # rowids reused: by rows
        else:
            c.executemany(job_sql, job_rows)
        ids = list(map(_FIRST, job_rows))
        suffixes = [f"/{i}" for i in range(n)]
        job_col = list(chain.from_iterable(map(repeat, ids, repeat(n))))
        idx_col = list(chain.from_iterable(map(range, repeat(n, len(ids)))))
        tids = map(add, job_col, map(suffixes.__getitem__, idx_col))
        c.executemany(task_sql, zip(tids, job_col, idx_col, repeat(t)))

    def find_submission(self, submission_id: str) -> str | None:
        """The id of the job stored under `submission_id`, None if there is none."""
        if not submission_id:
            return None
        with self._lock:
            row = self._conn.execute(
                "SELECT id FROM jobs WHERE submission_id = ?", (submission_id,)
            ).fetchone()
        return None if row is None else str(row[0])

    def get_job(self, job_id: str) -> Job | None:
        """The job stored as `job_id`; None if none is, or if it was purged (purge_finished)."""
        with self._lock:
            row = self._conn.execute(
                f"SELECT spec FROM jobs WHERE id = ? AND state != '{PURGED}'", (job_id,)
            ).fetchone()
        return None if row is None else decode_job(row[0])

    def is_purged(self, job_id: str) -> bool:
        """Whether `job_id` names a job purge_finished took: its id (and submission id) stay taken."""
        with self._lock:
            row = self._conn.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return row is not None and row[0] == PURGED

    def get_job_state(self, job_id: str) -> JobState | None:
        with self._lock:
            row = self._conn.execute(
                f"SELECT state FROM jobs WHERE id = ? AND state != '{PURGED}'", (job_id,)
            ).fetchone()
        return None if row is None else JobState(row[0])

    def set_job_state(self, job_id: str, state: JobState) -> None:
        with self._tx() as c:
            c.execute("UPDATE jobs SET state = ? WHERE id = ?", (state.value, job_id))

    def load_jobs(self, keep_finished: int | None = None) -> list[tuple[Job, list[TaskRow]]]:
        """Every job (in the order stored) with its tasks (idx, state, node, gpus), by index.

        `keep_finished`: of the jobs whose every task has ended, only the newest this many (the
        rest stay stored, unread: a restart after months of jobs does not decode them all, as
        slurmctld keeps finished jobs for MinJobAge only and sacct reads the history)."""
        with self._lock:
            c = self._conn
            tasks: dict[str, list[TaskRow]] = {}
            for jid, idx, state, node, gpus in c.execute(
                "SELECT job_id, idx, state, node, gpus FROM tasks ORDER BY job_id, idx"
            ):
                tasks.setdefault(jid, []).append((int(idx), TaskState(state), node, gpus_from_text(gpus)))
            skip: set[str] = set()
            if keep_finished is not None:
                finished = [
                    str(jid)
                    for (jid,) in c.execute(_LIVE_JOB_IDS)
                    if (rows := tasks.get(jid)) and all(row[1] in TERMINAL for row in rows)
                ]
                skip = set(finished[: max(0, len(finished) - keep_finished)])
            jobs = [
                (str(jid), decode_job(spec))
                for jid, spec in c.execute(_LIVE_JOB_SPECS)
                if jid not in skip
            ]
        return [(job, tasks.get(jid, [])) for jid, job in jobs]

    def task_state(self, tid: str) -> TaskState | None:
        with self._lock:
            row = self._conn.execute("SELECT state FROM tasks WHERE task_id = ?", (tid,)).fetchone()
        return None if row is None else TaskState(row[0])

    def task_attempt(self, tid: str) -> int | None:
        with self._lock:
            row = self._conn.execute("SELECT attempt FROM tasks WHERE task_id = ?", (tid,)).fetchone()
        return None if row is None else int(row[0])

    def task_attempts(self, task_ids: Sequence[str]) -> dict[str, int]:
        """Each known task's attempt: how many times it went back to pending after holding
        resources (a restart count, as the node agent tells the task)."""
        with self._lock:
            return {str(t): int(a) for t, a in _task_rows(self._conn, "task_id, attempt", task_ids)}

    def task_nodes(self, task_ids: Sequence[str]) -> dict[str, tuple[str, Gpus]]:
        """Where each known task was last placed: task id -> (node, GPUs). A task that ended keeps
        its node; one back to pending, or never placed, is left out."""
        with self._lock:
            rows = list(_task_rows(self._conn, "task_id, node, gpus", task_ids))
        return {str(t): (str(node), gpus_from_text(gpus)) for t, node, gpus in rows if node is not None}

    # -- tasks ------------------------------------------------------------------------------------
    def commit(
        self,
        version: int,
        bound: Sequence[tuple[str, str, Gpus]],
        state_changes: Sequence[tuple[str, TaskState]],
        *,
        now: float | None = None,
        jobs: Mapping[str, Job] | None = None,
        reasons: Mapping[str, str] | None = None,
    ) -> None:
        """The binder's batch, in ONE transaction: bindings (state bound, node, GPUs, bound_at=now),
        the other task state changes, the version, and `reasons` by task id (why a task it ends
        failed: with its state, so that no crash in between leaves a failure without its reason).

        A bound task without a row (its job was never stored) gets its job stored from `jobs`
        first; a job missing from `jobs` too raises KeyError and nothing is written.
        """
        t = time.time() if now is None else now
        with self._tx() as c:
            self._write_batch(c, version, bound, state_changes, t, jobs or {})
            if reasons:
                c.executemany(_SET_REASON, [(why, tid) for tid, why in reasons.items()])

    def commit_many(self, batches: Sequence[StoredBatch]) -> None:
        """Several binder batches, in order, in ONE transaction (the binder's writer process groups
        the batches that queued while it wrote). Every bound task must have its row already (its job
        stored at submission): a missing one raises KeyError and nothing is written."""
        with self._tx() as c:
            for version, bound, state_changes, t in batches:
                self._write_batch(c, version, bound, state_changes, t, {})

    def _write_batch(
        self,
        c: sqlite3.Connection,
        version: int,
        bound: Sequence[tuple[str, str, Gpus]],
        state_changes: Sequence[tuple[str, TaskState | str]],
        t: float,
        jobs: Mapping[str, Job],
    ) -> None:
        if bound:
            if any(map(_gpus_of, bound)):
                cur = c.executemany(
                    _BIND, [(node, gpus_to_text(gpus), t, t, tid) for tid, node, gpus in bound]
                )
            else:
                cur = c.executemany(_BIND_NO_GPUS, [(node, t, tid) for tid, node, _ in bound])
            if cur.rowcount != len(bound):
                bind_rows = [(node, gpus_to_text(gpus), t, t, tid) for tid, node, gpus in bound]
                self._bind_missing(c, bind_rows, jobs, t)
        if state_changes:
            c.executemany(_SET_STATE, [(TaskState(s).value, t, tid) for tid, s in state_changes])
        c.execute(_SET_META, ("version", version))

    def _bind_missing(
        self,
        c: sqlite3.Connection,
        bind_rows: list[tuple[str, str, float, float, str]],
        jobs: Mapping[str, Job],
        t: float,
    ) -> None:
        ids = [row[4] for row in bind_rows]
        present = {r[0] for r in _task_rows(c, "task_id", ids)}
        missing_rows = [row for row in bind_rows if row[4] not in present]
        if not missing_rows:
            return  # every row is there: the ones not bound hold a state a binding may not undo
        missing_jobs: dict[str, Job] = {}
        for row in missing_rows:
            job_id, _ = split_task_id(row[4])
            if job_id not in jobs:
                raise KeyError(f"task {row[4]}: its job {job_id} is not stored and was not given")
            missing_jobs[job_id] = jobs[job_id]
        self._insert_rows(c, *self._job_rows(list(missing_jobs.values()), t), if_missing=True)
        cur = c.executemany(_BIND, missing_rows)
        if cur.rowcount != len(missing_rows):
            raise KeyError("tasks out of range of their job: " + ", ".join(r[4] for r in missing_rows))

    def set_task_states(
        self,
        changes: Sequence[tuple[str, TaskState]],
        *,
        now: float | None = None,
        reasons: Mapping[str, str] | None = None,
        retried: Sequence[str] = (),
        retry_at: Mapping[str, float] | None = None,
        failing: Sequence[str] = (),
        settled: Sequence[str] = (),
    ) -> None:
        """Task state changes (dispatcher side: scheduled, pending, running, cancelled...), and
        `reasons` by task id: why a failed task failed, in its agent's words; `retried`: tasks whose
        failure is run again (Job.max_retries), each counted once more in its row; `retry_at` by
        job id: the unix time its failed tasks' backoff ends. `failing`: tasks whose failure is to
        be run again, marked with their attempt before the binder takes them off their nodes (a
        restart before they are counted counts them, load_retried); `settled`: marked tasks that
        were not run again after all (the binder no longer held them), unmarked.

        Moving to pending (requeue) starts a new attempt and clears node and GPUs; other states keep
        the node the task ran on. A change applies only where the stored state may legally move
        to it (common.states.LEGAL): where the binder's writes moved the row on first, theirs
        stands (see _SET_STATE).
        """
        if not changes and not reasons and not retried and not retry_at and not failing and not settled:
            return
        t = time.time() if now is None else now
        with self._tx() as c:
            c.executemany(_SET_STATE, [(s.value, t, tid) for tid, s in changes])
            if reasons:
                c.executemany(_SET_REASON, [(why, tid) for tid, why in reasons.items()])
            if failing:
                c.executemany(_MARK_FAILING, [(tid,) for tid in failing])
            if retried:
                c.executemany(_COUNT_FAILURE, [(tid,) for tid in retried])
            if settled:
                c.executemany(_CLEAR_FAILING, [(tid,) for tid in settled])
            if retry_at:
                c.executemany(_SET_RETRY_AT, list(retry_at.items()))

    def load_retry_at(self, after: float) -> dict[str, float]:
        """Per job, when its failed tasks' backoff ends, for the jobs whose backoff ends after
        `after` (a unix time: the restart's)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT job_id, retry_at FROM backoffs WHERE retry_at > ?", (after,)
            ).fetchall()
        return {str(jid): float(at) for jid, at in rows}

    def load_retried(self) -> dict[str, int]:
        """Per task id, how many of its failures were run again (only tasks with one or more).

        Called at a restart, it first settles the failures marked `failing` and not counted: a
        restart came between the dispatcher's mark and its count. One whose task has moved on to a
        later attempt was taken off its node to run again, and counts; the others were not, and
        are dropped (the task is still bound, as far as the store knows)."""
        with self._tx() as c:
            c.execute(_COUNT_INTERRUPTED)
            c.execute(_DROP_INTERRUPTED)
            rows = c.execute("SELECT task_id, failures FROM tasks WHERE failures > 0").fetchall()
        return {str(tid): int(n) for tid, n in rows}

    def load_failures(self) -> dict[str, str]:
        """Per job, its latest task failure with the reason stored for it: "task 3 failed: exit code 1
        (on node-a)", as the dispatcher's record said it before a restart."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT job_id, idx, reason FROM tasks WHERE reason != '' ORDER BY updated, idx"
            ).fetchall()
        return {str(jid): f"task {idx} failed: {reason}" for jid, idx, reason in rows}

    def load_task_reasons(self) -> dict[str, str]:
        """Per task id, why its latest failure failed, as its agent told it (tasks with one only)."""
        with self._lock:
            rows = self._conn.execute("SELECT task_id, reason FROM tasks WHERE reason != ''").fetchall()
        return {str(tid): str(reason) for tid, reason in rows}

    def load_bound(self) -> list[BoundTask]:
        """Every task holding resources (bound or running), with its job: for the binder's recovery."""
        holding = tuple(s.value for s in HOLDS_RESOURCES)
        marks = ",".join("?" * len(holding))
        with self._lock:
            c = self._conn
            rows = c.execute(
                f"SELECT job_id, idx, state, node, gpus, bound_at FROM tasks WHERE state IN ({marks}) "
                "ORDER BY job_id, idx",
                holding,
            ).fetchall()
            job_ids = sorted({r[0] for r in rows})
            jobs: dict[str, Job] = {}
            for start in range(0, len(job_ids), _CHUNK):
                chunk = job_ids[start : start + _CHUNK]
                q = f"SELECT id, spec FROM jobs WHERE id IN ({','.join('?' * len(chunk))})"
                for jid, spec in c.execute(q, chunk):
                    jobs[jid] = decode_job(spec)
        out = []
        for jid, idx, state, node, gpus, bound_at in rows:
            job = jobs.get(jid)
            if job is None or node is None:
                continue  # a binding without its job spec or node cannot be rebuilt
            out.append(
                BoundTask(
                    job, int(idx), TaskState(state), str(node), gpus_from_text(gpus), float(bound_at or 0.0)
                )
            )
        return out

    def load_down(self) -> list[tuple[str, str]]:
        """(job id, task id) of every task taken off its node (evicted or lost) and not running
        since, of the jobs with a disruption budget: a preempted row, or a pending or bound one past
        its first attempt (only a move back from bound or running starts a new one). For the
        binder's recovery: the budget counts them (common/disruptions.py)."""
        with self._lock:
            c = self._conn
            rows = c.execute(_DOWN_TASKS).fetchall()
            job_ids = sorted({r[0] for r in rows})
            budgeted: set[str] = set()
            for start in range(0, len(job_ids), _CHUNK):
                chunk = job_ids[start : start + _CHUNK]
                q = f"SELECT id, spec FROM jobs WHERE id IN ({','.join('?' * len(chunk))})"
                budgeted.update(
                    jid for jid, spec in c.execute(q, chunk) if decode_job(spec).disruption_budget is not None
                )
        return sorted((str(jid), str(tid)) for jid, tid in rows if jid in budgeted)

    # -- purging finished jobs ------------------------------------------------------------------
    def purge_finished(
        self,
        before: float,
        keep: int,
        *,
        rows: int = PURGE_ROWS,
        stop: threading.Event | None = None,
        on_purged: Callable[[list[tuple[str, int]]], None] | None = None,
    ) -> int:
        """Purge the jobs that finished (every task ended, none being run again) before `before`
        (unix time of their last task change), sparing the `keep` that finished last: their tasks,
        restart and backoff rows go, and their spec; the job's row stays as a tombstone (state
        "purged"), so that neither its id nor its submission id is ever taken again (an agent, the
        logs and the restart counts know a task by its id alone). Returns how many jobs went. As
        Kubernetes' pod garbage collector and a Job's ttlSecondsAfterFinished: without it the
        store grows by every job's spec and task rows, and a restart reads every task row.

        The candidates are read on a connection of their own, streamed (no list of every finished
        job in memory; the snapshot it holds keeps the WAL from being checkpointed meanwhile). The
        purge writes in transactions of about `rows` task rows, checking in each that its jobs are
        still finished, and after each waits as long as it took, so that other writers get the lock
        at least half the time. A job of more tasks than `rows` is made a tombstone first, then its
        task rows go `rows` at a time: a crash in between leaves ended rows of no job, which the
        next purge takes. `stop` set: it ends after the transaction under way.

        `on_purged`, after each transaction that made tombstones (outside it: the write lock is
        free meanwhile, and the pacing does not count it), gets those jobs as (job id, how many
        task ids it may have had: its highest task index plus one): what the master keeps of them
        beside the store (their log files) may go now, and nothing of a job the transaction found
        moved on. A job whose rows a crash left half deleted (between its tombstone's
        transaction and `on_purged`) is handed over again by the purge that takes the rest, with
        the highest task index of the rows left: the logs of tasks past it stay, in that case."""
        reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            found = reader.execute(_FINISHED_BEFORE, (keep, before))
            purged = 0
            batch: list[tuple[str, int, int]] = []
            size = 0
            while not _stopped(stop):
                more = found.fetchmany(1_000)
                for job_id, n, tasks in more:
                    batch.append((str(job_id), int(n), int(tasks)))
                    size += int(n)
                    if size >= rows:
                        purged += self._purge_batch(batch, before, rows, stop, on_purged)
                        batch, size = [], 0
                if not more:
                    purged += self._purge_batch(batch, before, rows, stop, on_purged)
                    break
        finally:
            reader.close()
        return purged

    def _purge_batch(
        self,
        batch: list[tuple[str, int, int]],
        before: float,
        rows: int,
        stop: threading.Event | None,
        on_purged: Callable[[list[tuple[str, int]]], None] | None = None,
    ) -> int:
        if not batch or _stopped(stop):
            return 0
        ids = [job_id for job_id, _, _ in batch]
        started = time.monotonic()
        with self._tx() as c:
            # Still finished (the candidates were read on another snapshot): one that moved on stays.
            values = ",".join(["(?)"] * len(ids))
            moved = {
                str(jid)
                for (jid,) in c.execute(
                    f"WITH ids(j) AS (VALUES {values}) SELECT j FROM ids WHERE EXISTS "
                    f"(SELECT 1 FROM tasks WHERE {_TASKS_OF.format('j')} AND {_NOT_ENDED_BY})",
                    (*ids, before),
                )
            }
            gone = [(jid,) for jid in ids if jid not in moved]
            # a job a purge stopped midway (the rest of its rows) is not counted again
            purged = c.executemany(_TOMBSTONE, gone).rowcount
            c.executemany("DELETE FROM task_restarts WHERE job_id = ?", gone)
            c.executemany("DELETE FROM backoffs WHERE job_id = ?", gone)
            big = [(jid,) for jid, n, _ in batch if n > rows and jid not in moved]
            c.executemany(f"DELETE FROM tasks WHERE {_TASKS_OF.format('?1')}", set(gone) - set(big))
        took = time.monotonic() - started
        if on_purged is not None and gone:  # committed: each of them is a tombstone now
            on_purged([(jid, tasks) for jid, _, tasks in batch if jid not in moved])
        time.sleep(took)
        for (job_id,) in big:  # a tombstone already: the rest of its rows, a transaction at a time
            while not _stopped(stop):
                started = time.monotonic()
                with self._tx() as c:
                    cur = c.execute(_DELETE_SOME_TASKS, (job_id, rows))
                time.sleep(time.monotonic() - started)
                if cur.rowcount < rows:
                    break
        return purged

    # -- restarts reported by node agents ----------------------------------------------------------
    def save_restarts(self, rows: Sequence[RestartRow], *, now: float | None = None) -> None:
        """Store the latest restart report of each task, all in one transaction (the agent
        gateway's tick hands over every report since the last one together). A row replaces the
        task's row unless that one is of a later attempt."""
        if not rows:
            return
        t = time.time() if now is None else now
        with self._tx() as c:
            c.executemany(_SAVE_RESTARTS, [(*row, t) for row in rows])

    def load_restarts(self, limit: int | None = None) -> list[RestartRow]:
        """The restart rows of the tasks' current attempts (`tasks.attempt`), the `limit` most
        recently saved, oldest first. Rows of an attempt that is over are deleted on the way."""
        with self._tx() as c:
            c.execute(_PRUNE_RESTARTS)
            rows = c.execute(
                "SELECT job_id, idx, attempt, restarts, last_reason, last_time, node FROM task_restarts "
                "ORDER BY noted DESC, job_id DESC, idx DESC LIMIT ?",
                (-1 if limit is None else limit,),
            ).fetchall()
        return [
            RestartRow(str(j), int(i), int(a), int(n), str(why), float(at), str(node))
            for j, i, a, n, why, at, node in reversed(rows)
        ]

    # -- nodes ------------------------------------------------------------------------------------
    def upsert_nodes(self, nodes: Sequence[Node], *, version: int | None = None) -> None:
        """Insert or replace node specs (and set the version, if given, in the same transaction)."""
        with self._tx() as c:
            c.executemany(_UPSERT_NODE, [(n.name, encode(n), n.state.value) for n in nodes])
            if version is not None:
                c.execute(_SET_META, ("version", version))

    def remove_node(
        self,
        name: str,
        *,
        version: int | None = None,
        state_changes: Sequence[tuple[str, TaskState]] = (),
        now: float | None = None,
    ) -> None:
        """Delete a node; in the same transaction, the state changes of its tasks and the version."""
        t = time.time() if now is None else now
        with self._tx() as c:
            c.execute("DELETE FROM nodes WHERE name = ?", (name,))
            if state_changes:
                c.executemany(_SET_STATE, [(s.value, t, tid) for tid, s in state_changes])
            if version is not None:
                c.execute(_SET_META, ("version", version))

    def load_nodes(self) -> list[Node]:
        """Every stored node, in the order first stored."""
        with self._lock:
            rows = self._conn.execute("SELECT spec FROM nodes ORDER BY rowid").fetchall()
        out = []
        for (spec,) in rows:
            node = decode(spec)
            if not isinstance(node, Node):
                raise TypeError(f"{self.path}: a node row decodes to {type(node).__name__}, not Node")
            out.append(node)
        return out

    # -- version ----------------------------------------------------------------------------------
    def set_version(self, version: int) -> None:
        with self._tx() as c:
            c.execute(_SET_META, ("version", version))

    def load_version(self) -> int:
        with self._lock:
            row = self._conn.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
        return 0 if row is None else int(row[0])
