"""most_allocated (bin-pack), least_allocated (spread) and balanced_allocation scores.

Each uses the node's usage after placing the task, per requested resource, on a 0..100 scale.
Rows where the task does not fit are masked by the filters, so no clipping is needed here.
"""

from typing import Any

import numpy as np

from gosched.common.cluster_state import ClusterArrays
from gosched.common.resources import GPU_MILLI, ResourceRequest
from gosched.scheduler_shard.framework.interfaces import (
    FractionScore,
    Rows,
    RowScore,
    ScorePlugin,
    Scores,
)
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.framework.task_class import TaskClass

# The last call's (rows, state, class, view position) and its result. The objects themselves are
# kept (and compared by identity), not their id()s: a freed object's id is soon reused (slices
# especially), and an id match would hand one view's fractions to another.
_memo: list[Any] = [None, None, None, -1, None]


def fractions_after(tc: TaskClass, state: ClusterArrays, rows: Rows) -> list[Any]:
    """Used/capacity after placement for each resource the task asks for (cpu always), as arrays
    over `rows`.

    Several scores need the same fractions for the same rows in one refresh: memoised on the
    (rows object, view, view position, class) so they are computed once.
    """
    memo = _memo
    position = state.dirty_position
    if memo[0] is rows and memo[1] is state and memo[2] is tc and memo[3] == position:
        hit: list[Any] = memo[4]
        return hit
    req = tc.request
    out = [(state.cpu_used[rows] + req.cpu_milli) / np.maximum(state.cpu_cap[rows], 1)]
    if req.memory:
        out.append((state.mem_used[rows] + req.memory) / np.maximum(state.mem_cap[rows], 1))
    if req.wants_gpu:
        cap = np.maximum(state.gpu_count[rows].astype(np.int64) * GPU_MILLI, 1)
        out.append((state.gpu_used_total[rows] + req.gpu_total_milli) / cap)
    memo[:] = [rows, state, tc, position, out]
    return out


# The last row_fractions call's (view, row, view position, request) and result: the scores of one
# row's refresh share it. Objects are compared by identity, as for _memo.
_row_memo: list[Any] = [None, -1, -1, None, None]


def row_fractions(req: ResourceRequest, state: ClusterArrays, r: int) -> list[float]:
    """fractions_after for one row, as floats, by the same arithmetic (the per-task refresh)."""
    memo = _row_memo
    position = state.dirty_position
    if memo[1] == r and memo[0] is state and memo[2] == position and memo[3] is req:
        hit: list[float] = memo[4]
        return hit
    out = [(state.cpu_used.item(r) + req.cpu_milli) / max(state.cpu_cap.item(r), 1)]
    if req.memory:
        out.append((state.mem_used.item(r) + req.memory) / max(state.mem_cap.item(r), 1))
    if req.wants_gpu:
        cap = max(state.gpu_count.item(r) * GPU_MILLI, 1)
        out.append((state.gpu_used_total.item(r) + req.gpu_total_milli) / cap)
    memo[:] = [state, r, position, req, out]
    return out


def _mean(parts: list[Any]) -> Any:
    # Summing a short list beats np.mean's generic reduction on the one-row hot path.
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total / len(parts) if len(parts) > 1 else total


@register
class MostAllocated(ScorePlugin):
    name = "most_allocated"
    dynamic = True

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        return 100.0 * _mean(fractions_after(tc, state, rows))

    def row_score(self, tc: TaskClass) -> RowScore:
        req = tc.request
        if _cpu_memory_only(req):
            return _cpu_memory_mean(req, 0.0, 100.0)
        return lambda state, r: 100.0 * _mean(row_fractions(req, state, r))

    def fraction_score(self, tc: TaskClass) -> FractionScore | None:
        return _mean_of_fractions(0.0, 100.0) if _cpu_memory_only(tc.request) else None


@register
class LeastAllocated(ScorePlugin):
    name = "least_allocated"
    dynamic = True

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        return 100.0 - 100.0 * _mean(fractions_after(tc, state, rows))

    def row_score(self, tc: TaskClass) -> RowScore:
        req = tc.request
        if _cpu_memory_only(req):
            return _cpu_memory_mean(req, 100.0, -100.0)
        return lambda state, r: 100.0 - 100.0 * _mean(row_fractions(req, state, r))

    def fraction_score(self, tc: TaskClass) -> FractionScore | None:
        return _mean_of_fractions(100.0, -100.0) if _cpu_memory_only(tc.request) else None


@register
class BalancedAllocation(ScorePlugin):
    """100 for a node whose resources are equally used after placement, lower as they diverge
    (100 times one minus the standard deviation of the used fractions)."""

    name = "balanced_allocation"
    dynamic = True

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return tc.request.memory > 0 or tc.request.wants_gpu

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        return _balanced(fractions_after(tc, state, rows))

    def row_score(self, tc: TaskClass) -> RowScore:
        req = tc.request
        if _cpu_memory_only(req):
            cpu, mem = req.cpu_milli, req.memory

            def cpu_memory(state: ClusterArrays, r: int) -> float:
                # _balanced of the two fractions, inline.
                gap = (state.cpu_used.item(r) + cpu) / max(state.cpu_cap.item(r), 1) - (
                    state.mem_used.item(r) + mem
                ) / max(state.mem_cap.item(r), 1)
                return 100.0 - 50.0 * abs(gap)

            return cpu_memory
        return lambda state, r: float(_balanced(row_fractions(req, state, r)))

    def fraction_score(self, tc: TaskClass) -> FractionScore | None:
        return _balance_of_fractions if _cpu_memory_only(tc.request) else None


def _cpu_memory_only(req: ResourceRequest) -> bool:
    """The request's fractions are cpu's and memory's (the usual task): the one-row scores then
    compute them inline, by the same arithmetic as row_fractions and _mean or _balanced."""
    return bool(req.memory) and not req.wants_gpu


def _cpu_memory_mean(req: ResourceRequest, offset: float, scale: float) -> RowScore:
    """offset + scale * the mean of the cpu and memory fractions on one row, inline: no list, no
    memo, no calls but numpy's item. The same floats as the generic path (negating the scale is
    exact, and adding 0.0 changes nothing)."""
    cpu, mem = req.cpu_milli, req.memory

    def cpu_memory(state: ClusterArrays, r: int) -> float:
        total = (state.cpu_used.item(r) + cpu) / max(state.cpu_cap.item(r), 1) + (
            state.mem_used.item(r) + mem
        ) / max(state.mem_cap.item(r), 1)
        return offset + scale * (total / 2)

    return cpu_memory


def _mean_of_fractions(offset: float, scale: float) -> FractionScore:
    """_cpu_memory_mean's score from the two fractions (the same floats)."""

    def score(cpu: float, mem: float) -> float:
        return offset + scale * ((cpu + mem) / 2)

    return score


def _balance_of_fractions(cpu: float, mem: float) -> float:
    """_balanced of two fractions, inline (the same float)."""
    return 100.0 - 50.0 * abs(cpu - mem)


def _balanced(fr: list[Any]) -> Any:
    if len(fr) == 2:  # the usual cpu+memory case: the deviation of two values is half their gap
        return 100.0 - 50.0 * abs(fr[0] - fr[1])
    mean = _mean(fr)
    # d * d, not d ** 2: on a Python float ** goes through pow(), which can differ from the product
    # in the last bit, and the one-row scalar path must match the vector path exactly.
    var = sum((f - mean) * (f - mean) for f in fr) / len(fr)
    return 100.0 - 100.0 * np.sqrt(var)
