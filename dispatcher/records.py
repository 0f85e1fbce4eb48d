"""The dispatcher's per-job record: task states, counts, where the job is, and retry bookkeeping."""

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gosched.common.job import Job, TaskGroup
from gosched.common.messages import Diagnosis
from gosched.common.states import HOLDS_RESOURCES, TERMINAL, JobState, TaskState

Cost = tuple[int, int, int]  # cpu milli, memory bytes, gpu milli


class Where(enum.Enum):
    NONE = "idle"  # nothing to dispatch (all placed, finished or cancelled)
    QUEUED = "queued"  # in its queue, ready
    PARKED = "backing off"  # unschedulable: waiting for its retry time
    DORMANT = "dormant"  # backoff over: waiting for the cluster to change (or the periodic retry)
    INFLIGHT = "in flight"  # one unit at a shard or the binder (at most one per job)


# The members as module globals: reading one through its class costs ~80 ns on 3.11 (enum class
# attribute lookup), several times per unit on the dispatcher's hot path.
IDLE = Where.NONE
QUEUED = Where.QUEUED
PARKED = Where.PARKED
DORMANT = Where.DORMANT
INFLIGHT = Where.INFLIGHT
PENDING = TaskState.PENDING
ALL_OF_ONE: tuple[int, ...] = (0,)  # the pending indexes of a one-task job, its task pending


class JobRecord:
    """Everything the dispatcher knows about one job. It is also the entry the queues hold."""

    __slots__ = (
        "attempt",
        "cancelled",
        "claim",
        "costs",
        "diagnosis",
        "dispatch_time",
        "dispatches",
        "disruption",
        "failed_backoff",
        "failure",
        "failures",
        "job",
        "job_id",
        "job_row",
        "last_shard",
        "n_held",
        "n_pending",
        "n_scheduled",
        "note",
        "park_epoch",
        "park_token",
        "parked_at",
        "qi",
        "queue",
        "ready_at",
        "retry_at",
        "seq",
        "shard",
        "states",
        "tenant",
        "trust_epoch",
        "uniform",
        "unsched",
        "where",
    )

    def __init__(
        self, job: Job, seq: int, qi: int, states: list[TaskState], *, n_pending: int | None = None
    ) -> None:
        """`n_pending`: given (len(states)) when every task is pending, as at submission: the
        counts are then known without reading the states."""
        self.job = job
        self.job_id = job.id
        self.job_row: tuple[Any, ...] | None = None  # its field values (restamped_rows), if kept
        self.queue = job.queue
        self.tenant = job.tenant
        self.seq = seq
        self.qi = qi
        self.states = states
        if n_pending is None:
            self.n_pending = states.count(PENDING)  # list.count runs in C
            self.n_scheduled = states.count(TaskState.SCHEDULED)
            self.n_held = sum(map(states.count, HOLDS_RESOURCES))
        else:
            self.n_pending = n_pending
            self.n_scheduled = self.n_held = 0
        self.uniform: Cost | None
        self.costs: list[Cost]
        self.uniform, self.costs = job_costs(job.groups)
        self.where = IDLE
        self.dispatches = 0  # units dispatched so far; the next unit's attempt number
        self.dispatch_time = 0.0  # when the latest unit was dispatched (its latency's start)
        self.attempt = -1  # attempt number of the unit in flight (or last dispatched)
        self.failures = 0  # consecutive unschedulable results (drives the backoff)
        self.unsched = False  # the unit in flight had tasks the shard could not place
        self.claim: Cost | None = None  # the unit in flight's cost, if it reclaims a guarantee
        self.shard = -1  # shard holding the unit in flight
        self.last_shard = -1
        self.ready_at = 0.0  # end of the backoff (parked) or of the dormant wait
        self.parked_at = 0.0
        # Not queued before this moment: a failed task's backoff (Dispatcher._wait_or_enqueue).
        self.retry_at = 0.0
        self.failed_backoff = False  # parked for that backoff, not for room
        # Cluster epochs (see Dispatcher.notify_cluster_changed): the latest one the shard's verdict on
        # the unit in flight can be trusted to have seen, and the one the job's parking is measured by.
        self.trust_epoch = 0
        self.park_epoch = 0
        self.park_token = 0
        self.cancelled = False
        self.diagnosis: Diagnosis | None = None
        self.note = ""  # the latest attempt's outcome (a binder rejection, a cancel)
        # The latest loss of a bound task (preempted, its node lost): kept apart from `note`, which
        # the immediate retry's outcome would overwrite, and kept once the job runs again.
        self.disruption = ""
        self.failure = ""  # the latest task failure, as its agent told it (kept as disruption is)

    def cost(self, index: int) -> Cost:
        return self.uniform if self.uniform is not None else self.costs[index]

    def cost_of(self, indexes: tuple[int, ...]) -> Cost:
        if self.uniform is not None:
            n = len(indexes)
            c, m, g = self.uniform
            return c * n, m * n, g * n
        costs = self.costs
        cpu = mem = gpu = 0
        for i in indexes:
            c, m, g = costs[i]
            cpu += c
            mem += m
            gpu += g
        return cpu, mem, gpu

    def pending_indexes(self) -> tuple[int, ...]:
        states = self.states
        if len(states) == 1:
            return ALL_OF_ONE if states[0] is PENDING else ()
        return tuple(i for i, s in enumerate(states) if s is PENDING)

    def indexes_in(self, state: TaskState) -> list[int]:
        return [i for i, s in enumerate(self.states) if s is state]


