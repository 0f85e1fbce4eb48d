"""The whole scheduler in one process: dispatcher -> shards -> binder, over any nodes.

Used by the tests and by `gosched bench --in-process`. It holds no scheduling logic of its own:
the same component classes run inside Ray actors, and this class only moves their messages.
In each round every shard plans on the view it has (optimistically, as the Ray shards do at the
same moment), then the binder judges the shards' batches one after another.
"""

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gosched.binder.binder import Binder
from gosched.common.aging import StandingRule
from gosched.common.config import Settings
from gosched.common.job import Job
from gosched.common.node import Node, NodeState, keep_operator_states
from gosched.common.states import TaskState
from gosched.common.store import Store
from gosched.dispatcher.dispatcher import Dispatcher
from gosched.runtime.gc_tuning import tune_gc
from gosched.scheduler_shard.shard import SchedulerShard


@dataclass(slots=True)
class PipelineStats:
    rounds: int = 0
    proposals: int = 0
    rejected_units: int = 0
    bound_tasks: int = 0
    unschedulable_units: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds, dispatch -> bind
    component_s: dict[str, float] = field(
        default_factory=lambda: {"dispatcher": 0.0, "shards": 0.0, "binder": 0.0}
    )

    @property
    def conflict_rate(self) -> float:
        return self.rejected_units / self.proposals if self.proposals else 0.0


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        *,
        store_path: str | Path | None = None,
        nodes: Sequence[Node] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.store = Store(store_path or settings.store_path)
        self.binder = Binder(self.store, clock=clock, standing=StandingRule(settings.queues) or None)
        self.dispatcher = Dispatcher(settings, store=self.store, clock=clock)
        self.shards = [SchedulerShard(i, settings.profile, clock=clock) for i in range(settings.shards)]
        self.stats = PipelineStats()
        known = self.binder.snapshot_nodes()
        if known:  # a restart: nodes come back from the store
            self._nodes_changed(known, [])
        self.dispatcher.restore()
        for job_id, holding in self.dispatcher.take_aborted().items():  # gangs found failed
            self.binder.cancel_job(job_id, holding)
        if nodes:
            self.add_nodes(keep_operator_states(nodes, known))
        self.sync_shards()
        tune_gc()

    # -- cluster ---------------------------------------------------------------------------------
    def add_nodes(self, nodes: Sequence[Node]) -> None:
        self.binder.add_nodes(nodes)
        self._nodes_changed(nodes, [])
        self.sync_shards()

    def remove_node(self, name: str) -> list[str]:
        """The node is gone: its tasks lost their place and are scheduled again (returned)."""
        lost = self.binder.remove_node(name)
        self.dispatcher.on_released(lost, TaskState.PENDING)
        self._nodes_changed([], [name])
        self.sync_shards()
        return lost

    def set_node_state(self, name: str, state: NodeState) -> None:
        self.binder.set_node_state(name, state)
        self.dispatcher.notify_cluster_changed()
        self.sync_shards()

    def _nodes_changed(self, added: Sequence[Node], removed: Sequence[str]) -> None:
        parts = self.dispatcher.partitions
        if added:
            parts.add_nodes(added)
        if removed:
            parts.remove_nodes(removed)
        for shard in self.shards:
            shard.set_partition(parts.partition_of(shard.shard_id))
        totals = self.binder.state.totals()
        self.dispatcher.set_cluster_capacity(totals["cpu"], totals["memory"], totals["gpu"])

    def sync_shards(self) -> None:
        """Bring every shard's view up to the binder's version now (as replies would)."""
        for shard in self.shards:
            changes, version, resync = self.binder.changes_since(shard.version)
            shard.sync(changes, version, resync)

    # -- jobs ------------------------------------------------------------------------------------
    def submit(self, job: Job) -> str:
        return self.dispatcher.submit(job)

    def submit_many(self, jobs: Sequence[Job]) -> list[str]:
        return self.dispatcher.submit_many(jobs)

    def complete(
        self,
        task_ids: Sequence[str],
        final: TaskState = TaskState.SUCCEEDED,
        reasons: Mapping[str, str] | None = None,
    ) -> None:
        """Tasks that ended on their node: free their resources and record the end (and, for a
        failure, why: `reasons` by task id). Only the tasks the binder still held end so: one
        evicted meanwhile ends as its eviction says (the binder's report), whatever its run said.
        A failed task its job runs again (Job.max_retries) leaves its node as a lost one does, after
        the report's other ends: a gang it breaks then takes none whose failure is final with it."""
        again = self.dispatcher.begin_retries(task_ids) if final is TaskState.FAILED else []
        if again:
            retried = set(again)
            task_ids = [t for t in task_ids if t not in retried]
        released = self.binder.release(task_ids, final.value, reasons)
        # A gang a failure for good stopped: its other tasks are freed as a cancel's are.
        for job_id, holding in self.dispatcher.on_released(released, final, reasons).items():
            self.binder.cancel_job(job_id, holding)
        if again:
            self.dispatcher.on_retried(again, self.binder.lose(again), reasons)
        self.sync_shards()  # see the room now: a verdict on the old view would be trusted

    def started(self, task_ids: Sequence[str]) -> None:
        """Tasks whose process started on their node: running, and, if down through a disruption,
        up again, which may let a preemptor their job's budget held back go ahead."""
        self.dispatcher.on_started(task_ids)
        if self.binder.started(task_ids):
            self.dispatcher.notify_cluster_changed()
            self.sync_shards()

    def cancel(self, job_id: str) -> None:
        holding = self.dispatcher.cancel(job_id)
        self.binder.cancel_job(job_id, holding)
        if holding:
            self.sync_shards()

    # -- scheduling rounds ----------------------------------------------------------------------
    def step(self) -> bool:
        """One round; False when nothing was dispatched (idle, or all pending are backing off)."""
        t0 = time.perf_counter()
        loads = [len(s.inflight) for s in self.shards]
        batches = self.dispatcher.next_batches(loads)
        cancels = self.dispatcher.take_deadline_cancels()
        if cancels:  # none has a unit in flight here; the binder hears of them as on Ray all the same
            self.binder.note_cancelled(cancels)
        t1 = time.perf_counter()
        if not batches:
            self.stats.component_s["dispatcher"] += t1 - t0
            return False
        planned = [self.shards[b.shard_id].schedule(b) for b in batches]
        t2 = time.perf_counter()
        binder_s = dispatcher_s = 0.0
        for batch in planned:
            tb = time.perf_counter()
            reply = self.binder.commit(batch)
            td = time.perf_counter()
            self.shards[batch.shard_id].apply_reply(reply)
            te = time.perf_counter()
            orphaned = self.dispatcher.on_reply(reply)
            if orphaned:  # bound for a job cancelled while its unit was in flight
                self.binder.release(orphaned, TaskState.CANCELLED.value)
            if batch.unschedulable:
                self.dispatcher.on_unschedulable(batch.unschedulable)
            tf = time.perf_counter()
            binder_s += td - tb
            dispatcher_s += tf - te
            self.stats.component_s["shards"] += te - td
            self._count(batch.proposals, reply, len(batch.unschedulable))
        self.stats.rounds += 1
        self.stats.component_s["dispatcher"] += (t1 - t0) + dispatcher_s
        self.stats.component_s["shards"] += t2 - t1
        self.stats.component_s["binder"] += binder_s
        return True

    def _count(self, proposals: list, reply: object, unschedulable: int) -> None:
        from gosched.common.messages import BindReply

        assert isinstance(reply, BindReply)
        s = self.stats
        s.proposals += len(proposals)
        # A unit counts as a conflict when the binder refused all of it; dropping a gang's extra
        # placements while binding the rest is not one.
        accepted = {a.job_id for a in reply.accepted}
        s.rejected_units += len({r.job_id for r in reply.rejected} - accepted)
        s.unschedulable_units += unschedulable
        dispatched = {p.job.id: p.dispatch_time for p in proposals}
        for acc in reply.accepted:
            s.bound_tasks += len(acc.task_indexes)
            started = dispatched.get(acc.job_id)
            if started is not None:  # 0.0 is a moment too (an injected clock may start there)
                s.latencies.extend([acc.bind_time - started] * len(acc.task_indexes))

    def run_until_idle(self, max_rounds: int = 1_000_000, wait_backoff: bool = False) -> int:
        """Run rounds until nothing is dispatched; with wait_backoff, also wait out retry backoff."""
        rounds = 0
        while rounds < max_rounds:
            if self.step():
                rounds += 1
                continue
            if wait_backoff and self.dispatcher.waiting_count() > 0:
                time.sleep(self.settings.retry_backoff_s)
                rounds += 1
                continue
            break
        return rounds

    def close(self) -> None:
        self.store.close()
