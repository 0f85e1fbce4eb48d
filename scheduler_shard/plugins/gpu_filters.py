"""gpu_model and gpu_memory: the node has enough GPUs of an acceptable model / memory size at all.

They look at the hardware only; whether those GPUs are free now is resources_fit's question.
gpu_memory counts the GPUs that are both big enough and of a wanted model: a node whose wanted
model is too small and whose big GPU is of another model has no GPU the task can use, and saying
so here keeps "why pending" from blaming it on busy GPUs (resources_fit).
"""

import numpy as np

from gosched.common.cluster_state import ClusterArrays
from gosched.scheduler_shard.framework.interfaces import FilterPlugin, Mask, Rows
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.framework.task_class import TaskClass


def _needed(tc: TaskClass) -> int:
    return max(1, tc.gpu_whole)


def eligibility_reason(tc: TaskClass) -> str:
    """Why a node has too few GPUs of the task's model and memory at all (for any filter that
    finds so, so that each such node is counted under one reason)."""
    if tc.group.gpu_models:
        return GpuMemory.model_reason if tc.request.gpu_memory_mib else GpuModel.reason
    return GpuMemory.reason if tc.request.gpu_memory_mib else "too few GPUs"


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
    model_reason = "no GPU of the wanted model with enough memory"

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return tc.request.wants_gpu and tc.request.gpu_memory_mib > 0

    def filter(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Mask:
        # The GPUs the task may use (existing, of a wanted model, big enough): the same per-GPU
        # mask resources_fit and the GPU choice use, cached per class and metadata generation.
        eligible = tc.eligible_gpus(state)
        assert eligible is not None  # relevant(): a GPU memory floor is set
        return eligible[rows].sum(axis=1) >= _needed(tc)

    def explain(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> list[tuple[str, Mask]]:
        return [(eligibility_reason(tc), ~self.filter(tc, state, rows))]
