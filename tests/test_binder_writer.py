"""The binder's store writer process: batches durable in order, callbacks only after durability,
failures told, a restarted binder waiting for the last writer. Real child processes, real SQLite."""

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gosched.binder.binder import Binder, next_epoch
from gosched.binder.writer import StoreWriter, WriterFailed
from gosched.binder.writer_child import GROUP_FRAMES
from gosched.common.messages import Placement, Proposal, ProposalBatch
from gosched.common.node import Node
from gosched.common.states import TaskState
from gosched.common.store import Store
from gosched.runtime.ray_actors import BinderCore
from tests.builders import make_job, make_node
from tests.test_binder import Clock, clusters, random_jobs, random_proposal


def stored(path: Path, sql: str, *args: object) -> list[tuple[object, ...]]:
    """Rows read through a connection of their own: what a recovering binder would find."""
    with sqlite3.connect(path) as c:
        return c.execute(sql, args).fetchall()


def version_of(path: Path) -> int:
    rows = stored(path, "SELECT value FROM meta WHERE key = 'version'")
    return int(rows[0][0]) if rows else 0  # type: ignore[call-overload]


def jobs_store(path: Path, count: int) -> Store:
    store = Store(path)
    store.add_jobs([make_job(f"j{i}").cpu("1").replicas(2).build() for i in range(count)])
    return store


def writer_on(tmp_path: Path, jobs: int, failures: list[str] | None = None) -> tuple[Path, StoreWriter]:
    """A store holding jobs j0..j{jobs-1} (two tasks each, pending), and a writer on it whose
    failures, if a list is given, go onto it."""
    db = tmp_path / "gs.db"
    jobs_store(db, jobs).close()
    return db, StoreWriter(str(db), on_failure=None if failures is None else failures.append)


def test_batches_become_durable_in_order_and_each_callback_sees_its_batch_stored(tmp_path: Path) -> None:
    db, writer = writer_on(tmp_path, 200)
    seen: list[tuple[int, int, str]] = []  # (callback number, stored version, stored state of j{n}/0)

    def note(n: int) -> None:
        state = stored(db, "SELECT state FROM tasks WHERE task_id = ?", f"j{n}/0")[0][0]
        seen.append((n, version_of(db), str(state)))

    for n in range(200):
        bound = [(f"j{n}/0", f"node-{n % 7}", ((n % 8, 1000),)), (f"j{n}/1", "node-0", ())]
        releases = [(f"j{n - 1}/1", TaskState.SUCCEEDED)] if n else []
        writer.write(n + 1, bound, releases, 1000.0 + n)
        writer.after_durable(lambda n=n: note(n))  # type: ignore[misc]
    writer.drain()
    assert [s[0] for s in seen] == list(range(200))  # in order, every one
    assert all(version >= n + 1 and state == "bound" for n, version, state in seen)
    assert version_of(db) == 200
    rows = dict(stored(db, "SELECT task_id, state || ':' || coalesce(node, '') || ':' || gpus FROM tasks"))
    assert rows["j5/0"] == "bound:node-5:5:1000" and rows["j5/1"] == "succeeded:node-0:"
    assert rows["j199/1"] == "bound:node-0:"  # the last batch's release never came
    assert writer.busy_s > 0
    writer.close()


def test_bindings_written_as_columns_are_stored_as_the_same_rows(tmp_path: Path) -> None:
    """write_plain's frames (task ids and nodes, no GPUs) between write's: the same store."""
    (tmp_path / "rows").mkdir()
    (tmp_path / "cols").mkdir()
    rows_db, by_rows = writer_on(tmp_path / "rows", 30)
    cols_db, by_cols = writer_on(tmp_path / "cols", 30)
    for n in range(30):
        tids, nodes = [f"j{n}/0", f"j{n}/1"], [f"node-{n % 7}", "node-0"]
        if n % 3:
            by_cols.write_plain(n + 1, tids, nodes, 1000.0 + n)
        else:
            by_cols.write(n + 1, list(zip(tids, nodes, [((0, 1000),), ()], strict=True)), [], 1000.0 + n)
        gpus = [((0, 1000),), ()] if n % 3 == 0 else [(), ()]
        by_rows.write(n + 1, list(zip(tids, nodes, gpus, strict=True)), [], 1000.0 + n)
    for writer in (by_rows, by_cols):
        writer.drain()
        writer.close()
    everything = "SELECT * FROM tasks ORDER BY task_id"
    assert stored(cols_db, everything) == stored(rows_db, everything)
    assert version_of(cols_db) == version_of(rows_db) == 30


def test_a_callback_with_nothing_in_flight_still_runs_after_the_earlier_ones(tmp_path: Path) -> None:
    _, writer = writer_on(tmp_path, 1)
    order: list[str] = []
    writer.write(1, [("j0/0", "n", ())], [], 1.0)
    writer.after_durable(lambda: order.append("bound"))
    writer.drain()
    writer.after_durable(lambda: order.append("nothing written"))  # a barrier carries it
    writer.drain()
    assert order == ["bound", "nothing written"] and writer.pending == 0
    writer.close()


