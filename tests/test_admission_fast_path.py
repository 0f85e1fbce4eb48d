"""submit_many's fast path keeps what the per-job path did: the checks in order with the same errors
(dispatcher/dispatcher.py submit_many), the records (records.py queued_records against
JobRecord.__init__), the queues' order (queues/base.py push_many against push)."""

import pickle
from dataclasses import replace

import pytest

from gosched.common.config import QueueConfig, QueuePolicy, Settings
from gosched.common.errors import SpecError
from gosched.common.job import Job
from gosched.common.states import TaskState
from gosched.dispatcher.dispatcher import Dispatcher
from gosched.dispatcher.queues import DeadlineQueue, FifoQueue
from gosched.dispatcher.records import QUEUED, JobRecord, queued_records
from gosched.dispatcher.store import MemoryStore
from gosched.runtime.simulation import basic_jobs
from tests.builders import make_job
from tests.test_dispatcher_queues import drain_ids

PENDING = TaskState.PENDING


def shipped(jobs: list[Job]) -> list[Job]:
    back: list[Job] = pickle.loads(pickle.dumps(jobs))
    return back


def slots(rec: JobRecord) -> dict[str, object]:
    return {name: getattr(rec, name) for name in JobRecord.__slots__}


def test_queued_records_match_records_made_by_init() -> None:
    gang = make_job("gang").cpu("1").replicas(3).group("ps").cpu("2").gpus(1).replicas(2).build()
    jobs = [*shipped(basic_jobs(3)), gang, *basic_jobs(2, start=3), replace(gang, id="gang2")]
    totals = [j.total_replicas for j in jobs]
    qis = [0, 0, 1, 0, 1, 1, 0]
    made = queued_records(jobs, 10, qis, totals)
    for k, (rec, job) in enumerate(zip(made, jobs, strict=True)):
        want = JobRecord(job, 11 + k, qis[k], [PENDING] * totals[k], n_pending=totals[k])
        want.where = QUEUED
        assert slots(rec) == slots(want)
    assert made[0].states is not made[1].states and made[0].costs is not made[1].costs


class Entry:
    def __init__(self, job_id: str, seq: int, deadline: float | None = None) -> None:
        self.job_id, self.seq = job_id, seq
        self.job = make_job(job_id).cpu("1").deadline(deadline).build() if deadline else basic_jobs(1)[0]


@pytest.mark.parametrize(
    ("before", "batch"),
    [
        ([], [("a", 1), ("b", 2), ("c", 3)]),
        ([("a", 1)], [("b", 2), ("c", 2), ("d", 5)]),  # equal keys: pushed order
        ([("x", 9)], [("b", 2), ("c", 3)]),  # below the run's last: into the heap
        ([], [("b", 3), ("c", 2)]),  # out of order
        ([("a", 1)], [("a", 4), ("b", 5)]),  # a member again: the first item goes stale
        ([], []),
    ],
)
def test_push_many_leaves_a_fifo_queue_as_pushes_one_by_one(
    before: list[tuple[str, int]], batch: list[tuple[str, int]]
) -> None:
    one: FifoQueue[Entry] = FifoQueue()
    many: FifoQueue[Entry] = FifoQueue()
    for q in (one, many):
        for job_id, seq in before:
            q.push(Entry(job_id, seq))
    entries = [Entry(job_id, seq) for job_id, seq in batch]
    for e in entries:
        one.push(e)
    many.push_many(entries)
    assert (len(one), many._token, many._stale) == (len(many), one._token, one._stale)
    assert list(one._run) == list(many._run) or [i[:2] for i in one._run] == [i[:2] for i in many._run]
    assert drain_ids(one) == drain_ids(many)


def test_push_many_keys_a_deadline_queue_by_its_own_key() -> None:
    one: DeadlineQueue[Entry] = DeadlineQueue()
    many: DeadlineQueue[Entry] = DeadlineQueue()
    entries = [Entry("a", 1, 5e9), Entry("b", 2, 2e9), Entry("c", 3, 9e9)]
    for e in entries:
        one.push(e)
    many.push_many(entries)
    assert drain_ids(one) == drain_ids(many) == ["b", "a", "c"]


def dispatcher(*queues: QueueConfig) -> Dispatcher:
    settings = Settings(shards=1, queues=list(queues) or [QueueConfig(name="default")])
    return Dispatcher(settings, store=MemoryStore(), clock=lambda: 1000.0)