_new = object.__new__


def job_costs(groups: tuple[TaskGroup, ...]) -> tuple[Cost | None, list[Cost]]:
    """(the cost every task shares, per-task costs): a one-group job's tasks all cost the same, so
    it needs no list; a job of several groups has one cost per task, in task order."""
    if len(groups) == 1:
        r = groups[0].resources
        return (r.cpu_milli, r.memory, r.gpu_total_milli), []
    costs = [
        (g.resources.cpu_milli, g.resources.memory, g.resources.gpu_total_milli)
        for g in groups
        for _ in range(g.replicas)
    ]
    return None, costs


def queued_records(
    jobs: list[Job],
    seq: int,
    qis: list[int],
    totals: list[int],
    rows: list[tuple[Any, ...]] | None = None,
) -> list[JobRecord]:
    """JobRecord(job, seq + k, qi, [PENDING] * total, n_pending=total) for the k-th job, its
    `where` QUEUED (and its `job_row` the k-th of `rows`, the job's field values, where given):
    the records of jobs just submitted, about to be queued. The slots are
    written here, in one frame for them all, not by a call of __init__ per job (which a
    submission pays for every job); tests/test_dispatcher_submit_cost.py checks they match."""
    out = []
    last: object = None  # the previous job's groups: alike jobs share the tuple, and its costs
    uniform: Cost | None = None
    costs: list[Cost] = []
    for k, (job, qi, total) in enumerate(zip(jobs, qis, totals, strict=True)):
        rec = _new(JobRecord)
        rec.job = job
        rec.job_id = job.id
        rec.job_row = None if rows is None else rows[k]
        rec.queue = job.queue
        rec.tenant = job.tenant
        seq += 1
        rec.seq = seq
        rec.qi = qi
        rec.states = [PENDING] * total
        rec.n_pending = total
        rec.n_scheduled = rec.n_held = 0
        groups = job.groups
        if groups is not last:
            last = groups
            uniform, costs = job_costs(groups)
        rec.uniform = uniform
        # A list of its own where it is the empty one, as __init__ gives; per-task costs are only
        # read, so the jobs sharing a groups tuple share them.
        rec.costs = [] if uniform is not None else costs
        rec.where = QUEUED
        rec.dispatches = 0
        rec.dispatch_time = 0.0
        rec.attempt = -1
        rec.failures = 0
        rec.unsched = False
        rec.claim = None
        rec.shard = rec.last_shard = -1
        rec.ready_at = rec.parked_at = 0.0
        rec.retry_at = 0.0
        rec.failed_backoff = False
        rec.trust_epoch = rec.park_epoch = rec.park_token = 0
        rec.cancelled = False
        rec.diagnosis = None
        rec.note = rec.disruption = rec.failure = ""
        out.append(rec)
    return out


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """What is kept of a job once every task has ended (the full record is dropped)."""

    job: Job
    state: JobState
    states: tuple[TaskState, ...]
    note: str
    retries: tuple[int, ...] = ()  # per task, its failures run again; () for none
    reasons: tuple[str, ...] = ()  # per task, why its latest failure failed; () for none


