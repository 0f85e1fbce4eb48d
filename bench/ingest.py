"""Ingest throughput, as scheduler_perf separates it from scheduling throughput: tasks submitted
through the gRPC API by one client, in batches (SubmitJobs), while the master runs.

The clock runs from the first request sent to the last answer received, so it covers the client's
message building, gRPC on loopback, the server's validation and admission, and the durable write
of every job and task row before each answer.
"""

import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import grpc
import numpy as np

from gosched.api.server import serve
from gosched.common.config import Settings
from gosched.proto.v1 import jobs_pb2, jobs_pb2_grpc
from gosched.proto.v1 import types_pb2 as pb
from gosched.runtime.simulation import sim_nodes


@dataclass(slots=True)
class IngestResult:
    runtime: str
    jobs: int
    replicas: int  # tasks per job
    batch: int  # jobs per SubmitJobs call (the last call may take fewer)
    calls: int  # SubmitJobs calls made
    accepted_tasks: int
    seconds: float
    p50_call_ms: float
    p99_call_ms: float

    @property
    def tasks_per_s(self) -> float:
        return self.accepted_tasks / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "tasks_per_s": self.tasks_per_s}


def ingest_line(r: IngestResult) -> str:
    """The result in one line, as `gosched bench --ingest` prints it."""
    calls = f"{r.calls:,} call" + ("s" if r.calls != 1 else "")
    per_call = f"{r.batch:,} jobs" if r.jobs % r.batch == 0 else f"up to {r.batch:,} jobs"
    return (
        f"{r.tasks_per_s:,.0f} tasks/s ingest ({r.accepted_tasks:,} tasks in {r.jobs:,} jobs of "
        f"{r.replicas:,} tasks, {calls} of {per_call}, {r.runtime}; call p50 {r.p50_call_ms:.0f} ms, "
        f"p99 {r.p99_call_ms:.0f} ms)"
    )


def call_percentiles_ms(calls: list[float]) -> tuple[float, float]:
    """(p50, p99) of the calls' seconds, in ms, as the runs' latencies are read (numpy's linear
    percentiles): picking calls[int(n * 0.99)] read the slowest call as the p99 of 100 calls."""
    p50, p99 = np.percentile(np.array(calls) * 1000, [50, 99])
    return float(p50), float(p99)


def _template(replicas: int) -> pb.JobSpec:
    return pb.JobSpec(
        min_member=replicas,
        groups=[
            pb.TaskGroup(
                role="worker",
                replicas=replicas,
                command=["python", "work.py"],
                resources=pb.Resources(cpu="500m", memory="1Gi"),
            )
        ],
    )


def run_ingest(
    tasks: int,
    *,
    replicas: int = 10,
    batch: int = 500,
    runtime: Literal["ray", "local"] = "local",
    nodes: int = 1000,
) -> IngestResult:
    """Submit `tasks` tasks (jobs of `replicas` tasks, `batch` jobs a call) to a fresh master."""
    jobs = max(1, tasks // replicas)
    with tempfile.TemporaryDirectory(prefix="gosched-ingest-") as tmp:
        settings = Settings(store_path=str(Path(tmp) / "ingest.db"), shards=2, runtime=runtime)
        handle = serve(
            settings,
            sim_nodes(nodes),
            grpc_port=0,
            http_port=None,
            host="127.0.0.1",
            runtime=runtime,
            wait_ready=True,
        )
        try:
            with grpc.insecure_channel(handle.target) as channel:
                stub = jobs_pb2_grpc.JobServiceStub(channel)
                template = _template(replicas)
                calls: list[float] = []
                accepted = 0
                start = time.perf_counter()
                for first in range(0, jobs, batch):
                    request = jobs_pb2.SubmitJobsRequest()
                    for i in range(first, min(first + batch, jobs)):
                        item = request.jobs.add()
                        item.spec.CopyFrom(template)
                        item.spec.id = f"ingest-{i}"
                    t0 = time.perf_counter()
                    reply = stub.SubmitJobs(request, timeout=120)
                    calls.append(time.perf_counter() - t0)
                    accepted += len(reply.job_ids) * replicas
                seconds = time.perf_counter() - start
        finally:
            handle.stop()
    p50_ms, p99_ms = call_percentiles_ms(calls)
    return IngestResult(
        runtime=runtime,
        jobs=jobs,
        replicas=replicas,
        batch=min(batch, jobs),  # asked for more a call than there are jobs: all of them in one
        calls=len(calls),
        accepted_tasks=accepted,
        seconds=seconds,
        p50_call_ms=p50_ms,
        p99_call_ms=p99_ms,
    )
