"""Victim search for one task: on each node, the fewest, least important victims that make it fit.

Per node (as kube-scheduler does): remove every eligible victim, check the task fits, then reprieve
victims from the most important down while it still fits. A victim set is priced (Pricer) with
the gangs it breaks, and refused if it breaks a disruption budget or takes a queue below its
guarantee floor; then the search runs once more with the victims those rules protect reprieved
first (kube-scheduler reprieves its PDB-violating pods first). A node a unit filter excludes only
for tasks on it (anti-affinity, `ClearedByEviction`) is searched too, with those tasks victims
the reprieve never lets back. The candidate nodes are ordered by the profile's CandidateSorting
plugins. A victim evicted by an earlier proposal of this shard is already gone from the view, so
it is never claimed twice; across shards the binder checks.
"""

from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Protocol, runtime_checkable

import numpy as np

from gosched.common.cluster_state import ClusterArrays, Resident
from gosched.common.messages import Floor, floor_kept
from gosched.common.resources import GPU_MILLI, ResourceRequest
from gosched.scheduler_shard.class_cache import ClassEntry, passes_dynamic_filters
from gosched.scheduler_shard.framework.interfaces import Candidate, Mask, VictimSearchingPlugin
from gosched.scheduler_shard.framework.profile import Profile
from gosched.scheduler_shard.framework.task_class import TaskClass
from gosched.scheduler_shard.gpu_assign import choose_gpus
from gosched.scheduler_shard.in_flight import InFlightPlans
from gosched.scheduler_shard.plugins.preemption import PricedCandidate, quota_of
from gosched.scheduler_shard.unit_context import EVICT, PLACE, UnitContext


def fits_row(entry: ClassEntry, state: ClusterArrays, row: int) -> bool:
    """The class's dynamic filters on one row, then whether its GPUs can be assigned there."""
    return passes_dynamic_filters(entry, state, row) and choose_gpus(entry.tc, state, row) is not None


Use = list[int]  # tasks, cpu milli, memory, gpu milli
_NONE: frozenset[str] = frozenset()


def _add(acc: Use, r: Resident) -> None:
    acc[0] += 1
    acc[1] += r.cpu_milli
    acc[2] += r.memory
    acc[3] += sum(m for _, m in r.gpus)


class ViewCensus:
    """Tasks and usage per job and per queue over a whole view, kept up to date from the view's
    dirty log: a look counts again only the rows changed since the last one (a full count when
    the log was compacted past it, or for a new view)."""

    __slots__ = ("jobs", "position", "queues", "rows", "state")

    def __init__(self, state: ClusterArrays) -> None:
        self.state = state
        self.position = -1
        self.rows: dict[int, tuple[dict[str, Use], dict[str, Use]]] = {}  # each row's share
        self.jobs: dict[str, Use] = {}
        self.queues: dict[str, Use] = {}

    def refresh(self) -> None:
        state = self.state
        changed, position = state.dirty_since(self.position) if self.position >= 0 else ([], -1)
        if position < 0:
            self.rows.clear()
            self.jobs.clear()
            self.queues.clear()
            changed, position = list(range(state.n)), state.dirty_position
        for row in set(changed):
            self._recount(row)
        self.position = position

    def _recount(self, row: int) -> None:
        old = self.rows.pop(row, None)
        if old is not None:
            _merge(self.jobs, old[0], -1)
            _merge(self.queues, old[1], -1)
        residents = self.state.residents[row] if row < len(self.state.residents) else {}
        if not residents:
            return
        jobs: dict[str, Use] = {}
        queues: dict[str, Use] = {}
        for r in residents.values():
            _count(jobs, r.job_id, r)
            _count(queues, r.queue, r)
        self.rows[row] = (jobs, queues)
        _merge(self.jobs, jobs, 1)
        _merge(self.queues, queues, 1)


def _count(table: dict[str, Use], key: str, r: Resident) -> None:
    use = table.get(key)
    if use is None:
        use = table[key] = [0, 0, 0, 0]
    _add(use, r)


