"""The components as Ray actors: thin wrappers that call the very same classes as the Pipeline.

    DispatcherCore(settings)             wraps Dispatcher; owns its own Store connection
    BinderCore(store_path, dispatcher)   wraps Binder; owns the Store and the store writer process
    ShardCore(shard_id, profile, dispatcher, binder)    wraps SchedulerShard and runs its loop

The actors are named (`NamedActor`), and a constructor gets the others by name, not by handle: Ray
counts a handle among a restartable actor's constructor arguments as an object-store argument,
which it does not promise to keep for the restarts (ray-project/ray#53727), and logs an error line
for each at every start. A name is a plain string, looked up again at every (re)start.

Messages travel pickled (gosched.common.wire), one message per batch, never one per task. One
shard round (ShardCore.run_once), with its shard planning while the others plan too:

    shard --poll(shard_id)--> dispatcher              a UnitBatch for this shard (or when to ask again)
    shard --commit(ProposalBatch)--> binder           the binder serialises commits (one thread)
    shard <-- BindReply with the changes since its version; apply_reply
          binder's writer process: the batch is durable in the store
          binder --report(BindReply w/o changes, unschedulable)--> dispatcher   (no wait)

The round is pipelined: the shard asks for its next batch before it plans this one, and plans
batch k+1 while the binder commits batch k (whose placements stay assumed in its view), so the
dispatcher, the shard and the binder work at the same time even with one shard.

The binder itself reports each outcome to the dispatcher, so a reply is never lost with a shard
that dies after its commit, and the dispatcher hears of a batch in the Pipeline's order (verdicts,
then the unschedulable). The binder's store writes run in a process of their own
(binder/writer.py), so the binder checks batch k+1 while batch k is written: a shard has its
answer before the batch is durable (a binder that dies then restarts, and every shard resyncs), but
the dispatcher's report, and every other answer the binder gives (what the agents launch, what
the API shows), waits until it is. Calls from one actor to another arrive in the order they were
sent, and BinderCore.requeue_shard (a lost shard's units taken back) waits for every report due
before it, so it reaches the dispatcher after them; the driver flushes the binder before a
dispatcher reload reads the store. A writer that fails or exits ends the binder's process (at once
if the ack thread sees it, else at the next write): Ray restarts it, and it recovers from the
store. An in-memory store (":memory:") has no writer: the binder writes it itself.

Each of the binder and the dispatcher has an incarnation id, new at every (re)start and reload:
the dispatcher ignores reports of a binder incarnation it has not been given (a restarted binder,
before the driver has reloaded the dispatcher from the store), and the ids travel back in the
shards' round results so the driver notices a restart that no call failed on.
"""

import contextlib
import logging
import os
import resource
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import ray
from ray.exceptions import RayActorError

from gosched.binder import queries
from gosched.binder.binder import Binder
from gosched.binder.writer import StoreWriter
from gosched.common import wire
from gosched.common.aging import StandingRule
from gosched.common.config import ProfileConfig, QueueConfig, Settings
from gosched.common.job import Job
from gosched.common.messages import (
    ROW_DISPATCH_TIME,
    BindReply,
    BindReplyRows,
    Change,
    ChangeList,
    ProposalBatch,
    ProposalColumns,
    UnitBatch,
    unpack_proposals,
)
from gosched.common.node import Node, NodeState
from gosched.common.snapshots import Gpus, JobSnapshot, NodeSnapshot
from gosched.common.states import TaskState
from gosched.common.store import Store
from gosched.dispatcher.dispatcher import Dispatcher
from gosched.dispatcher.verdicts import read_verdicts
from gosched.runtime.gc_tuning import tune_gc
from gosched.runtime.packed_changes import PackedChanges, Packer
from gosched.scheduler_shard.shard import SchedulerShard

# BinderCore.commit's answer: (binder incarnation, packed BindReply without its changes, packed
# segments of the changes since the shard's view, the binder's version, resync).
CommitAnswer = tuple[str, bytes, list[bytes], int, bool]

