"""Which GPUs of the chosen node a task gets.

Whole GPUs: the set on one NUMA node with the most NVLink links among its members, taking the
NUMA node with the fewest free GPUs that still fits (keeps larger free groups whole); when no NUMA
node has room, a set across them with the most links, unless the task's gpu_topology mode is a
required one (`rule_groups`): then only a set within one group of that rule, or none. A GPU share
goes to the eligible GPU with the least room that still fits (best fit: keeps whole GPUs free);
when only whole free GPUs fit, to the one a one-GPU task would take (keeps NVLinked pairs and
NUMA groups whole for the multi-GPU tasks to come).
"""

import numpy as np

from gosched.common.cluster_state import MAX_GPUS, ClusterArrays
from gosched.common.job import GpuTopologyMode
from gosched.common.resources import GPU_MILLI
from gosched.scheduler_shard.framework.task_class import TaskClass

PREFERRED = GpuTopologyMode.PREFERRED
NVLINK = GpuTopologyMode.SINGLE_NUMA_NVLINK


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


def rule_groups(
    free_gpus: list[int], numa_row: np.ndarray, nvlink_row: np.ndarray, mode: GpuTopologyMode
) -> list[list[int]]:
    """The sets of `free_gpus` a task under a required `mode` may take all its GPUs from: those of
    each known NUMA node (a GPU whose NUMA node is unknown, -1, is in none), and for the NVLink mode
    each NVLink-connected set within them. The GPU filters (plugins/gpu_topology.py) count the same
    sets, vectorised over rows."""
    by_numa: dict[int, int] = {}  # NUMA node -> bitmask of its free GPUs
    for g in free_gpus:
        numa = int(numa_row[g])
        if numa >= 0:
            by_numa[numa] = by_numa.get(numa, 0) | 1 << g
    masks = list(by_numa.values())
    if mode is NVLINK:
        masks = [part for mask in masks for part in _linked_parts(mask, nvlink_row)]
    return [[g for g in range(MAX_GPUS) if mask >> g & 1] for mask in masks]


def _linked_parts(mask: int, nvlink_row: np.ndarray) -> list[int]:
    """`mask`'s GPUs split into NVLink-connected sets (links between members of `mask` only)."""
    parts = []
    rest = mask
    while rest:
        part = frontier = rest & -rest  # the lowest GPU left starts a set
        while frontier:
            g = frontier.bit_length() - 1
            frontier &= ~(1 << g)
            new = int(nvlink_row[g]) & mask & ~part
            part |= new
            frontier |= new
        parts.append(part)
        rest &= ~part
    return parts


_memo: dict[tuple[bytes, bytes, tuple[int, ...], int, GpuTopologyMode], list[int] | None] = {}
_UNKNOWN: list[int] = []  # a marker: not memoised yet (a memoised answer may be None)


def choose_whole(
    free_gpus: list[int],
    k: int,
    numa_row: np.ndarray,
    nvlink_row: np.ndarray,
    mode: GpuTopologyMode = PREFERRED,
) -> list[int] | None:
    """`k` of `free_gpus`, or None when they are too few or (a required `mode`) no set keeps its rule."""
    if len(free_gpus) < k:
        return None
    if k < 2:
        mode = PREFERRED  # one GPU is on one NUMA node by itself (TaskGroup.gpu_topology_rule)
    # The answer depends only on the node's topology, its free GPUs, k and the mode: memoise it.
    key = (numa_row.tobytes(), nvlink_row.tobytes(), tuple(free_gpus), k, mode)
    hit = _memo.get(key, _UNKNOWN)
    if hit is _UNKNOWN:
        if len(_memo) > 65536:
            _memo.clear()
        if mode is PREFERRED:
            hit = _choose_whole(free_gpus, k, numa_row, nvlink_row)
        else:
            hit = _choose_in_groups(rule_groups(free_gpus, numa_row, nvlink_row, mode), k, nvlink_row)
        _memo[key] = hit
    return hit


def _choose_in_groups(groups: list[list[int]], k: int, nvlink_row: np.ndarray) -> list[int] | None:
    """The most-linked k-set within one of `groups`, the smallest group on ties; None: none fits.
    Within an NVLink-connected group the greedy growth of _best_subset stays connected: while the
    set is smaller than its group, some member outside the set is linked to it, and any member
    not linked to it has no link into it, so never wins."""
    options = []
    for gs in groups:
        if len(gs) >= k:
            subset, edges = _best_subset(gs, k, nvlink_row)
            options.append(((edges, -len(gs)), subset))
    return max(options, key=lambda o: o[0])[1] if options else None


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


def free_whole_gpus(tc: TaskClass, state: ClusterArrays, row: int) -> list[int]:
    """The GPUs of `row` that are fully free and that `tc` may use (model, memory), ascending."""
    eligible = tc.eligible_gpus(state)
    ok = state.gpu_exists[row] if eligible is None else eligible[row]
    free = state.gpu_free[row]
    return [g for g in range(MAX_GPUS) if ok[g] and free[g] == GPU_MILLI]


def rule_fits(tc: TaskClass, state: ClusterArrays, row: int) -> bool:
    """Whether `row` has the class's whole GPUs free within one group of its required gpu_topology
    rule (the scalar twin of the gpu_topology_fit filter; choose_gpus then finds such a set)."""
    free = free_whole_gpus(tc, state, row)
    k = tc.gpu_whole
    if len(free) < k:
        return False
    groups = rule_groups(free, state.gpu_numa[row], state.gpu_nvlink[row], tc.group.gpu_topology_rule)
    return any(len(gs) >= k for gs in groups)


def choose_gpus(tc: TaskClass, state: ClusterArrays, row: int) -> tuple[tuple[int, int], ...] | None:
    """(GPU index, milli) pairs for one task of class `tc` on `row`; None if they are not free (or,
    under a required gpu_topology rule, not free together within one of its groups)."""
    req = tc.request
    if not req.wants_gpu:
        return ()
    if req.gpus:
        whole = free_whole_gpus(tc, state, row)
        mode = tc.group.gpu_topology  # choose_whole idles the rule for one GPU (gpu_topology_rule)
        chosen = choose_whole(whole, req.gpus, state.gpu_numa[row], state.gpu_nvlink[row], mode)
        return None if chosen is None else tuple((g, GPU_MILLI) for g in chosen)
    eligible = tc.eligible_gpus(state)
    ok = state.gpu_exists[row] if eligible is None else eligible[row]
    free = state.gpu_free[row]
    fits = [g for g in range(MAX_GPUS) if ok[g] and free[g] >= req.gpu_milli]
    if not fits:
        return None
    g = min(fits, key=lambda i: (int(free[i]), i))
    if free[g] == GPU_MILLI:  # no partly used GPU fits: each of `fits` is whole
        g = _choose_whole(fits, 1, state.gpu_numa[row], state.gpu_nvlink[row])[0]
    return ((g, req.gpu_milli),)
