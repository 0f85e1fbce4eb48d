"""gpu_fragmentation: a fragmentation-gradient score for GPU tasks (after FGD, USENIX ATC'23).

A node's fragmentation for a task type is the free GPU capacity that type cannot use there: all of
it when the type does not fit on the node (too few GPUs free, or too little CPU), else the GPUs too
small for it. The expected fragmentation weighs the types by popularity; the plugin learns the
types (exact GPU demand, mean CPU) from the tasks the shard places, starting from a small prior. A
placement scores by how little it raises the node's expected fragmentation: 50 for no change,
higher when it fills fragments, lower when it creates them.
"""

import numpy as np

from gosched.common.cluster_state import ClusterArrays
from gosched.common.resources import GPU_MILLI
from gosched.scheduler_shard.framework.interfaces import Rows, ScorePlugin, Scores
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.framework.task_class import TaskClass

# Prior task types (GPU milli demand, CPU milli) and popularity, roughly a shared GPU cluster's.
GiB = 2**30
PRIOR = (
    ((250, 4000, 8 * GiB), 2.0),
    ((500, 4000, 16 * GiB), 2.0),
    ((1000, 8000, 32 * GiB), 4.0),
    ((2000, 16000, 64 * GiB), 1.0),
    ((8000, 64000, 256 * GiB), 1.0),
)
MAX_TYPES = 64  # most popular learned types kept in the model
# The scored model is looked at again each time the tasks seen grow by this share, and retaken
# when its weights moved by more than this much in total (L1, out of 2).
REFRESH_GROWTH = 0.1
MODEL_TOLERANCE = 0.05
# The score maps the change d in expected fragmentation (milli-GPU) to 50 * (1 - d / (|d| + HALF)):
# strictly decreasing, so no two changes tie by clipping, and 25 or 75 at d = +-HALF.
HALF = 1000.0


class TaskTypes:
    """Popularity of task types, a type being an exact (GPU milli, CPU milli, memory) demand.

    The scores use a snapshot of the popularity, not the live counts: cached scores must all come
    from one model, and invalidating them on every task would cost a full pass per placement. Once
    the tasks seen grow by REFRESH_GROWTH since the last look, the snapshot is retaken (and
    `generation` bumped) if the weights moved by more than MODEL_TOLERANCE in total: a workload
    whose mix is steady stops invalidating the scores.
    """

    def __init__(self) -> None:
        self.count: dict[tuple[int, int, int], float] = dict(PRIOR)
        self.generation = 0
        self._seen = self._looked_at = sum(self.count.values())
        self._weights = self._top_weights()
        self._arrays = self._as_arrays(self._weights)

    def observe(self, gpu_milli: int, cpu_milli: int, memory: int = 0, n: int = 1) -> None:
        if gpu_milli <= 0:
            return  # a CPU-only type cannot use GPUs: it has no GPU fragmentation
        key = (gpu_milli, cpu_milli, memory)
        self.count[key] = self.count.get(key, 0.0) + n
        self._seen += n
        if self._seen >= self._looked_at * (1.0 + REFRESH_GROWTH):
            self._looked_at = self._seen
            weights = self._top_weights()
            moved = sum(abs(w - self._weights.get(k, 0.0)) for k, w in weights.items())
            moved += sum(w for k, w in self._weights.items() if k not in weights)
            if moved > MODEL_TOLERANCE:
                self._weights, self._arrays = weights, self._as_arrays(weights)
                self.generation += 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(GPU demand milli, weight summing to 1, CPU milli, memory) of the most popular types,
        as of the last snapshot."""
        return self._arrays

    def _top_weights(self) -> dict[tuple[int, int, int], float]:
        top = sorted(self.count, key=lambda k: -self.count[k])[:MAX_TYPES]
        total = sum(self.count[k] for k in top)
        return {k: self.count[k] / total for k in top}

    @staticmethod
    def _as_arrays(
        weights: dict[tuple[int, int, int], float],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        keys = list(weights)
        demand = np.array([k[0] for k in keys], np.int64)
        weight = np.array([weights[k] for k in keys], np.float64)
        cpu = np.array([k[1] for k in keys], np.float64)
        memory = np.array([k[2] for k in keys], np.float64)
        return demand, weight, cpu, memory


def expected_fragmentation(
    free: np.ndarray, cpu_free: np.ndarray, mem_free: np.ndarray, types: TaskTypes
) -> np.ndarray:
    """free: (rows, GPUs) milli free per GPU (0 for absent GPUs); cpu_free, mem_free: (rows,).

    Returns (rows,) expected fragmented milli-GPU, all types at once (rows x GPUs x types).
    """
    demand, weight, cpu, memory = types.arrays()
    total_free = free.sum(axis=1)[:, None]  # (R, 1)
    per_gpu = np.minimum(demand, GPU_MILLI)  # a whole-GPU type needs each GPU fully free
    small = np.where(free[:, :, None] < per_gpu[None, None, :], free[:, :, None], 0).sum(axis=1)  # (R, T)
    whole_free = (free == GPU_MILLI).sum(axis=1)[:, None]
    fits = np.where(
        demand[None, :] < GPU_MILLI, small < total_free, whole_free >= demand[None, :] // GPU_MILLI
    )
    fits &= (cpu_free[:, None] >= cpu[None, :]) & (mem_free[:, None] >= memory[None, :])
    frag = np.where(fits, small, total_free)
    # A row-wise sum, not `frag @ weight`: BLAS may sum a row differently depending on how many
    # rows it is given, and a row refreshed alone must score exactly as in a full pass.
    return (frag * weight).sum(axis=1)


def after_placement(tc: TaskClass, free: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    """Each row's free vector after placing one task of `tc` there (as gpu_assign would)."""
    after = free.copy()
    rows = np.arange(free.shape[0])
    if not tc.request.wants_gpu:
        return after
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
        self.types = TaskTypes()

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        # CPU-only tasks matter too: the CPU they take can strand a node's free GPUs.
        return tc.request.wants_gpu or bool(state.gpu_count[: state.n].any())

    def observe(self, tc: TaskClass, n: int = 1) -> None:
        """Count `n` tasks of this class toward the learned task types."""
        self.types.observe(tc.request.gpu_total_milli, tc.request.cpu_milli, tc.request.memory, n)

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        eligible_all = tc.eligible_gpus(state)
        exists = state.gpu_exists[rows]
        eligible = exists if eligible_all is None else eligible_all[rows]
        free = np.where(exists, state.gpu_free[rows], 0).astype(np.int64)
        cpu_free = (state.cpu_cap[rows] - state.cpu_used[rows]).astype(np.float64)
        mem_free = (state.mem_cap[rows] - state.mem_used[rows]).astype(np.float64)
        before = expected_fragmentation(free, cpu_free, mem_free, self.types)
        after = expected_fragmentation(
            after_placement(tc, free, eligible),
            cpu_free - tc.request.cpu_milli,
            mem_free - tc.request.memory,
            self.types,
        )
        delta = after - before
        return 50.0 * (1.0 - delta / (np.abs(delta) + HALF))
