"""Capacity across queues: guarantees, borrowing up to max_share, reclaim_from."""

import pytest

from gosched.common.config import QueueConfig
from gosched.dispatcher.capacity import NOT_ELIGIBLE, CapacityPlanner
from gosched.scheduler_shard.plugins.preemption import quota_of
from tests.builders import make_job
from tests.test_dispatcher_support import CPU, GI, accept, dispatcher, evict, units

QUEUES = (
    QueueConfig(name="a", guarantee=0.6, max_share=0.8),
    QueueConfig(name="b", guarantee=0.3, max_share=0.5),
    QueueConfig(name="c", guarantee=0.1, max_share=1.0),
)


def cluster(**kw):
    d, clock = dispatcher(*QUEUES, shards=2, **kw)
    d.set_cluster_capacity(100 * CPU, 1000 * GI, 0)  # 1 CPU task = 1% of the cluster
    return d, clock


def submit(d, queue: str, n: int, cpu: str = "1") -> None:
    d.submit_many([make_job(f"{queue}{i}").queue(queue).cpu(cpu).mem("1Gi").build() for i in range(n)])


def test_a_lone_queue_is_dispatched_up_to_its_max_share_and_no_further():
    d, _ = cluster()
    submit(d, "a", 100)
    first = units(d.next_batches())
    assert len(first) == 80  # in-flight units count: one call stops at 80%
    assert d.queue_shares()["a"] == pytest.approx(0.8)
    assert d.next_batches() == []
    d.on_reply(accept(first))
    assert d.next_batches() == []  # bound usage holds it at 80% too
    assert d.pending_count() == 20
    assert "queue a is at 80.0% of the cluster" in d.explain("a80")
    assert "to 81.0%, above its max_share 80%" in d.explain("a80")
    assert all(quota_of(u).reclaim == frozenset() for u in first)


def test_other_queues_come_first_and_reclaim_from_the_borrower():
    d, _ = cluster()
    submit(d, "a", 100)
    d.on_reply(accept(units(d.next_batches())))  # a borrows: 80% against a 60% guarantee
    submit(d, "b", 10)
    submit(d, "c", 5)
    submit(d, "a", 0)
    us = units(d.next_batches())
    assert {u.job.queue for u in us} == {"b", "c"}
    assert len(us) == 15
    assert all(quota_of(u).reclaim == frozenset({"a"}) for u in us)


def test_below_guarantee_order_is_by_share_over_guarantee():
    d, _ = dispatcher(*QUEUES, shards=1)
    d.set_cluster_capacity(100 * CPU, 0, 0)
    submit(d, "b", 10)
    submit(d, "c", 10)
    order = [u.job.queue for u in units(d.next_batches(max_units=8))]
    # b (30%) and c (10%) both start at 0: b first (config order); then the smaller share/guarantee:
    # b at 1/30 vs c at 0 -> c; then b 1/30 vs c 1/10 -> b ... b gets three for each of c's
    assert order == ["b", "c", "b", "b", "b", "c", "b", "b"]


def test_units_above_the_guarantee_reclaim_nothing():
    d, _ = cluster()
    submit(d, "b", 60)
    us = units(d.next_batches())
    assert len(us) == 50  # b may borrow to 50%
    reclaiming = [u for u in us if quota_of(u).reclaim]
    assert reclaiming == []  # nobody else borrows


def test_borrowers_are_ordered_by_share():
    d, _ = dispatcher(*QUEUES, shards=1)
    d.set_cluster_capacity(100 * CPU, 0, 0)
    submit(d, "a", 70)
    submit(d, "c", 30)
    got = units(d.next_batches())
    by_queue = {q: sum(1 for u in got if u.job.queue == q) for q in "ac"}
    # a to its 60% guarantee and c to its 10% first; then both borrow, smallest share first;
    # c has only 30 jobs, a stops at 80%
    assert by_queue == {"a": 70, "c": 30}
    assert d.queue_shares() == {"a": pytest.approx(0.7), "b": 0.0, "c": pytest.approx(0.3)}


def test_max_share_blocks_the_queue_head_but_not_other_queues():
    d, _ = cluster()
    submit(d, "b", 1, cpu="60")  # 60% > b's 50% cap: never dispatched
    submit(d, "c", 3)
    us = units(d.next_batches())
    assert [u.job.queue for u in us] == ["c", "c", "c"]
    assert "cannot run in queue b: its smallest unit (1 task(s)" in d.explain("b0")
    assert "needs 60.0% of the cluster, above the queue's max_share 50%" in d.explain("b0")


def test_released_usage_lets_a_capped_queue_go_on():
    d, _ = cluster()
    submit(d, "a", 85)
    first = units(d.next_batches())
    d.on_reply(accept(first))
    assert len(first) == 80
    d.on_reply(evict(*((u.job.id, 0) for u in first[:3])))
    # three evicted tasks are pending again and compete with the five waiting jobs for three slots
    assert len(units(d.next_batches())) == 3


def test_without_cluster_capacity_nothing_is_capped():
    d, _ = dispatcher(*QUEUES, shards=1)
    submit(d, "b", 200)
    assert len(units(d.next_batches())) == 200


# -- the planner on its own --------------------------------------------------------------------------
PLANNER = CapacityPlanner(QUEUES)


@pytest.mark.parametrize(
    ("queue", "share", "expected"),
    [
        (0, 0.0, -2.0),  # below guarantee: share/guarantee - 2
        (0, 0.3, -1.5),
        (0, 0.6, 1.0),  # at the guarantee: borrowing, ranked by share/guarantee
        (0, 0.72, 1.2),
        (0, 0.8, NOT_ELIGIBLE),  # at max_share
        (1, 0.15, -1.5),
        (1, 0.5, NOT_ELIGIBLE),
        (2, 0.12, 1.2),  # a borrower guaranteed 10% at 12% ranks with one guaranteed 60% at 72%
        (2, 1.5, 15.0),  # max_share 1.0 is not enforced here
    ],
)
def test_rank(queue, share, expected):
    assert PLANNER.rank(queue, share) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("guarantees", "entitled"),
    [
        ((0.6, 0.1), (0.6, 0.1)),
        ((0.6, 0.0, 0.0), (0.6, 0.2, 0.2)),  # no guarantee: an equal part of the unpromised 40%
        ((0.0, 0.0), (0.5, 0.5)),  # none at all: by share, as before
        ((0.7, 0.3, 0.0), (0.7, 0.3, 1e-3)),  # all promised: a sliver, it borrows last
    ],
)
def test_borrowers_are_measured_against_their_entitlement(guarantees, entitled):
    planner = CapacityPlanner([QueueConfig(name=f"q{i}", guarantee=g) for i, g in enumerate(guarantees)])
    assert planner.entitled == pytest.approx(list(entitled))


@pytest.mark.parametrize(
    ("queue", "after", "fits"),
    [(0, 0.8, True), (0, 0.8000001, False), (1, 0.49, True), (1, 0.51, False), (2, 1.2, True)],
)
def test_fits(queue, after, fits):
    assert PLANNER.fits(queue, after) is fits


@pytest.mark.parametrize(
    ("shares", "borrowing"),
    [
        ([0.0, 0.0, 0.0], set()),
        ([0.6, 0.3, 0.1], set()),
        ([0.7, 0.3, 0.0], {"a"}),
        ([0.1, 0.4, 0.2], {"b", "c"}),
    ],
)
def test_borrowing(shares, borrowing):
    assert PLANNER.borrowing(shares) == frozenset(borrowing)