def _merge(total: dict[str, Use], part: dict[str, Use], sign: int) -> None:
    for key, use in part.items():
        acc = total.get(key)
        if acc is None:
            acc = total[key] = [0, 0, 0, 0]
        for i in range(4):
            acc[i] += sign * use[i]
        if not acc[0]:
            del total[key]


# One ViewCensus per view (shards in one process each have theirs); the view itself is the key's
# check, as an id() alone may be reused by a later object.
_VIEWS: dict[int, ViewCensus] = {}
MAX_VIEWS = 64


def view_census(state: ClusterArrays) -> ViewCensus:
    view = _VIEWS.get(id(state))
    if view is None or view.state is not state:
        if len(_VIEWS) >= MAX_VIEWS:
            _VIEWS.clear()
        view = _VIEWS[id(state)] = ViewCensus(state)
    view.refresh()
    return view


class Census:
    """Tasks and usage per job and per queue in the view as it was before the unit's own
    evictions: what a gang break takes, and what a queue holds against its floor. The view's
    counts (ViewCensus, brought up to date once per unit) with the unit's evictions put back."""

    __slots__ = ("_back_jobs", "_back_queues", "_view", "seen")

    def __init__(self, state: ClusterArrays, ctx: UnitContext) -> None:
        self._view = view_census(state)
        self.seen = len(ctx.log)  # the unit's steps counted in the view (later ones are not)
        self._back_jobs: dict[str, Use] = {}
        self._back_queues: dict[str, Use] = {}
        own = ctx.unit.job.id
        for action, _, r in ctx.log:
            if action == EVICT and r.job_id != own and r.task_id not in state.task_row:
                _count(self._back_jobs, r.job_id, r)  # evicted by the unit already: put back
                _count(self._back_queues, r.queue, r)

    def job(self, job_id: str) -> Use | None:
        return _sum(self._view.jobs.get(job_id), self._back_jobs.get(job_id))

    def queue(self, name: str) -> Use | None:
        return _sum(self._view.queues.get(name), self._back_queues.get(name))

    def queue_names(self) -> AbstractSet[str]:
        """The queues holding tasks."""
        return self._view.queues.keys() | self._back_queues.keys()


def _sum(a: Use | None, b: Use | None) -> Use | None:
    if a is None or b is None:
        return a if b is None else list(b)
    return [x + y for x, y in zip(a, b, strict=True)]


