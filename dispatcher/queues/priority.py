"""Priority with aging: effective priority = priority + aging_per_s * seconds waited.

Every waiting job ages at the same rate, so ordering by effective priority at any instant `now`,
    priority + aging * (now - submit_time),
is the same as ordering by the static key  aging * submit_time - priority  (smallest first).
A heap on that key is exact at every instant, and an old low-priority job overtakes a newer
high-priority one once it has waited (priority difference / aging) seconds longer: nothing starves
in the queue. Aging orders the queue only: preemption compares the jobs' own priorities (as
Kubernetes does), so a bound low-priority task can still be evicted by a higher-priority job.
"""

from typing import Any

from gosched.dispatcher.queues.base import E, HeapQueue


class PriorityAgingQueue(HeapQueue[E]):
    __slots__ = ("aging_per_s",)

    def __init__(self, aging_per_s: float) -> None:
        super().__init__()
        if aging_per_s < 0:
            raise ValueError(f"aging_per_s must be >= 0, got {aging_per_s}")
        self.aging_per_s = aging_per_s

    def key(self, entry: E) -> Any:
        job = entry.job
        return (self.aging_per_s * job.submit_time - job.priority, entry.seq)

    def effective_priority(self, entry: E, now: float) -> float:
        job = entry.job
        return job.priority + self.aging_per_s * max(0.0, now - job.submit_time)
