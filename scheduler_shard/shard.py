"""A scheduler shard: a cached view of the whole cluster, the plugin chain, and proposals.

It proposes and never binds. Its view is the binder's state at `version` plus its own in-flight
assumptions (UnitContexts), which are undone and redone around each batch of binder changes.
"""

import time
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from gosched.common.changes import apply_changes
from gosched.common.cluster_state import ClusterArrays
from gosched.common.config import ProfileConfig
from gosched.common.job import TaskGroup
from gosched.common.messages import (
    BindReply,
    Change,
    Proposal,
    ProposalBatch,
    TaskBound,
    TaskReleased,
    TaskUp,
    UnitBatch,
)
from gosched.scheduler_shard.class_cache import ClassCache
from gosched.scheduler_shard.framework.profile import build_profile
from gosched.scheduler_shard.in_flight import InFlightPlans
from gosched.scheduler_shard.placer import Placer
from gosched.scheduler_shard.plugins.gpu_fragmentation import GpuFragmentation
from gosched.scheduler_shard.unit_context import UnitContext


class SchedulerShard:
    def __init__(
        self, shard_id: int, profile: ProfileConfig | None = None, clock: Callable[[], float] = time.time
    ):
        self.shard_id = shard_id
        self.profile = build_profile(profile or ProfileConfig())
        self.clock = clock
        self.state = ClusterArrays()
        self.version = 0
        self.cache = ClassCache(self.profile)
        self.placer = Placer(self.profile, self.cache, clock)
        self.inflight: dict[str, UnitContext] = {}
        self._partition: list[str] | None = None
        self._own_rows: npt.NDArray[np.int64] | None = None
        self._own_rows_gen = -1
        self._learners = [p for p, _ in self.profile.scores if isinstance(p, GpuFragmentation)]

    # -- view maintenance -----------------------------------------------------------------------
    def set_partition(self, node_names: Sequence[str] | None) -> None:
        """The nodes this shard tries first; None: the whole cluster is its partition."""
        self._partition = None if node_names is None else list(node_names)
        self._own_rows_gen = -1

    def own_rows(self) -> npt.NDArray[np.int64] | None:
        if self._partition is None:
            return None
        if self._own_rows_gen != self.state.meta_generation:
            rows = [self.state.row_of[n] for n in self._partition if n in self.state.row_of]
            self._own_rows = np.array(rows, np.int64)
            self._own_rows_gen = self.state.meta_generation
        return self._own_rows

    def sync(self, changes: list[Change], version: int, resync: bool = False) -> None:
        """Bring the view to the binder's `version`, keeping in-flight assumptions on top.

        Usage adds up, so changes that touch no task an assumption placed or evicted, and no
        node, apply on top of the assumptions to the same view; the rest are applied underneath
        them (undo, apply, redo). With pipelined rounds a reply always meets the next batch's
        assumptions, so the usual case skips undoing and redoing every one of them.
        """
        live = list(self.inflight.values())
        if live and (resync or _touches_assumptions(live, changes)):
            for ctx in reversed(live):
                ctx.undo(self.state)
            if resync:
                self.state = ClusterArrays()
            apply_changes(self.state, changes)
            for ctx in live:
                ctx.redo(self.state)
        else:
            if resync:
                self.state = ClusterArrays()
            apply_changes(self.state, changes)
        self.version = version
        self._compact()

    def apply_reply(self, reply: BindReply) -> None:
        """Settle the assumptions the binder has answered for, then take its changes.

        A unit bound exactly as planned (every placement, no eviction) stays in the view: the
        reply's changes hold its bindings, which then only swap in the binder's records (see
        apply_change). Undoing it to place it again would cost a release, a place and a refresh
        of the row per task for the same result. Any other answered assumption is undone first.
        """
        rejected = {r.job_id for r in reply.rejected}
        for acc in reply.accepted:
            ctx = self.inflight.pop(acc.job_id, None)
            if ctx is not None and not (acc.job_id not in rejected and ctx.bound_as_planned(acc)):
                ctx.undo(self.state)
        for job_id in rejected:
            ctx = self.inflight.pop(job_id, None)
            if ctx is not None:
                ctx.undo(self.state)
        self.sync(reply.changes, reply.version, reply.resync)

    def _compact(self) -> None:
        oldest = self.cache.oldest_position()
        self.state.compact_dirty_log(self.state.dirty_position if oldest is None else oldest)

    def _observe(self, group: TaskGroup) -> None:
        """Teach the fragmentation score a GPU task type arriving (first attempts only)."""
        res = group.resources
        for learner in self._learners:
            before = learner.types.generation
            learner.types.observe(res.gpu_total_milli, res.cpu_milli, res.memory, group.replicas)
            if learner.types.generation != before:
                self.cache.models_changed()

    # -- scheduling ------------------------------------------------------------------------------
    def schedule(self, batch: UnitBatch) -> ProposalBatch:
        own = self.own_rows()
        proposals: list[Proposal] = []
        unschedulable = []
        assumed = InFlightPlans(self.inflight)
        # Read once for the batch: this loop runs once per unit.
        inflight, state, schedule_unit = self.inflight, self.state, self.placer.schedule_unit
        learning = bool(self._learners)
        for unit in batch.units:
            job = unit.job
            stale = inflight.pop(job.id, None)
            if stale is not None:  # the job was dispatched again (a restart): its old plan is void
                stale.undo(state)
                if assumed.asked:
                    assumed.forget(stale)
            if learning and unit.attempt == 0:
                for group in job.groups:
                    if group.resources.wants_gpu:
                        self._observe(group)
            ctx, leftover = schedule_unit(unit, state, own, assumed)
            if ctx is not None:
                inflight[job.id] = ctx
                if assumed.asked:
                    assumed.add(ctx)
                placements = ctx.placements
                proposals.append(
                    Proposal(
                        job,
                        list(placements),
                        unit.min_needed,
                        unit.attempt,
                        unit.dispatch_time,
                        unit.held,
                        unit.floors if ctx.victims_by_job and any(p.victims for p in placements) else (),
                        unit.standing,
                    )
                )
            if leftover is not None:
                unschedulable.append(leftover)
        self._compact()
        return ProposalBatch(self.shard_id, self.version, proposals, unschedulable)


def _touches_assumptions(live: list[UnitContext], changes: list[Change]) -> bool:
    """Whether a change names a task that a live attempt placed or evicted, or is a node change."""
    if not changes:
        return False
    assumed = {resident.task_id for ctx in live for _, _, resident in ctx.log}
    for change in changes:
        if isinstance(change, TaskBound):
            if change.resident.task_id in assumed:
                return True
        elif isinstance(change, TaskReleased | TaskUp):
            if change.task_id in assumed:
                return True
        else:  # NodeUpserted, NodeRemoved: rare; take the careful path
            return True
    return False
