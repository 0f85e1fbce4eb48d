"""`gosched bench --in-process`: the whole scheduler in one process over simulated nodes.

Scheduling throughput as scheduler_perf measures it: the tasks are accepted and queued first,
then the clock runs from the first dispatch to the last durable binding.
"""

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gosched.common.config import MINIMAL_PROFILE, ProfileConfig, Settings
from gosched.runtime.pipeline import Pipeline
from gosched.runtime.simulation import basic_jobs, sim_nodes


@dataclass(slots=True)
class BenchResult:
    nodes: int
    tasks: int
    shards: int
    profile: str
    bound: int
    seconds: float
    p50_ms: float
    p99_ms: float
    conflict_rate: float
    rounds: int
    component_s: dict[str, float]

    @property
    def tasks_per_s(self) -> float:
        return self.bound / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        parts = ", ".join(f"{k} {v:.2f}s" for k, v in self.component_s.items())
        return (
            f"{self.tasks_per_s:,.0f} tasks/s  ({self.bound:,} of {self.tasks:,} tasks bound "
            f"on {self.nodes:,} nodes, {self.shards} shard(s), profile {self.profile}, {self.seconds:.2f}s)\n"
            f"latency p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms; "
            f"conflict rate {self.conflict_rate:.2%}; "
            f"{self.rounds} rounds; time in {parts}"
        )


def run_scheduling_basic(
    nodes: int,
    tasks: int,
    shards: int,
    *,
    profile: ProfileConfig | None = None,
    batch_size: int = 512,
    store_dir: str | None = None,
) -> BenchResult:
    profile = profile or ProfileConfig()
    with tempfile.TemporaryDirectory(dir=store_dir) as tmp:
        settings = Settings(
            shards=shards, batch_size=batch_size, profile=profile, store_path=str(Path(tmp) / "bench.db")
        )
        pipeline = Pipeline(settings, nodes=sim_nodes(nodes, gpu_every=0))
        pipeline.submit_many(basic_jobs(tasks))
        start = time.perf_counter()
        rounds = pipeline.run_until_idle()
        seconds = time.perf_counter() - start
        stats = pipeline.stats
        lat = np.array(stats.latencies) if stats.latencies else np.zeros(1)
        pipeline.close()
        return BenchResult(
            nodes=nodes,
            tasks=tasks,
            shards=shards,
            profile=profile.name,
            bound=stats.bound_tasks,
            seconds=seconds,
            p50_ms=float(np.percentile(lat, 50) * 1000),
            p99_ms=float(np.percentile(lat, 99) * 1000),
            conflict_rate=stats.conflict_rate,
            rounds=rounds,
            component_s=dict(stats.component_s),
        )


def profiles(name: str) -> list[ProfileConfig]:
    if name == "default":
        return [ProfileConfig()]
    if name == "minimal":
        return [MINIMAL_PROFILE]
    if name == "both":
        return [ProfileConfig(), MINIMAL_PROFILE]
    raise ValueError(f"--profile must be default, minimal or both, not {name!r}")
