"""The dispatcher's work per task, as the Ray actor does it: DispatcherCore.next_batch, then report
with the binder's verdicts accepting every unit, over N single-task SchedulingBasic jobs.

    python dispatcher_harness.py N MODE
MODE 0 stops after the set-up, 1 runs the loop, 2 runs it with the harness's own part (decoding
each batch and packing its verdicts) done twice. Under callgrind (callgrind.sh), the instructions
per task of the dispatcher alone are (2 * I(1) - I(0) - I(2)) / N.

MODE check runs the loop once on a fixed clock and prints two sha256 digests: of every batch's
bytes in order (what the shards read), and of the dispatcher's state after the last report (every
job record's fields, the counters, the usage, the timings and the stored task states).
callgrind.sh compares them with batches.sha256, recorded from the code before the seventeenth
session's cuts, so that a cut changes no byte the shards read and no state the reports leave.
The state's digest was recorded again at the twenty-first session (6a43039): the records had
gained slots since (a failure's backoff, a deadline's watch), which the state lists; the batches'
digest is still the seventeenth session's.
"""

import sys
import time

if sys.argv[2] == "check":
    # Before gosched is imported: the dispatcher's clocks default to time.time. One fixed time
    # keeps the bytes the same however many times the code reads the clock.
    time.time = lambda: 1_800_000_000.0

import gc
import hashlib
import os
import tempfile

from gosched.common import wire
from gosched.common.config import Settings
from gosched.common.messages import BindReplyRows
from gosched.dispatcher.records import JobRecord
from gosched.runtime.gc_tuning import tune_gc
from gosched.runtime.ray_actors import DispatcherCore
from gosched.runtime.simulation import basic_jobs, sim_nodes


def state_of(core: DispatcherCore) -> str:
    """What the reports leave behind, as text (the job objects by id: they are the batches')."""
    d = core.dispatcher
    fields = [s for s in JobRecord.__slots__ if s != "job_row"]  # job_row: the job's fields (batches')
    recs = [[rec.job_id if s == "job" else getattr(rec, s) for s in fields] for rec in d._jobs.values()]
    usage = d.usage
    parts = (
        recs,
        d.pending_count(),
        d.waiting_count(),
        d.in_flight_count(),
        d.active_count(),
        d._shard_load,
        [sorted(x) for x in d._inflight_by_shard],
        d._claims,
        sorted(usage._queues.items()),
        sorted(usage._tenants.items()),
        sorted((k, v[0]) for k, v in usage._pairs.items()),
        d.timings,
        core.bound_tasks,
        core.last_bind,
        core.rejected_units,
        [(job.id, rows) for job, rows in core.store.load_jobs()],
    )
    return repr(parts)


n, mode = int(sys.argv[1]), sys.argv[2]
core = DispatcherCore(Settings(store_path=os.path.join(tempfile.mkdtemp(), "d.db"), shards=1))
cluster = sim_nodes(10_000, gpu_every=0)
totals = {"cpu": sum(x.cpu_milli for x in cluster), "memory": sum(x.memory for x in cluster), "gpu": 0}
core.set_nodes(cluster, totals)
core.submit_many(basic_jobs(n))
nothing = wire.pack([])
tune_gc()
gc.collect()
sent = hashlib.sha256()
if mode != "0":
    while True:
        _, data = core.next_batch(0)
        if data is None:
            break
        if mode == "check":
            sent.update(data)
        for _ in range(2 if mode == "2" else 1):
            batch = wire.unpack(data)
            rows = [(u.job.id, u.attempt, u.task_indexes, 1.0, ()) for u in batch.units]
            verdicts = wire.pack(BindReplyRows(rows, [], [], 1, 0))
        core.report(verdicts, nothing, core.binder_incarnation)
    assert core.bound_tasks == n, core.bound_tasks
if mode == "check":
    left = hashlib.sha256(state_of(core).encode()).hexdigest()
    print(f"batches {sent.hexdigest()}\nstate {left}", flush=True)
os._exit(0)  # no collector pass at exit: it is not the dispatcher's work