class Pricer:
    """Judges victim sets for one task of a unit, counting with the unit's earlier victims:

    - a victim whose job would fall below its min_member takes every bound task of the job with
      it (the binder breaks the gang), and that is what the eviction costs;
    - a job's disruption_budget bounds its tasks down at once: those down already (evicted or
      lost, not running since: ClusterArrays.down_tasks) and those the unit takes, gang breaks
      included (a victim down already, bound again and not yet running, takes none more);
    - a task of another queue with a floor (quota_of) is a victim only while its queue keeps
      the floor in some resource, gang breaks included: no preemption takes a queue below its
      guarantee, whoever preempts and whatever the priority;
    - a task of the unit's own queue is no other queue's loss: its guarantee protects it from
      other queues' preemptors, not from its own higher-priority jobs. Only the swap itself is
      judged: the victims the task displaces, traded for the task (and the unit's tasks placed
      before it), must leave the queue its floor in some resource, unless it was below already
      or no other queue borrows: a queue that traded itself below its guarantee (a CPU task for
      a GPU one) would then reclaim from the borrowers, whose higher-priority tasks preempt it
      back, for ever; with none borrowing there is nothing to reclaim, and priority decides. The
      rest of a gang the victims break is not counted there: that is the gang's all-or-nothing
      rule, not a trade, and the gang requeued whole cannot reclaim (the queue with it back and
      the task in would be past its floor again).
    """

    __slots__ = (
        "_borrowed",
        "_taken",
        "adds",
        "coming_back",
        "ctx",
        "done",
        "floors",
        "own_job",
        "own_queue",
        "plans",
        "refused",
        "state",
    )

    def __init__(
        self,
        state: ClusterArrays,
        ctx: UnitContext,
        request: ResourceRequest | None = None,
        plans: InFlightPlans | None = None,
    ) -> None:
        self.state, self.ctx = state, ctx
        self.plans = plans  # this shard's other units still awaiting the binder
        # A budget refused an eviction on a count a plan in flight may change (it evicts one of the
        # job's tasks, or places one down again): the refusal holds only until that plan's answer.
        self.coming_back = False
        job = ctx.unit.job
        self.own_job, self.own_queue = job.id, job.queue
        self.floors = quota_of(ctx.unit).floors
        # What the task being placed adds to its queue (cpu, memory, GPU milli).
        self.adds = (
            (0, 0, 0) if request is None else (request.cpu_milli, request.memory, request.gpu_total_milli)
        )
        self.done: dict[str, list[Resident]] = {}  # the unit's victims so far, by job
        for action, _, r in ctx.log:
            if action == EVICT and r.job_id != self.own_job:
                self.done.setdefault(r.job_id, []).append(r)
        self._taken: dict[str, Use] | None = None
        self._borrowed: bool | None = None  # another queue borrows (others_borrow), once asked
        self.refused = ""  # the rule the last refused price() broke, as explain tells it

    def floored(self, r: Resident) -> bool:
        """`r`'s queue has a guarantee floor in this unit's view."""
        return r.queue in self.floors

    def simple(self, r: Resident) -> bool:
        """Evicting `r` costs just `r` and breaks no rule: no budget, no gang, no floor."""
        return r.disruption_budget is None and r.min_member <= 1 and not self.floored(r)

    def ruled(self, r: Resident) -> bool:
        """A rule (its job's disruption budget, its queue's floor) may refuse evicting `r`."""
        return r.disruption_budget is not None or self.floored(r)

    def census(self) -> Census:
        if self.ctx.census is None:
            self.ctx.census = Census(self.state, self.ctx)
        return self.ctx.census

    def _removed(self, first: Resident, direct: list[Resident]) -> Use:
        """What the job of `first` loses with `direct` evicted: them, or all of it if they break
        its gang."""
        acc = [0, 0, 0, 0]
        for v in direct:
            _add(acc, v)
        if first.min_member > 1 and direct:
            whole = self.census().job(first.job_id)
            if whole is not None and whole[0] - acc[0] < first.min_member:
                return list(whole)
        return acc

    def _placed_since(self) -> tuple[int, int, int]:
        cpu = mem = gpu = 0
        for action, _, r in self.ctx.log[self.census().seen :]:
            if action == PLACE:
                cpu, mem, gpu = cpu + r.cpu_milli, mem + r.memory, gpu + sum(m for _, m in r.gpus)
        return cpu, mem, gpu

    def _taken_before(self, queue: str) -> Use:
        if self._taken is None:
            self._taken = {}
            for vs in self.done.values():
                first = vs[0]
                if self.floored(first):
                    acc = self._taken.setdefault(first.queue, [0, 0, 0, 0])
                    if first.queue == self.own_queue:
                        for v in vs:  # as price(): the swaps, not the gangs they break
                            _add(acc, v)
                    else:
                        for i, x in enumerate(self._removed(first, vs)):
                            acc[i] += x
        return self._taken.get(queue, [0, 0, 0, 0])

    def others_borrow(self) -> bool:
        """A queue other than the unit's holds past its guarantee in the view (one without a
        guarantee: anything), as the dispatcher's `CapacityPlanner.borrowing` counts: one that the
        unit's queue, below its guarantee, would reclaim from. Asked only of a swap that would take
        the unit's own queue below its floor."""
        if self._borrowed is None:
            census = self.census()
            own, floors = self.own_queue, self.floors
            self._borrowed = any(
                _borrows(census.queue(q), floors.get(q)) for q in census.queue_names() if q != own
            )
        return self._borrowed

    def _down_among(self, job: str, victims: list[Resident], lost: int) -> int:
        """Of the `lost` tasks of `job` (its victims, or its whole gang they break), those down
        already: bound again and not yet running. Evicting them takes no more of its budget."""
        down = self.state.down_tasks.tasks_of(job)
        if not down:
            return 0
        whole = self.census().job(job)
        if whole is not None and lost == whole[0]:
            held = self.state.task_row
            return sum(1 for tid in down if tid in held)
        return sum(1 for v in victims if v.task_id in down)

    def price(self, victims: list[Resident]) -> tuple[int, int] | None:
        """(tasks lost, their priorities summed) if evicting `victims` keeps every rule, else None."""
        by_job: dict[str, list[Resident]] = {}
        for v in victims:
            by_job.setdefault(v.job_id, []).append(v)
        lost = lost_priority = 0
        more: dict[str, Use] = {}
        for job, vs in by_job.items():
            first = vs[0]
            if self.simple(first):
                lost += len(vs)
                lost_priority += sum(v.priority for v in vs)
                continue
            prior = self.done.get(job, [])
            before = self._removed(first, prior)
            after = self._removed(first, [*prior, *vs])
            budget = first.disruption_budget
            if budget is not None:
                down_tasks = self.state.down_tasks
                down = down_tasks.count(job)  # down already: evicted or lost, not back
                # Evicted by this shard's other plans at the binder: down once it commits them.
                evicting = _NONE if self.plans is None else self.plans.evicting(job)
                going = sum(1 for tid in evicting if tid not in down_tasks) if evicting else 0
                taken = after[0] - (self._down_among(job, [*prior, *vs], after[0]) if down else 0)
                if down + going + taken > budget:
                    already = f", {down} down already" if down else ""
                    if going:
                        already += f"{' and' if down else ','} {going} being evicted"
                    self.refused = f"job {first.job_id}'s disruption budget ({budget}{already})"
                    # It may not hold once the binder answers this shard's plans in flight: one
                    # evicts a task of `job` (refused, the task stays up). A task bound again
                    # comes up only when it runs (common/disruptions.py), not with an answer.
                    self.coming_back = self.coming_back or bool(evicting)
                    return None
            n = after[0] - before[0]
            lost += n
            lost_priority += n * first.priority
            if self.floored(first):
                acc = more.setdefault(first.queue, [0, 0, 0, 0])
                if first.queue == self.own_queue:
                    for v in vs:  # the swap itself, not the rest of a gang it breaks
                        _add(acc, v)
                else:
                    for i in range(4):
                        acc[i] += after[i] - before[i]
        for queue, extra in more.items():
            held = self.census().queue(queue) or [0, 0, 0, 0]
            prior_taken = self._taken_before(queue)
            left = [held[i] - prior_taken[i] - extra[i] for i in range(1, 4)]
            floor = self.floors[queue]
            if queue == self.own_queue:
                if not floor_kept(held[1:], floor):
                    continue  # below its floor already: a swap within it settles nothing
                # The unit's own tasks count where they go: this one, and those placed since the
                # census was taken (the view it counted had not seen them).
                left = [x + a + p for x, a, p in zip(left, self.adds, self._placed_since(), strict=True)]
            if not floor_kept(left, floor):
                if queue == self.own_queue:
                    if not self.others_borrow():
                        continue  # nothing to reclaim below the floor: the swap starts no cycle
                    self.refused = (
                        f"its own queue {queue}'s guarantee (the swap would leave {queue} below it)"
                    )
                else:
                    self.refused = f"queue {queue}'s guarantee"
                return None  # the queue would fall below its guarantee
        return lost, lost_priority


