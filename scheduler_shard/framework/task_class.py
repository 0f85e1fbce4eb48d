"""A task class: the part of a task that decides where it may go. Identical tasks share one."""

from dataclasses import dataclass, field

import numpy as np

from gosched.common.cluster_state import ClusterArrays
from gosched.common.job import TaskGroup
from gosched.common.resources import GPU_MILLI, ResourceRequest


@dataclass(slots=True)
class TaskClass:
    key: tuple[object, ...]
    group: TaskGroup
    # Per-GPU eligibility (model and memory floor) for GPU tasks, None when any GPU will do.
    gpu_eligible: np.ndarray | None = None
    gpu_eligible_gen: int = -1
    ext_cols: list[tuple[int | None, int]] = field(default_factory=list)
    wants_gpu: bool = False  # request.wants_gpu, read once: the placer asks it per task placed

    @property
    def request(self) -> ResourceRequest:
        return self.group.resources

    def eligible_gpus(self, state: ClusterArrays) -> np.ndarray | None:
        """(rows x GPUs) mask of GPUs this class may use; None means every existing GPU."""
        req = self.request
        if not req.wants_gpu or (not self.group.gpu_models and req.gpu_memory_mib == 0):
            return None
        if self.gpu_eligible_gen != state.meta_generation or self.gpu_eligible is None:
            mask = state.gpu_exists.copy()
            if self.group.gpu_models:
                ids = [state.model_id(m) for m in self.group.gpu_models]
                mask &= np.isin(state.gpu_model, ids)
            if req.gpu_memory_mib:
                mask &= state.gpu_mem >= req.gpu_memory_mib
            self.gpu_eligible = mask
            self.gpu_eligible_gen = state.meta_generation
        return self.gpu_eligible

    @property
    def gpu_whole(self) -> int:
        return self.request.gpus

    @property
    def gpu_share(self) -> int:
        return self.request.gpu_milli if self.request.gpus == 0 else 0


def class_of(group: TaskGroup) -> TaskClass:
    return TaskClass(key=group.constraint_key(), group=group, wants_gpu=group.resources.wants_gpu)


FULL = GPU_MILLI
