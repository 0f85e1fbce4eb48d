"""The dispatcher's per-unit paths, checked against plain models of what they must do: the room
check, the shard choice (least loaded, a retry off its last shard on a tie, at most batch_size
each), and the wait of a unit past the free room. (The queue's peek-then-pop is checked with the
heap queue's model in test_dispatcher_queues.py.)"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gosched.common import wire
from gosched.common.config import QueueConfig, QueuePolicy
from gosched.common.messages import Unit
from gosched.dispatcher.dispatcher import _fits, _only_target
from tests.builders import make_job
from tests.test_dispatcher_support import CPU, GI, accept, dispatcher, job_ids, reject, units

_amount = st.integers(0, 4)


@given(_amount, _amount, _amount, st.lists(st.integers(-2, 4), min_size=3, max_size=3))
def test_fits_leaves_out_what_is_not_asked_for(cpu: int, mem: int, gpu: int, free: list[int]) -> None:
    want = all(x <= f for x, f in zip((cpu, mem, gpu), free, strict=True) if x)
    assert _fits(cpu, mem, gpu, free) is want


def _model_shards(
    loads: list[int], per_shard: int, jobs: list[str], last: dict[str, int], limit: int
) -> dict[str, int]:
    """Job -> shard: each job in turn to the least-loaded shard with room (lowest index on a tie),
    or the next one if that is the job's last shard and equally loaded."""
    load, taken, out = list(loads), [0] * len(loads), {}
    for job in jobs[:limit]:
        open_ = sorted((load[s], s) for s in range(len(loads)) if taken[s] < per_shard)
        if not open_:
            break
        s = open_[0][1]
        if s == last.get(job, -1) and len(open_) > 1 and open_[1][0] == open_[0][0]:
            s = open_[1][1]
        load[s] += 1
        taken[s] += 1
        out[job] = s
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(0, 3), min_size=n, max_size=n),
            st.lists(st.integers(0, 3), min_size=n, max_size=n),
        )
    ),
    st.integers(1, 3),
    st.integers(0, 12),
    st.one_of(st.none(), st.integers(0, 10)),
)
def test_units_go_to_the_least_loaded_shard_with_room(loads, per_shard, n_jobs, max_units) -> None:
    first, second = loads
    n = len(first)
    d, _ = dispatcher(shards=n, batch_size=per_shard)
    names = [f"j{i}" for i in range(n_jobs)]
    d.submit_many([make_job(j).cpu("1").build() for j in names])
    limit = n * per_shard if max_units is None else max_units

    batches = d.next_batches(first, max_units=max_units)
    got = {u.job.id: b.shard_id for b in batches for u in b.units}
    assert got == _model_shards(first, per_shard, names, {}, limit)

    # Refused, they are queued again at once; the retries avoid their last shard on a tie.
    d.on_reply(reject(units(batches)))
    batches = d.next_batches(second, max_units=max_units)
    again = {u.job.id: b.shard_id for b in batches for u in b.units}
    assert again == _model_shards(second, per_shard, names, got, limit)


# A cluster of 10 CPUs: 4 held, 4 in flight (unheld 6, free 2); then a unit of `cpus`.
@pytest.mark.parametrize(
    ("policy", "shards", "guarantee", "cpus", "waits"),
    [
        (QueuePolicy.FIFO, 2, 0.0, 2, False),  # within the free room
        (QueuePolicy.FIFO, 2, 0.0, 3, True),  # room the unit in flight claims
        (QueuePolicy.FIFO, 2, 0.0, 7, False),  # more than unheld: it must preempt anyway
        (QueuePolicy.FIFO, 1, 0.0, 3, False),  # one shard: answers come in order
        (QueuePolicy.FIFO, 2, 0.9, 3, False),  # below its guarantee: it may reclaim
        (QueuePolicy.DRF, 2, 0.0, 2, False),
        (QueuePolicy.DRF, 2, 0.0, 3, True),  # fairness: past the free room, whatever unheld
        (QueuePolicy.DRF, 2, 0.0, 7, True),
        (QueuePolicy.DRF, 1, 0.0, 7, True),
        (QueuePolicy.DRF, 2, 0.9, 7, False),
    ],
)
def test_a_unit_past_the_free_room_waits_for_the_units_in_flight(
    policy: QueuePolicy, shards: int, guarantee: float, cpus: int, waits: bool
) -> None:
    d, _ = dispatcher(QueueConfig(name="default", policy=policy, guarantee=guarantee), shards=shards)
    d.set_cluster_capacity(10 * CPU, 100 * GI, 0)
    d.submit(make_job("held").cpu("4").build())
    d.on_reply(accept(units(d.next_batches())))
    d.submit(make_job("flying").cpu("4").build())
    flying = units(d.next_batches())
    assert [u.job.id for u in flying] == ["flying"]

    d.submit(make_job("next").cpu(str(cpus)).build())
    assert job_ids(d.next_batches()) == ([] if waits else ["next"])
    if waits:
        d.on_reply(accept(flying))  # answered: the room is known again, the unit goes
        assert job_ids(d.next_batches()) == ["next"]


# -- the one-queue, one-shard loop (Dispatcher._dispatch_alone) against the general one ------------
BIG = 1 << 40  # the load the Ray dispatcher gives the shards that did not ask (DispatcherCore)

_job_spec = st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 6))  # tasks, min_member, cpus
_step = st.one_of(
    st.tuples(st.just("submit"), st.lists(_job_spec, min_size=1, max_size=4)),
    st.tuples(st.just("dispatch"), st.integers(0, 3), st.one_of(st.none(), st.integers(0, 6))),
    st.tuples(st.just("answer"), st.lists(st.booleans(), max_size=8)),
    st.tuples(st.just("cancel"), st.integers(0, 20)),
)