def test_the_ack_threads_cpu_counts_the_callbacks_it_runs(tmp_path: Path) -> None:
    """The bench counts it with the binder's call thread: the callbacks' work is in it, not in
    the thread that sent the frames."""
    _, writer = writer_on(tmp_path, 1)
    before, mine = writer.ack_thread_cpu_s(), time.thread_time()

    def spin() -> None:  # 50 ms of CPU in the callback
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass

    writer.write(1, [("j0/0", "n", ())], [], 1.0)
    writer.after_durable(spin)
    writer.drain()
    assert writer.ack_thread_cpu_s() - before >= 0.05
    assert time.thread_time() - mine < 0.05  # none of it in this thread
    writer.close()
    assert writer.ack_thread_cpu_s() == 0.0  # its thread has ended


def test_a_binding_of_a_task_the_store_lacks_fails_the_writer_and_is_not_written(tmp_path: Path) -> None:
    failures: list[str] = []
    db, writer = writer_on(tmp_path, 1, failures)
    ran: list[int] = []
    writer.write(1, [("j0/0", "n", ()), ("ghost/0", "n", ())], [], 1.0)
    with contextlib.suppress(WriterFailed):  # the writer may have failed already
        writer.after_durable(lambda: ran.append(1))
    with pytest.raises(WriterFailed, match="ghost/0"):
        writer.drain()
    assert len(failures) == 1 and "ghost/0" in failures[0] and "not stored" in failures[0]
    assert ran == []  # never durable: nobody hears of it
    with pytest.raises(WriterFailed):
        writer.write(2, [("j0/1", "n", ())], [], 2.0)
    assert stored(db, "SELECT state FROM tasks WHERE task_id = 'j0/0'") == [("pending",)]
    assert version_of(db) == 0
    writer.close()


def test_a_killed_writer_is_told_and_the_binder_stops_trusting_its_memory(tmp_path: Path) -> None:
    failures: list[str] = []
    db, writer = writer_on(tmp_path, 3, failures)
    binder = Binder(Store(db), clock=Clock(), writer=writer)
    binder.add_nodes([make_node("n1").cpu("8").build()])
    os.kill(writer.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not failures:  # the ack thread sees the writer gone, with nothing in flight
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert "store writer exited" in failures[0]
    with pytest.raises(WriterFailed, match="exited"):
        binder.commit(ProposalBatch(0, binder.version, [pair("j0", "n1")]))  # applied in memory, never stored
    with pytest.raises(RuntimeError, match="new Binder"):
        binder.commit(ProposalBatch(0, binder.version, [pair("j1", "n1")]))
    with pytest.raises(RuntimeError, match="new Binder"):
        binder.release(["j0/0"], "succeeded")
    assert len(failures) == 1
    binder.store.close()
    again = Binder(Store(db))  # the store's truth: the node, no binding
    assert again.resident("j0/0") is None and again.version == next_epoch(1)
    again.store.close()


def pair(job_id: str, node: str) -> Proposal:
    """A two-task gang proposed whole on one node."""
    job = make_job(job_id).cpu("1").replicas(2).build()
    return Proposal(job, [Placement(0, node, (), ()), Placement(1, node, (), ())], 2)


def test_a_new_writer_starts_only_once_the_last_one_wrote_all_it_was_sent(tmp_path: Path) -> None:
    db = tmp_path / "gs.db"
    jobs_store(db, 3000).close()
    old = StoreWriter(str(db))
    for n in range(3000):
        old.write(n + 1, [(f"j{n}/0", "n", ()), (f"j{n}/1", "n", ())], [], 1.0)
    # The binder dies here: its end of the pipe closes with the batches unwritten.
    assert old._proc.stdin is not None
    old._proc.stdin.close()
    new = StoreWriter(str(db))  # as a restarted binder makes it, before it recovers
    assert stored(db, "SELECT count(*) FROM tasks WHERE state = 'bound'") == [(6000,)]
    assert version_of(db) == 3000
    new.close()
    old.close()


def test_a_query_waits_for_durability_while_a_commit_does_not(tmp_path: Path) -> None:
    db, writer = writer_on(tmp_path, 50)
    binder = Binder(Store(db), clock=Clock(), writer=writer)
    binder.add_nodes([make_node(f"n{i}").cpu("64").build() for i in range(5)])
    for i in range(50):
        binder.commit(ProposalBatch(0, binder.version, [pair(f"j{i}", f"n{i % 5}")]))
    assert binder.version == 5 + 100  # applied in memory at once
    released = binder.release(["j0/0"], "succeeded")  # a write of its own: after the queue
    assert released == ["j0/0"] and writer.pending == 0
    assert stored(db, "SELECT count(*) FROM tasks WHERE state = 'bound'") == [(99,)]
    assert version_of(db) == binder.version
    binder.store.close()
    writer.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), data=st.data())
