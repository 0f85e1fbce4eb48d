"""Earliest latest start first: the job that must start soonest to end by its deadline (the
deadline less its time_limit, dispatcher/deadlines.start_by) goes first, as least-laxity
scheduling has it, and is the one the deadline check would cancel first. Without a time_limit
that is its deadline (earliest deadline first); at equal latest starts, the earlier deadline.
Jobs without a deadline come after all that have one, by submission."""

import math
from typing import Any

from gosched.dispatcher.deadlines import start_by
from gosched.dispatcher.queues.base import E, HeapQueue


class DeadlineQueue(HeapQueue[E]):
    __slots__ = ()

    def key(self, entry: E) -> Any:
        job = entry.job
        if job.deadline is None:
            return (math.inf, math.inf, entry.seq)
        return (start_by(job), job.deadline, entry.seq)
