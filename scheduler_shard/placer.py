"""Places one unit (a gang) on the shard's view: all-or-nothing up to its min_needed.

Order: each node set from the Locating plugins (own partition, then all), each topology domain
from the Grouping plugins; then, if nothing fits, the same with preemption. A failed attempt is
rolled back so it leaves no trace in the view. A gang (min_member above 1) preempts only while
it is below its min_member (Volcano's gang rule): the tasks of an elastic gang past its minimum take
free room only, in any location. A job of min_member 1 is no gang: each of its tasks preempts, as
a Kubernetes pod does.

Soft rules (score plugins marked `soft_rule`: preferences about nodes, not packing) may take a task
past its location to the next, wider one: when the best node of the own partition scores lower on
them than a node elsewhere that fits (ClassCache.softer_row). Each task of a unit decides alone.
"""

from collections.abc import Callable
from dataclasses import replace
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from gosched.common.cluster_state import ClusterArrays, Resident
from gosched.common.messages import Diagnosis, Placement, Unit, Unschedulable
from gosched.scheduler_shard.class_cache import ALL_ROWS, NEG_INF, ClassCache, ClassEntry, best_row
from gosched.scheduler_shard.diagnosis import diagnose, most_on_empty_nodes
from gosched.scheduler_shard.framework.interfaces import GroupingPlugin, Mask
from gosched.scheduler_shard.framework.profile import Profile
from gosched.scheduler_shard.framework.task_class import TaskClass
from gosched.scheduler_shard.gpu_assign import choose_gpus
from gosched.scheduler_shard.in_flight import InFlightPlans
from gosched.scheduler_shard.plugins.preemption import ForStarvingJobs
from gosched.scheduler_shard.preemption import find_candidate, shed_left
from gosched.scheduler_shard.unit_context import UnitContext

# At most this many class entries' never-fits counts are kept (each keeps its entry alive).
MOST_KEPT = 256
IN_FLIGHT_VICTIMS_NOTE = "lower-priority tasks in the way are still being bound: preempting them next"
BUDGET_IN_FLIGHT_NOTE = (
    "a disruption budget's count may change when this shard's plans at the binder are answered "
    "(they evict its tasks, or bind them again): trying again then"
)


def gang_has_minimum(unit: Unit, placed: int) -> bool:
    """The unit's job is a gang (min_member above 1) whose bound tasks and `placed` reach its
    min_member: its other tasks do not preempt by priority. A job of min_member 1 is no gang, but
    tasks that each stand alone, so each preempts (its default min_member must not make every
    multi-task job elastic)."""
    min_member = unit.job.min_member
    return min_member > 1 and unit.held + placed >= min_member


def past_minimum_note(min_member: int) -> str:
    """Why tasks of a job that holds (or this attempt placed) its min_member preempt nothing."""
    return f"past its min_member ({min_member}): waits for free room, as only a gang below it preempts"


class _Last:
    """The marker for "no wider location": the task's location is the last one."""


LAST = _Last()
Wider: TypeAlias = Mask | _Last | None  # the next location after a task's own (LAST: none)


