"""SchedulerService: one Pipeline, one scheduling thread, and the thread-safe calls the API serves.

The Pipeline is not thread-safe, so every call into it holds `lock`: the scheduling thread holds it
for one `step()` at a time, the gRPC handlers for one short query or command. After every step that
dispatched something and after every command, `version` is bumped and the condition notified; a
watcher waits on it and then diffs the job's state against what it sent last (cheap: one job).

Errors are raised as the small exceptions below (and SpecError / AdmissionRejected from common);
`gosched.api.server` maps them to gRPC status codes.
"""

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from gosched.common.config import Settings
from gosched.common.errors import SpecError
from gosched.common.job import Job, task_id
from gosched.common.node import Node, NodeState
from gosched.common.states import TERMINAL, JobState, TaskState
from gosched.runtime.pipeline import Pipeline

log = logging.getLogger(__name__)

JOB_FINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
assert {JobState(s.value) for s in TERMINAL} == JOB_FINAL


class ServiceError(Exception):
    """Base of the service's own errors; the message is meant for the caller."""


class NotFound(ServiceError, KeyError):
    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class FailedPrecondition(ServiceError):
    pass


class Unavailable(ServiceError):
    pass


@dataclass(frozen=True, slots=True)
class TaskView:
    id: str
    index: int
    role: str
    state: TaskState
    node: str = ""
    gpus: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class JobView:
    """A consistent snapshot of one job, taken under the lock."""

    job: Job
    state: JobState
    tasks: tuple[TaskView, ...] = ()
    task_counts: dict[str, int] = field(default_factory=dict)

    @property
    def final(self) -> bool:
        return self.state in JOB_FINAL


@dataclass(frozen=True, slots=True)
class NodeView:
    node: Node
    cpu_used_milli: int
    memory_used: int
    gpu_used_milli: tuple[int, ...]
    task_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class QueueView:
    name: str
    policy: str
    guarantee: float
    max_share: float
    share: float


@dataclass(frozen=True, slots=True)
class StatusView:
    ready: bool
    nodes: int = 0
    schedulable_nodes: int = 0
    cpu_milli: int = 0
    cpu_used_milli: int = 0
    memory: int = 0
    memory_used: int = 0
    gpu_milli: int = 0
    gpu_used_milli: int = 0
    active_jobs: int = 0
    pending_jobs: int = 0
    in_flight_units: int = 0
    rounds: int = 0
    bound_tasks: int = 0
    binder_conflicts: int = 0
    binder_version: int = 0
    shards: int = 0


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[JobView]
    next_token: str


