"""RayControl: the ControlPlane over the components as Ray actors (what `gosched master` runs).

Scheduling runs as in RayScheduler.run_until_idle, but without end: `step()` keeps one round
(ShardCore.run_once) in flight per shard, collects the rounds that finished within a few
milliseconds, and handles a lost shard or a restarted binder/dispatcher the same way. A shard that
found nothing to do is asked again after a delay that grows while it stays idle (2 ms to 1 s, and
no later than the dispatcher's next retry of a parked job) and drops to zero as soon as work
arrives (a round that bound something, a submission, a cluster change): an idle master costs
little and a busy one never waits. Every query is one actor call, whatever its size.

Failures. An actor that does not answer makes the call fail as ControlUnavailable (UNAVAILABLE to
clients) and sets `unavailable` (the service is not ready meanwhile). No rounds run then; every
PROBE_EVERY_S the binder and the dispatcher are asked, with a timeout, and once both answer (a
restarted one: after the dispatcher's reload from the store) scheduling goes on. While the
actors answer, Ray's GCS is asked every GCS_CHECK_EVERY_S whether it still knows this driver, and
its port is tried every GCS_PING_EVERY_S (a head that is gone refuses at once).
The cluster is lost for good (ControlLost: the master stops and exits non-zero) when another
cluster answers at the GCS's address (the head was restarted: the actors went with the old one),
when this driver's node is dead (the binder and the dispatcher are pinned to it), when the GCS
has not answered for CLUSTER_LOST_AFTER_S (Ray's own client kills the process at 60 s), or when
the actors have not answered for ACTORS_LOST_AFTER_S while the cluster does.
"""

import contextlib
import functools
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from gosched.common.config import Settings
from gosched.common.errors import AdmissionRejected, AlreadyStored, SpecError
from gosched.common.job import Job
from gosched.common.node import Node, NodeState
from gosched.common.snapshots import Counters, JobSnapshot, NodeSnapshot
from gosched.common.states import TaskState
from gosched.runtime.control import (
    ControlLost,
    ControlUnavailable,
    describe_error,
    untolerated,
    with_placements,
)
from gosched.runtime.ray_cluster import RayScheduler, stop_own_ray

P = ParamSpec("P")
R = TypeVar("R")

TOLD_AS_IS = (SpecError, AlreadyStored, AdmissionRejected)
SUBMIT_NOTE = (
    " (the submission may or may not have been accepted: retry it with the same submission id,"
    " or look the job id up first)"
)
IDLE_DELAY_MIN_S = 0.002
IDLE_DELAY_MAX_S = 1.0  # an idle shard is asked again at least this often
LOST_SHARD_DELAY_MAX_S = 1.0  # a shard whose rounds fail (restarting) is asked again at most this late
WAIT_S = 0.02  # longest a step waits for a round to finish
OUTSTANDING_PAUSE_S = 0.002  # after a step that waited for rounds in vain, before the next
# Failure handling (see the module's docstring).
PROBE_EVERY_S = 0.5
PROBE_TIMEOUT_S = 2.0
GCS_CHECK_EVERY_S = 5.0
GCS_PING_EVERY_S = 1.0  # and every second a TCP connect to its port: refused at once when it is down
CLUSTER_LOST_AFTER_S = 30.0
ACTORS_LOST_AFTER_S = 120.0
CALL_FAILURES = (RayActorError, GetTimeoutError)


def _answered(
    note: str = "",
) -> Callable[[Callable[Concatenate["RayControl", P], R]], Callable[Concatenate["RayControl", P], R]]:
    """An actor that does not answer (restarting after a crash, or its cluster gone) makes the call
    fail as ControlUnavailable, which the API reports as UNAVAILABLE (retry), not as an internal
    error; ControlLost once the cluster is lost for good."""

    def wrap(method: Callable[Concatenate["RayControl", P], R]) -> Callable[Concatenate["RayControl", P], R]:
        @functools.wraps(method)
        def call(self: "RayControl", /, *args: P.args, **kwargs: P.kwargs) -> R:
            self._check_usable()
            try:
                result = method(self, *args, **kwargs)
            except CALL_FAILURES as exc:  # ActorUnavailableError included
                self._note_unavailable(exc)  # raises ControlLost when the cluster is lost
                raise ControlUnavailable(
                    f"a scheduler component does not answer (it may be restarting){note}: {_short(exc)}"
                ) from exc
            except ray.exceptions.RayTaskError as exc:
                # A refusal raised in an actor (a duplicate id...) reaches the API as itself, to be
                # told as the client's error, not as Ray's wrapper with the actor's traceback.
                if isinstance(exc.cause, TOLD_AS_IS):
                    raise exc.cause from None
                raise
            return result

        return call

    return wrap


