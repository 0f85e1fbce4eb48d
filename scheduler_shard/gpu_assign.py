"""Which GPUs of the chosen node a task gets.

Whole GPUs: the set on one NUMA node with the most NVLink links among its members, taking the
NUMA node with the fewest free GPUs that still fits (keeps larger free groups whole). A GPU share
goes to the eligible GPU with the least room that still fits (best fit: keeps whole GPUs free);
when only whole free GPUs fit, to the one a one-GPU task would take (keeps NVLinked pairs and
NUMA groups whole for the multi-GPU tasks to come).
"""

import numpy as np

from gosched.common.cluster_state import MAX_GPUS, ClusterArrays
from gosched.common.resources import GPU_MILLI
from gosched.scheduler_shard.framework.task_class import TaskClass


def _links(nvlink_row: np.ndarray, chosen: list[int], g: int) -> int:
    mask = int(nvlink_row[g])
    return sum(1 for c in chosen if mask >> c & 1)


def _best_subset(candidates: list[int], k: int, nvlink_row: np.ndarray) -> tuple[list[int], int]:
    """Greedy from each start: repeatedly add the GPU with most links into the set; best total wins."""
    best: list[int] = []
    best_edges = -1
    for start in candidates:
        chosen = [start]
        edges = 0
        rest = [g for g in candidates if g != start]
        while len(chosen) < k:
            pick = max(rest, key=lambda g: (_links(nvlink_row, chosen, g), -g))
            edges += _links(nvlink_row, chosen, pick)
            chosen.append(pick)
            rest.remove(pick)
        if edges > best_edges:
            best, best_edges = sorted(chosen), edges
    return best, best_edges


_memo: dict[tuple[bytes, bytes, tuple[int, ...], int], list[int]] = {}


def choose_whole(
    free_gpus: list[int], k: int, numa_row: np.ndarray, nvlink_row: np.ndarray
) -> list[int] | None:
    if len(free_gpus) < k:
        return None
    # The answer depends only on the node's topology, its free GPUs and k: memoise it.
    key = (numa_row.tobytes(), nvlink_row.tobytes(), tuple(free_gpus), k)
    hit = _memo.get(key)
    if hit is None:
        if len(_memo) > 65536:
            _memo.clear()
        hit = _memo[key] = _choose_whole(free_gpus, k, numa_row, nvlink_row)
    return hit


def _choose_whole(free_gpus: list[int], k: int, numa_row: np.ndarray, nvlink_row: np.ndarray) -> list[int]:
    if k == 1:
        # A single GPU: from the NUMA node with the fewest free GPUs, to keep bigger groups intact.
        by_numa: dict[int, list[int]] = {}
        for g in free_gpus:
            by_numa.setdefault(int(numa_row[g]), []).append(g)
        group = min(by_numa.values(), key=lambda gs: (len(gs), gs[0]))
        # Prefer a GPU whose NVLink peers are taken, so linked free pairs survive.
        return [min(group, key=lambda g: (_links(nvlink_row, [p for p in group if p != g], g), g))]
    groups: dict[int, list[int]] = {}
    for g in free_gpus:
        groups.setdefault(int(numa_row[g]), []).append(g)
    fitting = [gs for numa, gs in groups.items() if len(gs) >= k and numa >= 0]
    options: list[tuple[tuple[int, int, int], list[int]]] = []
    for gs in fitting:
        subset, edges = _best_subset(gs, k, nvlink_row)
        options.append(((1, edges, -len(gs)), subset))
    if not options:  # no single NUMA node has room: span them, still maximising NVLink
        subset, edges = _best_subset(free_gpus, k, nvlink_row)
        options.append(((0, edges, 0), subset))
    return max(options, key=lambda o: o[0])[1]


def choose_gpus(tc: TaskClass, state: ClusterArrays, row: int) -> tuple[tuple[int, int], ...] | None:
    """(GPU index, milli) pairs for one task of class `tc` on `row`; None if they are not free."""
    req = tc.request
    if not req.wants_gpu:
        return ()
    eligible = tc.eligible_gpus(state)
    ok = state.gpu_exists[row] if eligible is None else eligible[row]
    free = state.gpu_free[row]
    if req.gpus:
        whole = [g for g in range(MAX_GPUS) if ok[g] and free[g] == GPU_MILLI]
        chosen = choose_whole(whole, req.gpus, state.gpu_numa[row], state.gpu_nvlink[row])
        return None if chosen is None else tuple((g, GPU_MILLI) for g in chosen)
    fits = [g for g in range(MAX_GPUS) if ok[g] and free[g] >= req.gpu_milli]
    if not fits:
        return None
    g = min(fits, key=lambda i: (int(free[i]), i))
    if free[g] == GPU_MILLI:  # no partly used GPU fits: each of `fits` is whole
        g = _choose_whole(fits, 1, state.gpu_numa[row], state.gpu_nvlink[row])[0]
    return ((g, req.gpu_milli),)
