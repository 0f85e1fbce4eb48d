"""`gosched demo`: the in-process scheduler on simulated nodes plus this machine, shown working."""

import os
import socket
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from gosched.common.config import QueueConfig, QueuePolicy, Settings
from gosched.common.job import Job, TaskGroup
from gosched.common.node import Node, make_node
from gosched.common.resources import ResourceRequest
from gosched.runtime.pipeline import Pipeline
from gosched.runtime.simulation import mixed_jobs, sim_nodes


def local_node() -> Node:
    """This machine as a node: its real CPU count and memory (GPUs come with the node agent)."""
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = int(line.split()[1]) * 1024
    except OSError:
        mem = 8 * 2**30
    return make_node(
        f"local-{socket.gethostname()}", (os.cpu_count() or 1) * 1000, mem, labels={"local": "true"}
    )


def run_demo(nodes: int, jobs: int, shards: int, echo: Callable[[str], None] = print) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            shards=shards,
            store_path=str(Path(tmp) / "demo.db"),
            queues=[
                QueueConfig(name="default", policy=QueuePolicy.PRIORITY, guarantee=0.5),
                QueueConfig(name="research", policy=QueuePolicy.DRF, guarantee=0.3, max_share=0.6),
            ],
        )
        cluster = [*sim_nodes(nodes), local_node()]
        pipeline = Pipeline(settings, nodes=cluster)
        echo(f"cluster: {len(cluster)} nodes ({sum(len(n.gpus) for n in cluster)} GPUs), {shards} shards")
        workload: list[Job] = list(mixed_jobs(jobs))
        too_big = Job(
            id="too-big",
            groups=(TaskGroup("main", 1, ResourceRequest(cpu_milli=1000, gpus=16), ("true",)),),
        )
        start = time.perf_counter()
        pipeline.submit_many([*workload, too_big])
        pipeline.run_until_idle()
        elapsed = time.perf_counter() - start
        states: Counter[str] = Counter()
        for job in [*workload, too_big]:
            states[pipeline.dispatcher.job_state(job.id).value] += 1
        stats = pipeline.stats
        echo(f"submitted {len(workload) + 1} jobs; scheduled in {elapsed:.2f}s ({stats.rounds} rounds)")
        echo("jobs by state: " + ", ".join(f"{k} {v}" for k, v in sorted(states.items())))
        echo(f"tasks bound: {stats.bound_tasks}; binder conflicts: {stats.conflict_rate:.1%}")
        state = pipeline.binder.state
        used_gpu = int(state.gpu_used_total[: state.n].sum()) / 1000
        total_gpu = int(state.gpu_count[: state.n].sum())
        used_cpu = int(state.cpu_used[: state.n].sum()) / 1000
        total_cpu = int(state.cpu_cap[: state.n].sum()) / 1000
        echo(
            f"GPUs allocated: {used_gpu:.1f} of {total_gpu}; "
            f"CPUs allocated: {used_cpu:.0f} of {total_cpu:.0f}"
        )
        echo(f"why is 'too-big' pending? {pipeline.dispatcher.explain('too-big')}")
        pipeline.close()
