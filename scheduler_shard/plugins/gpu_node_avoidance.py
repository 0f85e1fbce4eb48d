"""gpu_node_avoidance: keep tasks that want no GPU off GPU nodes while other nodes fit them.

A CPU-only task on a GPU node takes CPU and memory that the GPU tasks for that node's GPUs will
need, and bin-packing (most_allocated) happily puts it there. For a task class that asks for no GPU
(no whole GPU and no milli share) the score is

    100      on a node without GPUs,
    50 / k   on a node with k GPUs (1 GPU: 50, 2: 25, 4: 12.5, 8: 6.25).

A preference, not a filter: when only GPU nodes fit, the task still goes to one of them, the one with
the fewest GPUs first (the least GPU capacity whose CPU and memory it competes for). The scale is the
node's GPU count, not its free GPUs: GPUs busy now are free again when their tasks end, and a
long-running CPU task still holds the node's CPU then; and the count is node metadata, so the score
is static (computed once per view and metadata generation for all classes, then read from the
class cache's static part, with nothing to refresh per placement). On the openb trace replay (GPU
nodes only, the default score chain) scaling by the free GPUs instead raised the GPU allocation no
more than scaling by the count did.

A soft rule (`soft_rule`): a shard whose own node partition fits the task only on GPU nodes takes
a node elsewhere that scores higher here, when one fits (ClassCache.softer_row), rather than eat a
GPU node's CPU and memory.

For a GPU task the score is a constant (the plugin is not relevant to it), as it is when every live
node scores alike (no GPU node, or only GPU nodes of one size): nothing to prefer.

Weight (common/config.py, DEFAULT_SCORES: 3). For a CPU-only task most_allocated plus
balanced_allocation (weight 1 each) sum to 100 + 100 * min(cpu, memory used fraction after
placement), so they differ by at most 100 between two nodes; gpu_fragmentation scores a node
without GPUs 50 and a GPU node at most 50, so it never pulls toward a GPU node. Weighted 3, this
score puts a node without GPUs at least 150 above a 1-GPU node (and 281 above an 8-GPU one): more
than bin-packing can make up. Explicit preferences (preferred_affinity, an untolerated
PreferNoSchedule taint, weight 1 each) still count against it; a task that must run on a GPU node
says so with a node selector or required affinity.
"""

import numpy as np

from gosched.common.cluster_state import ClusterArrays
from gosched.scheduler_shard.framework.interfaces import Rows, ScorePlugin, Scores
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.framework.task_class import TaskClass

NO_GPU_SCORE = 100.0
ONE_GPU_SCORE = 50.0  # a node with k GPUs scores ONE_GPU_SCORE / k


def node_scores(state: ClusterArrays) -> np.ndarray:
    """The score of every row [0, n) for a task that wants no GPU."""
    count = state.gpu_count[: state.n]
    return np.where(count == 0, NO_GPU_SCORE, ONE_GPU_SCORE / np.maximum(count, 1))


@register
class GpuNodeAvoidance(ScorePlugin):
    name = "gpu_node_avoidance"
    soft_rule = True

    def __init__(self) -> None:
        # The rows' scores for the view and metadata generation of `_key`, and whether they differ
        # among the live rows (else the score is a constant and not worth adding).
        self._key: tuple[int, int, int] | None = None
        self._scores = np.zeros(0, np.float64)
        self._varies = False

    def _table(self, state: ClusterArrays) -> np.ndarray:
        key = (id(state), state.meta_generation, state.n)
        if key != self._key:
            scores = node_scores(state)
            scores.flags.writeable = False
            live = scores[state.alive[: state.n]]
            self._scores, self._varies = scores, bool(live.size and live.min() != live.max())
            self._key = key
        return self._scores

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        if tc.request.wants_gpu:
            return False
        self._table(state)
        return self._varies

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        table = self._table(state)
        if tc.request.wants_gpu:
            return np.zeros_like(table[rows])
        return table[rows]
