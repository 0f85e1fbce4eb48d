"""Runs a workload through the scheduler, in process or through the Ray actors, and measures it.

Throughput is scheduling throughput as scheduler_perf reports it: the measured tasks are accepted
and queued first, then the clock runs from the first dispatch to the last durable binding. The
bindings counted are the measured tasks bound, each once: a task evicted (by a measured task of a
higher priority) and placed again is counted in `bindings`, not twice in `bound`.
"""

import resource
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from gosched.bench.ray_daemons import daemons_cpu_s
from gosched.bench.workloads import Workload
from gosched.common.config import ProfileConfig, Settings
from gosched.common.job import Job
from gosched.common.messages import BindReply, ProposalBatch
from gosched.runtime.pipeline import Pipeline


@dataclass(slots=True)
class RunResult:
    workload: str
    runtime: str  # in-process | ray
    profile: str
    nodes: int
    shards: int
    tasks: int  # measured tasks
    bound: int  # measured tasks bound, each once (on Ray: of the binder's durable bindings)
    seconds: float  # first dispatch to the last binding of a measured task
    conflict_rate: float
    retries: int  # units proposed again after a rejection or an unschedulable verdict
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    component_s: dict[str, float] = field(default_factory=dict)  # busy seconds per component
    # CPU seconds per component's processes during the run (Ray: each actor is a process; with a
    # rate, the dispatcher's includes taking the submissions)
    component_cpu_s: dict[str, float] = field(default_factory=dict)
    # Ray: CPU seconds of each serial part (the dispatcher's call thread; the binder's call thread
    # and the thread that takes its writer's acks, which share the interpreter's lock; the
    # binder's store writer; the busiest shard's call thread). With a core each, a part busy the
    # whole run caps the throughput at tasks / these seconds.
    serial_cpu_s: dict[str, float] = field(default_factory=dict)
    # Ray: CPU seconds of Ray's own daemons on this machine during the run (raylet, GCS, ...)
    ray_daemons_cpu_s: float | None = None
    # Ray: bytes of the binder's answers to the commits (verdicts and change segments), and the
    # largest one since the binder started: past the actors' inline limit an answer goes through
    # the object store
    reply_bytes: int | None = None
    largest_reply_bytes: int | None = None
    peak_rss_mib: float = 0.0  # the whole control plane: this process, plus every actor on Ray
    process_rss_mib: dict[str, float] = field(default_factory=dict)  # peak per process (Ray)
    offered_rate: float | None = None  # tasks/s arriving during the run (open loop), else queued first
    asked: int | None = None  # the tasks asked for (--pods), when the workload measures fewer
    note: str = ""  # the workload's why (Workload.note)
    # Bindings of measured tasks, a task placed again counting again (None on Ray when the binder's
    # log could not tell: it restarted during the run, or trimmed the run's changes)
    bindings: int | None = None

    @property
    def tasks_per_s(self) -> float:
        return self.bound / self.seconds if self.seconds > 0 else 0.0

    @property
    def serial_cap_tasks_per_s(self) -> float | None:
        """Tasks/s the busiest serial thread would allow alone, were each part given a core."""
        busiest = max(self.serial_cpu_s.values(), default=0.0)
        return self.bound / busiest if busiest > 0 else None

    def as_dict(self) -> dict[str, object]:
        return {
            **asdict(self),
            "tasks_per_s": self.tasks_per_s,
            "serial_cap_tasks_per_s": self.serial_cap_tasks_per_s,
        }


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Bindings:
    """The measured tasks' bindings as the binder answers them, each task counted once: wraps the
    pipeline's binder.commit (in process a commit is durable when it returns).

    A task counts as bound whatever its dispatch stamp reads: 0.0 is a time like any other (a
    clock whose origin is the run's start, a test's frozen clock), not "no stamp"."""

    def __init__(self, p: Pipeline, measured: list[Job]) -> None:
        self.jobs = {j.id for j in measured}
        self.bound: set[tuple[str, int]] = set()  # the measured tasks bound, each once
        self.first: dict[tuple[str, int], float] = {}  # task -> seconds, dispatch to first binding
        self.bindings = 0
        self.last_s: float | None = None  # perf_counter at the last commit binding a measured task
        commit = p.binder.commit

        def counted(batch: ProposalBatch, *args: object, **kwargs: object) -> BindReply:
            reply = commit(batch, *args, **kwargs)  # type: ignore[arg-type]
            self.note(batch, reply)
            return reply

        p.binder.commit = counted  # type: ignore[method-assign]

    def note(self, batch: ProposalBatch, reply: BindReply) -> None:
        dispatched = {q.job.id: q.dispatch_time for q in batch.proposals}
        bound_any = False
        for acc in reply.accepted:
            if acc.job_id not in self.jobs:
                continue
            started = dispatched.get(acc.job_id)  # None: not proposed in this batch (no latency)
            for index in acc.task_indexes:
                self.bindings += 1
                bound_any = True
                task = (acc.job_id, index)
                if task in self.bound:
                    continue  # bound again: its latency is its first binding's
                self.bound.add(task)
                if started is not None:
                    self.first[task] = acc.bind_time - started
        if bound_any:
            self.last_s = time.perf_counter()


