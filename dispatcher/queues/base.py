"""What every queue policy offers, and a lazily-deleting heap that most of them are built on.

A queue holds entries (the dispatcher's per-job records); each policy decides which comes next.
Entries are removed lazily: `remove` forgets the job at once and the heap drops the stale item
when it surfaces, so every operation is O(log n).
"""

import heapq
from typing import Any, Generic, Protocol, TypeVar

from gosched.common.job import Job


class QueueEntry(Protocol):
    """What a policy reads from an entry: the job and its submission sequence number."""

    @property
    def job_id(self) -> str: ...

    @property
    def job(self) -> Job: ...

    @property
    def seq(self) -> int: ...


E = TypeVar("E", bound=QueueEntry)


class PolicyQueue(Protocol[E]):
    """The one interface of every queue policy."""

    def push(self, entry: E) -> None:
        """Add an entry; a job already present is replaced."""

    def peek(self) -> E | None:
        """The entry `pop` would return, or None when empty."""

    def pop(self) -> E | None:
        """Take the next entry in policy order, or None when empty."""

    def remove(self, job_id: str) -> bool:
        """Forget the job's entry; False when it was not queued."""

    def __len__(self) -> int: ...

    def __contains__(self, job_id: object) -> bool: ...


class HeapQueue(Generic[E]):
    """A min-heap on `key(entry)` with lazy removal; subclasses define `key`."""

    __slots__ = ("_heap", "_members", "_stale", "_token")

    def __init__(self) -> None:
        # items: (key, token, entry); the token is unique, so entries are never compared.
        self._heap: list[tuple[Any, int, E]] = []
        self._members: dict[str, int] = {}  # job id -> token of its live heap item
        self._token = 0
        self._stale = 0

    def key(self, entry: E) -> Any:
        raise NotImplementedError

    def push(self, entry: E) -> None:
        self._token += 1
        if self._members.get(entry.job_id) is not None:
            self._stale += 1
        self._members[entry.job_id] = self._token
        heapq.heappush(self._heap, (self.key(entry), self._token, entry))

    def peek(self) -> E | None:
        heap, members = self._heap, self._members
        while heap:
            _, token, entry = heap[0]
            if members.get(entry.job_id) == token:
                return entry
            heapq.heappop(heap)
            self._stale -= 1
        return None

    def pop(self) -> E | None:
        entry = self.peek()
        if entry is not None:
            heapq.heappop(self._heap)
            del self._members[entry.job_id]
        return entry

    def remove(self, job_id: str) -> bool:
        if self._members.pop(job_id, None) is None:
            return False
        self._stale += 1
        if self._stale > 1024 and self._stale > 2 * len(self._members):
            self._compact()
        return True

    def _compact(self) -> None:
        members = self._members
        self._heap = [item for item in self._heap if members.get(item[2].job_id) == item[1]]
        heapq.heapify(self._heap)
        self._stale = 0

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._members
