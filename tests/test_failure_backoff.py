"""A failed task run again (max_retries) waits out its backoff whatever state its job is in when
the failure comes: idle, queued, parked or dormant as unschedulable, or in flight (its unit then
bound or found unschedulable). Dispatcher level, on a clock the test moves; the end-to-end runs,
on both control planes and a real agent, are in test_task_retries.py."""

from collections.abc import Callable
from pathlib import Path

import pytest

from gosched.common.config import QueueConfig, Settings
from gosched.common.job import task_id
from gosched.common.messages import BUSY_REASON_PREFIX, Diagnosis, Unit, Unschedulable
from gosched.common.node import Node
from gosched.common.states import TaskState
from gosched.dispatcher.dispatcher import Dispatcher
from gosched.dispatcher.records import DORMANT, IDLE, INFLIGHT, PARKED, QUEUED, Where
from gosched.dispatcher.store import MemoryStore
from gosched.runtime.pipeline import Pipeline
from tests.builders import make_job, make_node
from tests.test_dispatcher_support import (
    CPU,
    GI,
    Clock,
    accept,
    accept_tasks,
    dispatcher,
    units,
    unschedulable,
)

BACKOFF = 10.0  # Settings' default failure_backoff_s


def _round(d: Dispatcher, *, change: bool = True) -> list[tuple[int, ...]]:
    """One round: the task indexes of job j's units it dispatches. A change first (unless not
    asked): a dormant job would go, so only the failure's backoff can hold it."""
    if change:
        d.notify_cluster_changed()
    return [u.task_indexes for u in units(d.next_batches()) if u.job.id == "j"]


def _fail(d: Dispatcher, index: int) -> None:
    tid = task_id("j", index)
    assert d.begin_retries([tid]) == [tid]
    d.on_retried([tid], [tid], {tid: "exit code 1"})


def _both_bound(d: Dispatcher, clock: Clock) -> None:
    (u,) = units(d.next_batches())
    d.on_reply(accept([u]))


def _idle(d: Dispatcher, clock: Clock) -> Callable[[], None] | None:
    _both_bound(d, clock)
    return None


def _queued(d: Dispatcher, clock: Clock) -> Callable[[], None] | None:
    _both_bound(d, clock)
    d.on_released([task_id("j", 1)], TaskState.PREEMPTED)  # evicted: queued again at once
    return None


def _parked(d: Dispatcher, clock: Clock) -> Callable[[], None] | None:
    (u,) = units(d.next_batches())
    d.on_reply(accept_tasks("j", [0]))
    d.on_unschedulable([unschedulable(u, [1])])  # task 1 backs off 0.05 s as unschedulable
    return None


def _dormant(d: Dispatcher, clock: Clock) -> Callable[[], None] | None:
    _queued(d, clock)
    for _ in range(2):  # the second verdict is judged on a view that saw the eviction
        (u,) = [u for u in units(d.next_batches()) if u.job.id == "j"]
        d.on_unschedulable([unschedulable(u)])  # task 1 fits nowhere
        clock.advance(1.0)
    assert _round(d, change=False) == []  # its backoff is over, nothing changed: dormant
    return None


def _in_flight(d: Dispatcher, clock: Clock) -> Unit:
    _queued(d, clock)
    (u,) = [u for u in units(d.next_batches()) if u.job.id == "j"]  # task 1's unit is out
    return u


def _in_flight_then_bound(d: Dispatcher, clock: Clock) -> Callable[[], None]:
    u = _in_flight(d, clock)
    return lambda: d.on_reply(accept([u]))


def _in_flight_then_unschedulable(d: Dispatcher, clock: Clock) -> Callable[[], None]:
    u = _in_flight(d, clock)
    return lambda: d.on_unschedulable([unschedulable(u)])


@pytest.mark.parametrize(
    ("setup", "where", "then_dispatched"),
    [
        (_idle, IDLE, (0,)),
        (_queued, QUEUED, (0, 1)),
        (_parked, PARKED, (0, 1)),
        (_dormant, DORMANT, (0, 1)),
        (_in_flight_then_bound, INFLIGHT, (0,)),
        (_in_flight_then_unschedulable, INFLIGHT, (0, 1)),
    ],
    ids=["idle", "queued", "parked", "dormant", "in-flight-then-bound", "in-flight-then-unschedulable"],
)
def test_a_failed_task_waits_its_backoff_whatever_its_job_was_doing(
    setup: Callable[[Dispatcher, Clock], Callable[[], None] | None],
    where: Where,
    then_dispatched: tuple[int, ...],
) -> None:
    d, clock = dispatcher(shards=1)
    d.set_cluster_capacity(100 * CPU, 100 * GI, 0)
    d.submit(make_job("j").cpu("1").replicas(2).min_member(1).max_retries(5).build())
    answer = setup(d, clock)
    assert d._jobs["j"].where is where
    _fail(d, 0)
    if answer is not None:
        answer()  # the unit in flight is answered after the failure
    explained = d.explain("j")
    assert f"run again (retry 1 of 5) after {BACKOFF:g}s" in explained
    assert "backing off after a task failed; queued again in" in explained
    clock.advance(BACKOFF - 0.1)
    assert _round(d) == []  # not before its backoff, though the cluster changed
    clock.advance(0.2)
    assert _round(d) == [then_dispatched]