def _run_until_idle(p: Pipeline) -> None:
    """Pipeline.run_until_idle(wait_backoff=True), as on Ray: jobs backing off after a change that
    may have made room are waited for (the waits after the last binding are not the run's time)."""
    while True:
        if p.step():
            continue
        if p.dispatcher.waiting_count() > 0:
            time.sleep(p.settings.retry_backoff_s)
            continue
        return


def run_in_process(w: Workload, shards: int, profile: ProfileConfig, batch_size: int = 512) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="gosched-bench-") as tmp:
        settings = Settings(
            shards=shards, batch_size=batch_size, profile=profile, store_path=str(Path(tmp) / "bench.db")
        )
        p = Pipeline(settings, nodes=w.nodes)
        if w.initial:
            p.submit_many(w.initial)
            p.run_until_idle()
            # "Already running": every shard knows of it before the clock starts, as in a cluster
            # that has been up a while (and as scheduler_perf waits for its informers' caches).
            p.sync_shards()
        before = p.stats.proposals, p.stats.rejected_units, p.stats.unschedulable_units
        comp_before = dict(p.stats.component_s)
        bindings = _Bindings(p, w.measured)
        p.submit_many(w.measured)
        start = time.perf_counter()
        _run_until_idle(p)
        end = time.perf_counter() if bindings.last_s is None else bindings.last_s
        s = p.stats
        proposals = s.proposals - before[0]
        rejected = s.rejected_units - before[1]
        lat = np.array(list(bindings.first.values())) * 1000 if bindings.first else None
        result = RunResult(
            workload=w.name,
            runtime="in-process",
            profile=profile.name,
            nodes=len(w.nodes),
            shards=shards,
            tasks=w.measured_tasks,
            bound=len(bindings.bound),
            seconds=end - start,
            conflict_rate=rejected / proposals if proposals else 0.0,
            retries=rejected + (s.unschedulable_units - before[2]),
            p50_ms=None if lat is None else float(np.percentile(lat, 50)),
            p95_ms=None if lat is None else float(np.percentile(lat, 95)),
            p99_ms=None if lat is None else float(np.percentile(lat, 99)),
            component_s={k: v - comp_before.get(k, 0.0) for k, v in s.component_s.items()},
            peak_rss_mib=_peak_rss_mib(),
            asked=w.asked if w.asked != w.measured_tasks else None,
            note=w.note,
            bindings=bindings.bindings,
        )
        p.close()
        return result


def _percentiles(seconds: list[float]) -> tuple[float | None, float | None, float | None]:
    if not seconds:
        return None, None, None
    ms = np.array(seconds) * 1000
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return float(p50), float(p95), float(p99)


class _Submitter(threading.Thread):
    """Open-loop arrivals: submits the jobs at `rate` tasks per second, in 10 ms slices, whatever
    the scheduler's pace (so the latency is what a steady arrival rate sees)."""

    SLICE_S = 0.01

    def __init__(self, submit: Callable[[list[Job]], object], jobs: list[Job], rate: float) -> None:
        super().__init__(daemon=True)
        self.submit, self.jobs, self.rate = submit, jobs, rate
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            start = time.perf_counter()
            sent = tasks = 0
            while sent < len(self.jobs):
                due = self.rate * (time.perf_counter() - start)
                chunk: list[Job] = []
                while sent < len(self.jobs) and tasks < due:
                    chunk.append(self.jobs[sent])
                    tasks += self.jobs[sent].total_replicas
                    sent += 1
                if chunk:
                    self.submit(chunk)
                time.sleep(self.SLICE_S)
        except BaseException as exc:  # surfaced by the runner
            self.error = exc
        finally:
            self.done.set()


def _serial_cpu_s(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, float]:
    """RunResult.serial_cpu_s from the actors' process_stats before and after the run."""

    def spent(name: str, key: str) -> float:
        return after[name].get(key, 0.0) - before[name].get(key, 0.0)

    parts: tuple[str, ...] = ("dispatcher", "binder")
    serial = {part: spent(part, "call_cpu_s") for part in parts if part in after}
    if "binder" in after:
        # Its ack thread takes the interpreter's lock in turn with the call thread: one serial part.
        serial["binder"] += spent("binder", "acks_cpu_s")
    if "binder" in after and "writer_cpu_s" in after["binder"]:
        serial["writer"] = spent("binder", "writer_cpu_s")
    shards = [spent(name, "call_cpu_s") for name in after if name.startswith("shard")]
    if shards:
        serial["busiest shard"] = max(shards)
    return serial


def _writer_cpu_s(before: dict[str, object], after: dict[str, object]) -> float | None:
    """The binder's store writer's CPU seconds between two of the binder actor's stats(), as the
    writer reports them with each ack (its process_time, to the microsecond): process_stats reads
    the writer's CPU from /proc in the kernel's ticks (10 ms), so a run with less writing than a
    tick or two (a few thousand tasks) read 0.0 us a task. None without a writer, or when it is
    another one than before (the binder restarted)."""
    pid = after.get("writer_pid")
    if pid is None or pid != before.get("writer_pid"):
        return None
    return float(after["writer_busy_s"]) - float(before["writer_busy_s"])  # type: ignore[arg-type]


