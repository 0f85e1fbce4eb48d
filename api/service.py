"""SchedulerService: one ControlPlane, one scheduling thread, and the thread-safe calls the API serves.

The control plane (the in-process Pipeline, or the components as Ray actors) is driven from one
thread at a time: every call into it holds `lock`; the scheduling thread holds it for one `step()`
and the tick hooks (the agent gateway, the task simulator), the gRPC handlers for one short query or
command. After every step that made progress and after every command, `version` is bumped and the
condition notified; a watcher waits on it and then diffs the job's state against what it sent last.

Errors are raised as the small exceptions below (and SpecError / AdmissionRejected from common);
`gosched.api.server` maps them to gRPC status codes.
"""

import contextlib
import functools
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TypeAlias

from gosched.common.config import QueueConfig
from gosched.common.errors import SpecError
from gosched.common.job import Job, split_task_id, task_id
from gosched.common.node import NodeState
from gosched.common.snapshots import Counters, JobSnapshot, NodeSnapshot
from gosched.common.states import TERMINAL, JobState, TaskState
from gosched.common.store import RestartRow, Store
from gosched.runtime.control import (
    ControlLost,
    ControlPlane,
    ControlUnavailable,
    SchedulerFailure,
    describe_error,
)

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


class Exhausted(ServiceError):
    """A limit of the server's (open streams): retry later."""


@dataclass(frozen=True, slots=True)
class TaskRestarts:
    """What a task's node agent said about restarting it (a service's task whose process exited),
    within one attempt of the task: how many times, and how the process behind the latest ended."""

    attempt: int  # the task's attempt (ControlPlane.task_attempts) the restarts belong to
    count: int
    reason: str = ""  # "exit code 1", "OOM killed", "failed to start: ..."
    at: float = 0.0  # when that process ended: unix seconds, the agent's clock (0: unknown)
    node: str = ""


@dataclass(frozen=True, slots=True)
class TaskView:
    id: str
    index: int
    role: str
    state: TaskState
    node: str = ""
    gpus: tuple[tuple[int, int], ...] = ()
    restarts: int = 0  # by its node agent, in this attempt
    last_restart_reason: str = ""
    last_restart_time: float = 0.0
    retries: int = 0  # its failures run again (max_retries), over all its attempts
    reason: str = ""  # why its latest failure failed, in its agent's words ("exit code 3 (on n1)")


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


NodeView: TypeAlias = NodeSnapshot


@dataclass(frozen=True, slots=True)
class QueueView:
    name: str
    policy: str
    guarantee: float
    max_share: float
    share: float


@dataclass(frozen=True, slots=True)
class StatusView(Counters):
    ready: bool = False


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[JobView]
    next_token: str


FAILURE_PAUSE_S = 0.5  # after a failed round or hook, before the next try
# A failure of one kind (where, exception type) is logged with its traceback the first time, then
# on one line at most this often, with the count since: not at the loop's pace.
FAILURE_LOG_EVERY_S = 60.0
IDLE_SLEEP_MAX_S = 0.05  # longest idle sleep between two passes (the tick hooks' pace)
RESTARTS_BUSY_S = 2.0  # how long a save of restart counts waits for the store's other writers
# Tasks whose restarts are remembered in memory (and loaded back at a start): past this many, the
# jobs noted longest ago are forgotten first. The store keeps every task's row for as long as its job.
RESTARTS_KEPT = 100_000

# Called under the lock from the scheduling thread between steps; True if it changed anything.
TickHook = Callable[[ControlPlane], bool]


def debugging() -> bool:
    """GOSCHED_DEBUG set (not empty, not 0): failures are logged with their tracebacks."""
    return os.environ.get("GOSCHED_DEBUG", "") not in ("", "0")


def start_failure(error: BaseException) -> str:
    """What a user reads when the scheduler could not start: one line, its causes included."""
    if isinstance(error, SchedulerFailure):
        return str(error)
    return f"the scheduler failed to start: {describe_error(error)}"


