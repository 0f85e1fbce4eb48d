"""gpu_model and gpu_memory: the node has enough GPUs of an acceptable model / memory size at all.

They look at the hardware only; whether those GPUs are free now is resources_fit's question.
"""

import numpy as np

from gosched.common.cluster_state import ClusterArrays
from gosched.scheduler_shard.framework.interfaces import FilterPlugin, Mask, Rows
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.framework.task_class import TaskClass


def _needed(tc: TaskClass) -> int:
    return max(1, tc.gpu_whole)


@register
class GpuModel(FilterPlugin):
    """The node has enough GPUs (of an acceptable model, when the task names models)."""

    name = "gpu_model"
    reason = "no GPU of the wanted model"

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return tc.request.wants_gpu

    def filter(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Mask:
        if not tc.group.gpu_models:
            return state.gpu_count[rows] >= _needed(tc)
        ids = [state.model_id(m) for m in tc.group.gpu_models]
        matching = np.isin(state.gpu_model[rows], ids) & state.gpu_exists[rows]
        return matching.sum(axis=1) >= _needed(tc)

    def explain(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> list[tuple[str, Mask]]:
        reason = self.reason if tc.group.gpu_models else "too few GPUs"
        return [(reason, ~self.filter(tc, state, rows))]


@register
class GpuMemory(FilterPlugin):
    name = "gpu_memory"
    reason = "GPU memory too small"

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return tc.request.wants_gpu and tc.request.gpu_memory_mib > 0

    def filter(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Mask:
        big = (state.gpu_mem[rows] >= tc.request.gpu_memory_mib) & state.gpu_exists[rows]
        return big.sum(axis=1) >= _needed(tc)