def test_the_longest_backoff_of_a_jobs_failed_tasks_counts() -> None:
    """Task 1 fails on its 4th retry (80 s) while the job already waits 10 s for task 0's first."""
    d, clock = dispatcher(shards=1)
    d.set_cluster_capacity(100 * CPU, 100 * GI, 0)
    d.submit(make_job("j").cpu("1").replicas(2).min_member(1).max_retries(9).build())
    _both_bound(d, clock)
    _fail(d, 0)
    for _ in range(3):  # task 1's retries before: counted as if run
        d._retried[task_id("j", 1)] = d._retried.get(task_id("j", 1), 0) + 1
    _fail(d, 1)
    assert "run again (retry 4 of 9) after 1m20s" in d.explain("j")
    clock.advance(BACKOFF + 0.1)
    assert _round(d) == []
    clock.advance(80.0 - BACKOFF)
    assert _round(d) == [(0, 1)]


def test_a_reservation_holder_that_fails_frees_its_queue_while_it_backs_off() -> None:
    """A gang that waited and reserved its queue starts, then a task fails: during its backoff
    the queue does not wait for it."""
    queue = QueueConfig(name="q", reserve_after_s=0)
    d, clock = dispatcher(queue, shards=1)
    d.set_cluster_capacity(100 * CPU, 100 * GI, 0)
    d.submit(make_job("j").cpu("1").replicas(2).min_member(2).max_retries(5).queue("q").build())
    (u,) = units(d.next_batches())
    busy = Diagnosis(total_nodes=10, ruled_out={f"{BUSY_REASON_PREFIX}cpu": 10})  # room may come
    d.on_unschedulable([Unschedulable("j", u.task_indexes, busy, u.attempt, False)])
    assert "holds queue q's reservation" in d.explain("j")
    clock.advance(1.0)
    (u,) = [v for v in units(d.next_batches()) if v.job.id == "j"]
    d.on_reply(accept([u]))  # it starts: both tasks bound
    _fail(d, 0)  # its gang goes back whole, to wait 10 s
    assert "reservation" not in d.explain("j")
    d.submit(make_job("s").cpu("1").queue("q").build())
    assert [v.job.id for v in units(d.next_batches())] == ["s"]  # not held behind j


def test_a_restart_waits_out_what_is_left_of_a_backoff() -> None:
    """The backoff's end is stored with the job: a dispatcher restarted on the same store 4 s into
    a 10 s backoff queues the job 6 s later, not at once nor 10 s later."""
    store = MemoryStore()  # it holds the dispatcher's writes only: the binder's (bound) are elsewhere
    d, clock = dispatcher(shards=1, store=store)
    d.set_cluster_capacity(100 * CPU, 100 * GI, 0)
    d.submit(make_job("j").cpu("1").max_retries(5).build())
    _both_bound(d, clock)
    _fail(d, 0)
    clock.advance(4.0)
    again, _ = dispatcher(shards=1, store=store, clock=clock)
    again.set_cluster_capacity(100 * CPU, 100 * GI, 0)
    assert again.restore() == 1
    assert again._jobs["j"].where is PARKED
    assert "backing off after a task failed; queued again in 6.000s" in again.explain("j")
    clock.advance(BACKOFF - 4.0 - 0.1)
    assert _round(again) == []
    clock.advance(0.2)
    assert _round(again) == [(0,)]
    assert store.load_retry_at(clock()) == {}  # over: a later restart queues it at once


def test_a_restart_after_the_backoff_queues_the_job_at_once() -> None:
    store = MemoryStore()
    d, clock = dispatcher(shards=1, store=store)
    d.set_cluster_capacity(100 * CPU, 100 * GI, 0)
    d.submit(make_job("j").cpu("1").max_retries(1).build())
    _both_bound(d, clock)
    _fail(d, 0)
    clock.advance(BACKOFF + 1.0)
    again, _ = dispatcher(shards=1, store=store, clock=clock)
    again.set_cluster_capacity(100 * CPU, 100 * GI, 0)
    again.restore()
    assert _round(again, change=False) == [(0,)]


