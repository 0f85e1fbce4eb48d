"""Priority with capped aging (Slurm's PriorityMaxAge).

Effective priority at `now` = priority + aging_per_s * min(max(0, now - submit_time), aging_max_s).
Uncapped, an old enough job at any priority outranks every other: the cap bounds what waiting is
worth (aging_per_s * aging_max_s), so priorities far enough apart keep their order however long
the lower one waits, while nearer ones are still overtaken and nothing close starves.

Re-sorting at every look would cost O(n), so each job is kept in the heap of its phase, whose
order does not change with time:
- ageing (submit_time <= now < submit_time + aging_max_s): these all age at the same rate, so the
  static key  aging_per_s * submit_time - priority  orders them exactly at every instant;
- frozen: capped (priority + aging_per_s * aging_max_s) or not yet started (a submit_time ahead of
  the clock counts as no wait, not as a negative one): constant, so keyed by -effective priority.
The head is the better of the two heads, compared at the clock's `now`. A job changes phase only
at its submit_time and at submit_time + aging_max_s; heaps on those times hand over the due jobs
when the head is next looked for, so every operation is O(log n). Jobs mostly arrive in order of
both keys, so, as in HeapQueue, each has a sorted run (a deque, O(1)) in front of its heap; the
uncapped path costs one clock read per head, and an append per push.

The clock is read only when the head is looked for (and by a push whose submit_time is past the
last reading): `pop` right after `peek` takes the entry `peek` showed, as the dispatcher expects.
Phases only move forward: a clock stepping back delays the hand-overs, no more. Aging orders the
queue only: preemption compares the jobs' own priorities (as Kubernetes does), so a bound
low-priority task can still be evicted by a higher-priority job.
"""

import heapq
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from gosched.dispatcher.queues.base import QueueEntry

# base.E, declared here too: mypy, run on this file alone, cannot follow the editable install's
# import hook, and a generic class needs a type variable it can see.
E = TypeVar("E", bound=QueueEntry)

# (order key, seq, token, entry); tokens are unique, so entries are never compared. A job has one
# live token; a phase change gives it a new one, so its items elsewhere go stale (lazy removal).
_Item = tuple[float, int, int, E]
# (submit_time, token, entry): when a frozen job starts ageing, or an ageing one's cap counts from.
_Timed = tuple[float, int, E]

_SLACK = 2048  # garbage items tolerated on top of the live ones before a compaction


