"""Dispatcher: units, replies, unschedulable backoff, evictions, cancel, shards, restart."""

import logging
from dataclasses import replace

import pytest

from gosched.common.config import QueueConfig
from gosched.common.errors import IllegalTransition, SpecError
from gosched.common.messages import AcceptedUnit, BindReply, Eviction, Placement, RejectedUnit
from gosched.common.spec import generated_job_id
from gosched.common.states import JobState, TaskState
from gosched.dispatcher import Dispatcher
from gosched.dispatcher.dispatcher import backoff_delay
from gosched.dispatcher.store import MemoryStore
from tests.builders import JobBuilder, make_job
from tests.test_dispatcher_support import (
    CPU,
    GI,
    accept,
    accept_tasks,
    dispatcher,
    evict,
    job_ids,
    reject,
    settings,
    units,
    unschedulable,
)

P, S, B, C = TaskState.PENDING, TaskState.SCHEDULED, TaskState.BOUND, TaskState.CANCELLED


def test_submitted_job_becomes_a_unit_of_its_pending_tasks():
    d, clock = dispatcher()
    d.submit(make_job("j").cpu("2").replicas(3).min_member(2).build())
    assert (d.pending_count(), d.in_flight_count()) == (1, 0)

    batches = d.next_batches()
    (unit,) = units(batches)
    assert unit.task_indexes == (0, 1, 2)
    assert unit.min_needed == 2
    assert unit.attempt == 0
    assert unit.dispatch_time == clock.now
    assert unit.reclaim_from == frozenset()
    assert d.task_states("j") == [S, S, S]
    assert (d.pending_count(), d.in_flight_count()) == (0, 1)
    assert d.next_batches() == []  # one unit in flight per job


def test_accepted_placements_bind_tasks_and_count_usage():
    d, _ = dispatcher()
    d.set_cluster_capacity(10 * CPU, 10 * GI, 0)
    d.submit(make_job("j").cpu("2").mem("1Gi").replicas(2).min_member(2).build())
    (unit,) = units(d.next_batches())
    assert d.usage.usage("queue", "default", "inflight").tolist() == [4 * CPU, 2 * GI, 0]

    assert d.on_reply(accept([unit])) == []
    assert d.task_states("j") == [B, B]
    assert d.job_state("j") is JobState.RUNNING
    assert d.in_flight_count() == 0 and d.pending_count() == 0
    assert d.usage.usage("queue", "default", "held").tolist() == [4 * CPU, 2 * GI, 0]
    assert d.usage.usage("tenant", "default", "inflight").tolist() == [0, 0, 0]
    assert d.queue_shares()["default"] == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("replicas", "min_member", "first_bound", "second_indexes", "second_need"),
    [
        (4, 4, [0, 1, 2], (3,), 1),  # 3 held < 4: max(1, 4 - 3)
        (4, 3, [0, 1], (2, 3), 1),  # 2 held < 3: max(1, 1)
        (4, 2, [0, 1], (2, 3), 1),  # held >= min_member: 1
        (6, 5, [0], (1, 2, 3, 4, 5), 4),  # 1 held < 5: 4 more
    ],
)
def test_min_needed_counts_tasks_already_held(replicas, min_member, first_bound, second_indexes, second_need):
    d, clock = dispatcher(backoff=1.0)
    d.submit(make_job("g").cpu("1").replicas(replicas).min_member(min_member).build())
    (u1,) = units(d.next_batches())
    assert u1.min_needed == min_member
    d.on_reply(accept_tasks("g", first_bound))  # the rest could not be placed
    assert d.task_states("g").count(B) == len(first_bound)
    assert d.next_batches() == []  # leftovers back off
    d.notify_cluster_changed()  # e.g. a node was added
    clock.advance(1.0)
    (u2,) = units(d.next_batches())
    assert u2.task_indexes == second_indexes
    assert u2.min_needed == second_need
    assert u2.attempt == 1


def test_rejected_unit_is_requeued_at_once_and_tries_another_shard():
    d, _ = dispatcher(shards=2)
    d.submit(make_job("j").cpu("1").build())
    (b1,) = d.next_batches()
    first = b1.shard_id
    d.on_reply(reject(b1.units, reason="node n3 full", stage="resources"))
    assert d.task_states("j") == [P]
    assert d.in_flight_count() == 0
    (b2,) = d.next_batches()  # no backoff
    assert b2.units[0].attempt == 1
    assert b2.shard_id != first  # loads tie (0, 0): prefer a different shard
    assert "rejected by the binder (resources): node n3 full" in d.explain("j")


def test_a_job_placed_whole_no_longer_explains_earlier_failures():
    d, clock = dispatcher()
    d.submit(make_job("j").cpu("1").build())
    (b1,) = d.next_batches()
    d.on_reply(reject(b1.units, reason="node n3 full", stage="resources"))
    (u,) = units(d.next_batches())
    d.on_unschedulable([unschedulable(u)])  # a verdict that reached the job before its binding
    assert "last unschedulable" in d.explain("j")
    d.notify_cluster_changed()
    clock.advance(60.0)
    (b3,) = d.next_batches()
    d.on_reply(accept(b3.units))
    d.on_unschedulable([unschedulable(u)])  # a late verdict of an old attempt
    assert d.task_states("j") == [B]
    assert d.explain("j") == "job j (queue default, tenant default): running; tasks: 1 bound"


def test_a_preemption_stays_in_explain_past_the_retry_that_follows():
    d, _ = dispatcher()
    d.submit(make_job("j").cpu("1").replicas(2).min_member(1).build())
    d.on_reply(accept(units(d.next_batches())))
    d.on_reply(evict(("j", 1)))
    d.on_reply(reject(units(d.next_batches()), reason="GPU 0 on n1 is not free", stage="gpus_free"))
    text = d.explain("j")
    assert "task 1 preempted by p" in text and "rejected by the binder (gpus_free)" in text
    d.on_released(["j/0"], P)  # its node was lost
    assert "task 0 lost its node" in d.explain("j")


def test_a_failure_reason_stays_in_explain_while_the_job_runs_on_and_after_it_ends():
    d, clock = dispatcher()
    d.submit(make_job("j").cpu("1").replicas(2).min_member(1).build())
    units(d.next_batches())
    d.on_reply(accept_tasks("j", [0]))  # task 1 did not fit: it waits
    d.on_released(["j/0"], TaskState.FAILED, {"j/0": "OOMKilled (on n0)"})
    assert "task 0 failed: OOMKilled (on n0)" in d.explain("j")
    d.notify_cluster_changed()
    clock.advance(60.0)
    (u2,) = units(d.next_batches())
    d.on_reply(accept([u2]))  # the freed room takes task 1: nothing pending now
    assert "task 0 failed: OOMKilled (on n0)" in d.explain("j")
    d.on_released(["j/1"], TaskState.SUCCEEDED)
    assert "task 0 failed: OOMKilled (on n0)" in d.explain("j")  # the finished job's record


