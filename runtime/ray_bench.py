"""A small throughput probe of the Ray runtime: tasks bound per second, first dispatch to last bind.

    run_ray_bench(nodes=500, tasks=10_000, shards=2) -> {"tasks_per_s": ..., ...}

Single-task jobs (runtime.simulation.basic_jobs) on simulated nodes, a fresh SQLite store in a
temporary folder. Joins the Ray instance already started in this process, or starts a local one.
"""

import tempfile
import time
from pathlib import Path
from typing import Any

from gosched.common.config import Settings
from gosched.runtime.ray_cluster import RayScheduler
from gosched.runtime.simulation import basic_jobs, sim_nodes


def run_ray_bench(nodes: int, tasks: int, shards: int, *, batch_size: int = 512) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gosched-ray-bench-") as tmp:
        settings = Settings(store_path=str(Path(tmp) / "bench.db"), shards=shards, batch_size=batch_size)
        rs = RayScheduler(settings, sim_nodes(nodes))
        try:
            rs.submit_many(basic_jobs(tasks))
            t0 = time.perf_counter()
            rounds = rs.run_until_idle(timeout=600)
            wall = time.perf_counter() - t0
            stats = rs.stats()
        finally:
            rs.shutdown()
    return {
        "nodes": nodes,
        "tasks": tasks,
        "shards": shards,
        "bound_tasks": stats["bound_tasks"],
        "rejected_units": stats["rejected_units"],
        "rounds": rounds,
        "tasks_per_s": stats["tasks_per_s"],  # first dispatch -> last binding
        "wall_s": wall,  # run_until_idle as a whole, idle detection included
    }


if __name__ == "__main__":
    import sys

    args = [int(a) for a in sys.argv[1:4]] or [500, 10_000, 2]
    print(run_ray_bench(*args))
