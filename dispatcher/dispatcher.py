"""The dispatcher: admits jobs, orders them by queue policy and capacity, and feeds the shards.

Flow of one job:

    submit -> admission -> store -> its queue
    next_batches: queue -> Unit (its pending tasks, or the longest prefix that keeps its queue
                  within max_share; a job that could not fit even with its queue empty is
                  parked) -> least-loaded shard                             tasks pending -> scheduled
    on_reply: accepted -> bound (usage counted); rejected -> pending, requeued at once
    on_unschedulable: -> pending, parked with exponential backoff, diagnosis kept for explain()
    eviction / release: bound -> preempted -> pending (requeued) or -> a final state

Retrying the unschedulable: a parked job waits out its backoff (retry_backoff_s doubling per
attempt, capped at retry_backoff_max_s), and then is retried only once the cluster has changed in a
way that may make room (capacity set, tasks released, evictions that freed more than their
preemptors took (dispatcher/room.py), a cancel, a partition change; or notify_cluster_changed()).
Until then it is dormant, and it is retried anyway unschedulable_retry_s after it was parked, so a
missed change cannot strand it. Without the change gate a zero backoff would retry an unplaceable
gang every round, and a backlog of them would keep the shards busy for nothing.

A shard's view lags the changes the dispatcher hears of: it learns them with its next binder
reply. So a shard's unschedulable verdict is trusted to reflect the cluster only as of the
dispatcher's previous batch to that shard; a job judged on an older view is tried again after its
backoff instead of going dormant, and without any change it goes dormant at once. So is a job whose
preemption was held back only by the shard's own plans awaiting the binder (`settling`): their
placements can be evicted once bound, a disruption budget's count may change with their answer, and
neither is a change that wakes anyone. And so is any verdict of
a shard whose latest or previous reply refused some of its placements (`_refused_near`): the room
they held in its view was free at the binder, and a refusal changes nothing there either.

A job has at most one unit in flight. Tasks that become pending while it is out (an eviction of
one of its bound tasks) wait until that unit is answered, then the job is queued again for all of
its pending tasks. Units answered for attempts that are no longer current are ignored.

Usage for capacity and fairness is held + in-flight, so a round of dispatching sees its own units.
Hot path (next_batches, on_reply): per unit a few dict and heap operations, no scans of jobs.
"""

import heapq
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import fields, replace
from operator import attrgetter, is_
from typing import Any, TypeVar

from gosched.common.aging import standing_from
from gosched.common.config import QueuePolicy, Settings
from gosched.common.errors import AlreadyStored, SpecError
from gosched.common.fast_pickle import objects_from, replaced, rows_of
from gosched.common.job import DEFAULT_QUEUE, NO_DEFAULT_QUEUE, Job, TaskGroup, split_task_id, task_id
from gosched.common.messages import (
    BindReply,
    QueueFloor,
    RejectedUnit,
    UnitBatch,
    UnitBatchRows,
    UnitRow,
    Unschedulable,
)
from gosched.common.snapshots import JobSnapshot
from gosched.common.spec import format_duration, generated_job_id
from gosched.common.states import HOLDS_RESOURCES, LEGAL, TERMINAL, JobState, TaskState, check_transition
from gosched.dispatcher.admission import AdmissionController
from gosched.dispatcher.capacity import EPS, NOT_ELIGIBLE, CapacityPlanner
from gosched.dispatcher.deadlines import DeadlineWatch, missed_note, start_by_note, too_late
from gosched.dispatcher.group_interner import GroupInterner
from gosched.dispatcher.partition import Partitioner
from gosched.dispatcher.queues import HeapQueue, PolicyQueue, make_queue
from gosched.dispatcher.records import (
    ALL_OF_ONE,
    DORMANT,
    IDLE,
    INFLIGHT,
    PARKED,
    QUEUED,
    FinishedJob,
    JobRecord,
    failure_line,
    gang_failed,
    job_state_of,
    queued_records,
    retries_told_as_past,
    retry_line,
    with_failure,
)
from gosched.dispatcher.reservation import Reservations, ahead
from gosched.dispatcher.room import evictions_made_room
from gosched.dispatcher.shedding import QueueShedding, Shed
from gosched.dispatcher.store import JobStore
from gosched.dispatcher.usage import UsageTracker
from gosched.dispatcher.verdicts import Verdicts

PENDING = TaskState.PENDING
FAILED = TaskState.FAILED
SCHEDULED = TaskState.SCHEDULED
BOUND = TaskState.BOUND
RUNNING = TaskState.RUNNING
PREEMPTED = TaskState.PREEMPTED
CANCELLED = TaskState.CANCELLED
NO_RECLAIM: frozenset[str] = frozenset()

# next_batches moves tasks pending -> scheduled without a per-task check; the edge must stay legal.
assert SCHEDULED in LEGAL[PENDING]

# The task states the dispatcher writes to the store. The binder commits the rest (bound with its
# node and GPUs, preempted, and the ends of tasks it releases); writing those here as well would
# only repeat its rows, or overwrite a newer one with a late reply. SCHEDULED (in flight at a
# shard) is not written: a restart turns it back into PENDING anyway, so the row that says pending
# until the binder's commit is already right, and the write per dispatch would buy nothing.
PERSISTED = frozenset({PENDING, CANCELLED})
FENCED_POLICIES = frozenset({QueuePolicy.DRF, QueuePolicy.FAIR})

Updates = list[tuple[str, TaskState]]
# The park epoch of a verdict that will not hold: no cluster epoch equals it, so the job is retried
# when its backoff ends whether or not anything changed (a Unschedulable marked settling, or one a
# shard took while the binder was refusing some of its placements).
UNTRUSTED = -1
# Finished jobs kept queryable (in memory, and read back at a restart): the store purges older
# ones only past these (api/store_purge.py).
FINISHED_RETENTION = 100_000

log = logging.getLogger(__name__)


