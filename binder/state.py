"""The binder's authoritative state: ClusterArrays plus an index of each job's resident tasks."""

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from gosched.common.cluster_state import MAX_GPUS, ClusterArrays, Resident
from gosched.common.job import Job
from gosched.common.messages import Change, NodeUpserted, TaskBound
from gosched.common.node import Node
from gosched.common.resources import GPU_MILLI


def make_resident(job: Job, idx: int, gpus: tuple[tuple[int, int], ...], start_time: float) -> Resident:
    """The Resident a bound task of `job` becomes (what preemption and anti-affinity need)."""
    return Resident.for_task(job, idx, gpus, start_time)


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


class BinderState:
    """ClusterArrays (rows, usage, residents) and job id -> its resident task ids."""

    def __init__(self) -> None:
        self.arrays = ClusterArrays()
        self.job_tasks: dict[str, set[str]] = {}

    # -- lookups ----------------------------------------------------------------------------------
    def resident(self, tid: str) -> tuple[int, Resident] | None:
        row = self.arrays.task_row.get(tid)
        if row is None:
            return None
        return row, self.arrays.residents[row][tid]

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
    def upsert_node(self, node: Node) -> int:
        return self.arrays.upsert_node(node)

    def remove_node(self, name: str) -> list[Resident]:
        lost = self.arrays.remove_node(name)
        for r in lost:
            self._forget(r)
        return lost

    # -- residents --------------------------------------------------------------------------------
    def place(self, row: int, r: Resident) -> None:
        self.arrays.place(row, r)
        self.job_tasks.setdefault(r.job_id, set()).add(r.task_id)

    def release(self, tid: str) -> tuple[int, Resident] | None:
        got = self.arrays.release(tid)
        if got is not None:
            self._forget(got[1])
        return got

    def _forget(self, r: Resident) -> None:
        tasks = self.job_tasks.get(r.job_id)
        if tasks is not None:
            tasks.discard(r.task_id)
            if not tasks:
                del self.job_tasks[r.job_id]

    def place_many(self, rows: Sequence[int], residents: Sequence[Resident]) -> None:
        """Place many residents at once (usage added with numpy); callers have checked they fit."""
        a = self.arrays
        n = len(rows)
        if n == 0:
            return
        row_arr = np.fromiter(rows, np.int64, n)
        np.add.at(a.cpu_used, row_arr, np.fromiter((r.cpu_milli for r in residents), np.int64, n))
        np.add.at(a.mem_used, row_arr, np.fromiter((r.memory for r in residents), np.int64, n))
        ext_rows: list[int] = []
        ext_cols: list[int] = []
        ext_amounts: list[int] = []
        gpu_rows: list[int] = []
        gpu_idx: list[int] = []
        gpu_milli: list[int] = []
        residents_of = a.residents
        task_row = a.task_row
        job_tasks = self.job_tasks
        for row, r in zip(rows, residents, strict=True):
            for name, amount in r.extended:
                col = a.ext_col(name)
                if col is None:  # a name no node has: let ClusterArrays add the column
                    a.ext_used[row, a._ext_col(name)] += amount
                    continue
                ext_rows.append(row)
                ext_cols.append(col)
                ext_amounts.append(amount)
            for g, milli in r.gpus:
                gpu_rows.append(row)
                gpu_idx.append(g)
                gpu_milli.append(milli)
            residents_of[row][r.task_id] = r
            task_row[r.task_id] = row
            tasks = job_tasks.get(r.job_id)
            if tasks is None:
                job_tasks[r.job_id] = {r.task_id}
            else:
                tasks.add(r.task_id)
        if ext_rows:
            np.add.at(a.ext_used, (np.array(ext_rows), np.array(ext_cols)), np.array(ext_amounts, np.int64))
        if gpu_rows:
            np.subtract.at(a.gpu_free, (np.array(gpu_rows), np.array(gpu_idx)), np.array(gpu_milli, np.int32))
            self.refresh_gpu_summaries(np.unique(np.array(gpu_rows, np.int64)))
        a.dirty_log.extend(rows)

    def refresh_gpu_summaries(self, rows: np.ndarray[Any, np.dtype[np.int64]]) -> None:
        """free_whole / max_share / gpu_used_total of `rows`, as ClusterArrays computes them per row."""
        a = self.arrays
        free = a.gpu_free[rows]
        exists = a.gpu_exists[rows]
        has = a.gpu_count[rows] > 0
        a.free_whole[rows] = np.where(has, np.count_nonzero((free == GPU_MILLI) & exists, axis=1), 0)
        a.max_share[rows] = np.where(has, np.where(exists, free, np.iinfo(np.int32).min).max(axis=1), 0)
        used = a.gpu_count[rows].astype(np.int64) * GPU_MILLI - np.where(exists, free, 0).sum(axis=1)
        a.gpu_used_total[rows] = np.where(has, used, 0)

    def compact(self) -> None:
        """Nobody reads the authoritative arrays' dirty log: keep it empty."""
        self.arrays.compact_dirty_log(self.arrays.dirty_position)

    # -- snapshots ----------------------------------------------------------------------------------
    def snapshot(self) -> list[Change]:
        """The whole state as changes: every live node, then every resident."""
        a = self.arrays
        out: list[Change] = [NodeUpserted(node) for node in a.nodes if node is not None]
        out.extend(TaskBound(name, r) for name, r in self.iter_residents())
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
