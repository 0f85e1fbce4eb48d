"""The dispatcher's admission per job, as the Ray actor does it: DispatcherCore.submit_many of
N SchedulingBasic jobs (or jobs of R tasks, ingest's shape) in pickled calls of C jobs, each
call unpickled inside the loop as the actor receives it.

    python admission_harness.py N MODE [R] [C]
MODE 0 stops after the set-up (the calls pickled, the store made), 1 admits every call. Under
callgrind (admission_callgrind.sh), the instructions per job are (I(1) - I(0)) / N; MODE 1 also prints
the process time of the loop (us per job).
"""

import gc
import os
import pickle
import sys
import tempfile
import time

from gosched.common.config import Settings
from gosched.common.job import Job, TaskGroup
from gosched.common.resources import ResourceRequest
from gosched.runtime.gc_tuning import tune_gc
from gosched.runtime.ray_actors import DispatcherCore
from gosched.runtime.simulation import GiB, basic_jobs, sim_nodes

n, mode = int(sys.argv[1]), sys.argv[2]
replicas = int(sys.argv[3]) if len(sys.argv) > 3 else 1
chunk = int(sys.argv[4]) if len(sys.argv) > 4 else 300
core = DispatcherCore(Settings(store_path=os.path.join(tempfile.mkdtemp(), "d.db"), shards=1))
cluster = sim_nodes(10_000, gpu_every=0)
totals = {"cpu": sum(x.cpu_milli for x in cluster), "memory": sum(x.memory for x in cluster), "gpu": 0}
core.set_nodes(cluster, totals)
if replicas == 1:
    jobs = basic_jobs(n)
else:  # ingest's: one group of R workers, a gang of all of them
    group = TaskGroup(
        role="worker",
        replicas=replicas,
        resources=ResourceRequest(cpu_milli=500, memory=GiB),
        command=("python", "work.py"),
    )
    jobs = [Job(id=f"job-{i}", groups=(group,), min_member=replicas) for i in range(n)]
calls = [pickle.dumps(jobs[i : i + chunk], protocol=5) for i in range(0, n, chunk)]
del jobs
tune_gc()
gc.collect()
if mode != "0":
    t0 = time.process_time()
    for data in calls:
        core.submit_many(pickle.loads(data))
    dt = time.process_time() - t0
    assert len(core.dispatcher._jobs) == n
    print(f"admission: {dt / n * 1e6:.2f} us per job ({n} jobs of {replicas} tasks, calls of {chunk})")
os._exit(0)  # no collector pass at exit: it is not the dispatcher's work
