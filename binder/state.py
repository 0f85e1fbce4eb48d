"""The binder's authoritative state: ClusterArrays plus an index of each job's resident tasks."""

from collections.abc import Iterator, Sequence

import numpy as np
from numpy.typing import NDArray

from gosched.common.cluster_state import I64, MAX_GPUS, ClusterArrays, PlainUsage, Resident
from gosched.common.disruptions import DOWN
from gosched.common.job import Job
from gosched.common.messages import Change, NodeUpserted, TaskBound, TaskReleased
from gosched.common.node import Node


def make_resident(
    job: Job, idx: int, gpus: tuple[tuple[int, int], ...], start_time: float, standing: int | None = None
) -> Resident:
    """The Resident a bound task of `job` becomes (what preemption and anti-affinity need);
    `standing`: Proposal.standing."""
    return Resident.for_task(job, idx, gpus, start_time, standing)


def _add_use(use: list[int], r: Resident, sign: int) -> None:
    use[0] += sign * r.cpu_milli
    use[1] += sign * r.memory
    use[2] += sign * sum(m for _, m in r.gpus)


def _rules(node: Node) -> tuple[object, ...]:
    """What the shards' filters read of a node and the binder's stages do not check again (the
    binder checks capacity, GPU existence and free room, and the node's state itself)."""
    return node.labels, node.taints, node.gpus


def validate_node(node: Node) -> None:
    """Raise ValueError for a node the arrays cannot hold (checked before anything is applied)."""
    if len(node.gpus) > MAX_GPUS:
        raise ValueError(f"node {node.name}: {len(node.gpus)} GPUs, at most {MAX_GPUS} supported")
    seen: set[int] = set()
    for gpu in node.gpus:
        if not 0 <= gpu.index < MAX_GPUS:
            raise ValueError(f"node {node.name}: GPU index {gpu.index} outside 0..{MAX_GPUS - 1}")
        if gpu.index in seen:
            raise ValueError(f"node {node.name}: GPU index {gpu.index} listed twice")
        seen.add(gpu.index)
    if node.cpu_milli < 0 or node.memory < 0 or any(a < 0 for _, a in node.extended):
        raise ValueError(f"node {node.name}: negative capacity")


# Cancelled job ids kept to refuse their proposals still in flight; ids are never reused, so an
# old one is only forgotten to bound memory (its units were answered long before).
MAX_CANCELLED = 100_000


