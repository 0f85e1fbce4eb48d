"""GPU topology: a score preferring GPUs on one NUMA node, NVLinked, and the filters of the
required modes (TaskGroup.gpu_topology: single-numa, single-numa-nvlink).

gpu_topology (score), for multi-GPU tasks: 100: k free GPUs on one NUMA node with NVLink among
them; 70: one NUMA node, no link; 40: linked but across NUMA nodes; 0 otherwise. Tasks of fewer
than two whole GPUs are not its concern.

gpu_topology_hardware (static) and gpu_topology_fit (dynamic), for a task of k >= 2 whole GPUs
under a required mode: the node has k GPUs the task may use (model, memory) within one group of
its rule (gpu_assign.rule_groups: one known NUMA node; for the NVLink mode, an NVLink-connected
set within one), at all / fully free now. They split as gpu_model and resources_fit do: the
hardware verdict is cached per class and metadata generation, keeps preemption from searching
for victims on nodes that could never do, and tells "why pending" that waiting will not help;
the fit verdict's reason starts with "insufficient", so the dispatcher may hold a reservation
for the task (room on one NUMA node comes back when tasks there end).
"""

import numpy as np

from gosched.common.cluster_state import MAX_GPUS, ClusterArrays
from gosched.common.job import GpuTopologyMode
from gosched.common.resources import GPU_MILLI
from gosched.scheduler_shard.framework.interfaces import (
    FilterPlugin,
    Mask,
    RowFilter,
    Rows,
    ScorePlugin,
    Scores,
)
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.framework.task_class import TaskClass
from gosched.scheduler_shard.gpu_assign import rule_fits

_BITS = (1 << np.arange(MAX_GPUS, dtype=np.int64)).astype(np.int64)
PREFERRED = GpuTopologyMode.PREFERRED
NVLINK = GpuTopologyMode.SINGLE_NUMA_NVLINK


def most_on_one_numa(gpus: Mask, numa: np.ndarray) -> np.ndarray:
    """Per row: the most of `gpus` (rows x GPUs) on one known NUMA node (-1 counts for none)."""
    best = np.zeros(gpus.shape[0], np.int64)
    # The NUMA ids present, not range(max): an id may be large (up to 1023) and the nodes have few.
    for n in np.unique(numa[gpus & (numa >= 0)]).tolist():
        best = np.maximum(best, (gpus & (numa == n)).sum(axis=1))
    return best


def most_linked_on_one_numa(gpus: Mask, numa: np.ndarray, nvlink: np.ndarray) -> np.ndarray:
    """Per row: the largest set of `gpus` on one known NUMA node whose members all reach each other
    over NVLink links among themselves (gpu_assign._linked_parts, vectorised)."""
    known = gpus & (numa >= 0)
    same = np.zeros(gpus.shape, np.int64)  # per GPU: the bitmask of `known` GPUs on its NUMA node
    for n in np.unique(numa[known]).tolist():
        members = known & (numa == n)
        same |= np.where(members, (members * _BITS).sum(axis=1)[:, None], 0)
    # reach[r, g]: the GPUs g reaches; grown by the reach of each GPU it reaches until it holds
    # (each round at least doubles the path length covered: at most log2(16) + 1 rounds).
    reach = np.where(known, (nvlink & same) | _BITS, 0)
    while True:
        grown = reach.copy()
        for h in range(MAX_GPUS):
            grown |= np.where((reach >> h) & 1 != 0, reach[:, h : h + 1], 0)
        if np.array_equal(grown, reach):
            break
        reach = grown
    return np.bitwise_count(reach).max(axis=1, initial=0).astype(np.int64)


def rule_capacity(gpus: Mask, numa: np.ndarray, nvlink: np.ndarray, mode: GpuTopologyMode, k: int) -> Mask:
    """Rows where one group of `mode`'s rule holds `k` of `gpus` (rows x GPUs)."""
    ok: Mask = most_on_one_numa(gpus, numa) >= k
    if mode is NVLINK and ok.any():
        idx = np.flatnonzero(ok)  # linking matters only where one NUMA node holds enough
        ok[idx] = most_linked_on_one_numa(gpus[idx], numa[idx], nvlink[idx]) >= k
    return ok


