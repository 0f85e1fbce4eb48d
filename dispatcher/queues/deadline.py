"""Earliest deadline first; jobs without a deadline come after all that have one, by submission."""

import math
from typing import Any

from gosched.dispatcher.queues.base import E, HeapQueue


class DeadlineQueue(HeapQueue[E]):
    __slots__ = ()

    def key(self, entry: E) -> Any:
        deadline = entry.job.deadline
        return (math.inf if deadline is None else deadline, entry.seq)
