"""Priority with capped aging (Slurm's PriorityMaxAge).

Effective priority at `now` = priority + aging_per_s * min(max(0, now - submit_time), aging_max_s),
ties by seq. Uncapped, a long enough wait outranks any priority; the cap bounds what waiting is
worth (aging_per_s * aging_max_s), so priorities further apart than that keep their order however
long the lower one waits, while nearer ones are still overtaken: nothing close starves.

Re-sorting at every look would cost O(n), so each job sits in the heap of its phase, whose order
does not change with time:
- ageing (submit_time <= now < submit_time + aging_max_s): all age at the same rate, so the static
  key  aging_per_s * submit_time - priority  orders them exactly at every instant;
- frozen: capped, or not started (a submit_time ahead of the clock counts as no wait, not as a
  negative one): constant, so keyed by -effective priority.
The head is the better of the two heads at the clock's `now`. A job changes phase only at its
submit_time and at submit_time + aging_max_s; heaps on those times hand the due jobs over when the
head is next looked for, so every operation stays O(log n). Most jobs arrive in order of both
the ageing key and submit_time, so (as in HeapQueue) each has a sorted run, a deque, in front of its
heap: the common path adds one clock read per head and one deque append per push to the uncapped
queue's cost.

The clock is read when the head is looked for, and by a push whose submit_time is past the last
reading; `pop` right after `peek` takes the entry `peek` showed, as the dispatcher expects. Phases
only move forward: a clock that steps back delays hand-overs, no more. A job the aging put ahead
keeps its effective priority at dispatch against preemption once bound (Unit.standing), while it
preempts with its own priority only: aging protects the jobs it starts, it does not arm them.
"""

import heapq
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from gosched.common.aging import aged_priority
from gosched.dispatcher.queues.base import QueueEntry

# base.E, declared here too: mypy, run on this file alone, cannot follow the editable install's
# import hook, and a generic class needs a type variable it can see.
E = TypeVar("E", bound=QueueEntry)

# (order key, seq, token, entry); tokens are unique, so entries are never compared. A job has one
# live token; a phase change gives it a new one, so its items elsewhere go stale (lazy removal).
_Item = tuple[float, int, int, E]
# (submit_time, token, entry): when a frozen job starts ageing, or an ageing one's cap counts from.
_Timed = tuple[float, int, E]

_SLACK = 2048  # stale items tolerated on top of the live ones before a compaction