class SchedulerService:
    """Owns a Pipeline (built in the scheduling thread, so a slow restore does not block start-up)
    and runs `pipeline.step()` in a loop, sleeping `idle_sleep_s` when nothing was dispatched."""

    def __init__(
        self,
        settings: Settings,
        nodes: Sequence[Node] = (),
        *,
        store_path: str | Path | None = None,
        idle_sleep_s: float = 0.005,
        on_round: Callable[[Pipeline], None] | None = None,
    ) -> None:
        self.settings = settings
        self._nodes = list(nodes)
        self._store_path = store_path
        self.idle_sleep_s = idle_sleep_s
        self.on_round = on_round  # called under the lock after each round that dispatched work
        self.lock = threading.RLock()
        self._changed = threading.Condition(self.lock)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._pipeline: Pipeline | None = None
        self.version = 0  # bumped on every change a watcher may care about
        self.error: BaseException | None = None
        self._order: list[str] = []  # job ids, in submission order
        self._known: set[str] = set()
        self._unfinished: set[str] = set()  # pruned lazily by pending_tasks()

    # -- life cycle --------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="gosched-scheduler", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        ready = self._ready.wait(timeout)
        if self.error is not None:
            raise RuntimeError("the scheduler failed to start") from self.error
        return ready

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and not self._stop.is_set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the scheduling thread to end (after stop(), or a failure)."""
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """The scheduling thread is running (or has not been started yet) and has not failed."""
        return self.error is None and (self._thread is None or self._thread.is_alive())

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._ready.set()  # release wait_ready(); `ready` stays false from now on
        self._wake.set()
        with self._changed:
            self.version += 1
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        with self.lock:
            if self._pipeline is not None:
                self._pipeline.close()
                self._pipeline = None

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline; hold `lock` while using it. Unavailable before the service is ready."""
        if self._pipeline is None or not self.ready:
            raise Unavailable("the scheduler is not ready")
        return self._pipeline

    def _run(self) -> None:
        try:
            pipeline = Pipeline(self.settings, store_path=self._store_path, nodes=self._nodes)
            with self.lock:
                self._pipeline = pipeline
                for job, _ in pipeline.store.load_jobs():  # restored jobs stay listable
                    if job.id in pipeline.dispatcher:
                        self._remember(job.id)
            self._ready.set()
            while not self._stop.is_set():
                with self._changed:
                    if self._stop.is_set():
                        break
                    progressed = pipeline.step()
                    if progressed:
                        if self.on_round is not None:
                            self.on_round(pipeline)
                        self.version += 1
                        self._changed.notify_all()
                if progressed:
                    time.sleep(0)  # let waiting handlers take the lock between rounds
                else:
                    self._wake.wait(self.idle_sleep_s)
                    self._wake.clear()
        except BaseException as exc:  # the thread must not die silently: health reports it
            log.exception("scheduling thread failed")
            self.error = exc
            self._ready.set()  # release wait_ready(), which re-raises
            self._stop.set()

    def _touch(self) -> None:
        """A command changed something: wake the scheduler and the watchers (lock held)."""
        self.version += 1
        self._changed.notify_all()
        self._wake.set()

    def _remember(self, job_id: str) -> None:
        if job_id not in self._known:
            self._known.add(job_id)
            self._order.append(job_id)
            self._unfinished.add(job_id)

    # -- jobs --------------------------------------------------------------------------------------
    def submit(self, job: Job) -> tuple[str, bool]:
        """(job id, created). created=False: a job with the same submission_id already existed."""
        with self._changed:
            p = self.pipeline
            job_id = p.submit(job)
            created = job_id not in self._known
            self._remember(job_id)
            self._touch()
            return job_id, created

    def known_queues(self) -> list[str]:
        return [q.name for q in self.settings.queues]

    def _view(self, p: Pipeline, job_id: str, tasks: bool) -> JobView:
        d = p.dispatcher
        if job_id not in d:
            raise NotFound(f"job {job_id!r} not found")
        job = d.job(job_id)
        states = d.task_states(job_id)
        counts: dict[str, int] = {}
        for s in states:
            counts[s.value] = counts.get(s.value, 0) + 1
        views: list[TaskView] = []
        if tasks:
            for i, s in enumerate(states):
                tid = task_id(job_id, i)
                node, gpus = "", cast(tuple[tuple[int, int], ...], ())
                if s in (TaskState.BOUND, TaskState.RUNNING):
                    placed = p.binder.resident(tid)
                    if placed is not None:
                        node, gpus = placed[0], placed[1].gpus
                views.append(TaskView(tid, i, job.group_of(i).role, s, node, gpus))
        return JobView(job, d.job_state(job_id), tuple(views), counts)

    def get(self, job_id: str, *, tasks: bool = True) -> JobView:
        with self.lock:
            return self._view(self.pipeline, job_id, tasks)

    def list_jobs(
        self,
        *,
        state: JobState | None = None,
        queue: str = "",
        tenant: str = "",
        page_size: int = 100,
        page_token: str = "",
    ) -> JobPage:
        """Jobs in submission order, filtered; the token is the position to resume from."""
        try:
            start = int(page_token) if page_token else 0
        except ValueError:
            start = -1
        if start < 0:
            raise SpecError("page_token", f"{page_token!r} is not a token from a previous page")
        page_size = max(1, min(page_size or 100, 1000))
        out: list[JobView] = []
        with self.lock:
            p = self.pipeline
            d = p.dispatcher
            pos = start
            while pos < len(self._order) and len(out) < page_size:
                jid = self._order[pos]
                pos += 1
                if jid not in d:
                    continue
                job = d.job(jid)
                if (queue and job.queue != queue) or (tenant and job.tenant != tenant):
                    continue
                if state is not None and d.job_state(jid) != state:
                    continue
                out.append(self._view(p, jid, tasks=False))
            more = pos < len(self._order)
        return JobPage(out, str(pos) if more else "")

    def cancel(self, job_id: str) -> JobView:
        with self._changed:
            p = self.pipeline
            if job_id not in p.dispatcher:
                raise NotFound(f"job {job_id!r} not found")
            state = p.dispatcher.job_state(job_id)
            if state in JOB_FINAL:
                raise FailedPrecondition(f"job {job_id!r} has already finished ({state.value})")
            p.cancel(job_id)
            self._touch()
            return self._view(p, job_id, tasks=True)

    def explain(self, job_id: str) -> tuple[JobState, str]:
        with self.lock:
            d = self.pipeline.dispatcher
            if job_id not in d:
                raise NotFound(f"job {job_id!r} not found")
            return d.job_state(job_id), d.explain(job_id)

    def watch(self, job_id: str, is_active: Callable[[], bool] = lambda: True) -> Iterator[JobView]:
        """The job now, then each change of its state or of its tasks; ends after a final state,
        when `is_active()` turns false, or when the service stops."""
        last: JobView | None = None
        while True:
            with self._changed:
                view = self._view(self.pipeline, job_id, tasks=True)
                seen = self.version
            if view != last:
                yield view
                last = view
            if view.final or not is_active():
                return
            with self._changed:
                self._changed.wait_for(functools.partial(self._moved_on, seen), timeout=0.5)
            if self._stop.is_set():
                return

    def _moved_on(self, seen: int) -> bool:
        return self.version != seen or self._stop.is_set()

    # -- nodes -------------------------------------------------------------------------------------
    def _node_view(self, p: Pipeline, name: str) -> NodeView:
        arrays = p.binder.state
        row = arrays.row_of.get(name)
        node = arrays.nodes[row] if row is not None else None
        if row is None or node is None:
            raise NotFound(f"node {name!r} not found")
        gpus = tuple(1000 - int(arrays.gpu_free[row, g.index]) for g in node.gpus)
        return NodeView(
            node=node,
            cpu_used_milli=int(arrays.cpu_used[row]),
            memory_used=int(arrays.mem_used[row]),
            gpu_used_milli=gpus,
            task_ids=tuple(sorted(arrays.residents[row])),
        )

    def nodes(self, state: NodeState | None = None) -> list[NodeView]:
        with self.lock:
            p = self.pipeline
            names = [n.name for n in p.binder.snapshot_nodes() if state is None or n.state == state]
            return [self._node_view(p, name) for name in names]

    def node(self, name: str) -> NodeView:
        with self.lock:
            return self._node_view(self.pipeline, name)

    def set_node_state(self, name: str, state: NodeState) -> NodeView:
        with self._changed:
            p = self.pipeline
            if name not in p.binder.state.row_of:
                raise NotFound(f"node {name!r} not found")
            p.set_node_state(name, state)
            self._touch()
            return self._node_view(p, name)

    # -- queues and status -------------------------------------------------------------------------
    def queues(self) -> list[QueueView]:
        with self.lock:
            shares = self.pipeline.dispatcher.queue_shares()
        return [
            QueueView(q.name, q.policy.value, q.guarantee, q.max_share, shares.get(q.name, 0.0))
            for q in self.settings.queues
        ]

    def status(self) -> StatusView:
        if not self.ready:
            return StatusView(ready=False)
        with self.lock:
            p = self.pipeline
            a = p.binder.state
            rows = a.live_rows()
            totals = a.totals()
            d = p.dispatcher
            return StatusView(
                ready=True,
                nodes=len(rows),
                schedulable_nodes=int(sum(bool(a.schedulable[r]) for r in rows)),
                cpu_milli=totals["cpu"],
                cpu_used_milli=int(sum(int(a.cpu_used[r]) for r in rows)),
                memory=totals["memory"],
                memory_used=int(sum(int(a.mem_used[r]) for r in rows)),
                gpu_milli=totals["gpu"],
                gpu_used_milli=int(sum(int(a.gpu_used_total[r]) for r in rows)),
                active_jobs=d.active_count(),
                pending_jobs=d.pending_count(),
                in_flight_units=d.in_flight_count(),
                rounds=p.stats.rounds,
                bound_tasks=p.stats.bound_tasks,
                binder_conflicts=p.stats.rejected_units,
                binder_version=p.binder.version,
                shards=len(p.shards),
            )

    def pending_tasks(self) -> int:
        """Tasks waiting to be placed, over every job still known (for the metrics)."""
        with self.lock:
            d = self.pipeline.dispatcher
            total = 0
            for jid in list(self._unfinished):
                if jid not in d or d.job_state(jid) in JOB_FINAL:
                    self._unfinished.discard(jid)
                else:
                    total += sum(1 for s in d.task_states(jid) if s is TaskState.PENDING)
            return total
