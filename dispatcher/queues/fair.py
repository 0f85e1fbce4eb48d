"""Weighted fair share across the tenants of this queue: a tenant's normalised usage is the mean of
its cpu, memory and gpu shares of the cluster (held + in-flight, within this queue only: usage in
other queues is theirs to share), divided by its weight; smallest first, FIFO within a tenant. With
weights 2:1 and equal demand, usage settles at 2:1."""

from gosched.dispatcher.queues.base import E
from gosched.dispatcher.queues.tenants import TenantShareQueue


class FairShareQueue(TenantShareQueue[E]):
    __slots__ = ()

    def tenant_key(self, tenant: str) -> float:
        return self.usage.tenant_mean_share(tenant, self.queue) / self.weight(tenant)