def test_a_gangs_first_failure_stays_beside_the_latest() -> None:
    d, _ = dispatcher()
    d.submit(make_job("g").cpu("1").replicas(3).min_member(2).build())
    d.on_reply(accept(units(d.next_batches())))
    assert d.on_released(["g/1"], TaskState.FAILED, {"g/1": "exit code 1 (on n0)"}) == {}  # 2 left
    # The second leaves one task, below min_member: the job fails and task 0 is to be stopped.
    stopped = d.on_released(["g/2"], TaskState.FAILED, {"g/2": "killed by signal SIGKILL (on n0)"})
    assert stopped == {"g": ["g/0"]}
    text = d.explain("g")
    assert "task 1 failed: exit code 1 (on n0)" in text  # the cause
    assert "latest: task 2 failed: killed by signal SIGKILL (on n0)" in text
    assert "stopped: task 2 failed with no retry left, and with 2 of its 3 tasks failed" in text
    assert d.job_state("g") is JobState.FAILED


def test_retry_still_goes_to_the_least_loaded_shard():
    d, _ = dispatcher(shards=2)
    d.submit(make_job("j").cpu("1").build())
    (b1,) = d.next_batches()
    d.on_reply(reject(b1.units))
    loads = [0, 0]
    loads[1 - b1.shard_id] = 5  # the other shard is busy: go back to the same one
    (b2,) = d.next_batches(shard_loads=loads)
    assert b2.shard_id == b1.shard_id


@pytest.mark.parametrize(
    ("base", "cap", "expected_waits"),
    [
        (0.125, 0.75, [0.125, 0.25, 0.5, 0.75, 0.75]),
        (1.0, 100.0, [1.0, 2.0, 4.0, 8.0, 16.0]),
        (2.0, 2.0, [2.0, 2.0, 2.0, 2.0, 2.0]),
    ],
)
def test_unschedulable_parks_the_job_with_doubling_backoff(base, cap, expected_waits):
    d, clock = dispatcher(backoff=base, backoff_max=cap)
    d.submit(make_job("j").cpu("1").build())
    for attempt, wait in enumerate(expected_waits):
        (u,) = units(d.next_batches())
        assert u.attempt == attempt
        d.on_unschedulable([unschedulable(u)])
        assert d.task_states("j") == [P]
        assert (d.pending_count(), d.in_flight_count()) == (1, 0)
        d.notify_cluster_changed()  # room may have been made: only the backoff holds it back
        assert d.waiting_count() == 1
        clock.advance(wait - 1 / 64)
        assert d.next_batches() == []  # still backing off
        clock.advance(1 / 64)
    assert "0/10 nodes fit: 7 resources_fit, 3 gpu_model" in d.explain("j")


def test_after_its_backoff_an_unschedulable_job_waits_for_the_cluster_to_change():
    d, clock = dispatcher(backoff=0.0, backoff_max=10.0, periodic=10.0)
    d.submit(make_job("j").cpu("1").build())
    (u,) = units(d.next_batches())
    d.on_unschedulable([unschedulable(u)])
    for _ in range(3):  # a zero backoff does not mean a retry every round
        clock.advance(1.0)
        assert d.next_batches() == []
    assert (d.pending_count(), d.waiting_count()) == (1, 0)
    assert "waiting for the cluster to change, or a periodic retry in 7.000s" in d.explain("j")
    d.set_cluster_capacity(100 * CPU, 0, 0)  # a node was added
    (u2,) = units(d.next_batches())
    assert u2.attempt == 1


def test_dormant_job_is_retried_periodically_without_any_change():
    d, clock = dispatcher(backoff=0.5, backoff_max=1.0, periodic=4.0)
    d.submit(make_job("j").cpu("1").build())
    (u,) = units(d.next_batches())
    d.on_unschedulable([unschedulable(u)])
    clock.advance(3.9)  # the backoff is long over; nothing changed
    assert d.next_batches() == []
    assert "or a periodic retry in 0.100s" in d.explain("j")
    clock.advance(0.1)  # unschedulable_retry_s after it was parked
    assert len(units(d.next_batches())) == 1


def test_the_periodic_retry_defaults_to_a_minute_not_the_backoff_cap():
    # At the 5 s cap, 10,000 units that fit nowhere would mean 2,000 futile attempts a second.
    d, clock = dispatcher(backoff=0.5, backoff_max=5.0)
    d.submit(make_job("j").cpu("1").build())
    (u,) = units(d.next_batches())
    d.on_unschedulable([unschedulable(u)])
    clock.advance(59.9)
    assert d.next_batches() == []
    clock.advance(0.1)
    assert len(units(d.next_batches())) == 1


def test_a_job_that_failed_on_the_latest_cluster_does_not_count_as_waiting():
    # Its retry can only repeat the verdict until something changes, so a run over an overfilled
    # cluster is idle once every such job has failed on the latest view (bench, run_until_idle).
    d, clock = dispatcher(backoff=1.0, backoff_max=1.0, periodic=3.0)
    d.submit_many([make_job("j").cpu("1").build(), make_job("k").cpu("1").build()])
    uj, uk = sorted(units(d.next_batches()), key=lambda u: u.job.id)
    d.on_unschedulable([unschedulable(uj), unschedulable(uk)])
    assert (d.pending_count(), d.waiting_count()) == (2, 0)
    d.notify_cluster_changed()
    assert d.waiting_count() == 2  # the change may have made room: their retries are due
    for expected in (2, 0):  # a shard's verdict is trusted only as of its previous batch
        clock.advance(1.0)
        (u2, u3) = units(d.next_batches())
        d.on_unschedulable([unschedulable(u2), unschedulable(u3)])
        assert d.waiting_count() == expected
    clock.advance(2.0)
    assert d.next_batches() == []  # dormant: nothing changed since their verdicts
    clock.advance(1.0)  # the periodic retry still comes, on the same cluster
    assert len(units(d.next_batches())) == 2


@pytest.mark.parametrize("partly_placed", [False, True], ids=["nothing-placed", "gang-placed-in-part"])
@pytest.mark.parametrize("settling", [False, True])
def test_a_settling_verdict_is_retried_after_its_backoff_without_any_change(
    settling: bool, partly_placed: bool
) -> None:
    # Settling: the shard's preemption passed over its own placements awaiting the binder. Their
    # binding wakes nobody, so the retry must not wait for a change (or the periodic retry).
    # A gang placed in part is parked by the reply for its placed tasks, before the verdict on
    # the rest arrives (both runtimes report in that order).
    d, clock = dispatcher(backoff=1.0, backoff_max=1.0, periodic=60.0)
    d.submit(make_job("j").cpu("1").replicas(3).min_member(1).build())
    (u,) = units(d.next_batches())
    if partly_placed:
        d.on_reply(accept_tasks("j", [0]))
        d.on_unschedulable([unschedulable(u, [1, 2], settling=settling)])
    else:
        d.on_unschedulable([unschedulable(u, settling=settling)])
    assert d.waiting_count() == (1 if settling else 0)
    clock.advance(1.0)
    assert len(units(d.next_batches())) == (1 if settling else 0)


