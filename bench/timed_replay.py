"""The trace replayed in time through the running system (`gosched replay --timed`).

Each trace task is submitted at its creation time and, once placed, runs for its lifetime
(deletion - scheduled time), both divided by the compression factor, on the trace's GPU nodes as
simulated nodes of a real master (its gRPC API, its scheduler on Ray or in process). Every
`sample_s` of wall time the replay records the GPU and CPU allocation and the tasks waiting, and
notes each job's queueing delay (submission to leaving the pending state, to within one sample).
Times are reported in trace seconds (wall seconds times the factor).
"""

import csv
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import numpy as np

from gosched.api.server import serve
from gosched.bench.trace import TraceTask, task_from_row
from gosched.common.config import Settings
from gosched.common.node import Node
from gosched.proto.v1 import cluster_pb2, cluster_pb2_grpc, jobs_pb2, jobs_pb2_grpc
from gosched.proto.v1 import types_pb2 as pb
from gosched.runtime.sim_tasks import SIM_SECONDS_LABEL


@dataclass(frozen=True, slots=True)
class TimedTask:
    task: TraceTask
    created: float
    lifetime: float  # seconds it ran in the trace (deletion - scheduled, or - created)


def load_timed_tasks(path: Path) -> list[TimedTask]:
    """Tasks of `openb_pod_list_default.csv` with their creation time and lifetime, by creation."""
    out = []
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            task = task_from_row(r)
            created = float(r["creation_time"] or 0)
            started = float(r["scheduled_time"] or created)
            deleted = float(r["deletion_time"] or started)
            out.append(TimedTask(task, created, max(0.0, deleted - started)))
    out.sort(key=lambda t: t.created)
    return out


@dataclass(slots=True)
class Sample:
    trace_time: float
    gpu_alloc: float  # allocated milli-GPU / total
    cpu_alloc: float
    pending_jobs: int
    submitted: int


@dataclass(slots=True)
class TimedResult:
    runtime: str
    compress: float
    tasks: int
    submitted: int
    started: int
    wall_s: float
    samples: list[Sample] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)  # trace seconds, per started job

    def delay_percentiles(self) -> dict[str, float]:
        if not self.delays:
            return {}
        a = np.asarray(self.delays)
        return {f"p{q}": float(np.percentile(a, q)) for q in (50, 95, 99)} | {"mean": float(a.mean())}

    def mean_gpu_alloc(self) -> float:
        return float(np.mean([s.gpu_alloc for s in self.samples])) if self.samples else 0.0

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["delay_percentiles_trace_s"] = self.delay_percentiles()
        out["mean_gpu_alloc"] = self.mean_gpu_alloc()
        out.pop("delays")
        return out


def _spec(i: int, t: TimedTask, compress: float) -> pb.JobSpec:
    res = pb.Resources(cpu=f"{t.task.cpu_milli}m", memory=str(t.task.memory))
    if t.task.num_gpu == 1 and t.task.gpu_milli < 1000:
        res.gpu_milli = t.task.gpu_milli
    elif t.task.num_gpu:
        res.gpus = str(t.task.num_gpu)
    group = pb.TaskGroup(role="main", replicas=1, command=["true"], resources=res)
    spec = pb.JobSpec(id=f"trace-{i}", groups=[group])
    spec.labels[SIM_SECONDS_LABEL] = f"{t.lifetime / compress:.6f}"
    return spec


def run_timed_replay(
    nodes: list[Node],
    tasks: list[TimedTask],
    *,
    compress: float,
    runtime: str = "local",
    sample_s: float = 0.25,
    limit_s: float | None = None,
    progress: Callable[[float], None] | None = None,
) -> TimedResult:
    """Replay `tasks` (sorted by creation) on `nodes`; stops when all were submitted and none waits,
    or after `limit_s` wall seconds."""
    if compress <= 0:
        raise ValueError(f"compress must be > 0, got {compress}")
    t0_trace = tasks[0].created if tasks else 0.0
    result = TimedResult(runtime, compress, len(tasks), 0, 0, 0.0)
    with tempfile.TemporaryDirectory(prefix="gosched-timed-") as tmp:
        settings = Settings(store_path=str(Path(tmp) / "replay.db"), shards=2, retry_backoff_max_s=0.5)
        handle = serve(
            settings,
            nodes,
            grpc_port=0,
            http_port=None,
            host="127.0.0.1",
            runtime=runtime,
            sim_task_seconds=0.0,
            wait_ready=True,
        )
        try:
            with grpc.insecure_channel(handle.target) as channel:
                jobs = jobs_pb2_grpc.JobServiceStub(channel)
                cluster = cluster_pb2_grpc.ClusterServiceStub(channel)
                _drive(jobs, cluster, tasks, t0_trace, compress, sample_s, limit_s, result, progress)
        finally:
            handle.stop()
    return result


