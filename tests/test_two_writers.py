"""Two writers of task states share the store: the dispatcher (its own connection) and the binder
(through its writer process, a moment behind it). A race between them, and any restart after it,
keeps each job's fate: the store moves a task only along a legal transition (common.states), so the
later of two racing writes never undoes the other's final word.

Real SQLite files, real writer processes (stopped with SIGSTOP to hold a batch back), the real
Binder, Dispatcher and SchedulerShard wired in one process in the order the Ray actors run them.
"""

import os
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gosched.binder.binder import Binder
from gosched.binder.writer import StoreWriter
from gosched.common.config import Settings
from gosched.common.job import Job
from gosched.common.messages import BindReply, ProposalBatch
from gosched.common.states import LEGAL, TaskState
from gosched.common.store import Store
from gosched.dispatcher.dispatcher import Dispatcher
from gosched.runtime.pipeline import Pipeline
from gosched.scheduler_shard.shard import SchedulerShard
from tests.builders import make_job, make_node

S = TaskState


class Master:
    """One incarnation of the master's store-side actors, as BinderCore and DispatcherCore build
    them: a binder with its writer process, a dispatcher restored from the store, one shard."""

    def __init__(self, db: Path, cpus: str = "") -> None:
        self.writer = StoreWriter(str(db))
        self.binder = Binder(Store(db), writer=self.writer)
        if cpus:
            self.binder.add_nodes([make_node("n1").cpu(cpus).mem("4Gi").build()])
        self.dispatcher = Dispatcher(Settings(store_path=str(db), shards=1), store=Store(db))
        self.dispatcher.restore()
        self.dispatcher.partitions.add_nodes(self.binder.snapshot_nodes())
        totals = self.binder.state.totals()
        self.dispatcher.set_cluster_capacity(totals["cpu"], totals["memory"], totals["gpu"])
        self.shard = SchedulerShard(0, Settings().profile)
        self.shard.sync(*self.binder.changes_since(0))

    def plan(self) -> ProposalBatch:
        return self.shard.schedule(self.dispatcher.next_batches([0])[0])

    def bind(self, batch: ProposalBatch) -> BindReply:
        """The binder commits; its report reaches the dispatcher once durable."""
        reply = self.binder.commit(batch)
        self.shard.apply_reply(reply)
        self.writer.drain()
        self.dispatcher.on_reply(reply)
        return reply

    def run(self, job: Job) -> None:
        self.dispatcher.submit(job)
        self.bind(self.plan())
        self.dispatcher.on_started([f"{job.id}/0"])

    def stored(self, tid: str) -> TaskState:
        return self.binder.store.task_state(tid)

    def crash(self) -> None:
        """The processes end; the writer (its own session) writes what it was sent first."""
        self.writer.close()
        self.binder.store.close()
        assert self.dispatcher.store is not None
        self.dispatcher.store.close()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "gs.db"


LOW = make_job("low").cpu("1").build()
HIGH = make_job("high").cpu("1").priority(100).build()


@pytest.mark.parametrize("target", list(S))
@pytest.mark.parametrize("stored", list(S))
def test_the_store_moves_a_task_only_along_a_legal_transition(db: Path, stored: S, target: S) -> None:
    store = Store(db)
    store.add_jobs([make_job("j").cpu("1").build()])
    store.set_task_states([])
    with sqlite3.connect(db) as c:
        c.execute("UPDATE tasks SET state = ? WHERE task_id = 'j/0'", (stored.value,))
    if target is S.BOUND:
        store.commit(1, [("j/0", "n1", ())], [])
    else:
        store.set_task_states([("j/0", target)])
    legal = target in LEGAL[stored] or target is stored
    assert store.task_state("j/0") is (target if legal else stored)
    store.close()


def test_a_cancel_while_the_writer_still_holds_an_eviction_stays_cancelled_after_a_restart(db: Path) -> None:
    m = Master(db, cpus="1")
    m.run(LOW)
    m.dispatcher.submit(HIGH)
    batch = m.plan()  # evicts low/0
    os.kill(m.writer.pid, signal.SIGSTOP)  # the writer a moment behind the binder
    try:
        reply = m.binder.commit(batch)
        holding = m.dispatcher.cancel("low")  # the API's cancel: the dispatcher writes at once
    finally:
        os.kill(m.writer.pid, signal.SIGCONT)
    m.binder.cancel_job("low", holding)  # waits for the writer: the eviction is written by now
    m.dispatcher.on_reply(reply)
    assert m.stored("low/0") is S.CANCELLED  # the eviction came too late to undo the cancel
    m.crash()
    again = Master(db)
    assert again.dispatcher.task_states("low") == [S.CANCELLED]
    again.crash()