# Actor options: no CPU reservation (the actors must never wait for a CPU slot on a small machine).
ACTOR_CPUS = 0
# The largest call argument or result Ray sends inline, in the gRPC message. Ray's default is
# 100 KiB; anything larger goes through the shared-memory object store (create, seal, a fetch
# through the raylet, a free later). A commit's answer carries every shard's bindings since the
# caller's last view, so with 8 shards nearly every answer passed 100 KiB (280 KB on average, 8
# segments, at batches of 512); through the store each cost about 1.5 ms more of wall time and
# 1-1.4 ms of the raylet's CPU (docs/benchmarks.md, eighteenth session). Ray reads it from each
# process's environment when the process starts: a local Ray started by ray_cluster gets it, and
# a cluster's nodes get it from their `ray start` (deploy/ray-cluster.yaml). Not set per actor
# through runtime_env: a runtime environment that fails to set up marks the actor dead whatever
# its max_restarts, and the binder's and the dispatcher's restarts must not depend on it.
INLINE_BYTES = 8 * 2**20  # under Ray's 10 MiB cap on a call's inlined arguments
INLINE_ENV = "RAY_max_direct_call_object_size"
# Latencies kept for the API's histogram between two scrapes (beyond this, the rest are dropped).
LATENCY_KEEP = 100_000
_TASK_INDEXES = itemgetter(2)  # of an AcceptedRow
_BIND_TIME = itemgetter(3)
# The binder's exit code when its store writer fails: Ray restarts it, and it recovers from the store.
WRITER_FAILED_EXIT = 70
# Store paths SQLite opens as a private in-memory database, one per connection.
IN_MEMORY = ("", ":memory:")

log = logging.getLogger(__name__)


def process_stats(busy_s: float) -> dict[str, float]:
    """This actor process's pid, memory (now and peak, MiB), seconds spent on scheduling work (wall
    clock), and CPU seconds used by the whole process (user + system, Ray's own threads included):
    where cores are shared, busy seconds count the waits for a core too, CPU seconds do not.

    `call_cpu_s` is the CPU of the one thread that runs the actor's calls (Ray runs a synchronous
    actor's calls on one thread, and this is called there): it holds the interpreter's lock for
    the actor's work and for packing and unpacking its calls' arguments and results, so with
    cores to spare it is what one actor can do in a second, while Ray's other threads (its
    gRPC transport and event loops, `cpu_s` less `call_cpu_s`) run beside it."""
    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "pid": os.getpid(),
        "rss_mib": rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20,
        "peak_rss_mib": usage.ru_maxrss / 1024,
        "busy_s": busy_s,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "call_cpu_s": time.thread_time(),
    }


