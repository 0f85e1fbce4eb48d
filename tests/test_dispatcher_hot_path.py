"""The dispatcher's per-unit paths, checked against plain models of what they must do: the room
check, the shard choice (least loaded, a retry off its last shard on a tie, at most batch_size
each), and the wait of a unit past the free room. (The queue's peek-then-pop is checked with the
heap queue's model in test_dispatcher_queues.py.)"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gosched.common.config import QueueConfig, QueuePolicy
from gosched.dispatcher.dispatcher import _fits
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
