"""Priority aging capped at aging_max_s (Slurm's PriorityMaxAge): effective priority =
priority + aging_per_s * min(max(0, now - submit_time), aging_max_s), ties by seq."""

import math
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gosched.common.aging import StandingRule, standing_from
from gosched.common.config import QueueConfig, QueuePolicy
from gosched.dispatcher.queues import PriorityAgingQueue, make_queue
from gosched.dispatcher.queues import priority as priority_module
from gosched.dispatcher.usage import UsageTracker
from tests.builders import make_job
from tests.test_dispatcher_queues import Entry, drain_ids
from tests.test_dispatcher_support import Clock, dispatcher, job_ids

INF = math.inf


def reference_eff(aging: float, max_age: float, priority: int, submit: float, now: float) -> float:
    """The definition, written independently of the queue (no aging when either knob is 0)."""
    if aging == 0 or max_age == 0:
        return float(priority)
    return priority + aging * min(max(0.0, now - submit), max_age)


def queue(aging: float, max_age: float, clock: Clock) -> PriorityAgingQueue[Entry]:
    return PriorityAgingQueue(aging, max_age, clock)


def push_all(q: PriorityAgingQueue[Entry], jobs: list[tuple[str, int, float]]) -> dict[str, Entry]:
    out = {}
    for seq, (job_id, prio, submit) in enumerate(jobs):
        out[job_id] = Entry(make_job(job_id).priority(prio).submitted(submit).build(), seq)
        q.push(out[job_id])
    return out


# -- order at one instant --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("aging", "max_age", "jobs", "now", "expected"),
    [
        # (id, priority, submit_time). Uncapped, old-low (waited 1000 s) would beat new-high:
        # 1000 vs 60. Capped at 30 s it is worth 30 < 60.
        (1.0, INF, [("old-low", 0, 0.0), ("new-high", 50, 990.0)], 1000.0, ["old-low", "new-high"]),
        (1.0, 30.0, [("old-low", 0, 0.0), ("new-high", 50, 990.0)], 1000.0, ["new-high", "old-low"]),
        # within the cap (500 s) old-low still overtakes: 500 vs 60
        (1.0, 500.0, [("old-low", 0, 0.0), ("new-high", 50, 990.0)], 1000.0, ["old-low", "new-high"]),
        # both capped: by priority alone, whatever they waited
        (2.0, 10.0, [("a", 1, 0.0), ("b", 3, 500.0), ("c", 2, 100.0)], 1000.0, ["b", "c", "a"]),
        # capped (5 + 2*10 = 25) ties an ageing one (15 + 2*5 = 25): seq decides, either way round
        (2.0, 10.0, [("capped", 5, 0.0), ("ageing", 15, 995.0)], 1000.0, ["capped", "ageing"]),
        (2.0, 10.0, [("ageing", 15, 995.0), ("capped", 5, 0.0)], 1000.0, ["ageing", "capped"]),
        # aging 0 / aging_max_s 0: priority, then seq, however long they waited
        (0.0, 30.0, [("old", 0, 0.0), ("hi", 9, 999.0), ("hi2", 9, 10.0)], 1000.0, ["hi", "hi2", "old"]),
        (5.0, 0.0, [("old", 0, 0.0), ("hi", 9, 999.0), ("hi2", 9, 10.0)], 1000.0, ["hi", "hi2", "old"]),
        # a submit_time ahead of the clock counts as no wait (10 vs 3 + 5), not as a negative one
        # (the static key alone would rank it at 10 - 50)
        (1.0, 30.0, [("past", 3, 995.0), ("future", 10, 1050.0)], 1000.0, ["future", "past"]),
        (1.0, INF, [("past", 3, 995.0), ("future", 10, 1050.0)], 1000.0, ["future", "past"]),
    ],
)
def test_order_at_one_instant(aging, max_age, jobs, now, expected):
    q = queue(aging, max_age, Clock(now))
    entries = push_all(q, jobs)
    by_definition = sorted(
        entries.values(),
        key=lambda e: (-reference_eff(aging, max_age, e.job.priority, e.job.submit_time, now), e.seq),
    )
    assert [e.job_id for e in by_definition] == expected  # the table agrees with the definition
    assert drain_ids(q) == expected


