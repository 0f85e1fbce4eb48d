"""Priority aging (the priority queue policy; Slurm's PriorityMaxAge) and the standing it gives a
bound task. The dispatcher orders its priority queues by it and stamps a unit's standing with it
at dispatch (Unit.standing); the binder gives a recovered task its standing back from the store's
bound_at, which no column keeps."""

import math
from collections.abc import Sequence

from gosched.common.config import QueueConfig, QueuePolicy
from gosched.common.job import Job


def aged_priority(priority: int, submit_time: float, now: float, per_s: float, max_s: float) -> float:
    """Effective priority at `now`: `priority` plus `per_s` for each second waited since
    `submit_time`, `max_s` of them at most. A submit time ahead of the clock counts as no wait."""
    return priority + per_s * min(max(0.0, now - submit_time), max_s)


def standing_from(priority: int, aged: float) -> int | None:
    """Unit.standing of a job of `priority` aged to `aged`: None where aging added no whole step
    (rounded down, not toward zero: -1 aged to -0.9 has gained none)."""
    whole = math.floor(aged)
    return whole if whole > priority else None


class StandingRule:
    """The standing a task of each aging queue kept from its dispatch, told again from the moment
    it was bound: the binder's bound_at, a scheduling latency after the dispatch, may count up to
    aging_per_s times that latency more, and no more than the queue's cap allows."""

    __slots__ = ("_aging",)

    def __init__(self, queues: Sequence[QueueConfig]) -> None:
        self._aging = {
            q.name: (q.aging_per_s, q.aging_max_s)
            for q in queues
            if q.policy is QueuePolicy.PRIORITY and q.aging_per_s > 0 and q.aging_max_s > 0
        }

    def __bool__(self) -> bool:
        return bool(self._aging)

    def __call__(self, job: Job, bound_at: float) -> int | None:
        aging = self._aging.get(job.queue)
        if aging is None:
            return None
        return standing_from(job.priority, aged_priority(job.priority, job.submit_time, bound_at, *aging))
