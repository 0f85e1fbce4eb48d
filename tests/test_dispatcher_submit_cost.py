"""The submission path's shortcuts keep what submit_many did: validation per job, restamping,
interning, the records and the queue order (dispatcher/dispatcher.py submit_many, _register)."""

import pickle
from dataclasses import dataclass, fields, replace
from pathlib import Path

import pytest

from gosched.common.config import Settings
from gosched.common.errors import SpecError
from gosched.common.job import Job, TaskGroup
from gosched.common.states import TaskState
from gosched.common.store import Store
from gosched.dispatcher.dispatcher import Dispatcher, restamped_rows
from gosched.dispatcher.group_interner import GroupInterner
from gosched.dispatcher.records import QUEUED, JobRecord
from gosched.dispatcher.store import MemoryStore
from gosched.runtime.simulation import basic_jobs
from tests.builders import make_job

PENDING = TaskState.PENDING


def shipped(jobs: list[Job]) -> list[Job]:
    """The jobs as an actor receives them: one pickled batch, whose jobs share their groups tuple."""
    back: list[Job] = pickle.loads(pickle.dumps(jobs))
    return back


def dispatcher(*, store: object = None) -> Dispatcher:
    return Dispatcher(Settings(shards=1), store=store, clock=lambda: 1000.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"min_member": 2}, "jobs[1].min_member"),
        ({"queue": "nope"}, "jobs[1].queue"),
        ({"groups": ()}, "jobs[1].groups"),
    ],
)
def test_the_second_job_sharing_a_groups_tuple_is_still_validated(bad: dict[str, object], field: str) -> None:
    # The replica total is summed once per groups tuple: each job's own fields are still checked.
    first, second = basic_jobs(2)
    assert first.groups is second.groups
    d = dispatcher(store=MemoryStore())
    with pytest.raises(SpecError) as info:
        d.submit_many([first, replace(second, **bad)])  # type: ignore[arg-type]
    assert info.value.field == field
    assert "job-0" not in d and len(d.store.jobs) == 0  # type: ignore[union-attr]


def test_a_batch_of_alike_jobs_hashes_its_groups_once() -> None:
    hashed = 0

    @dataclass(frozen=True)
    class CountedGroup(TaskGroup):
        def __hash__(self) -> int:
            nonlocal hashed
            hashed += 1
            return super().__hash__()

    (group,) = basic_jobs(1)[0].groups
    counted = CountedGroup(**{name: getattr(group, name) for name in TaskGroup.__dataclass_fields__})
    groups = (counted,)
    d = dispatcher()
    d.submit_many([Job(id=f"j{i}", groups=groups) for i in range(50)])
    assert hashed == 1
    d.submit_many([Job(id=f"k{i}", groups=groups) for i in range(50)])
    assert hashed == 1  # the same tuple again: known by identity


def test_jobs_are_restamped_and_share_interned_groups_across_batches(tmp_path: Path) -> None:
    with Store(tmp_path / "d.db") as store:
        d = dispatcher(store=store)
        batches = [shipped(basic_jobs(3, start=3 * b)) for b in range(3)]
        assert batches[0][0].groups[0] is not batches[1][0].groups[0]
        for batch in batches:
            d.submit_many(batch)
        sent = [job for batch in batches for job in batch]
        held = [d.job(job.id) for job in sent]
        assert held == [replace(job, submit_time=1000.0) for job in sent]
        assert len({id(job.groups[0]) for job in held}) == 1
        assert [job for job, _ in store.load_jobs()] == held
        assert all(job.submit_time == 0.0 for job in sent)  # the caller's jobs are left as they were


