"""The vectorised fast path: find the proposals of a batch that the sequential stages would accept
whole no matter what the rest of the batch does, so they can be bound without per-stage work.

A proposal is *clean* when
  * it names no victims, has >= max(1, min_needed) placements, and its job is not the job of any
    victim named in the batch (so no eviction or gang break of this batch can touch it);
  * its job has no anti-affinity rule (the anti_affinity stage looks at other tasks) and carries
    no labels that a rule of the batch repels (bound early, it would turn that rule's verdict) or
    a resident's rule repels (the stage checks that way round too);
  * its job's queue has no floor named in the batch (the queue_floors stage looks at the queue's
    whole usage, which a proposal bound early, out of batch order, would raise);
  * each of its tasks is valid, unbound, proposed once in the whole batch and named by no victim;
  * each placement's node exists and is schedulable, its GPU pairs match the request (the same
    static checks as the stages), and every extended resource it asks for is known;
  * every node it touches has had the same labels, taints and GPUs since the batch's view
    (BinderState.rules_version, the node_current stage);
  * every node it touches is *cool*: the demand of ALL placements of the batch on that node (no
    victim credit, every placement counted as if accepted) fits the node's free cpu, memory,
    extended resources and each GPU's free milli — aggregated with np.add.at over the rows the
    batch touches only (a batch of 64 on 50,000 nodes must not pay for the 50,000).

Why the answers match the sequential path: usage only grows through placements, and every
placement that could ever be accepted on a cool node is in its aggregate, so a clean proposal passes
every stage whatever came before it. A non-clean proposal sees the same arrays either way: clean
proposals touch only cool nodes (where any placement fits whatever else is applied), bind tasks no
one else names, and evict nothing.
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gosched.binder.stages import gpu_shape_error, request_error
from gosched.binder.state import BinderState
from gosched.common.cluster_state import I64, MAX_GPUS, ClusterArrays, PlainUsage
from gosched.common.job import TaskGroup, split_task_id
from gosched.common.messages import Proposal
from gosched.common.resources import GPU_MILLI, ResourceRequest


@dataclass(slots=True)
class CleanSet:
    """The clean proposals of a batch, as columns: what binding them needs, gathered once."""

    index: list[int]  # position of each clean proposal in the batch, in batch order
    rows: list[int]  # row of each of their placements: proposal by proposal, in placement order
    tids: list[str]  # task id of each of those placements, likewise
    # Where no placement of the batch names GPUs or asks for any GPU or extended resource (the
    # usual batch) and all are clean: each placement's cpu and memory, likewise. None otherwise.
    plain: PlainUsage | None = None
    row_array: I64 | None = None  # `rows` as an array, where all are clean: place_many's too

    def __len__(self) -> int:
        return len(self.index)


NO_CLEAN = CleanSet([], [], [])  # read only

# "/0", "/1", ...: what task_id() puts after the job id, for the usual task indexes.
_SLASH_INDEXES = 4096
_SLASH_INDEX = tuple(f"/{i}" for i in range(_SLASH_INDEXES))


def find_clean(state: BinderState, proposals: Sequence[Proposal], seen_version: int) -> CleanSet:
    """The clean proposals of a batch planned on the binder's view at `seen_version` (see the
    module docstring), in batch order."""
    a = state.arrays
    row_of = a.row_of
    task_row = a.task_row

    job_tasks = state.job_tasks
    cancelled = state.cancelled
    tids: list[str] = []  # every placement's task id, in batch order
    victims: set[str] = set()

    # Demand of every placement with a node (clean or not), and each proposal's verdict so far.
    # Requests are few (the batch's jobs mostly share interned groups): each demand names its
    # request's slot in `reqs`, and the cpu and memory columns are read from the slots at once.
    d_rows: list[int] = []
    d_slot: list[int] = []
    slot_of: dict[int, int] = {}  # id(request) -> its slot, or -1 for a request in error
    reqs: list[ResourceRequest] = []
    plain: list[bool] = []  # per slot: no extended resource and no GPU asked for

    def slot_for(req: ResourceRequest) -> int:
        slot = slot_of.get(id(req))
        if slot is None:
            slot = slot_of[id(req)] = len(reqs) if request_error(req) is None else -1
            if slot >= 0:
                reqs.append(req)
                plain.append(not (req.extended or req.gpus or req.gpu_milli))
        return slot

    extra = _Extra()
    maybe: list[int] = []
    # Match labels of the batch's anti-affinity rules: a job carrying them may not be bound ahead
    # of the proposal whose rule repels it (the stages would have judged that one first).
    repelled: list[frozenset[tuple[str, str]]] = []
    # What a job's groups tell, kept for the next proposal: consecutive jobs often share theirs.
    last_groups: tuple[TaskGroup, ...] | None = None
    single: ResourceRequest | None = None  # the request of a one-group job's tasks
    single_slot = -1
    total = 0
    repels = False
    all_plain = True  # no placement so far names GPUs or asks for a GPU or extended resource

    for i, p in enumerate(proposals):
        job = p.job
        jid = job.id
        groups = job.groups
        placements = p.placements
        n = len(placements)
        need = p.min_needed  # gang_need(p, state), inlined: it runs once per proposal
        if p.held:
            need += max(0, p.held - len(job_tasks.get(jid, ())))
        clean = n >= need and n > 0 and jid not in cancelled
        if groups is not last_groups:
            last_groups = groups
            repels = False
            for group in groups:
                if group.anti_affinity:  # the anti_affinity stage looks at other tasks: the stages judge it
                    repels = True
                    repelled.extend(frozenset(r.match_labels) for r in group.anti_affinity if r.match_labels)
            total = sum(group.replicas for group in groups)  # job.total_replicas
            single = groups[0].resources if len(groups) == 1 else None
            if single is not None:
                single_slot = slot_for(single)
        if repels:
            clean = False
        for pl in placements:
            idx = pl.task_index
            # task_id(): the "/index" strings made once (a concatenation costs a third of
            # formatting); an index that is not a plain int is formatted as task_id() does.
            tid = (
                jid + _SLASH_INDEX[idx] if type(idx) is int and 0 <= idx < _SLASH_INDEXES else f"{jid}/{idx}"
            )
            tids.append(tid)
            if pl.victims:
                victims.update(pl.victims)
                clean = False
            if not 0 <= idx < total:
                clean = False
                continue  # fails task_valid whatever happens: never consumes
            if single is not None:
                req = single
                slot = single_slot
            else:
                req = job.group_of(idx).resources
                slot = slot_for(req)
            try:
                row = row_of[pl.node]  # a subscript: half a get() call
            except KeyError:
                clean = False
                continue  # fails node_exists whatever happens: never consumes
            if slot < 0:
                clean = False
                continue  # fails task_valid whatever happens: never consumes
            d_rows.append(row)
            d_slot.append(slot)
            gpus = pl.gpus
            if gpus or not plain[slot]:
                all_plain = False
                clean = extra.add(a, row, req, gpus, clean and tid not in task_row)
            elif clean and tid in task_row:  # an unschedulable node makes its rows hot, below
                clean = False
        if clean:
            maybe.append(i)

    # Rare: a task proposed twice in the batch, or victims named. Neither such task nor a victim's
    # job may take the fast path (an eviction or gang break of the batch could touch it).
    if victims or len(set(tids)) != len(tids):
        named = Counter(tids)
        victim_jobs = {split_task_id(v)[0] for v in victims}

        def untouched(i: int) -> bool:
            p = proposals[i]
            jid = p.job.id
            if jid in victim_jobs:
                return False
            return all(
                named[t] == 1 and t not in victims for t in (f"{jid}/{pl.task_index}" for pl in p.placements)
            )

        maybe = [i for i in maybe if untouched(i)]

    if a.repellers and maybe:  # residents' rules repel the other way too: the stages judge it
        repelled.extend(frozenset(rule.match_labels) for rule in a.repellers)
    if repelled and maybe:
        maybe = [i for i in maybe if not _repelled(set(proposals[i].job.labels), repelled)]

    if victims and maybe:  # floors travel only with proposals that evict
        floored = {f.queue for p in proposals for f in p.floors}
        if floored:
            maybe = [i for i in maybe if proposals[i].job.queue not in floored]

    if not maybe:
        return NO_CLEAN

    # Hot nodes: unschedulable, or where the whole batch's demand does not fit what is free. Only
    # the touched rows are looked at: `at` maps each demand to its row's place in `touched`.
    row_array = np.array(d_rows, np.int64)
    touched, at = np.unique(row_array, return_inverse=True)
    k = touched.size
    cpu = np.zeros(k, np.int64)
    mem = np.zeros(k, np.int64)
    if len(reqs) == 1:  # one request for the whole batch (the usual batch): no slot column to read
        d_cpu = np.full(len(d_rows), reqs[0].cpu_milli, np.int64)
        d_mem = np.full(len(d_rows), reqs[0].memory, np.int64)
    else:
        slots = np.array(d_slot, np.int64)
        d_cpu = np.array([r.cpu_milli for r in reqs], np.int64)[slots]
        d_mem = np.array([r.memory for r in reqs], np.int64)[slots]
    np.add.at(cpu, at, d_cpu)
    np.add.at(mem, at, d_mem)
    hot = (
        ~a.schedulable[touched]
        | (state.rules_version[touched] > seen_version)
        | (a.cpu_used[touched] + cpu > a.cpu_cap[touched])
        | (a.mem_used[touched] + mem > a.mem_cap[touched])
    )
    if extra.e_rows:  # rows with demands are all in `touched` (e_rows and g_rows are subsets of d_rows)
        ext = np.zeros((k, a.ext_cap.shape[1]), np.int64)
        e_at = np.searchsorted(touched, np.array(extra.e_rows, np.int64))
        np.add.at(ext, (e_at, np.array(extra.e_cols)), np.array(extra.e_amt, np.int64))
        hot |= (a.ext_used[touched] + ext > a.ext_cap[touched]).any(axis=1)
    if extra.g_rows:
        gpu = np.zeros((k, MAX_GPUS), np.int64)
        g_at = np.searchsorted(touched, np.array(extra.g_rows, np.int64))
        np.add.at(gpu, (g_at, np.array(extra.g_idx)), np.array(extra.g_milli, np.int64))
        hot |= (gpu > a.gpu_free[touched]).any(axis=1)
    hot_rows = set(touched[hot].tolist()) if hot.any() else set()
    if not hot_rows and len(maybe) == len(proposals):
        # Every proposal clean (the usual batch): each placement gave one demand and one task id,
        # in order, so the columns are those already gathered.
        plain_usage = PlainUsage(tids, d_cpu, d_mem) if all_plain else None
        return CleanSet(maybe, d_rows, tids, plain_usage, row_array)
    # Otherwise gather the clean proposals' columns again (their nodes all exist).
    out = CleanSet([], [], [])
    for i in maybe:
        p = proposals[i]
        rows = [row_of[pl.node] for pl in p.placements]
        if hot_rows.isdisjoint(rows):
            out.index.append(i)
            out.rows.extend(rows)
            out.tids.extend(f"{p.job.id}/{pl.task_index}" for pl in p.placements)
    return out


class _Extra:
    """The extended-resource and GPU demands of a batch's placements (rows, columns, amounts)."""

    __slots__ = ("e_amt", "e_cols", "e_rows", "g_idx", "g_milli", "g_rows")

    def __init__(self) -> None:
        self.e_rows: list[int] = []
        self.e_cols: list[int] = []
        self.e_amt: list[int] = []
        self.g_rows: list[int] = []
        self.g_idx: list[int] = []
        self.g_milli: list[int] = []

    def add(
        self, a: ClusterArrays, row: int, req: ResourceRequest, gpus: tuple[tuple[int, int], ...], clean: bool
    ) -> bool:
        """Count the demand of a placement that names GPUs or asks for extended resources or GPUs;
        returns `clean` and whether its GPUs and extended resources pass the static checks."""
        for name, amount in req.extended:
            if not amount:
                continue
            col = a.ext_col(name)
            if col is None:
                clean = False
                continue
            self.e_rows.append(row)
            self.e_cols.append(col)
            self.e_amt.append(amount)
        for g, milli in gpus:
            if 0 <= g < MAX_GPUS and 0 < milli <= GPU_MILLI:
                self.g_rows.append(row)
                self.g_idx.append(g)
                self.g_milli.append(milli)
        if clean and (gpus or req.gpus or req.gpu_milli):
            gpu_exists = a.gpu_exists
            if gpu_shape_error(req, gpus) is not None or not all(gpu_exists[row, g] for g, _ in gpus):
                return False
        return clean


def _repelled(labels: set[tuple[str, str]], repelled: list[frozenset[tuple[str, str]]]) -> bool:
    return any(wanted <= labels for wanted in repelled)