class Dispatcher:
    """See the module docstring. `finished_retention`: how many finished jobs stay queryable
    (job_state, task_states, explain) after their record is dropped; the store keeps them all."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: JobStore | None = None,
        clock: Callable[[], float] = time.time,
        finished_retention: int = FINISHED_RETENTION,
    ) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock
        self.usage = UsageTracker()
        self.admission = AdmissionController(settings.admission, clock)
        self.partitions = Partitioner(settings.shards)
        self.capacity = CapacityPlanner(settings.queues)
        self._shedding = QueueShedding(settings.queues)
        self._queue_index = {q.name: i for i, q in enumerate(settings.queues)}
        self._queues: list[PolicyQueue[JobRecord]] = [
            make_queue(q, self.usage, self.clock) for q in settings.queues
        ]
        # Queues whose order is by current usage (DRF across tenants, weighted fair share): past the
        # free room, their next unit waits for those in flight (see next_batches).
        self._fenced = [q.policy in FENCED_POLICIES for q in settings.queues]
        # The others (FIFO, priority, deadline) are ordered by the jobs alone: with more than one
        # shard, a unit that would need room claimed by units in flight waits for their answers
        # (a later unit on a shard that commits first would otherwise take an earlier one's room).
        self._ordered = [not fenced for fenced in self._fenced]
        self._reservations = Reservations(settings.queues, self._ordered)
        self._jobs: dict[str, JobRecord] = {}
        self._finished: dict[str, FinishedJob] = {}  # oldest first
        # Restored jobs of queues no longer configured: shown and cancellable, never scheduled
        # (configuring the queue again brings them back at the next start).
        self._unqueued: dict[str, FinishedJob] = {}
        self.finished_retention = finished_retention
        self._submissions: dict[str, str] = {}
        self._seq = 0
        self._parked: list[tuple[float, int, JobRecord]] = []  # (end of backoff, park token, record)
        self._dormant: list[tuple[float, int, JobRecord]] = []  # (periodic retry time, park token, record)
        self._park_seq = 0
        self._epoch = 0  # bumped by every cluster change that may make room
        self._backing_off = 0  # jobs parked whose backoff has not ended
        self._partition_version = self.partitions.version
        self._shard_load: list[int] = []  # units in flight per shard
        self._shard_epoch: list[int] = []  # cluster epoch when each shard was last sent a batch
        # Per shard: did its previous and its latest reply refuse any placement? (see on_unschedulable)
        self._shard_refused: list[tuple[bool, bool]] = []
        self._inflight_by_shard: list[dict[str, JobRecord]] = []
        self._waiting = 0  # jobs queued, backing off or dormant
        self._inflight = 0  # units in flight
        self.skipped_on_restore: list[str] = []  # stored jobs of queues no longer configured
        # Per task of an active job with max_retries: its failures run again so far (in the store).
        self._retried: dict[str, int] = {}
        # Per unit bound, when a caller keeps them (set a list): (dispatch time, submission time,
        # binding time, tasks bound), for the scheduling latencies; the caller drains it.
        self.timings: list[tuple[float, float, float, int]] | None = None
        self.fast_dispatch = True  # False: next_batch_rows takes its general loop always (tests)
        self.bind_whole = True  # False: on_verdicts takes its per-task path for every unit (tests)
        self._ensure_shards(self.partitions.shards)
        self._group_interner = GroupInterner()
        self._floors_for: tuple[tuple[int, int, int], list[tuple[QueueFloor, ...]]] = ((-1, -1, -1), [])
        # Per queue: the job at its head that max_share holds back (for explain of those behind).
        self._held_back: list[str] = [""] * len(settings.queues)
        # Per queue: the summed cost (cpu, memory, gpu) of its units in flight that reclaim. Whether
        # a queue is below its guarantee, for reclaim, is judged on what it holds plus these: a
        # unit in flight on free room (a gang past the guarantee that may fail) claims nothing, and
        # counting it would stop the units behind it from reclaiming, failure after failure.
        self._claims: list[list[int]] = [[0, 0, 0] for _ in settings.queues]
        self._tenant_jobs: dict[str, int] = {}  # jobs not yet ended per tenant (admission's limit)
        # Jobs with a deadline, cancelled once they could no longer end by it (Settings.end_missed_deadlines).
        self._deadlines = DeadlineWatch()
        # The jobs a deadline cancelled since the runtime last took them (take_deadline_cancels): the
        # binder refuses a late proposal of theirs, which may name victims, as after a user's cancel.
        self._deadline_cancels: list[str] = []
        # Gangs stopped since on_released last returned (a task failed for good and the others
        # can no longer make min_member): job id -> its tasks that held resources, to free.
        self._aborted: dict[str, list[str]] = {}
        # Per task of an active job that failed, why its latest failure failed (its agent's words).
        self._reasons: dict[str, str] = {}
        # Per job, (task index, attempt) of tasks the binder released (node lost, evicted) while
        # their unit's verdict was still on its way: bound, then gone. That late verdict binds
        # none of them, which are pending again (on_verdicts). Dropped when the job ends.
        self._gone_in_flight: dict[str, set[tuple[int, int]]] = {}

    # -- submission ---------------------------------------------------------------------------------
    def submit(self, job: Job) -> str:
        """Admit and queue one job; returns its id (the existing one for a repeated submission_id)."""
        return self.submit_many([job])[0]

    def submit_many(self, jobs: Sequence[Job]) -> list[str]:
        """Admit and queue jobs, all or none, with one store call. Returns their ids in order.

        Raises SpecError for an invalid job and AdmissionRejected when a limit is hit; in both cases
        nothing is stored or queued.
        """
        now = self.clock()
        ids: list[str] = []
        new: list[Job] = []
        shared: list[tuple[TaskGroup, ...]] = []
        totals: list[int] = []
        batch_subs: dict[str, Job] = {}
        batch_ids: set[str] = set()
        queue_index, active, finished, unqueued = (
            self._queue_index,
            self._jobs,
            self._finished,
            self._unqueued,
        )
        # The previous job's groups as given, and what the interner made of them.
        given: tuple[TaskGroup, ...] | None = None
        groups: tuple[TaskGroup, ...] = ()
        total = 0
        ends_missed = self.settings.end_missed_deadlines
        dated = False  # some job has a deadline to watch (one with a deadline takes the whole way)
        for k, job in enumerate(jobs):
            # The usual job, checked here as _check_new checks it: its groups the previous job's
            # (the same tuple, as in a pickled batch, or one of the same group objects, as the API
            # makes them: the interner would give the same groups and total), valid, no
            # submission id, a new id. Any other goes the whole way, which finds the same or says
            # what is wrong.
            g = job.groups
            if (
                given is not None
                and (g is given or (type(g) is tuple and len(g) == len(given) and all(map(is_, g, given))))
                and job.queue in queue_index
                and total >= 1
                and 1 <= job.min_member <= total
                and not job.submission_id
                and job.deadline is None
                and job.id not in active
                and job.id not in finished
                and job.id not in unqueued
                and job.id not in batch_ids
            ):
                batch_ids.add(job.id)
                new.append(job)
                shared.append(groups)
                totals.append(total)
                ids.append(job.id)
                continue
            try:
                # Interned first: the jobs of one batch share their groups tuple, so it is looked up
                # and its replica total summed once for them all (validated per job from the total).
                groups, total = self._shared_groups(job)
                given = g if type(g) is tuple else None
                first = self._check_new(job, total, batch_subs, batch_ids)
                if first is None and job.deadline is not None and ends_missed:
                    why = too_late(job, now)  # a repeat of a submission answers with its first job
                    if why is not None:
                        raise SpecError("deadline", why)
                    dated = True
            except SpecError as exc:
                if len(jobs) == 1:
                    raise
                raise SpecError(f"jobs[{k}].{exc.field}", exc.reason) from None  # which of the batch
            if first is not None:  # a repeat of a submission: its first job answers
                ids.append(first.id)
                continue
            new.append(job)
            shared.append(groups)
            totals.append(total)
            ids.append(job.id)
        if not new:
            return ids
        # The dispatcher's clock, whatever a client gave: aging reads it, and a backdated time
        # would jump the queue past any priority. The same copy holds the shared groups.
        new, rows = restamped_rows(new, shared, now)
        # Tokens are taken only once the jobs are stored: a submission the store refuses takes none.
        tenants = (j.tenant for j in new)
        tokens = self.admission.check(tenants, self._waiting + self._inflight, self._tenant_jobs)
        if self.store is not None:
            try:
                self.store.add_jobs(new)
            except AlreadyStored as exc:
                # Known to the store only: finished and past retention, or in a queue no longer
                # configured. Still taken: the id may not be reused.
                field = exc.field
                at = [k for k, job in enumerate(jobs) if job.id == exc.job_id]
                if len(jobs) > 1 and at:
                    field = f"jobs[{at[0]}].{field}"  # which of the batch
                raise SpecError(field, f"{exc.reason} (ids must be new: it already exists)") from exc
        self.admission.take(tokens)
        self._register(new, totals, rows, dated)
        return ids

    def _shared_groups(self, job: Job) -> tuple[tuple[TaskGroup, ...], int]:
        """(the job's groups as the interned ones, their replica total); SpecError for groups that
        are not task groups (a hand-built Job: the API's parser makes only well-formed ones)."""
        try:
            return self._group_interner.groups(job.groups)
        except (TypeError, AttributeError):
            kind = type(job.groups).__name__
            raise SpecError("groups", f"job {job.id}: must be a tuple of task groups, got {kind}") from None

    def _check_new(self, job: Job, total: int, batch_subs: dict[str, Job], batch_ids: set[str]) -> Job | None:
        """SpecError unless `job` (of `total` tasks) may be taken: valid, and its id new (here and
        in the batch so far). A repeat of a submission id returns the job first submitted under it."""
        self._validate(job, total)
        sid = job.submission_id
        if sid:
            in_batch = batch_subs.get(sid)
            if in_batch is not None and not same_request(job, in_batch):
                raise SpecError(
                    "submission_id", f"{sid!r} is given to two jobs of this request with different specs"
                )
            first = in_batch or self._submitted_as(sid)
            if first is not None:
                if not same_request(job, first):
                    if same_request(replace(job, id=first.id), first):  # only the id differs
                        raise SpecError(
                            "submission_id",
                            f"{sid!r} was first used for job {first.id}, and this request names job "
                            f"{job.id}: a retry names the first job's id or none (a new job needs a "
                            "new submission id)",
                        )
                    raise SpecError(
                        "submission_id",
                        f"{sid!r} was first used for job {first.id} with another spec: a retry "
                        "must repeat that request (a new job needs a new submission id)",
                    )
                return first
            batch_subs[sid] = job
        if job.id in batch_ids:  # not a conflict with a job: a request that names one job twice
            raise SpecError("id", f"job id {job.id!r} is given to two jobs of this request")
        if job.id in self:  # active, kept apart, or retained
            raise SpecError("id", f"job id {job.id!r} already exists")
        batch_ids.add(job.id)
        return None

    def _submitted_as(self, submission_id: str) -> Job | None:
        """The job first submitted under `submission_id`, if any (in memory, or in the store only)."""
        job_id = self._submissions.get(submission_id)
        if job_id is not None and job_id in self:
            return self.job(job_id)
        if self.store is None:
            return None
        job_id = self.store.find_submission(submission_id)
        return None if job_id is None else self.store.get_job(job_id)

    def _validate(self, job: Job, total: int) -> None:
        if job.queue not in self._queue_index:
            known = ", ".join(sorted(self._queue_index))
            # most likely it named none, and this config has no default
            hint = f": {NO_DEFAULT_QUEUE}" if job.queue == DEFAULT_QUEUE else ""
            raise SpecError("queue", f"job {job.id}: unknown queue {job.queue!r}{hint} (known: {known})")
        if total < 1:
            raise SpecError("groups", f"job {job.id}: has no tasks")
        if not 1 <= job.min_member <= total:
            raise SpecError("min_member", f"job {job.id}: min_member {job.min_member} not in 1..{total}")

    def _register(
        self,
        jobs: list[Job],
        totals: list[int],
        rows: list[tuple[Any, ...]] | None = None,
        dated: bool = False,
    ) -> None:
        """Make the records of `jobs` just admitted (`totals`: their task counts, every task
        pending; `rows`: each job's field values, kept for its batches) and queue them in order.
        `dated`: some have a deadline that may cancel them (end_missed_deadlines)."""
        qis = list(map(self._queue_index.__getitem__, map(_QUEUE, jobs)))
        recs = queued_records(jobs, self._seq, qis, totals, rows)  # every task pending, QUEUED
        self._seq += len(recs)
        ids = list(map(_ID, jobs))
        self._jobs.update(zip(ids, recs, strict=True))
        if self._shedding.any_enabled:
            self._shedding.admit(recs)
        tenant_jobs = self._tenant_jobs
        for tenant, n in Counter(map(_TENANT, jobs)).items():
            tenant_jobs[tenant] = tenant_jobs.get(tenant, 0) + n
        subs = list(map(_SUBMISSION, jobs))
        if any(subs):
            self._submissions.update((sid, jid) for sid, jid in zip(subs, ids, strict=True) if sid)
        # Queued in order (a new job has pending tasks and is not cancelled): a queue at a time,
        # which keeps each queue's order; usually one queue takes them all.
        if qis.count(qis[0]) == len(qis):
            self._queues[qis[0]].push_many(recs)
        else:
            for qi in dict.fromkeys(qis):
                self._queues[qi].push_many([rec for rec in recs if rec.qi == qi])
        self._waiting += len(recs)
        if dated:
            for rec in recs:
                if rec.job.deadline is not None:
                    self._deadlines.watch(rec.job, rec.seq)

    # -- dispatching ---------------------------------------------------------------------------------
    def next_batches(
        self, shard_loads: Sequence[int] | None = None, max_units: int | None = None
    ) -> list[UnitBatch]:
        """Take ready units in policy and capacity order and give each to the least-loaded shard.

        `shard_loads` (one number per shard) replaces the dispatcher's own count of units in flight
        per shard as the load; at most settings.batch_size units go to one shard per call, and at
        most `max_units` in all.
        """
        return [b.batch() for b in self.next_batch_rows(shard_loads, max_units)]

    def next_batch_rows(
        self, shard_loads: Sequence[int] | None = None, max_units: int | None = None
    ) -> list[UnitBatchRows]:
        """next_batches with each unit as its row (UnitRow), for a caller that packs the batches:
        they pack as the UnitBatches would, without a Unit object per unit."""
        now = self.clock()
        if self.partitions.version != self._partition_version:
            self._partition_version = self.partitions.version
            self.notify_cluster_changed()
        if self._parked or self._dormant:
            self._release_parked(now)
        if self._deadlines:
            self._end_missed(now)
        n_shards = self.partitions.shards
        self._ensure_shards(n_shards)
        if shard_loads is None:
            base = self._shard_load[:n_shards]
        else:
            if len(shard_loads) != n_shards:
                raise ValueError(f"shard_loads has {len(shard_loads)} entries for {n_shards} shards")
            base = list(shard_loads)
        if not self._waiting:
            return []
        per_shard_cap = self.settings.batch_size
        limit = n_shards * per_shard_cap if max_units is None else max_units
        heap = [(load, s) for s, load in enumerate(base)]
        heapq.heapify(heap)
        batches: list[list[UnitRow]] = [[] for _ in range(n_shards)]

        usage = self.usage
        cap = self.capacity
        queues = self._queues
        names = cap.names
        nq = len(queues)
        shares = [usage.queue_share(n) for n in names]
        floors = self._floors()
        blocked = [False] * nq
        # Per queue: its effective priority at `now`, for a queue with aging (Unit.standing).
        standing_of = [getattr(q, "effective_priority", None) for q in queues]
        # Per queue: the job whose reservation holds it (dispatcher/reservation.py), if any.
        reserved = self._reservations.holding(self._jobs)
        enforce_max = usage.has_capacity
        capped, shares_matter = cap.capped, cap.shares_matter
        sheds = self._shedding.enabled
        fenced = self._fenced if usage.has_capacity and any(self._fenced) else None
        ordered = self._ordered if n_shards > 1 and usage.has_capacity and any(self._ordered) else None
        # unheld: capacity less what is held; free (cpu, memory, gpu): less what is in flight too
        # (this call's units included, counted down below).
        unheld, free = usage.room() if fenced is not None or ordered is not None else ([], [0, 0, 0])
        free_cpu, free_mem, free_gpu = free
        # Per queue: does its next unit wait for those in flight when it is past the free room?
        fence = [fenced is not None and fenced[i] for i in range(nq)]  # always (fairness)
        order = [ordered is not None and ordered[i] for i in range(nq)]  # if it fits without them
        n = 0
        # A lone queue with neither cap nor guarantee, and no fairness fence or share listener:
        # nothing in the loop reads the usage (the room is read once, above), so the units'
        # in-flight cost is added once at the end.
        lone = not shares_matter and fenced is None and not usage.has_listeners
        inflight: dict[tuple[str, str], list[int]] | None = {} if lone else None
        # Per queue: below its guarantee at its share (read by the fences and reclaim); kept in step
        # with `shares`, so it is not asked again for every unit.
        guaranteed = [g > 0 for g in cap.guarantees]
        below = [guaranteed[i] and cap.below_guarantee(i, self._claim_share(i)) for i in range(nq)]
        dispatch = self._dispatch
        if lone and self.fast_dispatch and standing_of[0] is None and reserved[0] is None:
            target = _only_target(base, limit, per_shard_cap)
            if target >= 0 and self._reservations.held[0] is None:
                # Whatever the loop below would do, spelt out for the case at hand (one queue,
                # one shard to fill): the Ray dispatcher's every batch with a single queue.
                assert inflight is not None
                batch = batches[target]
                n, stopped = self._dispatch_alone(
                    queues[0], target, limit, now, floors[0], order[0], free, unheld, batch, inflight
                )
                blocked[0] = stopped  # nothing more to take: the loop below ends at once
        # The shard just given a unit, with its load counted, while its batch has room: it goes back
        # on the heap as the next shard is taken (heappushpop: with one shard far less loaded than
        # the others, as the runtime asks, it comes straight back without moving the heap).
        back: tuple[int, int] | None = None
        while n < limit and (heap or back is not None):
            # -- which queue: below guarantee first, then borrowers by share
            if lone:
                if blocked[0]:
                    break
                best = 0  # an empty queue peeks None below, and is blocked
            else:
                best, best_key = -1, NOT_ELIGIBLE
                for i in range(nq):
                    if blocked[i] or not queues[i]:
                        continue
                    key = cap.rank(i, shares[i])
                    if key == NOT_ELIGIBLE and sheds[i]:
                        key = cap.borrow_rank(i, shares[i])  # at its cap, its head may shed (below)
                    if key == NOT_ELIGIBLE:
                        blocked[i] = True
                    elif key < best_key:
                        best, best_key = i, key
                if best < 0:
                    break
            pq = queues[best]
            rec = pq.peek()
            if rec is None:
                blocked[best] = True
                continue
            if not rec.n_pending or rec.cancelled:
                pq.pop()
                rec.where = IDLE
                self._waiting -= 1
                self._maybe_finish(rec)
                continue
            holder = reserved[best]
            if holder is not None and not ahead(pq, rec, holder, now):
                blocked[best] = True  # the queue's room gathers for the job holding its reservation
                continue
            uniform, states = rec.uniform, rec.states
            if uniform is not None and len(states) == 1 and states[0] is PENDING:
                # A one-task job (most are): what the two calls below would return, without them.
                idx = ALL_OF_ONE
                cpu, mem, gpu = uniform
            else:
                idx = rec.pending_indexes()
                cpu, mem, gpu = rec.cost_of(idx)
            shed = None
            if enforce_max and capped[best]:
                after = usage.queue_share_after(rec.queue, cpu, mem, gpu)
                if not cap.fits(best, after):
                    part = self._prefix_within(rec, idx, cap.max_shares[best])
                    if part is None and self._never_fits(rec, idx):
                        # No fall in usage would ever let it in: set aside, not at the head.
                        pq.pop()
                        self._waiting -= 1
                        rec.failures += 1
                        rec.trust_epoch = self._epoch
                        delay = backoff_delay(
                            self.settings.retry_backoff_s, self.settings.retry_backoff_max_s, rec.failures
                        )
                        self._park(rec, now, delay)
                        continue
                    if part is None and sheds[best]:
                        # Within-queue preemption: its minimum goes, evicting the queue's own
                        # lower-priority tasks to stay within max_share (dispatcher/shedding.py).
                        part = idx[: self._need(rec)]
                        shed = self._shed_for(rec, best, part)
                        if shed is None:
                            part = None
                    if part is None:
                        blocked[best] = True  # head-of-line: the queue waits for its usage to fall
                        self._held_back[best] = rec.job_id
                        continue
                    idx = part  # the rest of the job waits for a later unit
                    cpu, mem, gpu = rec.cost_of(idx)
            if (
                (fence[best] or order[best])
                and self._inflight
                # past the free room (as `not _fits(cpu, mem, gpu, free)`, spelt out: once per unit)
                and ((cpu and cpu > free_cpu) or (mem and mem > free_mem) or (gpu and gpu > free_gpu))
                and (fence[best] or _fits(cpu, mem, gpu, unheld))
                and not below[best]  # it may reclaim: room it can take
            ):
                # fence: past the free room the units in flight race: shards plan the same room,
                # and the first to commit wins, whatever the tenants' shares. The next unit of a
                # fairness queue waits for their answers, so the room goes in the queue's order.
                # order: room that units in flight claim: a later unit of theirs, on a shard that
                # commits first, would take it from an earlier one. Wait for their answers. A unit
                # that does not fit even without them must preempt anyway, so it goes.
                blocked[best] = True
                continue
            pq.pop()
            reclaim = NO_RECLAIM
            claim = False
            if below[best]:
                claimed = self._claims[best]
                held_share = self._claim_share(best)
                if not cap.may_reclaim(best, held_share, self._claim_share(best, cpu, mem, gpu)):
                    # Too big to reclaim for whole: the part within the guarantee reclaims, the
                    # rest follows in a later unit (borrowing, on free room and priority).
                    part = self._prefix_within(rec, idx, cap.guarantees[best], claimed)
                    if part is not None:
                        idx = part
                        cpu, mem, gpu = rec.cost_of(idx)
                if cap.may_reclaim(best, held_share, self._claim_share(best, cpu, mem, gpu)):
                    reclaim = cap.borrowing(shares)
                    claim = True

            # -- which shard: least loaded; a retry avoids its last shard when loads tie
            if back is None:
                load, s = heapq.heappop(heap)
            else:
                load, s = heapq.heappushpop(heap, back)
                back = None
            if s == rec.last_shard and heap and heap[0][0] == load:
                load, s = heapq.heapreplace(heap, (load, s))
            effective = standing_of[best]
            standing = None if effective is None else standing_from(rec.job.priority, effective(rec, now))
            unit = dispatch(rec, idx, cpu, mem, gpu, s, reclaim, floors[best], now, inflight, standing, shed)
            if shed is not None:
                self._shedding.started(rec)
            if rec is self._reservations.held[best]:
                reserved[best] = rec  # in flight now: the jobs behind it wait for its answer
            if claim:
                rec.claim = (cpu, mem, gpu)
                claimed[0] += cpu
                claimed[1] += mem
                claimed[2] += gpu
            free_cpu -= cpu
            free_mem -= mem
            free_gpu -= gpu
            batch = batches[s]
            batch.append(unit)
            if len(batch) < per_shard_cap:
                back = (load + 1, s)
            if shares_matter:
                shares[best] = usage.queue_share(rec.queue)
                if guaranteed[best]:
                    below[best] = cap.below_guarantee(best, self._claim_share(best))
            n += 1
        if inflight:
            for (queue, tenant), (cpu, mem, gpu) in inflight.items():
                usage.add_inflight(queue, tenant, cpu, mem, gpu)
        # Each unit's job as the row of field values its record keeps (made at admission), not
        # read again from the job: UnitBatchRows packs them as it packs the jobs' rows.
        jobs = self._jobs
        out = [
            UnitBatchRows(s, units, [jobs[row[0].id].job_row for row in units])
            for s, units in enumerate(batches)
            if units
        ]
        for b in out:
            self._shard_epoch[b.shard_id] = self._epoch
        return out

    def _floors(self) -> list[tuple[QueueFloor, ...]]:
        """Per queue, the guarantee floors its units carry (capacity.py)."""
        cap = self.usage.capacity_tuple
        if self._floors_for[0] != cap:
            self._floors_for = (cap, self.capacity.floors(cap))
        return self._floors_for[1]

    @staticmethod
    def _need(rec: JobRecord) -> int:
        """Tasks a unit of the job must place: the rest of its gang, else one."""
        held, mm = rec.n_held, rec.job.min_member
        return mm - held if held < mm else 1

    # -- what a reservation asks (reservation.RoomCheck) ------------------------------------------------
    def could_cover(self, rec: JobRecord) -> bool:
        idx = rec.pending_indexes()
        need = rec.cost_of(idx[: self._need(rec)])
        held = self.usage.usage("queue", rec.queue, "held").tolist()
        unheld, _ = self.usage.room()
        return all(n <= h + u for n, h, u in zip(need, held, unheld, strict=True))

    def queue_holds(self, rec: JobRecord) -> bool:
        return bool(self.usage.usage("queue", rec.queue, "held").any())

    def _claim_share(self, qi: int, cpu: int = 0, mem: int = 0, gpu: int = 0) -> float:
        """Queue qi's share for reclaim: what it holds and its reclaiming units in flight claim
        (see _claims), with `cpu, mem, gpu` more."""
        c = self._claims[qi]
        return self.usage.queue_held_share_after(self.capacity.names[qi], c[0] + cpu, c[1] + mem, c[2] + gpu)

    def _prefix_within(
        self, rec: JobRecord, idx: tuple[int, ...], limit: float, claimed: list[int] | None = None
    ) -> tuple[int, ...] | None:
        """The longest prefix of `idx` that keeps the queue's share within `limit` (its max_share,
        or its guarantee), if it holds at least a unit's minimum; None otherwise. With `claimed`
        (the queue's reclaiming cost in flight), the share is that of reclaim (see _claims)."""
        usage = self.usage
        cpu = mem = gpu = 0
        n = 0
        for i in idx:
            c, m, g = rec.cost(i)
            if claimed is None:
                after = usage.queue_share_after(rec.queue, cpu + c, mem + m, gpu + g)
            else:
                after = self._claim_share(rec.qi, cpu + c, mem + m, gpu + g)
            if after > limit + EPS:
                break
            cpu, mem, gpu = cpu + c, mem + m, gpu + g
            n += 1
        return idx[:n] if n and n >= self._need(rec) else None

    def _smallest_unit_share(self, rec: JobRecord, idx: tuple[int, ...]) -> float:
        """The share of the job's next unit at its minimum, with the tasks of its gang it holds
        (they must run together; tasks beyond min_member may end and make room)."""
        held: tuple[int, ...] = ()
        if rec.n_held < rec.job.min_member:
            held = tuple(i for i, s in enumerate(rec.states) if s in HOLDS_RESOURCES)
        c0, m0, g0 = rec.cost_of(held)
        c1, m1, g1 = rec.cost_of(idx[: self._need(rec)])
        return self.usage.dominant_share((c0 + c1, m0 + m1, g0 + g1))

    def _shed_for(self, rec: JobRecord, qi: int, idx: tuple[int, ...]) -> Shed | None:
        """What the unit `idx` of `rec` must make its queue shed to stay within max_share, if it
        may (QueueShedding.shed_for); None: it waits, as without within-queue preemption."""
        usage = self.usage
        excess = usage.queue_excess_after(rec.queue, *rec.cost_of(idx), self.capacity.max_shares[qi])
        if not any(excess):
            return None  # within it after all (the share's rounding): _prefix_within said no
        key = tuple(usage.usage("queue", rec.queue, "held").tolist())
        return self._shedding.shed_for(rec, excess, key)

    def _never_fits(self, rec: JobRecord, idx: tuple[int, ...]) -> bool:
        """Even with its queue otherwise empty, the job's next unit would pass max_share."""
        return not self.capacity.fits(rec.qi, self._smallest_unit_share(rec, idx))

    def _dispatch_alone(
        self,
        pq: PolicyQueue[JobRecord],
        shard: int,
        limit: int,
        now: float,
        floors: tuple[QueueFloor, ...],
        order: bool,
        free: list[int],
        unheld: list[int],
        batch: list[UnitRow],
        inflight: dict[tuple[str, str], list[int]],
    ) -> tuple[int, bool]:
        """next_batch_rows' loop for one queue with no cap, guarantee, reservation or aging feeding
        one shard: the same units in the same order, the same records, with _dispatch's steps
        inline and the counters moved once. Returns the units dispatched and whether the queue has
        none to give now (empty, or its head waits for the units in flight: `order`)."""
        free_cpu, free_mem, free_gpu = free
        of_shard = self._inflight_by_shard[shard]
        epoch = self._shard_epoch[shard]
        in_flight = self._inflight
        # The queue's next entries at once where it can say them (HeapQueue.head_run), popped
        # together once read; else one peek and pop.
        runs = pq if isinstance(pq, HeapQueue) else None
        # The units' cost in flight, summed in locals while their (queue, tenant) stays the same
        # (one queue's jobs, mostly of one tenant): added to `inflight` when it changes, and at the end.
        queue: str | None = None
        tenant = ""
        cpu_sum = mem_sum = gpu_sum = 0
        n = 0
        waits = False
        while n < limit and not waits:
            recs: list[JobRecord] = runs.head_run(limit - n) if runs is not None else []
            from_run = runs if recs else None
            if from_run is None:
                rec = pq.peek()
                if rec is None:
                    break
                recs = [rec]
            start, skipped = n, 0
            for rec in recs:
                if not rec.n_pending or rec.cancelled:
                    skipped += 1  # popped with the others below
                    rec.where = IDLE
                    self._waiting -= 1
                    self._maybe_finish(rec)
                    continue
                uniform, states = rec.uniform, rec.states
                if uniform is not None and len(states) == 1 and states[0] is PENDING:
                    idx = ALL_OF_ONE
                    cpu, mem, gpu = uniform
                else:
                    idx = rec.pending_indexes()
                    cpu, mem, gpu = rec.cost_of(idx)
                if (
                    order
                    and in_flight + n
                    and ((cpu and cpu > free_cpu) or (mem and mem > free_mem) or (gpu and gpu > free_gpu))
                    and _fits(cpu, mem, gpu, unheld)
                ):
                    waits = True  # as the loop's `order` wait: the head waits for the answers in flight
                    break
                count = len(idx)
                if count == 1:
                    states[idx[0]] = SCHEDULED
                else:
                    for i in idx:
                        states[i] = SCHEDULED
                rec.n_pending -= count
                rec.n_scheduled += count
                attempt = rec.attempt = rec.dispatches
                rec.dispatches = attempt + 1
                rec.trust_epoch = epoch
                rec.unsched = False
                rec.where = INFLIGHT
                rec.shard = rec.last_shard = shard
                rec.dispatch_time = now
                of_shard[rec.job_id] = rec
                if rec.queue != queue or rec.tenant != tenant:
                    if queue is not None:
                        _add_cost(inflight, (queue, tenant), cpu_sum, mem_sum, gpu_sum)
                    queue, tenant = rec.queue, rec.tenant
                    cpu_sum = mem_sum = gpu_sum = 0
                cpu_sum += cpu
                mem_sum += mem
                gpu_sum += gpu
                held = rec.n_held
                need = rec.job.min_member - held
                if need < 1:
                    need = 1
                if need > count:
                    need = count
                batch.append((rec.job, idx, need, attempt, NO_RECLAIM, now, held, floors, None))
                free_cpu -= cpu
                free_mem -= mem
                free_gpu -= gpu
                n += 1
            used = n - start + skipped  # the entries read, the one that waits left out
            if from_run is not None:
                if used:
                    from_run.drop_run(recs if used == len(recs) else recs[:used])
            elif used:
                pq.pop()
        if queue is not None:
            _add_cost(inflight, (queue, tenant), cpu_sum, mem_sum, gpu_sum)
        if n:
            self._shard_load[shard] += n
            self._waiting -= n
            self._inflight += n
            self._held_back[0] = ""
        return n, n < limit

    def _dispatch(
        self,
        rec: JobRecord,
        idx: tuple[int, ...],
        cpu: int,
        mem: int,
        gpu: int,
        shard: int,
        reclaim: frozenset[str],
        floors: tuple[QueueFloor, ...],
        now: float,
        inflight: dict[tuple[str, str], list[int]] | None,
        standing: int | None = None,
        shed: Shed | None = None,
    ) -> UnitRow:
        """Send the unit `idx` of `rec` (costing cpu, mem, gpu) to `shard`: its tasks scheduled, its
        cost in flight (added to `inflight` per queue and tenant, when given, for the caller to add
        at once); returns the unit as its row. Runs once per unit: plain locals and no calls."""
        states = rec.states
        count = len(idx)
        if count == 1:
            states[idx[0]] = SCHEDULED
        else:
            for i in idx:
                states[i] = SCHEDULED
        rec.n_pending -= count
        rec.n_scheduled += count
        attempt = rec.attempt = rec.dispatches
        rec.dispatches = attempt + 1
        rec.trust_epoch = self._shard_epoch[shard]
        rec.unsched = False
        rec.where = INFLIGHT
        rec.shard = rec.last_shard = shard
        rec.dispatch_time = now
        self._inflight_by_shard[shard][rec.job_id] = rec
        self._shard_load[shard] += 1
        self._waiting -= 1
        self._inflight += 1
        if inflight is None:
            self.usage.add_inflight(rec.queue, rec.tenant, cpu, mem, gpu)
        else:
            key = (rec.queue, rec.tenant)
            row = inflight.get(key)
            if row is None:
                inflight[key] = [cpu, mem, gpu]
            else:
                row[0] += cpu
                row[1] += mem
                row[2] += gpu
        self._held_back[rec.qi] = ""
        # The tasks the unit must place: the rest of its gang (see _need), at most the unit's.
        held = rec.n_held
        need = rec.job.min_member - held
        if need < 1:
            need = 1
        if need > count:
            need = count
        if shed is None:  # the usual unit: its row without the field (UnitRow)
            return (rec.job, idx, need, attempt, reclaim, now, held, floors, standing)
        return (rec.job, idx, need, attempt, reclaim, now, held, floors, standing, shed)

    # -- answers ---------------------------------------------------------------------------------------
    def on_reply(self, reply: BindReply) -> list[str]:
        """Take the binder's verdicts and evictions. Returns task ids bound for jobs or tasks that
        were cancelled meanwhile (or are unknown): the caller should release them."""
        return self.on_verdicts(Verdicts.of(reply))

    def on_verdicts(self, reply: Verdicts) -> list[str]:
        """on_reply for the reply read as Verdicts (read_verdicts: the Ray dispatcher's)."""
        now = self.clock()
        updates: Updates = []
        orphans: list[str] = []
        jobs = self._jobs
        shard = reply.shard_id
        if 0 <= shard < len(self._shard_refused):
            self._shard_refused[shard] = (self._shard_refused[shard][1], bool(reply.rejected))
        # Whole units bound as dispatched (the common case) move from in flight to held in one
        # step per queue and tenant at the end, without the per-task transition checks of _apply.
        committed: dict[tuple[str, str], list[int]] = {}
        # The binder's refusals by job: of a unit bound in part (an elastic job), they tell the
        # accepted loop that the tasks left were refused, not left unplaced by the shard.
        refused: dict[str, list[RejectedUnit]] = {}
        for rej in reply.rejected:
            refused.setdefault(rej.job_id, []).append(rej)
        timings = self.timings
        whole = self.bind_whole
        shard_load, by_shard, n_shards = self._shard_load, self._inflight_by_shard, len(self._shard_load)
        # The cost bound whole, summed in locals while the (queue, tenant) stays the same (as the
        # one-queue loop sums what it dispatches): added to `committed` when it changes, and at the end.
        queue: str | None = None
        tenant = ""
        cpu_sum = mem_sum = gpu_sum = 0
        for job_id, attempt, indexes, bind_time, _ in reply.accepted:
            rec = jobs.get(job_id)
            if rec is None:
                orphans.extend(task_id(job_id, i) for i in indexes)
                continue
            k = len(indexes)
            if timings is not None and rec.dispatch_time:  # (dispatched by this dispatcher)
                timings.append((rec.dispatch_time, rec.job.submit_time, bind_time, k))
            states = rec.states
            if (
                whole
                and rec.where is INFLIGHT
                and not rec.cancelled
                and not rec.unsched
                and k == rec.n_scheduled
                and (
                    states[indexes[0]] is SCHEDULED
                    if k == 1
                    else len(set(indexes)) == k and all(states[i] is SCHEDULED for i in indexes)
                )
            ):
                # The unit in flight bound whole, its tasks all still scheduled (the usual answer):
                # bound without _apply's per-task checks, its cost committed with the others at
                # the end, the unit cleared as answered in full (_resolve without backoff; a job
                # with every task placed forgets its earlier failures). Spelt out: it runs per unit.
                if k == 1:
                    states[indexes[0]] = BOUND
                else:
                    for i in indexes:
                        states[i] = BOUND
                rec.n_scheduled = 0
                rec.n_held += k
                rec.failures = 0
                uniform = rec.uniform
                if uniform is None:
                    cpu, mem, gpu = rec.cost_of(indexes)
                else:
                    cpu, mem, gpu = uniform[0] * k, uniform[1] * k, uniform[2] * k  # as cost_of
                if rec.queue != queue or rec.tenant != tenant:
                    if queue is not None:
                        _add_cost(committed, (queue, tenant), cpu_sum, mem_sum, gpu_sum)
                    queue, tenant = rec.queue, rec.tenant
                    cpu_sum = mem_sum = gpu_sum = 0
                cpu_sum += cpu
                mem_sum += mem
                gpu_sum += gpu
                # _leave_flight (the job is not cancelled: checked above)
                s = rec.shard
                if s < n_shards:
                    shard_load[s] -= 1
                    by_shard[s].pop(job_id, None)
                self._inflight -= 1
                rec.where = IDLE
                rec.shard = -1
                claim = rec.claim
                if claim is not None:
                    rec.claim = None
                    claimed = self._claims[rec.qi]
                    claimed[0] -= claim[0]
                    claimed[1] -= claim[1]
                    claimed[2] -= claim[2]
                if rec.n_pending:  # tasks that became pending meanwhile (a failed one: its backoff)
                    self._wait_or_enqueue(rec, now)
                else:
                    # Every task is placed: the reasons of earlier attempts no longer say anything.
                    rec.note = ""
                    rec.diagnosis = None
                continue
            changes: list[tuple[int, TaskState]] = []
            gone = self._gone_in_flight.get(job_id) if self._gone_in_flight else None
            for i in indexes:
                st = states[i]
                if gone is not None and (i, attempt) in gone:
                    gone.discard((i, attempt))  # released since this bind: pending, not bound
                    continue
                if st is SCHEDULED or st is PENDING:
                    changes.append((i, BOUND))
                elif st not in HOLDS_RESOURCES:
                    orphans.append(task_id(rec.job_id, i))
            self._apply(rec, changes, updates)
            if rec.where is INFLIGHT:
                if rec.n_scheduled:
                    self._apply(rec, [(i, PENDING) for i in rec.indexes_in(SCHEDULED)], updates)
                    why = refused.get(rec.job_id)
                    if why:
                        # The binder refused the rest: a race for the room (another shard took
                        # it), not unschedulable. Queued again at once, as a unit refused whole
                        # is; the rejected loop below skips the job once resolved, so its
                        # reason is kept here.
                        rec.note = _refused_in_part(rec.attempt, why)
                    else:
                        # tasks of the unit that the shard did not place: it could not fit them
                        rec.unsched = True
                if not rec.unsched:
                    rec.failures = 0
                self._resolve(rec, now, backoff=rec.unsched)
            if not rec.n_pending:
                # Every task is placed: the reasons of earlier attempts no longer say anything.
                rec.note, rec.diagnosis = "", None
        if queue is not None:
            _add_cost(committed, (queue, tenant), cpu_sum, mem_sum, gpu_sum)
        usage = self.usage
        for (q, t), (cpu, mem, gpu) in committed.items():
            usage.commit(q, t, cpu, mem, gpu)
        for rej in reply.rejected:
            rec = jobs.get(rej.job_id)
            if rec is None or rec.where is not INFLIGHT:
                continue
            rec.note = f"attempt {rec.attempt} rejected by the binder ({rej.stage}): {rej.reason}"
            self._apply(rec, [(i, PENDING) for i in rec.indexes_in(SCHEDULED)], updates)
            self._resolve(rec, now, backoff=False)
        # Per job: its tasks this reply evicted, by preemptor (explain names them all).
        disrupted: dict[str, tuple[JobRecord, dict[str, list[int]]]] = {}
        for ev in reply.evicted:
            rec = jobs.get(ev.job_id)
            if rec is None or rec.states[ev.task_index] not in HOLDS_RESOURCES:
                continue
            then = CANCELLED if rec.cancelled else PENDING
            self._apply(rec, [(ev.task_index, PREEMPTED), (ev.task_index, then)], updates)
            by = disrupted.setdefault(rec.job_id, (rec, {}))[1]
            by.setdefault(ev.preemptor or "a gang break", []).append(ev.task_index)
            self._requeue_if_idle(rec)
        for rec, by in disrupted.values():
            rec.disruption = "; ".join(
                f"{'tasks' if len(ix) > 1 else 'task'} {', '.join(map(str, sorted(ix)))} preempted by {who}"
                for who, ix in by.items()
            )
        if reply.evicted and evictions_made_room(reply.accepted, reply.evicted, jobs):
            self.notify_cluster_changed()
        if self.store is not None and updates:
            self.store.set_task_states(updates)
        return orphans

    def on_unschedulable(self, items: Sequence[Unschedulable]) -> None:
        """Tasks a shard could not place: back to pending; the job retries after a backoff."""
        now = self.clock()
        updates: Updates = []
        for item in items:
            rec = self._jobs.get(item.job_id)
            if rec is None or not (rec.n_scheduled or rec.n_pending):
                continue  # gone, or placed whole by a later attempt: this verdict is stale
            rec.diagnosis = item.diagnosis
            if item.attempt != rec.attempt:
                continue  # an answer for an attempt that is no longer out
            if rec.where is INFLIGHT:
                states = rec.states
                self._apply(rec, [(i, PENDING) for i in item.task_indexes if states[i] is SCHEDULED], updates)
                rec.unsched = True
                if not rec.n_scheduled:
                    self._resolve(rec, now, backoff=True)
                    if not rec.failed_backoff:  # one that waits out a failure takes no reservation
                        self._reservations.on_unschedulable(rec, item.diagnosis, now, self)
            if rec.where is PARKED and (item.settling or self._refused_near(rec.last_shard)):
                # Parked just now (or by the reply, for a gang placed in part); the verdict may
                # change once the shard's placements are answered: retry when the backoff ends.
                rec.park_epoch = UNTRUSTED
        if self.store is not None and updates:
            self.store.set_task_states(updates)

    def _refused_near(self, shard: int) -> bool:
        """Whether the binder refused placements of `shard` in its latest reply or the one before.

        A shard judges a unit unschedulable against a view that holds its own placements still
        awaiting the binder: those of the same batch, and, with pipelined rounds, those of the
        batch before (planned-on but not yet answered). A refused placement frees room in that
        view, yet the binder changed nothing, so no cluster change would wake a job parked on such
        a verdict: it is not trusted, and the job retries when its backoff ends. The reports come
        reply first, then the batch's verdicts, so the two latest replies are those two batches'.
        """
        return 0 <= shard < len(self._shard_refused) and any(self._shard_refused[shard])

    def on_released(
        self,
        task_ids: Iterable[str],
        final_state: TaskState,
        reasons: Mapping[str, str] | None = None,
        *,
        again: Collection[str] = (),
    ) -> dict[str, list[str]]:
        """Tasks that stopped holding resources: finished (succeeded, failed, cancelled), or back to
        pending (PENDING: node lost; PREEMPTED: evicted) and then queued again. `reasons`: why a
        failed task failed (its agent's words), kept as the job's note for explain. `again`: the
        pending ones that failed and run again (on_retried): their failure is their note.

        Returns the gangs a failure for good of this call stopped (the others could no longer make
        the job's min_member: it has failed, its other tasks are cancelled), by job id, with their
        tasks that held resources: the caller frees them at the binder as a cancel's are
        (Binder.cancel_job), which stops them on their nodes. Those a restore stopped stay for
        take_aborted: a caller that releases lost tasks (no failure) may drop the answer."""
        updates: Updates = []
        told: dict[str, str] = {}  # the reasons of tasks this call ends, kept in the store
        earlier = self._aborted  # a restore's, still to send: not this caller's to take
        self._aborted = {}
        try:
            self._release(task_ids, final_state, reasons, again, updates, told)
            if told:
                self._note_reasons(told)
            if self.store is not None and (updates or told):
                self.store.set_task_states(updates, reasons=told)
        except BaseException:  # no answer goes out: all of them wait for take_aborted
            self._aborted = earlier | self._aborted
            raise
        now, self._aborted = self._aborted, earlier
        return now

    def _note_reasons(self, told: Mapping[str, str]) -> None:
        """Keep each task's latest failure reason, for the API (a finished job's go with it)."""
        for tid, why in told.items():
            job_id, index = split_task_id(tid)
            if job_id in self._jobs:
                self._reasons[tid] = why
            else:  # ended by this very failure
                kept = self._finished.get(job_id) or self._unqueued.get(job_id)
                if kept is not None:
                    reasons = list(kept.reasons or ("",) * len(kept.states))
                    reasons[index] = why
                    done = replace(kept, reasons=tuple(reasons))
                    (self._finished if job_id in self._finished else self._unqueued)[job_id] = done

    def take_aborted(self) -> dict[str, list[str]]:
        """The gangs stopped since the last call (on_released's answer, or restore's), by job id,
        with their tasks that held resources, for the binder's cancel_job."""
        aborted, self._aborted = self._aborted, {}
        return aborted

    def _release(
        self,
        task_ids: Iterable[str],
        final_state: TaskState,
        reasons: Mapping[str, str] | None,
        again: Collection[str],
        updates: Updates,
        told: dict[str, str],
    ) -> None:
        """on_released's work, its store writes added to `updates` and `told` for the caller."""
        freed = False
        failed_gangs: dict[str, int] = {}  # gangs a task of failed for good: its latest failed index
        for tid in task_ids:
            job_id, index = split_task_id(tid)
            rec = self._jobs.get(job_id)
            if rec is None:
                if job_id in self._unqueued:
                    why = (reasons or {}).get(tid, "") if final_state is TaskState.FAILED else ""
                    if why:
                        told[tid] = why
                    freed = self._release_unqueued(job_id, index, final_state, why) or freed
                    if final_state is FAILED:
                        failed_gangs[job_id] = index  # judged once the call's other ends are in
                continue
            current = rec.states[index]
            if current is final_state:
                continue
            freed = freed or current in HOLDS_RESOURCES
            if final_state is PREEMPTED or final_state is PENDING:
                if current in TERMINAL:
                    continue
                then = CANCELLED if rec.cancelled else PENDING
                steps = [(index, PREEMPTED), (index, then)] if final_state is PREEMPTED else [(index, then)]
                if current is SCHEDULED:  # bound at the binder, the verdict not here yet: then gone
                    self._gone_in_flight.setdefault(job_id, set()).add((index, rec.attempt))
                if tid not in again:
                    rec.disruption = f"task {index} " + (
                        "evicted" if final_state is PREEMPTED else "lost its node"
                    )
                self._apply(rec, steps, updates)
                self._requeue_if_idle(rec)
            else:
                if current in TERMINAL:
                    continue
                self._apply(rec, [(index, final_state)], updates)
                if reasons and tid in reasons:
                    if final_state is TaskState.FAILED:
                        told[tid] = reasons[tid]
                    line = failure_line(index, final_state, reasons[tid])
                    used = self._retried.get(tid, 0) if final_state is FAILED else 0
                    if used and used >= rec.job.max_retries:
                        line += f"; no retry left (of {used})"
                    rec.failure = with_failure(rec.failure, line)
                if final_state is FAILED and rec.job.min_member > 1:
                    failed_gangs[job_id] = index  # judged once the call's other ends are in
                if rec.where is INFLIGHT and not rec.n_scheduled:
                    self._resolve(rec, self.clock(), backoff=False)
                self._maybe_finish(rec)
        for job_id, index in failed_gangs.items():
            rec = self._jobs.get(job_id)  # gone: every task ended
            if rec is not None and not rec.cancelled and gang_failed(rec.states, rec.job.min_member):
                freed = self._abort_gang(rec, index, updates) or freed
            elif rec is None and job_id in self._unqueued:
                freed = self._abort_unqueued_gang(job_id, index) or freed
        if freed:
            self.notify_cluster_changed()

    def begin_retries(self, task_ids: Iterable[str]) -> list[str]:
        """Of these failed tasks, those their job runs again (Job.max_retries not used up, the job not
        cancelled, the task still holding its room): the caller takes them from their nodes as lost
        (a gang below its min_member with them) and calls on_retried.

        Their backoff's end is stored first, with each failure marked on its task's row: the
        binder's write that takes them off their nodes stores them pending, and a restart after
        it, before on_retried's write, then still waits the backoff out and counts the failure
        (Store.load_retried), so no task gets a retry past max_retries. A restart before that
        write finds the task still bound and its job's backoff stored: only the job's tasks pending
        then wait it out, as they would have after on_retried, and the mark is dropped. Nothing
        else changes here; on_retried does the rest.

        A gang that the report's failures with no retry left leave below its min_member for good
        runs none of them again: it has failed (on_released stops the rest), so the caller ends
        them all as failed. The caller ends those failures first, then takes these off their nodes,
        so that a gang broken by these takes no task whose failure is final with it."""
        out = []
        waits: dict[str, float] = {}
        base, cap = self.settings.failure_backoff_s, self.settings.failure_backoff_max_s
        now = self.clock()
        final: dict[str, list[int]] = {}  # per gang of the report, its tasks failed for good
        for tid in task_ids:
            job_id, index = split_task_id(tid)
            rec = self._jobs.get(job_id)
            if rec is None or not rec.job.max_retries or rec.cancelled:
                continue
            used = self._retried.get(tid, 0)
            if rec.states[index] in HOLDS_RESOURCES and used < rec.job.max_retries:
                out.append(tid)
                delay = backoff_delay(base, cap, used + 1)
                if delay:
                    waits[job_id] = max(waits.get(job_id, rec.retry_at), now + delay)
            elif rec.job.min_member > 1 and rec.states[index] in HOLDS_RESOURCES:
                # Its retries used up (one no longer holding room was lost or evicted meanwhile:
                # no failure of its own).
                final.setdefault(job_id, []).append(index)
        failed = {job_id for job_id, indexes in final.items() if self._fails_with(job_id, indexes)}
        if failed:
            out = [tid for tid in out if split_task_id(tid)[0] not in failed]
            waits = {job_id: at for job_id, at in waits.items() if job_id not in failed}
        if self.store is not None and out:
            self.store.set_task_states([], retry_at=waits, failing=out)
        return out

    def _fails_with(self, job_id: str, indexes: list[int]) -> bool:
        """The gang has failed once these of its tasks have failed for good."""
        rec = self._jobs[job_id]
        states = list(rec.states)
        for index in indexes:
            states[index] = FAILED
        return gang_failed(states, rec.job.min_member)

    def _holds(self, tid: str) -> bool:
        job_id, index = split_task_id(tid)
        rec = self._jobs.get(job_id)
        return rec is not None and rec.states[index] in HOLDS_RESOURCES

    def on_retried(
        self, retried: Sequence[str], released: Sequence[str], reasons: Mapping[str, str] | None = None
    ) -> None:
        """`retried` (from begin_retries) failed and are queued to run again; `released`: every task the
        binder took off its node for them, gang members included. explain tells each failure, with
        the retries it leaves."""
        gone = set(released)
        counted = [tid for tid in retried if tid in gone]  # the binder held them: none ended otherwise
        # A restart between the binder's write and this one restored them as pending and counted
        # their failures already (Store.load_retried): told, not counted again.
        restored = {tid for tid in counted if not self._holds(tid)}
        told: dict[str, str] = {}
        waiting: dict[str, JobRecord] = {}  # jobs with a backoff to wait out
        base, cap = self.settings.failure_backoff_s, self.settings.failure_backoff_max_s
        now = self.clock()
        for tid in counted:
            job_id, index = split_task_id(tid)
            rec = self._jobs.get(job_id)
            if rec is None:  # ended since begin_retries (a cancel): nothing runs again
                continue
            used = self._retried.get(tid, 0) + (tid not in restored)
            self._retried[tid] = used
            why = (reasons or {}).get(tid, "")
            if why:
                told[tid] = why
            delay = backoff_delay(base, cap, used)
            if delay:
                rec.retry_at = max(rec.retry_at, now + delay)  # the longest of its failures
                waiting[job_id] = rec
            line = failure_line(index, FAILED, why or "no reason given")
            again = retry_line(line, used, rec.job.max_retries, format_duration(delay) if delay else "")
            rec.failure = with_failure(rec.failure, again)
        for tid in gone.difference(counted):  # a gang's members stopped with a failed one
            job_id, index = split_task_id(tid)
            mate = self._jobs.get(job_id)
            if mate is not None:
                mate.disruption = f"task {index} stopped: a task of its gang failed and runs again"
        updates: Updates = []
        self._release(released, PENDING, None, gone, updates, told)  # an idle job parks (_wait_or_enqueue)
        if told:
            self._note_reasons(told)
        for rec in waiting.values():
            self._back_off_failed(rec, now)
        if self.store is not None and (updates or retried):
            # One transaction (the backoff's end and the failure's mark were stored before the
            # binder's write, by begin_retries): the pending state, the count and the backoff stand
            # or fall together; the marks of tasks the binder no longer held are dropped.
            waits = {job_id: rec.retry_at for job_id, rec in waiting.items()}  # a restart waits them out
            fresh = [tid for tid in counted if tid not in restored]
            settled = [tid for tid in retried if tid not in fresh]
            self.store.set_task_states(updates, reasons=told, retried=fresh, retry_at=waits, settled=settled)

    def _back_off_failed(self, rec: JobRecord, now: float) -> None:
        """A job with a failed task to run again is not queued before its retry_at. One already
        queued, or parked or dormant until earlier, is parked until then; one in flight parks when
        its unit is answered (_resolve), and one parked later than that keeps its wait."""
        where = rec.where
        if where is QUEUED:
            self._queues[rec.qi].remove(rec.job_id)
        elif where is PARKED and rec.ready_at < rec.retry_at:
            self._backing_off -= 1  # its heap entry goes stale with the new park token
        elif where is not DORMANT:
            return
        self._waiting -= 1
        self._park_failed(rec, now)

    def _park_failed(self, rec: JobRecord, now: float) -> None:
        """Park `rec` until its retry_at, then queue it whether or not the cluster changed (the
        failure, not the room, is why it waits). It gives up its queue's reservation meanwhile."""
        self._park(rec, now, rec.retry_at - now)
        rec.park_epoch = UNTRUSTED  # retried when the backoff ends, not only on a change
        rec.failed_backoff = True
        self._reservations.release(rec)

    def _wait_or_enqueue(self, rec: JobRecord, now: float) -> None:
        """Queue `rec`, or park it while a failed task's backoff lasts."""
        if rec.retry_at > now:
            self._park_failed(rec, now)
        else:
            self._enqueue(rec)

    def on_started(self, task_ids: Iterable[str]) -> list[str]:
        """Tasks whose process started on their node: bound -> running. Tasks in any other state
        (cancelled or evicted meanwhile, or already running) are skipped. Returns those moved."""
        updates: Updates = []
        moved: list[str] = []
        for tid in task_ids:
            job_id, index = split_task_id(tid)
            rec = self._jobs.get(job_id)
            if rec is None or rec.states[index] is not BOUND:
                continue
            self._apply(rec, [(index, RUNNING)], updates)
            updates.append((tid, RUNNING))  # not in PERSISTED: only this call knows it started
            moved.append(tid)
        if self.store is not None and updates:
            self.store.set_task_states(updates)
        return moved

    def cancel(self, job_id: str, note: str = "cancelled") -> list[str]:
        """Cancel a job: every task not yet finished becomes cancelled now and leaves usage.
        `note`: what explain tells of it.

        Returns the ids of the tasks that were holding resources: the caller frees them at the
        binder (a later on_released for them is a no-op). Cancelling twice returns [] the second time.
        """
        if job_id in self._finished:
            return []
        if job_id in self._unqueued:
            return self._cancel_unqueued(job_id)
        rec = self._jobs[job_id]
        if rec.cancelled:
            return []
        updates: Updates = []
        holding = self._cancel_record(rec, note, updates)
        if holding:
            self.notify_cluster_changed()
        if self.store is not None and updates:
            self.store.set_task_states(updates)
        return [task_id(job_id, i) for i in holding]

    def _abort_gang(self, rec: JobRecord, index: int, updates: Updates) -> bool:
        """Task `index` of a gang failed for good, and the others can no longer make its
        min_member: the job has failed (a DDP rank's peers would wait for it for ever). Its other
        tasks are cancelled, as Kubeflow's training jobs and JobSet's failure policy stop them, and
        those that held resources are handed to the caller to free (on_released's answer).
        Returns whether any held resources."""
        failed = sum(1 for s in rec.states if s is FAILED)
        note = (
            f"stopped: task {index} failed with no retry left, and with {failed} of its "
            f"{len(rec.states)} tasks failed the gang cannot reach its min_member of {rec.job.min_member}"
        )
        holding = self._cancel_record(rec, note, updates)
        log.info("job %s failed: %s", rec.job_id, note)
        # Told to the binder even with nothing held, as a cancel is: a unit in flight is refused.
        self._aborted[rec.job_id] = [task_id(rec.job_id, i) for i in holding]
        return bool(holding)

    def _cancel_record(self, rec: JobRecord, note: str, updates: Updates) -> list[int]:
        """cancel() on the record, its store writes added to `updates`; returns the indexes of its
        tasks that were holding resources."""
        rec.cancelled = True
        job_id = rec.job_id
        if rec.where is QUEUED:
            self._queues[rec.qi].remove(job_id)
            self._waiting -= 1
            rec.where = IDLE
        elif rec.where is PARKED or rec.where is DORMANT:
            if rec.where is PARKED:
                self._backing_off -= 1
            rec.park_token = -1
            self._waiting -= 1
            rec.where = IDLE
        holding = [i for i, s in enumerate(rec.states) if s in HOLDS_RESOURCES]
        self._apply(rec, [(i, CANCELLED) for i, s in enumerate(rec.states) if s not in TERMINAL], updates)
        if rec.where is INFLIGHT:
            self._resolve(rec, self.clock(), backoff=False)
        rec.note = note
        self._maybe_finish(rec)
        return holding

    def _cancel_unqueued(self, job_id: str, note: str = "cancelled") -> list[str]:
        """Cancel a job of a queue no longer configured: it is not in usage nor in any queue.
        `note`: what explain tells of it (a failed gang's stop, which ends it failed)."""
        kept = self._unqueued.pop(job_id)
        states = list(kept.states)
        holding = [i for i, s in enumerate(states) if s in HOLDS_RESOURCES]
        updates: Updates = []
        for i, s in enumerate(states):
            if s not in TERMINAL:
                states[i] = CANCELLED
                updates.append((task_id(job_id, i), CANCELLED))
        history = "\n".join(filter(None, (kept.note, note)))  # a failure told before stays
        ended = job_state_of(states, kept.job.min_member, True)  # failed, for a failed gang
        self._retain(replace(kept, state=ended, states=tuple(states), note=history))
        if self.store is not None and updates:
            self.store.set_task_states(updates)
        if holding:
            self.notify_cluster_changed()
        return [task_id(job_id, i) for i in holding]

    def _release_unqueued(self, job_id: str, index: int, final_state: TaskState, why: str) -> bool:
        """A task of a job of a queue no longer configured stopped holding resources: its state is
        kept (no usage or queue to update: such jobs have neither); a lost or evicted one waits as
        pending, never scheduled. Once every task has ended, the job is finished. `why`: the
        reason a failed task failed. Returns whether the task held resources."""
        kept = self._unqueued[job_id]
        states = list(kept.states)
        if states[index] not in HOLDS_RESOURCES:
            return False
        states[index] = PENDING if final_state is PREEMPTED else final_state
        state = job_state_of(states, kept.job.min_member, False)
        history = with_failure(kept.note, failure_line(index, final_state, why)) if why else kept.note
        done = replace(kept, state=state, states=tuple(states), note=history)  # its reasons and retries too
        if all(s in TERMINAL for s in states):
            del self._unqueued[job_id]
            self._retain(done)
        else:
            self._unqueued[job_id] = done
        return True

    def _abort_unqueued_gang(self, job_id: str, index: int) -> bool:
        """_abort_gang for a job of a queue no longer configured: if its failed tasks leave it
        below its min_member for good, its other tasks are cancelled, those held handed to the
        caller. Returns whether any held resources."""
        kept = self._unqueued[job_id]
        if not gang_failed(kept.states, kept.job.min_member):
            return False
        note = (
            f"stopped: task {index} failed, and the gang cannot reach its min_member of {kept.job.min_member}"
        )
        holding = self._aborted[job_id] = self._cancel_unqueued(job_id, note)
        return bool(holding)

    def requeue_in_flight(self, shard_id: int) -> int:
        """Take back every unit in flight at a shard that is gone; they are queued again at once.

        Only for a shard whose proposals can no longer reach the binder. Returns the units taken back.
        """
        if shard_id >= len(self._inflight_by_shard):
            return 0
        now = self.clock()
        updates: Updates = []
        recs = list(self._inflight_by_shard[shard_id].values())
        for rec in recs:
            self._apply(rec, [(i, PENDING) for i in rec.indexes_in(SCHEDULED)], updates)
            rec.note = f"attempt {rec.attempt} taken back from shard {shard_id}"
            self._resolve(rec, now, backoff=False)
        if self.store is not None and updates:
            self.store.set_task_states(updates)
        return len(recs)

    # -- state bookkeeping -----------------------------------------------------------------------------
    def _apply(self, rec: JobRecord, changes: Iterable[tuple[int, TaskState]], updates: Updates) -> None:
        """Move tasks of one job through legal transitions, keeping counts and usage in step."""
        states = rec.states
        held = [0, 0, 0]
        infl = [0, 0, 0]
        store = self.store is not None
        for i, new in changes:
            old = states[i]
            if new not in LEGAL[old]:
                check_transition(task_id(rec.job_id, i), old, new)
            states[i] = new
            c = rec.cost(i)
            if old is PENDING:
                rec.n_pending -= 1
            elif old is SCHEDULED:
                rec.n_scheduled -= 1
                infl[0] -= c[0]
                infl[1] -= c[1]
                infl[2] -= c[2]
            elif old in HOLDS_RESOURCES:
                rec.n_held -= 1
                held[0] -= c[0]
                held[1] -= c[1]
                held[2] -= c[2]
            if new is PENDING:
                rec.n_pending += 1
            elif new is SCHEDULED:
                rec.n_scheduled += 1
                infl[0] += c[0]
                infl[1] += c[1]
                infl[2] += c[2]
            elif new in HOLDS_RESOURCES:
                rec.n_held += 1
                held[0] += c[0]
                held[1] += c[1]
                held[2] += c[2]
            if store and new in PERSISTED:
                updates.append((task_id(rec.job_id, i), new))
        if self._deadlines.late and not rec.n_held:  # a late job that started now holds nothing
            self._deadlines.waits_again(rec.job_id)
        if held == [-x for x in infl]:
            if any(held):
                self.usage.commit(rec.queue, rec.tenant, *held)
            return
        if any(held):
            self.usage.add_held(rec.queue, rec.tenant, *held)
        if any(infl):
            self.usage.add_inflight(rec.queue, rec.tenant, *infl)

    def _leave_flight(self, rec: JobRecord) -> None:
        """The job's unit in flight is answered: its shard's slot is free, the job idle (spelt out
        in on_verdicts too: change both)."""
        s = rec.shard
        if s < len(self._shard_load):
            self._shard_load[s] -= 1
            self._inflight_by_shard[s].pop(rec.job_id, None)
        self._inflight -= 1
        rec.where = IDLE
        rec.shard = -1
        claim = rec.claim
        if claim is not None:
            rec.claim = None
            claimed = self._claims[rec.qi]
            claimed[0] -= claim[0]
            claimed[1] -= claim[1]
            claimed[2] -= claim[2]

    def _resolve(self, rec: JobRecord, now: float, *, backoff: bool) -> None:
        """The unit in flight has been answered in full: clear it and queue the job again if needed."""
        if rec.where is not INFLIGHT:
            return
        self._leave_flight(rec)
        if rec.cancelled or not rec.n_pending:
            return
        if backoff:
            rec.failures += 1
            delay = backoff_delay(
                self.settings.retry_backoff_s, self.settings.retry_backoff_max_s, rec.failures
            )
            if rec.retry_at > now + delay:  # a failed task's backoff is the longer wait
                self._park_failed(rec, now)
            else:
                self._park(rec, now, delay)
            return
        self._wait_or_enqueue(rec, now)

    def _maybe_finish(self, rec: JobRecord) -> None:
        """Drop the record of a job whose every task has ended, keeping a small summary."""
        if rec.where is not IDLE or rec.n_pending or rec.n_scheduled or rec.n_held:
            return
        del self._jobs[rec.job_id]
        if self._shedding.any_enabled:
            self._shedding.forget(rec)
        self._reservations.forget(rec.job_id)
        if self._gone_in_flight:
            self._gone_in_flight.pop(rec.job_id, None)
        self._deadlines.late.discard(rec.job_id)
        retries = self.retries_of(rec.job)
        if rec.job.max_retries and self._retried:
            for tid in rec.job.task_ids():
                self._retried.pop(tid, None)
        reasons = self.reasons_of(rec.job)
        if reasons:
            for tid in rec.job.task_ids():
                self._reasons.pop(tid, None)
        left = self._tenant_jobs[rec.tenant] - 1
        if left:
            self._tenant_jobs[rec.tenant] = left
        else:
            del self._tenant_jobs[rec.tenant]
        state = job_state_of(rec.states, rec.job.min_member, rec.cancelled)
        # A finished job's retries have come (or were cancelled): told as what happened.
        history = "\n".join(filter(None, (rec.disruption, rec.failure, rec.note)))
        history = retries_told_as_past(history, rec.states)
        self._retain(FinishedJob(rec.job, state, tuple(rec.states), history, retries, reasons))

    def _retain(self, done: FinishedJob) -> None:
        finished = self._finished
        finished[done.job.id] = done
        while len(finished) > self.finished_retention:
            oldest = next(iter(finished))
            job = finished.pop(oldest).job
            if job.submission_id and self._submissions.get(job.submission_id) == oldest:
                del self._submissions[job.submission_id]

    def _requeue_if_idle(self, rec: JobRecord) -> None:
        if rec.where is IDLE and rec.n_pending and not rec.cancelled:
            self._wait_or_enqueue(rec, self.clock())

    def _enqueue(self, rec: JobRecord) -> None:
        rec.where = QUEUED
        self._queues[rec.qi].push(rec)
        self._waiting += 1
        self._deadlines.waits_again(rec.job_id)

    @staticmethod
    def _not_started(rec: JobRecord) -> bool:
        """Whether a deadline may still cancel the job: tasks to place, none holding resources."""
        return bool(rec.n_pending) and not rec.n_held and not rec.cancelled

    def _end_missed(self, now: float) -> None:
        """Cancel the jobs that could no longer end by their deadline and have not started, with
        one store write for them all. One that holds resources or has a unit in flight is looked
        at again when it waits again or stops holding any (_enqueue, _park, _unpark, _apply)."""
        jobs = self._jobs
        updates: Updates = []
        ended: list[str] = []
        for job_id in self._deadlines.due(now):
            rec = jobs.get(job_id)
            if rec is None or rec.cancelled or too_late(rec.job, now) is None:
                continue  # ended, or an id used again by a job it does not concern
            if rec.where is INFLIGHT or rec.n_held or rec.n_scheduled:
                self._deadlines.keep_late(job_id)
            elif rec.n_pending:
                self._cancel_record(rec, missed_note(rec.job), updates)
                ended.append(job_id)
        if ended:
            log.info(
                "cancelled %d job(s) that could no longer end by their deadline: %s", len(ended), _some(ended)
            )
            self._deadline_cancels += ended
        if self.store is not None and updates:
            self.store.set_task_states(updates)

    def take_deadline_cancels(self) -> list[str]:
        """The jobs a deadline cancelled since the last call, for the binder's note_cancelled: none
        had a unit in flight, but a lost shard's commit may still reach the binder after its units
        were taken back (requeue_in_flight)."""
        out, self._deadline_cancels = self._deadline_cancels, []
        return out

    def _park(self, rec: JobRecord, now: float, delay: float) -> None:
        self._park_seq += 1
        rec.where = PARKED
        rec.failed_backoff = False
        rec.parked_at = now
        rec.ready_at = now + delay
        rec.park_epoch = rec.trust_epoch  # what the verdict can be trusted to have seen
        rec.park_token = self._park_seq
        heapq.heappush(self._parked, (rec.ready_at, self._park_seq, rec))
        self._waiting += 1
        self._backing_off += 1
        self._deadlines.waits_again(rec.job_id)

    def _release_parked(self, now: float) -> None:
        """Queue the parked jobs whose backoff is over if the cluster changed since; the others
        go dormant until it does (or until their periodic retry)."""
        parked, dormant = self._parked, self._dormant
        max_wait = self.settings.unschedulable_retry_s
        while parked and parked[0][0] <= now:
            _, token, rec = heapq.heappop(parked)
            if rec.park_token != token or rec.where is not PARKED:
                continue
            self._backing_off -= 1
            retry_at = rec.parked_at + max_wait
            if rec.park_epoch != self._epoch or retry_at <= now:
                self._unpark(rec)
            else:
                rec.where = DORMANT
                rec.ready_at = retry_at
                heapq.heappush(dormant, (retry_at, token, rec))
        while dormant and dormant[0][0] <= now:
            _, token, rec = heapq.heappop(dormant)
            if rec.park_token == token and rec.where is DORMANT:
                self._unpark(rec)

    def _unpark(self, rec: JobRecord) -> None:
        # Never before a failed task's backoff ends: _back_off_failed parked it until then.
        rec.where = QUEUED
        self._queues[rec.qi].push(rec)
        self._deadlines.waits_again(rec.job_id)

    def notify_cluster_changed(self) -> None:
        """Something may have made room (nodes, capacity, releases): retry the dormant jobs, and
        let the ones still backing off retry as soon as their backoff ends."""
        self._epoch += 1
        if self._dormant:
            for _, token, rec in self._dormant:
                if rec.park_token == token and rec.where is DORMANT:
                    self._unpark(rec)
            self._dormant.clear()

    def _ensure_shards(self, n: int) -> None:
        while len(self._shard_load) < n:
            self._shard_load.append(0)
            self._shard_epoch.append(self._epoch)
            self._shard_refused.append((False, False))
            self._inflight_by_shard.append({})

    # -- restart -----------------------------------------------------------------------------------------
    def restore(self) -> int:
        """Reload jobs from the store after a restart. Pending and scheduled tasks become pending and
        are queued again; bound and running ones count in usage. Returns the jobs restored; active
        jobs of queues no longer configured are listed in skipped_on_restore and kept apart: shown
        (explain says why they wait) and cancellable, never scheduled."""
        if self.store is None:
            return 0
        # In the store's order, which is submission order (JobStore.load_jobs): the sequence numbers
        # given here keep FIFO order (and every policy's tie-break) as it was before the restart. Not
        # by submit_time: a client may give a past one, and policies that read it (priority aging,
        # deadlines) read it from the job, not from this order.
        # The failure marks are settled first (load_retried writes): the jobs read next then agree
        # with the counts, should a binder still running move a task on meanwhile.
        retried = self.store.load_retried()
        # Finished jobs past the retention are left in the store unread, as _retain would drop them.
        loaded = self.store.load_jobs(keep_finished=self.finished_retention)
        failures = self.store.load_failures()  # what explain said of a task failure, before
        task_reasons = self.store.load_task_reasons()
        now = self.clock()
        backoffs = self.store.load_retry_at(now)  # failed tasks' backoffs still to wait out
        missed: list[str] = []  # not started, and could no longer end by their deadline
        updates: Updates = []
        restored = 0
        skipped_queues: set[str] = set()
        for job, rows in loaded:
            if job.id in self:
                continue
            states = [PENDING] * job.total_replicas
            for index, state, _node, _gpus in rows:
                if state is SCHEDULED or state is PREEMPTED:
                    updates.append((task_id(job.id, index), PENDING))
                    state = PENDING
                states[index] = state
            if job.queue not in self._queue_index and not all(s in TERMINAL for s in states):
                self.skipped_on_restore.append(job.id)
                skipped_queues.add(job.queue)
                used = _per_task(job, retried, 0) if job.max_retries else ()
                why = _per_task(job, task_reasons, "") if job.id in failures else ()
                so_far, note = job_state_of(states, job.min_member, False), failures.get(job.id, "")
                self._unqueued[job.id] = FinishedJob(job, so_far, tuple(states), note, used, why)
                if FAILED in states:  # a gang failed before the restart told the dispatcher
                    self._abort_unqueued_gang(job.id, states.index(FAILED))
                continue
            if all(s in TERMINAL for s in states):
                if job.submission_id:
                    self._submissions[job.submission_id] = job.id
                cancelled = CANCELLED in states
                ended = job_state_of(states, job.min_member, cancelled)
                used = _per_task(job, retried, 0) if job.max_retries else ()
                why = _per_task(job, task_reasons, "") if job.id in failures else ()
                self._retain(FinishedJob(job, ended, tuple(states), failures.get(job.id, ""), used, why))
                restored += 1
                continue
            self._seq += 1
            rec = JobRecord(self._group_interner.intern(job), self._seq, self._queue_index[job.queue], states)
            rec.cancelled = CANCELLED in states
            rec.failure = failures.get(job.id, "")
            self._jobs[job.id] = rec
            if self._shedding.any_enabled:
                self._shedding.admit((rec,))
            if job.max_retries:
                for tid in job.task_ids():
                    if tid in retried:
                        self._retried[tid] = retried[tid]
            if job.id in failures:  # a task of it failed: its reasons, per task
                for tid in job.task_ids():
                    if tid in task_reasons:
                        self._reasons[tid] = task_reasons[tid]
            self._tenant_jobs[rec.tenant] = self._tenant_jobs.get(rec.tenant, 0) + 1
            if job.submission_id:
                self._submissions[job.submission_id] = job.id
            if rec.n_held:
                idx = tuple(i for i, s in enumerate(states) if s in HOLDS_RESOURCES)
                self.usage.add_held(rec.queue, rec.tenant, *rec.cost_of(idx))
            rec.retry_at = backoffs.get(job.id, 0.0)
            if job.deadline is not None and self.settings.end_missed_deadlines:
                self._deadlines.watch(job, rec.seq)  # one already past it: cancelled at the next round
                if self._not_started(rec) and too_late(job, now):
                    missed.append(job.id)
            if rec.n_pending and not rec.cancelled:
                self._wait_or_enqueue(rec, now)
            restored += 1
            if not rec.cancelled and gang_failed(states, job.min_member):
                # A gang failed for good before the restart told the dispatcher (the binder had
                # stored the failure): stopped now, its held tasks for the caller (take_aborted).
                self._abort_gang(rec, states.index(FAILED), updates)
        if updates:
            self.store.set_task_states(updates)
        if missed:
            log.warning(
                "%d stored job(s) could no longer end by their deadline and are cancelled at the first "
                "round (end_missed_deadlines): %s",
                len(missed),
                _some(missed),
            )
        if skipped_queues:
            # Kept in the store, not lost: configuring the queue again brings them back.
            skipped = self.skipped_on_restore
            log.warning(
                "%d stored job(s) of queue(s) no longer configured (%s) are kept but not scheduled: %s",
                len(skipped),
                ", ".join(sorted(skipped_queues)),
                _some(skipped),
            )
        return restored

    # -- capacity -------------------------------------------------------------------------------------------
    def set_cluster_capacity(self, cpu_milli: int, memory: int, gpu_milli: int) -> None:
        """The cluster total that shares, guarantees and max_share are measured against."""
        self.usage.set_capacity(cpu_milli, memory, gpu_milli)
        self.notify_cluster_changed()

    def queue_shares(self) -> dict[str, float]:
        """Dominant share of each queue (held + in flight)."""
        return {n: self.usage.queue_share(n) for n in self.capacity.names}

    # -- queries --------------------------------------------------------------------------------------------
    def _kept(self, job_id: str) -> FinishedJob:
        """The record of a job with no JobRecord: finished, or of a queue no longer configured."""
        kept = self._unqueued.get(job_id)
        return self._finished[job_id] if kept is None else kept

    def job_state(self, job_id: str) -> JobState:
        rec = self._jobs.get(job_id)
        if rec is None:
            return self._kept(job_id).state
        return job_state_of(rec.states, rec.job.min_member, rec.cancelled)

    def task_states(self, job_id: str) -> list[TaskState]:
        rec = self._jobs.get(job_id)
        return list(self._kept(job_id).states if rec is None else rec.states)

    def job(self, job_id: str) -> Job:
        rec = self._jobs.get(job_id)
        return self._kept(job_id).job if rec is None else rec.job

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs or job_id in self._finished or job_id in self._unqueued

    def job_ids(self) -> list[str]:
        """Every job known (active, of a queue no longer configured, and finished ones still
        retained), oldest submission first."""
        ids = [*self._jobs, *self._unqueued, *(j for j in self._finished if j not in self._jobs)]
        return sorted(ids, key=lambda j: self.job(j).submit_time)

    def snapshots(self, job_ids: Sequence[str]) -> list[JobSnapshot | None]:
        """Each job's spec, state, task states and retries used (None: unknown); placements are
        the binder's."""
        out: list[JobSnapshot | None] = []
        for j in job_ids:
            if j not in self:
                out.append(None)
                continue
            rec = self._jobs.get(j)
            if rec is None:
                kept = self._kept(j)
                retries, reasons = kept.retries, kept.reasons
            else:
                retries, reasons = self.retries_of(rec.job), self.reasons_of(rec.job)
            states = tuple(self.task_states(j))
            out.append(JobSnapshot(self.job(j), self.job_state(j), states, retries=retries, reasons=reasons))
        return out

    def reasons_of(self, job: Job) -> tuple[str, ...]:
        """Per task of a job not finished, why its latest failure failed ("" none); () for none."""
        return _per_task(job, self._reasons, "")

    def retries_of(self, job: Job) -> tuple[int, ...]:
        """Per task of a job not finished, its failures run again so far; () for none."""
        return _per_task(job, self._retried, 0) if job.max_retries else ()

    def pending_task_count(self) -> int:
        """Tasks waiting to be placed, over every active job."""
        return sum(rec.n_pending for rec in self._jobs.values())

    def active_count(self) -> int:
        """Jobs with a task not yet ended (their full records are in memory)."""
        return len(self._jobs)

    def pending_count(self) -> int:
        """Jobs waiting for dispatch: queued, backing off, or dormant (waiting for room)."""
        return self._waiting

    def waiting_count(self) -> int:
        """Jobs in their retry backoff that waiting alone makes worth retrying: the cluster has
        changed since the view their verdict was taken on. The others go dormant when their
        backoff ends; only a change, or the periodic retry of a verdict on the same cluster, brings
        them back. So with none of these, nothing in flight and nothing queued, the dispatcher is
        idle even if jobs that fit nowhere remain (an overfilled cluster)."""
        if not self._backing_off:
            return 0
        epoch = self._epoch
        return sum(
            1
            for _, token, rec in self._parked
            if rec.park_token == token and rec.where is PARKED and rec.park_epoch != epoch
        )

    def in_flight_count(self) -> int:
        """Units dispatched to shards and not yet answered."""
        return self._inflight

    def shard_loads(self) -> list[int]:
        """Units in flight per shard."""
        return self._shard_load[: self.partitions.shards]

    def explain(self, job_id: str) -> str:
        """Why the job is where it is: state, tasks, retry timing, last diagnosis or rejection."""
        rec = self._jobs.get(job_id)
        if rec is None:
            kept = self._unqueued.get(job_id)
            if kept is not None:
                unqueued = (
                    f"queue {kept.job.queue} is not configured: kept, not scheduled "
                    "(configure it again, or cancel the job)"
                )
                return "\n".join(
                    filter(None, (_summary(kept.job, kept.state, kept.states), kept.note, unqueued))
                )
            done = self._finished[job_id]
            head = _summary(done.job, done.state, done.states)
            return f"{head} (finished)" + (f"\n{done.note}" if done.note else "")
        lines = [_summary(rec.job, self.job_state(job_id), rec.states)]
        capacity = self._capacity_note(rec) if rec.where in (QUEUED, PARKED, DORMANT) else ""
        # Set aside at its every turn (next_batch_rows): no shard tried it, and queued it is not
        # waiting for one. The capacity line below says why.
        aside = capacity.startswith(CANNOT_RUN_IN_QUEUE)
        if rec.where is PARKED and rec.failed_backoff:
            wait = max(0.0, rec.ready_at - self.clock())
            lines.append(f"backing off after a task failed; queued again in {wait:.3f}s")
        elif aside and rec.where is PARKED:
            wait = max(0.0, rec.ready_at - self.clock())
            lines.append(f"set aside: it cannot run in its queue (below); looked at again in {wait:.3f}s")
        elif aside and rec.where is DORMANT:
            wait = max(0.0, rec.ready_at - self.clock())
            lines.append(
                "set aside: it cannot run in its queue (below); looked at again when the cluster "
                f"changes, or in {wait:.3f}s"
            )
        elif aside:
            lines.append("not sent to a shard: it cannot run in its queue (below), so its turn sets it aside")
        elif rec.where is PARKED:
            wait = max(0.0, rec.ready_at - self.clock())
            lines.append(f"backing off after {rec.failures} unschedulable attempt(s); retry in {wait:.3f}s")
        elif rec.where is DORMANT:
            wait = max(0.0, rec.ready_at - self.clock())
            lines.append(
                f"unschedulable ({rec.failures} attempt(s)); waiting for the cluster to change, "
                f"or a periodic retry in {wait:.3f}s"
            )
        elif rec.where is INFLIGHT:
            lines.append(f"attempt {rec.attempt} in flight at shard {rec.shard}")
        elif rec.where is QUEUED:
            lines.append(f"queued, {rec.dispatches} attempt(s) so far")
        if rec.where in (QUEUED, PARKED, DORMANT):
            if capacity:
                lines.append(capacity)
            reservation = self._reservations.note(rec, self.clock(), self._jobs, self._queues[rec.qi])
            if reservation:
                lines.append(reservation)
        deadline = rec.job.deadline
        if deadline is not None and not self.settings.end_missed_deadlines and deadline < self.clock():
            late = self.clock() - deadline
            lines.append(f"past its deadline by {late:.0f}s (deadlines order the queue; nothing is stopped)")
        elif deadline is not None and self.settings.end_missed_deadlines and self._not_started(rec):
            lines.append(start_by_note(rec.job, self.clock()))
        if rec.disruption:
            lines.append(rec.disruption)
        if rec.failure:
            lines.append(rec.failure)
        if rec.note:
            lines.append(rec.note)
        if rec.diagnosis is not None:
            lines.append(f"last unschedulable: {rec.diagnosis.message()}")
        return "\n".join(lines)

    def _capacity_note(self, rec: JobRecord) -> str:
        idx = rec.pending_indexes()
        if not self.usage.has_capacity or not self.capacity.capped[rec.qi] or not idx:
            return ""
        cap = f"max_share {self.capacity.max_shares[rec.qi]:.0%}"
        need = min(self._need(rec), len(idx))
        if self._never_fits(rec, idx):
            alone = self._smallest_unit_share(rec, idx)
            return (
                f"{CANNOT_RUN_IN_QUEUE} {rec.queue}: its smallest unit ({need} task(s), with the gang's "
                f"bound ones) needs {alone:.1%} of the cluster, above the queue's {cap}; skipped, "
                "so that the jobs behind it are not held back"
            )
        share = self.usage.queue_share(rec.queue)
        after = self.usage.queue_share_after(rec.queue, *rec.cost_of(idx[:need]))
        if not self.capacity.fits(rec.qi, after):
            note = (
                f"held back by capacity: queue {rec.queue} is at {share:.1%} of the cluster and this "
                f"job's next {need} task(s) would take it to {after:.1%}, above its {cap}"
            )
            why = self._shedding.why[rec.qi] if self._shedding.enabled[rec.qi] else ""
            if why and self._held_back[rec.qi] == rec.job_id:
                note += f"; no within-queue preemption: {why}"
            return note
        head = self._jobs.get(self._held_back[rec.qi])
        if head is not None and head is not rec and head.where is QUEUED and rec.where is QUEUED:
            return (
                f"queued behind job {head.job_id}, which waits for queue {rec.queue}'s usage to fall "
                f"within its {cap}"
            )
        return ""


CANNOT_RUN_IN_QUEUE = "cannot run in queue"  # the capacity note of a job set aside (_capacity_note)


def _summary(job: Job, state: JobState, states: Sequence[TaskState]) -> str:
    counts: dict[str, int] = {}
    for s in states:
        counts[s.value] = counts.get(s.value, 0) + 1
    tasks = ", ".join(f"{n} {st}" for st, n in counts.items())
    return f"job {job.id} (queue {job.queue}, tenant {job.tenant}): {state.value}; tasks: {tasks}"


def _refused_in_part(attempt: int, refusals: Sequence[RejectedUnit]) -> str:
    """The note of a unit the binder bound in part and refused in part (one stage or more)."""
    said = "; ".join(
        f"task(s) {', '.join(map(str, r.task_indexes))} ({r.stage}): {r.reason}" for r in refusals
    )
    return f"attempt {attempt} rejected in part by the binder, retried at once: {said}"


V = TypeVar("V")


def _per_task(job: Job, values: Mapping[str, V], default: V) -> tuple[V, ...]:
    """`values` (by task id) for each of the job's tasks, `default` for those without; () when
    none has one (the snapshots' and finished records' "nothing to tell")."""
    if not values:
        return ()
    found = tuple(values.get(tid, default) for tid in job.task_ids())
    return found if any(found) else ()


def backoff_delay(base: float, cap: float, failures: int) -> float:
    """The wait after `failures` consecutive unschedulable attempts, or retries of a failed
    task (0 for none): base, doubling per one more, at most cap."""
    if failures <= 0:
        return 0.0
    return min(cap, base * math.pow(2.0, min(failures - 1, 62)))


def same_request(job: Job, first: Job) -> bool:
    """`job` repeats the request that submitted `first`: the same spec (its deadline included: a
    deadline is a moment, the same in every retry), whenever each was stamped, and the same id
    unless `job` named none (its id is the one generated for its submission id: a retry need not
    repeat a generated id)."""
    named = job.id != generated_job_id(job.submission_id)
    job_id = job.id if named else first.id
    return replace(job, id=job_id, submit_time=first.submit_time) == first


def _only_target(loads: Sequence[int], limit: int, per_shard_cap: int) -> int:
    """The shard that next_batches' least-loaded choice gives all `limit` units to, or -1: the
    least loaded by more than `limit` (no tie, no catching up), `limit` within its batch cap."""
    if limit > per_shard_cap or not loads:
        return -1
    least = min(loads)
    s = loads.index(least)
    if len(loads) == 1:
        return s
    others = min(load for i, load in enumerate(loads) if i != s)
    return s if others > least + limit else -1


def _add_cost(
    sums: dict[tuple[str, str], list[int]], key: tuple[str, str], cpu: int, mem: int, gpu: int
) -> None:
    """Add a cost (cpu, memory, gpu) to the sums kept per (queue, tenant)."""
    row = sums.get(key)
    if row is None:
        sums[key] = [cpu, mem, gpu]
    else:
        row[0] += cpu
        row[1] += mem
        row[2] += gpu


def _fits(cpu: int, mem: int, gpu: int, free: list[int]) -> bool:
    """Whether the amounts fit in `free` (cpu, memory, gpu), leaving out those not asked for. Spelt
    out: it runs per unit with several shards, where a generator over the three costs ~5x."""
    return (not cpu or cpu <= free[0]) and (not mem or mem <= free[1]) and (not gpu or gpu <= free[2])


# Job's field positions, for restamped.
_JOB_FIELDS = [f.name for f in fields(Job)]
_GROUPS_AT, _TIME_AT = _JOB_FIELDS.index("groups"), _JOB_FIELDS.index("submit_time")
_ID, _QUEUE, _TENANT = attrgetter("id"), attrgetter("queue"), attrgetter("tenant")
_SUBMISSION = attrgetter("submission_id")


def _some(job_ids: Sequence[str]) -> str:
    """The first ten of `job_ids` for a log line, and how many more."""
    more = f" and {len(job_ids) - 10} more" if len(job_ids) > 10 else ""
    return ", ".join(job_ids[:10]) + more


def restamped_rows(
    jobs: list[Job], groups: list[tuple[TaskGroup, ...]], now: float
) -> tuple[list[Job], list[tuple[Any, ...]] | None]:
    """Copies of `jobs` submitted at `now`, each with its groups from `groups`, and the rows of field
    values they were made from (None for jobs of a subclass), which their records keep
    (JobRecord.job_row). Every job's fields are read with one
    C map and the copies made with one C starmap (fast_pickle's rows_of and objects_from): a third
    less than `replaced` per job, which a submission pays for every job."""
    rows = rows_of(Job, jobs)
    if rows is None:  # some are of a subclass of Job, with fields of their own
        return [replaced(j, submit_time=now, groups=g) for j, g in zip(jobs, groups, strict=True)], None
    g_at, t_at = _GROUPS_AT, _TIME_AT
    rows = [
        (*row[:g_at], g, *row[g_at + 1 : t_at], now, *row[t_at + 1 :])
        for row, g in zip(rows, groups, strict=True)
    ]
    return objects_from(Job, rows), rows
