"""A small throughput probe of the Ray runtime: tasks bound per second, first dispatch to last bind.

    run_ray_bench(nodes=500, tasks=10_000, shards=2) -> {"tasks_per_s": ..., ...}

Single-task jobs (runtime.simulation.basic_jobs) on simulated nodes, a fresh SQLite store in a
temporary folder. Joins the Ray instance already started in this process, or starts a local one.

The counts come from the binder's durable bindings (measured_bindings), read once the run is over:
`bound` is the measured tasks bound, each once, and `bindings` every binding of them (a task
evicted and placed again counts again), as `gosched bench` in process reports them. The
dispatcher's own bound_tasks counts every binding of any task, so it is not the benchmark's figure.
"""

import tempfile
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from gosched.common import wire
from gosched.common.config import Settings
from gosched.common.messages import Change, TaskBound
from gosched.runtime.ray_cluster import RayScheduler
from gosched.runtime.simulation import basic_jobs, sim_nodes


@dataclass(frozen=True, slots=True)
class MeasuredBindings:
    bound: int  # measured tasks bound, each once
    # Every binding of a measured task, one placed again counting again; None when the binder's
    # log could not tell (it restarted, or trimmed the run's changes): `bound` is then the measured
    # tasks it holds at the end.
    bindings: int | None
    last_bind: float | None  # the binder's clock (time.time) at the last binding of a measured task


def count_bindings(changes: Sequence[Change], resync: bool, job_ids: Collection[str]) -> MeasuredBindings:
    """MeasuredBindings from the binder's changes since the run began (Binder.changes_since): each
    TaskBound of a measured job's task is one binding, at its resident's start_time (the bind time).
    With `resync` the changes are a snapshot, one TaskBound per task held now, not the run's log."""
    jobs = job_ids if isinstance(job_ids, set | frozenset) else set(job_ids)
    tasks: set[str] = set()
    bindings = 0
    last: float | None = None
    for change in changes:
        if type(change) is not TaskBound:
            continue
        r = change.resident
        if r.job_id not in jobs:
            continue
        bindings += 1
        tasks.add(r.task_id)
        if last is None or r.start_time > last:
            last = r.start_time
    return MeasuredBindings(len(tasks), None if resync else bindings, last)


def measured_bindings(rs: RayScheduler, version: int | None, job_ids: Collection[str]) -> MeasuredBindings:
    """The measured jobs' durable bindings since the binder's `version` (its stats()' before the
    run), in two calls once the run is over: one waits for the binder's writer, one takes the
    binder's change log. `version` None (the binder restarted since): what it holds at the end."""
    ray.get(rs.binder.flush.remote())  # every batch committed is durable: the log's bindings are
    # -1 is before any log's start: the binder answers with a snapshot (resync).
    data = ray.get(rs.binder.changes_since.remote(-1 if version is None else version))
    got = wire.unpack(data)
    assert isinstance(got, tuple)
    changes, _, resync = got
    return count_bindings(changes, bool(resync), job_ids)


def run_ray_bench(nodes: int, tasks: int, shards: int, *, batch_size: int = 512) -> dict[str, Any]:
    jobs = basic_jobs(tasks)
    with tempfile.TemporaryDirectory(prefix="gosched-ray-bench-") as tmp:
        settings = Settings(store_path=str(Path(tmp) / "bench.db"), shards=shards, batch_size=batch_size)
        rs = RayScheduler(settings, sim_nodes(nodes))
        try:
            rs.submit_many(jobs)
            before = ray.get(rs.binder.stats.remote())
            started = time.time()
            t0 = time.perf_counter()
            rounds = rs.run_until_idle(timeout=600)
            wall = time.perf_counter() - t0
            stats = rs.stats()
            after = ray.get(rs.binder.stats.remote())
            same = after["incarnation"] == before["incarnation"]
            got = measured_bindings(rs, before["version"] if same else None, {j.id for j in jobs})
        finally:
            rs.shutdown()
    # First dispatch (the dispatcher's stamp; 0.0 before any) to the last binding of a measured task.
    first = max(started, stats["first_dispatch"])
    span = got.last_bind - first if got.last_bind is not None else 0.0
    return {
        "nodes": nodes,
        "shards": shards,
        "tasks": sum(j.total_replicas for j in jobs),
        "bound": got.bound,
        "bindings": got.bindings,
        "rejected_units": stats["rejected_units"],
        "rounds": rounds,
        "tasks_per_s": got.bound / span if span > 0 else 0.0,  # first dispatch -> last binding
        "wall_s": wall,  # run_until_idle as a whole, idle detection included
    }


if __name__ == "__main__":
    import sys

    args = [int(a) for a in sys.argv[1:4]] or [500, 10_000, 2]
    print(run_ray_bench(*args))
