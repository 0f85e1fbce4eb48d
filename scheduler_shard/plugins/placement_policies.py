"""Baseline GPU placement policies from the fragmentation study (FGD, ATC'23), as score plugins.

They let `gosched replay` compare our default chain against the published baselines: random,
best_fit, gpu_packing, gpu_clustering and dot_product. Each scores on a fixed 0..100 scale.
"""

import numpy as np

from gosched.common.cluster_state import ClusterArrays
from gosched.common.resources import GPU_MILLI
from gosched.scheduler_shard.framework.interfaces import Rows, ScorePlugin, Scores
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.framework.task_class import TaskClass


def _rows(state: ClusterArrays, rows: Rows) -> np.ndarray:
    return np.arange(state.n)[rows]


@register
class RandomScore(ScorePlugin):
    """A random score per node (refreshed when the node changes): random placement."""

    name = "random"
    dynamic = True

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        return self.rng.uniform(0.0, 100.0, len(_rows(state, rows)))


@register
class BestFit(ScorePlugin):
    """Least CPU and GPU left on the node after placement (the mean of the used fractions)."""

    name = "best_fit"
    dynamic = True

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        req = tc.request
        cpu = (state.cpu_used[rows] + req.cpu_milli) / np.maximum(state.cpu_cap[rows], 1)
        gpu_cap = np.maximum(state.gpu_count[rows].astype(np.int64) * GPU_MILLI, 1)
        gpu = (state.gpu_used_total[rows] + req.gpu_total_milli) / gpu_cap
        return 50.0 * (np.minimum(cpu, 1.0) + np.minimum(gpu, 1.0))


@register
class DotProduct(ScorePlugin):
    """Alignment of the demand with what the node has free (Tetris): sum of demand x free shares."""

    name = "dot_product"
    dynamic = True

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        req = tc.request
        cpu_cap = np.maximum(state.cpu_cap[rows], 1)
        gpu_cap = np.maximum(state.gpu_count[rows].astype(np.int64) * GPU_MILLI, 1)
        cpu_free = (state.cpu_cap[rows] - state.cpu_used[rows]) / cpu_cap
        gpu_free = (gpu_cap - state.gpu_used_total[rows]) / gpu_cap
        align = (req.cpu_milli / cpu_cap) * cpu_free + (req.gpu_total_milli / gpu_cap) * gpu_free
        return 50.0 * np.minimum(align, 2.0)


@register
class GpuPacking(ScorePlugin):
    """Fill GPUs already in use first, then nodes already in use, then idle nodes."""

    name = "gpu_packing"
    dynamic = True

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return tc.request.wants_gpu

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        free = state.gpu_free[rows]
        exists = state.gpu_exists[rows]
        partial = exists & (free < GPU_MILLI)
        node_used = state.gpu_used_total[rows] > 0
        if tc.gpu_share:
            on_partial = (partial & (free >= tc.gpu_share)).any(axis=1)
        else:
            on_partial = np.zeros(len(node_used), np.bool_)
        tier = np.where(on_partial, 90.0, np.where(node_used, 60.0, 20.0))
        idle_share = state.free_whole[rows] / np.maximum(state.gpu_count[rows], 1)
        return tier - 10.0 * idle_share


@register
class GpuClustering(ScorePlugin):
    """Keep tasks of the same GPU demand together: the share of the node's GPU tasks that match."""

    name = "gpu_clustering"
    dynamic = True

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return tc.request.wants_gpu

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        want = tc.request.gpu_total_milli
        out = []
        for row in _rows(state, rows):
            gpu_tasks = [r for r in state.residents[row].values() if r.gpus]
            if not gpu_tasks:
                out.append(50.0)
                continue
            same = sum(1 for r in gpu_tasks if sum(m for _, m in r.gpus) == want)
            out.append(100.0 * same / len(gpu_tasks))
        return np.array(out, np.float64)
