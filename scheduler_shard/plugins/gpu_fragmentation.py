"""gpu_fragmentation: a fragmentation-gradient score for GPU tasks (after FGD, ATC'23).

A node's fragmentation for a task type is the free GPU capacity that type cannot use there: all of
it when the type does not fit, else the GPUs too small for it. Its expected fragmentation weighs
types by popularity, which the plugin learns from the tasks it scores. A placement scores by how
little it raises that expectation: 50 for no change, higher when it fills fragments.
"""

import numpy as np

from gosched.common.cluster_state import ClusterArrays
from gosched.common.resources import GPU_MILLI
from gosched.scheduler_shard.framework.interfaces import Rows, ScorePlugin, Scores
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.framework.task_class import TaskClass

# Task types as GPU demand in milli: shares of one GPU, then whole GPUs (as multiples of 1000).
TYPES = np.array([100, 250, 500, 750, 1000, 2000, 4000, 8000], np.int64)
# A prior popularity, roughly that of shared GPU clusters; learned counts are added to it.
PRIOR = np.array([5, 10, 15, 5, 40, 10, 8, 7], np.float64)
SCALE = 40.0  # milli-GPU of expected fragmentation per score point


def expected_fragmentation(free: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """free: (rows, GPUs) milli free per GPU (0 for absent GPUs). Returns (rows,) expected milli."""
    total_free = free.sum(axis=1)
    whole_free = (free == GPU_MILLI).sum(axis=1)
    out = np.zeros(free.shape[0], np.float64)
    for demand, weight in zip(TYPES, weights, strict=True):
        if demand < GPU_MILLI:
            small = np.where(free < demand, free, 0).sum(axis=1)
            frag = small  # when no GPU fits, every GPU is "small": all free capacity counts
        else:
            k = demand // GPU_MILLI
            partial = np.where(free < GPU_MILLI, free, 0).sum(axis=1)
            frag = np.where(whole_free >= k, partial, total_free)
        out += weight * frag
    return out


def after_placement(tc: TaskClass, free: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    """Each row's free vector after placing one task of `tc` there (as gpu_assign would)."""
    after = free.copy()
    rows = np.arange(free.shape[0])
    if tc.gpu_whole:
        full = (free == GPU_MILLI) & eligible
        # Zero the first k fully free eligible GPUs (which ones does not change the measure).
        order = np.cumsum(full, axis=1)
        after[full & (order <= tc.gpu_whole)] = 0
    else:
        fits = (free >= tc.gpu_share) & eligible
        room = np.where(fits, free, np.iinfo(np.int32).max)
        best = room.argmin(axis=1)
        has = fits.any(axis=1)
        after[rows[has], best[has]] -= tc.gpu_share
    return after


@register
class GpuFragmentation(ScorePlugin):
    name = "gpu_fragmentation"
    dynamic = True

    def __init__(self) -> None:
        self.counts = PRIOR.copy()

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return tc.request.wants_gpu

    def observe(self, tc: TaskClass, n: int = 1) -> None:
        """Count `n` tasks of this class toward the learned popularity of task types."""
        demand = tc.request.gpu_total_milli
        self.counts[int(np.abs(TYPES - demand).argmin())] += n

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        weights = self.counts / self.counts.sum()
        eligible_all = tc.eligible_gpus(state)
        exists = state.gpu_exists[rows]
        eligible = exists if eligible_all is None else eligible_all[rows]
        free = np.where(exists, state.gpu_free[rows], 0).astype(np.int64)
        before = expected_fragmentation(free, weights)
        after = expected_fragmentation(after_placement(tc, free, eligible), weights)
        return np.clip(50.0 - (after - before) / SCALE, 0.0, 100.0)
