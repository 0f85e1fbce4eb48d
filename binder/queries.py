"""Read-only questions to the binder's truth, answered as plain snapshots (for the API, in process
or through the binder's Ray actor)."""

from collections.abc import Iterable, Sequence

import numpy as np

from gosched.binder.binder import Binder
from gosched.common.snapshots import Gpus, NodeSnapshot

GPU_MILLI = 1000


def node_snapshots(binder: Binder, names: Sequence[str] | None = None) -> list[NodeSnapshot]:
    """Live nodes in row order, or those named (unknown names left out)."""
    a = binder.state
    rows = a.live_rows() if names is None else [a.row_of[n] for n in names if n in a.row_of]
    out: list[NodeSnapshot] = []
    for row in rows:
        node = a.nodes[row]
        if node is None:
            continue
        out.append(
            NodeSnapshot(
                node=node,
                cpu_used_milli=int(a.cpu_used[row]),
                memory_used=int(a.mem_used[row]),
                gpu_used_milli=tuple(GPU_MILLI - int(a.gpu_free[row, g.index]) for g in node.gpus),
                task_ids=tuple(sorted(a.residents[row])),
            )
        )
    return out


def residents_of(binder: Binder, names: Iterable[str]) -> dict[str, list[str]]:
    a = binder.state
    out: dict[str, list[str]] = {}
    for name in names:
        row = a.row_of.get(name)
        out[name] = [] if row is None else list(a.residents[row])
    return out


def resident_runs(binder: Binder, names: Iterable[str]) -> dict[str, dict[str, float]]:
    """Each named node's residents with the time each was bound there: a task evicted and bound
    to the same node again is the same id with a new time (another run)."""
    a = binder.state
    out: dict[str, dict[str, float]] = {}
    for name in names:
        row = a.row_of.get(name)
        out[name] = {} if row is None else {t: r.start_time for t, r in a.residents[row].items()}
    return out


def misfits(binder: Binder, names: Iterable[str]) -> list[str]:
    """Residents that the named nodes, as they are now, can no longer hold (a node that came back
    smaller: a GPU gone, less cpu or memory): those on a GPU the node no longer has, then, while
    cpu, memory or an extended resource is over capacity, the least important of the rest (lowest
    priority, then the latest started), as preemption would choose."""
    a = binder.state
    out: list[str] = []
    for name in names:
        row = a.row_of.get(name)
        node = None if row is None else a.nodes[row]
        if row is None or node is None:
            continue
        residents = sorted(a.residents[row].values(), key=lambda r: (r.priority, -r.start_time, r.task_id))
        kept = []
        for r in residents:
            if any(not a.gpu_exists[row, g] for g, _ in r.gpus):
                out.append(r.task_id)
            else:
                kept.append(r)
        cpu = sum(r.cpu_milli for r in kept)
        mem = sum(r.memory for r in kept)
        ext: dict[str, int] = {}
        for r in kept:
            for ename, amount in r.extended:
                ext[ename] = ext.get(ename, 0) + amount
        cap = dict(node.extended)
        for r in kept:  # least important first
            over_ext = any(amount > cap.get(ename, 0) for ename, amount in ext.items())
            if cpu <= int(a.cpu_cap[row]) and mem <= int(a.mem_cap[row]) and not over_ext:
                break
            out.append(r.task_id)
            cpu -= r.cpu_milli
            mem -= r.memory
            for ename, amount in r.extended:
                ext[ename] -= amount
    return out


def placements_of(binder: Binder, task_ids: Iterable[str]) -> dict[str, tuple[str, Gpus]]:
    """Where each task is or last was: task id -> (node, gpus). Resident tasks from the arrays; the
    rest (ended, or released since the caller looked) from the store, which keeps the node a task
    ended on; tasks never placed, or back to pending, are left out."""
    out: dict[str, tuple[str, Gpus]] = {}
    gone: list[str] = []
    for tid in task_ids:
        got = binder.resident(tid)
        if got is not None:
            out[tid] = (got[0], got[1].gpus)
        else:
            gone.append(tid)
    if gone:
        out.update(binder.store.task_nodes(gone))
    return out


def cluster_usage(binder: Binder) -> dict[str, int]:
    """Capacity and use over the live nodes, and the binder's version (one vectorised pass)."""
    a = binder.state
    rows = np.asarray(a.live_rows(), dtype=np.int64)
    totals = a.totals()
    ready = rows[a.schedulable[rows]] if rows.size else rows
    used = {
        "cpu_used_milli": int(a.cpu_used[rows].sum()),
        "memory_used": int(a.mem_used[rows].sum()),
        "gpu_used_milli": int(a.gpu_used_total[rows].sum()),
        "schedulable_nodes": int(ready.size),
        "schedulable_cpu_milli": int(a.cpu_cap[ready].sum()),
        "schedulable_memory": int(a.mem_cap[ready].sum()),
        "schedulable_gpu_milli": int(a.gpu_count[ready].sum()) * GPU_MILLI,
    }
    return {
        "nodes": int(rows.size),
        "cpu_milli": totals["cpu"],
        "memory": totals["memory"],
        "gpu_milli": totals["gpu"],
        "binder_version": binder.version,
        **used,
    }
