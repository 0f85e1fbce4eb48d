"""The vectorised fast path: find the proposals of a batch that the sequential stages would accept
whole no matter what the rest of the batch does, so they can be bound without per-stage work.

A proposal is *clean* when
  * it names no victims, has >= max(1, min_needed) placements, and its job is not the job of any
    victim named in the batch (so no eviction or gang break of this batch can touch it);
  * its job has no anti-affinity rule (the anti_affinity stage looks at other tasks) and carries
    no labels that a rule of the batch repels (bound early, it would turn that rule's verdict) or
    a resident's rule repels (the stage checks that way round too);
  * its job's queue has no floor named in the batch (the queue_floors stage looks at the queue's
    whole usage, which a proposal bound early, out of batch order, would raise; the
    disruption_budgets stage reads only victims' jobs, which the first rule keeps off this path);
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
from dataclasses import dataclass, fields
from itertools import repeat
from operator import add, itemgetter
from typing import Any

import numpy as np

from gosched.binder.stages import gpu_shape_error, request_error
from gosched.binder.state import BinderState
from gosched.common.cluster_state import I64, MAX_GPUS, ClusterArrays, PlainUsage
from gosched.common.job import Job, TaskGroup, split_task_id
from gosched.common.messages import Placement, Proposal, ProposalColumns, unfold
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


# -- the usual batch, read from its columns ----------------------------------------------------------
@dataclass(slots=True)
class UsualBatch:
    """A batch of ProposalColumns that find_clean would find clean throughout, each proposal with
    one placement and every job of one shape (the fields its residents copy, one object each):
    what binding it needs, read from the columns."""

    job_ids: tuple[str, ...]  # per proposal (and placement), likewise the columns below
    task_ids: list[str]
    nodes: tuple[str, ...]
    task_indexes: tuple[int, ...]
    attempts: tuple[int, ...]
    rows: list[int]
    row_array: I64
    plain: PlainUsage
    group: TaskGroup  # every job's one group
    # Every job's tenant, queue, priority, min_member, preemptible, labels and disruption budget.
    job: tuple[str, str, int, int, bool, tuple[tuple[str, str], ...], int | None]
    standing: int | None


def _columns(cls: type, *names: str, after: int = 0) -> Any:
    """A getter of the columns of `names` (fields of `cls`, its first `after` left out) from a
    ProposalColumns' columns of `cls`, in that order."""
    at = [f.name for f in fields(cls)][after:]
    return itemgetter(*(at.index(name) for name in names))


_JOB_KEYS = _columns(Job, "id", "groups")
# What a resident copies from its job, in the order UsualBatch.job keeps it.
_JOB_SHAPE = _columns(
    Job, "tenant", "queue", "priority", "min_member", "preemptible", "labels", "disruption_budget"
)
_PLACEMENT = _columns(Placement, "task_index", "node", "gpus", "victims")
# ProposalColumns.rest: Proposal's fields after job and placements.
_REST = _columns(Proposal, "min_needed", "attempt", "held", "floors", "standing", after=2)


def usual_batch(state: BinderState, cols: ProposalColumns) -> UsualBatch | None:
    """The usual batch (see UsualBatch) of a batch planned on the binder's view at
    cols.seen_version, or None where it is anything else, the object path to judge it: the same
    conditions as find_clean's, each read once for the batch."""
    n = cols.n
    if not n or cols.counts is not None:
        return None
    ids, groups = _JOB_KEYS(cols.jobs)
    shape = _JOB_SHAPE(cols.jobs)
    tenant, queue, priority, min_member, preemptible, labels, budget = shape
    indexes, nodes, gpus, victims = _PLACEMENT(cols.placements)
    min_needed, attempts, held, floors, standing = _REST(cols.rest)
    # One object each throughout (one column entry): what every resident copies, and no victims,
    # no GPU pairs, no tasks already held (gang_need is then min_needed), at most one task needed.
    if any(len(c) != 1 for c in (groups, *shape, gpus, victims, min_needed, held, floors, standing)):
        return None
    if victims[0] != () or gpus[0] != () or held[0] != 0 or not min_needed[0] <= 1:
        return None
    if len(groups[0]) != 1:
        return None
    group = groups[0][0]
    req = group.resources
    if group.anti_affinity or request_error(req) is not None or req.extended or req.gpus or req.gpu_milli:
        return None
    a = state.arrays
    if a.repellers and _repelled(set(labels[0]), [frozenset(r.match_labels) for r in a.repellers]):
        return None
    job_ids = unfold(ids, n)
    if state.cancelled and not state.cancelled.keys().isdisjoint(job_ids):
        return None
    task_indexes = unfold(indexes, n)
    if any(type(i) is not int for i in indexes) or min(indexes) < 0 or max(indexes) >= group.replicas:
        return None
    if len(indexes) == 1 and indexes[0] < _SLASH_INDEXES:  # the usual: every job's first task
        task_ids = list(map(add, job_ids, repeat(_SLASH_INDEX[indexes[0]])))
    else:
        task_ids = [f"{jid}/{idx}" for jid, idx in zip(job_ids, task_indexes, strict=True)]
    if len(set(task_ids)) != n or not a.task_row.keys().isdisjoint(task_ids):
        return None  # a task proposed twice, or bound already
    row_of = a.row_of
    try:
        rows = [row_of[nodes[0]]] * n if len(nodes) == 1 else list(map(row_of.__getitem__, nodes))
    except KeyError:
        return None
    # No hot node: each touched node takes the whole batch's demand on it.
    row_array = np.array(rows, np.int64)
    touched, count = np.unique(row_array, return_counts=True)
    hot = (
        ~a.schedulable[touched]
        | (state.rules_version[touched] > cols.seen_version)
        | (a.cpu_used[touched] + count * req.cpu_milli > a.cpu_cap[touched])
        | (a.mem_used[touched] + count * req.memory > a.mem_cap[touched])
    )
    if hot.any():
        return None
    plain = PlainUsage(task_ids, np.full(n, req.cpu_milli, np.int64), np.full(n, req.memory, np.int64))
    return UsualBatch(
        job_ids,
        task_ids,
        unfold(nodes, n),
        task_indexes,
        unfold(attempts, n),
        rows,
        row_array,
        plain,
        group,
        (tenant[0], queue[0], priority[0], min_member[0], preemptible[0], labels[0], budget[0]),
        standing[0],
    )