def _state(d: object) -> tuple[object, ...]:
    """What the two loops must leave alike: every record's fields, the counters, the usage (per
    queue and tenant too)."""
    recs = d._jobs  # type: ignore[attr-defined]
    fields = ("where", "shard", "last_shard", "attempt", "dispatches", "n_pending", "n_scheduled", "n_held")
    return (
        {j: (tuple(r.states), *(getattr(r, f) for f in fields), r.trust_epoch) for j, r in recs.items()},
        d._shard_load,  # type: ignore[attr-defined]
        d._waiting,  # type: ignore[attr-defined]
        d._inflight,  # type: ignore[attr-defined]
        {s: sorted(m) for s, m in enumerate(d._inflight_by_shard)},  # type: ignore[attr-defined]
        d.usage.room(),  # type: ignore[attr-defined]
        sorted((pair, row[0]) for pair, row in d.usage._pairs.items()),  # type: ignore[attr-defined]
    )


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from([QueuePolicy.FIFO, QueuePolicy.PRIORITY]),
    st.integers(1, 3),
    st.integers(1, 4),
    st.lists(_step, min_size=1, max_size=16),
)
def test_the_one_shard_loop_dispatches_as_the_general_loop(
    policy: QueuePolicy, shards: int, batch_size: int, steps: list[tuple]
) -> None:
    made = [dispatcher(QueueConfig(name="default", policy=policy), shards=shards, batch_size=batch_size)[0]]
    made.append(
        dispatcher(QueueConfig(name="default", policy=policy), shards=shards, batch_size=batch_size)[0]
    )
    fast, general = made
    general.fast_dispatch = False
    for d in made:
        d.set_cluster_capacity(10 * CPU, 100 * GI, 0)  # small: units past the free room wait (`order`)
    submitted = 0
    for step in steps:
        outs = []
        for d in made:
            if step[0] == "submit":
                jobs = []
                for n, (tasks, min_member, cpus) in enumerate(step[1]):
                    b = make_job(f"j{submitted + n}").cpu(str(cpus)).replicas(tasks).tenant(f"t{n % 2}")
                    jobs.append(b.min_member(min(min_member, tasks)).priority(n % 3).build())
                d.submit_many(jobs)
            elif step[0] == "dispatch":
                target, max_units = step[1], step[2]
                loads = [0 if s == target % shards else BIG for s in range(shards)]
                batches = d.next_batch_rows(loads, max_units)
                rows = [(b.shard_id, [(r[0].id, *r[1:]) for r in b.rows]) for b in batches]
                outs.append(rows)
            elif step[0] == "answer":
                inflight = sorted(j for m in d._inflight_by_shard for j in m)  # type: ignore[attr-defined]
                take = [j for j, yes in zip(inflight, step[1], strict=False) if yes]
                recs = [d._jobs[j] for j in take]  # type: ignore[attr-defined]
                idx = [tuple(i for i, s in enumerate(r.states) if s.value == "scheduled") for r in recs]
                us = [Unit(r.job, ix, 1, r.attempt) for r, ix in zip(recs, idx, strict=True)]
                d.on_reply(accept(us))
            else:
                ids = sorted(d._jobs)  # type: ignore[attr-defined]
                if ids:
                    d.cancel(ids[step[1] % len(ids)])
        if step[0] == "submit":
            submitted += len(step[1])
        if outs:
            assert outs[0] == outs[1]
        assert _state(fast) == _state(general)


@pytest.mark.parametrize(
    ("loads", "limit", "cap", "target"),
    [
        ([0], 4, 4, 0),
        ([3], 4, 4, 0),
        ([0, BIG, BIG], 4, 4, 0),  # the Ray dispatcher's poll from shard 0
        ([BIG, BIG, 0], 4, 4, 2),
        ([0, 5], 4, 4, 0),  # shard 1 never catches up within 4 units
        ([0, 4], 4, 4, -1),  # it would tie at the last unit: the general loop decides
        ([0, 0], 4, 4, -1),
        ([0, BIG], 8, 4, -1),  # more than one batch's worth: the other shard takes the rest
    ],
)
def test_the_one_shard_loop_is_taken_only_where_one_shard_gets_every_unit(
    loads: list[int], limit: int, cap: int, target: int
) -> None:
    assert _only_target(loads, limit, cap) == target


def test_the_ray_dispatchers_poll_takes_the_one_shard_loop() -> None:
    d, _ = dispatcher(shards=3, batch_size=4)
    taken: list[int] = []
    alone = d._dispatch_alone
    d._dispatch_alone = lambda *a: taken.append(1) or alone(*a)  # type: ignore[method-assign]
    d.submit_many([make_job(f"j{i}").cpu("1").build() for i in range(6)])
    batches = d.next_batch_rows([BIG, 0, BIG], max_units=4)
    assert taken and [(b.shard_id, [r[0].id for r in b.rows]) for b in batches] == [
        (1, ["j0", "j1", "j2", "j3"])
    ]


def test_a_batch_of_rows_packs_as_its_units_do() -> None:
    """The Ray dispatcher sends UnitBatchRows; the shards must read the same UnitBatch, byte for byte."""
    d, _ = dispatcher(shards=2, batch_size=8)
    jobs = [make_job("solo").cpu("1").build(), make_job("gang").cpu("2").replicas(3).min_member(2).build()]
    jobs.append(make_job("urgent").cpu("1").priority(7).labels(team="a").build())
    d.submit_many(jobs)
    (rows,) = d.next_batch_rows([0, BIG], max_units=8)
    batch = rows.batch()
    assert [u.job.id for u in batch.units] == ["solo", "gang", "urgent"]
    assert wire.pack(rows) == wire.pack(batch)
    assert wire.unpack(wire.pack(rows)) == batch