@pytest.mark.parametrize(
    ("at", "bad", "field"),
    [
        (2, {"id": "job-0"}, "jobs[2].id"),  # an id given twice in the batch
        (1, {"queue": "nope"}, "jobs[1].queue"),
        (3, {"min_member": 0}, "jobs[3].min_member"),
        (2, {"groups": ()}, "jobs[2].groups"),
    ],
)
def test_a_fast_path_job_refused_names_its_place_and_nothing_is_taken(
    at: int, bad: dict[str, object], field: str
) -> None:
    jobs = shipped(basic_jobs(4))
    jobs[at] = replace(jobs[at], **bad)  # type: ignore[arg-type]
    d = dispatcher()
    with pytest.raises(SpecError) as info:
        d.submit_many(jobs)
    assert info.value.field == field
    assert len(d.store.jobs) == 0 and d._waiting == 0 and not d._jobs  # type: ignore[union-attr]


def test_a_job_id_already_known_is_refused_behind_alike_jobs() -> None:
    d = dispatcher()
    d.submit_many(basic_jobs(2))
    with pytest.raises(SpecError) as info:
        d.submit_many(shipped(basic_jobs(3, start=1)))
    assert info.value.field == "jobs[0].id"
    with pytest.raises(SpecError) as info:
        d.submit_many(shipped([*basic_jobs(3, start=5), basic_jobs(1, start=1)[0]]))
    assert info.value.field == "jobs[3].id"


def test_submission_ids_among_alike_jobs_keep_their_idempotency() -> None:
    d = dispatcher()
    jobs = shipped(basic_jobs(4))
    jobs[1] = replace(jobs[1], submission_id="s1")
    jobs[3] = jobs[1]  # the same request again
    ids = d.submit_many(jobs)
    assert ids == ["job-0", "job-1", "job-2", "job-1"]
    assert d._submissions == {"s1": "job-1"} and d._tenant_jobs == {"default": 3}


def test_jobs_of_several_queues_are_queued_each_in_its_order() -> None:
    d = dispatcher(QueueConfig(name="a"), QueueConfig(name="b", policy=QueuePolicy.PRIORITY))
    jobs = shipped(basic_jobs(6))
    jobs = [replace(j, queue="ab"[k % 2], tenant="t" if k < 2 else "u") for k, j in enumerate(jobs)]
    d.submit_many(jobs)
    assert [d._jobs[j.id].seq for j in jobs] == [1, 2, 3, 4, 5, 6]
    assert d._tenant_jobs == {"t": 2, "u": 4} and d._waiting == 6
    assert all(r.where is QUEUED for r in d._jobs.values())
    for qi, name in enumerate("ab"):
        queue = d._queues[qi]
        out = []
        while (rec := queue.pop()) is not None:
            out.append(rec.job_id)
        assert out == [j.id for j in jobs if j.queue == name]


def test_a_batch_alternating_two_groups_tuples_is_interned_and_counted() -> None:
    gang = make_job("g").cpu("1").replicas(3).min_member(3).build()
    jobs = [
        Job(
            id=f"j{k}", groups=gang.groups if k % 2 else basic_jobs(1)[0].groups, min_member=3 if k % 2 else 1
        )
        for k in range(6)
    ]
    d = dispatcher()
    d.submit_many(shipped(jobs))
    assert [d._jobs[j.id].n_pending for j in jobs] == [1, 3, 1, 3, 1, 3]
    assert len({id(d.job(j.id).groups[0]) for j in jobs}) == 2
    with pytest.raises(SpecError) as info:  # min_member 3 on a one-task job, second of its tuple
        d.submit_many(shipped([replace(j, id=f"k{i}", min_member=3) for i, j in enumerate(jobs)]))
    assert info.value.field == "jobs[0].min_member"


def test_jobs_with_tuples_of_their_own_are_taken_as_the_api_makes_them() -> None:
    # The API parses each job's groups tuple apart, of shared group objects (api/convert.py).
    (group,) = basic_jobs(1)[0].groups
    copy = replace(group)  # equal, another object: interned to the first
    jobs = [Job(id=f"j{k}", groups=(copy if k == 3 else group,)) for k in range(5)]
    d = dispatcher()
    assert d.submit_many(shipped(jobs)) == [j.id for j in jobs]
    held = [d.job(j.id) for j in jobs]
    assert held == [replace(j, submit_time=1000.0) for j in jobs]
    assert all(h.groups[0] is held[0].groups[0] for h in held)
    assert [d._jobs[j.id].n_pending for j in jobs] == [1] * 5
    bad = [Job(id=f"k{k}", groups=(group,), min_member=2 if k == 2 else 1) for k in range(4)]
    with pytest.raises(SpecError) as info:
        d.submit_many(shipped(bad))
    assert info.value.field == "jobs[2].min_member"
