"""topology_domain: place a whole gang inside one topology domain when the job asks for it.

A job labelled `gosched.io/pack-domain: <label key>` (e.g. "zone" or "rack") is tried domain by
domain, the domains with the most free GPUs (then CPU) first.
"""

import numpy as np

from gosched.common.cluster_state import ClusterArrays
from gosched.common.messages import Unit
from gosched.scheduler_shard.framework.interfaces import GroupingPlugin, Mask
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.plugins.labels import domain_ids

PACK_DOMAIN_LABEL = "gosched.io/pack-domain"


@register
class TopologyDomain(GroupingPlugin):
    name = "topology_domain"

    def groups(self, unit: Unit, state: ClusterArrays) -> list[Mask] | None:
        key = dict(unit.job.labels).get(PACK_DOMAIN_LABEL)
        if not key:
            return None
        domains = domain_ids(state, key)
        free_gpu = state.gpu_count[: state.n].astype(np.int64) * 1000 - state.gpu_used_total[: state.n]
        free_cpu = state.cpu_cap[: state.n] - state.cpu_used[: state.n]
        ranked = []
        for d in np.unique(domains[domains >= 0]):
            mask = domains == d
            ranked.append(((int(free_gpu[mask].sum()), int(free_cpu[mask].sum())), mask))
        ranked.sort(key=lambda item: item[0], reverse=True)
        return [mask for _, mask in ranked]