def run_ray(
    w: Workload, shards: int, profile: ProfileConfig, batch_size: int = 512, rate: float | None = None
) -> RunResult:
    """One run through the real Ray actors. With `rate` (tasks/s) the measured jobs arrive at that
    rate while the shards run, and the latency is submission to binding; without it they are all
    queued first and the latency is dispatch to binding."""
    import ray

    from gosched.runtime.ray_bench import measured_bindings
    from gosched.runtime.ray_cluster import RayScheduler

    with tempfile.TemporaryDirectory(prefix="gosched-bench-") as tmp:
        settings = Settings(
            shards=shards, batch_size=batch_size, profile=profile, store_path=str(Path(tmp) / "bench.db")
        )
        rs = RayScheduler(settings, w.nodes)
        try:
            if w.initial:
                rs.submit_many(w.initial)
                rs.run_until_idle(timeout=600)
                rs.sync_shards()  # as in run_in_process
            rs.drain_latencies()
            rs.reset_largest_reply()  # the warm-up's replies are not the run's
            before, procs_before = rs.stats(), rs.process_stats()
            binder_before = ray.get(rs.binder.stats.remote())
            daemons_before = daemons_cpu_s()
            start, started = time.perf_counter(), time.time()
            if rate is None:
                rs.submit_many(w.measured)
                procs_before = rs.process_stats()  # queued first: their submission is not the run's
                binder_before = ray.get(rs.binder.stats.remote())
                daemons_before = daemons_cpu_s()
                start, started = time.perf_counter(), time.time()
                rs.run_until_idle(timeout=1800)
            else:
                sub = _Submitter(rs.submit_many, w.measured, rate)
                sub.start()
                rs.run_until_idle(timeout=1800, more_coming=lambda: not sub.done.is_set())
                sub.join()
                if sub.error is not None:
                    raise sub.error
            wall = time.perf_counter() - start
            stats, procs = rs.stats(), rs.process_stats()
            binder_after = ray.get(rs.binder.stats.remote())  # every write acked: all reported
            daemons = daemons_cpu_s() - daemons_before
            dispatched, waited = rs.drain_latencies()
            # The clock has stopped: the measured tasks' bindings from the binder's log (two calls).
            same_binder = binder_after["incarnation"] == binder_before["incarnation"]
            measured = measured_bindings(
                rs, binder_before["version"] if same_binder else None, {j.id for j in w.measured}
            )
        finally:
            rs.shutdown()
    # From the first dispatch of the run (the dispatcher's stamp: the warm-up's, when there was
    # one, is before `started`) to the last binding of a measured task (the binder's; both actors
    # run on this machine, on its clock), as in process; the wall time when nothing bound.
    first = max(started, stats["first_dispatch"])
    seconds = measured.last_bind - first if measured.last_bind is not None else wall
    proposals = max(1, stats.get("proposals", 0) - before.get("proposals", 0))
    rejected = stats.get("rejected_units", 0) - before.get("rejected_units", 0)
    p50, p95, p99 = _percentiles(waited if rate else dispatched)
    component = {"dispatcher": 0.0, "shards": 0.0, "binder": 0.0}
    cpu = dict.fromkeys(component, 0.0)
    for name, p in procs.items():
        key = "shards" if name.startswith("shard") else name
        component[key] += p["busy_s"] - procs_before[name]["busy_s"]
        cpu[key] += p["cpu_s"] - procs_before[name]["cpu_s"]
    serial = _serial_cpu_s(procs_before, procs)
    writer = _writer_cpu_s(binder_before, binder_after)
    if writer is not None and "writer" in serial:
        cpu["binder"] += writer - serial["writer"]  # the same seconds, to the microsecond, not in ticks
        serial["writer"] = writer
    rss = {name: p["peak_rss_mib"] for name, p in procs.items()}
    rss["driver"] = _peak_rss_mib()
    return RunResult(
        workload=w.name,
        runtime="ray",
        profile=profile.name,
        nodes=len(w.nodes),
        shards=shards,
        tasks=w.measured_tasks,
        bound=measured.bound,
        seconds=seconds,
        conflict_rate=rejected / proposals,
        retries=rejected + stats.get("unschedulable_units", 0) - before.get("unschedulable_units", 0),
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        component_s=component,
        component_cpu_s=cpu,
        serial_cpu_s=serial,
        ray_daemons_cpu_s=daemons,
        reply_bytes=stats["reply_bytes"] - before["reply_bytes"],
        largest_reply_bytes=stats["largest_reply"],
        peak_rss_mib=sum(rss.values()),
        process_rss_mib=rss,
        offered_rate=rate,
        asked=w.asked if w.asked != w.measured_tasks else None,
        note=w.note,
        bindings=measured.bindings,
    )