def _borrows(use: Use | None, floor: Floor | None) -> bool:
    """A queue holding `use` borrows: past its floor in some resource (its dominant share above
    its guarantee), or holding anything without a floor (no guarantee)."""
    if use is None or not use[0]:
        return False
    if floor is None:
        return True
    return any(f is not None and x > f for x, f in zip(use[1:], floor, strict=True))


Shed = tuple[int, int, int]  # cpu milli, memory, GPU milli (Unit.shed)


def shed_left(ctx: UnitContext) -> Shed | None:
    """What the unit's queue still has to shed (Unit.shed) after the unit's evictions of its
    tasks so far; None once it has (or when there is nothing to shed). The rest of a gang its
    victims break is not counted: shedding more than asked is safe, less is not."""
    shed = ctx.unit.shed
    if shed is None:
        return None
    job = ctx.unit.job
    cpu, mem, gpu = shed
    for action, _, r in ctx.log:
        if action == EVICT and r.queue == job.queue and r.job_id != job.id:
            cpu, mem, gpu = cpu - r.cpu_milli, mem - r.memory, gpu - sum(m for _, m in r.gpus)
    if cpu <= 0 and mem <= 0 and gpu <= 0:
        return None
    return max(cpu, 0), max(mem, 0), max(gpu, 0)