def _drive(
    jobs: jobs_pb2_grpc.JobServiceStub,
    cluster: cluster_pb2_grpc.ClusterServiceStub,
    tasks: list[TimedTask],
    t0_trace: float,
    compress: float,
    sample_s: float,
    limit_s: float | None,
    result: TimedResult,
    progress: Callable[[float], None] | None,
) -> None:
    waiting: dict[str, float] = {}  # job id -> wall time submitted
    start = time.monotonic()
    nxt = 0
    next_sample = start
    while True:
        now = time.monotonic()
        wall = now - start
        due = t0_trace + wall * compress
        request = jobs_pb2.SubmitJobsRequest()
        while nxt < len(tasks) and tasks[nxt].created <= due:
            request.jobs.add().spec.CopyFrom(_spec(nxt, tasks[nxt], compress))
            waiting[f"trace-{nxt}"] = now
            nxt += 1
        if request.jobs:
            jobs.SubmitJobs(request, timeout=120)
            result.submitted = nxt
        if now >= next_sample:
            next_sample = now + sample_s
            pending = _pending_ids(jobs)
            for job_id in [j for j in waiting if j not in pending]:
                result.delays.append((now - waiting.pop(job_id)) * compress)
                result.started += 1
            st = cluster.GetStatus(cluster_pb2.GetStatusRequest(), timeout=30)
            result.samples.append(
                Sample(
                    trace_time=wall * compress,
                    gpu_alloc=st.gpu_used_milli / st.gpu_milli if st.gpu_milli else 0.0,
                    cpu_alloc=st.cpu_used_milli / st.cpu_milli if st.cpu_milli else 0.0,
                    pending_jobs=len(pending),
                    submitted=nxt,
                )
            )
            if progress is not None:
                progress(nxt / max(1, len(tasks)))
            if nxt >= len(tasks) and not waiting:
                break
        if limit_s is not None and wall > limit_s:
            break
        time.sleep(0.01)
    result.wall_s = time.monotonic() - start


def _pending_ids(jobs: jobs_pb2_grpc.JobServiceStub) -> set[str]:
    out: set[str] = set()
    token = ""
    while True:
        page = jobs.ListJobs(
            jobs_pb2.ListJobsRequest(state=pb.JOB_STATE_PENDING, page_size=1000, page_token=token), timeout=30
        )
        out.update(j.id for j in page.jobs)
        token = page.next_page_token
        if not token:
            return out


def summary(r: TimedResult) -> str:
    d = r.delay_percentiles()
    delays = ", ".join(f"{k} {v:,.0f}s" for k, v in d.items()) or "none started"
    return (
        f"timed replay ({r.runtime}, x{r.compress:,.0f}): {r.submitted:,}/{r.tasks:,} submitted, "
        f"{r.started:,} started in {r.wall_s:.1f}s wall; mean GPU allocation {r.mean_gpu_alloc():.1%}; "
        f"queueing delay (trace time) {delays}"
    )


def write_timed(r: TimedResult, out_dir: Path) -> list[Path]:
    """timed.json (samples and delays), timed.txt (the summary) and timed.png (allocation and
    waiting jobs over trace time)."""
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "timed.json", out_dir / "timed.txt"]
    paths[0].write_text(json.dumps(r.as_dict(), indent=2))
    paths[1].write_text(summary(r) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the JSON carries the numbers
        return paths
    fig, ax = plt.subplots(figsize=(7, 4))
    days = [s.trace_time / 86400 for s in r.samples]
    ax.plot(days, [100 * s.gpu_alloc for s in r.samples], label="GPU allocated (%)")
    ax.plot(days, [100 * s.cpu_alloc for s in r.samples], label="CPU allocated (%)")
    ax.set_xlabel("trace time (days)")
    ax.set_ylabel("allocated (%)")
    ax2 = ax.twinx()
    ax2.plot(days, [s.pending_jobs for s in r.samples], color="grey", linestyle=":", label="jobs waiting")
    ax2.set_ylabel("jobs waiting")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"openb-v2023 replayed in time (x{r.compress:,.0f})")
    fig.tight_layout()
    fig.savefig(out_dir / "timed.png", dpi=120)
    plt.close(fig)
    paths.append(out_dir / "timed.png")
    return paths