def test_a_binder_with_a_writer_answers_and_recovers_as_one_without(
    nodes: list[Node], data: st.DataObject
) -> None:
    draw = data.draw
    with tempfile.TemporaryDirectory() as tmp:
        plain = Binder(Store(Path(tmp) / "plain.db"), clock=Clock())
        piped_db = Path(tmp) / "piped.db"
        writer = StoreWriter(str(piped_db))
        piped = Binder(Store(piped_db), clock=Clock(), writer=writer)
        for b in (plain, piped):
            b.add_nodes(nodes)
        stored_jobs: set[str] = set()
        heard: list[int] = []
        for batch_no in range(draw(st.integers(1, 6))):
            residents = sorted(plain.state.task_row)
            if residents and draw(st.integers(0, 3)) == 0:
                done = draw(st.lists(st.sampled_from(residents), max_size=3, unique=True))
                assert plain.release(done, "succeeded") == piped.release(done, "succeeded")
            batch = [
                random_proposal(draw, draw(random_jobs(f"b{batch_no}p{i}")), plain)
                for i in range(draw(st.integers(1, 10)))
            ]
            new_jobs = {p.job.id: p.job for p in batch if p.job.id not in stored_jobs}
            piped.store.add_jobs(list(new_jobs.values()))  # as the dispatcher stores them at submission
            stored_jobs.update(new_jobs)
            r_plain = plain.commit(ProposalBatch(0, plain.version, batch))
            r_piped = piped.commit(ProposalBatch(0, piped.version, batch))
            assert r_plain == r_piped
            version = piped.version
            writer.after_durable(lambda v=version: heard.append(version_of(piped_db) - v))  # type: ignore[misc]
        writer.drain()
        assert heard and all(d >= 0 for d in heard)  # never told before its version was stored
        writer.close()
        again = Binder(Store(piped_db))
        assert again.view() == plain.view() and again.version == next_epoch(plain.version)
        for b in (plain, piped, again):
            b.store.close()


def test_the_writer_writes_what_queued_meanwhile_in_one_transaction(tmp_path: Path) -> None:
    db, writer = writer_on(tmp_path, 500)
    heard: list[int] = []
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # the writer's first transaction waits on this one
    for n in range(500):
        writer.write(n + 1, [(f"j{n}/0", "n", ())], [], 1.0)
        writer.after_durable(lambda n=n: heard.append(n))  # type: ignore[misc]
    time.sleep(0.2)
    assert heard == [] and version_of(db) == 0
    blocker.execute("COMMIT")
    writer.drain()
    assert heard == list(range(500)) and version_of(db) == 500
    # At most the first frame alone, then groups of GROUP_FRAMES: far fewer acks than frames.
    assert writer.acks <= 2 + 500 // GROUP_FRAMES
    writer.close()


def test_a_batch_that_cannot_be_packed_fails_alone_and_leaves_no_gap(tmp_path: Path) -> None:
    db, writer = writer_on(tmp_path, 2)
    with pytest.raises(TypeError):  # a numpy integer is not msgpack's: a caller's bug, told at once
        writer.write(1, [("j0/0", "n", ((np.int64(0), 1000),))], [], 1.0)  # type: ignore[list-item]
    writer.write(1, [("j1/0", "n", ((0, 1000),))], [], 1.0)
    writer.drain(timeout_s=10)  # no seq was taken by the batch that failed: nothing to wait for
    assert stored(db, "SELECT task_id FROM tasks WHERE state = 'bound'") == [("j1/0",)]
    writer.close()
    with pytest.raises(WriterFailed, match="closed"):
        writer.write(2, [("j0/0", "n", ())], [], 2.0)


def test_the_writer_writes_all_it_was_sent_when_nobody_reads_its_acks_any_more(tmp_path: Path) -> None:
    # The binder's process is gone (its pipes closed): what it sent still reaches the store.
    db = tmp_path / "gs.db"
    jobs_store(db, 300).close()
    ack_read, ack_write = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-m", "gosched.binder.writer_child", str(db), str(ack_write)],
        stdin=subprocess.PIPE,
        pass_fds=(ack_write,),
    )
    os.close(ack_write)
    assert msgpack.unpackb(os.read(ack_read, 64)) == [0, None, 0.0]  # ready
    os.close(ack_read)  # nobody reads the acks from now on
    assert child.stdin is not None
    for n in range(300):
        child.stdin.write(msgpack.packb([n + 1, n + 1, 1.0, [[f"j{n}/0", "n", []]], []]))
    child.stdin.close()
    assert child.wait(30) == 0
    assert stored(db, "SELECT count(*) FROM tasks WHERE state = 'bound'") == [(300,)]
    assert version_of(db) == 300


def test_an_in_memory_store_has_no_writer_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    core = BinderCore(":memory:", dispatcher=None)
    assert core.writer is None and core.stats()["writer_pid"] is None
    core.add_nodes([make_node("n1").cpu("8").build()])
    core.flush()  # nothing to wait for
    assert core.binder.version == 1 and list(tmp_path.iterdir()) == []  # no lock file, no store file
    core.close()