def _usable(tc: TaskClass, state: ClusterArrays, rows: Rows) -> Mask:
    eligible = tc.eligible_gpus(state)
    return state.gpu_exists[rows] if eligible is None else eligible[rows]


def _hardware_reasons(
    tc: TaskClass, state: ClusterArrays, rows: Rows, usable: Mask
) -> list[tuple[str, Mask]]:
    mode = tc.group.gpu_topology_rule
    ok = rule_capacity(usable, state.gpu_numa[rows], state.gpu_nvlink[rows], mode, tc.gpu_whole)
    # A node whose GPUs' NUMA node the agent could not read (a VM, an old driver) never meets the
    # rule: say so, or its owner looks for busy GPUs that are not there.
    unknown = (usable & (state.gpu_numa[rows] < 0)).any(axis=1)
    what = "NVLinked GPUs" if mode is NVLINK else "GPUs"
    return [
        (f"GPU NUMA node unknown (gpu_topology: {mode.value})", ~ok & unknown),
        (f"too few {what} on one NUMA node (gpu_topology: {mode.value})", ~ok),
    ]


class _RequiredTopology(FilterPlugin):
    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return tc.group.gpu_topology_rule is not PREFERRED  # a required mode, 2+ whole GPUs


@register
class GpuTopologyHardware(_RequiredTopology):
    """The node has the task's k GPUs (of its model and memory) within one group of its rule."""

    name = "gpu_topology_hardware"
    reason = "too few GPUs on one NUMA node (gpu_topology)"

    def filter(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Mask:
        usable = _usable(tc, state, rows)
        mode = tc.group.gpu_topology_rule
        return rule_capacity(usable, state.gpu_numa[rows], state.gpu_nvlink[rows], mode, tc.gpu_whole)

    def explain(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> list[tuple[str, Mask]]:
        return _hardware_reasons(tc, state, rows, _usable(tc, state, rows))


@register
class GpuTopologyFit(_RequiredTopology):
    """The task's k GPUs are fully free within one group of its rule now."""

    name = "gpu_topology_fit"
    reason = "insufficient free GPUs on one NUMA node (gpu_topology)"
    dynamic = True
    resolvable_by_preemption = True

    def filter(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Mask:
        free = (state.gpu_free[rows] == GPU_MILLI) & _usable(tc, state, rows)
        mode = tc.group.gpu_topology_rule
        return rule_capacity(free, state.gpu_numa[rows], state.gpu_nvlink[rows], mode, tc.gpu_whole)

    def row_filter(self, tc: TaskClass) -> RowFilter | None:
        return lambda state, row: rule_fits(tc, state, row)

    def explain(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> list[tuple[str, Mask]]:
        # The hardware reasons first, for a profile without gpu_topology_hardware (with it, the
        # static filters are asked first and these rows are no longer counted here).
        mode = tc.group.gpu_topology_rule
        what = "NVLinked GPUs" if mode is NVLINK else "GPUs"
        busy = f"insufficient free {what} on one NUMA node (gpu_topology: {mode.value})"
        return [
            *_hardware_reasons(tc, state, rows, _usable(tc, state, rows)),
            (busy, ~self.filter(tc, state, rows)),
        ]


@register
class GpuTopology(ScorePlugin):
    name = "gpu_topology"
    dynamic = True

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return tc.gpu_whole >= 2

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        k = tc.gpu_whole
        free = (state.gpu_free[rows] == GPU_MILLI) & _usable(tc, state, rows)
        same_numa = most_on_one_numa(free, state.gpu_numa[rows]) >= k
        free_bits = (free * _BITS).sum(axis=1)
        linked = ((state.gpu_nvlink[rows] & free_bits[:, None]) != 0) & free
        nvlinked = linked.sum(axis=1) >= k
        return np.where(same_numa & nvlinked, 100.0, np.where(same_numa, 70.0, np.where(nvlinked, 40.0, 0.0)))
