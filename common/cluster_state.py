"""The cluster as numpy arrays, one row per node: capacity, usage, GPUs, labels, taints, residents.

The binder keeps the authoritative copy; each shard keeps a cached copy that it updates from the
binder's change log (`apply`). Rows are stable: a removed node leaves a tombstone row.
"""

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gosched.common.disruptions import DownTasks
from gosched.common.fast_pickle import fast_pickle
from gosched.common.job import AntiAffinity, Job
from gosched.common.node import Node, NodeState, Taint
from gosched.common.resources import GPU_MILLI

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
B = npt.NDArray[np.bool_]

MAX_GPUS = 16  # GPUs per node the arrays hold; larger nodes are refused at registration
NO_VICTIM = np.iinfo(np.int64).max
NO_GPU_SHARE = int(np.iinfo(np.int32).min)  # below any GPU's free milli, over-committed ones too

# Metadata generations are drawn from one counter for every ClusterArrays in the process, so a
# cache keyed by a generation can never mistake a new view (a shard's resync, whose rows may be in
# another order) for an older one that happened to reach the same count of node changes.
_GENERATIONS = itertools.count(1)


@fast_pickle
@dataclass(slots=True)
class Resident:
    """A task holding resources on a node, with what preemption and anti-affinity need to know."""

    task_id: str
    job_id: str
    cpu_milli: int
    memory: int
    gpus: tuple[tuple[int, int], ...] = ()
    extended: tuple[tuple[str, int], ...] = ()
    priority: int = 0
    preemptible: bool = True
    queue: str = "default"
    tenant: str = "default"
    start_time: float = 0.0
    job_labels: tuple[tuple[str, str], ...] = ()
    role: str = ""
    min_member: int = 1
    disruption_budget: int | None = None
    # The task's anti-affinity rules that have match labels: they repel tasks of other jobs too,
    # both ways (a task carrying the labels is not placed in this task's domain either).
    repels: tuple[AntiAffinity, ...] = ()
    # Unit.standing: the effective priority the aging of its queue gave it, which it keeps against
    # preemptors of that queue only (aging orders a queue; it says nothing across queues).
    standing: int | None = None

    def defends_with(self, queue: str) -> int:
        """The priority this task keeps against a preemptor of `queue` (at least `priority`)."""
        standing = self.standing
        return self.priority if standing is None or queue != self.queue else standing

    @classmethod
    def for_task(
        cls,
        job: Job,
        index: int,
        gpus: tuple[tuple[int, int], ...],
        start_time: float,
        standing: int | None = None,
    ) -> "Resident":
        """The resident record of task `index` of `job` holding `gpus`; `standing`: Unit.standing."""
        # Positional, in field order: four times quicker than keywords, and made once per task in
        # both the shard and the binder.
        group = job.group_of(index)
        req = group.resources
        return cls(
            f"{job.id}/{index}",  # task_id(job.id, index)
            job.id,
            req.cpu_milli,
            req.memory,
            gpus,
            req.extended,
            job.priority,
            job.preemptible,
            job.queue,
            job.tenant,
            start_time,
            job.labels,
            group.role,
            job.min_member,
            job.disruption_budget,
            tuple(rule for rule in group.anti_affinity if rule.match_labels) if group.anti_affinity else (),
            standing,
        )


class PlainUsage:
    """What placing residents that hold no GPUs or extended resources and repel nothing takes,
    as columns (one entry per resident, in order): what ClusterArrays.place_many would otherwise
    read from each record. The binder's fast path has them at hand. (Never sent: not a message.)"""

    __slots__ = ("cpu", "memory", "task_ids")

    def __init__(self, task_ids: Sequence[str], cpu: I64, memory: I64) -> None:
        self.task_ids = task_ids
        self.cpu = cpu
        self.memory = memory


