"""The Binder: the single writer of the truth (a Nomad-style plan applier).

Shards propose placements from cached views; the binder checks each proposal against the
authoritative arrays with named stages (binder/stages.py), applies what passes (evict victims,
confirm they are gone, then bind), persists the whole batch in one store transaction, and answers
with the changes since the shard's last view (binder/changelog.py).

    Binder(store, *, clock=time.time, stages=DEFAULT_STAGES, vectorised=True, max_log_entries=1_000_000,
           writer=None, standing=None)
    .commit(batch: ProposalBatch, *, with_changes=True, rows_only=False) -> BindReply
    .add_nodes(nodes) -> int            .set_node_state(name, state) -> int
    .remove_node(name) -> list[str]     .release(task_ids, reason) -> list[str]
    .changes_since(version) -> (changes, version, resync)    .snapshot() -> list[Change]
    .version  .state (ClusterArrays)  .snapshot_nodes()  .resident(task_id)  .view()

Versions: one per change entry; a call that changes nothing (e.g. a batch whose proposals are
all rejected) does not bump the version.

With a `writer` (binder/writer.py), commit() hands its batch to the writer process and returns
before it is durable: the caller must let nothing but the shards hear of it before then
(writer.after_durable, writer.drain). Every other write first waits for the writer to be done,
so that the store sees all writes in the order the binder made them.
"""

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any

import numpy as np

from gosched.binder.changelog import DEFAULT_MAX_ENTRIES, ChangeLog
from gosched.binder.fastpath import NO_CLEAN, CleanSet, UsualBatch, find_clean, usual_batch
from gosched.binder.stages import (
    ACROSS_NODES,
    DEFAULT_STAGES,
    BatchScope,
    Candidate,
    Stage,
    UnitCheck,
    candidates_of,
    gang_need,
)
from gosched.binder.state import BinderState, make_resident, validate_node
from gosched.binder.writer import StoreWriter
from gosched.common.cluster_state import I64, NO_VICTIM, ClusterArrays, Resident
from gosched.common.disruptions import DOWN, DOWN_REASONS
from gosched.common.job import Job, split_task_id
from gosched.common.messages import (
    AcceptedUnit,
    BindReply,
    Change,
    Eviction,
    NodeRemoved,
    NodeUpserted,
    Proposal,
    ProposalBatch,
    ProposalColumns,
    RejectedUnit,
    TaskBound,
    TaskReleased,
    TaskUp,
)
from gosched.common.node import Node, NodeState
from gosched.common.states import TaskState
from gosched.common.store import Store

log = logging.getLogger(__name__)

# Versions below 2**40 are one incarnation's (next_epoch): a million changes a second for 12 days.
EPOCH_BITS = 40

Gpus = tuple[tuple[int, int], ...]

_TASK_INDEX = attrgetter("task_index")

# TaskReleased reason -> the state the task is stored in.
RELEASE_STATES: dict[str, TaskState] = {
    "succeeded": TaskState.SUCCEEDED,
    "failed": TaskState.FAILED,
    "cancelled": TaskState.CANCELLED,
    "preempted": TaskState.PREEMPTED,
    "lost": TaskState.PENDING,  # its node is gone: it goes back to the queue
}


@dataclass(slots=True)
class _Outcome:
    """What one proposal came to, before it is merged into the batch's reply."""

    accepted: AcceptedUnit | None = None
    rejected: list[RejectedUnit] = field(default_factory=list)
    evicted: list[Eviction] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)


@dataclass(slots=True)
class BoundRows:
    """A commit's changes when all of them are the fast path's bindings (the usual batch): those
    after version `start`, as each TaskBound's node and its resident's field values in order (what
    fast_pickle.rows_of reads), gathered while the records were made; and its verdicts likewise.
    runtime/packed_changes.py and the binder actor pack them without reading every record back
    (messages.TaskBoundRows, messages.BindReplyRows)."""

    start: int
    nodes: list[str]
    rows: list[tuple[Any, ...]]
    # The reply's AcceptedUnits as their field values in order (fast_pickle.rows_of), likewise.
    accepted: list[tuple[Any, ...]]

    @property
    def end(self) -> int:
        return self.start + len(self.rows)