def test_records_of_a_batch_are_queued_in_order() -> None:
    d = dispatcher()
    gang = make_job("gang").cpu("1").replicas(3).min_member(2).build()
    ids = d.submit_many([*basic_jobs(2), gang, replace(basic_jobs(1, start=2)[0], tenant="t2")])
    assert ids == ["job-0", "job-1", "gang", "job-2"]
    records = [d._jobs[j] for j in ids]
    assert [r.seq for r in records] == [1, 2, 3, 4]
    assert all(r.where is QUEUED for r in records)
    assert records[2].states == [PENDING] * 3 and records[2].n_pending == 3
    assert d._tenant_jobs == {"default": 3, "t2": 1} and d._waiting == 4
    (batch,) = d.next_batches()
    assert [u.job.id for u in batch.units] == ids


def test_a_record_told_its_tasks_are_all_pending_counts_as_one_that_reads_them() -> None:
    job = make_job("g").cpu("1").replicas(4).build()
    told = JobRecord(job, 1, 0, [PENDING] * 4, n_pending=4)
    read = JobRecord(job, 1, 0, [PENDING] * 4)
    assert (told.n_pending, told.n_scheduled, told.n_held) == (read.n_pending, read.n_scheduled, read.n_held)


def test_restamped_rows_match_replace_and_keep_subclasses() -> None:
    jobs = basic_jobs(3)
    other = make_job("x").cpu("2").build().groups
    out, rows = restamped_rows(jobs, [other, jobs[1].groups, other], 5.0)
    assert rows is not None and rows == [tuple(getattr(j, f.name) for f in fields(Job)) for j in out]
    assert out == [
        replace(j, submit_time=5.0, groups=g)
        for j, g in zip(jobs, [other, jobs[1].groups, other], strict=True)
    ]

    @dataclass(frozen=True)
    class Tagged(Job):
        tag: str = "t"

    tagged = Tagged(id="t1", groups=jobs[0].groups, tag="kept")
    (back,), none = restamped_rows([tagged], [other], 6.0)
    assert none is None  # a subclass's fields are its own: no row kept
    assert type(back) is Tagged and back.tag == "kept" and back.submit_time == 6.0 and back.groups is other


def test_interner_groups_by_identity_and_by_value() -> None:
    interner = GroupInterner()
    a = make_job("a").cpu("1").replicas(2).build().groups
    b = make_job("b").cpu("1").replicas(2).build().groups  # equal, other objects
    assert interner.groups(a) == (a, 2)
    shared, total = interner.groups(b)
    assert shared == b and shared[0] is a[0] and total == 2
    assert interner.groups(b)[0] is shared  # remembered by identity now
    interner = GroupInterner(max_groups=1)
    interner.groups(a)
    c = make_job("c").cpu("3").build().groups
    assert interner.groups(c) == (c, 1)  # the table started afresh
    assert interner.groups(b)[0] is b  # and so did the identity memo: a's group is no longer shared


def test_a_groups_list_is_not_remembered_by_identity() -> None:
    # A list may change between two submissions; a tuple of frozen groups cannot.
    interner = GroupInterner()
    groups = list(make_job("a").cpu("1").build().groups)
    assert interner.groups(groups) == (groups, 1)  # type: ignore[arg-type]
    groups.append(make_job("b").cpu("2").replicas(2).build().groups[0])
    shared, total = interner.groups(groups)  # type: ignore[arg-type]
    assert list(shared) == groups and total == 3


@pytest.mark.parametrize("groups", [None, [{"replicas": 1}], 3])
def test_groups_that_are_not_task_groups_are_refused_naming_the_field(groups: object) -> None:
    # Interned before the other checks: what is not a tuple of task groups must still be a
    # SpecError naming the field, not a TypeError from the interner.
    good, bad = basic_jobs(2)
    d = dispatcher(store=MemoryStore())
    with pytest.raises(SpecError) as info:
        d.submit_many([good, replace(bad, groups=groups)])  # type: ignore[arg-type]
    assert info.value.field == "jobs[1].groups"
    assert "task groups" in info.value.reason
    assert len(d.store.jobs) == 0  # type: ignore[union-attr]