def child_stats(pid: int) -> tuple[float, float, float]:
    """A child process's CPU seconds (user + system), memory now and peak (MiB); zeros once gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
    except (FileNotFoundError, ProcessLookupError):
        return 0.0, 0.0, 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    cpu_s = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14 and 15 of stat)

    def mib(key: str) -> float:
        value = status.get(key, "0 kB").split()
        return int(value[0]) / 1024 if value else 0.0

    return cpu_s, mib("VmRSS"), mib("VmHWM")


@dataclass(frozen=True, slots=True)
class NamedActor:
    """An actor as its name (see the module docstring): what a constructor gets for another actor."""

    name: str
    namespace: str

    def handle(self) -> Any:
        return ray.get_actor(self.name, namespace=self.namespace)


def _handle(actor: Any) -> Any:
    """A handle for `actor`: a NamedActor looked up, anything else (a handle, a stand-in) as it is."""
    return actor.handle() if isinstance(actor, NamedActor) else actor


def _end_binder(why: str) -> None:
    """The store writer failed: this binder's memory is ahead of the store for good. Its process
    ends; Ray starts it again, and the new incarnation recovers from the store."""
    log.critical("ending the binder's process: %s", why)
    logging.shutdown()
    os._exit(WRITER_FAILED_EXIT)


class DispatcherCore:
    """The dispatcher actor's body (a plain class: see make_actor_classes)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.binder: Any = None
        self.binder_incarnation = ""
        self.first_dispatch = 0.0
        self.last_bind = 0.0
        self.bound_tasks = 0
        self.rejected_units = 0
        self.stale_reports = 0
        self.latencies: list[float] = []  # dispatch -> bind seconds per task, drained by the API
        self.wait_latencies: list[float] = []  # submission -> bind seconds per task (benchmarks)
        self.busy_s = 0.0  # time in next_batch and report: the dispatcher's share of scheduling
        self._build()

    def _build(self) -> None:
        self.store = Store(self.settings.store_path)
        self.dispatcher = Dispatcher(self.settings, store=self.store)
        self.dispatcher.timings = []  # per unit bound, turned into latencies when drained
        self.restored = self.dispatcher.restore()
        self.incarnation = uuid.uuid4().hex
        tune_gc()

    def reload(self, binder: Any, binder_incarnation: str) -> str:
        """Rebuild the dispatcher from the store (after a binder restart, or its own), and take
        reports from this binder incarnation only. Returns the dispatcher's new incarnation."""
        # Not yet told: the new dispatcher reads these jobs from the store as cancelled, and never
        # would; so with the gangs the old one (its restore at this actor's start) stopped.
        cancels = self.dispatcher.take_deadline_cancels()
        aborted = self.dispatcher.take_aborted()
        self.store.close()
        self._build()
        self.binder = binder
        self.binder_incarnation = binder_incarnation
        if cancels:
            binder.note_cancelled.remote(cancels)
        for job_id, holding in aborted.items():
            binder.cancel_job.remote(job_id, holding)
        self._send_deadline_cancels()  # and the gangs the new one's restore found failed
        return self.incarnation

    def _send_deadline_cancels(self) -> None:
        """Tell the binder of the jobs a deadline cancelled (a lost shard's commit of theirs is
        refused), and of the gangs a restore found failed (their held tasks to free, as a cancel's);
        kept while there is no binder yet (after a restart of this actor, before reload). Without
        waiting for its answer: the binder calls into this actor (requeue_shard)."""
        if self.binder is not None:
            cancels = self.dispatcher.take_deadline_cancels()
            if cancels:
                self.binder.note_cancelled.remote(cancels)
            for job_id, holding in self.dispatcher.take_aborted().items():
                self.binder.cancel_job.remote(job_id, holding)

    def ping(self) -> str:
        """Answered once every call sent to this actor before it by the same caller has run."""
        return self.incarnation

    def set_binder(self, binder: Any, binder_incarnation: str) -> str:
        self.binder = binder
        self.binder_incarnation = binder_incarnation
        return self.incarnation

    def set_nodes(self, nodes: Sequence[Node], totals: dict[str, int]) -> list[list[str]]:
        """Nodes for the partitions and the cluster total; returns each shard's partition."""
        parts = self.dispatcher.partitions
        parts.add_nodes(nodes)
        self.dispatcher.set_cluster_capacity(totals["cpu"], totals["memory"], totals["gpu"])
        return [parts.partition_of(s) for s in range(self.settings.shards)]

    def partition_of(self, shard_id: int) -> list[str]:
        return self.dispatcher.partitions.partition_of(shard_id)

    def submit_many(self, jobs: Sequence[Job]) -> list[str]:
        return self.dispatcher.submit_many(jobs)

    def next_batch(self, shard_id: int) -> tuple[str, bytes | None]:
        """(incarnation, encoded UnitBatch for `shard_id` or None when nothing is ready)."""
        t0 = time.perf_counter()
        try:
            return self._next_batch(shard_id)
        finally:
            self.busy_s += time.perf_counter() - t0

    def poll(self, shard_id: int) -> tuple[str, bytes | None, float | None]:
        """next_batch for a shard's round, and with no batch the seconds until the earliest parked
        job's backoff (or periodic retry) ends, if any: the driver asks an idle shard again then at
        the latest, not on a fixed short period (a submission or a cluster change wakes it anyway)."""
        incarnation, data = self.next_batch(shard_id)
        return incarnation, data, None if data is not None else self._ready_in()

    def _ready_in(self) -> float | None:
        d = self.dispatcher
        # Heaps of (time, token, record); next_batch has just popped every entry already due.
        heads = [heap[0][0] for heap in (getattr(d, "_parked", ()), getattr(d, "_dormant", ())) if heap]
        return max(0.0, min(heads) - d.clock()) if heads else None

    def _next_batch(self, shard_id: int) -> tuple[str, bytes | None]:
        d = self.dispatcher
        loads = [0 if s == shard_id else 1 << 40 for s in range(d.partitions.shards)]
        batches = d.next_batch_rows(loads, max_units=self.settings.batch_size)
        self._send_deadline_cancels()
        mine = [b for b in batches if b.shard_id == shard_id]
        if not mine:
            return self.incarnation, None
        if not self.first_dispatch:
            self.first_dispatch = mine[0].rows[0][ROW_DISPATCH_TIME]
        return self.incarnation, wire.pack(mine[0])

    def report(self, reply_data: bytes, unschedulable_data: bytes, binder_incarnation: str) -> None:
        """A batch's outcome, from the binder: verdicts first, then the shard's unschedulable."""
        if binder_incarnation != self.binder_incarnation:
            self.stale_reports += 1
            return
        t0 = time.perf_counter()
        try:
            self._report(reply_data, unschedulable_data)
        finally:
            self.busy_s += time.perf_counter() - t0

    def _report(self, reply_data: bytes, unschedulable_data: bytes) -> None:
        reply = read_verdicts(reply_data)  # the accepted units as rows: no object made per unit
        orphaned = self.dispatcher.on_verdicts(reply)
        if orphaned and self.binder is not None:  # bound for a job cancelled while in flight
            self.binder.release.remote(orphaned, TaskState.CANCELLED.value)
        unschedulable = wire.unpack(unschedulable_data)
        assert isinstance(unschedulable, list)
        if unschedulable:
            self.dispatcher.on_unschedulable(unschedulable)
        if reply.rejected:
            accepted = {row[0] for row in reply.accepted}
            self.rejected_units += len({r.job_id for r in reply.rejected} - accepted)
        if reply.accepted:  # the counts by C maps; the latencies wait in the timings until drained
            self.bound_tasks += sum(map(len, map(_TASK_INDEXES, reply.accepted)))
            self.last_bind = max(self.last_bind, *map(_BIND_TIME, reply.accepted))
            timings = self.dispatcher.timings
            if timings is not None and len(timings) > LATENCY_KEEP:
                del timings[LATENCY_KEEP:]

    def _take_timings(self) -> None:
        """Turn the dispatcher's timings into per-task latencies (each list kept to LATENCY_KEEP)."""
        timings = self.dispatcher.timings
        if not timings:
            return
        latencies, waits = self.latencies, self.wait_latencies
        for dispatched, submitted, bound, n in timings:
            if len(latencies) < LATENCY_KEEP:
                latencies.extend([bound - dispatched] * n)
            if len(waits) < LATENCY_KEEP:
                waits.extend([bound - submitted] * n)
        timings.clear()

    def requeue_in_flight(self, shard_id: int, binder_incarnation: str) -> int:
        if binder_incarnation != self.binder_incarnation:
            return 0
        return self.dispatcher.requeue_in_flight(shard_id)

    def counts(self) -> dict[str, Any]:
        d = self.dispatcher
        return {
            "incarnation": self.incarnation,
            "pending": d.pending_count(),
            "waiting": d.waiting_count(),
            "in_flight": d.in_flight_count(),
            "active": d.active_count(),
        }

    def job_state(self, job_id: str) -> str:
        return self.dispatcher.job_state(job_id).value

    def task_state_counts(self, job_ids: Sequence[str]) -> dict[str, int]:
        """How many tasks of these jobs are in each state."""
        out: dict[str, int] = {}
        for job_id in job_ids:
            for s in self.dispatcher.task_states(job_id):
                out[s.value] = out.get(s.value, 0) + 1
        return out

    def task_states(self, job_id: str) -> list[str]:
        return [s.value for s in self.dispatcher.task_states(job_id)]

    def explain(self, job_id: str) -> str:
        return self.dispatcher.explain(job_id)

    # -- for the API (runtime/ray_control.py) ----------------------------------------------------------
    def snapshots(self, job_ids: Sequence[str]) -> list[JobSnapshot | None]:
        return self.dispatcher.snapshots(job_ids)

    def job_ids(self) -> list[str]:
        return self.dispatcher.job_ids()

    def cancel(self, job_id: str) -> list[str]:
        """Cancel; returns the tasks that held resources (the caller frees them at the binder)."""
        return self.dispatcher.cancel(job_id)

    def task_attempts(self, task_ids: Sequence[str]) -> dict[str, int]:
        return self.store.task_attempts(task_ids)

    def on_started(self, task_ids: Sequence[str]) -> list[str]:
        return self.dispatcher.on_started(task_ids)

    def on_released(
        self, task_ids: Sequence[str], final_state: str, reasons: Mapping[str, str] | None = None
    ) -> dict[str, list[str]]:
        return self.dispatcher.on_released(task_ids, TaskState(final_state), reasons)

    def begin_retries(self, task_ids: Sequence[str]) -> list[str]:
        return self.dispatcher.begin_retries(task_ids)

    def on_retried(
        self, retried: Sequence[str], released: Sequence[str], reasons: Mapping[str, str] | None = None
    ) -> None:
        self.dispatcher.on_retried(retried, released, reasons)

    def notify_cluster_changed(self) -> None:
        self.dispatcher.notify_cluster_changed()

    def queue_shares(self) -> dict[str, float]:
        return self.dispatcher.queue_shares()

    def pending_task_count(self) -> int:
        return self.dispatcher.pending_task_count()

    def drain_latencies(self) -> list[float]:
        self._take_timings()
        out, self.latencies = self.latencies, []
        return out

    def drain_wait_latencies(self) -> list[float]:
        self._take_timings()
        out, self.wait_latencies = self.wait_latencies, []
        return out

    def process_stats(self) -> dict[str, float]:
        return process_stats(self.busy_s)

    def stats(self) -> dict[str, Any]:
        return {
            "first_dispatch": self.first_dispatch,
            "last_bind": self.last_bind,
            "bound_tasks": self.bound_tasks,
            "rejected_units": self.rejected_units,
            "stale_reports": self.stale_reports,
            "restored_jobs": self.restored,
        }