def _short(exc: BaseException) -> str:
    return describe_error(exc, limit=200).split("; caused by ")[0]


class RayControl:
    def __init__(self, settings: Settings, nodes: Sequence[Node] = (), address: str | None = None) -> None:
        self.rs = RayScheduler(settings, nodes, address=address)
        self._outstanding: dict[Any, int] = {}
        n = len(self.rs.shards)
        self._next_start = [0.0] * n  # monotonic time a shard's next round may start
        self._idle_delay = [0.0] * n
        self._lost_delay = [0.0] * n  # back-off of a shard whose rounds fail
        context = ray.get_runtime_context()
        self.address: str = context.gcs_address
        self._node_id: str = context.get_node_id()
        self._unavailable: str | None = None
        self._unavailable_since = 0.0
        self._gcs_silent_since: float | None = None
        self._lost: ControlLost | None = None
        self._gcs_error = ""  # what the GCS's client said last time it failed
        self._needs_recovery = False  # a shard saw the binder or dispatcher lost: reload on return
        self._requeue: set[int] = set()  # lost shards whose units the binder could not take back yet
        self._next_probe = 0.0
        self._next_gcs_check = time.monotonic() + GCS_CHECK_EVERY_S
        self._next_gcs_ping = time.monotonic() + GCS_PING_EVERY_S
        self._checked: tuple[float, tuple[bool, str] | None] = (-1e9, None)

    # -- availability ----------------------------------------------------------------------------------
    @property
    def unavailable(self) -> str | None:
        return self._unavailable

    def _check_usable(self) -> None:
        if self._lost is not None:
            raise self._lost
        if not ray.is_initialized():  # an actor call now would start a new, empty local Ray
            raise self._lose("Ray was shut down in this process")

    def _lose(self, what: str) -> ControlLost:
        if self._lost is None:
            self._lost = ControlLost(f"lost the Ray cluster at {self.address}: {what}")
            self._unavailable = str(self._lost)
        return self._lost

    def _note_unavailable(self, exc: BaseException) -> None:
        """A call found a component not answering: unavailable from now until a probe finds both
        the binder and the dispatcher answering; ControlLost if the cluster is lost for good."""
        if self._unavailable is None:
            self._unavailable = f"a scheduler component does not answer: {_short(exc)}"
            self._unavailable_since = time.monotonic()
            self._next_probe = time.monotonic() + PROBE_EVERY_S
        self._judge_cluster()

    def _cluster_problem(self) -> tuple[bool, str] | None:
        """What is wrong with the Ray cluster, asked of its GCS: (for good, what), or None."""
        now = time.monotonic()
        at, found = self._checked
        if now - at < PROBE_EVERY_S:
            return found
        found = self._ask_gcs()
        self._checked = (time.monotonic(), found)
        return found

    def _ask_gcs(self) -> tuple[bool, str] | None:
        try:  # Ray's own client to the GCS: a call with a timeout, unlike ray.nodes()
            gcs: Any = getattr(ray._private.worker.global_worker, "gcs_client")  # noqa: B009 (untyped)
            nodes = gcs.get_all_node_info(timeout=PROBE_TIMEOUT_S)
        except AttributeError:
            return None  # another Ray: the actors' answers alone tell
        except Exception as exc:
            if "WrongClusterID" in str(exc):
                return True, (
                    "another Ray cluster answers at its address (its head was restarted), and the "
                    "scheduler's actors went with the old one"
                )
            self._gcs_error = _short(exc)
            return False, "its GCS does not answer"
        info = next((v for k, v in nodes.items() if k.hex() == self._node_id), None)
        if info is None or info.GcsNodeState.Name(info.state) != "ALIVE":
            return True, (
                f"this machine's Ray node {self._node_id[:12]} is dead, and the binder and the "
                "dispatcher, which run on it, cannot come back"
            )
        return None

    def _gcs_listens(self) -> bool:
        """A TCP connect to the GCS's port: a head that is gone refuses it at once, long before Ray
        finds its actors unreachable."""
        self._next_gcs_ping = time.monotonic() + GCS_PING_EVERY_S
        host, _, port = self.address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=0.5).close()
        except (OSError, ValueError) as exc:
            self._gcs_error = f"{self.address}: {getattr(exc, 'strerror', None) or exc}"
            return False
        return True

    def _judge_cluster(self) -> tuple[bool, str] | None:
        """Raise ControlLost if the cluster is lost by now; else what is wrong with it, if anything."""
        problem = self._cluster_problem()
        now = time.monotonic()
        if problem is None:
            self._gcs_silent_since = None
            if self._unavailable is not None and now - self._unavailable_since >= ACTORS_LOST_AFTER_S:
                raise self._lose(
                    f"the scheduler's actors have not answered for {ACTORS_LOST_AFTER_S:.0f} s "
                    f"({self._unavailable})"
                )
            return None
        for_good, what = problem
        if for_good:
            raise self._lose(what)
        if self._gcs_silent_since is None:
            self._gcs_silent_since = now
        if now - self._gcs_silent_since >= CLUSTER_LOST_AFTER_S:
            raise self._lose(f"its GCS has not answered for {CLUSTER_LOST_AFTER_S:.0f} s ({self._gcs_error})")
        self._gcs_silent(what)
        return problem

    def _gcs_silent(self, what: str) -> None:
        if self._unavailable is None:
            self._unavailable_since = time.monotonic()
            self._next_probe = self._unavailable_since + PROBE_EVERY_S
        self._unavailable = f"the Ray cluster at {self.address}: {what} ({self._gcs_error})"

    def _probe(self) -> bool:
        """While unavailable: every PROBE_EVERY_S, judge the cluster and ask the binder and the
        dispatcher; once both answer (and the GCS does), recover and schedule again."""
        now = time.monotonic()
        if now < self._next_probe:
            return False
        self._next_probe = now + PROBE_EVERY_S
        if self._judge_cluster() is not None:
            return False
        rs = self.rs
        try:
            b_inc, counts = ray.get(
                [rs.binder.get_incarnation.remote(), rs.dispatcher.counts.remote()], timeout=PROBE_TIMEOUT_S
            )
            if (
                self._needs_recovery
                or b_inc != rs.binder_incarnation
                or counts["incarnation"] != rs.dispatcher_incarnation
            ):
                self._recover()
            for s in sorted(self._requeue):
                ray.get(rs.binder.requeue_shard.remote(s), timeout=PROBE_TIMEOUT_S)
                self._requeue.discard(s)
        except CALL_FAILURES as exc:
            self._unavailable = f"a scheduler component does not answer: {_short(exc)}"
            self._judge_cluster()  # the actors' own bound
            return False
        self._unavailable = None
        self._gcs_silent_since = None
        self._next_gcs_check = time.monotonic() + GCS_CHECK_EVERY_S
        self._wake_shards()
        return True

    def _recover(self) -> None:
        """The binder or the dispatcher restarted (or a shard lost sight of one): let the rounds in
        flight end, reload the dispatcher from the store, rewire. One try; on a failure the next
        probe tries again."""
        self.rs._drain(self._outstanding)
        self._needs_recovery = True
        self.rs._recover(timeout=0.0)
        self._needs_recovery = False
        self._requeue.clear()  # the reload took back every unit in flight
        self._wake_shards()

    # -- scheduling ------------------------------------------------------------------------------------
    def _wake_shards(self) -> None:
        self._next_start = [0.0] * len(self._next_start)
        self._idle_delay = [0.0] * len(self._idle_delay)

    def idle_wait(self) -> float:
        now = time.monotonic()
        if self._unavailable is not None:
            return max(0.0, self._next_probe - now)
        if self._outstanding:  # step() waits for them itself, holding the service's lock: a
            return OUTSTANDING_PAUSE_S  # pause between two such waits lets the API calls in
        return max(0.0, min([*self._next_start, self._next_gcs_check, self._next_gcs_ping]) - now)

    def step(self) -> bool:
        self._check_usable()
        if self._unavailable is not None:
            return self._probe()
        try:
            progressed = self._step()
            now = time.monotonic()
            refused = now >= self._next_gcs_ping and not self._gcs_listens()
            if refused:  # not ready from now on; the GCS is asked next
                self._gcs_silent("its GCS does not accept connections")
            if refused or now >= self._next_gcs_check:
                self._next_gcs_check = now + GCS_CHECK_EVERY_S
                self._judge_cluster()
        except CALL_FAILURES as exc:
            self._note_unavailable(exc)
            return False
        return progressed

    def _step(self) -> bool:
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
        binder_silent: BaseException | None = None
        for ref in ready:
            s = self._outstanding.pop(ref)
            try:
                res = ray.get(ref)
            except RayActorError:
                # Ray restarts the shard; its units go back to the queue, and its next round
                # (after a back-off: it may take a while to come back) resyncs its view.
                rs.counters["shard_restarts"] += 1
                try:
                    ray.get(rs.binder.requeue_shard.remote(s), timeout=PROBE_TIMEOUT_S)
                except CALL_FAILURES as exc:
                    self._requeue.add(s)
                    binder_silent = exc
                delay = min(LOST_SHARD_DELAY_MAX_S, max(0.05, self._lost_delay[s] * 2))
                self._lost_delay[s] = delay
                self._next_start[s] = time.monotonic() + delay
                continue
            self._lost_delay[s] = 0.0
            if "lost" in res or rs._restarted(res):
                lost_control = True
                continue
            if res["idle"]:
                delay = min(IDLE_DELAY_MAX_S, max(IDLE_DELAY_MIN_S, self._idle_delay[s] * 2))
                ready_in = res.get("ready_in")
                if ready_in is not None:  # a parked job's retry is due then: look at once
                    delay = max(IDLE_DELAY_MIN_S, min(delay, ready_in))
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
            self._needs_recovery = True  # done by the next probe if not now
        if binder_silent is not None:
            raise binder_silent
        if lost_control:
            self._recover()
            progressed = True
        return progressed

    def close(self) -> None:
        refs, self._outstanding = list(self._outstanding), {}
        if self._unavailable is None and ray.is_initialized():
            with contextlib.suppress(Exception):  # let the rounds in flight end
                ray.wait(refs, num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
            self.rs.shutdown()
            return
        # A component or the cluster does not answer: no actor to kill (each try could wait on a
        # dead GCS; Ray ends a driver's actors when it leaves). Leave Ray if this scheduler joined
        # it, or if the cluster is lost: Ray's client would end this process once it gives up on
        # the GCS.
        if self.rs._own_ray or self._lost is not None:
            with contextlib.suppress(Exception):
                if self.rs._own_ray:  # Ray's shutdown, then an end to what it left of the session
                    stop_own_ray()
                else:
                    ray.shutdown()

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

    @_answered()
    def drain_latencies(self) -> list[float]:
        out: list[float] = ray.get(self.rs.dispatcher.drain_latencies.remote())
        return out

    # -- task lives -------------------------------------------------------------------------------------
    @_answered()
    def started(self, task_ids: Sequence[str]) -> None:
        ids = list(task_ids)
        ray.get(self.rs.dispatcher.on_started.remote(ids))
        # A task down through a disruption is up once it runs: a preemptor its job's budget held
        # back may go ahead (as on_released's room would let it).
        if ray.get(self.rs.binder.started.remote(ids)):
            ray.get(self.rs.dispatcher.notify_cluster_changed.remote())
            self._resync_shards()

    @_answered()
    def task_attempts(self, task_ids: Sequence[str]) -> dict[str, int]:
        out: dict[str, int] = ray.get(self.rs.dispatcher.task_attempts.remote(list(task_ids)))
        return out

    @_answered()
    def finished(
        self, task_ids: Sequence[str], final: TaskState, reasons: Mapping[str, str] | None = None
    ) -> None:
        # Only the tasks the binder still held: one a batch evicted meanwhile ends as the eviction
        # (the binder's report) says, whatever its run said. A failed task its job runs again
        # (Job.max_retries) leaves its node as a lost one does, after the report's other ends: a
        # gang it breaks then takes none whose failure is final with it.
        again: list[str] = []
        if final is TaskState.FAILED:
            again = ray.get(self.rs.dispatcher.begin_retries.remote(list(task_ids)))
            retried = set(again)
            task_ids = [t for t in task_ids if t not in retried]
        released: list[str] = ray.get(
            self.rs.binder.release.remote(list(task_ids), final.value, dict(reasons or {}))
        )
        aborted: dict[str, list[str]] = ray.get(
            self.rs.dispatcher.on_released.remote(released, final.value, dict(reasons or {}))
        )
        # A gang a failure for good stopped: its other tasks are freed as a cancel's are.
        binder = self.rs.binder
        if aborted:
            ray.get([binder.cancel_job.remote(job_id, holding) for job_id, holding in aborted.items()])
        if again:
            gone: list[str] = ray.get(binder.lose.remote(again))
            ray.get(self.rs.dispatcher.on_retried.remote(again, gone, dict(reasons or {})))
        self._resync_shards()

    @_answered()
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
    @_answered()
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

    @_answered()
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
        # The binder's stats before its usage, which waits for its writer (they run in this order).
        counts, stats, binder, usage = ray.get(
            [d.counts.remote(), d.stats.remote(), b.stats.remote(), b.usage.remote()]
        )
        return Counters(
            **usage,
            active_jobs=counts["active"],
            pending_jobs=counts["pending"],
            in_flight_units=counts["in_flight"],
            rounds=self.rs.counters["rounds"],
            bound_tasks=stats["bound_tasks"],
            binder_conflicts=stats["rejected_units"],
            shards=len(self.rs.shards),
            unwritten_batches=binder["writer_pending"],
            writer_cpu_seconds=binder["writer_busy_s"],
        )

    @_answered()
    def pending_tasks(self) -> int:
        n: int = ray.get(self.rs.dispatcher.pending_task_count.remote())
        return n
