"""RayControl: the ControlPlane over the components as Ray actors (what `gosched master` runs).

Scheduling runs as in RayScheduler.run_until_idle, but without end: `step()` keeps one round
(ShardActor.run_once) in flight per shard, collects the rounds that finished within a few
milliseconds, and handles a lost shard or a restarted binder/dispatcher the same way. A shard that
found nothing to do is asked again after a delay that grows while it stays idle (2 ms to 50 ms) and
drops to zero as soon as work arrives, so an idle master costs little and a busy one never waits.
Every query is one actor call, whatever its size. An actor that does not answer makes a client's
call fail as ControlUnavailable (UNAVAILABLE to clients).
"""

import contextlib
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

import ray
from ray.exceptions import RayActorError

from gosched.common.config import Settings
from gosched.common.errors import AdmissionRejected, AlreadyStored, SpecError
from gosched.common.job import Job
from gosched.common.node import Node, NodeState
from gosched.common.snapshots import Counters, JobSnapshot, NodeSnapshot
from gosched.common.states import TaskState
from gosched.runtime.control import ControlUnavailable, untolerated, with_placements
from gosched.runtime.ray_cluster import RayScheduler

P = ParamSpec("P")
R = TypeVar("R")


def _answered(note: str = "") -> Callable[[Callable[P, R]], Callable[P, R]]:
    """An actor that does not answer (restarting after a crash) makes a client's call fail as
    ControlUnavailable, which the API reports as UNAVAILABLE (retry), not as an internal error."""

    def wrap(method: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(method)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return method(*args, **kwargs)
            except RayActorError as exc:  # ActorUnavailableError included
                raise ControlUnavailable(f"the scheduler is restarting a component{note}: {exc}") from exc
            except ray.exceptions.RayTaskError as exc:
                # A refusal raised in an actor (a duplicate id...) reaches the API as itself, to be
                # told as the client's error, not as Ray's wrapper with the actor's traceback.
                if isinstance(exc.cause, TOLD_AS_IS):
                    raise exc.cause from None
                raise

        return call

    return wrap


TOLD_AS_IS = (SpecError, AlreadyStored, AdmissionRejected)
SUBMIT_NOTE = (
    " (the submission may or may not have been accepted: retry it with the same submission id,"
    " or look the job id up first)"
)
IDLE_DELAY_MIN_S = 0.002
IDLE_DELAY_MAX_S = 0.05
WAIT_S = 0.02  # longest a step waits for a round to finish


class RayControl:
    def __init__(self, settings: Settings, nodes: Sequence[Node] = (), address: str | None = None) -> None:
        self.rs = RayScheduler(settings, nodes, address=address)
        self._outstanding: dict[Any, int] = {}
        n = len(self.rs.shards)
        self._next_start = [0.0] * n  # monotonic time a shard's next round may start
        self._idle_delay = [0.0] * n

    # -- scheduling ------------------------------------------------------------------------------------
    def _wake_shards(self) -> None:
        self._next_start = [0.0] * len(self._next_start)
        self._idle_delay = [0.0] * len(self._idle_delay)

    def step(self) -> bool:
        rs = self.rs
        now = time.monotonic()
        running = set(self._outstanding.values())
        for s, shard in enumerate(rs.shards):
            if s not in running and self._next_start[s] <= now:
                self._outstanding[shard.run_once.remote()] = s
        if not self._outstanding:
            return False
        refs = list(self._outstanding)
        ready, _ = ray.wait(refs, num_returns=1, timeout=WAIT_S)
        if ready:  # take every round that is already done, not just the first
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        progressed = False
        lost_control = False
        for ref in ready:
            s = self._outstanding.pop(ref)
            try:
                res = ray.get(ref)
            except RayActorError:
                rs._shard_lost(s)
                self._next_start[s] = 0.0
                progressed = True
                continue
            if "lost" in res or rs._restarted(res):
                lost_control = True
                continue
            if res["idle"]:
                delay = min(IDLE_DELAY_MAX_S, max(IDLE_DELAY_MIN_S, self._idle_delay[s] * 2))
                self._idle_delay[s] = delay
                self._next_start[s] = time.monotonic() + delay
                continue
            progressed = True
            rs.counters["rounds"] += 1
            rs.counters["proposals"] += res["proposals"]
            rs.counters["unschedulable_units"] += res["unschedulable"]
        if progressed:  # work is flowing: every shard asks again at once
            self._wake_shards()
        if lost_control:
            rs._drain(self._outstanding)
            rs._recover()
            self._wake_shards()
            progressed = True
        return progressed

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.rs._drain(self._outstanding)
        self.rs.shutdown()

    # -- jobs -------------------------------------------------------------------------------------------
    @_answered(SUBMIT_NOTE)
    def submit_many(self, jobs: Sequence[Job]) -> list[str]:
        ids = self.rs.submit_many(jobs)
        self._wake_shards()
        return ids

    @_answered()
    def job_ids(self) -> list[str]:
        ids: list[str] = ray.get(self.rs.dispatcher.job_ids.remote())
        return ids

    @_answered()
    def jobs(
        self, job_ids: Sequence[str], *, placements: bool, ended: bool = False
    ) -> list[JobSnapshot | None]:
        snaps: list[JobSnapshot | None] = ray.get(self.rs.dispatcher.snapshots.remote(list(job_ids)))
        if not placements:
            return snaps
        binder = self.rs.binder
        return with_placements(snaps, lambda tids: ray.get(binder.placements.remote(tids)), ended=ended)

    @_answered()
    def cancel(self, job_id: str) -> None:
        holding: list[str] = ray.get(self.rs.dispatcher.cancel.remote(job_id))
        ray.get(self.rs.binder.cancel_job.remote(job_id, holding))
        if holding:
            self._resync_shards()

    @_answered()
    def explain(self, job_id: str) -> str:
        return self.rs.explain(job_id)

    def drain_latencies(self) -> list[float]:
        out: list[float] = ray.get(self.rs.dispatcher.drain_latencies.remote())
        return out

    # -- task lives -------------------------------------------------------------------------------------
    def started(self, task_ids: Sequence[str]) -> None:
        ray.get(self.rs.dispatcher.on_started.remote(list(task_ids)))

    def task_attempts(self, task_ids: Sequence[str]) -> dict[str, int]:
        out: dict[str, int] = ray.get(self.rs.dispatcher.task_attempts.remote(list(task_ids)))
        return out

    def finished(
        self, task_ids: Sequence[str], final: TaskState, reasons: Mapping[str, str] | None = None
    ) -> None:
        ray.get(self.rs.binder.release.remote(list(task_ids), final.value))
        ray.get(self.rs.dispatcher.on_released.remote(list(task_ids), final.value, dict(reasons or {})))
        self._resync_shards()

    def lost(self, task_ids: Sequence[str]) -> None:
        released: list[str] = ray.get(self.rs.binder.lose.remote(list(task_ids)))
        ray.get(self.rs.dispatcher.on_released.remote(released, TaskState.PENDING.value))
        self._resync_shards()

    def _resync_shards(self) -> None:
        """Room was freed: each shard takes the binder's changes before its next round (no wait:
        an actor's calls run in order). A unit planned on a view without the room would be found
        unschedulable after the change, and the dispatcher trusts such a verdict until the next."""
        for shard in self.rs.shards:
            shard.sync.remote()
        self._wake_shards()

    # -- nodes ------------------------------------------------------------------------------------------
    def add_nodes(self, nodes: Sequence[Node]) -> None:
        self.rs.add_nodes(nodes)
        # A node that came back smaller or with a NoExecute taint gives up what it cannot hold.
        names = [n.name for n in nodes]
        binder = self.rs.binder
        residents, evict = ray.get([binder.residents.remote(names), binder.misfits.remote(names)])
        evict += untolerated(nodes, residents, lambda ids: self.jobs(ids, placements=False))
        if evict:
            self.lost(list(dict.fromkeys(evict)))
        self._resync_shards()  # learn them now, not with the next reply

    @_answered()
    def set_node_state(self, name: str, state: NodeState) -> None:
        try:
            ray.get(self.rs.binder.set_node_state.remote(name, state.value))
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, KeyError):
                raise KeyError(name) from None
            raise
        ray.get(self.rs.dispatcher.notify_cluster_changed.remote())
        self._wake_shards()

    def node_lost(self, name: str) -> list[str]:
        released: list[str] = ray.get(self.rs.binder.node_lost.remote(name))
        ray.get(self.rs.dispatcher.on_released.remote(released, TaskState.PENDING.value))
        ray.get(self.rs.dispatcher.notify_cluster_changed.remote())
        self._wake_shards()
        return released

    @_answered()
    def remove_node(self, name: str) -> list[str]:
        try:
            released = self.rs.remove_node(name)
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, KeyError):
                raise KeyError(name) from None
            raise
        self._wake_shards()
        return released

    @_answered()
    def nodes(self, names: Sequence[str] | None = None) -> list[NodeSnapshot]:
        got: list[NodeSnapshot] = ray.get(self.rs.binder.nodes.remote(None if names is None else list(names)))
        return got

    @_answered()
    def residents(self, names: Sequence[str]) -> dict[str, list[str]]:
        got: dict[str, list[str]] = ray.get(self.rs.binder.residents.remote(list(names)))
        return got

    @_answered()
    def resident_runs(self, names: Sequence[str]) -> dict[str, dict[str, float]]:
        got: dict[str, dict[str, float]] = ray.get(self.rs.binder.resident_runs.remote(list(names)))
        return got

    # -- cluster ----------------------------------------------------------------------------------------
    @_answered()
    def queue_shares(self) -> dict[str, float]:
        shares: dict[str, float] = ray.get(self.rs.dispatcher.queue_shares.remote())
        return shares

    @_answered()
    def counters(self) -> Counters:
        d, b = self.rs.dispatcher, self.rs.binder
        counts, stats, usage = ray.get([d.counts.remote(), d.stats.remote(), b.usage.remote()])
        return Counters(
            **usage,
            active_jobs=counts["active"],
            pending_jobs=counts["pending"],
            in_flight_units=counts["in_flight"],
            rounds=self.rs.counters["rounds"],
            bound_tasks=stats["bound_tasks"],
            binder_conflicts=stats["rejected_units"],
            shards=len(self.rs.shards),
        )

    @_answered()
    def pending_tasks(self) -> int:
        n: int = ray.get(self.rs.dispatcher.pending_task_count.remote())
        return n
