"""resources_fit: CPU, memory, extended resources, whole GPUs and milli-GPU shares."""

import numpy as np

from gosched.common.cluster_state import ClusterArrays
from gosched.common.resources import GPU_MILLI
from gosched.scheduler_shard.framework.interfaces import FilterPlugin, Mask, RowFilter, Rows
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.framework.task_class import TaskClass
from gosched.scheduler_shard.plugins.gpu_filters import eligibility_reason


def _wants_extended(tc: TaskClass) -> bool:
    return any(amount > 0 for _, amount in tc.request.extended)


def _ext_checks(tc: TaskClass, state: ClusterArrays, rows: Rows) -> list[tuple[str, Mask]]:
    out = []
    for name, amount in tc.request.extended:
        if amount <= 0:
            continue  # asks for nothing: fits anywhere, as the binder and ClusterArrays.fits judge
        col = state.ext_col(name)
        if col is None:
            out.append((f"insufficient {name}", np.zeros(len(state.cpu_cap[rows]), np.bool_)))
        else:
            out.append(
                (f"insufficient {name}", state.ext_used[rows, col] + amount <= state.ext_cap[rows, col])
            )
    return out


def _ext_capacity_checks(tc: TaskClass, state: ClusterArrays, rows: Rows) -> list[tuple[str, Mask]]:
    out = []
    for name, amount in tc.request.extended:
        if amount <= 0:
            continue
        col = state.ext_col(name)
        if col is None:
            out.append((f"node has no {name}", np.zeros(len(state.cpu_cap[rows]), np.bool_)))
        else:
            out.append((f"node too small for {name}", amount <= state.ext_cap[rows, col]))
    return out


def gpu_fit(tc: TaskClass, state: ClusterArrays, rows: Rows) -> Mask:
    """Rows with room for the class's GPUs: k fully free eligible GPUs, or one with the share free."""
    eligible = tc.eligible_gpus(state)
    if tc.gpu_whole:
        if eligible is None:
            return state.free_whole[rows] >= tc.gpu_whole
        free = (state.gpu_free[rows] == GPU_MILLI) & eligible[rows]
        return free.sum(axis=1) >= tc.gpu_whole
    if eligible is None:
        return state.max_share[rows] >= tc.gpu_share
    return ((state.gpu_free[rows] >= tc.gpu_share) & eligible[rows]).any(axis=1)


@register
class ResourcesFit(FilterPlugin):
    name = "resources_fit"
    reason = "insufficient resources"
    dynamic = True
    resolvable_by_preemption = True

    def filter(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Mask:
        req = tc.request
        ok = state.cpu_used[rows] + req.cpu_milli <= state.cpu_cap[rows]
        if req.memory:
            ok &= state.mem_used[rows] + req.memory <= state.mem_cap[rows]
        if req.extended:
            for _, mask in _ext_checks(tc, state, rows):
                ok &= mask
        if req.wants_gpu:
            ok &= gpu_fit(tc, state, rows)
        return ok

    def row_filter(self, tc: TaskClass) -> RowFilter | None:
        req = tc.request
        if _wants_extended(tc) or (req.wants_gpu and (tc.group.gpu_models or req.gpu_memory_mib)):
            return None  # extended resources, per-GPU eligibility: the vector path
        cpu, mem, whole, share = req.cpu_milli, req.memory, tc.gpu_whole, tc.gpu_share

        def fits(state: ClusterArrays, r: int) -> bool:
            if state.cpu_used.item(r) + cpu > state.cpu_cap.item(r):
                return False
            if mem and state.mem_used.item(r) + mem > state.mem_cap.item(r):
                return False
            if whole:
                return state.free_whole.item(r) >= whole
            if share:
                return state.max_share.item(r) >= share
            return True

        return fits

    def fits_cpu_memory_only(self, tc: TaskClass) -> bool:
        return not tc.request.wants_gpu and not _wants_extended(tc)

    def explain(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> list[tuple[str, Mask]]:
        req = tc.request
        # Nodes too small for the request whatever runs there first, apart from busy ones: a task
        # too big for them waits in vain (the dispatcher reserves room only for "insufficient").
        checks = [
            ("node too small for cpu", req.cpu_milli <= state.cpu_cap[rows]),
            ("node too small for memory", req.memory <= state.mem_cap[rows]),
            *_ext_capacity_checks(tc, state, rows),
        ]
        if req.wants_gpu:
            checks.append(("node has too few GPUs", state.gpu_count[rows] >= max(1, tc.gpu_whole)))
        checks += [
            ("insufficient cpu", state.cpu_used[rows] + req.cpu_milli <= state.cpu_cap[rows]),
            ("insufficient memory", state.mem_used[rows] + req.memory <= state.mem_cap[rows]),
            *_ext_checks(tc, state, rows),
        ]
        if req.wants_gpu:
            eligible = tc.eligible_gpus(state)
            if eligible is not None:
                # No GPU of the wanted model and memory at all is not a matter of usage (a profile
                # without gpu_model / gpu_memory only has this filter to say so).
                enough = eligible[rows].sum(axis=1) >= max(1, tc.gpu_whole)
                checks.append((eligibility_reason(tc), enough))
            checks.append(("insufficient GPU", gpu_fit(tc, state, rows)))
        return [(reason, ~ok) for reason, ok in checks]
