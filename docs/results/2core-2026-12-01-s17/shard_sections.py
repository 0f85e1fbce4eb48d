"""The shard's round in the one-process `gosched bench --bodies` setting (a DispatcherCore, a
BinderCore with its writer process, a SchedulerShard and a second shard's view), timed by section:
unpacking the units, scheduling, packing the proposals, unpacking the verdicts and the segments,
applying the reply; the bytes per task of each message; the collector's counts at the end.

    python shard_sections.py [--no-collector] [--columns-off]

--no-collector turns the cyclic collector off (else the runtime's thresholds, tune_gc);
--columns-off makes the binder take the object path for every batch (no commit_columns).
"""

import gc
import sys
import tempfile
import time
from pathlib import Path

from gosched.bench.actor_bodies import _NoDispatcher
from gosched.binder.binder import Binder
from gosched.common import wire
from gosched.common.config import Settings
from gosched.runtime.gc_tuning import tune_gc
from gosched.runtime.ray_actors import BinderCore, DispatcherCore
from gosched.runtime.simulation import basic_jobs, sim_nodes
from gosched.scheduler_shard.shard import SchedulerShard

TASKS, NODES = 50_000, 10_000


def main() -> None:
    if "--columns-off" in sys.argv:
        Binder.commit_columns = lambda self, batch: None  # type: ignore[method-assign,assignment]
    tmp = Path(tempfile.mkdtemp())
    settings = Settings(store_path=str(tmp / "shard.db"), shards=1)
    dispatcher = DispatcherCore(settings)
    binder = BinderCore(settings.store_path, _NoDispatcher(), on_writer_failure=None)
    cluster = sim_nodes(NODES, gpu_every=0)
    binder.add_nodes(cluster)
    dispatcher.set_nodes(cluster, binder.cluster()[1])
    dispatcher.submit_many(basic_jobs(TASKS))
    shard, other = SchedulerShard(0, settings.profile), SchedulerShard(1, settings.profile)
    for view in (shard, other):
        view.sync(*wire.unpack(binder.changes_since(0)))
    tune_gc()
    gc.collect()
    if "--no-collector" in sys.argv:
        gc.disable()
    spent = dict.fromkeys(("units", "schedule", "pack", "verdicts", "segments", "apply"), 0.0)
    size = dict.fromkeys(("units", "proposals", "verdicts", "segments"), 0)
    clock = time.perf_counter
    while True:
        _, data = dispatcher.next_batch(0)
        if data is None:
            break
        t0 = clock()
        batch = wire.unpack(data)
        t1 = clock()
        planned = shard.schedule(batch)
        planned.seen_version = shard.version
        t2 = clock()
        proposals = wire.pack(planned)
        t3 = clock()
        _, verdicts, segments, version, resync = binder.commit(proposals)
        t4 = clock()
        reply = wire.unpack(verdicts)
        t5 = clock()
        for segment in segments:
            reply.changes.extend(wire.unpack(segment))
        t6 = clock()
        reply.version, reply.resync = version, resync
        shard.apply_reply(reply)
        t7 = clock()
        for key, took in zip(spent, (t1 - t0, t2 - t1, t3 - t2, t5 - t4, t6 - t5, t7 - t6), strict=True):
            spent[key] += took
        sizes = (len(data), len(proposals), len(verdicts), sum(map(len, segments)))
        for key, n in zip(size, sizes, strict=True):
            size[key] += n
        taken: list[object] = []
        for segment in segments:
            taken.extend(wire.unpack(segment))
        other.sync(taken, version, resync)
        dispatcher.report(verdicts, wire.pack(planned.unschedulable), dispatcher.binder_incarnation)
    binder.close()
    print(" ".join(f"{k}={v / TASKS * 1e6:.2f}us" for k, v in spent.items()))
    print(" ".join(f"{k}={v / TASKS:.1f}B" for k, v in size.items()))
    print("collections per generation:", [s["collections"] for s in gc.get_stats()])


if __name__ == "__main__":
    main()
