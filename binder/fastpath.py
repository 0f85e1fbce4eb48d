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
from gosched.common.cluster_state import MAX_GPUS
from gosched.common.job import split_task_id
from gosched.common.messages import Proposal
from gosched.common.resources import GPU_MILLI, ResourceRequest


@dataclass(slots=True)
class CleanUnit:
    index: int  # position of the proposal in the batch
    rows: list[int]  # row of each placement, in order


def find_clean(state: BinderState, proposals: Sequence[Proposal], seen_version: int) -> list[CleanUnit]:
    """The clean proposals of a batch planned on the binder's view at `seen_version` (see the
    module docstring), in batch order."""
    a = state.arrays
    row_of = a.row_of
    gpu_exists = a.gpu_exists
    task_row = a.task_row

    job_tasks = state.job_tasks
    cancelled = state.cancelled
    tids: list[str] = []  # every placement's task id, in batch order
    victims: set[str] = set()

    # Demand of every placement with a node (clean or not), and each proposal's verdict so far.
    d_rows: list[int] = []
    d_cpu: list[int] = []
    d_mem: list[int] = []
    e_rows: list[int] = []
    e_cols: list[int] = []
    e_amt: list[int] = []
    g_rows: list[int] = []
    g_idx: list[int] = []
    g_milli: list[int] = []
    maybe: list[CleanUnit] = []
    # request_error per request object: the batch's jobs mostly share a few (interned groups).
    bad_request: dict[int, bool] = {}
    # Match labels of the batch's anti-affinity rules: a job carrying them may not be bound ahead
    # of the proposal whose rule repels it (the stages would have judged that one first).
    repelled: list[frozenset[tuple[str, str]]] = []

    for i, p in enumerate(proposals):
        job = p.job
        jid = job.id
        groups = job.groups
        if len(groups) == 1:
            single: ResourceRequest | None = groups[0].resources
            total = groups[0].replicas
        else:
            single = None
            total = job.total_replicas
        placements = p.placements
        need = p.min_needed  # gang_need(p, state), inlined: it runs once per proposal
        if p.held:
            need += max(0, p.held - len(job_tasks.get(jid, ())))
        clean = len(placements) >= max(1, need) and jid not in cancelled
        for group in groups:
            if group.anti_affinity:  # the anti_affinity stage looks at other tasks: the stages judge it
                clean = False
                repelled.extend(frozenset(r.match_labels) for r in group.anti_affinity if r.match_labels)
        rows: list[int] = []
        for pl in placements:
            idx = pl.task_index
            tid = f"{jid}/{idx}"  # task_id()
            tids.append(tid)
            if pl.victims:
                victims.update(pl.victims)
                clean = False
            row = row_of.get(pl.node)
            if not 0 <= idx < total:
                clean = False
                continue  # fails task_valid whatever happens: never consumes
            req = single if single is not None else job.group_of(idx).resources
            bad = bad_request.get(id(req))
            if bad is None:
                bad = bad_request[id(req)] = request_error(req) is not None
            if row is None or bad:
                clean = False
                continue  # fails node_exists / task_valid whatever happens: never consumes
            rows.append(row)
            d_rows.append(row)
            d_cpu.append(req.cpu_milli)
            d_mem.append(req.memory)
            if req.extended:
                for name, amount in req.extended:
                    if not amount:
                        continue
                    col = a.ext_col(name)
                    if col is None:
                        clean = False
                        continue
                    e_rows.append(row)
                    e_cols.append(col)
                    e_amt.append(amount)
            gpus = pl.gpus
            for g, milli in gpus:
                if 0 <= g < MAX_GPUS and 0 < milli <= GPU_MILLI:
                    g_rows.append(row)
                    g_idx.append(g)
                    g_milli.append(milli)
            if not clean or tid in task_row:  # an unschedulable node makes its rows hot, below
                clean = False
                continue
            if (gpus or req.gpus or req.gpu_milli) and (
                gpu_shape_error(req, gpus) is not None or not all(gpu_exists[row, g] for g, _ in gpus)
            ):
                clean = False
        if clean:
            maybe.append(CleanUnit(i, rows))

    # Rare: a task proposed twice in the batch, or victims named. Neither such task nor a victim's
    # job may take the fast path (an eviction or gang break of the batch could touch it).
    if victims or len(set(tids)) != len(tids):
        named = Counter(tids)
        victim_jobs = {split_task_id(v)[0] for v in victims}

        def untouched(u: CleanUnit) -> bool:
            p = proposals[u.index]
            jid = p.job.id
            if jid in victim_jobs:
                return False
            return all(
                named[t] == 1 and t not in victims for t in (f"{jid}/{pl.task_index}" for pl in p.placements)
            )

        maybe = [u for u in maybe if untouched(u)]

    if a.repellers and maybe:  # residents' rules repel the other way too: the stages judge it
        repelled.extend(frozenset(rule.match_labels) for rule in a.repellers)
    if repelled and maybe:
        maybe = [u for u in maybe if not _repelled(set(proposals[u.index].job.labels), repelled)]

    if victims and maybe:  # floors travel only with proposals that evict
        floored = {f.queue for p in proposals for f in p.floors}
        if floored:
            maybe = [u for u in maybe if proposals[u.index].job.queue not in floored]

    if not maybe:
        return []

    # Hot nodes: unschedulable, or where the whole batch's demand does not fit what is free. Only
    # the touched rows are looked at: `at` maps each demand to its row's place in `touched`.
    touched, at = np.unique(np.array(d_rows, np.int64), return_inverse=True)
    k = touched.size
    cpu = np.zeros(k, np.int64)
    mem = np.zeros(k, np.int64)
    np.add.at(cpu, at, np.array(d_cpu, np.int64))
    np.add.at(mem, at, np.array(d_mem, np.int64))
    hot = (
        ~a.schedulable[touched]
        | (state.rules_version[touched] > seen_version)
        | (a.cpu_used[touched] + cpu > a.cpu_cap[touched])
        | (a.mem_used[touched] + mem > a.mem_cap[touched])
    )
    if e_rows:  # rows with demands are all in `touched` (e_rows and g_rows are subsets of d_rows)
        ext = np.zeros((k, a.ext_cap.shape[1]), np.int64)
        e_at = np.searchsorted(touched, np.array(e_rows, np.int64))
        np.add.at(ext, (e_at, np.array(e_cols)), np.array(e_amt, np.int64))
        hot |= (a.ext_used[touched] + ext > a.ext_cap[touched]).any(axis=1)
    if g_rows:
        gpu = np.zeros((k, MAX_GPUS), np.int64)
        g_at = np.searchsorted(touched, np.array(g_rows, np.int64))
        np.add.at(gpu, (g_at, np.array(g_idx)), np.array(g_milli, np.int64))
        hot |= (gpu > a.gpu_free[touched]).any(axis=1)
    if not hot.any():
        return maybe
    hot_rows = set(touched[hot].tolist())
    return [u for u in maybe if hot_rows.isdisjoint(u.rows)]


def _repelled(labels: set[tuple[str, str]], repelled: list[frozenset[tuple[str, str]]]) -> bool:
    return any(wanted <= labels for wanted in repelled)