@dataclass
class ClusterArrays:
    capacity: int = 64
    n: int = 0  # rows in use (tombstones included)
    nodes: list[Node | None] = field(default_factory=list)
    row_of: dict[str, int] = field(default_factory=dict)
    residents: list[dict[str, Resident]] = field(default_factory=list)
    task_row: dict[str, int] = field(default_factory=dict)
    # Per match-label anti-affinity rule of a resident (Resident.repels): row -> how many residents
    # there carry it. What the anti-affinity checks of a labelled task go through, rule by rule
    # (a service's replicas share one rule), not resident by resident.
    repellers: dict[AntiAffinity, dict[int, int]] = field(default_factory=dict)
    extended_names: list[str] = field(default_factory=list)
    gpu_models: dict[str, int] = field(default_factory=dict)
    # meta_generation changes whenever node metadata (labels, taints, state, capacity) changes; it is
    # unique across all ClusterArrays of the process (see _GENERATIONS).
    meta_generation: int = 0
    # Rows whose usage changed, in order; dynamic caches remember how far they have read.
    dirty_log: list[int] = field(default_factory=list)
    dirty_base: int = 0  # absolute position of dirty_log[0]
    # Rows whose lowest-priority preemptible resident left: their bound is recounted when read.
    stale_victim_rows: set[int] = field(default_factory=set)
    # The tasks down through a disruption, of jobs with a disruption budget (common/disruptions.py).
    # Kept by whoever applies the binder's changes, not by place() and release(): a shard's own
    # plans place and evict too, and undo it.
    down_tasks: DownTasks = field(default_factory=DownTasks)

    def __post_init__(self) -> None:
        self.meta_generation = next(_GENERATIONS)
        self._alloc(self.capacity)

    # -- storage --------------------------------------------------------------------------------
    def _alloc(self, cap: int) -> None:
        e = max(1, len(self.extended_names))
        self.cpu_cap: I64 = np.zeros(cap, np.int64)
        self.cpu_used: I64 = np.zeros(cap, np.int64)
        self.mem_cap: I64 = np.zeros(cap, np.int64)
        self.mem_used: I64 = np.zeros(cap, np.int64)
        self.ext_cap: I64 = np.zeros((cap, e), np.int64)
        self.ext_used: I64 = np.zeros((cap, e), np.int64)
        self.gpu_exists: B = np.zeros((cap, MAX_GPUS), np.bool_)
        self.gpu_free: I32 = np.zeros((cap, MAX_GPUS), np.int32)  # milli-GPU free per GPU
        self.gpu_mem: I32 = np.zeros((cap, MAX_GPUS), np.int32)
        self.gpu_numa: I32 = np.full((cap, MAX_GPUS), -1, np.int32)
        self.gpu_nvlink: I64 = np.zeros((cap, MAX_GPUS), np.int64)  # bitmask of NVLink peers
        self.gpu_model: I32 = np.full((cap, MAX_GPUS), -1, np.int32)
        self.gpu_count: I32 = np.zeros(cap, np.int32)
        self.free_whole: I32 = np.zeros(cap, np.int32)  # fully free GPUs
        self.max_share: I32 = np.zeros(cap, np.int32)  # largest free milli on any one GPU
        self.gpu_used_total: I64 = np.zeros(cap, np.int64)  # milli-GPU in use on the node
        self.schedulable: B = np.zeros(cap, np.bool_)
        self.alive: B = np.zeros(cap, np.bool_)
        # At most the lowest priority among the row's preemptible residents (read it through
        # min_victim_priority, which makes it exact).
        self.victim_priority_bound: I64 = np.full(cap, NO_VICTIM, np.int64)

    def _grow(self) -> None:
        old = {name: getattr(self, name) for name in _ARRAYS}
        self.capacity *= 2
        self._alloc(self.capacity)
        for name, arr in old.items():
            new = getattr(self, name)
            if name in ("ext_cap", "ext_used"):
                new[: arr.shape[0], : arr.shape[1]] = arr
            else:
                new[: arr.shape[0]] = arr

    def _ext_col(self, name: str) -> int:
        try:
            return self.extended_names.index(name)
        except ValueError:
            self.extended_names.append(name)
            col = len(self.extended_names) - 1
            if col >= self.ext_cap.shape[1]:
                pad = np.zeros((self.capacity, 1), np.int64)
                self.ext_cap = np.hstack([self.ext_cap, pad])
                self.ext_used = np.hstack([self.ext_used, pad.copy()])
            return col

    def ext_col(self, name: str) -> int | None:
        """Column of an extended resource, None if no node has it."""
        try:
            return self.extended_names.index(name)
        except ValueError:
            return None

    def model_id(self, model: str) -> int:
        """Id of a GPU model name; -2 if no node has that model (matches nothing)."""
        return self.gpu_models.get(model, -2)

    # -- nodes ----------------------------------------------------------------------------------
    def upsert_node(self, node: Node) -> int:
        if len(node.gpus) > MAX_GPUS:
            raise ValueError(f"node {node.name}: {len(node.gpus)} GPUs, at most {MAX_GPUS} supported")
        row = self.row_of.get(node.name)
        if row is None:
            if self.n == self.capacity:
                self._grow()
            row = self.n
            self.n += 1
            self.nodes.append(node)
            self.residents.append({})
            self.row_of[node.name] = row
        else:
            self.nodes[row] = node
        self.cpu_cap[row] = node.cpu_milli
        self.mem_cap[row] = node.memory
        self.ext_cap[row, :] = 0
        for name, amount in node.extended:
            col = self._ext_col(name)  # first: it may widen (replace) the arrays
            self.ext_cap[row, col] = amount
        self.gpu_exists[row, :] = False
        self.gpu_numa[row, :] = -1
        self.gpu_nvlink[row, :] = 0
        self.gpu_model[row, :] = -1
        self.gpu_mem[row, :] = 0
        for gpu in node.gpus:
            g = gpu.index
            self.gpu_exists[row, g] = True
            self.gpu_mem[row, g] = gpu.memory_mib
            self.gpu_numa[row, g] = gpu.numa_node
            self.gpu_model[row, g] = self.gpu_models.setdefault(gpu.model, len(self.gpu_models))
            mask = 0
            for peer in gpu.nvlink_peers:
                mask |= 1 << peer
            self.gpu_nvlink[row, g] = mask
        self.gpu_count[row] = len(node.gpus)
        self.alive[row] = True
        self.schedulable[row] = node.state == NodeState.READY
        self._recompute_usage(row)
        self.meta_generation = next(_GENERATIONS)
        self.mark_dirty(row)
        return row

    def set_state(self, name: str, state: NodeState) -> None:
        row = self.row_of[name]
        node = self.nodes[row]
        assert node is not None
        self.upsert_node(
            Node(
                node.name,
                node.cpu_milli,
                node.memory,
                node.gpus,
                node.labels,
                node.taints,
                node.extended,
                state,
            )
        )

    def remove_node(self, name: str) -> list[Resident]:
        """Tombstone the node's row; returns the residents it held (they lost their node)."""
        row = self.row_of.pop(name)
        lost = list(self.residents[row].values())
        for r in lost:
            self.task_row.pop(r.task_id, None)
            if r.repels:
                self._count_repels(row, r, -1)
        self.residents[row] = {}
        self.nodes[row] = None
        self.alive[row] = False
        self.schedulable[row] = False
        self.cpu_cap[row] = self.mem_cap[row] = 0
        self.ext_cap[row, :] = 0
        self.gpu_exists[row, :] = False
        self.gpu_count[row] = 0
        self._recompute_usage(row)
        self.meta_generation = next(_GENERATIONS)
        self.mark_dirty(row)
        return lost

    def _recompute_usage(self, row: int) -> None:
        cpu = mem = 0
        for r in self.residents[row].values():
            for name, _ in r.extended:
                self._ext_col(name)  # make room for every column before sizing the sums
        ext = np.zeros(self.ext_used.shape[1], np.int64)
        free = np.where(self.gpu_exists[row], GPU_MILLI, 0).astype(np.int32)
        for r in self.residents[row].values():
            cpu += r.cpu_milli
            mem += r.memory
            for name, amount in r.extended:
                ext[self._ext_col(name)] += amount
            for g, milli in r.gpus:
                free[g] -= milli
        self._refresh_min_priority(row)
        self.cpu_used[row] = cpu
        self.mem_used[row] = mem
        self.ext_used[row, : ext.shape[0]] = ext
        self.gpu_free[row] = free
        self._refresh_gpu_summary(row)

    @property
    def min_victim_priority(self) -> I64:
        """Lowest priority among each row's preemptible residents (NO_VICTIM: none), so preemption
        can skip, in one vector comparison, nodes where nothing may be evicted. A release does
        not recount its row at once: releasing a node's thousands of equal-priority tasks one by
        one would recount the rest each time (quadratic); each stale row is recounted once here."""
        if self.stale_victim_rows:
            for row in self.stale_victim_rows:
                self._refresh_min_priority(row)
            self.stale_victim_rows.clear()
        return self.victim_priority_bound

    def _refresh_min_priority(self, row: int) -> None:
        prios = [r.priority for r in self.residents[row].values() if r.preemptible]
        self.victim_priority_bound[row] = min(prios) if prios else NO_VICTIM

    def _refresh_gpu_summary(self, row: int) -> None:
        if self.gpu_count[row] == 0:
            self.free_whole[row] = 0
            self.max_share[row] = 0
            self.gpu_used_total[row] = 0
            return
        # One pass over the row's few GPUs in Python: several numpy calls on 16 elements cost
        # about six times as much, and this runs on every GPU placement and release.
        # largest starts below any share, as in refresh_gpu_summaries: over-committed GPUs (free < 0,
        # from changes applied as they come) must read the same on both paths.
        whole = total = 0
        largest = NO_GPU_SHARE
        for free, exists in zip(self.gpu_free[row].tolist(), self.gpu_exists[row].tolist(), strict=True):
            if exists:
                total += free
                whole += free == GPU_MILLI
                largest = max(largest, free)
        self.free_whole[row] = whole
        self.max_share[row] = largest
        self.gpu_used_total[row] = int(self.gpu_count[row]) * GPU_MILLI - total

    # -- usage ----------------------------------------------------------------------------------
    def mark_dirty(self, row: int) -> None:
        self.dirty_log.append(row)

    def dirty_since(self, position: int) -> tuple[list[int], int]:
        """Rows changed since absolute log `position`, and the new position. Empty+(-1): too old."""
        if position < self.dirty_base:
            return [], -1
        return self.dirty_log[position - self.dirty_base :], self.dirty_base + len(self.dirty_log)

    @property
    def dirty_position(self) -> int:
        return self.dirty_base + len(self.dirty_log)

    def compact_dirty_log(self, keep_from: int) -> None:
        """Drop log entries before absolute position `keep_from` (no reader needs them)."""
        cut = keep_from - self.dirty_base
        if cut > 0:
            del self.dirty_log[:cut]
            self.dirty_base = keep_from

    def place(self, row: int, r: Resident) -> None:
        """Add a resident's usage to a row (no checks: callers check fit first)."""
        self.cpu_used[row] += r.cpu_milli
        self.mem_used[row] += r.memory
        for name, amount in r.extended:
            col = self._ext_col(name)  # first: it may widen (replace) the arrays
            self.ext_used[row, col] += amount
        if r.gpus:
            for g, milli in r.gpus:
                self.gpu_free[row, g] -= milli
            self._refresh_gpu_summary(row)
        self.residents[row][r.task_id] = r
        self.task_row[r.task_id] = row
        if r.repels:
            self._count_repels(row, r, 1)
        if r.preemptible and r.priority < self.victim_priority_bound[row]:
            self.victim_priority_bound[row] = r.priority
        self.dirty_log.append(row)

    def _count_repels(self, row: int, r: Resident, sign: int) -> None:
        for rule in r.repels:
            rows = self.repellers.setdefault(rule, {})
            left = rows.get(row, 0) + sign
            if left:
                rows[row] = left
            else:
                del rows[row]
                if not rows:
                    del self.repellers[rule]

    def swap_record(self, row: int, r: Resident) -> None:
        """Replace the record of a resident task of `row` by `r`, which holds the same usage."""
        old = self.residents[row][r.task_id]
        self.residents[row][r.task_id] = r
        if (old.priority, old.preemptible) != (r.priority, r.preemptible):
            self.stale_victim_rows.add(row)

    def place_many(
        self,
        rows: Sequence[int],
        residents: Sequence[Resident],
        plain: PlainUsage | None = None,
        victim_priority: Sequence[int] | I64 | int | None = None,
        row_array: I64 | None = None,
    ) -> None:
        """place() for many residents at once, usage added with numpy (callers have checked fit;
        no task may appear twice). A shard applies every binding in the cluster this way.

        `plain`: the residents' task ids, cpu and memory, for residents that hold no GPUs or
        extended resources and repel nothing (the caller vouches for it). `victim_priority`: the
        priority each offers as a victim (its priority if preemptible, else NO_VICTIM), per
        resident, or one int that every one offers. `row_array`: `rows` as an int64 array, where
        the caller has it (the binder's fast path made one): a list-to-array pass less."""
        n = len(rows)
        if n < 8:  # numpy's per-call cost outweighs the loop
            for row, r in zip(rows, residents, strict=True):
                self.place(row, r)
            return
        row_arr = np.fromiter(rows, np.int64, n) if row_array is None else row_array
        prio: I64 | int
        if victim_priority is None:
            prio = np.fromiter((r.priority if r.preemptible else NO_VICTIM for r in residents), np.int64, n)
        elif isinstance(victim_priority, int | np.ndarray):
            prio = victim_priority
        else:
            prio = np.fromiter(victim_priority, np.int64, n)
        np.minimum.at(self.victim_priority_bound, row_arr, prio)
        if plain is not None:
            np.add.at(self.cpu_used, row_arr, plain.cpu)
            np.add.at(self.mem_used, row_arr, plain.memory)
            residents_of = self.residents
            for row, tid, r in zip(rows, plain.task_ids, residents, strict=True):
                residents_of[row][tid] = r
            self.task_row.update(zip(plain.task_ids, rows, strict=True))
            self.dirty_log.extend(rows)
            return
        np.add.at(self.cpu_used, row_arr, np.fromiter((r.cpu_milli for r in residents), np.int64, n))
        np.add.at(self.mem_used, row_arr, np.fromiter((r.memory for r in residents), np.int64, n))
        ext: list[tuple[int, int, int]] = []
        gpu: list[tuple[int, int, int]] = []
        residents_of = self.residents
        task_row = self.task_row
        for row, r in zip(rows, residents, strict=True):
            if r.extended:
                ext.extend((row, self._ext_col(name), amount) for name, amount in r.extended)
            if r.gpus:
                gpu.extend((row, g, milli) for g, milli in r.gpus)
            residents_of[row][r.task_id] = r
            task_row[r.task_id] = row
            if r.repels:
                self._count_repels(row, r, 1)
        if ext:
            e_rows, e_cols, e_amounts = zip(*ext, strict=True)
            np.add.at(self.ext_used, (np.array(e_rows), np.array(e_cols)), np.array(e_amounts, np.int64))
        if gpu:
            g_rows, g_idx, g_milli = zip(*gpu, strict=True)
            np.subtract.at(self.gpu_free, (np.array(g_rows), np.array(g_idx)), np.array(g_milli, np.int32))
            self.refresh_gpu_summaries(np.unique(np.array(g_rows, np.int64)))
        self.dirty_log.extend(rows)

    def refresh_gpu_summaries(self, rows: I64) -> None:
        """free_whole / max_share / gpu_used_total of `rows` at once, as _refresh_gpu_summary."""
        free = self.gpu_free[rows]
        exists = self.gpu_exists[rows]
        has = self.gpu_count[rows] > 0
        self.free_whole[rows] = np.where(has, np.count_nonzero((free == GPU_MILLI) & exists, axis=1), 0)
        self.max_share[rows] = np.where(has, np.where(exists, free, NO_GPU_SHARE).max(axis=1), 0)
        used = self.gpu_count[rows].astype(np.int64) * GPU_MILLI - np.where(exists, free, 0).sum(axis=1)
        self.gpu_used_total[rows] = np.where(has, used, 0)

    def release(self, task_id: str) -> tuple[int, Resident] | None:
        """Remove a resident's usage; returns (row, resident), None if it holds nothing here."""
        row = self.task_row.pop(task_id, None)
        if row is None:
            return None
        r = self.residents[row].pop(task_id)
        if r.repels:
            self._count_repels(row, r, -1)
        self.cpu_used[row] -= r.cpu_milli
        self.mem_used[row] -= r.memory
        for name, amount in r.extended:
            col = self._ext_col(name)
            self.ext_used[row, col] -= amount
        if r.gpus:
            for g, milli in r.gpus:
                self.gpu_free[row, g] += milli
            self._refresh_gpu_summary(row)
        if r.preemptible and r.priority == self.victim_priority_bound[row]:
            self.stale_victim_rows.add(row)
        self.dirty_log.append(row)
        return row, r

    def fits(self, row: int, r: Resident) -> str | None:
        """None if `r` fits on `row` exactly as given (its GPUs included); else the reason."""
        if not self.alive[row]:
            return "node is gone"
        if self.cpu_used[row] + r.cpu_milli > self.cpu_cap[row]:
            return "insufficient cpu"
        if self.mem_used[row] + r.memory > self.mem_cap[row]:
            return "insufficient memory"
        for name, amount in r.extended:
            if amount <= 0:
                continue
            col = self.ext_col(name)
            if col is None or self.ext_used[row, col] + amount > self.ext_cap[row, col]:
                return f"insufficient {name}"
        for g, milli in r.gpus:
            if not 0 <= g < MAX_GPUS or not self.gpu_exists[row, g]:
                return f"no GPU {g}"
            if milli <= 0:
                return f"GPU {g}: a share must be positive"
            if self.gpu_free[row, g] < milli:
                return f"GPU {g} is not free"
        if r.gpus and len({g for g, _ in r.gpus}) != len(r.gpus):
            return "a GPU is assigned twice"
        return None

    # -- labels and taints (static, cached per meta_generation) -------------------------------
    def label_values(self, key: str) -> list[str | None]:
        """Each row's value for label `key` (None: absent or tombstone)."""
        out: list[str | None] = []
        for node in self.nodes:
            out.append(None if node is None else node.label_dict().get(key))
        return out

    def node_taints(self, row: int) -> tuple[Taint, ...]:
        node = self.nodes[row]
        return () if node is None else node.taints

    def totals(self) -> dict[str, int]:
        """Cluster capacity over schedulable-or-not live nodes: cpu, memory, gpu (milli)."""
        alive = self.alive[: self.n]
        return {
            "cpu": int(self.cpu_cap[: self.n][alive].sum()),
            "memory": int(self.mem_cap[: self.n][alive].sum()),
            "gpu": int(self.gpu_count[: self.n][alive].sum()) * GPU_MILLI,
        }

    def live_rows(self) -> list[int]:
        return [row for row in range(self.n) if self.alive[row]]


_ARRAYS = (
    "cpu_cap",
    "cpu_used",
    "mem_cap",
    "mem_used",
    "ext_cap",
    "ext_used",
    "gpu_exists",
    "gpu_free",
    "gpu_mem",
    "gpu_numa",
    "gpu_nvlink",
    "gpu_model",
    "gpu_count",
    "free_whole",
    "max_share",
    "gpu_used_total",
    "schedulable",
    "alive",
    "victim_priority_bound",
)