@dataclass(slots=True)
class _Writes:
    """Task rows to persist, the latest write per task winning (order kept)."""

    rows: dict[str, tuple[str, Gpus] | TaskState] = field(default_factory=dict)
    # Bindings of the fast path's clean proposals: no other write of the batch names their tasks.
    clean_binds: list[tuple[str, str, Gpus]] = field(default_factory=list)

    def bind(self, tid: str, node: str, gpus: Gpus) -> None:
        self.rows.pop(tid, None)
        self.rows[tid] = (node, gpus)

    def state(self, tid: str, state: TaskState) -> None:
        self.rows.pop(tid, None)
        self.rows[tid] = state

    def split(self) -> tuple[list[tuple[str, str, Gpus]], list[tuple[str, TaskState]]]:
        if not self.rows:  # only the fast path's bindings (the usual batch): no copy
            return self.clean_binds, []
        bound: list[tuple[str, str, Gpus]] = list(self.clean_binds)
        states: list[tuple[str, TaskState]] = []
        for tid, w in self.rows.items():
            if isinstance(w, TaskState):
                states.append((tid, w))
            else:
                bound.append((tid, w[0], w[1]))
        return bound, states


class Binder:
    """Applies shards' proposals to the authoritative cluster state; recovers it from `store`."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], float] = time.time,
        stages: Sequence[Stage] = DEFAULT_STAGES,
        vectorised: bool = True,
        max_log_entries: int = DEFAULT_MAX_ENTRIES,
        writer: StoreWriter | None = None,
        standing: Callable[[Job, float], int | None] | None = None,
    ) -> None:
        """`standing`: the Unit.standing of a task recovered from the store, from its job and
        bound_at (common.aging.StandingRule of the queues): no column keeps it."""
        self.store = store
        self._standing = standing
        self.writer = writer
        self.clock = clock
        self.stages = tuple(stages)
        # The stages that count a unit's victims as gone beyond their own node (see _commit_unit).
        self._across_nodes = tuple(stage for stage in self.stages if stage.name in ACROSS_NODES)
        self.vectorised = vectorised
        self.truth = BinderState()
        self._broken: BaseException | None = None
        stored = self.store.load_version()
        base = next_epoch(stored)
        if base != stored:
            self.store.set_version(base)  # a restart before any change still starts a new epoch
        self._recover(base)
        self.log = ChangeLog(base=base, max_entries=max_log_entries)
        # The last commit's bindings as rows, when they were all its changes (see BoundRows).
        self.last_bound: BoundRows | None = None

    # -- recovery -----------------------------------------------------------------------------------
    def _recover(self, base: int) -> None:
        # Proposals planned on an earlier incarnation's view are refused on every node
        # (NodeCurrent): this one knows nothing of what that one had in memory only.
        for node in self.store.load_nodes():
            self.truth.upsert_node(node, 0)
        self.truth.mark_all(base)
        row_of = self.truth.arrays.row_of
        for bt in self.store.load_bound():
            row = row_of.get(bt.node)
            if row is None:
                log.warning(
                    "task %s/%d is bound to unknown node %s: not recovered", bt.job.id, bt.idx, bt.node
                )
                continue
            standing = None if self._standing is None else self._standing(bt.job, bt.bound_at)
            self.truth.place(row, make_resident(bt.job, bt.idx, bt.gpus, bt.bound_at, standing))
        for job_id, tid in self.store.load_down():
            self.truth.arrays.down_tasks.add(job_id, tid)
        self.truth.compact()

    # -- reading ------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self.log.version

    @property
    def state(self) -> ClusterArrays:
        """The authoritative arrays: read them; change them only through the Binder."""
        return self.truth.arrays

    @property
    def arrays(self) -> ClusterArrays:
        return self.truth.arrays

    def snapshot_nodes(self) -> list[Node]:
        """Every live node, in row order."""
        return [node for node in self.truth.arrays.nodes if node is not None]

    def snapshot(self) -> list[Change]:
        """The whole state as changes: NodeUpserted per live node, then TaskBound per resident."""
        return self.truth.snapshot()

    def changes_since(self, version: int) -> tuple[list[Change], int, bool]:
        """(changes after `version`, current version, resync). resync=True: `version` is older than
        the log keeps (or newer than it has reached) and the changes are a full snapshot."""
        changes = self.log.since(version)
        if changes is None:
            return self.snapshot(), self.log.version, True
        return changes, self.log.version, False

    def view(self) -> dict[str, dict[str, object]]:
        """Per node name: usage, GPU frees and residents (to compare two binders)."""
        return self.truth.view()

    def resident(self, tid: str) -> tuple[str, Resident] | None:
        got = self.truth.resident(tid)
        return None if got is None else (self.truth.node_name(got[0]), got[1])

    # -- nodes --------------------------------------------------------------------------------------
    def add_nodes(self, nodes: Sequence[Node]) -> int:
        """Register or update nodes; returns the new version."""
        self._writable()
        for node in nodes:
            validate_node(node)
        if not nodes:
            return self.version
        changes: list[Change] = [NodeUpserted(n) for n in nodes]
        self.store.upsert_nodes(nodes, version=self.version + len(changes))  # then the arrays
        for version, node in enumerate(nodes, self.version + 1):  # each NodeUpserted's version
            self.truth.upsert_node(node, version)
        return self._publish(changes)

    def set_node_state(self, name: str, state: NodeState) -> int:
        """Mark a node ready / not ready / cordoned / draining (residents stay); returns the version."""
        self._writable()
        row = self.truth.arrays.row_of.get(name)
        if row is None:
            raise KeyError(f"unknown node {name}")
        old = self.truth.arrays.nodes[row]
        assert old is not None
        node = Node(
            old.name, old.cpu_milli, old.memory, old.gpus, old.labels, old.taints, old.extended, state
        )
        self.store.upsert_nodes([node], version=self.version + 1)  # then the arrays
        self.truth.upsert_node(node, self.version + 1)
        return self._publish([NodeUpserted(node)])

    def remove_node(self, name: str) -> list[str]:
        """Remove a node. Its residents are released as "lost" (stored as pending) and, where that
        leaves a gang below its min_member, the gang's other residents are evicted ("preempted",
        preemptor ""). Returns every task id released this way, for the caller to requeue."""
        self._writable()
        if name not in self.truth.arrays.row_of:
            raise KeyError(f"unknown node {name}")
        lost = self.truth.remove_node(name)
        lost.sort(key=lambda r: split_task_id(r.task_id))
        changes: list[Change] = [TaskReleased(r.task_id, "lost") for r in lost]
        changes += _down_notes(lost)
        changes.append(NodeRemoved(name))
        writes = _Writes()
        for r in lost:
            writes.state(r.task_id, TaskState.PENDING)
        broken = self._gang_break({r.job_id: r.min_member for r in lost}, "", changes, writes, BatchScope())
        _, states = writes.split()
        self._guarded(
            lambda: self.store.remove_node(name, version=self.version + len(changes), state_changes=states)
        )
        self._publish(changes)
        return [r.task_id for r in lost] + [e.task_id for e in broken]

    # -- releases -----------------------------------------------------------------------------------
    def cancel_job(self, job_id: str, holding: Iterable[str]) -> list[str]:
        """A job was cancelled: refuse its proposals still in flight (they may name victims, whose
        eviction would be for nothing) and release its tasks in `holding`."""
        self._usable()
        self.truth.note_cancelled(job_id)
        released = self.release(holding, TaskState.CANCELLED.value)
        self._end_down([job_id])
        return released

    def note_cancelled(self, job_ids: Iterable[str]) -> None:
        """Jobs cancelled while none of their units was in flight (a missed deadline): refuse a
        proposal of theirs that still comes, from a shard lost meanwhile."""
        ids = list(job_ids)
        for job_id in ids:
            self.truth.note_cancelled(job_id)
        self._end_down(ids)

    def _end_down(self, job_ids: Sequence[str]) -> None:
        """The tasks down of these cancelled jobs will not come back: their budgets count them no
        more, here and (through a "cancelled" release of each) in the shards' views."""
        down = self.truth.arrays.down_tasks
        if not down:
            return
        ended = [tid for job_id in job_ids for tid in down.of_job(job_id)]
        if not ended:
            return
        self._writable()
        down.discard_many(ended)
        changes: list[Change] = [TaskReleased(tid, TaskState.CANCELLED.value) for tid in ended]
        self._guarded(lambda: self.store.set_version(self.version + len(changes)))
        self._publish(changes)

    def started(self, task_ids: Iterable[str]) -> bool:
        """Tasks whose process started on their node (bound -> running at the dispatcher): those
        down through a disruption are up again, as Kubernetes counts a pod available once it is
        ready, not once it is scheduled. True if one was: a preemption its job's budget refused
        may now go ahead. Nothing is stored: the store tells a running task from one bound again
        and not yet started (Store.load_down)."""
        down = self.truth.arrays.down_tasks
        if not down:
            return False
        held = self.truth.arrays.task_row
        up = [tid for tid in dict.fromkeys(task_ids) if tid in down and tid in held]
        if not up:
            return False
        self._writable()
        down.discard_many(up)
        changes: list[Change] = [TaskUp(tid) for tid in up]
        self._guarded(lambda: self.store.set_version(self.version + len(changes)))
        self._publish(changes)
        return True

    def release(
        self, task_ids: Iterable[str], reason: str, why: Mapping[str, str] | None = None
    ) -> list[str]:
        """Free the resources of tasks that ended (succeeded / failed / cancelled / preempted...);
        `why` by task id: why a failed one failed (its agent's words), stored with its end.

        Tasks not bound here are skipped. Returns the task ids released."""
        self._writable()
        state = RELEASE_STATES.get(reason)
        if state is None:
            raise ValueError(f"unknown release reason {reason!r} (one of {', '.join(RELEASE_STATES)})")
        released: list[str] = []
        ended_down: list[str] = []  # not bound, but down: a terminal end takes it off the count
        down = reason in DOWN_REASONS
        down_tasks = self.truth.arrays.down_tasks
        gone: list[Resident] = []
        for tid in dict.fromkeys(task_ids):
            got = self.truth.release(tid, down=down)
            if got is not None:
                released.append(tid)
                gone.append(got[1])
            elif not down and down_tasks and tid in down_tasks:
                ended_down.append(tid)
        if ended_down:  # as _end_down: the shards hear of it as this release
            down_tasks.discard_many(ended_down)
            self._guarded(lambda: self.store.set_version(self.version + len(ended_down)))
            self._publish([TaskReleased(tid, reason) for tid in ended_down])
        if not released:
            return []
        changes: list[Change] = [TaskReleased(tid, reason) for tid in released]
        if down:
            changes += _down_notes(gone)
        now = self.clock()
        told = {t: why[t] for t in released if t in why} if why else None
        self._guarded(
            lambda: self.store.commit(
                self.version + len(changes), [], [(t, state) for t in released], now=now, reasons=told
            )
        )
        self._publish(changes)
        return released

    def lose(self, task_ids: Iterable[str]) -> list[str]:
        """Tasks gone with their node or agent: released as "lost" (stored as pending, to be queued
        again) and, where that leaves a gang below its min_member, the gang's other residents are
        evicted too. Returns every task id released this way, for the caller to requeue."""
        self._writable()
        release = self.truth.release
        lost = [
            got[1] for got in (release(tid, down=True) for tid in dict.fromkeys(task_ids)) if got is not None
        ]
        if not lost:
            return []
        changes: list[Change] = [TaskReleased(r.task_id, "lost") for r in lost]
        changes += _down_notes(lost)
        writes = _Writes()
        for r in lost:
            writes.state(r.task_id, TaskState.PENDING)
        broken = self._gang_break({r.job_id: r.min_member for r in lost}, "", changes, writes, BatchScope())
        _, states = writes.split()
        now = self.clock()
        self._guarded(lambda: self.store.commit(self.version + len(changes), [], states, now=now))
        self._publish(changes)
        return [r.task_id for r in lost] + [e.task_id for e in broken]

    # -- the plan applier -----------------------------------------------------------------------------
    def commit(
        self, batch: ProposalBatch, *, with_changes: bool = True, rows_only: bool = False
    ) -> BindReply:
        """Check, apply and persist a batch of proposals; reply with the outcome and the changes
        since `batch.seen_version` (left empty with `with_changes=False`, for a caller that sends
        the changes its own way; reply.version is the binder's version either way).

        `rows_only`: when the fast path takes the whole batch (last_bound is set), leave
        reply.accepted empty, the verdicts being last_bound.accepted's rows, for a caller that
        packs those (the binder actor): no AcceptedUnit is made only to be dropped."""
        self._usable()
        now = self.clock()
        proposals = batch.proposals
        writes = _Writes()
        reply = BindReply([], [], [], [], self.version, shard_id=batch.shard_id)
        changes: list[Change] = []
        seen = batch.seen_version
        clean = find_clean(self.truth, proposals, seen) if self.vectorised and proposals else NO_CLEAN
        as_rows: BoundRows | None = None
        if len(clean) == len(proposals):
            # Every proposal is clean (the usual batch): its answers go straight into the reply.
            as_rows = BoundRows(self.version, [], [], [])
            accepted = None if rows_only else reply.accepted
            self._bind_clean(proposals, clean, now, writes, accepted, changes, as_rows)
        else:
            self._commit_mixed(proposals, clean, seen, now, writes, reply, changes)
        self.last_bound = as_rows
        if changes:
            bound, states = writes.split()
            version = self.version + len(changes)
            if self.writer is not None:
                writer = self.writer  # every job is stored at its submission: the writer needs no jobs
                self._guarded(lambda: writer.write(version, bound, states, now))
            else:
                jobs = {p.job.id: p.job for p in proposals}
                self._guarded(lambda: self.store.commit(version, bound, states, now=now, jobs=jobs))
            self._publish(changes)
        if with_changes:
            reply.changes, reply.version, reply.resync = self.changes_since(batch.seen_version)
        else:
            reply.version = self.version
        return reply

    def commit_columns(self, batch: ProposalColumns) -> BindReply | None:
        """commit(batch.batch(), with_changes=False, rows_only=True) for the usual batch (see
        fastpath.UsualBatch), read from its columns without making its objects; None, having
        changed nothing, for any other batch (or without a writer: the store is then given the
        jobs), which the caller commits as objects."""
        self._usable()
        writer = self.writer
        if not self.vectorised or writer is None:
            return None
        usual = usual_batch(self.truth, batch)
        if usual is None:
            return None
        now = self.clock()
        changes: list[Change] = []
        self.last_bound = self._bind_usual(usual, now, changes)
        version = self.version + len(changes)
        self._guarded(lambda: writer.write_plain(version, usual.task_ids, usual.nodes, now))
        self._publish(changes)
        return BindReply([], [], [], [], self.version, shard_id=batch.shard_id)

    def _bind_usual(self, usual: UsualBatch, now: float, changes: list[Change]) -> BoundRows:
        """Bind the usual batch as _bind_clean binds a batch clean throughout: the same records,
        rows and verdict rows, the job's fields read once for all (its writes go as columns:
        StoreWriter.write_plain)."""
        group = usual.group
        req = group.resources
        cpu = req.cpu_milli
        memory = req.memory
        extended = req.extended
        role = group.role
        tenant, queue, priority, min_member, preemptible, labels, budget = usual.job
        standing = usual.standing
        gpus = ()  # no placement of the usual batch names GPUs
        task_ids = usual.task_ids
        nodes = usual.nodes
        b_rows: list[tuple[Any, ...]] = []
        residents: list[Resident] = []
        job_tasks = self.truth.job_tasks
        new = object.__new__
        for tid, jid, node in zip(task_ids, usual.job_ids, nodes, strict=True):
            r = new(Resident)  # its slots written here, as _bind_clean does
            r.task_id = tid
            r.job_id = jid
            r.cpu_milli = cpu
            r.memory = memory
            r.gpus = gpus
            r.extended = extended
            r.priority = priority
            r.preemptible = preemptible
            r.queue = queue
            r.tenant = tenant
            r.start_time = now
            r.job_labels = labels
            r.role = role
            r.min_member = min_member
            r.disruption_budget = budget
            r.repels = ()
            r.standing = standing
            residents.append(r)
            held = job_tasks.get(jid)
            if held is None:
                job_tasks[jid] = {tid}
            else:
                held.add(tid)
            change = new(TaskBound)
            change.node = node
            change.resident = r
            changes.append(change)
            b_rows.append(
                (tid, jid, cpu, memory, gpus, extended, priority, preemptible, queue, tenant,
                 now, labels, role, min_member, budget, (), standing)
            )  # fmt: skip
        # The verdicts: one task index each, every tuple a new one (the memo packs shared ones once).
        accepted = list(zip(usual.job_ids, usual.attempts, zip(usual.task_indexes), repeat(now), repeat(())))
        bound = BoundRows(self.version, list(nodes), b_rows, accepted)
        offers = priority if preemptible else NO_VICTIM
        self.truth.place_clean(usual.rows, residents, usual.plain, offers, usual.row_array)
        return bound

    def _commit_mixed(
        self,
        proposals: Sequence[Proposal],
        clean: CleanSet,
        seen_version: int,
        now: float,
        writes: _Writes,
        reply: BindReply,
        changes: list[Change],
    ) -> None:
        """A batch with proposals the fast path cannot take: bind the clean ones first (they touch
        nothing the others do), run the stages over the rest in batch order, answer in batch order."""
        outcomes: list[_Outcome | None] = [None] * len(proposals)
        if clean:
            accepted: list[AcceptedUnit] = []
            bound: list[Change] = []
            self._bind_clean(proposals, clean, now, writes, accepted, bound)
            start = 0
            for i, acc in zip(clean.index, accepted, strict=True):
                end = start + len(proposals[i].placements)  # one TaskBound per placement
                outcomes[i] = _Outcome(accepted=acc, changes=bound[start:end])
                start = end
        scope = BatchScope(seen_version)
        for i, proposal in enumerate(proposals):
            if outcomes[i] is None:
                outcomes[i] = self._commit_unit(proposal, scope, writes, now)
        for out in outcomes:
            assert out is not None
            if out.accepted is not None:
                reply.accepted.append(out.accepted)
            reply.rejected.extend(out.rejected)
            reply.evicted.extend(out.evicted)
            changes.extend(out.changes)

    def _bind_clean(
        self,
        proposals: Sequence[Proposal],
        clean: CleanSet,
        now: float,
        writes: _Writes,
        accepted: list[AcceptedUnit] | None,
        changes: list[Change],
        bound: BoundRows | None = None,
    ) -> None:
        """Bind the batch's clean proposals at once (see fastpath.py): one AcceptedUnit per unit
        onto `accepted` (when given), one TaskBound per placement onto `changes`, in order; each
        TaskBound's node and resident row, and each AcceptedUnit's row, onto `bound` (when
        given; one of `accepted` and `bound` must be)."""
        residents: list[Resident] = []
        binds = writes.clean_binds
        tids = clean.tids  # in placement order, as the loop below takes them
        # The victim priority each placement offers (the rows' victim bound, place_many), as runs:
        # the first placement of each run and its value. Consecutive jobs mostly offer the same.
        run_starts: list[int] = []
        run_offers: list[int] = []
        last_offer: int | None = None
        job_tasks = self.truth.job_tasks
        b_nodes = bound.nodes if bound is not None else None
        b_rows = bound.rows if bound is not None else []
        b_accepted = bound.accepted if bound is not None else []
        k = 0
        new = object.__new__
        # A one-group job's request and role, kept for the next proposal: consecutive jobs mostly
        # share their groups (interned at submission).
        last_groups = None
        single = None
        cpu = memory = 0
        extended: tuple[tuple[str, int], ...] = ()
        role = ""
        for i in clean.index:
            p = proposals[i]
            job = p.job
            jid = job.id
            groups = job.groups
            if groups is not last_groups:
                last_groups = groups
                single = groups[0] if len(groups) == 1 else None
                if single is not None:
                    req = single.resources
                    cpu = req.cpu_milli
                    memory = req.memory
                    extended = req.extended
                    role = single.role
            standing = p.standing
            placements = p.placements
            priority = job.priority
            preemptible = job.preemptible
            queue = job.queue
            tenant = job.tenant
            labels = job.labels
            min_member = job.min_member
            budget = job.disruption_budget
            offers = priority if preemptible else NO_VICTIM
            if offers != last_offer:
                run_starts.append(k)
                run_offers.append(offers)
                last_offer = offers
            held = job_tasks.get(jid)
            for pl in placements:
                if single is None:
                    group = job.group_of(pl.task_index)
                    req = group.resources
                    cpu = req.cpu_milli
                    memory = req.memory
                    extended = req.extended
                    role = group.role
                node = pl.node
                gpus = pl.gpus
                tid = tids[k]
                k += 1
                # Resident.for_task's record, made here from what the fast path already has (the
                # task id), its slots written in this frame: a dataclass __init__ call costs as much
                # again. Every field is set (the tests compare these with the stages' records). A
                # clean job has no anti-affinity rule: it repels nothing.
                r = new(Resident)
                r.task_id = tid
                r.job_id = jid
                r.cpu_milli = cpu
                r.memory = memory
                r.gpus = gpus
                r.extended = extended
                r.priority = priority
                r.preemptible = preemptible
                r.queue = queue
                r.tenant = tenant
                r.start_time = now
                r.job_labels = labels
                r.role = role
                r.min_member = min_member
                r.disruption_budget = budget
                r.repels = ()
                r.standing = standing
                residents.append(r)
                if held is None:
                    held = job_tasks[jid] = {tid}
                else:
                    held.add(tid)
                change = new(TaskBound)  # TaskBound(node, r), likewise
                change.node = node
                change.resident = r
                changes.append(change)
                binds.append((tid, node, gpus))
                if b_nodes is not None:
                    # The resident's field values in order (fast_pickle.rows_of(Resident)), for
                    # the change segment: read back from the record they would cost twice this.
                    b_nodes.append(node)
                    b_rows.append(
                        (tid, jid, cpu, memory, gpus, extended, priority, preemptible, queue, tenant,
                         now, labels, role, min_member, budget, (), standing)
                    )  # fmt: skip
            # One placement (the usual unit) spares map() and tuple(); clean: no victims.
            if len(placements) == 1:
                indexes: tuple[int, ...] = (placements[0].task_index,)
            else:
                indexes = tuple(map(_TASK_INDEX, placements))
            attempt = p.attempt
            if accepted is not None:
                unit = new(AcceptedUnit)  # AcceptedUnit(jid, attempt, indexes, now), likewise
                unit.job_id = jid
                unit.attempt = attempt
                unit.task_indexes = indexes
                unit.bind_time = now
                unit.victims = ()
                accepted.append(unit)
            if b_nodes is not None:
                b_accepted.append((jid, attempt, indexes, now, ()))
        victim_priority: I64 | int
        if len(run_offers) <= 1:  # one for all (or no placement): no column to build
            victim_priority = run_offers[0] if run_offers else NO_VICTIM
        else:
            lengths = [end - start for start, end in zip(run_starts, [*run_starts[1:], k], strict=True)]
            victim_priority = np.repeat(np.array(run_offers, np.int64), lengths)
        self.truth.place_clean(clean.rows, residents, clean.plain, victim_priority, clean.row_array)

    def _commit_unit(self, proposal: Proposal, scope: BatchScope, writes: _Writes, now: float) -> _Outcome:
        """Run the stages over one proposal, then apply it: evict -> confirm released -> bind."""
        job = proposal.job
        if not proposal.placements:
            return _Outcome(
                rejected=[RejectedUnit(job.id, (), "the proposal has no placements", self.stages[0].name)]
            )
        need = gang_need(proposal, self.truth)
        unit = UnitCheck(proposal, self.truth, scope)
        dropped: list[RejectedUnit] = []
        alive = self._run_stages(self.stages, unit, candidates_of(proposal), need, dropped)
        # A later stage may have dropped a placement whose node's victims an earlier stage counted
        # as gone for the others. Only the victims on the nodes the unit still binds to go, and a
        # rule judged across a domain (anti-affinity: a zone, a rack) may have counted on one left
        # in place: judge such stages again with the victims that go, until nothing more drops.
        while not isinstance(alive, RejectedUnit):
            rows = {c.row for c in alive}
            going = {v: row for v, row in unit.victims.items() if row in rows}
            if len(going) == len(unit.victims):
                break
            unit.victims = going
            alive = self._run_stages(self._across_nodes, unit, alive, need, dropped)
        if isinstance(alive, RejectedUnit):
            return _Outcome(rejected=[alive])

        out = _Outcome(rejected=dropped)
        # Phase 1: evict the victims on the nodes the unit still binds to (every victim whose credit
        # a surviving placement may have counted on).
        rows = {c.row for c in alive}
        victims = [v for v, row in unit.victims.items() if row in rows]
        scope.claimed_victims.update(victims)
        out.evicted = self._evict(victims, job.id, out.changes, writes, scope)
        # Phase 2: their room is free in the truth. Their runs stop on their machines through the
        # grace period; the agent gateway holds a launch that needs a victim's GPU or memory until
        # that run's end is in (api/agents.py), so the binder need not wait here.
        self._confirm_released(victims)
        # Phase 3: bind.
        for c in alive:
            pl = c.placement
            r = make_resident(job, pl.task_index, pl.gpus, now, proposal.standing)
            self.truth.place(c.row, r)
            scope.placed.add(r.task_id)
            out.changes.append(TaskBound(pl.node, r))
            writes.bind(r.task_id, pl.node, pl.gpus)
        out.accepted = AcceptedUnit.of(job.id, proposal.attempt, [c.placement for c in alive], now)
        return out

    @staticmethod
    def _run_stages(
        stages: Sequence[Stage],
        unit: UnitCheck,
        alive: list[Candidate],
        need: int,
        dropped: list[RejectedUnit],
    ) -> list[Candidate] | RejectedUnit:
        """The placements that pass `stages` in order (those a stage fails onto `dropped`), or the
        whole unit's rejection once fewer than `need` are left (the gang check after each stage)."""
        job = unit.job
        all_indexes = tuple(p.task_index for p in unit.proposal.placements)
        for stage in stages:
            verdicts = stage(unit, alive)
            failed = [(c, why) for c, why in zip(alive, verdicts, strict=True) if why is not None]
            if not failed:
                if len(alive) < need:
                    why = f"{len(alive)} placement(s) proposed, {need} needed"
                    return RejectedUnit(job.id, all_indexes, why, stage.name)
                continue
            alive = [c for c, why in zip(alive, verdicts, strict=True) if why is None]
            reasons = _summarise(why for _, why in failed if why is not None)
            if len(alive) < need:
                why = f"{reasons} ({len(alive)} of {len(all_indexes)} placements left, {need} needed)"
                return RejectedUnit(job.id, all_indexes, why, stage.name)
            dropped.append(
                RejectedUnit(job.id, tuple(c.placement.task_index for c, _ in failed), reasons, stage.name)
            )
        return alive

    def _evict(
        self,
        victims: Sequence[str],
        preemptor: str,
        changes: list[Change],
        writes: _Writes,
        scope: BatchScope,
    ) -> list[Eviction]:
        """Evict `victims` (state preempted), then break the gangs they leave below min_member."""
        evicted: list[Eviction] = []
        affected: dict[str, int] = {}
        for tid in victims:
            got = self.truth.release(tid, down=True)
            if got is None:
                continue
            r = got[1]
            evicted.append(Eviction(tid, r.job_id, split_task_id(tid)[1], preemptor))
            changes.append(TaskReleased(tid, "preempted"))
            if r.disruption_budget is not None:
                changes.append(TaskReleased(tid, DOWN))
            writes.state(tid, TaskState.PREEMPTED)
            scope.evicted.add(tid)
            affected.setdefault(r.job_id, r.min_member)
        evicted.extend(self._gang_break(affected, "", changes, writes, scope))
        return evicted

    def _gang_break(
        self,
        affected: dict[str, int],
        preemptor: str,
        changes: list[Change],
        writes: _Writes,
        scope: BatchScope,
    ) -> list[Eviction]:
        """Evict the remaining residents of each job in `affected` (job id -> min_member) that has
        fewer residents left than its min_member: no gang stays partly bound."""
        out: list[Eviction] = []
        for job_id, min_member in affected.items():
            rest = self.truth.job_tasks.get(job_id)
            if not rest or len(rest) >= min_member:
                continue
            for tid in sorted(rest, key=split_task_id):
                got = self.truth.release(tid, down=True)
                out.append(Eviction(tid, job_id, split_task_id(tid)[1], preemptor))
                changes.append(TaskReleased(tid, "preempted"))
                if got is not None and got[1].disruption_budget is not None:
                    changes.append(TaskReleased(tid, DOWN))
                writes.state(tid, TaskState.PREEMPTED)
                scope.evicted.add(tid)
        return out

    def _confirm_released(self, task_ids: Sequence[str]) -> None:
        """Phase 2 of preemption: the victims must be gone from the truth (their runs' ends are the
        agent gateway's to wait for)."""
        task_row = self.truth.arrays.task_row
        still = [t for t in task_ids if t in task_row]
        if still:
            raise RuntimeError(f"victims still bound after eviction: {still}")

    # -- plumbing -----------------------------------------------------------------------------------
    def _publish(self, changes: list[Change]) -> int:
        self.truth.compact()
        return self.log.extend(changes)

    def _guarded(self, write: Callable[[], None]) -> None:
        """Persist; if the store fails after the arrays changed, this binder is no longer the truth."""
        try:
            write()
        except BaseException as exc:
            self._broken = exc
            raise

    def _writable(self) -> None:
        """Before a write other than commit's: the writer's queue goes to the store first."""
        self._usable()
        if self.writer is not None:
            self._guarded(self.writer.drain)

    def _usable(self) -> None:
        if self._broken is not None:
            raise RuntimeError(
                "the binder failed to persist a change; build a new Binder from the store"
            ) from (self._broken)