class PriorityAgingQueue(Generic[E]):
    """See the module docstring. `aging_per_s == 0` or `aging_max_s == 0`: no aging (priority,
    then seq), and the clock is never read. `aging_max_s` defaults to no cap."""

    __slots__ = (
        "_aging",
        "_aging_max_s",
        "_aging_per_s",
        "_cap_gain",
        "_capping",
        "_check_in",
        "_clock",
        "_due_heap",
        "_due_run",
        "_frozen",
        "_head_item",
        "_head_now",
        "_heap",
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
        # Events that leave stale items (removals, replacements, hand-overs, some pops) before the
        # next look at how many items are held: the common push and pop pay no count.
        self._check_in = _SLACK
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
        return aged_priority(job.priority, job.submit_time, now, self._aging, self._max_age)

    # -- PolicyQueue ------------------------------------------------------------------------------------
    def push_many(self, entries: list[E]) -> None:
        for entry in entries:
            self.push(entry)

    def push(self, entry: E) -> None:
        job_id = entry.job_id
        members = self._members
        token = self._token = self._token + 1
        if job_id in members:
            self._check_in -= 1
        members[job_id] = token
        self._head_item = None
        submit = entry.job.submit_time
        if submit > self._seen and self._aging:  # as a fresh submission is: ahead of the clock?
            self._seen = self._clock()
        self._place(entry, token, submit)
        if self._check_in <= 0:
            self._check()

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
        run = self._run
        if run and run[0] is item:
            run.popleft()
        elif self._heap and self._heap[0] is item:
            heapq.heappop(self._heap)
        else:
            heapq.heappop(self._frozen)
            wake = self._wake
            if wake and wake[0][1] == token:  # taken before its submit_time
                heapq.heappop(wake)
            else:  # capped (nothing left behind) or its wake item is deeper: count it anyway
                self._litter(1)
            return entry
        if self._capping:  # its due item: most often the first (the oldest job went first)
            due_run = self._due_run
            if due_run and due_run[0][1] == token:
                due_run.popleft()
            elif self._due_heap and self._due_heap[0][1] == token:
                heapq.heappop(self._due_heap)
            else:
                self._litter(1)
        return entry

    def remove(self, job_id: str) -> bool:
        if self._members.pop(job_id, None) is None:
            return False
        self._head_item = None
        self._litter(1)
        return True

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._members

    # -- internals ---------------------------------------------------------------------------------------
    def _place(self, entry: E, token: int, submit: float) -> None:
        """Queue the job's items under `token`, in its phase as of the last clock reading."""
        job = entry.job
        aging = self._aging
        if aging:
            seen = self._seen
            if submit > seen:  # not started yet: its own priority until submit_time
                heapq.heappush(self._frozen, (-job.priority, entry.seq, token, entry))
                heapq.heappush(self._wake, (submit, token, entry))
                if submit < self._next_event:
                    self._next_event = submit
                return
            if submit + self._max_age <= seen:  # capped already (a restored or replayed job)
                heapq.heappush(self._frozen, (-(job.priority + self._cap_gain), entry.seq, token, entry))
                return
            item = (aging * submit - job.priority, entry.seq, token, entry)
        else:
            item = (-job.priority, entry.seq, token, entry)
        run = self._run
        if not run or run[-1] < item:  # tokens grow: an equal (key, seq) pushed later sorts after
            run.append(item)
        else:
            heapq.heappush(self._heap, item)
        if self._capping:
            due_run = self._due_run
            if due_run and due_run[-1][0] <= submit:  # _next_event is at most due_run[0]'s time
                due_run.append((submit, token, entry))
            else:
                if due_run:
                    heapq.heappush(self._due_heap, (submit, token, entry))
                else:
                    due_run.append((submit, token, entry))
                due = submit + self._max_age
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
        while heap and members.get(heap[0][3].job_id) != heap[0][2]:
            heapq.heappop(heap)
        while run and members.get(run[0][3].job_id) != run[0][2]:
            run.popleft()
        while frozen and members.get(frozen[0][3].job_id) != frozen[0][2]:
            heapq.heappop(frozen)
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
        moved = 0
        wake = self._wake
        while wake and wake[0][0] <= now:
            submit, token, entry = heapq.heappop(wake)
            if members.get(entry.job_id) == token:
                self._token += 1
                members[entry.job_id] = self._token
                self._place(entry, self._token, submit)
                moved += 1
        if self._capping:
            max_age = self._max_age
            due_run, due_heap = self._due_run, self._due_heap
            capped: list[E] = []
            while due_run and (
                due_run[0][0] + max_age <= now or members.get(due_run[0][2].job_id) != due_run[0][1]
            ):
                _, token, entry = due_run.popleft()
                if members.get(entry.job_id) == token:
                    capped.append(entry)
            while due_heap and (
                due_heap[0][0] + max_age <= now or members.get(due_heap[0][2].job_id) != due_heap[0][1]
            ):
                _, token, entry = heapq.heappop(due_heap)
                if members.get(entry.job_id) == token:
                    capped.append(entry)
            frozen, gain = self._frozen, self._cap_gain
            for entry in capped:
                self._token += 1
                members[entry.job_id] = self._token
                heapq.heappush(frozen, (-(entry.job.priority + gain), entry.seq, self._token, entry))
            moved += len(capped)
        self._reschedule()
        if moved:
            self._litter(moved)

    def _reschedule(self) -> None:
        nxt = self._wake[0][0] if self._wake else math.inf
        if self._due_run:
            nxt = min(nxt, self._due_run[0][0] + self._max_age)
        if self._due_heap:
            nxt = min(nxt, self._due_heap[0][0] + self._max_age)
        self._next_event = nxt

    def _held(self) -> int:
        return (
            len(self._run)
            + len(self._heap)
            + len(self._frozen)
            + len(self._due_run)
            + len(self._due_heap)
            + len(self._wake)
        )

    def _litter(self, events: int) -> None:
        self._check_in -= events
        if self._check_in <= 0:
            self._check()

    def _check(self) -> None:
        """Compact when stale items outnumber the live ones (at most two each) by enough. Each
        event leaves at most two stale items, and the next check comes after as many events as
        there are live jobs, so what is held stays O(live + _SLACK), at O(1) amortised."""
        live = len(self._members)
        if self._held() > 4 * live + _SLACK:
            self._compact()
        self._check_in = max(1, live >> 1, _SLACK >> 1)

    def _compact(self) -> None:
        """Drop every stale item: O(items held), after at least half of them went stale."""
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
        self._reschedule()