@pytest.mark.parametrize(
    ("aging", "max_age", "priority", "submit", "now", "expected"),
    [
        (2.0, 10.0, 3, 100.0, 104.0, 11.0),  # ageing
        (2.0, 10.0, 3, 100.0, 110.0, 23.0),  # at the cap
        (2.0, 10.0, 3, 100.0, 1e9, 23.0),  # long past it
        (2.0, 10.0, 3, 100.0, 90.0, 3.0),  # submit_time ahead: no wait
        (2.0, INF, 3, 100.0, 1100.0, 2003.0),  # no cap
        (0.0, 10.0, 3, 100.0, 1100.0, 3.0),  # no aging
        (2.0, 0.0, 3, 100.0, 1100.0, 3.0),  # no aging either
    ],
)
def test_effective_priority_is_capped(aging, max_age, priority, submit, now, expected):
    q = queue(aging, max_age, Clock())
    (e,) = push_all(q, [("j", priority, submit)]).values()
    assert q.effective_priority(e, now) == expected


@pytest.mark.parametrize(
    ("policy", "aging", "max_age", "bound_at", "expected"),
    [
        (QueuePolicy.PRIORITY, 2.0, 10.0, 104.5, 12),  # 3 + 9: whole steps only
        (QueuePolicy.PRIORITY, 2.0, 10.0, 1e9, 23),  # capped
        (QueuePolicy.PRIORITY, 2.0, 10.0, 100.2, None),  # aged to 3.4: no whole step over 3
        (QueuePolicy.PRIORITY, 0.0, 10.0, 1e9, None),  # no aging
        (QueuePolicy.FIFO, 2.0, 10.0, 1e9, None),  # not a priority queue
    ],
)
def test_a_recovered_task_gets_its_standing_back_from_its_bound_at(
    policy, aging, max_age, bound_at, expected
):
    """StandingRule (the binder's recovery) reads the queue's aging as the dispatcher's does."""
    config = QueueConfig(name="q", policy=policy, aging_per_s=aging, aging_max_s=max_age)
    job = make_job("j").queue("q").priority(3).submitted(100.0).build()
    assert StandingRule([config])(job, bound_at) == expected
    q = queue(aging, max_age, Clock())
    (e,) = push_all(q, [("j", 3, 100.0)]).values()
    if policy is QueuePolicy.PRIORITY:
        assert standing_from(3, q.effective_priority(e, bound_at)) == expected
    assert bool(StandingRule([config])) is (policy is QueuePolicy.PRIORITY and aging > 0)  # any queue ages


@pytest.mark.parametrize(
    ("priority", "aged", "expected"),
    [(-1, -0.9, None), (-2, -0.5, -1), (3, 3.99, None), (3, 4.0, 4), (-1, 0.0, 0)],
)
def test_a_standing_counts_whole_steps_rounded_down(priority, aged, expected):
    """Not toward zero: a job of priority -1 that waited a moment has gained no step."""
    assert standing_from(priority, aged) == expected


@pytest.mark.parametrize(("aging", "max_age"), [(-1.0, 10.0), (INF, 10.0), (1.0, -1.0), (1.0, math.nan)])
def test_bad_knobs_are_refused(aging, max_age):
    with pytest.raises(ValueError):
        PriorityAgingQueue(aging, max_age)


# -- jobs crossing the cap (or their submit_time) while queued ---------------------------------------------
def test_a_job_reaching_the_cap_while_queued_is_overtaken():
    clock = Clock(1000.0)
    q = queue(1.0, 60.0, clock)
    old = Entry(make_job("old").priority(0).submitted(1000.0).build(), 1)
    new = Entry(make_job("new").priority(30).submitted(1050.0).build(), 2)
    q.push(old)
    clock.advance(50.0)
    q.push(new)
    seen = []
    for _ in range(3):  # t = 1050 (50 vs 30), 1080 (60 vs 60: seq), 1081 (60 vs 61)
        seen.append(q.peek().job_id)
        clock.advance(30.0 if len(seen) == 1 else 1.0)
    assert seen == ["old", "old", "new"]
    assert q.peek() is new and q.peek() is new