def _down_notes(released: Sequence[Resident]) -> list[Change]:
    """A TaskReleased(task, DOWN) for each of these tasks, taken down, that its job's disruption
    budget counts: the shards' ledgers follow these notes, not their views (a plan of their own
    in flight may hold the task in the view, or not, whatever the binder did)."""
    return [TaskReleased(r.task_id, DOWN) for r in released if r.disruption_budget is not None]


def next_epoch(version: int) -> int:
    """The first version of a binder recovered from a store at `version`: the next epoch's.

    A version carries its binder's incarnation in its high bits, so every version of a recovered
    binder is above any the last one reached, in the store or in memory only (its writer a few
    batches behind when it died). A shard's view or plan of an earlier incarnation is never taken
    for one of this: the shard resyncs, and its plans are refused (NodeCurrent), where they could
    count on what was never durable, or miss what only the dead binder knew (a cancel). A store
    with no change yet (version 0) has had no view to tell apart."""
    return ((version >> EPOCH_BITS) + 1) << EPOCH_BITS if version else 0


def _summarise(reasons: Iterable[str], limit: int = 3) -> str:
    distinct = list(dict.fromkeys(reasons))
    text = "; ".join(distinct[:limit])
    if len(distinct) > limit:
        text += f"; and {len(distinct) - limit} more"
    return text
