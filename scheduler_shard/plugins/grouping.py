"""topology_domain: place a whole gang inside one topology domain when the job asks for it.

A job labelled `gosched.io/pack-domain: <label key>` (e.g. "zone" or "rack") is tried domain by
domain, the domains with the most free GPUs (then CPU) first. A later attempt of a job whose other
tasks are already bound (a gang placed in parts: min_member below its replicas) goes only to the
domain holding them, as Volcano's network-topology-aware gang placement keeps a job's later pods
in the hypernode its first pods took: when that domain has no room, the tasks wait there rather
than split the gang across domains.
"""

import numpy as np
import numpy.typing as npt

from gosched.common.cluster_state import ClusterArrays
from gosched.common.job import task_id
from gosched.common.messages import Unit
from gosched.scheduler_shard.framework.interfaces import GroupingPlugin, Mask
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.plugins.labels import domain_ids, label_column

PACK_DOMAIN_LABEL = "gosched.io/pack-domain"

Ids = npt.NDArray[np.int64]


def _pack_key(unit: Unit) -> str | None:
    labels = unit.job.labels
    if not labels:  # most jobs carry none: no dict to build (asked once per unit)
        return None
    return dict(labels).get(PACK_DOMAIN_LABEL) or None


def _held_domain(unit: Unit, state: ClusterArrays, ids: Ids) -> int | None:
    """The domain of the job's tasks bound outside this unit (the one holding most of them), or
    None when none is bound on a labelled node. A job's replicas, not the nodes, are looped over."""
    job = unit.job
    total = job.total_replicas
    if len(unit.task_indexes) >= total:
        return None  # the unit is the whole job: nothing of it is bound elsewhere
    own = set(unit.task_indexes)
    task_row = state.task_row
    rows = [
        row for i in range(total) if i not in own and (row := task_row.get(task_id(job.id, i))) is not None
    ]
    if not rows:
        return None
    held = ids[rows]
    held = held[held >= 0]
    if held.size == 0:
        return None
    return int(np.bincount(held).argmax())


@register
class TopologyDomain(GroupingPlugin):
    name = "topology_domain"

    def groups(self, unit: Unit, state: ClusterArrays) -> list[Mask] | None:
        key = _pack_key(unit)
        if key is None:
            return None
        ids = domain_ids(state, key)
        held = _held_domain(unit, state, ids)
        if held is not None:
            return [ids == held]  # only where the gang already is: never split it
        count = int(ids.max()) + 1 if ids.size else 0
        if count == 0:
            return []  # no node carries the key: explain() says so
        n = state.n
        labelled = ids >= 0
        free_gpu = state.gpu_count[:n].astype(np.int64) * 1000 - state.gpu_used_total[:n]
        free_cpu = state.cpu_cap[:n] - state.cpu_used[:n]
        # Per-domain sums in one pass each (exact: integer sums well below 2**53).
        gpu = np.bincount(ids[labelled], weights=free_gpu[labelled], minlength=count)
        cpu = np.bincount(ids[labelled], weights=free_cpu[labelled], minlength=count)
        # Most free GPUs, then CPU; ties keep the lower domain id first (a stable sort).
        order = np.lexsort((-cpu, -gpu))
        return [ids == d for d in order.tolist()]

    def explain(self, unit: Unit, state: ClusterArrays) -> list[tuple[str, Mask]]:
        """(reason, rows never tried) pairs for "why pending": nodes without the domain label, and
        the nodes outside the domain the job's bound tasks hold."""
        key = _pack_key(unit)
        if key is None:
            return []
        ids = domain_ids(state, key)
        out = [(f"missing label {key!r} ({PACK_DOMAIN_LABEL})", ids < 0)]
        held = _held_domain(unit, state, ids)
        if held is not None:
            value = label_column(state, key)[int(np.flatnonzero(ids == held)[0])]
            reason = f"outside {key}={value}, where the job's bound tasks are (waiting for room there)"
            out.append((reason, (ids >= 0) & (ids != held)))
        return out
