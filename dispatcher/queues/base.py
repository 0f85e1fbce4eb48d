"""What every queue policy offers, and a lazily-deleting heap that most of them are built on.

A queue holds entries (the dispatcher's per-job records); each policy decides which comes next.
Entries are removed lazily: `remove` forgets the job at once and the heap drops the stale item
when it surfaces, so every operation is O(log n).

Most entries arrive in policy order (jobs are submitted in sequence; FIFO's key is that
sequence): an entry whose key is not below the last one's goes to a sorted run, a deque taken
from the left in O(1), and only entries that arrive out of order (a retry of an older job, a
higher priority) go to the heap. The next entry is the smaller of the two heads.
"""

import heapq
import operator
from bisect import bisect_left
from collections import deque
from itertools import islice, repeat, starmap
from typing import Any, ClassVar, Generic, Protocol, TypeVar

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
_JOB_ID = operator.attrgetter("job_id")
_ENTRY = operator.itemgetter(2)


class PolicyQueue(Protocol[E]):
    """The one interface of every queue policy."""

    def push(self, entry: E) -> None:
        """Add an entry; a job already present is replaced."""

    def push_many(self, entries: list[E]) -> None:
        """push each entry, in order."""

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

    __slots__ = ("_head_item", "_heap", "_members", "_run", "_stale", "_token")

    def __init__(self) -> None:
        # items: (key, token, entry); the token is unique, so entries are never compared.
        self._heap: list[tuple[Any, int, E]] = []
        self._run: deque[tuple[Any, int, E]] = deque()  # items pushed in ascending order
        self._members: dict[str, int] = {}  # job id -> token of its live item
        self._token = 0
        self._stale = 0
        # The live head item _head found, until the queue changes: the dispatcher peeks, then pops
        # the same entry, and the second look would only find it again.
        self._head_item: tuple[Any, int, E] | None = None

    # `key` as a C getter, where there is one: push_many reads every entry's key with it.
    keys_by: ClassVar["operator.attrgetter[Any] | None"] = None

    def key(self, entry: E) -> Any:
        raise NotImplementedError

    def push(self, entry: E) -> None:
        self._token += 1
        if self._members.get(entry.job_id) is not None:
            self._stale += 1
        self._members[entry.job_id] = self._token
        self._head_item = None
        item = (self.key(entry), self._token, entry)
        run = self._run
        if not run or run[-1][0] <= item[0]:  # equal keys: the newer token sorts after
            run.append(item)
        else:
            heapq.heappush(self._heap, item)

    def push_many(self, entries: list[E]) -> None:
        """push each entry in order. The usual case, new jobs whose keys ascend from the run's
        last (a submission's jobs in a FIFO queue), is done by C maps: their items go to the run
        at once. Anything else goes entry by entry."""
        members = self._members
        ids = list(map(_JOB_ID, entries))
        keys = list(map(self.keys_by or self.key, entries))
        run = self._run
        if (
            not keys
            or any(map(members.__contains__, ids))
            or (run and not run[-1][0] <= keys[0])
            or not all(map(operator.le, keys, keys[1:]))
        ):
            for entry in entries:
                self.push(entry)
            return
        tokens = range(self._token + 1, self._token + 1 + len(entries))
        self._token += len(entries)
        members.update(zip(ids, tokens, strict=True))
        self._head_item = None
        run.extend(zip(keys, tokens, entries, strict=True))

    def _head(self) -> tuple[Any, int, E] | None:
        """The next live item (stale ones at either head are dropped on the way), or None."""
        if self._head_item is not None:
            return self._head_item
        heap, run, members = self._heap, self._run, self._members
        while heap and members.get(heap[0][2].job_id) != heap[0][1]:
            heapq.heappop(heap)
            self._stale -= 1
        while run and members.get(run[0][2].job_id) != run[0][1]:
            run.popleft()
            self._stale -= 1
        if heap and (not run or heap[0] < run[0]):  # unique tokens: the entries are never compared
            item = heap[0]
        elif run:
            item = run[0]
        else:
            return None
        self._head_item = item
        return item

    def peek(self) -> E | None:
        item = self._head_item  # _head's first step, here: a call fewer per unit dispatched
        if item is None:
            item = self._head()
            if item is None:
                return None
        return item[2]

    def pop(self) -> E | None:
        item = self._head_item  # set by the peek that usually comes just before
        if item is None:
            item = self._head()
            if item is None:
                return None
        if self._run and self._run[0] is item:
            self._run.popleft()
        else:
            heapq.heappop(self._heap)
        self._head_item = None
        entry = item[2]
        del self._members[entry.job_id]
        return entry

    def head_run(self, limit: int) -> list[E]:
        """The next entries, up to `limit`, that as many pops would return if the queue did not
        change meanwhile: the run's head, while no heap item comes first. The dispatcher reads them
        and pops those it takes with drop_run, not one peek and pop each (a third of its work per
        unit). Empty where the next entry is the heap's, or stale items may lie between them (there
        it peeks and pops one by one)."""
        if self._stale:
            return []
        items = list(islice(self._run, limit))
        heap = self._heap
        if heap and items:
            # The run ascends; its items before the heap's head come first. Unique tokens: two
            # items never compare their entries.
            del items[bisect_left(items, heap[0]) :]
        return list(map(_ENTRY, items))

    def drop_run(self, entries: list[E]) -> None:
        """Pop `entries`: the first of what head_run returned, the queue unchanged since."""
        run, members = self._run, self._members
        if len(entries) == len(run):
            run.clear()
        else:
            deque(starmap(run.popleft, repeat((), len(entries))), 0)  # popleft, per entry, in C
        deque(map(members.__delitem__, map(_JOB_ID, entries)), 0)
        self._head_item = None

    def remove(self, job_id: str) -> bool:
        if self._members.pop(job_id, None) is None:
            return False
        self._head_item = None
        self._stale += 1
        if self._stale > 1024 and self._stale > 2 * len(self._members):
            self._compact()
        return True

    def _compact(self) -> None:
        self._head_item = None
        members = self._members
        self._heap = [item for item in self._heap if members.get(item[2].job_id) == item[1]]
        heapq.heapify(self._heap)
        self._run = deque(item for item in self._run if members.get(item[2].job_id) == item[1])
        self._stale = 0

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._members
