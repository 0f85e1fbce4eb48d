"""gpu_topology: for multi-GPU tasks, prefer nodes that can give GPUs on one NUMA node, NVLinked.

100: k free GPUs on one NUMA node with NVLink among them; 70: one NUMA node, no link; 40: linked
but across NUMA nodes; 0 otherwise. Tasks of fewer than two whole GPUs are not its concern.
"""

import numpy as np

from gosched.common.cluster_state import MAX_GPUS, ClusterArrays
from gosched.common.resources import GPU_MILLI
from gosched.scheduler_shard.framework.interfaces import Rows, ScorePlugin, Scores
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.framework.task_class import TaskClass

_BITS = (1 << np.arange(MAX_GPUS, dtype=np.int64)).astype(np.int64)


@register
class GpuTopology(ScorePlugin):
    name = "gpu_topology"
    dynamic = True

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return tc.gpu_whole >= 2

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        k = tc.gpu_whole
        eligible = tc.eligible_gpus(state)
        free = state.gpu_free[rows] == GPU_MILLI
        free &= state.gpu_exists[rows] if eligible is None else eligible[rows]
        numa = state.gpu_numa[rows]
        best_numa = np.zeros(free.shape[0], np.int64)
        for n in range(int(numa.max(initial=-1)) + 1):
            best_numa = np.maximum(best_numa, (free & (numa == n)).sum(axis=1))
        same_numa = best_numa >= k
        free_bits = (free * _BITS).sum(axis=1)
        linked = ((state.gpu_nvlink[rows] & free_bits[:, None]) != 0) & free
        nvlinked = linked.sum(axis=1) >= k
        return np.where(same_numa & nvlinked, 100.0, np.where(same_numa, 70.0, np.where(nvlinked, 40.0, 0.0)))