@pytest.mark.parametrize(
    ("refusals", "retried"),
    [
        # (shard of each reply before the verdict's, whether it refused anything), last one is
        # the reply to the verdict's own batch
        ([(0, True)], True),  # a placement of the same batch refused
        ([(0, True), (0, False)], True),  # one of the batch before (pipelined: still assumed)
        ([(0, True), (0, False), (0, False)], False),  # answered before the batch was planned
        ([(1, True)], False),  # another shard's refusals freed nothing in this shard's view
        ([(0, False)], False),
    ],
)
def test_a_verdict_taken_beside_refused_placements_is_retried_after_its_backoff(
    refusals: list[tuple[int, bool]], retried: bool
) -> None:
    # The refused placements held room in the shard's view when it judged the unit; the binder
    # never applied them, so no cluster change will come to wake a job parked on that verdict.
    d, clock = dispatcher(shards=2, backoff=1.0, backoff_max=1.0, periodic=60.0)
    d.submit(make_job("j").cpu("1").build())
    (b,) = d.next_batches(shard_loads=[0, 1])
    assert b.shard_id == 0
    for shard, refused in refusals:
        refusal = [RejectedUnit("other", (0,), "gpus taken", "gpus_free")] if refused else []
        d.on_reply(BindReply([], refusal, [], [], 1, shard_id=shard))
    d.on_unschedulable([unschedulable(b.units[0])])
    assert d.waiting_count() == (1 if retried else 0)
    clock.advance(1.0)
    assert job_ids(d.next_batches()) == (["j"] if retried else [])


def test_a_change_during_the_backoff_still_waits_for_the_backoff():
    d, clock = dispatcher(backoff=1.0, backoff_max=10.0)
    d.submit(make_job("j").cpu("1").build())
    (u,) = units(d.next_batches())
    d.on_unschedulable([unschedulable(u)])
    d.notify_cluster_changed()
    clock.advance(0.5)
    assert d.next_batches() == []
    assert d.waiting_count() == 1
    clock.advance(0.5)
    assert len(units(d.next_batches())) == 1


@pytest.mark.parametrize("event", ["capacity", "released", "evicted", "cancel", "partition"])
def test_cluster_changes_wake_dormant_jobs(event):
    d, _ = dispatcher(backoff=0.0, backoff_max=100.0)
    d.submit(make_job("holder").cpu("1").build())
    d.on_reply(accept(units(d.next_batches())))
    d.submit(make_job("j").cpu("1").build())
    (u,) = units(d.next_batches())
    d.on_unschedulable([unschedulable(u)])
    assert d.next_batches() == []  # dormant
    if event == "capacity":
        d.set_cluster_capacity(10 * CPU, 0, 0)
    elif event == "released":
        d.on_released(["holder/0"], TaskState.SUCCEEDED)
    elif event == "evicted":
        d.on_reply(evict(("holder", 0)))
    elif event == "cancel":
        d.cancel("holder")
    else:
        d.partitions.add_nodes(["new-node"])
    assert "j" in job_ids(d.next_batches())


def _swap(victims: dict[str, str], taker: str) -> tuple[bool, bool]:
    """A dormant job `j`; a preemptor `p` asking for `taker` bound by evicting tasks of the
    `victims` sizes (job id -> resources, by a builder spec) claimed by its placement, plus
    whatever the reply evicts beyond them. Returns (j woken, the dispatcher saw the evictions)."""
    d, _ = dispatcher(backoff=0.0, backoff_max=100.0)
    for job_id, spec in victims.items():
        d.submit(_sized(make_job(job_id), spec).build())
    d.on_reply(accept(units(d.next_batches())))
    d.submit(make_job("j").cpu("1").build())
    (u,) = units(d.next_batches())
    d.on_unschedulable([unschedulable(u)])
    assert d.next_batches() == []  # dormant
    d.submit(_sized(make_job("p"), taker).priority(100).build())
    (up,) = units(d.next_batches())
    claimed = tuple(f"{v}/0" for v in victims if not v.startswith("extra"))
    placement = Placement(0, "n1", victims=claimed)
    evicted = [Eviction(f"{v}/0", v, 0, "p" if v in {c[:-2] for c in claimed} else "") for v in victims]
    d.on_reply(BindReply([AcceptedUnit.of(up.job.id, 0, [placement], 0.0)], [], evicted, [], 2))
    seen = all(d.task_states(v) == [P] for v in victims)
    return "j" in job_ids(d.next_batches()), seen


def _sized(b: JobBuilder, spec: str) -> JobBuilder:
    """Apply "cpu=2 mem=4Gi gpus=1 share=500 fpga=1" to a job builder."""
    for part in spec.split():
        kind, amount = part.split("=")
        if kind == "fpga":
            b = b.extended("fpga", int(amount))
        elif kind in ("gpus", "share"):
            b = b.gpus(int(amount)) if kind == "gpus" else b.gpu_share(int(amount))
        else:
            b = b.cpu(amount) if kind == "cpu" else b.mem(amount)
    return b


@pytest.mark.parametrize(
    ("victims", "taker", "wakes"),
    [
        ({"v": "cpu=4 mem=4Gi"}, "cpu=4 mem=4Gi", False),  # an even swap frees nothing
        ({"v": "cpu=2", "w": "cpu=2"}, "cpu=4", False),
        ({"v": "cpu=2", "w": "cpu=2"}, "cpu=3", True),  # 1 CPU left over
        ({"v": "cpu=1 mem=8Gi"}, "cpu=1 mem=4Gi", True),
        ({"v": "cpu=1 gpus=8"}, "cpu=1 gpus=1", True),  # a big GPU task out, a small one in
        ({"v": "cpu=1 share=500", "w": "cpu=1 share=500"}, "cpu=2 gpus=1", False),
        ({"v": "cpu=1 gpus=1"}, "cpu=1 share=500", True),
        ({"v": "cpu=1 fpga=2"}, "cpu=1 fpga=1", True),
        ({"v": "cpu=1 fpga=1"}, "cpu=1", True),
        ({"v": "cpu=2", "extra": "cpu=1"}, "cpu=2", True),  # an eviction no placement claimed
    ],
)
def test_an_eviction_wakes_dormant_jobs_only_if_it_freed_more_than_its_preemptor_took(victims, taker, wakes):
    woken, seen = _swap(victims, taker)
    assert seen  # the evictions themselves were taken either way
    assert woken is wakes


