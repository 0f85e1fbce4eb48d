"""The dispatcher's work per task, as the Ray actor does it: DispatcherCore.next_batch, then report
with the binder's verdicts accepting every unit, over N single-task SchedulingBasic jobs.

    python dispatcher_harness.py N MODE
MODE 0 stops after the set-up, 1 runs the loop, 2 runs it with the harness's own part (decoding
each batch and packing its verdicts) done twice. Under callgrind (callgrind.sh), the instructions
per task of the dispatcher alone are (2 * I(1) - I(0) - I(2)) / N.
"""

import gc
import os
import sys
import tempfile

from gosched.common import wire
from gosched.common.config import Settings
from gosched.common.messages import BindReplyRows
from gosched.runtime.gc_tuning import tune_gc
from gosched.runtime.ray_actors import DispatcherCore
from gosched.runtime.simulation import basic_jobs, sim_nodes

n, mode = int(sys.argv[1]), sys.argv[2]
core = DispatcherCore(Settings(store_path=os.path.join(tempfile.mkdtemp(), "d.db"), shards=1))
cluster = sim_nodes(10_000, gpu_every=0)
totals = {"cpu": sum(x.cpu_milli for x in cluster), "memory": sum(x.memory for x in cluster), "gpu": 0}
core.set_nodes(cluster, totals)
core.submit_many(basic_jobs(n))
nothing = wire.pack([])
tune_gc()
gc.collect()
if mode != "0":
    while True:
        _, data = core.next_batch(0)
        if data is None:
            break
        for _ in range(2 if mode == "2" else 1):
            batch = wire.unpack(data)
            rows = [(u.job.id, u.attempt, u.task_indexes, 1.0, ()) for u in batch.units]
            verdicts = wire.pack(BindReplyRows(rows, [], [], 1, 0))
        core.report(verdicts, nothing, core.binder_incarnation)
    assert core.bound_tasks == n, core.bound_tasks
os._exit(0)  # no collector pass at exit: it is not the dispatcher's work
