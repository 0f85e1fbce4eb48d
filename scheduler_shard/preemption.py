"""Victim search for one task: on each node, the fewest, least important victims that make it fit.

Per node (as kube-scheduler does): remove every eligible victim, check the task fits, then reprieve
victims from the most important down while it still fits. The candidate nodes are then ordered by
the profile's CandidateSorting plugins. A victim evicted by an earlier proposal of this shard is
already gone from the view, so it is never claimed twice; across shards the binder checks.
"""

from collections.abc import Set as AbstractSet

import numpy as np

from gosched.common.cluster_state import ClusterArrays, Resident
from gosched.common.resources import GPU_MILLI
from gosched.scheduler_shard.class_cache import ClassEntry, passes_dynamic_filters
from gosched.scheduler_shard.framework.interfaces import Candidate, Mask
from gosched.scheduler_shard.framework.profile import Profile
from gosched.scheduler_shard.framework.task_class import TaskClass
from gosched.scheduler_shard.gpu_assign import choose_gpus
from gosched.scheduler_shard.unit_context import UnitContext


def fits_row(entry: ClassEntry, state: ClusterArrays, row: int) -> bool:
    """The class's dynamic filters on one row, then whether its GPUs can be assigned there."""
    return passes_dynamic_filters(entry, state, row) and choose_gpus(entry.tc, state, row) is not None


def _budget_left(ctx: UnitContext, victim: Resident) -> int | None:
    if victim.disruption_budget is None:
        return None
    return victim.disruption_budget - ctx.victims_by_job.get(victim.job_id, 0)


def victims_on_row(
    entry: ClassEntry,
    state: ClusterArrays,
    row: int,
    eligible: list[Resident],
    ctx: UnitContext,
) -> list[Resident] | None:
    """Smallest victim set on `row` (after reprieve) that lets the task fit; None if none does."""
    tc = entry.tc
    req = tc.request
    if not req.wants_gpu and not req.extended and not any(r.gpus or r.extended for r in eligible):
        victims = _cpu_memory_victims(tc, state, row, eligible)
    else:
        victims = _victims_by_trial(entry, state, row, eligible)
    if victims is None:
        return None
    per_job: dict[str, int] = {}
    for v in victims:
        per_job[v.job_id] = per_job.get(v.job_id, 0) + 1
        left = _budget_left(ctx, v)
        if left is not None and per_job[v.job_id] > left:
            return None  # would break that job's disruption budget
    return victims


def _cpu_memory_victims(
    tc: TaskClass, state: ClusterArrays, row: int, eligible: list[Resident]
) -> list[Resident] | None:
    """The same remove-all-then-reprieve search in plain arithmetic, for CPU/memory-only work."""
    req = tc.request
    cpu_free = int(state.cpu_cap[row] - state.cpu_used[row]) + sum(r.cpu_milli for r in eligible)
    mem_free = int(state.mem_cap[row] - state.mem_used[row]) + sum(r.memory for r in eligible)
    if cpu_free < req.cpu_milli or mem_free < req.memory:
        return None
    victims: list[Resident] = []
    for r in sorted(eligible, key=lambda r: (-r.priority, r.start_time)):
        if cpu_free - r.cpu_milli >= req.cpu_milli and mem_free - r.memory >= req.memory:
            cpu_free -= r.cpu_milli  # reprieved: it stays
            mem_free -= r.memory
        else:
            victims.append(r)
    return victims


def _victims_by_trial(
    entry: ClassEntry, state: ClusterArrays, row: int, eligible: list[Resident]
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
        for r in sorted(removed, key=lambda r: (-r.priority, r.start_time)):
            state.place(row, r)
            if not fits_row(entry, state, row):
                state.release(r.task_id)
                victims.append(r)
        return victims
    finally:
        for r in removed:
            if r.task_id not in state.task_row:
                state.place(row, r)


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
    assumed: AbstractSet[str] = frozenset(),
) -> Candidate | None:
    """The best node and its victims for the task, or None. Tasks in `assumed` (placements of
    this shard's units still awaiting the binder) are never victims: they are not bound, so the
    binder would refuse the proposal, and undoing the two attempts would then restore a task that
    was never placed."""
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
    for plugin in profile.victim_searching:
        rows = plugin.rows_with_victims(unit, state)
        if rows is None or may_hold is None:
            may_hold = None
        else:
            may_hold |= rows
    if may_hold is not None:
        base &= may_hold
    for uf in profile.unit_filters:
        if uf.relevant(tc):
            excluded = uf.excluded(tc, ctx, state)
            if excluded is not None:
                base &= ~excluded
    candidates: list[Candidate] = []
    limit = max(MIN_CANDIDATES, n * CANDIDATE_PERCENT // 100)
    job_id = unit.job.id
    may_evict = [p.eligible for p in profile.victim_searching]
    # A row where the task would fit if placements still awaiting the binder were victims too.
    held_back = False
    for row in np.flatnonzero(base).tolist():
        residents = state.residents[row]
        if not residents:
            continue
        eligible: list[Resident] = []
        in_flight: list[Resident] = []
        for r in residents.values():
            if r.job_id == job_id:
                continue
            for ok in may_evict:  # a loop, not any(<genexpr>): this runs per resident per row
                if ok(unit, r):
                    break
            else:
                continue
            left = _budget_left(ctx, r)
            if left is None or left > 0:
                (in_flight if r.task_id in assumed else eligible).append(r)
        if in_flight and not held_back:
            held_back = could_fit(tc, state, row, eligible + in_flight)
        if not eligible or not could_fit(tc, state, row, eligible):
            continue
        victims = victims_on_row(entry, state, row, eligible, ctx)
        if victims:
            candidates.append(Candidate(row, victims))
            if len(candidates) >= limit:
                break
    if not candidates:
        # Bound, those placements could be evicted: the verdict holds only until they are.
        ctx.victims_in_flight = ctx.victims_in_flight or held_back
        return None
    for sorter in profile.candidate_sorting:
        candidates = sorter.sort(candidates)
    return candidates[0]