def test_a_reject_is_not_a_cluster_change():
    d, _ = dispatcher(backoff=0.0, backoff_max=100.0)
    d.submit_many([make_job("j").cpu("1").build(), make_job("k").cpu("1").build()])
    uj, uk = sorted(units(d.next_batches()), key=lambda u: u.job.id)
    d.on_unschedulable([unschedulable(uj)])
    d.on_reply(reject([uk]))
    assert job_ids(d.next_batches()) == ["k"]


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(0, 0.0), (1, 0.05), (2, 0.1), (3, 0.2), (8, 5.0), (10_000, 5.0)],
)
def test_backoff_delay(failures, expected):
    assert backoff_delay(0.05, 5.0, failures) == pytest.approx(expected)


def test_explain_while_backing_off():
    d, clock = dispatcher(backoff=2.0)
    d.submit(make_job("j").cpu("1").build())
    (u,) = units(d.next_batches())
    d.on_unschedulable([unschedulable(u, note="gang needs 1 of 1 tasks")])
    clock.advance(0.5)
    text = d.explain("j")
    assert "retry in 1.500s" in text
    assert "(gang needs 1 of 1 tasks)" in text
    assert "job j (queue default, tenant default): pending; tasks: 1 pending" in text


def test_unschedulable_for_an_old_attempt_is_ignored():
    d, _ = dispatcher()
    d.submit(make_job("j").cpu("1").build())
    (u0,) = units(d.next_batches())
    d.on_reply(reject([u0]))
    (u1,) = units(d.next_batches())
    d.on_unschedulable([unschedulable(u0)])  # late answer for attempt 0
    assert d.task_states("j") == [S]
    assert d.in_flight_count() == 1
    d.on_reply(accept([u1]))
    assert d.task_states("j") == [B]


@pytest.mark.parametrize("unschedulable_first", [True, False])
def test_partly_placed_unit_proposal_and_leftovers_in_either_order(unschedulable_first):
    """A shard proposes some tasks and reports the rest unschedulable, as one ProposalBatch."""
    d, clock = dispatcher(backoff=1.0)
    d.submit(make_job("j").cpu("1").replicas(4).min_member(2).build())
    (u,) = units(d.next_batches())
    leftover = unschedulable(u, indexes=(2, 3))
    if unschedulable_first:
        d.on_unschedulable([leftover])
        assert d.task_states("j") == [S, S, P, P]
        assert d.in_flight_count() == 1  # the proposal for 0, 1 is still with the binder
        d.on_reply(accept_tasks("j", [0, 1]))
    else:
        d.on_reply(accept_tasks("j", [0, 1]))
        d.on_unschedulable([leftover])
    assert d.task_states("j") == [B, B, P, P]
    assert d.job_state("j") is JobState.RUNNING
    assert d.in_flight_count() == 0
    assert d.next_batches() == []  # leftovers back off
    d.notify_cluster_changed()
    clock.advance(1.0)
    (u2,) = units(d.next_batches())
    assert (u2.task_indexes, u2.min_needed, u2.attempt) == ((2, 3), 1, 1)


def test_eviction_returns_the_task_to_pending_and_requeues_its_job():
    d, _ = dispatcher()
    d.set_cluster_capacity(10 * CPU, 0, 0)
    d.submit(make_job("j").cpu("1").replicas(3).min_member(3).build())
    d.on_reply(accept(units(d.next_batches())))
    assert d.queue_shares()["default"] == pytest.approx(0.3)

    d.on_reply(evict(("j", 1)))
    assert d.task_states("j") == [B, P, B]
    assert d.queue_shares()["default"] == pytest.approx(0.2)
    assert d.job_state("j") is JobState.PENDING  # 2 held < min_member 3
    (u,) = units(d.next_batches())  # requeued at once
    assert (u.task_indexes, u.min_needed, u.attempt) == ((1,), 1, 1)
    assert "task 1 preempted by p" in d.explain("j")


def test_eviction_during_flight_is_folded_into_the_next_unit():
    d, _ = dispatcher(backoff=0.0)
    d.submit(make_job("a").cpu("1").replicas(2).min_member(1).build())
    d.next_batches()
    d.on_reply(accept_tasks("a", [0]))  # task 1 left over: pending, parked
    d.notify_cluster_changed()  # with no backoff, a change lets it go at once
    (u2,) = units(d.next_batches())
    assert u2.task_indexes == (1,)
    d.on_reply(evict(("a", 0)))  # the unit for task 1 is still out: task 0 waits for it
    assert d.task_states("a") == [P, S]
    assert d.next_batches() == []  # one unit per job in flight
    d.on_reply(accept([u2]))
    (u3,) = units(d.next_batches())
    assert u3.task_indexes == (0,)


def test_released_tasks_leave_usage_and_finish_the_job():
    d, _ = dispatcher()
    d.set_cluster_capacity(10 * CPU, 0, 0)
    d.submit(make_job("j").cpu("1").replicas(2).min_member(2).build())
    d.on_reply(accept(units(d.next_batches())))
    d.on_released(["j/0"], TaskState.SUCCEEDED)
    assert d.job_state("j") is JobState.RUNNING
    assert d.queue_shares()["default"] == pytest.approx(0.1)
    d.on_released(["j/1", "j/1"], TaskState.SUCCEEDED)  # a repeat is harmless
    assert d.job_state("j") is JobState.SUCCEEDED
    assert d.queue_shares()["default"] == 0.0


@pytest.mark.parametrize(
    ("final", "states_after", "requeued"),
    [
        (TaskState.FAILED, [TaskState.FAILED, B], False),
        (TaskState.PENDING, [P, B], True),  # node lost before start
        (TaskState.PREEMPTED, [P, B], True),
    ],
)
def test_release_to_pending_requeues(final, states_after, requeued):
    d, _ = dispatcher()
    d.submit(make_job("j").cpu("1").replicas(2).build())
    d.on_reply(accept(units(d.next_batches())))
    d.on_released(["j/0"], final)
    assert d.task_states("j") == states_after
    assert bool(units(d.next_batches())) is requeued


def test_release_from_an_illegal_state_raises():
    d, _ = dispatcher()
    d.submit(make_job("j").cpu("1").build())
    with pytest.raises(IllegalTransition, match=r"task j/0: pending -> running"):
        d.on_released(["j/0"], TaskState.RUNNING)


def test_cancel_waiting_job_drops_its_unit():
    d, _ = dispatcher()
    d.submit(make_job("a").cpu("1").build())
    d.submit(make_job("b").cpu("1").build())
    assert d.cancel("a") == []
    assert d.task_states("a") == [C]
    assert d.job_state("a") is JobState.CANCELLED
    assert job_ids(d.next_batches()) == ["b"]
    assert d.pending_count() == 0