def _shed_from(victims: list[Resident], queue: str, left: Shed) -> list[int]:
    """`left` less what the victims of `queue` free."""
    need = list(left)
    for v in victims:
        if v.queue == queue:
            need[0] -= v.cpu_milli
            need[1] -= v.memory
            need[2] -= sum(m for _, m in v.gpus)
    return need


def _with_shed(victims: list[Resident], eligible: list[Resident], queue: str, left: Shed) -> list[Resident]:
    """`victims` and, while they leave some of `left` to shed, more of the eligible tasks of
    `queue` (all of lower priority than the unit's, as the victim search chose them), the least
    important and the youngest first, each freeing some resource still to shed."""
    need = _shed_from(victims, queue, left)
    if all(x <= 0 for x in need):
        return victims
    chosen = {v.task_id for v in victims}
    more = [r for r in eligible if r.queue == queue and r.task_id not in chosen]
    out = list(victims)
    for r in sorted(more, key=lambda r: (r.defends_with(queue), -r.start_time)):
        frees = (r.cpu_milli, r.memory, sum(m for _, m in r.gpus))
        if not any(f > 0 and n > 0 for f, n in zip(frees, need, strict=True)):
            continue
        out.append(r)
        need = [n - f for n, f in zip(need, frees, strict=True)]
        if all(x <= 0 for x in need):
            break
    return out


def victims_on_row(
    entry: ClassEntry,
    state: ClusterArrays,
    row: int,
    eligible: list[Resident],
    pricer: Pricer,
    forced: AbstractSet[str] = frozenset(),
    shed: Shed | None = None,
) -> PricedCandidate | None:
    """Smallest victim set on `row` (after reprieve) that lets the task fit, priced with what its
    gang breaks take; None if none does or the set breaks a budget or a queue floor. The tasks
    of `eligible` named in `forced` are never reprieved (their anti-affinity keeps the task off).
    With `shed` (what the unit's queue has still to shed), the set takes more of the queue's own
    eligible tasks until it is shed, or the row has no more."""
    tc = entry.tc
    req = tc.request
    wants_extended = any(amount > 0 for _, amount in req.extended)  # as resources_fit: 0 asks nothing
    arithmetic = not req.wants_gpu and not wants_extended and not any(r.gpus or r.extended for r in eligible)
    # Shedding, the queue's own tasks are reprieved last: those the task must displace anyway
    # are then the queue's, and count toward its shed.
    first: ReprieveOrder = (
        _reprieve_order if shed is None else _others_first(pricer.own_queue, _reprieve_order)
    )
    if arithmetic:
        victims = _cpu_memory_victims(tc, state, row, eligible, first, forced)
    else:
        victims = _victims_by_trial(entry, state, row, eligible, first, forced)
    if shed is not None and victims is not None:
        victims = _with_shed(victims, eligible, pricer.own_queue, shed)
    if not victims:
        return None
    price = pricer.price(victims)
    if price is None:
        # The reprieve kept the most important tasks whatever the rules, and the set breaks one;
        # another set may keep it. Search again with the victims the rules protect reprieved
        # first: only here, so the usual case (the first set passes) costs nothing more.
        order = _protected_first(eligible, pricer)
        if shed is not None:
            order = _others_first(pricer.own_queue, order)
        if arithmetic:
            victims = _cpu_memory_victims(tc, state, row, eligible, order, forced)
        else:
            victims = _victims_by_trial(entry, state, row, eligible, order, forced)
        assert victims is not None, "all of `eligible` gone lets the task fit, as in the first search"
        if shed is not None:
            victims = _with_shed(victims, eligible, pricer.own_queue, shed)
        if not victims:
            return None
        price = pricer.price(victims)
        if price is None:
            return None
    lost, lost_priority = price
    return PricedCandidate(row, victims, lost=lost, lost_priority=lost_priority)