class BinderCore:
    """The binder actor's body: recovers from the store at every (re)start (after the writer of
    the last incarnation is done), and answers nobody but the shards before a batch is durable."""

    def __init__(
        self,
        store_path: str,
        dispatcher: Any,
        *,
        queues: Sequence[QueueConfig] = (),
        on_writer_failure: Callable[[str], None] | None = _end_binder,
    ) -> None:
        """`queues`: Settings.queues, whose aging gives a recovered task its standing back.
        `on_writer_failure`: what a failed writer does beyond making every later call fail. In
        the actor, the process ends so that Ray restarts it from the store; a binder used in
        another process (the benchmarks) passes None."""
        # An in-memory store is this process's alone: no other process could write it.
        self.writer = (
            None if store_path in IN_MEMORY else StoreWriter(store_path, on_failure=on_writer_failure)
        )
        try:
            self.store = Store(store_path)
            self.binder = Binder(self.store, writer=self.writer, standing=StandingRule(queues) or None)
        except BaseException:
            if self.writer is not None:
                self.writer.close()
            raise
        self.dispatcher = _handle(dispatcher)
        self.incarnation = uuid.uuid4().hex
        self.commits = 0
        self.busy_s = 0.0  # time in commit and changes_since
        # One kept Pickler per kind of message (all packed in this thread): a memo table keeps the
        # size its kind grows it to, and is cleared whole after each message, so an empty list
        # must not clear the table a change segment grew.
        self._pack_verdicts = Packer().pack
        self._pack_unschedulable = Packer().pack
        self.packed = PackedChanges(Packer())
        self.reply_bytes = 0  # commits' answers, verdicts and segments: see INLINE_BYTES
        self.largest_reply = 0
        tune_gc()

    def get_incarnation(self) -> str:
        return self.incarnation

    def add_nodes(self, nodes: Sequence[Node]) -> int:
        return self.binder.add_nodes(nodes)

    def cluster(self) -> tuple[list[Node], dict[str, int]]:
        """The live nodes and the cluster totals (for the dispatcher's partitions and capacity)."""
        return self.binder.snapshot_nodes(), self.binder.state.totals()

    def commit(self, batch_data: bytes) -> CommitAnswer:
        """Commit a shard's ProposalBatch; report the outcome to the dispatcher; answer the shard
        with the same packed verdicts and the packed segments of changes since its view."""
        t0 = time.perf_counter()
        batch = unpack_proposals(batch_data)
        # The usual batch is bound from its columns; any other is made into its objects first.
        reply = self.binder.commit_columns(batch) if isinstance(batch, ProposalColumns) else None
        if reply is None:
            planned = batch.batch() if isinstance(batch, ProposalColumns) else batch
            reply = self.binder.commit(planned, with_changes=False, rows_only=True)  # changes: as segments
        self.commits += 1
        as_rows = self.binder.last_bound  # this commit's, when the fast path took it whole
        if as_rows is not None:
            verdicts = self._pack_verdicts(
                BindReplyRows(as_rows.accepted, reply.rejected, reply.evicted, reply.version, reply.shard_id)
            )
        else:
            verdicts = self._pack_verdicts(
                BindReply(
                    reply.accepted, reply.rejected, reply.evicted, [], reply.version, shard_id=reply.shard_id
                )
            )
        unschedulable = self._pack_unschedulable(batch.unschedulable)
        report = self.dispatcher.report.remote
        incarnation = self.incarnation
        if self.writer is None:
            report(verdicts, unschedulable, incarnation)
        else:
            self.writer.after_durable(lambda: report(verdicts, unschedulable, incarnation))
        segments, version, resync = self.packed.since(self.binder, batch.seen_version)
        size = len(verdicts) + sum(map(len, segments))
        self.reply_bytes += size
        self.largest_reply = max(self.largest_reply, size)
        self.busy_s += time.perf_counter() - t0
        return self.incarnation, verdicts, segments, version, resync

    def requeue_shard(self, shard_id: int) -> int:
        """A shard is lost: the dispatcher takes back its units, after every report sent before."""
        self.flush()
        return int(ray.get(self.dispatcher.requeue_in_flight.remote(shard_id, self.incarnation)))

    def changes_since(self, version: int) -> bytes:
        t0 = time.perf_counter()
        changes, current, resync = self.binder.changes_since(version)
        out = wire.pack((ChangeList(changes), current, resync))
        self.busy_s += time.perf_counter() - t0
        return out

    def process_stats(self) -> dict[str, float]:
        """This process's figures, its store writer's CPU and memory included (peak: the sum of
        the two processes' peaks, an upper bound of their joint peak)."""
        stats = process_stats(self.busy_s)
        if self.writer is None or not self.writer.alive:
            return stats
        cpu_s, rss_mib, peak_mib = child_stats(self.writer.pid)
        stats["cpu_s"] += cpu_s
        stats["writer_cpu_s"] = cpu_s
        # The thread that takes the writer's acks and sends the dispatcher its reports holds the
        # interpreter's lock for them, one at a time with the call thread.
        stats["acks_cpu_s"] = self.writer.ack_thread_cpu_s()
        stats["rss_mib"] += rss_mib
        stats["peak_rss_mib"] += peak_mib
        return stats

    def release(
        self, task_ids: Sequence[str], reason: str, why: Mapping[str, str] | None = None
    ) -> list[str]:
        return self.binder.release(task_ids, reason, why)

    def cancel_job(self, job_id: str, holding: Sequence[str]) -> list[str]:
        return self.binder.cancel_job(job_id, holding)

    def note_cancelled(self, job_ids: Sequence[str]) -> None:
        self.binder.note_cancelled(job_ids)

    def resident_node(self, tid: str) -> str | None:
        got = self._durable().resident(tid)
        return None if got is None else got[0]

    def resident_ids(self) -> list[str]:
        """Every task id resident on a node (one entry per residence: a duplicate is a bug)."""
        return [tid for per_node in self._durable().state.residents for tid in per_node]

    def stats(self) -> dict[str, Any]:
        return {
            "version": self.binder.version,
            "commits": self.commits,
            "reply_bytes": self.reply_bytes,
            "largest_reply": self.largest_reply,
            "incarnation": self.incarnation,
            "writer_pid": None if self.writer is None else self.writer.pid,
            "writer_busy_s": 0.0 if self.writer is None else self.writer.busy_s,
            "writer_pending": 0 if self.writer is None else self.writer.pending,
        }

    def reset_largest_reply(self) -> None:
        """Count the largest reply from here (a benchmark's measured phase, not its warm-up)."""
        self.largest_reply = 0

    def flush(self) -> None:
        """Return once every batch committed so far is durable and its report sent."""
        if self.writer is not None:
            self.writer.drain()

    def settle(self) -> None:
        """Return once every batch committed so far is durable and its report has been taken by
        the dispatcher (calls from one actor run in the order sent): before a dispatcher reload,
        which the driver sends, reads the store."""
        self.flush()
        ray.get(self.dispatcher.ping.remote())

    def close(self) -> None:
        """Let the writer finish, and close the store (for a binder used outside an actor)."""
        if self.writer is not None:
            self.writer.close()
        self.store.close()

    def _durable(self) -> Binder:
        """The binder, once every batch it committed is durable: what it tells beyond the shards
        (what runs where, for the agents and the API) must survive its crash."""
        self.flush()
        return self.binder

    # -- for the API (runtime/ray_control.py) ----------------------------------------------------------
    def nodes(self, names: Sequence[str] | None) -> list[NodeSnapshot]:
        return queries.node_snapshots(self._durable(), names)

    def residents(self, names: Sequence[str]) -> dict[str, list[str]]:
        return queries.residents_of(self._durable(), names)

    def resident_runs(self, names: Sequence[str]) -> dict[str, dict[str, float]]:
        return queries.resident_runs(self._durable(), names)

    def misfits(self, names: Sequence[str]) -> list[str]:
        return queries.misfits(self._durable(), names)

    def placements(self, task_ids: Sequence[str]) -> dict[str, tuple[str, Gpus]]:
        return queries.placements_of(self._durable(), task_ids)

    def usage(self) -> dict[str, int]:
        return queries.cluster_usage(self._durable())

    def set_node_state(self, name: str, state: str) -> int:
        return self.binder.set_node_state(name, NodeState(state))

    def lose(self, task_ids: Sequence[str]) -> list[str]:
        return self.binder.lose(task_ids)

    def started(self, task_ids: Sequence[str]) -> bool:
        return self.binder.started(task_ids)

    def remove_node(self, name: str) -> list[str]:
        return self.binder.remove_node(name)

    def node_lost(self, name: str) -> list[str]:
        """Mark the node not ready and release its residents as lost (gangs broken whole)."""
        self.binder.set_node_state(name, NodeState.NOT_READY)
        return self.binder.lose(queries.residents_of(self.binder, [name])[name])