def test_a_retried_failure_is_stored_in_one_write_with_its_backoff() -> None:
    """The task's move back to pending, its failure's count and reason and its backoff's end are one
    store write: a crash between two would restart the job at once, its backoff not yet stored."""
    store = MemoryStore()
    d, clock = dispatcher(shards=1, store=store)
    d.set_cluster_capacity(100 * CPU, 100 * GI, 0)
    d.submit(make_job("j").cpu("1").max_retries(5).build())
    _both_bound(d, clock)
    tid = task_id("j", 0)
    assert d.begin_retries([tid]) == [tid]  # stores the backoff's end alone, before the binder's write
    assert store.load_retry_at(clock()) == {"j": clock() + BACKOFF}
    writes = store.calls["set_task_states"]
    d.on_retried([tid], [tid], {tid: "exit code 1"})
    assert store.calls["set_task_states"] == writes + 1
    assert store.states["j"] == [TaskState.PENDING]
    assert store.load_retry_at(clock()) == {"j": clock() + BACKOFF}
    assert store.load_retried() == {task_id("j", 0): 1}


def test_a_restart_between_the_binders_write_and_on_retried_still_waits_the_backoff(tmp_path: Path) -> None:
    """The binder's lose() stores the failed task pending in its own transaction, before
    on_retried's write: the backoff's end, stored by begin_retries first, is waited out after a
    crash between the two (real SQLite, the in-process control plane)."""
    clock = Clock(1_000_000.0)
    settings = Settings(store_path=str(tmp_path / "gs.db"), shards=1)
    nodes = [make_node("n0").cpu("4").mem("16Gi").build()]
    p = Pipeline(settings, nodes=nodes, clock=clock)
    p.submit(make_job("j").cpu("1").max_retries(5).build())
    p.run_until_idle()
    again = p.dispatcher.begin_retries([task_id("j", 0)])
    assert p.binder.lose(again) == [task_id("j", 0)]  # stored pending; then the master dies
    p.close()
    restarted = Pipeline(settings, nodes=nodes, clock=clock)
    restarted.run_until_idle()
    assert not restarted.binder.state.task_row  # not started again at once
    assert "backing off after a task failed" in restarted.dispatcher.explain("j")
    clock.advance(BACKOFF + 0.1)
    restarted.run_until_idle()
    assert sorted(restarted.binder.state.task_row) == [task_id("j", 0)]
    restarted.close()


def _running_with_retries(tmp_path: Path, retries: int) -> tuple[Pipeline, Settings, list[Node]]:
    """Job j (one task, `retries` retries, no backoff) running on one node, on real SQLite."""
    settings = Settings(store_path=str(tmp_path / "gs.db"), shards=1, failure_backoff_s=0.0)
    nodes = [make_node("n0").cpu("4").mem("16Gi").build()]
    p = Pipeline(settings, nodes=nodes)
    p.submit(make_job("j").cpu("1").max_retries(retries).build())
    p.run_until_idle()
    return p, settings, nodes


@pytest.mark.parametrize("dies", ["after lose", "after begin_retries"])
def test_a_restart_in_a_retry_counts_the_failure_once(dies: str, tmp_path: Path) -> None:
    """max_retries 1: the first failure's retry is cut by the master dying after the binder's
    write (the task stored pending, on_retried's count never written) or before it (the task
    still bound). The restarted master counts that failure if the task left its node, and not
    otherwise, so the next failure ends the job, or runs it its one time again."""
    p, settings, nodes = _running_with_retries(tmp_path, 1)
    tid = task_id("j", 0)
    again = p.dispatcher.begin_retries([tid])
    if dies == "after lose":
        assert p.binder.lose(again) == [tid]
    p.close()
    restarted = Pipeline(settings, nodes=nodes)
    restarted.run_until_idle()
    assert tid in restarted.binder.state.task_row  # running again, or still
    restarted.complete([tid], TaskState.FAILED, {tid: "exit code 1"})
    restarted.run_until_idle()
    if dies == "after lose":  # its one retry was used: the job fails
        assert restarted.dispatcher.job_state("j").value == "failed"
        assert "no retry left (of 1)" in restarted.dispatcher.explain("j")
    else:  # the first failure never took it off its node: this one is its retry
        assert tid in restarted.binder.state.task_row
        assert "retry 1 of 1" in restarted.dispatcher.explain("j")
    restarted.close()


def test_on_retried_after_a_restart_that_counted_the_failure_does_not_count_it_again(tmp_path: Path) -> None:
    """The dispatcher restarted (restoring the failure as counted) between the binder's write and
    on_retried, which then reaches the new dispatcher: the failure counts once."""
    p, settings, _ = _running_with_retries(tmp_path, 3)
    tid = task_id("j", 0)
    again = p.dispatcher.begin_retries([tid])
    gone = p.binder.lose(again)
    fresh = Dispatcher(settings, store=p.store)  # the restarted dispatcher, on the same store
    fresh.restore()
    fresh.on_retried(again, gone, {tid: "exit code 1"})
    assert p.store.load_retried() == {tid: 1}
    assert "task 0 failed: exit code 1; run again (retry 1 of 3)" in fresh.explain("j")
    assert "a task of its gang failed" not in fresh.explain("j")
    p.close()