def test_cancel_backing_off_job():
    d, clock = dispatcher(backoff=1.0)
    d.submit(make_job("a").cpu("1").build())
    (u,) = units(d.next_batches())
    d.on_unschedulable([unschedulable(u)])
    d.cancel("a")
    clock.advance(5)
    assert d.next_batches() == []
    assert d.pending_count() == 0


def test_cancel_returns_tasks_holding_resources_and_frees_their_usage():
    d, _ = dispatcher(backoff=1.0)
    d.set_cluster_capacity(10 * CPU, 0, 0)
    d.submit(make_job("j").cpu("1").replicas(3).build())
    d.next_batches()
    d.on_reply(accept_tasks("j", [0]))  # task 0 bound; 1 and 2 left over, backing off
    assert d.queue_shares()["default"] == pytest.approx(0.1)
    assert d.cancel("j") == ["j/0"]
    assert d.task_states("j") == [C, C, C]
    assert d.job_state("j") is JobState.CANCELLED
    assert d.queue_shares()["default"] == 0.0
    assert d.pending_count() == 0
    assert d.cancel("j") == []  # already cancelled
    d.on_released(["j/0"], TaskState.CANCELLED)  # the caller's release comes back: nothing to do
    d.on_reply(evict(("j", 0)))  # nor for a late eviction
    assert d.task_states("j") == [C, C, C]
    assert d.queue_shares()["default"] == 0.0


def test_cancel_a_finished_job_keeps_its_final_states():
    d, _ = dispatcher()
    d.submit(make_job("j").cpu("1").replicas(2).build())
    d.on_reply(accept(units(d.next_batches())))
    d.on_released(["j/0"], TaskState.FAILED)
    assert d.cancel("j") == ["j/1"]
    assert d.task_states("j") == [TaskState.FAILED, C]
    assert d.job_state("j") is JobState.CANCELLED


def test_cancel_in_flight_unit_then_binder_accepts_it():
    d, _ = dispatcher()
    d.submit(make_job("j").cpu("1").replicas(2).build())
    (u,) = units(d.next_batches())
    assert d.cancel("j") == []
    assert d.in_flight_count() == 0 and d.shard_loads() == [0, 0]
    orphans = d.on_reply(accept([u]))
    assert orphans == ["j/0", "j/1"]  # bound for a cancelled job: release them
    assert d.task_states("j") == [C, C]


def test_bind_for_an_unknown_job_is_an_orphan():
    d, _ = dispatcher()
    reply = BindReply([AcceptedUnit.of("ghost", 0, [Placement(0, "n1")], 0.0)], [], [], [], 1)
    assert d.on_reply(reply) == ["ghost/0"]


def test_least_loaded_shard_by_dispatcher_counts():
    d, _ = dispatcher(shards=3)
    d.submit_many([make_job(f"a{i}").cpu("1").build() for i in range(5)])
    first = d.next_batches()
    assert sorted(len(b.units) for b in first) == [1, 2, 2]
    assert d.shard_loads() == [2, 2, 1]
    d.submit(make_job("late").cpu("1").build())
    (b,) = d.next_batches()
    assert b.shard_id == 2  # the one with a single unit in flight


@pytest.mark.parametrize(
    ("loads", "n", "expected"),
    [
        ([5, 0, 3], 6, [0, 5, 1]),  # fill shard 1 up to 3, then alternate lowest id
        ([0, 0, 0], 4, [2, 1, 1]),
        ([9, 9, 0], 2, [0, 0, 2]),
    ],
)
def test_least_loaded_shard_by_given_loads(loads, n, expected):
    d, _ = dispatcher(shards=3)
    d.submit_many([make_job(f"j{i}").cpu("1").build() for i in range(n)])
    per_shard = [0, 0, 0]
    for b in d.next_batches(shard_loads=loads):
        per_shard[b.shard_id] = len(b.units)
    assert per_shard == expected


def test_shard_loads_must_match_the_shards():
    d, _ = dispatcher(shards=2)
    d.submit(make_job("j").cpu("1").build())
    with pytest.raises(ValueError, match="3 entries for 2 shards"):
        d.next_batches(shard_loads=[0, 0, 0])


def test_batch_size_caps_units_per_shard_per_call():
    d, _ = dispatcher(shards=2, batch_size=3)
    d.submit_many([make_job(f"j{i}").cpu("1").build() for i in range(10)])
    assert [len(b.units) for b in d.next_batches()] == [3, 3]
    assert len(units(d.next_batches(max_units=1))) == 1
    assert len(units(d.next_batches())) == 3  # shard loads are now 4 and 3: the rest goes round
    assert d.pending_count() == 0


def test_more_shards_after_set_shards():
    d, _ = dispatcher(shards=1)
    d.partitions.add_nodes([f"n{i}" for i in range(6)])
    d.partitions.set_shards(3)
    d.submit_many([make_job(f"j{i}").cpu("1").build() for i in range(6)])
    assert sorted(b.shard_id for b in d.next_batches()) == [0, 1, 2]
    assert [len(d.partitions.partition_of(s)) for s in range(3)] == [2, 2, 2]


def test_requeue_in_flight_takes_units_back_from_a_lost_shard():
    d, _ = dispatcher(shards=2)
    d.submit_many([make_job(f"j{i}").cpu("1").build() for i in range(4)])
    batches = d.next_batches()
    lost = batches[0].shard_id
    taken = {u.job.id for u in batches[0].units}
    assert d.requeue_in_flight(lost) == len(taken)
    assert d.shard_loads()[lost] == 0
    again = units(d.next_batches())
    assert {u.job.id for u in again} == taken
    assert all(u.attempt == 1 for u in again)


def test_unknown_queue_is_a_spec_error():
    d, _ = dispatcher(QueueConfig(name="a"), QueueConfig(name="b"))
    with pytest.raises(SpecError) as err:
        d.submit(make_job("j").queue("c").build())
    assert err.value.field == "queue"
    assert "unknown queue 'c' (known: a, b)" in str(err.value)
    assert "j" not in d


@pytest.mark.parametrize(
    ("job", "field"),
    [
        (make_job("j").replicas(2).min_member(3).build(), "min_member"),
        (make_job("j").replicas(0).build(), "groups"),
    ],
)
def test_invalid_jobs_are_spec_errors(job, field):
    d, _ = dispatcher()
    with pytest.raises(SpecError) as err:
        d.submit(job)
    assert err.value.field == field


def test_submit_stamps_the_submit_time():
    d, clock = dispatcher()
    d.submit(make_job("j").build())
    assert d.job("j").submit_time == clock.now
    # A client's time is not kept: aging reads it, and a backdated one would jump the queue.
    d.submit(make_job("k").submitted(5.0).build())
    assert d.job("k").submit_time == clock.now