class Placer:
    def __init__(self, profile: Profile, cache: ClassCache, clock: Callable[[], float]) -> None:
        self.profile = profile
        self.cache = cache
        self.clock = clock
        # The last read-only node mask seen and its rows: the own-partition mask recurs every unit.
        self._mask: Mask | None = None
        self._mask_rows: npt.NDArray[np.intp] = np.empty(0, np.intp)
        self._own: Mask | None = None  # the unit's first location (the own partition), if others follow
        self._left_rows: list[int] = []  # per unit: rows of its own tasks the view still holds (_try)
        self._preempts = bool(profile.preemption and profile.victim_searching)
        self._assumed = InFlightPlans({})  # the unit's (schedule_unit), for the shedding search
        # The victim searching a task past its job's min_member may still do (capacity reclaim).
        self._past_minimum = [p for p in profile.victim_searching if not isinstance(p, ForStarvingJobs)]
        # Per class entry (by id, the entry kept beside its count), how many of its tasks the
        # nodes would hold empty (_never_fits), for the node metadata of _most_generation.
        self._most: dict[int, tuple[ClassEntry, int]] = {}
        self._most_generation = -1

    def schedule_unit(
        self,
        unit: Unit,
        state: ClusterArrays,
        own_rows: npt.NDArray[np.int64] | None,
        assumed: InFlightPlans | None = None,
    ) -> tuple[UnitContext | None, Unschedulable | None]:
        """A context holding the assumed placements (or None), and what could not be placed.
        `assumed`: what the shard's other units in flight placed and evicted, which the binder
        has not answered for (asked only when preempting: their tasks may not be victims, and the
        budgeted tasks they evict count as down)."""
        if assumed is None:
            assumed = InFlightPlans({})
        self._assumed = assumed
        ctx, unschedulable = self._schedule(unit, state, own_rows, assumed)
        if ctx is not None and unit.shed is not None:
            left = shed_left(ctx)
            if left is not None:  # placed, but its queue would stay past its max_share
                ctx.rollback(state)
                return None, self._not_shed(ctx, state, left)
        return ctx, unschedulable

    def _schedule(
        self,
        unit: Unit,
        state: ClusterArrays,
        own_rows: npt.NDArray[np.int64] | None,
        assumed: InFlightPlans,
    ) -> tuple[UnitContext | None, Unschedulable | None]:
        ctx = UnitContext(unit)
        self._diagnosis: Diagnosis | None = None
        self._left_rows = []
        self._grouping: GroupingPlugin | None = None
        locations: list[Mask | None] = [None]
        if self.profile.locating:
            locations = self.profile.locating[0].locate(unit, own_rows, state)
        domains: list[Mask | None] = [None]
        for grouping in self.profile.grouping:
            found = grouping.groups(unit, state)
            if found is not None:
                domains = list(found)
                self._grouping = grouping
                break
        # The usual unit: one task, the whole view to choose from (one shard), no domains.
        alone = len(unit.task_indexes) == 1 and len(domains) == 1 and domains[0] is None
        alone = alone and unit.shed is None  # a unit that sheds searches victims first (_try)
        if alone and len(locations) == 1 and locations[0] is None and self._place_alone(ctx, state):
            return ctx, None
        # A gang preempts by priority only below its min_member (Volcano's gang rule): a retry of
        # a gang whose bound tasks reach it may only reclaim, as may the tasks past it of any unit.
        preempting = self._preempts and (not gang_has_minimum(unit, 0) or bool(self._past_minimum))
        passes = (False, True) if preempting else (False,)
        # The preemption pass searches the last (widest) location alone: in the own partition
        # first, it evicted there while room was free elsewhere, or evicted more important tasks
        # than the cluster's least important. Shards searching alike would pick the same victims,
        # and the binder refuse all but one, so at equal harm the own partition's go first.
        self._own = locations[0] if len(locations) > 1 else None
        for preempt in passes:
            victims_of = assumed if preempt else None
            tried = locations[-1:] if preempt else locations
            for at, location in enumerate(tried):
                # The next, wider location, where a task may go for a node that keeps its soft
                # rules better (none past the last location, and none when preempting).
                wider: Wider = tried[at + 1] if at + 1 < len(tried) else LAST
                # An elastic unit may reach its minimum in several domains: it takes the one
                # where most of its tasks fit (the first of those), not the first where the
                # minimum does, as the rest of the job may later go only where it is.
                best: tuple[int, Mask | None] | None = None
                for domain in domains:
                    if domain is None:  # no topology domains (the usual unit): the location as is
                        unplaced = self._try(ctx, state, location, victims_of, wider)
                    else:
                        unplaced = self._try(
                            ctx, state, _both(location, domain), victims_of, _within(wider, domain)
                        )
                    placed = len(ctx.placements)
                    if placed >= unit.min_needed:
                        if not unplaced:
                            return ctx, None
                        if len(domains) == 1:
                            return ctx, self._leftover(
                                ctx,
                                state,
                                unplaced,
                                tried[at + 1 :],
                                domain,
                                None if preempt else assumed,
                                locations[-1],
                            )
                        if best is None or placed > best[0]:
                            best = (placed, domain)
                    ctx.rollback(state)
                if best is not None:
                    unplaced = self._try(
                        ctx, state, _both(location, best[1]), victims_of, _within(wider, best[1])
                    )
                    return ctx, self._leftover(
                        ctx,
                        state,
                        unplaced,
                        tried[at + 1 :],
                        best[1],
                        None if preempt else assumed,
                        locations[-1],
                    )
        return None, self._unschedulable(ctx, state, list(unit.task_indexes))

    def _try(
        self,
        ctx: UnitContext,
        state: ClusterArrays,
        allowed: Mask | None,
        assumed: InFlightPlans | None,
        wider: Wider = LAST,
        only: list[int] | None = None,
    ) -> list[int]:
        """One attempt at the unit's tasks (`only`: these of them, in this order) on `allowed`
        rows; with `assumed` (the preemption pass) a task that fits nowhere may evict, never one
        of those tasks, while the job is below its min_member. A task whose best allowed row
        breaks a soft rule that a fitting row of `wider` (LAST: none) keeps goes there."""
        unit = ctx.unit
        job = unit.job
        if only is not None:
            indexes: tuple[int, ...] | list[int] = only
        else:
            indexes = unit.task_indexes if len(job.groups) == 1 else _largest_first(unit)
        need = unit.min_needed
        now = self.clock()
        unplaced: list[int] = []
        unit_filters = self.profile.unit_filters
        task_row = state.task_row
        stale_rows: list[int] = []
        shedding = unit.shed is not None and self._preempts
        for idx in indexes:
            tid = f"{job.id}/{idx}"  # task_id(job.id, idx), inline: once per task
            if tid in task_row:
                stale_rows.append(task_row[tid])
                ctx.drop_stale(state, tid)
        if stale_rows:
            # The view still holds the unit's own task, released at the binder since. Its room is
            # most likely taken (by the task that evicted it): this attempt does not count on it,
            # or every shard that has not heard yet proposes the task back into its old slot.
            allowed = _excluding(allowed, stale_rows, state.n)
            self._left_rows.extend(stale_rows)  # and a diagnosis says why it was not tried there
            if not isinstance(wider, _Last):
                wider = _excluding(wider, stale_rows, state.n)
        # Soft rules can take a task past `allowed` only to a wider set of rows.
        spill = allowed is not None and not isinstance(wider, _Last)
        # Choosing among the allowed rows (ascending, so ties still go to the lowest row) costs
        # one gather per task instead of masking the whole cluster's scores.
        allowed_rows = None if allowed is None else self._rows_of(allowed)
        for pos, idx in enumerate(indexes):
            if need > 1 and len(ctx.placements) + (len(indexes) - pos) < need:
                unplaced.extend(indexes[pos:])  # the gang can no longer reach min_needed
                break
            group = job.group_of(idx)
            entry = self.cache.entry(group, state)
            if shedding and self._place_shedding(ctx, state, entry, allowed, idx, now):
                continue
            eff = entry.eff
            if unit_filters:
                for uf in unit_filters:
                    if uf.relevant(entry.tc, state):
                        excluded = uf.excluded(entry.tc, ctx, state)
                        if excluded is not None:
                            eff = np.where(excluded, NEG_INF, eff)
            if eff is not entry.eff:
                row = best_row(eff, allowed_rows)
            elif entry.best_key is (ALL_ROWS if allowed is None else allowed):
                row = entry.best  # remembered_best_row's hit, inline (most tasks take it)
            else:
                row = self.cache.remembered_best_row(entry, allowed, allowed_rows)
            soft = entry.soft
            if (
                spill
                and soft is not None
                and row >= 0
                and soft.item(row) < entry.soft_top
                and eff[row] != NEG_INF
            ):
                # The best allowed row breaks a soft rule (nothing preferred: soft is None).
                assert allowed is not None and not isinstance(wider, _Last)
                softer = self.cache.softer_row(entry, eff, row, allowed, wider)
                if softer >= 0:
                    row = softer
            victims: tuple[str, ...] = ()
            if row < 0 or eff.item(row) == NEG_INF:
                # A task that stands alone (no gang) is diagnosed where it is tried last: failing
                # its own partition, it goes on to the wider nodes, and the diagnosis would count
                # those it then takes, or others of its job take, as fitting.
                if self._diagnosis is None and (need > 1 or isinstance(wider, _Last)):
                    # Diagnose while the attempt's own placements are still in the view.
                    note = f"gang needs {need} of {len(indexes)} tasks" if need > 1 else ""
                    self._diagnosis = self._diagnose(entry.tc, state, ctx, note)
                if assumed is None:
                    unplaced.append(idx)
                    continue
                searching = None  # the profile's
                if gang_has_minimum(unit, len(ctx.placements)):
                    # The gang has its minimum: past it no priority preemption (Volcano's gang
                    # rule: only a gang below its min_member preempts), reclaim alone.
                    searching = self._past_minimum
                    if not searching:
                        unplaced.append(idx)
                        continue
                candidate = find_candidate(
                    self.profile, entry, state, ctx, allowed, assumed, self._own, searching
                )
                if candidate is None:
                    unplaced.append(idx)
                    continue
                for victim in candidate.victims:
                    ctx.evict(state, victim)
                row, victims = candidate.row, tuple(v.task_id for v in candidate.victims)
            gpus = choose_gpus(entry.tc, state, row) if entry.tc.wants_gpu else ()
            if gpus is None:
                unplaced.append(idx)
                continue
            node = state.nodes[row]
            assert node is not None
            resident = Resident.for_task(job, idx, gpus, now, unit.standing)
            ctx.place(state, row, resident, Placement(idx, node.name, gpus, victims))
        return unplaced

    def _place_shedding(
        self,
        ctx: UnitContext,
        state: ClusterArrays,
        entry: ClassEntry,
        allowed: Mask | None,
        idx: int,
        now: float,
    ) -> bool:
        """While the unit's queue has still to shed (Unit.shed), the task goes where evicting
        lower-priority tasks of its queue sheds it (or the most of it), fitting or not; whether it
        was placed so. Not placed (nothing of the queue to evict where it may go), it is placed as
        any task, and the unit fails at the end if the queue has not shed enough."""
        left = shed_left(ctx)
        if left is None:
            return False
        candidate = find_candidate(
            self.profile, entry, state, ctx, allowed, self._assumed, self._own, None, left
        )
        if candidate is None:
            return False
        for victim in candidate.victims:
            ctx.evict(state, victim)
        row = candidate.row
        gpus = choose_gpus(entry.tc, state, row) if entry.tc.wants_gpu else ()
        assert gpus is not None, "the victim search checked the GPUs fit"
        node = state.nodes[row]
        assert node is not None
        job = ctx.unit.job
        resident = Resident.for_task(job, idx, gpus, now, ctx.unit.standing)
        victims = tuple(v.task_id for v in candidate.victims)
        ctx.place(state, row, resident, Placement(idx, node.name, gpus, victims))
        return True

    def _not_shed(self, ctx: UnitContext, state: ClusterArrays, left: tuple[int, int, int]) -> Unschedulable:
        """The unit placed, but without evicting enough of its queue's lower-priority tasks on
        the nodes it took for the queue to stay within its max_share: unschedulable, saying so."""
        unit = ctx.unit
        assert unit.shed is not None
        tc = self.cache.entry(unit.job.group_of(unit.task_indexes[0]), state).tc
        note = shed_note(unit.job.queue, unit.shed, left, self._preempts)
        diagnosis = self._diagnose(tc, state, ctx, note)
        if ctx.protected:
            diagnosis = replace(diagnosis, note=f"{diagnosis.note}; {protected_note(ctx.protected)}")
        settling = ctx.victims_in_flight or ctx.budget_in_flight
        return Unschedulable(unit.job.id, unit.task_indexes, diagnosis, unit.attempt, settling)

    def _place_alone(self, ctx: UnitContext, state: ClusterArrays) -> bool:
        """_try's first pass for a one-task unit over every row, where nothing but the class's
        remembered best row can decide: no unit filter applies, no GPUs to choose, the task not
        still in the view. Whether it placed the task; if not, _try does it all (and diagnoses)."""
        unit = ctx.unit
        job = unit.job
        idx = unit.task_indexes[0]
        if f"{job.id}/{idx}" in state.task_row:
            return False
        entry = self.cache.entry(job.group_of(idx), state)
        tc = entry.tc
        if tc.wants_gpu:
            return False
        for uf in self.profile.unit_filters:
            if uf.relevant(tc, state):
                return False
        row = entry.best if entry.best_key is ALL_ROWS else self.cache.remembered_best_row(entry, None, None)
        if row < 0 or entry.eff.item(row) == NEG_INF:
            return False
        node = state.nodes[row]
        assert node is not None
        resident = Resident.for_task(job, idx, (), self.clock(), unit.standing)
        ctx.place(state, row, resident, Placement(idx, node.name, (), ()))
        return True

    def _rows_of(self, allowed: Mask) -> npt.NDArray[np.intp]:
        if allowed is self._mask:
            return self._mask_rows
        rows = np.flatnonzero(allowed)
        if not allowed.flags.writeable:  # a mask that can change must not be cached by identity
            self._mask, self._mask_rows = allowed, rows
        return rows

    def _diagnose(self, tc: TaskClass, state: ClusterArrays, ctx: UnitContext, note: str) -> Diagnosis:
        # Rows the Grouping plugin kept the unit off are blamed on it (asked only on failure).
        rules = [] if self._grouping is None else self._grouping.explain(ctx.unit, state)
        return diagnose(self.profile, tc, state, ctx, note, rules, self._left_rows)

    def _leftover(
        self,
        ctx: UnitContext,
        state: ClusterArrays,
        unplaced: list[int],
        later: list[Mask | None],
        domain: Mask | None,
        assumed: InFlightPlans | None,
        last: Mask | None,
    ) -> Unschedulable | None:
        """The tasks past the unit's minimum that found no room where it did: they try the
        later, wider locations (within the domain) for free room, then, with `assumed` (the pass
        searched no victims for them), the `last` location with a victim search: the profile's for
        tasks that each stand alone (min_member 1), capacity reclaim alone past a gang's minimum.
        The rest are unschedulable, and not settling unless the victim search was held back by
        the shard's plans in flight: nothing else is left untried, so the verdict holds until room
        frees, which wakes the job."""
        for at, location in enumerate(later):
            if not unplaced:
                return None
            wider: Wider = later[at + 1] if at + 1 < len(later) else LAST
            unplaced = self._try(ctx, state, _both(location, domain), None, _within(wider, domain), unplaced)
        if unplaced and assumed is not None and self._preempts:
            # _try's victim search: the profile's for tasks that each stand alone (min_member 1),
            # reclaim alone past a gang's minimum (none: the tasks stay unplaced).
            unplaced = self._try(ctx, state, _both(last, domain), assumed, LAST, unplaced)
        if not unplaced:
            return None
        return self._unschedulable(ctx, state, unplaced)

    def _never_fits(self, unit: Unit, state: ClusterArrays) -> str:
        """For a gang of one task group that the cluster's nodes could not hold even empty: says
        so, as Slurm refuses a job larger than its partition (it waits here, for nodes to join)."""
        job = unit.job
        if job.min_member <= 1 or len(job.groups) != 1:
            return ""
        group = job.groups[0]
        entry = self.cache.entry(group, state)
        if self._most_generation != state.meta_generation or len(self._most) >= MOST_KEPT:
            self._most.clear()  # capacities and filters changed, or entries of dropped classes pile up
            self._most_generation = state.meta_generation
        known = self._most.get(id(entry))
        if known is None or known[0] is not entry:
            most = most_on_empty_nodes(group.resources, state, entry.static_ok)
            known = self._most[id(entry)] = (entry, most)
        most = known[1]
        if most >= job.min_member:
            return ""
        return (
            f"it can never fit as the cluster is: even empty, the ready nodes it may use hold at most {most} "
            f"of its tasks, and its gang needs {job.min_member}"
        )

    def _unschedulable(self, ctx: UnitContext, state: ClusterArrays, indexes: list[int]) -> Unschedulable:
        unit = ctx.unit
        diagnosis = self._diagnosis
        if diagnosis is None:  # the gang ran out of tasks before any one failed to fit
            tc = self.cache.entry(unit.job.group_of(indexes[0]), state).tc
            note = (
                f"gang needs {unit.min_needed} of {len(unit.task_indexes)} tasks"
                if unit.min_needed > 1
                else ""
            )
            diagnosis = self._diagnose(tc, state, ctx, note)
        never = self._never_fits(unit, state)
        if never:
            diagnosis = replace(diagnosis, note="; ".join(filter(None, (diagnosis.note, never))))
        if ctx.victims_in_flight:  # say why a preemptor waits ("why pending")
            note = "; ".join(filter(None, (diagnosis.note, IN_FLIGHT_VICTIMS_NOTE)))
            diagnosis = replace(diagnosis, note=note)
        if ctx.budget_in_flight:
            note = "; ".join(filter(None, (diagnosis.note, BUDGET_IN_FLIGHT_NOTE)))
            diagnosis = replace(diagnosis, note=note)
        if self._preempts and gang_has_minimum(unit, len(ctx.placements)):
            note = "; ".join(filter(None, (diagnosis.note, past_minimum_note(unit.job.min_member))))
            diagnosis = replace(diagnosis, note=note)
        if ctx.protected:  # lower-priority tasks were in the way, but a rule kept them
            note = "; ".join(filter(None, (diagnosis.note, protected_note(ctx.protected))))
            diagnosis = replace(diagnosis, note=note)
        settling = ctx.victims_in_flight or ctx.budget_in_flight
        return Unschedulable(unit.job.id, tuple(indexes), diagnosis, unit.attempt, settling)