class SchedulerService:
    """Owns a ControlPlane (built in the scheduling thread by `make_control`, so a slow restore or
    Ray start does not block start-up) and runs `control.step()` in a loop, then the tick hooks,
    sleeping when nothing moved until the control plane's next step is due (`idle_wait()`, at
    most `idle_sleep_s`) or something wakes it (a submission, an agent's report).

    While the control plane is unavailable (`control.unavailable`: a component or its cluster does
    not answer) the service is not ready, refuses calls with Unavailable, skips the tick hooks and
    logs it once; ControlLost (the cluster is gone for good) stops it, with the error kept in
    `error` (a master then exits non-zero).

    With `store_path` (the control plane's store), the restart counts agents report are saved
    there too and loaded back when the service starts again."""

    def __init__(
        self,
        make_control: Callable[[], ControlPlane],
        *,
        queues: Sequence[QueueConfig],
        idle_sleep_s: float = IDLE_SLEEP_MAX_S,
        on_round: Callable[[ControlPlane], None] | None = None,
        store_path: str | Path | None = None,
    ) -> None:
        self._make_control = make_control
        # A second connection would open another, empty ":memory:" database: memory only then.
        self._store_path = None if store_path is None or str(store_path) == ":memory:" else store_path
        self._store: Store | None = None  # opened by the scheduling thread, after the control plane
        self.queue_configs = list(queues)
        self.idle_sleep_s = idle_sleep_s
        self.on_round = on_round  # called under the lock after each round that made progress
        self.tick_hooks: list[TickHook] = []
        self.lock = threading.RLock()
        self._changed = threading.Condition(self.lock)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._control: ControlPlane | None = None
        self.version = 0  # bumped on every change a watcher may care about
        self.error: BaseException | None = None
        self._order: list[str] = []  # job ids, in submission order
        self._known: set[str] = set()
        # Agent-reported restarts, job id -> task index -> the latest report (lock held); saved in
        # the store (with store_path), so a restarted master shows them again.
        self._restarts: dict[str, dict[int, TaskRestarts]] = {}
        self._restarts_kept = 0
        self._failures: dict[tuple[str, str], list[float]] = {}  # kind -> [count since logged, logged at]
        self._outage_since: float | None = None  # when the control plane became unavailable

    # -- life cycle --------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="gosched-scheduler", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        ready = self._ready.wait(timeout)
        if self.error is not None:
            raise RuntimeError(start_failure(self.error)) from self.error
        return ready

    @property
    def ready(self) -> bool:
        return self.not_ready_reason is None

    @property
    def not_ready_reason(self) -> str | None:
        """Why the service does not serve now (None: it does)."""
        if self.error is not None:
            return f"the scheduler stopped: {self.error}"
        if not self._ready.is_set() or self._stop.is_set():
            return "the scheduler is not ready"
        control = self._control
        why = control.unavailable if control is not None else None
        return None if why is None else f"the scheduler is unavailable: {why}"

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
            if self._control is not None:
                self._control.close()
                self._control = None
            if self._store is not None:
                self._store.close()
                self._store = None

    @property
    def control(self) -> ControlPlane:
        """The control plane; hold `lock` while using it. Unavailable (with the reason) while the
        service is not ready: starting, stopped, or its control plane does not answer."""
        why = self.not_ready_reason
        if self._control is None or why is not None:
            raise Unavailable(why or "the scheduler is not ready")
        return self._control

    def _run(self) -> None:
        try:
            control = self._make_control()
            store: Store | None = None
            saved: list[RestartRow] = []
            try:
                if self._store_path is not None:
                    # A short busy timeout: saves run under the service's lock, in the gateway's tick.
                    store = Store(self._store_path, busy_timeout_s=RESTARTS_BUSY_S)
                    # After the control plane's restore: rows of the attempts it ended are left out.
                    saved = store.load_restarts(RESTARTS_KEPT)
            except sqlite3.Error as exc:  # counts are for show: the scheduler starts without them
                log.warning("restart counts not loaded, kept in memory only: %s", exc)
                if store is not None:
                    store.close()
                store, saved = None, []
            except BaseException:
                if store is not None:
                    store.close()
                control.close()
                raise
            with self.lock:
                if self._stop.is_set():  # stopped while it started (stop() found nothing to close)
                    control.close()
                    if store is not None:
                        store.close()
                    return
                self._control, self._store = control, store
                for job_id in control.job_ids():  # restored jobs stay listable
                    self._remember(job_id)
                self._keep_restarts(
                    {
                        task_id(r.job_id, r.idx): TaskRestarts(
                            r.attempt, r.restarts, r.last_reason, r.last_time, r.node
                        )
                        for r in saved
                    }
                )
        except BaseException as exc:  # wait_ready() raises it, told on one line
            if debugging():
                log.error("the scheduler failed to start", exc_info=exc)
            self._fail(exc)
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                self._wake.clear()  # a wake from now on ends this pass's idle wait at once
                with self._changed:
                    if self._stop.is_set():
                        break
                    progressed, failed = self._pass(control)
                    self._note_availability(control)
                    if progressed:
                        self.version += 1
                        self._changed.notify_all()
                if failed:
                    self._stop.wait(FAILURE_PAUSE_S)
                elif progressed:
                    time.sleep(0)  # let waiting handlers take the lock between rounds
                else:
                    self._wake.wait(min(self.idle_sleep_s, control.idle_wait()))
        except ControlLost as exc:  # the cluster is gone: stop, so that the master exits
            log.error("%s; the scheduler stops", exc)
            self._fail(exc)
            with self.lock:
                if self._control is not None:
                    with contextlib.suppress(Exception):
                        self._control.close()  # leaves Ray before Ray's client ends the process
                    self._control = None
        except BaseException as exc:  # the thread must not die silently: health reports it
            log.exception("scheduling thread failed")
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        self._ready.set()  # release wait_ready(), which re-raises
        self._stop.set()
        with self._changed:  # watchers end
            self.version += 1
            self._changed.notify_all()

    def _pass(self, control: ControlPlane) -> tuple[bool, bool]:
        """One step and the tick hooks (lock held): (progressed, failed). A failing round or hook (an
        actor restarting under a call, a bad report) is logged and tried again: the master must not
        stop scheduling for one error. ControlLost goes up: the scheduler stops."""
        failed = False
        try:
            progressed = control.step()
            if progressed and self.on_round is not None:
                self.on_round(control)
        except ControlLost:
            raise
        except Exception as exc:
            self._log_failure("scheduling round", exc)
            progressed, failed = False, True
        if control.unavailable is not None:
            return progressed, True  # the hooks would only fail too: wait for the probe
        for hook in self.tick_hooks:
            try:
                progressed = hook(control) or progressed
            except ControlLost:
                raise
            except Exception as exc:
                self._log_failure(f"tick hook {getattr(hook, '__qualname__', hook)}", exc)
                failed = True
        return progressed, failed

    def _log_failure(self, where: str, exc: Exception) -> None:
        """A traceback the first time a kind of failure happens, then one line at most every
        FAILURE_LOG_EVERY_S with the count since. A component not answering is the control plane's
        unavailability, logged once by _note_availability."""
        if isinstance(exc, ControlUnavailable):
            if debugging():
                log.warning("%s failed", where, exc_info=exc)
            return
        now = time.monotonic()
        kind = (where, type(exc).__name__)
        seen = self._failures.get(kind)
        if seen is None:
            self._failures[kind] = [0, now]
            log.error("%s failed: %s", where, describe_error(exc), exc_info=exc)
            return
        seen[0] += 1
        if now - seen[1] >= FAILURE_LOG_EVERY_S or debugging():
            log.error(
                "%s failed again (%d times in %.0f s): %s", where, seen[0], now - seen[1], describe_error(exc)
            )
            seen[0], seen[1] = 0, now

    def _note_availability(self, control: ControlPlane) -> None:
        """Log when the control plane becomes unavailable (once, with why) and when it is back."""
        why = control.unavailable
        if why is not None and self._outage_since is None:
            self._outage_since = time.monotonic()
            log.warning("the scheduler is unavailable (not ready until it answers again): %s", why)
        elif why is None and self._outage_since is not None:
            log.warning("the scheduler answers again, after %.1f s", time.monotonic() - self._outage_since)
            self._outage_since = None

    def touch(self) -> None:
        """Something changed outside a step: wake the scheduler and the watchers (lock held)."""
        self.version += 1
        self._changed.notify_all()
        self._wake.set()

    def _remember(self, job_id: str) -> None:
        if job_id not in self._known:
            self._known.add(job_id)
            self._order.append(job_id)

    # -- jobs --------------------------------------------------------------------------------------
    def submit(self, job: Job) -> tuple[str, bool]:
        """(job id, created). created=False: a job with the same submission_id already existed."""
        with self._changed:
            job_id = self.control.submit_many([job])[0]
            created = job_id not in self._known
            self._remember(job_id)
            self.touch()
            return job_id, created

    def submit_many(self, jobs: list[Job]) -> tuple[list[str], list[bool]]:
        """Admit jobs all or none; (ids, created per job)."""
        with self._changed:
            ids = self.control.submit_many(jobs)
            created = []
            for job_id in ids:  # a repeat within the batch is not created twice
                created.append(job_id not in self._known)
                self._remember(job_id)
            self.touch()
            return ids, created

    def known_queues(self) -> list[str]:
        return [q.name for q in self.queue_configs]

    def _snapshot(self, job_id: str, tasks: bool) -> JobSnapshot:
        if not job_id:  # bad input, not a job that is missing
            raise SpecError("id", "required: the job's id")
        snap = self.control.jobs([job_id], placements=tasks, ended=tasks)[0]
        if snap is None:
            raise NotFound(f"job {job_id!r} not found")
        return snap

    def get(self, job_id: str, *, tasks: bool = True) -> JobView:
        with self.lock:
            return self._view(self._snapshot(job_id, tasks), tasks)

    # -- restarts reported by node agents ------------------------------------------------------------
    def note_restarts(self, restarts: Mapping[str, TaskRestarts]) -> None:
        """Take agents' restart reports, by task id (lock held: the agent gateway's tick). A report
        replaces the one before it: the agent's count is the run's total so far. They are saved in
        one transaction: the tick hands over every report since the last one at once."""
        self._keep_restarts(restarts)
        if self._store is None or not restarts:
            return
        rows = []
        for tid, rec in restarts.items():
            job_id, index = split_task_id(tid)
            rows.append(RestartRow(job_id, index, rec.attempt, rec.count, rec.reason, rec.at, rec.node))
        try:
            self._store.save_restarts(rows)
        except sqlite3.Error as exc:  # shown from memory still; the task's next report saves it again
            self._log_failure("saving restart counts", exc)

    def _keep_restarts(self, restarts: Mapping[str, TaskRestarts]) -> None:
        """Remember reports in memory (lock held), within RESTARTS_KEPT tasks."""
        for tid, rec in restarts.items():
            job_id, index = split_task_id(tid)
            noted = self._restarts.pop(job_id, {})  # back in last: the most recently noted job
            self._restarts_kept += index not in noted
            noted[index] = rec
            self._restarts[job_id] = noted
        while self._restarts_kept > RESTARTS_KEPT and len(self._restarts) > 1:
            oldest = next(iter(self._restarts))
            self._restarts_kept -= len(self._restarts.pop(oldest))

    def _current_restarts(self, job_id: str) -> dict[int, TaskRestarts]:
        """The job's restart reports that belong to its tasks' current attempts (lock held): a task
        placed anew since (evicted, lost, requeued) starts again from none. One control-plane call,
        and only for a job some agent reported restarts of."""
        noted = self._restarts.get(job_id)
        if not noted:
            return {}
        attempts = self.control.task_attempts([task_id(job_id, i) for i in noted])
        current = {
            i: rec for i, rec in noted.items() if attempts.get(task_id(job_id, i), rec.attempt) == rec.attempt
        }
        if len(current) < len(noted):  # an older attempt's: never current again
            self._restarts_kept -= len(noted) - len(current)
            if current:
                self._restarts[job_id] = current
            else:
                del self._restarts[job_id]
        return current

    def _view(self, snap: JobSnapshot, tasks: bool) -> JobView:
        return _job_view(snap, tasks, self._current_restarts(snap.job.id) if tasks else {})

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
        pos = start
        with self.lock:
            control = self.control
            while pos < len(self._order) and len(out) < page_size:
                chunk = self._order[pos : pos + page_size]  # one control-plane call per chunk
                for snap in control.jobs(chunk, placements=False):
                    pos += 1
                    if snap is None:
                        continue
                    job = snap.job
                    if (queue and job.queue != queue) or (tenant and job.tenant != tenant):
                        continue
                    if state is not None and snap.state != state:
                        continue
                    out.append(self._view(snap, False))
                    if len(out) == page_size:
                        break
            more = pos < len(self._order)
        return JobPage(out, str(pos) if more else "")

    def cancel(self, job_id: str) -> JobView:
        with self._changed:
            snap = self._snapshot(job_id, False)
            if snap.state in JOB_FINAL:
                raise FailedPrecondition(f"job {job_id!r} has already finished ({snap.state.value})")
            self.control.cancel(job_id)
            self.touch()
            return self._view(self._snapshot(job_id, True), True)

    def explain(self, job_id: str) -> tuple[JobState, str]:
        """The control plane's explanation, then a line per task its agent restarted (the count
        and how the process behind the latest restart ended): a crash-looping service shows."""
        with self.lock:
            snap = self._snapshot(job_id, False)
            why = self.control.explain(job_id)
            restarts = self._current_restarts(job_id)
        lines = [why] if why else []
        lines.extend(restart_line(i, restarts[i]) for i in sorted(restarts))
        return snap.state, "\n".join(lines)

    def watch(self, job_id: str, is_active: Callable[[], bool] = lambda: True) -> Iterator[JobView]:
        """The job now, then each change of its state or of its tasks; ends after a final state or
        when `is_active()` turns false. Unavailable when the service stops: the job goes on, and
        a watcher may watch again once the master is back (a stream that just ended would read
        as the job's end)."""
        last: JobView | None = None
        while True:
            with self._changed:
                view = self._view(self._snapshot(job_id, True), True)
                seen = self.version
            if view != last:
                yield view
                last = view
            if view.final or not is_active():
                return
            with self._changed:
                self._changed.wait_for(functools.partial(self._moved_on, seen), timeout=0.5)
            if self._stop.is_set():
                raise Unavailable(f"the master stopped while job {job_id} was {view.state.value}")

    def _moved_on(self, seen: int) -> bool:
        return self.version != seen or self._stop.is_set()

    # -- nodes -------------------------------------------------------------------------------------
    def nodes(self, state: NodeState | None = None) -> list[NodeView]:
        with self.lock:
            return [n for n in self.control.nodes() if state is None or n.node.state == state]

    def node(self, name: str) -> NodeView:
        with self.lock:
            got = self.control.nodes([name])
        if not got:
            raise NotFound(f"node {name!r} not found")
        return got[0]

    def set_node_state(self, name: str, state: NodeState) -> NodeView:
        with self._changed:
            try:
                self.control.set_node_state(name, state)
            except KeyError:
                raise NotFound(f"node {name!r} not found") from None
            self.touch()
            return self.node(name)

    def delete_node(self, name: str, *, force: bool) -> list[str]:
        """Remove a node; refused (FailedPrecondition) while tasks hold resources on it, unless
        `force`: they are then released as at the node's loss and queued again (returned)."""
        with self._changed:
            holding = self.control.residents([name]).get(name, [])
            if holding and not force:
                shown = ", ".join(sorted(holding)[:5]) + (", ..." if len(holding) > 5 else "")
                raise FailedPrecondition(
                    f"node {name} holds {len(holding)} task(s) ({shown}): drain it (gosched drain {name}) "
                    f"and let them end, or force it (gosched delete-node {name} --force; force in the "
                    "DeleteNode request) to queue them again"
                )
            try:
                requeued = self.control.remove_node(name)
            except KeyError:
                raise NotFound(f"node {name!r} not found") from None
            self.touch()
            return requeued

    # -- queues and status -------------------------------------------------------------------------
    def queues(self) -> list[QueueView]:
        with self.lock:
            shares = self.control.queue_shares()
        return [
            QueueView(q.name, q.policy.value, q.guarantee, q.max_share, shares.get(q.name, 0.0))
            for q in self.queue_configs
        ]

    def status(self) -> StatusView:
        if self._control is None or not self._ready.is_set() or self._stop.is_set():
            return StatusView(ready=False)  # starting, or stopped
        with self.lock:  # Unavailable, with why, while the control plane does not answer
            c = self.control.counters()
        return StatusView(ready=True, **{f.name: getattr(c, f.name) for f in fields(c)})

    def pending_tasks(self) -> int:
        """Tasks waiting to be placed, over every job still known (for the metrics)."""
        with self.lock:
            return self.control.pending_tasks()