def test_multi_group_unit_costs_each_group():
    d, _ = dispatcher()
    d.set_cluster_capacity(100 * CPU, 0, 8000)
    job = make_job("j").cpu("4").replicas(1).group("worker").cpu("1").gpus(1).replicas(2).build()
    d.submit(job)
    (u,) = units(d.next_batches())
    assert u.task_indexes == (0, 1, 2)
    assert d.usage.usage("queue", "default").tolist() == [6 * CPU, 0, 2000]


def test_store_gets_one_batched_write_per_call_and_only_dispatcher_side_states():
    store = MemoryStore()
    d, _ = dispatcher(store=store)
    d.submit_many([make_job(f"j{i}").cpu("1").build() for i in range(5)])
    assert store.calls["add_jobs"] == 1
    us = units(d.next_batches())  # in flight is not written: a restart makes it pending anyway
    assert store.calls.get("set_task_states", 0) == 0
    assert all(store.states[f"j{i}"] == [P] for i in range(5))
    d.on_reply(accept(us[:2]))  # bound is the binder's to write
    assert store.calls.get("set_task_states", 0) == 0
    d.on_reply(reject(us[2:]))
    assert store.calls["set_task_states"] == 1
    assert [store.states[u.job.id] for u in us[2:]] == [[P]] * 3
    d.on_reply(evict((us[0].job.id, 0)))  # preempted is the binder's, the requeue is ours
    assert store.states[us[0].job.id] == [P]
    d.cancel(us[1].job.id)
    assert store.states[us[1].job.id] == [C]


def _restart_scenario(store, bind) -> Dispatcher:
    """Before the restart: a bound, b in flight, c and d queued, e cancelled.

    `bind(task_ids)` writes the bindings to the store as the binder does.
    """
    d, _ = dispatcher(store=store)
    d.set_cluster_capacity(10 * CPU, 0, 0)
    d.submit_many([make_job(n).cpu("1").build() for n in "abcde"])
    us = {u.job.id: u for u in units(d.next_batches(max_units=2))}
    bind(["a/0"])
    d.on_reply(accept([us["a"]]))
    d.cancel("e")
    assert d.task_states("b") == [S]
    return d


def _check_restored(store) -> None:
    d2, _ = dispatcher(store=store)
    d2.set_cluster_capacity(10 * CPU, 0, 0)
    assert d2.restore() == 5
    assert d2.task_states("a") == [B]
    assert d2.task_states("b") == [P]  # scheduled -> pending
    assert d2.job_state("e") is JobState.CANCELLED
    assert d2.queue_shares()["default"] == pytest.approx(0.1)  # a counts
    assert sorted(job_ids(d2.next_batches())) == ["b", "c", "d"]
    assert d2.restore() == 0  # already known


def test_restore_from_memory_store():
    store = MemoryStore()
    _restart_scenario(store, lambda tids: store.set_task_states([(t, B) for t in tids]))
    _check_restored(store)


def test_restore_from_sqlite_store(tmp_path):
    store_mod = pytest.importorskip("gosched.common.store")
    store = store_mod.Store(str(tmp_path / "gosched.db"))
    _restart_scenario(store, lambda tids: store.commit(1, [(t, "n1", ()) for t in tids], []))
    assert store.task_state("b/0") is P  # in flight at a shard: the store still says pending
    store.close()
    _check_restored(store_mod.Store(str(tmp_path / "gosched.db")))


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_failure_reason_outlives_a_restart(kind: str, tmp_path) -> None:
    from gosched.common.store import Store

    def open_store():
        return MemoryStore() if kind == "memory" else Store(str(tmp_path / "gosched.db"))

    store = open_store()
    d, _ = dispatcher(store=store)
    d.submit_many([make_job("f").cpu("1").build(), make_job("g").cpu("1").replicas(2).min_member(1).build()])
    d.on_reply(accept(units(d.next_batches())))
    d.on_released(
        ["f/0", "g/0"], TaskState.FAILED, {"f/0": "exit code 3 (on n1)", "g/0": "OOMKilled (on n2)"}
    )
    ends = [("f/0", TaskState.FAILED), ("g/0", TaskState.FAILED), ("g/1", B)]  # the binder's rows
    if kind == "sqlite":
        store.commit(1, [("f/0", "n1", ()), ("g/0", "n2", ()), ("g/1", "n2", ())], [])  # bound first
        store.commit(2, [], ends)
        store.close()
        store = open_store()
    else:
        store.set_task_states(ends)
    d2, _ = dispatcher(store=store)
    assert d2.restore() == 2
    assert d2.job_state("f") is JobState.FAILED
    assert "task 0 failed: exit code 3 (on n1)" in d2.explain("f")  # a finished job's record
    assert "task 0 failed: OOMKilled (on n2)" in d2.explain("g")  # a job still running


def test_restore_without_store_is_a_no_op():
    d = Dispatcher(settings())
    assert d.restore() == 0


def test_finished_jobs_leave_memory_but_stay_queryable():
    d = Dispatcher(settings(), finished_retention=2)
    d.submit_many([make_job(f"j{i}").cpu("1").build() for i in range(4)])
    d.on_reply(accept(units(d.next_batches())))
    assert d.active_count() == 4
    d.on_released(["j0/0"], TaskState.SUCCEEDED)
    d.on_released(["j1/0"], TaskState.FAILED)
    assert d.active_count() == 2
    assert d.job_state("j0") is JobState.SUCCEEDED and d.task_states("j0") == [TaskState.SUCCEEDED]
    assert d.job_state("j1") is JobState.FAILED
    assert d.explain("j1") == "job j1 (queue default, tenant default): failed; tasks: 1 failed (finished)"
    assert d.cancel("j1") == []
    d.cancel("j2")  # j2's record goes too; j0, the oldest finished, is forgotten
    assert "j0" not in d and "j1" in d and "j2" in d
    with pytest.raises(KeyError):
        d.job_state("j0")
    with pytest.raises(SpecError):  # a retained job's id cannot be reused
        d.submit(make_job("j1").build())
    assert d.on_reply(accept_tasks("j2", [0])) == ["j2/0"]  # a late bind of a finished job: release it


def test_restore_keeps_finished_jobs_out_of_the_queues():
    store = MemoryStore()
    d, _ = dispatcher(store=store)
    d.submit_many([make_job("a").cpu("1").build(), make_job("b").cpu("1").build()])
    d.cancel("a")
    d2, _ = dispatcher(store=store)
    assert d2.restore() == 2
    assert d2.active_count() == 1
    assert d2.job_state("a") is JobState.CANCELLED
    assert job_ids(d2.next_batches()) == ["b"]


