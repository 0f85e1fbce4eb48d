"""Stores and masters the purge tests share (tests/test_store_purge.py, tests/test_purge_logs.py):
real SQLite in a test's tmp_path, a local-runtime master over it."""

import threading
from collections.abc import Mapping
from pathlib import Path

from gosched.api.server import ServerHandle, serve
from gosched.common.config import Settings
from gosched.common.states import TaskState
from gosched.common.store import Store
from tests.builders import make_job

T0 = 1_000.0  # when the jobs are stored and end (unix seconds)


def finished_jobs(s: Store, tasks: Mapping[str, int]) -> None:
    """Jobs of these ids and task counts, stored in this order and all cancelled at T0."""
    s.add_jobs([make_job(j).cpu("1").replicas(n).build() for j, n in tasks.items()], now=T0)
    s.set_task_states([(f"{j}/{i}", TaskState.CANCELLED) for j, n in tasks.items() for i in range(n)], now=T0)


def stop_in_transaction(s: Store, nth: int) -> threading.Event:
    """A stop for s.purge_finished, set as its connection begins its nth write transaction: the
    purge ends within it, as a master that dies midway (clear with s._conn.set_trace_callback(None))."""
    stop = threading.Event()
    begun: list[str] = []

    def trace(sql: str) -> None:
        if sql.startswith("BEGIN"):
            begun.append(sql)
            if len(begun) == nth:
                stop.set()

    s._conn.set_trace_callback(trace)
    return stop


def master(db: Path, ttl_s: float | None) -> ServerHandle:
    """A master of one shard (local runtime, no nodes) over the store at db, purging finished jobs
    after ttl_s (None: no purger)."""
    settings = Settings(store_path=str(db), shards=1, finished_job_ttl_s=ttl_s)
    return serve(
        settings, (), grpc_port=0, http_port=None, host="127.0.0.1", runtime="local", wait_ready=True
    )
