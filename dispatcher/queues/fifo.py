"""FIFO: submission order. A requeued job keeps its place (its original sequence number)."""

from operator import attrgetter
from typing import Any

from gosched.dispatcher.queues.base import E, HeapQueue


class FifoQueue(HeapQueue[E]):
    __slots__ = ()
    keys_by = attrgetter("seq")

    def key(self, entry: E) -> Any:
        return entry.seq
