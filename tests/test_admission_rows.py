"""The admission write's shortcuts keep the stored bytes and rows: encode_many's path for a batch of
jobs (common/codec.py _encode_alike) and the rows add_jobs writes (common/store.py _job_rows)."""

import pickle
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from gosched.common.codec import decode_job, encode, encode_many
from gosched.common.errors import AlreadyStored
from gosched.common.job import Job, JobKind, task_id
from gosched.common.store import Store
from gosched.runtime.simulation import basic_jobs
from tests.builders import make_job


def shipped(jobs: list[Job]) -> list[Job]:
    back: list[Job] = pickle.loads(pickle.dumps(jobs))
    return back


def test_a_batch_of_alike_jobs_encodes_as_each_alone() -> None:
    jobs = shipped(basic_jobs(5))
    assert jobs[0].groups is jobs[1].groups
    assert encode_many(jobs) == [encode(j) for j in jobs]


def test_jobs_that_differ_in_any_field_encode_as_each_alone() -> None:
    base = basic_jobs(1)[0]
    gang = make_job("g").cpu("2").replicas(3).min_member(2).build()
    jobs = [
        base,
        replace(base, id="a" * 40),  # a longer id: another msgpack string header
        replace(base, id="b", groups=gang.groups),
        replace(base, id="c", tenant="t", queue="q", priority=7, min_member=1, preemptible=False),
        replace(base, id="d", deadline=1e9, kind=JobKind.SERVICE, labels=(("k", "v"),)),
        replace(base, id="e", disruption_budget=2, submit_time=3.5, submission_id="s"),
        # Equal values of other types pack to other bytes: each keeps its own.
        replace(base, id="f", priority=True, deadline=1),  # type: ignore[arg-type]
        replace(base, id="g", priority=1, deadline=1.0),
        replace(base, id="h", submit_time=-0.0),
    ]
    assert encode_many(jobs) == [encode(j) for j in jobs]
    assert [decode_job(b) for b in encode_many(jobs)] == jobs


def test_a_batch_with_a_subclass_of_job_encodes_each_by_its_own_class() -> None:
    @dataclass(frozen=True)
    class Tagged(Job):
        tag: str = ""

    jobs = [*basic_jobs(2), Tagged(id="t", groups=basic_jobs(1)[0].groups)]
    with pytest.raises(Exception, match="Tagged"):  # unregistered: refused as before
        encode_many(jobs)
    assert encode_many(jobs[:2]) == [encode(j) for j in jobs[:2]]


def stored(s: Store) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    c = s._conn
    jobs = c.execute(
        "SELECT id, submission_id, typeof(spec), spec, submit_time, state FROM jobs ORDER BY rowid"
    ).fetchall()
    tasks = c.execute(
        "SELECT task_id, job_id, idx, state, updated FROM tasks ORDER BY job_id, idx"
    ).fetchall()
    return jobs, tasks


@pytest.mark.parametrize("named", [False, True])
def test_add_jobs_stores_every_job_and_task_row(tmp_path: Path, named: bool) -> None:
    gang = make_job("gang").cpu("1").replicas(12).min_member(12).build()
    jobs = [
        *shipped(basic_jobs(3)),
        gang,
        replace(basic_jobs(1, start=3)[0], submission_id="s" if named else ""),
    ]
    with Store(tmp_path / "d.db") as s:
        s.add_jobs(jobs, now=5.0)
        job_rows, task_rows = stored(s)
        assert job_rows == [
            (j.id, j.submission_id or None, "blob", encode(j), j.submit_time, "pending") for j in jobs
        ]
        expect = [(task_id(j.id, i), j.id, i, "pending", 5.0) for j in jobs for i in range(j.total_replicas)]
        assert sorted(task_rows) == sorted(expect)
        assert [job for job, _ in s.load_jobs()] == jobs


def test_add_jobs_stays_all_or_nothing(tmp_path: Path) -> None:
    with Store(tmp_path / "d.db") as s:
        s.add_jobs(basic_jobs(2), now=1.0)
        for clash in (basic_jobs(3, start=1), [*basic_jobs(1, start=5), *basic_jobs(1, start=5)]):
            with pytest.raises(AlreadyStored):
                s.add_jobs(clash, now=2.0)
        s.add_jobs([replace(basic_jobs(1, start=7)[0], submission_id="x")], now=3.0)
        with pytest.raises(AlreadyStored) as info:
            s.add_jobs([*basic_jobs(1, start=8), replace(basic_jobs(1, start=9)[0], submission_id="x")])
        assert info.value.field == "submission_id"
        job_rows, task_rows = stored(s)
        assert [r[0] for r in job_rows] == ["job-0", "job-1", "job-7"]
        assert [r[0] for r in task_rows] == ["job-0/0", "job-1/0", "job-7/0"]


def test_single_task_rows_are_written_when_sqlite_reuses_rowids(tmp_path: Path) -> None:
    # Past rowid 2**63 - 1 SQLite picks unused rowids at random: the task rows made from the jobs
    # past the largest rowid would miss them, so they are written row by row instead.
    with Store(tmp_path / "d.db") as s:
        s._conn.execute(
            "INSERT INTO jobs (rowid, id, spec, submit_time, state) VALUES (?, 'top', x'00', 0, 'done')",
            (2**63 - 1,),
        )
        jobs = basic_jobs(5)
        s.add_jobs(jobs, now=4.0)
        _, task_rows = stored(s)
        assert task_rows == [(task_id(j.id, 0), j.id, 0, "pending", 4.0) for j in jobs]


def test_the_binder_stores_missing_single_task_jobs_with_their_rows(tmp_path: Path) -> None:
    with Store(tmp_path / "d.db") as s:
        jobs = basic_jobs(3)
        s.add_jobs(jobs[:1], now=1.0)
        s.commit(1, [(task_id(j.id, 0), "n1", ()) for j in jobs], [], now=2.0, jobs={j.id: j for j in jobs})
        job_rows, task_rows = stored(s)
        assert [r[0] for r in job_rows] == ["job-0", "job-1", "job-2"]
        assert [(r[0], r[3]) for r in task_rows] == [(task_id(j.id, 0), "bound") for j in jobs]
