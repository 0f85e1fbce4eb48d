"""Queue policies: fifo, priority with aging, drf, weighted fair share, deadline."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gosched.common.config import QueueConfig, QueuePolicy
from gosched.dispatcher.queues import (
    DeadlineQueue,
    DrfQueue,
    FairShareQueue,
    FifoQueue,
    PriorityAgingQueue,
    make_queue,
)
from gosched.dispatcher.queues.base import HeapQueue
from gosched.dispatcher.usage import UsageTracker
from tests.builders import make_job
from tests.test_dispatcher_support import CPU, GI, Entry, accept, dispatcher, entries, job_ids, reject, units


def drain_ids(q) -> list[str]:
    out = []
    while (e := q.pop()) is not None:
        out.append(e.job_id)
    return out


# -- the queue classes on their own ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("policy", "cls"),
    [
        (QueuePolicy.FIFO, FifoQueue),
        (QueuePolicy.PRIORITY, PriorityAgingQueue),
        (QueuePolicy.DRF, DrfQueue),
        (QueuePolicy.FAIR, FairShareQueue),
        (QueuePolicy.DEADLINE, DeadlineQueue),
    ],
)
def test_every_policy_shares_the_queue_interface(policy, cls):
    q = make_queue(QueueConfig(name="q", policy=policy), UsageTracker())
    assert isinstance(q, cls)
    a, b, c = entries(make_job("a").build(), make_job("b").build(), make_job("c").build())
    for e in (a, b, c):
        q.push(e)
    assert len(q) == 3 and "b" in q
    assert q.remove("b") is True
    assert q.remove("b") is False
    assert len(q) == 2 and "b" not in q
    assert q.peek() is q.peek()
    q.push(a)  # pushing a queued job again replaces it
    assert len(q) == 2
    assert sorted(drain_ids(q)) == ["a", "c"]
    assert q.pop() is None and q.peek() is None and len(q) == 0


def test_fifo_is_submission_order_and_a_requeued_job_keeps_its_place():
    q: FifoQueue[Entry] = FifoQueue()
    es = entries(*(make_job(n).build() for n in "abcd"))
    for e in es:
        q.push(e)
    assert q.pop().job_id == "a"
    assert q.pop().job_id == "b"
    q.push(es[0])  # a comes back (retry): still first
    assert drain_ids(q) == ["a", "c", "d"]


def test_heap_queue_compacts_after_many_removals():
    q: FifoQueue[Entry] = FifoQueue()
    es = entries(*(make_job(f"j{i}").build() for i in range(5000)))
    for e in es:
        q.push(e)
    for e in es[:4000]:
        q.remove(e.job_id)
    assert len(q._heap) + len(q._run) < 5000  # stale items were dropped
    assert drain_ids(q) == [f"j{i}" for i in range(4000, 5000)]


@pytest.mark.parametrize(
    ("aging", "jobs", "expected"),
    [
        # (id, priority, submit_time): no aging -> by priority, then submission
        (0.0, [("lo", 0, 0.0), ("hi", 10, 100.0), ("mid", 5, 50.0)], ["hi", "mid", "lo"]),
        # aging 1/s: lo has waited 100 s longer -> effective 100 vs 10
        (1.0, [("lo", 0, 0.0), ("hi", 10, 100.0)], ["lo", "hi"]),
        # aging 0.05/s: 100 s is worth 5 < 10 -> hi first
        (0.05, [("lo", 0, 0.0), ("hi", 10, 100.0)], ["hi", "lo"]),
        # a tie in effective priority goes to the earlier submission
        (0.1, [("lo", 0, 0.0), ("hi", 10, 100.0)], ["lo", "hi"]),
    ],
)
def test_priority_with_aging_order(aging, jobs, expected):
    q: PriorityAgingQueue[Entry] = PriorityAgingQueue(aging)
    for e in entries(*(make_job(i).priority(p).submitted(t).build() for i, p, t in jobs)):
        q.push(e)
    assert drain_ids(q) == expected


def test_effective_priority_grows_with_waiting():
    q: PriorityAgingQueue[Entry] = PriorityAgingQueue(2.0)
    (e,) = entries(make_job("j").priority(3).submitted(10.0).build())
    assert q.effective_priority(e, now=10.0) == 3.0
    assert q.effective_priority(e, now=15.0) == 13.0


def test_deadline_is_earliest_first_and_no_deadline_last_by_submission():
    q: DeadlineQueue[Entry] = DeadlineQueue()
    jobs = [
        make_job("none1").build(),
        make_job("late").deadline(300.0).build(),
        make_job("none2").build(),
        make_job("soon").deadline(100.0).build(),
        make_job("mid").deadline(200.0).build(),
    ]
    for e in entries(*jobs):
        q.push(e)
    assert drain_ids(q) == ["soon", "mid", "late", "none1", "none2"]


@pytest.mark.parametrize(
    ("jobs", "order"),
    [
        # (name, deadline, time_limit): the latest start (deadline less time_limit) goes first
        ([("short", 100.0, 10.0), ("long", 200.0, 150.0)], ["long", "short"]),
        ([("long", 200.0, 150.0), ("short", 100.0, 10.0)], ["long", "short"]),
        # no time_limit: the deadline is the latest start
        ([("bare", 60.0, None), ("limited", 100.0, 30.0)], ["bare", "limited"]),
        # equal latest starts: the earlier deadline, then submission
        ([("b", 200.0, 100.0), ("a", 150.0, 50.0), ("c", 150.0, 50.0)], ["a", "c", "b"]),
    ],
)
def test_deadline_queue_runs_the_latest_start_first(
    jobs: list[tuple[str, float, float | None]], order: list[str]
) -> None:
    """Least laxity first: the job the deadline check would cancel first is tried first."""
    q: DeadlineQueue[Entry] = DeadlineQueue()
    built = []
    for name, deadline, limit in jobs:
        b = make_job(name).deadline(deadline)
        built.append((b if limit is None else b.time_limit(limit)).build())
    for e in entries(*built):
        q.push(e)
    assert drain_ids(q) == order


def test_drf_queue_follows_usage_changes():
    usage = UsageTracker()
    usage.set_capacity(100 * CPU, 0, 0)
    q: DrfQueue[Entry] = DrfQueue(usage)
    for e in entries(*(make_job(f"{t}{i}").tenant(t).build() for i in range(3) for t in "ab")):
        q.push(e)
    usage.add_held("q", "a", 30 * CPU, 0, 0)
    assert q.peek().job.tenant == "b"
    usage.add_held("q", "b", 40 * CPU, 0, 0)
    assert q.peek().job.tenant == "a"
    usage.add_held("q", "b", -40 * CPU, 0, 0)  # b's usage drops: it must be re-ranked
    assert q.peek().job.tenant == "b"
    usage.set_capacity(100 * CPU, 0, 0)
    assert q.pop().job_id == "b0"


def test_tenant_queue_ties_go_to_the_oldest_head():
    usage = UsageTracker()
    q: FairShareQueue[Entry] = FairShareQueue(usage)
    for e in entries(*(make_job(f"{t}{i}").tenant(t).build() for i in range(2) for t in "xyz")):
        q.push(e)
    assert drain_ids(q) == ["x0", "y0", "z0", "x1", "y1", "z1"]


# -- through the dispatcher ----------------------------------------------------------------------------
def test_fifo_dispatch_order():
    d, _ = dispatcher(QueueConfig(name="default", policy="fifo"), shards=1)
    d.submit_many([make_job(n).cpu("1").priority(p).build() for n, p in [("a", 0), ("b", 100), ("c", 5)]])
    assert job_ids(d.next_batches()) == ["a", "b", "c"]


def test_priority_aging_old_low_priority_job_overtakes_new_high_one():
    d, clock = dispatcher(QueueConfig(name="default", policy="priority", aging_per_s=0.5), shards=1)
    d.submit(make_job("old-low").cpu("1").priority(0).build())
    clock.advance(60.0)  # effective: old-low 30
    d.submit(make_job("new-high").cpu("1").priority(20).build())  # effective 20
    clock.advance(1.0)
    assert job_ids(d.next_batches(max_units=1)) == ["old-low"]
    assert job_ids(d.next_batches(max_units=1)) == ["new-high"]


def test_priority_aging_nothing_starves_under_a_stream_of_high_priority_jobs():
    d, clock = dispatcher(QueueConfig(name="default", policy="priority", aging_per_s=1.0), shards=1)
    d.submit(make_job("low").cpu("1").priority(0).build())
    served_at = None
    for step in range(100):
        clock.advance(1.0)
        d.submit(make_job(f"hi{step}").cpu("1").priority(50).build())
        (u,) = units(d.next_batches(max_units=1))
        d.on_reply(accept([u]))
        if u.job.id == "low":
            served_at = step
            break
    # every high job arrives with effective 50; low reaches 50 after 50 s of waiting
    assert served_at is not None and served_at <= 51


def test_drf_cpu_heavy_and_gpu_heavy_tenants_end_with_equal_dominant_shares():
    d, _ = dispatcher(QueueConfig(name="default", policy="drf"), shards=1, batch_size=1)
    d.set_cluster_capacity(100 * CPU, 1000 * GI, 40 * 1000)
    # A: 4 CPU per task (4% cpu); B: 1 CPU + 2 GPUs per task (5% gpu)
    d.submit_many([make_job(f"a{i}").tenant("A").cpu("4").mem("1Gi").build() for i in range(60)])
    d.submit_many([make_job(f"b{i}").tenant("B").cpu("1").mem("1Gi").gpus(2).build() for i in range(60)])
    for _ in range(30):  # one unit per round, the reply feeds usage back before the next
        us = units(d.next_batches())
        d.on_reply(accept(us))
    shares = d.usage.shares("tenant")
    # 30 tasks: A at 4% each and B at 5% each balance at 17 / 13 (68% cpu vs 65% gpu)
    assert d.usage.usage("tenant", "A", "held").tolist() == [68 * CPU, 17 * GI, 0]
    assert d.usage.usage("tenant", "B", "held").tolist() == [13 * CPU, 13 * GI, 26_000]
    assert abs(shares["A"] - shares["B"]) <= 0.05  # within one task's dominant share


def test_drf_counts_units_in_flight():
    """With no replies in between, one call still interleaves the tenants."""
    d, _ = dispatcher(QueueConfig(name="default", policy="drf"), shards=1)
    d.set_cluster_capacity(100 * CPU, 0, 0)
    d.submit_many([make_job(f"a{i}").tenant("A").cpu("2").build() for i in range(10)])
    d.submit_many([make_job(f"b{i}").tenant("B").cpu("1").build() for i in range(10)])
    order = job_ids(d.next_batches(max_units=9))
    assert "".join(j[0] for j in order) == "abbabbabb"  # 2% per a-task, 1% per b-task


def test_drf_tenant_weights():
    d, _ = dispatcher(
        QueueConfig(name="default", policy="drf", tenant_weights={"a": 3.0}), shards=1, batch_size=1
    )
    d.set_cluster_capacity(100 * CPU, 0, 0)
    d.submit_many([make_job(f"a{i}").tenant("a").cpu("1").build() for i in range(50)])
    d.submit_many([make_job(f"b{i}").tenant("b").cpu("1").build() for i in range(50)])
    for _ in range(40):
        d.on_reply(accept(units(d.next_batches())))
    shares = d.usage.shares("tenant")
    assert shares["a"] / shares["b"] == pytest.approx(3.0, rel=0.1)


def test_fair_share_weights_two_to_one_give_usage_two_to_one():
    d, _ = dispatcher(
        QueueConfig(name="default", policy="fair", tenant_weights={"a": 2.0, "b": 1.0}),
        shards=1,
        batch_size=4,
    )
    d.set_cluster_capacity(64 * CPU, 256 * GI, 16 * 1000)
    d.submit_many([make_job(f"a{i}").tenant("a").cpu("1").mem("4Gi").build() for i in range(100)])
    d.submit_many([make_job(f"b{i}").tenant("b").cpu("1").mem("4Gi").build() for i in range(100)])
    for _ in range(12):
        d.on_reply(accept(units(d.next_batches())))
    a = d.usage.usage("tenant", "a", "held")
    b = d.usage.usage("tenant", "b", "held")
    assert a[0] + b[0] == 48 * CPU
    assert a[0] / b[0] == pytest.approx(2.0, abs=0.1)


def test_fair_share_uses_the_mean_of_the_resource_shares():
    d, _ = dispatcher(QueueConfig(name="default", policy="fair"), shards=1)
    d.set_cluster_capacity(100 * CPU, 100 * GI, 0)  # gpu has no capacity: mean over cpu, memory
    d.submit(make_job("a0").tenant("A").cpu("10").mem("10Gi").build())  # 10% cpu, 10% mem -> 0.10
    d.submit(make_job("b0").tenant("B").cpu("16").build())  # 16% cpu, 0% mem -> 0.08
    d.on_reply(accept(units(d.next_batches())))
    d.submit(make_job("a1").tenant("A").cpu("1").build())
    d.submit(make_job("b1").tenant("B").cpu("1").build())
    assert job_ids(d.next_batches(max_units=1)) == ["b1"]  # by DRF it would be A (0.10 < 0.16)
    assert d.usage.tenant_mean_share("A") == pytest.approx(0.10)


def test_deadline_dispatch_order():
    d, _ = dispatcher(QueueConfig(name="default", policy="deadline"), shards=1)
    d.submit(make_job("no-deadline").cpu("1").build())
    d.submit(make_job("friday").cpu("1").deadline(5_000.0).build())
    d.submit(make_job("monday").cpu("1").deadline(2_000.0).build())
    assert job_ids(d.next_batches()) == ["monday", "friday", "no-deadline"]


@pytest.mark.parametrize("policy", list(QueuePolicy))
def test_retried_job_keeps_its_place_in_every_policy(policy):
    d, _ = dispatcher(QueueConfig(name="default", policy=policy), shards=1)
    d.submit_many([make_job(f"j{i}").cpu("1").submitted(float(i + 1)).build() for i in range(3)])
    (u0,) = units(d.next_batches(max_units=1))
    assert u0.job.id == "j0"
    d.on_reply(reject([u0]))
    assert job_ids(d.next_batches()) == ["j0", "j1", "j2"]


def test_head_run_is_the_runs_head_up_to_the_first_heap_item_and_none_past_stale_items() -> None:
    q: FifoQueue[Entry] = FifoQueue()
    es = entries(*(make_job(n).build() for n in "abcde"))
    q.push_many(es[1:])
    assert [e.job_id for e in q.head_run(3)] == ["b", "c", "d"]
    assert [e.job_id for e in q.head_run(9)] == ["b", "c", "d", "e"]
    q.drop_run(q.head_run(2))  # b and c, as two pops
    assert len(q) == 2 and "b" not in q and q.peek() is es[3]
    q.push(es[0])  # a retry ahead of the run: the heap's, popped first
    assert q.head_run(5) == []
    assert q.pop() is es[0] and [e.job_id for e in q.head_run(5)] == ["d", "e"]
    q.remove("d")  # a stale item at the run's head: one by one again
    assert q.head_run(5) == [] and drain_ids(q) == ["e"]
    q.push_many(es[:2])
    q.drop_run(q.head_run(5))  # all of it
    assert len(q) == 0 and q.peek() is None and q.head_run(5) == []


class _Keyed(HeapQueue[Entry]):
    """Keyed by the entry's seq, which the test draws freely (in order, out of order, tied)."""

    def key(self, entry: Entry) -> int:
        return entry.seq


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["push", "pop", "peek", "remove", "compact", "run"]),
            st.integers(0, 7),
            st.integers(0, 20),
        )
    )
)
def test_the_heap_queue_pops_in_key_then_arrival_order_whatever_the_pushes(ops) -> None:
    """Against a plain model: the live entries sorted by (key, push number). Pushes that arrive in
    order take the sorted run, the others the heap; pops must interleave both exactly. The head a
    peek found is kept for the pop after it: a push, a removal or a compaction in between must not
    let a stale head out. head_run must give the next entries in that order (maybe fewer, or none),
    and drop_run pop the ones taken of them as that many pops would."""
    q = _Keyed()
    model: dict[str, tuple[int, int]] = {}  # job id -> (key, push number) of its live entry
    jobs = {i: make_job(f"j{i}").build() for i in range(8)}
    pushes = 0

    def first() -> str | None:
        return min(model, key=model.__getitem__) if model else None

    for op, i, key in ops:
        job_id = f"j{i}"
        if op == "peek":
            got = q.peek()
            assert (None if got is None else got.job_id) == first()
        elif op == "push":
            pushes += 1
            q.push(Entry(jobs[i], key))
            model[job_id] = (key, pushes)
        elif op == "remove":
            assert q.remove(job_id) is (model.pop(job_id, None) is not None)
        elif op == "compact":  # as many removals trigger it: stale items dropped, order kept
            q._compact()
        elif op == "run":
            got = [e.job_id for e in q.head_run(i)]
            assert len(got) <= i and got == sorted(model, key=model.__getitem__)[: len(got)]
            taken = q.head_run(i)[: key % (len(got) + 1)]
            q.drop_run(taken)
            for e in taken:
                del model[e.job_id]
        else:
            want = first()
            got = q.pop()
            assert (None if got is None else got.job_id) == want
            model.pop(want, None)  # type: ignore[arg-type]
        assert len(q) == len(model)
        head = q.peek()
        assert (None if head is None else head.job_id) == first()
    assert drain_ids(q) == sorted(model, key=model.__getitem__)
