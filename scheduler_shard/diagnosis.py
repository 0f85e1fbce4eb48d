"""Why a task fits nowhere: each filter's count of the nodes it was first to rule out, then, of the
nodes every filter passes, those the Grouping plugin kept the unit off, and why."""

from collections.abc import Sequence

import numpy as np

from gosched.common.cluster_state import ClusterArrays
from gosched.common.messages import (
    GANG_APART_REASON,
    LEFT_NODE_REASON,
    LONE_GPUS_REASON,
    LONE_UNPLACED_REASON,
    Diagnosis,
)
from gosched.common.resources import GPU_MILLI, ResourceRequest
from gosched.scheduler_shard.framework.interfaces import Mask
from gosched.scheduler_shard.framework.profile import Profile
from gosched.scheduler_shard.framework.task_class import TaskClass
from gosched.scheduler_shard.unit_context import UnitContext


def diagnose(
    profile: Profile,
    tc: TaskClass,
    state: ClusterArrays,
    ctx: UnitContext,
    note: str = "",
    unit_rules: Sequence[tuple[str, Mask]] = (),
    left_rows: Sequence[int] = (),
) -> Diagnosis:
    """`unit_rules`: (reason, rows) the unit was never tried on (its Grouping's domains), counted
    after the filters, so a node is blamed on the domain only when it would otherwise fit.
    `left_rows`: rows the attempt kept the unit's tasks off because the view still holds them
    there, released at the binder since (Placer._try); a node left over is the gang's doing only
    for a gang (min_member above 1)."""
    alive = state.alive[: state.n].copy()
    remaining = alive.copy()
    counts: dict[str, int] = {}
    rows = slice(0, state.n)
    for f in profile.filters:
        if not f.relevant(tc, state):
            continue
        for reason, ruled_out in f.explain(tc, state, rows):
            hit = ruled_out & remaining
            if hit.any():
                counts[reason] = counts.get(reason, 0) + int(hit.sum())
                remaining &= ~hit
    for uf in profile.unit_filters:
        if uf.relevant(tc, state):
            excluded = uf.excluded(tc, ctx, state)
            if excluded is not None:
                hit = excluded & remaining
                if hit.any():
                    counts[uf.reason] = counts.get(uf.reason, 0) + int(hit.sum())
                    remaining &= ~hit
    for reason, ruled_out in unit_rules:
        hit = ruled_out & remaining
        if hit.any():
            counts[reason] = counts.get(reason, 0) + int(hit.sum())
            remaining &= ~hit
    for row in left_rows:
        if row < state.n and remaining[row]:
            counts[LEFT_NODE_REASON] = counts.get(LEFT_NODE_REASON, 0) + 1
            remaining[row] = False
    if remaining.any():
        if ctx.unit.job.min_member > 1:
            # Nodes that pass each filter alone but not the unit as a whole (the gang did not fit).
            reason = GANG_APART_REASON
        else:  # tasks that each stand alone: no gang kept them off
            reason = LONE_GPUS_REASON if tc.wants_gpu else LONE_UNPLACED_REASON
        counts[reason] = int(np.count_nonzero(remaining))
    return Diagnosis(total_nodes=int(alive.sum()), ruled_out=counts, note=note)


def most_on_empty_nodes(req: ResourceRequest, state: ClusterArrays, usable: Mask) -> int:
    """At most how many tasks asking `req` the `usable` rows (alive, past the static filters) would
    hold with nothing on them: each node's capacity over the request, per resource. An upper
    bound (a GPU too small for gpu_memory_mib on a node that has bigger ones counts), so a gang
    needing more can never be placed on this cluster as it is, however long it waits."""
    n = state.n
    rows = usable[:n] & state.alive[:n]
    fits = np.where(rows, np.int64(1) << 40, 0)  # no resource asked: unbounded per node
    if req.cpu_milli > 0:
        fits = np.minimum(fits, state.cpu_cap[:n] // req.cpu_milli)
    if req.memory > 0:
        fits = np.minimum(fits, state.mem_cap[:n] // req.memory)
    gpus = state.gpu_count[:n].astype(np.int64)
    if req.gpus > 0:
        fits = np.minimum(fits, gpus // req.gpus)
    elif req.gpu_milli > 0:
        fits = np.minimum(fits, gpus * (GPU_MILLI // req.gpu_milli))
    for name, amount in req.extended:
        col = state.ext_col(name)
        if amount > 0:
            fits = np.minimum(fits, 0 if col is None else state.ext_cap[:n, col] // amount)
    return int(np.minimum(fits, 1 << 40).sum())