def test_a_run_that_ends_while_a_batch_evicts_it_ends_as_the_eviction_says(db: Path) -> None:
    m = Master(db, cpus="1")
    m.run(LOW)
    m.dispatcher.submit(HIGH)
    reply = m.binder.commit(m.plan())  # evicts low/0; its report is on its way
    m.writer.drain()
    released = m.binder.release(["low/0"], "succeeded")  # the run's end, reported meanwhile
    m.dispatcher.on_released(released, S.SUCCEEDED)  # as the control planes hand it on
    m.dispatcher.on_reply(reply)
    assert released == [] and m.dispatcher.task_states("low") == [S.PENDING]
    m.dispatcher.on_started(["low/0"])  # and its RUNNING report, late: it undoes nothing
    assert m.stored("low/0") is S.PENDING
    m.crash()
    again = Master(db)
    assert again.dispatcher.task_states("low") == [S.PENDING] and again.stored("low/0") is S.PENDING
    again.crash()


def test_a_late_running_report_does_not_undo_an_eviction_the_dispatcher_has_not_heard_of(db: Path) -> None:
    m = Master(db, cpus="1")
    m.dispatcher.submit(LOW)
    m.bind(m.plan())  # bound; its agent starts it, and reports RUNNING later
    m.dispatcher.submit(HIGH)
    m.binder.commit(m.plan())  # evicts low/0, durable; the dispatcher dies before the report
    m.writer.drain()
    m.dispatcher.on_started(["low/0"])
    assert m.stored("low/0") is S.PREEMPTED
    m.crash()
    again = Master(db)  # the reloaded dispatcher requeues it; the binder has high/0 alone on n1
    assert again.dispatcher.task_states("low") == [S.PENDING]
    assert sorted(again.binder.state.task_row) == ["high/0"]
    again.crash()


def test_a_cancel_that_races_a_commit_holds_when_the_binder_dies_before_its_release(db: Path) -> None:
    m = Master(db, cpus="4")
    m.dispatcher.submit(LOW)
    batch = m.plan()
    assert m.dispatcher.cancel("low") == []  # nothing bound yet: the dispatcher writes cancelled
    reply = m.binder.commit(batch)  # the commit was queued at the binder ahead of the cancel
    assert [a.job_id for a in reply.accepted] == ["low"]
    m.writer.drain()
    assert m.stored("low/0") is S.CANCELLED  # the late binding did not undo the cancel
    m.crash()  # before the orphan's release reaches the binder
    again = Master(db)
    assert again.dispatcher.task_states("low") == [S.CANCELLED]
    assert again.binder.resident("low/0") is None
    again.crash()


def test_a_plan_made_on_an_earlier_binders_view_is_refused(db: Path) -> None:
    m = Master(db, cpus="4")
    m.dispatcher.submit(LOW)
    batch = m.plan()  # in flight when the binder restarts
    m.crash()
    again = Master(db)  # nothing changed in between: the same stored state as the plan's view
    reply = again.binder.commit(batch)
    assert [(r.job_id, r.stage) for r in reply.rejected] == [("low", "node_current")]
    again.crash()


def test_the_pipeline_hands_the_dispatcher_only_the_ends_the_binder_took(tmp_path: Path) -> None:
    p = Pipeline(
        Settings(store_path=str(tmp_path / "gs.db"), shards=1), nodes=[make_node("n1").cpu("1").build()]
    )
    p.submit(LOW)
    p.run_until_idle()
    p.submit(HIGH)
    reply = p.binder.commit(p.shards[0].schedule(p.dispatcher.next_batches([0])[0]))  # evicts low/0
    p.complete(["low/0"])  # its run's end, reported while the batch's report is on its way
    p.dispatcher.on_reply(reply)
    assert p.dispatcher.task_states("low") == [S.PENDING]  # requeued, not succeeded
    p.close()