class BinderState:
    """ClusterArrays (rows, usage, residents), job id -> its resident task ids, the jobs
    cancelled lately (a proposal of one is refused: it must not evict anything), and the usage of
    the queues whose guarantee floors a proposal asked about."""

    def __init__(self) -> None:
        self.arrays = ClusterArrays()
        self.job_tasks: dict[str, set[str]] = {}
        self.cancelled: dict[str, None] = {}  # insertion-ordered set
        # queue -> [cpu milli, memory, GPU milli] held. Counted in full the first time a queue is
        # asked about, kept up to date from then on: clusters without guarantees never pay for it
        # on the binding path.
        self._queue_use: dict[str, list[int]] = {}
        # Per row: the binder version at which the node was added or its placement rules (labels,
        # taints, GPUs) last changed. A shard that planned on an older view planned on rules the
        # binder does not check itself (or on a removed node of that name): NodeCurrent refuses
        # such placements.
        self.rules_version: NDArray[np.int64] = np.zeros(self.arrays.capacity, np.int64)

    def note_cancelled(self, job_id: str) -> None:
        self.cancelled[job_id] = None
        if len(self.cancelled) > MAX_CANCELLED:
            del self.cancelled[next(iter(self.cancelled))]

    # -- lookups ----------------------------------------------------------------------------------
    def resident(self, tid: str) -> tuple[int, Resident] | None:
        row = self.arrays.task_row.get(tid)
        if row is None:
            return None
        return row, self.arrays.residents[row][tid]

    def queue_usage(self, queue: str) -> tuple[int, int, int]:
        """(cpu milli, memory, GPU milli) held by the residents of `queue`."""
        use = self._queue_use.get(queue)
        if use is None:
            use = self._queue_use[queue] = [0, 0, 0]
            for residents in self.arrays.residents[: self.arrays.n]:
                for r in residents.values():
                    if r.queue == queue:
                        _add_use(use, r, 1)
        return use[0], use[1], use[2]

    def node_name(self, row: int) -> str:
        node = self.arrays.nodes[row]
        return "" if node is None else node.name

    def iter_residents(self) -> Iterator[tuple[str, Resident]]:
        """(node name, resident) for every resident, by row then task id (the same order whichever
        path placed them)."""
        a = self.arrays
        for row in range(a.n):
            node = a.nodes[row]
            if node is None:
                continue
            residents = a.residents[row]
            for tid in sorted(residents):
                yield node.name, residents[tid]

    # -- nodes ------------------------------------------------------------------------------------
    def upsert_node(self, node: Node, version: int) -> int:
        """Add or update a node, as of change-log `version` (see rules_version)."""
        a = self.arrays
        row = a.row_of.get(node.name)
        old = None if row is None else a.nodes[row]
        row = a.upsert_node(node)
        if row >= self.rules_version.size:
            grown = np.zeros(a.capacity, np.int64)
            grown[: self.rules_version.size] = self.rules_version
            self.rules_version = grown
        if old is None or _rules(old) != _rules(node):
            self.rules_version[row] = version
        return row

    def mark_all(self, version: int) -> None:
        """Every node's rules count as changed at `version` (a binder recovered from its store
        knows nothing of the views older than that)."""
        self.rules_version[:] = version

    def remove_node(self, name: str) -> list[Resident]:
        """Remove the node; its residents, returned, are down (lost with it)."""
        lost = self.arrays.remove_node(name)
        for r in lost:
            self._forget(r)
            if r.disruption_budget is not None:
                self.arrays.down_tasks.add(r.job_id, r.task_id)
        return lost

    # -- residents --------------------------------------------------------------------------------
    def place(self, row: int, r: Resident) -> None:
        self.arrays.place(row, r)
        self.job_tasks.setdefault(r.job_id, set()).add(r.task_id)
        if self._queue_use:
            self._count_queue(r, 1)

    def release(self, tid: str, *, down: bool = False) -> tuple[int, Resident] | None:
        """Free the task's room; `down`: through a disruption (evicted, lost), which its job's
        disruption budget counts until it runs again. Any other end (finished, cancelled) takes
        a task bound again but not yet running off that count."""
        got = self.arrays.release(tid)
        if got is not None:
            r = got[1]
            self._forget(r)
            if down and r.disruption_budget is not None:
                self.arrays.down_tasks.add(r.job_id, tid)
            elif not down and self.arrays.down_tasks:
                self.arrays.down_tasks.discard_many((tid,))
        return got

    def _forget(self, r: Resident) -> None:
        if self._queue_use:
            self._count_queue(r, -1)
        tasks = self.job_tasks.get(r.job_id)
        if tasks is not None:
            tasks.discard(r.task_id)
            if not tasks:
                del self.job_tasks[r.job_id]

    def place_clean(
        self,
        rows: Sequence[int],
        residents: Sequence[Resident],
        plain: PlainUsage | None,
        victim_priority: Sequence[int] | I64 | int,
        row_array: I64 | None = None,
    ) -> None:
        """Place the fast path's residents (see ClusterArrays.place_many for `plain`,
        `victim_priority` and `row_array`). job_tasks is the caller's: it adds each task as it
        makes the record."""
        self.arrays.place_many(rows, residents, plain, victim_priority, row_array)
        if self._queue_use:
            for r in residents:
                self._count_queue(r, 1)

    def _count_queue(self, r: Resident, sign: int) -> None:
        use = self._queue_use.get(r.queue)
        if use is not None:
            _add_use(use, r, sign)

    def compact(self) -> None:
        """Nobody reads the authoritative arrays' dirty log: keep it empty."""
        self.arrays.compact_dirty_log(self.arrays.dirty_position)

    # -- snapshots ----------------------------------------------------------------------------------
    def snapshot(self) -> list[Change]:
        """The whole state as changes: every live node, then every resident."""
        a = self.arrays
        out: list[Change] = [NodeUpserted(node) for node in a.nodes if node is not None]
        out.extend(TaskBound(name, r) for name, r in self.iter_residents())
        out.extend(TaskReleased(tid, DOWN) for _, tid in a.down_tasks.items())
        return out

    def view(self) -> dict[str, dict[str, object]]:
        """A canonical picture per node name, see `arrays_view`."""
        return arrays_view(self.arrays)


def arrays_view(a: ClusterArrays) -> dict[str, dict[str, object]]:
    """A canonical picture of ClusterArrays per node name (rows, column order and model ids left
    out): for comparing two states, e.g. a live binder and one recovered from its store, or a
    shard's cache."""
    out: dict[str, dict[str, object]] = {}
    for row in range(a.n):
        node = a.nodes[row]
        if node is None:
            continue
        exists = a.gpu_exists[row]
        out[node.name] = {
            "node": node,
            "schedulable": bool(a.schedulable[row]),
            "cpu_used": int(a.cpu_used[row]),
            "mem_used": int(a.mem_used[row]),
            "ext_used": {
                name: int(a.ext_used[row, col])
                for col, name in enumerate(a.extended_names)
                if a.ext_used[row, col]
            },
            "gpu_free": {int(g): int(a.gpu_free[row, g]) for g in np.flatnonzero(exists)},
            "free_whole": int(a.free_whole[row]),
            "max_share": int(a.max_share[row]),
            "gpu_used_total": int(a.gpu_used_total[row]),
            "residents": dict(sorted(a.residents[row].items())),
        }
    return out
