"""Victim search for one task: on each node, the fewest, least important victims that make it fit.

Per node (as kube-scheduler does): remove every eligible victim, check the task fits, then reprieve
victims from the most important down while it still fits. The candidate nodes are then ordered by
the profile's CandidateSorting plugins. A victim evicted by an earlier proposal of this shard is
already gone from the view, so it is never claimed twice; across shards the binder checks.
"""

import numpy as np

from gosched.common.cluster_state import ClusterArrays, Resident
from gosched.scheduler_shard.class_cache import ClassEntry
from gosched.scheduler_shard.framework.interfaces import Candidate, Mask
from gosched.scheduler_shard.framework.profile import Profile
from gosched.scheduler_shard.framework.task_class import TaskClass
from gosched.scheduler_shard.gpu_assign import choose_gpus
from gosched.scheduler_shard.unit_context import UnitContext


def fits_row(profile: Profile, tc: TaskClass, state: ClusterArrays, row: int) -> bool:
    rows = np.array([row], np.int64)
    for f in profile.dynamic_filters:
        if f.relevant(tc, state) and not bool(f.filter(tc, state, rows)[0]):
            return False
    return choose_gpus(tc, state, row) is not None


def _budget_left(ctx: UnitContext, victim: Resident) -> int | None:
    if victim.disruption_budget is None:
        return None
    return victim.disruption_budget - ctx.victims_by_job.get(victim.job_id, 0)


def victims_on_row(
    profile: Profile, tc: TaskClass, state: ClusterArrays, row: int, eligible: list[Resident], ctx: UnitContext
) -> list[Resident] | None:
    """Smallest victim set on `row` (after reprieve) that lets the task fit; None if none does."""
    removed: list[Resident] = []
    for r in sorted(eligible, key=lambda r: (r.priority, -r.start_time)):
        state.release(r.task_id)
        removed.append(r)
    try:
        if not fits_row(profile, tc, state, row):
            return None
        victims: list[Resident] = []
        for r in sorted(removed, key=lambda r: (-r.priority, r.start_time)):
            state.place(row, r)
            if not fits_row(profile, tc, state, row):
                state.release(r.task_id)
                victims.append(r)
        per_job: dict[str, int] = {}
        for v in victims:
            per_job[v.job_id] = per_job.get(v.job_id, 0) + 1
            left = _budget_left(ctx, v)
            if left is not None and per_job[v.job_id] > left:
                return None  # would break that job's disruption budget
        return victims
    finally:
        for r in removed:
            if r.task_id not in state.task_row:
                state.place(row, r)


def find_candidate(
    profile: Profile, entry: ClassEntry, state: ClusterArrays, ctx: UnitContext, allowed: Mask | None
) -> Candidate | None:
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
    for uf in profile.unit_filters:
        if uf.relevant(tc):
            excluded = uf.excluded(tc, ctx, state)
            if excluded is not None:
                base &= ~excluded
    candidates: list[Candidate] = []
    for row in np.flatnonzero(base):
        residents = state.residents[row]
        if not residents:
            continue
        eligible = [
            r
            for r in residents.values()
            if r.job_id != unit.job.id
            and any(p.eligible(unit, r) for p in profile.victim_searching)
            and (_budget_left(ctx, r) is None or (_budget_left(ctx, r) or 0) > 0)
        ]
        if not eligible:
            continue
        victims = victims_on_row(profile, tc, state, int(row), eligible, ctx)
        if victims:
            candidates.append(Candidate(int(row), victims))
    if not candidates:
        return None
    for sorter in profile.candidate_sorting:
        candidates = sorter.sort(candidates)
    return candidates[0]