def restart_line(index: int, rec: TaskRestarts) -> str:
    """`task 0 restarted 3 times by its agent, the latest after exit code 1 at 2025-01-02 10:31:02
    UTC (on node-a)`: what explain says of a task its agent restarted."""
    times = "once" if rec.count == 1 else f"{rec.count} times"
    why = rec.reason or "an unknown exit"
    at = time.strftime(" at %Y-%m-%d %H:%M:%S UTC", time.gmtime(rec.at)) if rec.at > 0 else ""
    on = f" (on {rec.node})" if rec.node else ""
    return f"task {index} restarted {times} by its agent, the latest after {why}{at}{on}"


def _job_view(snap: JobSnapshot, tasks: bool, restarts: Mapping[int, TaskRestarts] | None = None) -> JobView:
    job, states = snap.job, snap.task_states
    counts: dict[str, int] = {}
    for s in states:
        counts[s.value] = counts.get(s.value, 0) + 1
    views: tuple[TaskView, ...] = ()
    if tasks:
        views = tuple(
            TaskView(task_id(job.id, i), i, job.group_of(i).role, s, *snap.placements.get(i, ("", ())))
            for i, s in enumerate(states)
        )
        if snap.retries:
            views = tuple(replace(v, retries=n) for v, n in zip(views, snap.retries, strict=True))
        if snap.reasons:
            views = tuple(replace(v, reason=why) for v, why in zip(views, snap.reasons, strict=True))
        if restarts:
            views = tuple(
                v
                if (r := restarts.get(v.index)) is None
                else replace(v, restarts=r.count, last_restart_reason=r.reason, last_restart_time=r.at)
                for v in views
            )
    return JobView(job, snap.state, views, counts)