def test_pop_right_after_peek_takes_the_peeked_entry_even_if_the_clock_moved():
    clock = Clock(1000.0)
    q = queue(1.0, 60.0, clock)
    push_all(q, [("old", 0, 1000.0)])
    clock.advance(50.0)
    new = Entry(make_job("new").priority(30).submitted(1050.0).build(), 5)
    q.push(new)
    assert q.peek().job_id == "old"
    clock.advance(100.0)  # old is capped now: a fresh look would give new
    assert q.pop().job_id == "old"
    assert q.pop() is new and q.pop() is None


def test_a_future_submit_time_starts_ageing_when_it_comes():
    clock = Clock(1000.0)
    q = queue(1.0, 100.0, clock)
    push_all(q, [("now", 5, 1000.0), ("later", 6, 1020.0)])  # seqs 0, 1
    assert q.peek().job_id == "later"  # 6 (not ageing yet) vs 5
    clock.advance(10.0)
    assert q.peek().job_id == "now"  # 6 vs 15
    clock.advance(20.0)
    assert q.peek().job_id == "now"  # 16 vs 35
    clock.advance(200.0)  # both capped: 106 vs 105
    assert q.peek().job_id == "later"  # (a pop alone would take what the last peek showed)
    assert drain_ids(q) == ["later", "now"]


# -- remove and replace, in each phase -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("victim", "expected"),
    [
        ("ageing", ["capped", "pending"]),
        ("capped", ["ageing", "pending"]),
        ("pending", ["ageing", "capped"]),
    ],
)
def test_remove_from_each_phase(victim, expected):
    clock = Clock(1000.0)
    q = queue(1.0, 10.0, clock)
    # ageing: 20 + 5; capped: 14 + 10; pending: 3
    push_all(q, [("ageing", 20, 995.0), ("capped", 14, 0.0), ("pending", 3, 2000.0)])
    assert q.peek().job_id == "ageing"
    assert q.remove(victim) is True
    assert q.remove(victim) is False
    assert victim not in q and len(q) == 2
    assert drain_ids(q) == expected
    assert len(q) == 0 and q.peek() is None


@pytest.mark.parametrize(
    ("job_id", "priority", "submit", "expected"),
    [
        # effective now: ageing 25, capped 24, pending 3
        ("capped", 30, 0.0, ["capped", "ageing", "pending"]),  # capped again: 40
        ("capped", 14, 999.0, ["ageing", "capped", "pending"]),  # now ageing: 15
        ("ageing", 20, 0.0, ["ageing", "capped", "pending"]),  # now capped: 30
        ("ageing", 0, 2000.0, ["capped", "pending", "ageing"]),  # now pending: 0 < 3
        ("pending", 3, 0.0, ["ageing", "capped", "pending"]),  # now capped: 13
        ("pending", 50, 990.0, ["pending", "ageing", "capped"]),  # now ageing: 60
    ],
)
def test_a_push_of_a_queued_job_replaces_it_across_phases(job_id, priority, submit, expected):
    clock = Clock(1000.0)
    q = queue(1.0, 10.0, clock)
    entries = push_all(q, [("ageing", 20, 995.0), ("capped", 14, 0.0), ("pending", 3, 2000.0)])
    assert q.peek().job_id == "ageing"
    q.push(Entry(make_job(job_id).priority(priority).submitted(submit).build(), entries[job_id].seq))
    assert len(q) == 3
    assert drain_ids(q) == expected


def test_popping_a_younger_ageing_job_keeps_the_older_ones_due_time():
    """The pop drops the popped job's due-time item only when it is that job's: the older job in
    front must still reach its cap."""
    clock = Clock(1000.0)
    q = queue(1.0, 10.0, clock)
    push_all(q, [("older", 0, 995.0), ("younger", 20, 999.0)])  # 5 vs 21
    assert q.pop().job_id == "younger"
    clock.advance(20.0)  # older capped: 10
    push_all(q, [("fresh", 7, 1015.0)])  # 12 (seq 0: it would lose a tie)
    assert q.peek().job_id == "fresh"
    assert drain_ids(q) == ["fresh", "older"]


def test_removing_the_peeked_head_lets_the_next_one_out():
    clock = Clock(1000.0)
    q = queue(1.0, 10.0, clock)
    push_all(q, [("a", 50, 0.0), ("b", 40, 0.0), ("c", 0, 999.0)])
    assert q.peek().job_id == "a"
    q.remove("a")
    assert q.pop().job_id == "b"