def protected_note(protected: dict[str, int]) -> str:
    """'no preemption: evicting lower-priority tasks would break job a's disruption budget (0) on
    1 node', the rules that kept the victim search from the room it needed."""
    by_nodes = sorted(protected.items(), key=lambda item: -item[1])
    rules = ", ".join(f"{why} on {n} node{'s' if n != 1 else ''}" for why, n in by_nodes)
    return f"no preemption: evicting lower-priority tasks would break {rules}"


def shed_note(queue: str, shed: tuple[int, int, int], left: tuple[int, int, int], preempts: bool) -> str:
    """Why a unit that had to shed its queue's usage (Unit.shed) was not placed."""
    if not preempts:
        return f"queue {queue} is at its max_share, and this profile preempts nothing to get within it"
    names = ("cpu", "memory", "GPU")
    short = ", ".join(
        f"{name} {_amount(name, n - k)} of {_amount(name, n)}"
        for name, n, k in zip(names, shed, left, strict=True)
        if n
    )
    return (
        f"queue {queue} is at its max_share: evicting its lower-priority tasks on the nodes this job "
        f"may take frees only {short} of what the queue must give up"
    )


def _amount(name: str, value: int) -> str:
    if name == "memory":
        return f"{value / 2**30:.1f}GiB"
    return f"{value / 1000:g}"


def _largest_first(unit: Unit) -> tuple[int, ...]:
    """The unit's tasks, biggest request first (first-fit decreasing packs gangs tighter)."""
    job = unit.job
    if len(job.groups) == 1:
        return unit.task_indexes

    def size(idx: int) -> tuple[int, int, int]:
        r = job.group_of(idx).resources
        return (-r.gpu_total_milli, -r.cpu_milli, -r.memory)

    return tuple(sorted(unit.task_indexes, key=size))


def _within(wider: Wider, domain: Mask | None) -> Wider:
    """The wider location inside the topology domain (a gang never leaves its domain)."""
    return wider if isinstance(wider, _Last) else _both(wider, domain)


def _excluding(allowed: Mask | None, rows: list[int], n: int) -> Mask:
    mask = np.ones(n, np.bool_) if allowed is None else allowed.copy()
    mask[rows] = False
    return mask


def _both(a: Mask | None, b: Mask | None) -> Mask | None:
    if a is None:
        return b
    if b is None:
        return a
    return a & b