def test_restore_skips_jobs_of_queues_no_longer_configured(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    d, _ = dispatcher(QueueConfig(name="a"), QueueConfig(name="b"), store=store)
    d.submit_many([make_job("ja").queue("a").build(), make_job("jb").queue("b").build()])
    d2, _ = dispatcher(QueueConfig(name="a"), store=store)
    with caplog.at_level(logging.WARNING, logger="gosched.dispatcher.dispatcher"):
        assert d2.restore() == 1
    assert d2.skipped_on_restore == ["jb"]
    assert "queue(s) no longer configured (b)" in caplog.text and "jb" in caplog.text  # told, not silent
    # Shown, never scheduled, and it says why.
    assert "jb" in d2 and d2.job_state("jb") is JobState.PENDING and "jb" in d2.job_ids()
    assert "queue b is not configured" in d2.explain("jb")
    assert "jb" not in job_ids(d2.next_batches())
    # Its id is still taken: reusing it is refused as a duplicate, naming the field.
    with pytest.raises(SpecError, match="already exists") as err:
        d2.submit_many([make_job("jb").queue("a").build()])
    assert err.value.field == "id"
    assert store.jobs["jb"].queue == "b"  # the stored one is untouched
    # It can be cancelled, and stays cancelled after another restart.
    assert d2.cancel("jb") == []
    assert d2.job_state("jb") is JobState.CANCELLED
    d3, _ = dispatcher(QueueConfig(name="a"), store=store)
    d3.restore()
    assert d3.job_state("jb") is JobState.CANCELLED and d3.skipped_on_restore == []


def test_tasks_of_a_job_of_a_removed_queue_end_as_they_are_told() -> None:
    store = MemoryStore()
    d, _ = dispatcher(QueueConfig(name="a"), QueueConfig(name="b"), store=store)
    d.submit_many([make_job("two").queue("b").replicas(2).build(), make_job("one").queue("b").build()])
    store.set_task_states([("two/0", B), ("two/1", B), ("one/0", B)])  # as the binder stored them
    d2, _ = dispatcher(QueueConfig(name="a"), store=store)
    d2.restore()
    assert d2.skipped_on_restore == ["two", "one"]
    d2.on_released(["two/0"], TaskState.FAILED, {"two/0": "exit code 2 (on n1)"})
    d2.on_released(["two/1"], TaskState.PREEMPTED)  # evicted: it waits, never scheduled
    assert d2.task_states("two") == [TaskState.FAILED, P]
    said = d2.explain("two")
    assert "queue b is not configured" in said and "task 0 failed: exit code 2 (on n1)" in said
    d2.on_released(["one/0"], TaskState.FAILED, {"one/0": "OOMKilled (on n2)"})
    assert d2.job_state("one") is JobState.FAILED  # every task ended: finished
    said = d2.explain("one")
    assert "not configured" not in said and "task 0 failed: OOMKilled (on n2)" in said
    assert store.load_failures() == {
        "two": "task 0 failed: exit code 2 (on n1)",
        "one": "task 0 failed: OOMKilled (on n2)",
    }
    assert d2.cancel("two") == []  # nothing holds resources any more
    assert d2.task_states("two") == [TaskState.FAILED, C]
    assert "task 0 failed: exit code 2 (on n1)" in d2.explain("two")


R, OK, F = TaskState.RUNNING, TaskState.SUCCEEDED, TaskState.FAILED


@pytest.mark.parametrize(
    ("states", "min_member", "want"),
    [
        ([R, R, R], 3, JobState.RUNNING),
        ([R, F, R], 3, JobState.RUNNING),  # a failed member: the others still run
        ([R, OK, R], 3, JobState.RUNNING),
        ([R, P, R], 3, JobState.PENDING),  # a member waits to be placed again
        ([B, P, P], 1, JobState.RUNNING),
        ([F, P, P], 1, JobState.PENDING),  # nothing holds resources
        ([F, OK, OK], 3, JobState.FAILED),
        ([OK, OK], 2, JobState.SUCCEEDED),
        ([C, OK], 1, JobState.CANCELLED),
    ],
)
def test_job_state_of_a_gang(states: list[TaskState], min_member: int, want: JobState) -> None:
    from gosched.dispatcher.records import job_state_of

    assert job_state_of(states, min_member, False) is want


def test_a_submission_id_answers_only_a_repeat_of_its_first_request(tmp_path) -> None:
    from gosched.common.store import Store

    store = Store(str(tmp_path / "gosched.db"))
    d, _ = dispatcher(store=store)
    first = make_job("a").cpu("1").build()
    s = "key-1"
    assert d.submit_many([replace_sub(first, s)]) == ["a"]
    # A retry that names no id (it is generated from the submission id), a later stamp: the
    # first job is the answer.
    assert d.submit(replace_sub(make_job(generated_job_id(s)).cpu("1").submitted(5.0).build(), s)) == "a"
    for changed in (make_job("c").cpu("2").build(), make_job("c").cpu("1").priority(3).build()):
        with pytest.raises(SpecError, match="first used for job a with another spec") as err:
            d.submit(replace_sub(changed, s))
        assert err.value.field == "submission_id"
    with pytest.raises(
        SpecError, match="given to two jobs of this request with different specs"
    ):  # within one batch too
        d.submit_many(
            [replace_sub(make_job("x").build(), "k2"), replace_sub(make_job("y").cpu("3").build(), "k2")]
        )
    d2, _ = dispatcher(store=store)  # known to the store only (not restored): still checked
    assert d2.submit(replace_sub(make_job(generated_job_id(s)).cpu("1").build(), s)) == "a"
    with pytest.raises(SpecError, match="another spec"):
        d2.submit(replace_sub(make_job("z").cpu("5").build(), s))


def replace_sub(job, submission_id: str):
    from dataclasses import replace

    return replace(job, submission_id=submission_id)


def test_explain_says_when_a_job_is_past_its_deadline_where_deadlines_only_order() -> None:
    d, clock = dispatcher(end_missed_deadlines=False)
    d.submit(make_job("late").cpu("1").deadline(clock.now + 10).build())
    assert "deadline" not in d.explain("late")
    clock.advance(70.0)
    assert "past its deadline by 60s (deadlines order the queue; nothing is stopped)" in d.explain("late")


def _reply_cases() -> list[tuple[str, list[QueueConfig], list[tuple[str, str]]]]:
    """(case, queues, [(job id, how the binder answers its unit)]): "whole", "part" (all but the
    last task), "cancel" (job cancelled while in flight)."""
    drf = [QueueConfig(name="default", policy="drf")]
    capped = [QueueConfig(name="default", max_share=0.9), QueueConfig(name="other", guarantee=0.1)]
    answers = [("one", "whole"), ("gang", "whole"), ("mixed", "whole"), ("part", "part")]
    return [
        ("fifo", [], answers),
        ("drf", drf, answers),
        ("capped", capped, answers),
        ("cancelled", [], [("one", "cancel"), ("gang", "whole"), ("mixed", "cancel")]),
    ]


def _answer(d: Dispatcher, batches, answers: dict[str, str]) -> BindReply:
    acc = []
    for u in units(batches):
        how = answers.get(u.job.id, "whole")
        idx = list(u.task_indexes)
        if how == "part":
            idx = idx[:-1]
        elif how == "cancel":
            d.cancel(u.job.id)
        acc.append(AcceptedUnit.of(u.job.id, u.attempt, [Placement(i, "n1") for i in idx], 0.0))
    return BindReply(acc, [], [], [], 1)


@pytest.mark.parametrize(
    "case, queues, answers", _reply_cases(), ids=lambda c: c if isinstance(c, str) else ""
)
def test_whole_units_bound_in_one_step_match_the_per_task_path(case, queues, answers) -> None:
    """The reply's shortcut for units bound whole (Dispatcher.on_verdicts) leaves the dispatcher as
    the per-task transitions would: states, counts, usage per queue and tenant, what goes next."""

    def run(shortcut: bool) -> tuple[object, ...]:
        d, _ = dispatcher(*queues, shards=1)
        d.bind_whole = shortcut
        d.set_cluster_capacity(100 * CPU, 100 * GI, 8000)
        d.submit(make_job("one").cpu("1").tenant("t1").build())
        d.submit(make_job("gang").cpu("2").mem("1Gi").replicas(3).min_member(3).tenant("t2").build())
        d.submit(make_job("mixed").cpu("1").gpus(1).group("w").cpu("3").replicas(2).tenant("t1").build())
        d.submit(make_job("part").cpu("1").replicas(3).min_member(1).tenant("t2").build())
        ids = ["one", "gang", "mixed", "part"]
        d.on_reply(_answer(d, d.next_batches(), dict(answers)))
        again = [(u.job.id, u.task_indexes) for u in units(d.next_batches())]
        usage = {
            (kind, name, part): d.usage.usage(kind, name, part).tolist()
            for kind, names in (("queue", ("default",)), ("tenant", ("t1", "t2", "default")))
            for name in names
            for part in ("held", "inflight")
        }
        states = {j: d.task_states(j) for j in ids if j in d}
        records = {  # the counts the dispatcher's next decisions read (units' min_needed, finishing)
            j: (r.n_pending, r.n_scheduled, r.n_held, r.failures, r.where)
            for j in ids
            if (r := d._jobs.get(j)) is not None
        }
        before = (
            states,
            records,
            {j: d.job_state(j) for j in ids},
            d.pending_count(),
            d.in_flight_count(),
        )
        # End every bound task: the counts the shortcut kept must let each job finish.
        d.on_released(
            [f"{j}/{i}" for j, st in states.items() for i, s in enumerate(st) if s is B],
            TaskState.SUCCEEDED,
        )
        after = ({j: d.job_state(j) for j in ids}, d.usage.usage("queue", "default", "held").tolist())
        return before, usage, again, after

    shortcut, per_task = run(True), run(False)
    assert shortcut == per_task
    held = shortcut[1][("queue", "default", "held")]
    assert held[0] > 0  # something was bound: the comparison is not between two empty states


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_batch_reusing_an_id_known_to_the_store_only_names_its_place(kind: str, tmp_path) -> None:
    from gosched.common.store import Store

    store = MemoryStore() if kind == "memory" else Store(str(tmp_path / "s.db"))
    d, _ = dispatcher(store=store)
    d.submit(make_job("old").cpu("1").build())
    d2, _ = dispatcher(store=store)  # not restored: "old" is known to the store only
    with pytest.raises(SpecError, match="already exists") as err:
        d2.submit_many([make_job("new").cpu("1").build(), make_job("old").cpu("1").build()])
    assert err.value.field == "jobs[1].id"
    assert "new" not in d2  # all or none
    with pytest.raises(SpecError) as err:
        d2.submit(make_job("old").cpu("1").build())
    assert err.value.field == "id"


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_a_restart_reads_only_the_newest_finished_jobs_the_retention_keeps(kind, tmp_path):
    """Finished jobs past the retention stay stored and unread at a restart, as they left memory
    before it: an old one's id and submission id are still taken (the store says so), and every
    job not finished comes back."""
    from gosched.common.store import Store

    store = MemoryStore() if kind == "memory" else Store(str(tmp_path / "gosched.db"))
    d = Dispatcher(settings(), store=store, finished_retention=2)
    d.submit_many([replace(make_job(f"j{i}").cpu("1").build(), submission_id=f"s{i}") for i in range(5)])
    d.on_reply(accept(units(d.next_batches())))
    ran = [f"j{i}/0" for i in range(5)]
    store.set_task_states([(t, TaskState.BOUND) for t in ran])  # as the binder stores them
    for tid in ran[:4]:
        d.on_released([tid], TaskState.SUCCEEDED)
    store.set_task_states([(t, TaskState.SUCCEEDED) for t in ran[:4]])
    again = Dispatcher(settings(), store=store, finished_retention=2)
    assert again.restore() == 3  # j2 and j3 (the newest finished), and j4 (running)
    assert [j for j in ("j0", "j1", "j2", "j3", "j4") if j in again] == ["j2", "j3", "j4"]
    assert again.job_state("j4") is JobState.RUNNING
    with pytest.raises(SpecError, match="already exists"):
        again.submit(make_job("j0").cpu("1").build())
    assert again.submit(replace(make_job("j0").cpu("1").build(), submission_id="s0")) == "j0"  # a retry


def test_a_late_verdict_binds_no_task_the_binder_released_since():
    """The binder bound j/0 and then lost its node; the release reaches the dispatcher before the
    bind's verdict (the binder sends verdicts once durable, the control plane the release). The
    late verdict must not mark j/0 bound: the binder no longer holds it, and it would never run
    again. Seen once on Ray as a job read bound on no node."""
    d = Dispatcher(settings())
    d.submit(make_job("j").cpu("1").build())
    batch = d.next_batches()
    d.on_released(["j/0"], TaskState.PENDING)  # the node lost, after the bind
    d.on_reply(accept(units(batch)))  # the bind's verdict, late
    assert d.task_states("j") == [TaskState.PENDING]
    assert job_ids(d.next_batches()) == ["j"]  # queued again


def test_a_verdict_for_a_unit_taken_back_still_binds_it():
    """A unit taken back from a lost shard (requeue_in_flight) whose commit still reached the binder
    is bound: the binder holds it (nothing released it)."""
    d = Dispatcher(settings())
    d.submit(make_job("j").cpu("1").build())
    batch = d.next_batches()
    assert d.requeue_in_flight(batch[0].shard_id) == 1
    d.on_reply(accept(units(batch)))
    assert d.task_states("j") == [TaskState.BOUND]
