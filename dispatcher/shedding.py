"""Within-queue preemption past max_share: what a held-back job's queue must shed, and whether it can.

A queue with `within_queue_preemption: lower_priority` lets the job its max_share holds back evict
the queue's own lower-priority preemptible tasks to get within it, as Kueue's withinClusterQueue:
LowerPriority and YARN's intra-queue preemption do. The dispatcher sends the job's next unit (its
minimum: the rest of its gang, or one task) with `Unit.shed`, per resource what the queue would be
past its max_share with the unit; the shard must evict at least that much of the queue's tasks of
lower priority on the nodes the unit takes (scheduler_shard/preemption.py), or the unit fails.

Two guards keep this from churning:
- the queue's preemptible tasks of lower priority than the job must hold the shed in every resource
  (counted by job priority: the tasks' aged standing is at least that, so this never refuses a unit
  the shard could place; the shard judges the standing);
- one such unit per queue in flight: the next would count the first's victims as still held and
  pick the same ones on another shard.
"""

import bisect
from collections.abc import Iterable, Sequence
from typing import Final

from gosched.common.config import QueueConfig
from gosched.common.states import HOLDS_RESOURCES
from gosched.dispatcher.records import INFLIGHT, JobRecord

Shed = tuple[int, int, int]
LOWER_PRIORITY: Final = "lower_priority"


class _Lower:
    """A queue's preemptible held usage by job priority, summed from the lowest priority up."""

    __slots__ = ("cumulative", "key", "priorities")

    def __init__(self, key: tuple[int, ...], records: Iterable[JobRecord]) -> None:
        self.key = key
        held: list[tuple[int, int, int, int]] = []
        for rec in records:
            if not rec.n_held or not rec.job.preemptible:
                continue
            idx = tuple(i for i, s in enumerate(rec.states) if s in HOLDS_RESOURCES)
            cpu, mem, gpu = rec.cost_of(idx)
            held.append((rec.job.priority, cpu, mem, gpu))
        held.sort()
        self.priorities = [p for p, *_ in held]
        self.cumulative: list[Shed] = []
        c = m = g = 0
        for _, cpu, mem, gpu in held:
            c, m, g = c + cpu, m + mem, g + gpu
            self.cumulative.append((c, m, g))

    def below(self, priority: int) -> Shed:
        """Usage of the jobs with priority below `priority`."""
        n = bisect.bisect_left(self.priorities, priority)
        return self.cumulative[n - 1] if n else (0, 0, 0)


class QueueShedding:
    __slots__ = ("_in_flight", "_lower", "any_enabled", "enabled", "members", "why")

    def __init__(self, queues: Sequence[QueueConfig]) -> None:
        self.enabled = [q.within_queue_preemption == LOWER_PRIORITY for q in queues]
        self.any_enabled = any(self.enabled)
        # The jobs of each queue that may shed (admit/forget), read again to sum what they hold by
        # priority when the queue's held usage has changed: the queue's jobs, not every job.
        self.members: list[dict[str, JobRecord]] = [{} for _ in queues]
        self._in_flight: list[tuple[JobRecord, int] | None] = [None] * len(queues)
        self._lower: list[_Lower | None] = [None] * len(queues)
        # Per queue: why its held-back head may not shed (for explain), "" when it may or did.
        self.why = [""] * len(queues)

    def shedder(self, qi: int) -> JobRecord | None:
        """The job of queue qi whose shedding unit is in flight, if any."""
        held = self._in_flight[qi]
        if held is None:
            return None
        rec, attempt = held
        if rec.where is INFLIGHT and rec.attempt == attempt:
            return rec
        self._in_flight[qi] = None
        return None

    def shed_for(
        self,
        rec: JobRecord,
        excess: Shed,
        held_key: tuple[int, ...],
    ) -> Shed | None:
        """`excess` (what the queue would be past its max_share with the unit) if the queue's
        lower-priority preemptible tasks hold it and no other unit of the queue sheds now; else
        None, with the reason in `why`. `held_key`: the queue's held usage, which the cached sums
        by priority are good for (read again from the queue's jobs when it changed)."""
        qi = rec.qi
        other = self.shedder(qi)
        if other is not None:
            self.why[qi] = f"job {other.job_id} of the queue is evicting its lower-priority tasks: waiting"
            return None
        lower = self._lower[qi]
        if lower is None or lower.key != held_key:
            lower = self._lower[qi] = _Lower(held_key, self.members[qi].values())
        can = lower.below(rec.job.priority)
        if any(need > have for need, have in zip(excess, can, strict=True)):
            self.why[qi] = "its queue's preemptible tasks of lower priority hold too little to make room"
            return None
        self.why[qi] = ""
        return excess

    def admit(self, recs: Iterable[JobRecord]) -> None:
        """Jobs taken in (submitted, or restored): those of queues that may shed are kept."""
        enabled, members = self.enabled, self.members
        for rec in recs:
            if enabled[rec.qi]:
                members[rec.qi][rec.job_id] = rec

    def forget(self, rec: JobRecord) -> None:
        """A job that has ended."""
        self.members[rec.qi].pop(rec.job_id, None)

    def started(self, rec: JobRecord) -> None:
        """rec's unit, dispatched with a shed, is in flight."""
        self._in_flight[rec.qi] = (rec, rec.attempt)