def gang_failed(states: list[TaskState] | tuple[TaskState, ...], min_member: int) -> bool:
    """So many of a gang's tasks failed for good that the others can no longer make its
    min_member: the job has failed, and its other tasks are stopped (Dispatcher._abort_gang)."""
    if min_member <= 1:
        return False
    failed = sum(1 for s in states if s is TaskState.FAILED)
    return failed > len(states) - min_member


def job_state_of(
    states: list[TaskState] | tuple[TaskState, ...], min_member: int, cancelled: bool
) -> JobState:
    # A gang stopped for its failed tasks is failed, though its other tasks end cancelled.
    if cancelled and not gang_failed(states, min_member):
        return JobState.CANCELLED
    if all(s in TERMINAL for s in states):
        if TaskState.FAILED in states:
            return JobState.FAILED
        if all(s is TaskState.SUCCEEDED for s in states):
            return JobState.SUCCEEDED
        return JobState.CANCELLED
    # Running: some tasks hold resources, and with the tasks that ran and ended (succeeded or
    # failed) they make the gang. A failed member leaves the rest running, not waiting for it.
    held = sum(1 for s in states if s in HOLDS_RESOURCES)
    ended = sum(1 for s in states if s is TaskState.SUCCEEDED or s is TaskState.FAILED)
    if held and held + ended >= min_member:
        return JobState.RUNNING
    return JobState.PENDING


def failure_line(index: int, state: TaskState, why: str) -> str:
    """How explain tells a task's end with a reason: "task 3 failed: exit code 1 (on node-a)"."""
    return f"task {index} {state.value}: {why}"


def retry_line(line: str, used: int, of: int, after: str = "") -> str:
    """A failure's line with the retry it gets, told while it is to come: "task 0 failed: exit
    code 3; run again (retry 1 of 2) after 10s" (`after`: the backoff, "" for none)."""
    return f"{line}; run again (retry {used} of {of})" + (f" after {after}" if after else "")


# retry_line's future, at the end of a line (after an optional "latest: "): the task and the retry.
_RETRY_TO_COME = re.compile(
    r"^((?:latest: )?task (\d+) .*); run again \((retry \d+ of \d+)\)(?: after \S+)?$", re.M
)


def retries_told_as_past(history: str, states: Sequence[TaskState] = ()) -> str:
    """`history` with each retry_line told as what happened: "; was run again (retry 1 of 2)",
    for a task whose retry has come (a later failure of it, or its job finished). Of a task that
    ended cancelled (`states`), the retry may not have run: "; was set to run again (...)"."""

    def past(match: re.Match[str]) -> str:
        index = int(match.group(2))
        cancelled = index < len(states) and states[index] is TaskState.CANCELLED
        return f"{match.group(1)}; was {'set to run' if cancelled else 'run'} again ({match.group(3)})"

    return _RETRY_TO_COME.sub(past, history)


def _task_of(line: str) -> str:
    """'task 3' of a failure_line ("" for another line)."""
    words = line.split(" ", 2)
    return f"{words[0]} {words[1]}" if len(words) > 2 and words[0] == "task" else ""


def with_failure(history: str, line: str) -> str:
    """A job's failure record after another failure: the first stays (a gang's other members
    often fail of it: killed, peers lost), beside the latest. A first failure's retry that a later
    failure of the same task shows has come is told as past."""
    first = history.split("\n", 1)[0]
    if not first or first == line:
        return line
    if _task_of(first) and _task_of(first) == _task_of(line):
        first = retries_told_as_past(first)
    return f"{first}\nlatest: {line}"
