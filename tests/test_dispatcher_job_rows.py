"""The job rows a record keeps from its admission (JobRecord.job_row) stand for its job in the
batches it leaves in: the same bytes as reading them from the job, and the job's own fields."""

from gosched.common import wire
from gosched.common.fast_pickle import rows_of
from gosched.common.job import Job
from gosched.common.messages import UnitBatchRows
from tests.builders import make_job
from tests.test_dispatcher_support import dispatcher


def test_a_records_kept_row_is_its_jobs_fields_and_its_batches_pack_as_before() -> None:
    d, _ = dispatcher(shards=1, batch_size=8)
    jobs = [
        make_job(f"j{i}").cpu("1").priority(i).max_retries(i % 2).time_limit(60).build() for i in range(6)
    ]
    d.submit_many(jobs)
    for job_id in d.job_ids():
        rec = d._jobs[job_id]
        assert rec.job_row is not None and rec.job_row == rows_of(Job, [rec.job])[0]
    (batch,) = d.next_batch_rows()
    assert batch.job_rows is not None and None not in batch.job_rows
    read = UnitBatchRows(batch.shard_id, batch.rows)  # the rows read from the jobs again
    assert wire.pack(batch) == wire.pack(read) == wire.pack(batch.batch())
    # A record without a kept row (restored, say) makes its batch read every job's row again.
    mixed = UnitBatchRows(batch.shard_id, batch.rows, [None, *batch.job_rows[1:]])
    assert wire.pack(mixed) == wire.pack(read)
    assert wire.unpack(wire.pack(batch)) == batch.batch()