class ShardCore:
    """A shard actor's body. A (re)started shard resyncs its view from the binder before planning."""

    def __init__(self, shard_id: int, profile: ProfileConfig, dispatcher: Any, binder: Any) -> None:
        self.shard_id = shard_id
        self.profile = profile
        self.dispatcher = _handle(dispatcher)
        self.binder = _handle(binder)
        self.shard = SchedulerShard(shard_id, profile)
        self.ready = False
        self.rounds = 0
        self.busy_s = 0.0  # planning and applying replies, not the wait for the binder
        self._next_ref: Any = None  # the next UnitBatch, asked for while this one is planned
        self._pending: tuple[ProposalBatch, Any] | None = None  # the commit in flight
        self._binder_lost = False  # a sync() found the binder gone: the next round says so

    def reset(self, partition: Sequence[str] | None) -> int:
        """Drop the view and every assumption, resync from the binder; returns the version. A commit
        or a batch in flight is forgotten: the full resync below shows whatever the binder did with
        it, and the driver has the dispatcher take back the units it had handed out."""
        self._next_ref = self._pending = None
        self.shard = SchedulerShard(self.shard_id, self.profile)
        self.shard.set_partition(partition)
        changes, version, resync = _decode_changes(ray.get(self.binder.changes_since.remote(0)))
        self.shard.sync(changes, version, resync)
        self.ready = True
        tune_gc()
        return version

    def set_partition(self, partition: Sequence[str] | None) -> None:
        self.shard.set_partition(partition)

    def sync(self) -> int:
        """Bring the view up to the binder's version now (as a reply would); returns it."""
        settled = self.settle()
        if settled is not None and "lost" in settled:
            self._binder_lost = True
            return self.shard.version
        data = ray.get(self.binder.changes_since.remote(self.shard.version))
        changes, version, resync = _decode_changes(data)
        self.shard.sync(changes, version, resync)
        return version

    def run_once(self) -> dict[str, Any]:
        """One round, pipelined: take the batch asked for during the last round (or ask now), ask for
        the next one, plan this one while the binder still commits the last one, then apply that
        reply and send this commit. The shard's view keeps every unanswered plan as an assumption,
        so the two batches never book the same room. Never raises for a lost peer:
        {"lost": "dispatcher" | "binder"} tells the driver to recover."""
        if self._binder_lost:  # noticed by a sync() between rounds
            self._binder_lost = False
            return {"lost": "binder"}
        try:
            if not self.ready:
                self.reset(ray.get(self.dispatcher.partition_of.remote(self.shard_id)))
            ref, self._next_ref = self._next_ref, None
            if ref is None:
                ref = self.dispatcher.poll.remote(self.shard_id)
            d_inc, data, ready_in = ray.get(ref)
        except RayActorError:
            return {"lost": "dispatcher"}
        if data is None:
            if self._pending is None:
                return {"idle": True, "dispatcher": d_inc, "ready_in": ready_in}
            res = self._finish_commit()
            res["dispatcher"] = d_inc
            return res
        self._next_ref = self.dispatcher.poll.remote(self.shard_id)
        t0 = time.perf_counter()
        batch = wire.unpack(data)
        assert isinstance(batch, UnitBatch)
        planned = self.shard.schedule(batch)
        self.busy_s += time.perf_counter() - t0
        try:
            res = self._finish_commit() if self._pending is not None else {"idle": False, "bound": 0}
        except BaseException:
            self._drop_assumptions(planned)
            raise
        if "lost" in res:
            self._drop_assumptions(planned)
            return res
        self._send_commit(planned)
        res.update(
            dispatcher=d_inc,
            units=len(batch.units),
            proposals=len(planned.proposals),
            unschedulable=len(planned.unschedulable),
        )
        return res

    def _send_commit(self, planned: ProposalBatch) -> None:
        # The reply carries the changes after the version the view has when the commit leaves (the
        # last reply applied), not when the batch was planned: no change is applied twice.
        t0 = time.perf_counter()
        planned.seen_version = self.shard.version
        self._pending = (planned, self.binder.commit.remote(wire.pack(planned)))
        self.busy_s += time.perf_counter() - t0

    def _finish_commit(self) -> dict[str, Any]:
        """Wait for the commit in flight and apply its reply."""
        assert self._pending is not None
        planned, ref = self._pending
        self._pending = None
        try:
            b_inc, verdicts, segments, version, resync = ray.get(ref)
        except RayActorError:
            self._drop_assumptions(planned)
            return {"lost": "binder"}
        except BaseException:  # the binder failed this commit: its verdicts are unknown
            self._drop_assumptions(planned)
            raise
        t0 = time.perf_counter()
        reply = wire.unpack(verdicts)
        assert isinstance(reply, BindReply)
        for segment in segments:
            changes = wire.unpack(segment)
            assert isinstance(changes, list)
            reply.changes.extend(changes)
        reply.version, reply.resync = version, resync
        self.shard.apply_reply(reply)
        self.busy_s += time.perf_counter() - t0
        self.rounds += 1
        bound = sum(len(a.task_indexes) for a in reply.accepted)
        return {
            "idle": False,
            "binder": b_inc,
            "bound": bound,
            "units": 0,
            "proposals": 0,
            "unschedulable": 0,
        }

    def _drop_assumptions(self, planned: ProposalBatch) -> None:
        """The verdicts are unknown (the binder is lost): drop the plan's assumptions."""
        for p in planned.proposals:
            ctx = self.shard.inflight.pop(p.job.id, None)
            if ctx is not None:
                ctx.undo(self.shard.state)

    def process(self, data: bytes) -> dict[str, Any]:
        """Plan a packed UnitBatch, commit it and apply the reply, unpipelined (for tests that
        stage a race between shards)."""
        self.settle()
        batch = wire.unpack(data)
        assert isinstance(batch, UnitBatch)
        planned = self.shard.schedule(batch)
        self._send_commit(planned)
        res = self._finish_commit()
        res.update(units=len(batch.units), proposals=len(planned.proposals))
        res["unschedulable"] = len(planned.unschedulable)
        return res

    def quiesce(self) -> None:
        """Wait for every call this shard has out (the prefetched batch, the commit) and forget
        them; the driver calls it before it reloads the dispatcher, then resets the shard."""
        calls = [c for c in (self._next_ref, self._pending[1] if self._pending else None) if c]
        self._next_ref = self._pending = None
        for call in calls:
            with contextlib.suppress(Exception):  # a lost peer: nothing more will land
                ray.get(call)

    def settle(self) -> dict[str, Any] | None:
        """Finish the commit in flight, if any (before a sync, or when asked)."""
        return self._finish_commit() if self._pending is not None else None

    def inflight_count(self) -> int:
        return len(self.shard.inflight)

    def process_stats(self) -> dict[str, float]:
        return process_stats(self.busy_s)


def _decode_changes(data: bytes) -> tuple[list[Change], int, bool]:
    """BinderCore.changes_since's answer: (changes, version, resync)."""
    decoded = wire.unpack(data)
    assert isinstance(decoded, tuple) and len(decoded) == 3
    changes, version, resync = decoded
    return list(changes), int(version), bool(resync)


def actor_options() -> dict[str, Any]:
    """ray.remote's options for every actor of the control plane."""
    return {"num_cpus": ACTOR_CPUS, "max_restarts": -1}


def make_actor_classes() -> tuple[Any, Any, Any]:
    """The Ray actor classes (dispatcher, binder, shard). Shards and the binder restart without
    limit; every actor is created with num_cpus=0 so that none waits for a CPU slot."""
    options = actor_options()
    dispatcher = ray.remote(**options)(DispatcherCore)
    binder = ray.remote(**options)(BinderCore)
    shard = ray.remote(**options)(ShardCore)
    return dispatcher, binder, shard