ReprieveOrder = Callable[[Resident], tuple[float, ...]]  # sort key: the first reprieved first


def _reprieve_order(r: Resident) -> tuple[int, bool, float]:
    # The most important first; at equal priority gang members (evicting one may break the gang).
    return (-r.priority, r.min_member <= 1, r.start_time)


def _others_first(queue: str, order: ReprieveOrder) -> ReprieveOrder:
    """`order` with the tasks of queues other than `queue` reprieved first."""
    return lambda r: (r.queue == queue, *order(r))


def _protected_first(eligible: list[Resident], pricer: Pricer) -> ReprieveOrder:
    """A reprieve order that lets back first the victims a rule protects: going through the
    rule-bound ones from the least important up, each the rules would not let go with those let
    go before it (kube-scheduler's PDB-violating pods); then _reprieve_order."""
    let_go: dict[tuple[bool, str], list[Resident]] = {}
    protected: set[str] = set()
    for r in sorted(eligible, key=_reprieve_order, reverse=True):
        if not pricer.ruled(r):
            continue
        # The verdict on r depends only on the victims of its job, or of its queue if floored.
        floored = pricer.floored(r)
        before = let_go.setdefault((floored, r.queue if floored else r.job_id), [])
        if pricer.price([*before, r]) is None:
            protected.add(r.task_id)
        else:
            before.append(r)
    return lambda r: (r.task_id not in protected, *_reprieve_order(r))


def _cpu_memory_victims(
    tc: TaskClass,
    state: ClusterArrays,
    row: int,
    eligible: list[Resident],
    order: ReprieveOrder = _reprieve_order,
    forced: AbstractSet[str] = frozenset(),
) -> list[Resident] | None:
    """The same remove-all-then-reprieve search in plain arithmetic, for CPU/memory-only work."""
    req = tc.request
    cpu_free = int(state.cpu_cap[row] - state.cpu_used[row]) + sum(r.cpu_milli for r in eligible)
    mem_free = int(state.mem_cap[row] - state.mem_used[row]) + sum(r.memory for r in eligible)
    if cpu_free < req.cpu_milli or mem_free < req.memory:
        return None
    victims: list[Resident] = []
    for r in sorted(eligible, key=order):
        if r.task_id in forced:
            victims.append(r)
        elif cpu_free - r.cpu_milli >= req.cpu_milli and mem_free - r.memory >= req.memory:
            cpu_free -= r.cpu_milli  # reprieved: it stays
            mem_free -= r.memory
        else:
            victims.append(r)
    return victims


