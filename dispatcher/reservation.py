"""Head-of-line reservations: a job starved by the jobs behind it gets its queue's room kept for it.

In a queue ordered by the jobs alone (fifo, priority, deadline), a job that needs more room than
is ever free at once (a gang, an 8-GPU task) would wait for ever: every slot that frees goes to a
smaller job behind it, which fits. Slurm's backfill keeps a reservation for the job at the top;
it lets a job behind it start only if it ends before the reservation starts, which needs run-time
limits, and our jobs declare none. So a reservation here holds the whole queue: once a job has
waited `reserve_after_s` and a shard said it fits nowhere only because nodes are busy, the jobs
behind it in its queue are not dispatched until it starts; the room its queue frees stays free
for it. Jobs ahead of it in queue order (an older retry, a higher priority) still go first.

A reservation gathers only what the queue's own tasks free, so it is taken (and kept) only while
that can cover the job: what the queue holds plus the room nobody holds must reach the job's
minimum, in every resource. A gang bigger than the cluster, or a queue whose room other queues
borrow, would otherwise hold its queue and gain nothing.

One reservation per queue. It ends when the job holds its gang (min_member tasks), ends, is
cancelled, or is told it fits nowhere for a reason that no ending task would change (a node too
small, a selector); and for good when it still fits nowhere once its queue holds nothing more to
free (the shards judge a gang with its own first tasks placed, so they say "insufficient" even of
an idle cluster too small for it): a job that can never run does not hold its queue for ever.
"""

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from gosched.common.config import QueueConfig
from gosched.common.messages import BUSY_REASON_PREFIX, GANG_APART_REASON, Diagnosis
from gosched.dispatcher.records import QUEUED, JobRecord


def room_may_come(diagnosis: Diagnosis | None) -> bool:
    """Whether some node was ruled out only by what runs on it now."""
    if diagnosis is None:
        return False
    return any(
        reason.startswith(BUSY_REASON_PREFIX) or reason == GANG_APART_REASON for reason in diagnosis.ruled_out
    )


class Reservations:
    """The reservation of each queue (see the module docstring), by queue index."""

    __slots__ = ("after", "futile", "held")

    def __init__(self, queues: Sequence[QueueConfig], ordered: Sequence[bool]) -> None:
        # Only queues ordered by the jobs alone reserve: a tenant-fair queue's order moves with usage.
        self.after: list[float | None] = [
            q.reserve_after_s if is_ordered else None for q, is_ordered in zip(queues, ordered, strict=True)
        ]
        self.held: list[JobRecord | None] = [None] * len(queues)
        # Jobs whose reservation proved futile (module docstring): they do not take one again.
        self.futile: set[str] = set()

    def on_unschedulable(
        self, rec: JobRecord, diagnosis: Diagnosis | None, now: float, room: "RoomCheck"
    ) -> None:
        """A unit of `rec` fit nowhere: it may take its queue's reservation, or lose it. `room`
        tells whether the queue's held tasks and the unheld room could cover the job, and whether
        the queue holds anything at all."""
        qi = rec.qi
        after = self.after[qi]
        if after is None:
            return
        held = self.held[qi]
        busy = room_may_come(diagnosis)
        if held is rec:
            if not room.queue_holds(rec):
                self.futile.add(rec.job_id)  # nothing of its queue left to free, and still no fit
                self.held[qi] = None
            elif not busy or not room.could_cover(rec):
                self.held[qi] = None  # waiting would not help it: free the queue
            return
        if (
            held is None
            and busy
            and now - rec.job.submit_time >= after
            and not starting(rec)
            and rec.job_id not in self.futile
            and room.could_cover(rec)
        ):
            self.held[qi] = rec

    def current(self, qi: int, live: Mapping[str, JobRecord]) -> JobRecord | None:
        """The queue's reservation holder, if its reservation still stands (dropped otherwise)."""
        rec = self.held[qi]
        if rec is None:
            return None
        if rec.cancelled or starting(rec) or live.get(rec.job_id) is not rec:
            self.held[qi] = None
            self.futile.discard(rec.job_id)
            return None
        return rec

    def holding(self, live: Mapping[str, JobRecord]) -> list[JobRecord | None]:
        """Per queue: the job whose reservation holds the queue now (it waits outside the queue:
        backing off, dormant or in flight), else None. Reservations that have ended are dropped."""
        out: list[JobRecord | None] = [None] * len(self.held)
        for qi in range(len(self.held)):
            rec = self.current(qi, live)
            if rec is not None and rec.where is not QUEUED:
                out[qi] = rec
        return out

    def release(self, rec: JobRecord) -> None:
        """`rec` waits out a failed task's backoff: it gives up its queue's reservation, if it holds
        it (the queue must not wait on a job that cannot start before its backoff ends)."""
        if self.held[rec.qi] is rec:
            self.held[rec.qi] = None

    def forget(self, job_id: str) -> None:
        """The job has ended: drop what is kept of it."""
        self.futile.discard(job_id)

    def note(self, rec: JobRecord, now: float, live: Mapping[str, JobRecord], queue: Any) -> str:
        """For explain: the reservation that holds `rec` back, or that `rec` holds."""
        holder = self.current(rec.qi, live)
        if holder is None or (holder is not rec and ahead(queue, rec, holder, now)):
            return ""
        waited = now - holder.job.submit_time
        if holder is rec:
            return (
                f"holds queue {rec.queue}'s reservation (waited {waited:.0f}s; the room it needs is "
                "busy): the jobs behind it wait until it starts"
            )
        return (
            f"queued behind job {holder.job_id}, which holds queue {rec.queue}'s reservation "
            f"(waited {waited:.0f}s for room that is busy); the jobs behind it wait until it starts"
        )


def ahead(queue: Any, rec: JobRecord, holder: JobRecord, now: float) -> bool:
    """Whether `queue` orders `rec` before `holder` now (a job that may pass a reservation)."""
    effective = getattr(queue, "effective_priority", None)
    if effective is not None:  # priority with aging: the heap's key is not the order at `now`
        return (-effective(rec, now), rec.seq) < (-effective(holder, now), holder.seq)
    return bool(queue.key(rec) < queue.key(holder))


class RoomCheck(Protocol):
    """What the dispatcher tells a reservation of usage (dispatcher.py implements it)."""

    def could_cover(self, rec: JobRecord) -> bool:
        """Whether what `rec`'s queue holds plus the room nobody holds reach its minimum."""
        ...

    def queue_holds(self, rec: JobRecord) -> bool:
        """Whether `rec`'s queue holds anything (whose end the reservation could gather)."""
        ...


def starting(rec: JobRecord) -> bool:
    """Whether the job needs no reservation any more: its gang is held, or nothing is pending."""
    return not rec.n_pending or rec.n_held >= rec.job.min_member