def test_stale_items_are_compacted_behind_a_job_that_stays():
    """Popped jobs leave their due-time items behind the oldest job's; a queue with one job left
    must not hold thousands of items."""
    clock = Clock(10.0)
    q = queue(1.0, 1e9, clock)
    n = 10_000
    push_all(q, [("anchor", -1_000_000, 0.0)] + [(f"j{i}", i, 1.0) for i in range(n)])
    popped = [q.pop().job_id for _ in range(n)]  # highest priority first: the anchor stays
    assert popped[:2] == [f"j{n - 1}", f"j{n - 2}"] and len(q) == 1
    held = len(q._run) + len(q._heap) + len(q._frozen) + len(q._due_run) + len(q._due_heap) + len(q._wake)
    assert held <= 4 * len(q) + 2 * priority_module._SLACK  # not the ~n items popped jobs left
    assert q.pop().job_id == "anchor"


# -- through make_queue and the dispatcher ----------------------------------------------------------------
def test_make_queue_passes_the_cap_and_the_clock():
    clock = Clock(1000.0)
    config = QueueConfig(name="q", policy=QueuePolicy.PRIORITY, aging_per_s=1.0, aging_max_s=30.0)
    q = make_queue(config, UsageTracker(), clock)
    assert isinstance(q, PriorityAgingQueue) and q.aging_max_s == 30.0
    push_all(q, [("old-low", 0, 0.0), ("new-high", 50, 990.0)])
    assert drain_ids(q) == ["new-high", "old-low"]  # 30 vs 60; uncapped: 1000 vs 60
    q2 = make_queue(config, UsageTracker(), clock)
    push_all(q2, [("old-low", 0, 960.0), ("new-high", 20, 990.0)])
    # on `clock`: 30 (capped) vs 30, seq decides; on time.time() both capped: 30 vs 50
    assert drain_ids(q2) == ["old-low", "new-high"]


def test_dispatcher_ages_on_its_own_clock_and_caps():
    capped = QueueConfig(name="default", policy="priority", aging_per_s=1.0, aging_max_s=30.0)
    d, clock = dispatcher(capped, shards=1)
    d.submit(make_job("old-low").cpu("1").priority(0).build())
    clock.advance(100.0)  # uncapped, old-low would be at 100
    d.submit(make_job("new-high").cpu("1").priority(40).build())
    clock.advance(1.0)  # old-low 30 (capped), new-high 41
    assert job_ids(d.next_batches(max_units=1)) == ["new-high"]
    assert job_ids(d.next_batches(max_units=1)) == ["old-low"]

    d, clock = dispatcher(capped, shards=1)
    d.submit(make_job("old-low").cpu("1").priority(0).build())
    clock.advance(25.0)
    d.submit(make_job("new-high").cpu("1").priority(20).build())
    clock.advance(1.0)  # old-low 26, within the cap, new-high 21
    assert job_ids(d.next_batches(max_units=1)) == ["old-low"]


# -- against the definition, under random operations ------------------------------------------------------
def check_structure(q: PriorityAgingQueue[Entry]) -> None:
    """White-box: each live job has one ordering item (ageing or frozen) and the timed item its
    phase needs (an ageing job its due time when capping, a not-yet-started one its wake time);
    the item count is exact, the run sorted, and no hand-over is due before _next_event."""
    live = set(q._members.values())
    ageing = [it[2] for it in (*q._run, *q._heap) if it[2] in live]
    frozen = [it for it in q._frozen if it[2] in live]
    assert sorted(ageing + [it[2] for it in frozen]) == sorted(live)
    due = [t[1] for t in (*q._due_run, *q._due_heap) if t[1] in live]
    assert sorted(due) == (sorted(ageing) if q._capping else [])
    # not started yet: frozen at its own priority (a capped one is above it: aging * max age > 0)
    pending = [it[2] for it in frozen if q._aging and it[0] == -it[3].job.priority]
    assert sorted(t[1] for t in q._wake if t[1] in live) == sorted(pending)
    assert list(q._run) == sorted(q._run)
    times = [t[0] + q._max_age for t in (*q._due_run, *q._due_heap)] + [t[0] for t in q._wake]
    assert q._next_event <= min(times, default=INF)