def _victims_by_trial(
    entry: ClassEntry,
    state: ClusterArrays,
    row: int,
    eligible: list[Resident],
    order: ReprieveOrder = _reprieve_order,
    forced: AbstractSet[str] = frozenset(),
) -> list[Resident] | None:
    """Remove-all-then-reprieve on the view itself, so GPU assignment decides what fits."""
    removed: list[Resident] = []
    for r in sorted(eligible, key=lambda r: (r.priority, -r.start_time)):
        state.release(r.task_id)
        removed.append(r)
    try:
        if not fits_row(entry, state, row):
            return None
        victims: list[Resident] = []
        for r in sorted(removed, key=order):
            if r.task_id in forced:
                victims.append(r)
                continue
            state.place(row, r)
            if not fits_row(entry, state, row):
                state.release(r.task_id)
                victims.append(r)
        return victims
    finally:
        for r in removed:
            if r.task_id not in state.task_row:
                state.place(row, r)


@runtime_checkable
class ClearedByEviction(Protocol):
    """A unit filter that can say which of the rows it excludes evicting tasks on the row itself
    would clear, and those tasks (AntiAffinityFilter)."""

    def evictable_blockers(
        self, tc: TaskClass, ctx: UnitContext, state: ClusterArrays
    ) -> dict[int, list[Resident]]: ...


# As kube-scheduler: stop searching once this many candidate nodes are found (at least 100, 10%).
MIN_CANDIDATES = 100
CANDIDATE_PERCENT = 10


def could_fit(tc: TaskClass, state: ClusterArrays, row: int, eligible: list[Resident]) -> bool:
    """Cheap upper bound: would the task fit if every eligible victim on `row` were gone?"""
    req = tc.request
    if state.cpu_cap[row] - state.cpu_used[row] + sum(r.cpu_milli for r in eligible) < req.cpu_milli:
        return False
    if state.mem_cap[row] - state.mem_used[row] + sum(r.memory for r in eligible) < req.memory:
        return False
    if not req.wants_gpu:
        return True
    free = state.gpu_free[row].astype(np.int64)
    for r in eligible:
        for g, milli in r.gpus:
            free[g] += milli
    exists = state.gpu_exists[row]
    if req.gpus:
        return int(np.count_nonzero((free == GPU_MILLI) & exists)) >= req.gpus
    return bool(((free >= req.gpu_milli) & exists).any())


