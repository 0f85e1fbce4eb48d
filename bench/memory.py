"""`gosched bench --memory`: the control plane's memory with N nodes and M tasks pending.

The dispatcher, the binder and the shards run as Ray actors; the tasks are accepted (stored and
queued) but not dispatched, and every shard has synced its view of all the nodes. Reported: the
resident memory of each of our processes (the actors and this driver, which stands in for the
master's API process), and apart from them Ray's own daemons.
"""

import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from gosched.bench.ray_daemons import daemons_rss_mib
from gosched.common.config import Settings
from gosched.runtime.simulation import basic_jobs, sim_nodes

SUBMIT_CHUNK = 10_000


@dataclass(slots=True)
class MemoryResult:
    nodes: int
    pending_tasks: int
    shards: int
    rss_mib: dict[str, float] = field(default_factory=dict)  # per process of ours, now
    ray_daemons_mib: float = 0.0

    @property
    def control_plane_mib(self) -> float:
        return sum(self.rss_mib.values())

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "control_plane_mib": self.control_plane_mib}


def measure_memory(nodes: int, pending: int, shards: int) -> MemoryResult:
    from gosched.runtime.ray_cluster import RayScheduler

    with tempfile.TemporaryDirectory(prefix="gosched-mem-") as tmp:
        settings = Settings(shards=shards, store_path=str(Path(tmp) / "mem.db"))
        rs = RayScheduler(settings, sim_nodes(nodes, gpu_every=4))
        try:
            for start in range(0, pending, SUBMIT_CHUNK):
                rs.submit_many(basic_jobs(min(SUBMIT_CHUNK, pending - start), start=start))
            rs.sync_shards()
            rss = {name: p["rss_mib"] for name, p in rs.process_stats().items()}
            rss["driver"] = psutil.Process().memory_info().rss / 2**20
            return MemoryResult(nodes, pending, shards, rss, daemons_rss_mib())
        finally:
            rs.shutdown()