N_JOBS = 6  # few ids: pushes often replace, removes often hit
push_op = st.tuples(
    st.just("push"),
    st.integers(0, N_JOBS - 1),  # job
    st.integers(-3, 3).map(lambda p: p * 4),  # priority
    st.integers(-12, 3),  # submit_time - now: past the cap, ageing, or ahead of the clock
    st.booleans(),  # keep the job's seq (a requeue) or take a new one
)
ops = st.lists(
    st.one_of(  # about: push 4/10, pop 2/10, advance 2/10, peek 1/10, remove 1/10
        push_op,
        push_op,
        push_op,
        push_op,
        st.tuples(st.just("pop")),
        st.tuples(st.just("pop")),
        st.tuples(st.just("advance"), st.integers(1, 6), st.booleans()),  # and peek after?
        st.tuples(st.just("advance"), st.integers(1, 6), st.booleans()),
        st.tuples(st.just("peek")),
        st.tuples(st.just("remove"), st.integers(0, N_JOBS - 1)),
    ),
    min_size=8,
    max_size=80,
)


@settings(max_examples=1000, deadline=None)
@given(
    aging=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    max_age=st.sampled_from([0.0, 1.0, 4.0, 10.0, INF]),
    slack=st.sampled_from([0, priority_module._SLACK]),  # 0: compact at nearly every chance
    ops=ops,
)
def test_the_queue_pops_in_effective_priority_then_seq_order(aging, max_age, slack, ops) -> None:
    """Model: the live entries sorted by (-effective priority at now, seq). A pop right after a
    peek (nothing pushed or removed between) takes what the peek showed, whatever the clock did;
    any other look is at the current time. Values are small integers and halves: exact floats."""
    clock = Clock(100.0)
    live: dict[str, Entry] = {}
    seqs: dict[str, int] = {}
    next_seq = 0
    peeked: str | None = None

    def first() -> str | None:
        if not live:
            return None
        now = clock.now
        return min(
            live,
            key=lambda j: (
                -reference_eff(aging, max_age, live[j].job.priority, live[j].job.submit_time, now),
                live[j].seq,
            ),
        )

    with mock.patch.object(priority_module, "_SLACK", slack):
        q = queue(aging, max_age, clock)
        for op in ops:
            if op[0] == "push":
                _, i, prio, offset, keep = op
                job_id = f"j{i}"
                if not (keep and job_id in seqs):
                    next_seq += 1
                    seqs[job_id] = next_seq
                entry = Entry(
                    make_job(job_id).priority(prio).submitted(clock.now + offset).build(), seqs[job_id]
                )
                q.push(entry)
                live[job_id] = entry
                peeked = None
            elif op[0] == "remove":
                job_id = f"j{op[1]}"
                removed = live.pop(job_id, None) is not None
                assert q.remove(job_id) is removed
                if removed:  # one that removes nothing leaves the queue, and a peek's answer, as they were
                    peeked = None
            elif op[0] == "peek":
                got = q.peek()
                peeked = first()
                assert (None if got is None else got.job_id) == peeked
            elif op[0] == "pop":
                want = peeked if peeked is not None else first()
                got = q.pop()
                assert (None if got is None else got.job_id) == want
                if want is not None:
                    assert got is live.pop(want)
                peeked = None
            else:
                clock.advance(float(op[1]))
                if op[2]:  # a look at the new time: the head may have changed with no push or pop
                    got = q.peek()
                    peeked = first()
                    assert (None if got is None else got.job_id) == peeked
            assert len(q) == len(live)
            assert all(j in q for j in live) and all(
                f"j{i}" not in q for i in range(N_JOBS) if f"j{i}" not in live
            )
            check_structure(q)
            for e in live.values():
                assert q.effective_priority(e, clock.now) == reference_eff(
                    aging, max_age, e.job.priority, e.job.submit_time, clock.now
                )
        assert (None if (head := q.peek()) is None else head.job_id) == first()
        # drain while the clock runs: jobs cross the cap (or their submit_time) between pops
        while live:
            want = first()
            got = q.pop()
            assert got is not None and got is live.pop(want)  # type: ignore[arg-type]
            clock.advance(2.0)
        assert q.pop() is None and len(q) == 0