def find_candidate(
    profile: Profile,
    entry: ClassEntry,
    state: ClusterArrays,
    ctx: UnitContext,
    allowed: Mask | None,
    plans: InFlightPlans | None = None,
    own: Mask | None = None,
    searching: Sequence[VictimSearchingPlugin] | None = None,
    shed: Shed | None = None,
) -> Candidate | None:
    """The best node and its victims for the task, or None. Tasks that `plans` (this shard's
    units still awaiting the binder) placed are never victims: they are not bound, so the
    binder would refuse the proposal, and undoing the two attempts would then restore a task that
    was never placed; the budgeted tasks they evict count as down. `own`: the shard's partition,
    whose candidates win at equal harm.
    `searching`: the VictimSearching plugins that may name victims (None: the profile's).
    `shed`: what the unit's queue must still shed (shed_left): victims of the queue are taken on
    a node beyond what the task needs, and the nodes whose victims shed it all come first."""
    if searching is None:
        searching = profile.victim_searching
    tc, unit = entry.tc, ctx.unit
    req = tc.request
    n = state.n
    base = entry.static_ok[:n].copy()
    # A node too small even when empty can never take the task.
    base &= state.cpu_cap[:n] >= req.cpu_milli
    base &= state.mem_cap[:n] >= req.memory
    if req.gpus:
        base &= state.gpu_count[:n] >= req.gpus
    if allowed is not None:
        base &= allowed
    may_hold: Mask | None = np.zeros(n, np.bool_)
    for plugin in searching:
        rows = plugin.rows_with_victims(unit, state)
        if rows is None or may_hold is None:
            may_hold = None
        else:
            may_hold |= rows
    if may_hold is not None:
        if not may_hold.any():
            return None  # no node holds a task these plugins may evict
        base &= may_hold
    # Per row a unit filter excludes only for tasks on it that evicting clears (anti-affinity):
    # those tasks, which must all be victims there (kube-scheduler's preemption takes the
    # lower-priority pods off a node and runs the filters again).
    blocked: dict[int, list[Resident]] = {}
    for uf in profile.unit_filters:
        if uf.relevant(tc, state):
            excluded = uf.excluded(tc, ctx, state)
            if excluded is not None:
                if isinstance(uf, ClearedByEviction) and (excluded & base).any():
                    clearable = uf.evictable_blockers(tc, ctx, state)
                    if clearable:
                        back = np.zeros(n, np.bool_)
                        back[list(clearable)] = True
                        excluded = excluded & ~back
                        for row, tasks in clearable.items():
                            blocked.setdefault(row, []).extend(tasks)
                base &= ~excluded
    candidates: list[Candidate] = []
    limit = max(MIN_CANDIDATES, n * CANDIDATE_PERCENT // 100)
    job_id = unit.job.id
    may_evict = [p.eligible for p in searching]
    pricer = Pricer(state, ctx, req, plans)
    assumed = _NONE if plans is None else plans.placed()
    # A row where the task would fit if placements still awaiting the binder were victims too.
    held_back = False
    # Rows where evicting the tasks some rule protects (a disruption budget, a queue's guarantee)
    # would have made room, per rule: what explain says when no candidate is found.
    protected: dict[str, int] = {}
    for row in np.flatnonzero(base).tolist():
        residents = state.residents[row]
        if not residents:
            continue
        eligible: list[Resident] = []
        in_flight: list[Resident] = []
        kept: list[Resident] = []  # lower-priority tasks a rule protects
        rules: set[str] = set()
        blockers = blocked.get(row)
        for r in residents.values():
            if r.job_id == job_id:
                continue
            for ok in may_evict:  # a loop, not any(<genexpr>): this runs per resident per row
                if ok(unit, r):
                    break
            else:
                continue
            if pricer.simple(r) or pricer.price([r]) is not None:
                (in_flight if r.task_id in assumed else eligible).append(r)
            else:
                kept.append(r)
                rules.add(pricer.refused)
        forced: frozenset[str] = frozenset()
        stuck = False  # a task whose anti-affinity keeps the task off may not be evicted now
        if blockers is not None:
            forced = frozenset(r.task_id for r in blockers)
            missing = forced.difference(r.task_id for r in eligible)
            if missing and not missing <= {r.task_id for r in (*in_flight, *kept)}:
                continue  # one no eviction may take: higher priority, not preemptible
            stuck = bool(missing)  # it awaits the binder, or a rule protects it: the tallies say
        if in_flight and not held_back:
            held_back = could_fit(tc, state, row, eligible + in_flight)
        if kept and could_fit(tc, state, row, eligible + in_flight + kept):
            for why in rules:
                protected[why] = protected.get(why, 0) + 1
        if stuck or not eligible or not could_fit(tc, state, row, eligible):
            continue
        pricer.refused = ""
        candidate = victims_on_row(entry, state, row, eligible, pricer, forced, shed)
        if candidate is not None:
            candidate.remote = own is not None and not own[row]
            candidates.append(candidate)
            if len(candidates) >= limit:
                break
        elif pricer.refused and not kept:  # the set the task needs breaks a rule as a whole
            protected[pricer.refused] = protected.get(pricer.refused, 0) + 1
    if not candidates:
        # Bound, those placements could be evicted (or, bound again, a task down gives its job's
        # budget room back; refused, an eviction in flight does): the verdict holds until then.
        ctx.victims_in_flight = ctx.victims_in_flight or held_back
        ctx.budget_in_flight = ctx.budget_in_flight or pricer.coming_back
        for why, nodes in protected.items():
            ctx.protected[why] = max(nodes, ctx.protected.get(why, 0))
        return None
    for sorter in profile.candidate_sorting:
        candidates = sorter.sort(candidates)
    if shed is not None:
        queue = unit.job.queue
        for c in candidates:  # the first (by the sorters' order) that sheds all that is left
            if all(x <= 0 for x in _shed_from(c.victims, queue, shed)):
                return c
    return candidates[0]