class PriorityAgingQueue(Generic[E]):
    """See the module docstring. `aging_per_s == 0` or `aging_max_s == 0`: no aging (priority,
    then seq), and the clock is never read. `aging_max_s` defaults to no cap."""

    __slots__ = (
        "_aging",
        "_aging_max_s",
        "_aging_per_s",
        "_cap_gain",
        "_capping",
        "_clock",
        "_due_heap",
        "_due_run",
        "_frozen",
        "_head_item",
        "_head_now",
        "_heap",
        "_items",
        "_max_age",
        "_members",
        "_next_event",
        "_run",
        "_seen",
        "_token",
        "_wake",
    )

    def __init__(
        self,
        aging_per_s: float,
        aging_max_s: float = math.inf,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0.0 <= aging_per_s < math.inf:
            raise ValueError(f"aging_per_s must be finite and >= 0, got {aging_per_s}")
        if not aging_max_s >= 0.0:
            raise ValueError(f"aging_max_s must be >= 0, got {aging_max_s}")
        self._aging_per_s = aging_per_s
        self._aging_max_s = aging_max_s
        # Normalised: _aging 0 means no aging at all, and then _max_age is inf (no hand-overs).
        self._aging = aging_per_s if aging_max_s > 0.0 else 0.0
        self._max_age = aging_max_s if self._aging else math.inf
        self._capping = self._max_age < math.inf
        self._cap_gain = self._aging * self._max_age if self._capping else 0.0
        self._clock = clock
        self._members: dict[str, int] = {}  # job id -> token of its live items
        self._token = 0
        self._run: deque[_Item[E]] = deque()  # ageing, pushed in key order
        self._heap: list[_Item[E]] = []  # ageing, the others
        self._frozen: list[_Item[E]] = []  # capped or not yet started: key -effective priority
        self._due_run: deque[_Timed[E]] = deque()  # ageing, by submit_time, pushed in order
        self._due_heap: list[_Timed[E]] = []  # ageing, by submit_time, the others
        self._wake: list[_Timed[E]] = []  # not yet started, by submit_time
        self._next_event = math.inf  # no hand-over is due before this (a lower bound)
        self._seen = -math.inf  # the last clock reading
        self._items = 0  # items in all the containers above, live or stale
        # The head _find found (and the time it was found for), until the queue changes.
        self._head_item: _Item[E] | None = None
        self._head_now = -math.inf

    @property
    def aging_per_s(self) -> float:
        return self._aging_per_s

    @property
    def aging_max_s(self) -> float:
        return self._aging_max_s

    def effective_priority(self, entry: E, now: float) -> float:
        job = entry.job
        return job.priority + self._aging * min(max(0.0, now - job.submit_time), self._max_age)

    # -- PolicyQueue ------------------------------------------------------------------------------------
    def push(self, entry: E) -> None:
        job_id = entry.job_id
        self._token += 1
        token = self._token
        replaced = self._members.get(job_id) is not None
        self._members[job_id] = token
        self._head_item = None
        if not self._aging:
            self._add_ageing((-entry.job.priority, entry.seq, token, entry))
            self._items += 1
        else:
            submit = entry.job.submit_time
            if submit > self._seen:  # as a fresh submission is: is it ahead of the clock?
                self._seen = self._clock()
                if submit > self._seen:
                    heapq.heappush(self._frozen, (-entry.job.priority, entry.seq, token, entry))
                    heapq.heappush(self._wake, (submit, token, entry))
                    self._items += 2
                    if submit < self._next_event:
                        self._next_event = submit
                    return
            self._start_ageing(entry, token, submit)
        if replaced and self._items > (len(self._members) << 2) + _SLACK:
            self._compact()

    def peek(self) -> E | None:
        if self._aging:
            now = self._clock()
            item = self._head_item
            if item is None or now != self._head_now:
                item = self._find(now)
        else:
            item = self._head_item or self._find(0.0)
        return None if item is None else item[3]

    def pop(self) -> E | None:
        item = self._head_item  # set by the peek that usually comes just before
        if item is None:
            item = self._find(self._clock() if self._aging else 0.0)
            if item is None:
                return None
        self._head_item = None
        token, entry = item[2], item[3]
        del self._members[entry.job_id]
        self._items -= 1
        left = False  # whether the job leaves an item behind (its due or wake time)
        run, heap = self._run, self._heap
        if run and run[0] is item:
            run.popleft()
            left = self._capping
        elif heap and heap[0] is item:
            heapq.heappop(heap)
            left = self._capping
        else:
            heapq.heappop(self._frozen)
            wake = self._wake
            if wake and wake[0][1] == token:  # taken before its submit_time
                heapq.heappop(wake)
                self._items -= 1
            elif self._items > (len(self._members) << 2) + _SLACK:
                self._compact()
        if left:  # its due item is most often the first (the oldest job went first): drop it now
            due_run, due_heap = self._due_run, self._due_heap
            if due_run and due_run[0][1] == token:
                due_run.popleft()
                self._items -= 1
            elif due_heap and due_heap[0][1] == token:
                heapq.heappop(due_heap)
                self._items -= 1
            elif self._items > (len(self._members) << 2) + _SLACK:
                self._compact()
        return entry

    def remove(self, job_id: str) -> bool:
        if self._members.pop(job_id, None) is None:
            return False
        self._head_item = None
        if self._items > (len(self._members) << 2) + _SLACK:
            self._compact()
        return True

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._members

    # -- internals ---------------------------------------------------------------------------------------
    def _add_ageing(self, item: _Item[E]) -> None:
        run = self._run
        if not run or run[-1] < item:  # tokens grow: an equal (key, seq) pushed later sorts after
            run.append(item)
        else:
            heapq.heappush(self._heap, item)

    def _start_ageing(self, entry: E, token: int, submit: float) -> None:
        """Queue a job whose submit_time has come, as of the last clock reading."""
        max_age = self._max_age
        due = submit + max_age
        if due <= self._seen:  # waited past the cap already (a restored or replayed job)
            item = (-(entry.job.priority + self._cap_gain), entry.seq, token, entry)
            heapq.heappush(self._frozen, item)
            self._items += 1
            return
        self._add_ageing((self._aging * submit - entry.job.priority, entry.seq, token, entry))
        if not self._capping:
            self._items += 1
            return
        due_run = self._due_run
        if not due_run or due_run[-1][0] <= submit:
            due_run.append((submit, token, entry))
        else:
            heapq.heappush(self._due_heap, (submit, token, entry))
        self._items += 2
        if due < self._next_event:
            self._next_event = due

    def _find(self, now: float) -> _Item[E] | None:
        """The next live item at `now` (hand-overs due by then done, stale heads dropped)."""
        aging = self._aging
        if aging:
            self._seen = now
            if now >= self._next_event:
                self._hand_over(now)
        members = self._members
        heap, run, frozen = self._heap, self._run, self._frozen
        items = self._items
        while heap and members.get(heap[0][3].job_id) != heap[0][2]:
            heapq.heappop(heap)
            items -= 1
        while run and members.get(run[0][3].job_id) != run[0][2]:
            run.popleft()
            items -= 1
        while frozen and members.get(frozen[0][3].job_id) != frozen[0][2]:
            heapq.heappop(frozen)
            items -= 1
        self._items = items
        item: _Item[E] | None
        if heap and (not run or heap[0] < run[0]):
            item = heap[0]
        elif run:
            item = run[0]
        else:
            item = None
        if frozen:
            top = frozen[0]
            if item is None:
                item = top
            else:
                key = item[0] - aging * now  # -effective priority of the ageing head
                if top[0] < key or (top[0] == key and top[1] < item[1]):
                    item = top
        self._head_item = item
        self._head_now = now
        return item

    def _hand_over(self, now: float) -> None:
        """Move the jobs whose submit_time has come to the ageing heap, and those that reached the
        cap to the frozen one; each gets a new token, so the item it leaves behind goes stale."""
        members = self._members
        wake = self._wake
        while wake and wake[0][0] <= now:
            submit, token, entry = heapq.heappop(wake)
            self._items -= 1
            if members.get(entry.job_id) == token:
                self._token += 1
                members[entry.job_id] = self._token
                self._start_ageing(entry, self._token, submit)
        max_age = self._max_age
        due_run, due_heap = self._due_run, self._due_heap
        if self._capping:
            frozen, gain = self._frozen, self._cap_gain
            capped: list[E] = []
            while due_run and (
                due_run[0][0] + max_age <= now or members.get(due_run[0][2].job_id) != due_run[0][1]
            ):
                _, token, entry = due_run.popleft()
                self._items -= 1
                if members.get(entry.job_id) == token:
                    capped.append(entry)
            while due_heap and (
                due_heap[0][0] + max_age <= now or members.get(due_heap[0][2].job_id) != due_heap[0][1]
            ):
                _, token, entry = heapq.heappop(due_heap)
                self._items -= 1
                if members.get(entry.job_id) == token:
                    capped.append(entry)
            for entry in capped:
                self._token += 1
                members[entry.job_id] = self._token
                heapq.heappush(frozen, (-(entry.job.priority + gain), entry.seq, self._token, entry))
            self._items += len(capped)
        self._reschedule()

    def _reschedule(self) -> None:
        nxt = self._wake[0][0] if self._wake else math.inf
        if self._due_run:
            nxt = min(nxt, self._due_run[0][0] + self._max_age)
        if self._due_heap:
            nxt = min(nxt, self._due_heap[0][0] + self._max_age)
        self._next_event = nxt

    def _compact(self) -> None:
        """Drop every stale item: O(items), after at least as many went stale."""
        members = self._members
        self._head_item = None
        self._run = deque(it for it in self._run if members.get(it[3].job_id) == it[2])
        self._heap = [it for it in self._heap if members.get(it[3].job_id) == it[2]]
        self._frozen = [it for it in self._frozen if members.get(it[3].job_id) == it[2]]
        self._due_run = deque(t for t in self._due_run if members.get(t[2].job_id) == t[1])
        self._due_heap = [t for t in self._due_heap if members.get(t[2].job_id) == t[1]]
        self._wake = [t for t in self._wake if members.get(t[2].job_id) == t[1]]
        heapq.heapify(self._heap)
        heapq.heapify(self._frozen)
        heapq.heapify(self._due_heap)
        heapq.heapify(self._wake)
        self._items = (
            len(self._run)
            + len(self._heap)
            + len(self._frozen)
            + len(self._due_run)
            + len(self._due_heap)
            + len(self._wake)
        )
        self._reschedule()
