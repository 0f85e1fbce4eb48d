"""Dominant resource fairness across the tenants of this queue: next job from the tenant with the
smallest weighted dominant share (its held + in-flight usage within this queue, over the cluster
capacity, divided by its weight); FIFO within a tenant. Usage in other queues does not count: the
queues split the cluster by their guarantees and caps, this queue splits its part (as YARN's DRF)."""

from gosched.dispatcher.queues.base import E
from gosched.dispatcher.queues.tenants import TenantShareQueue


class DrfQueue(TenantShareQueue[E]):
    __slots__ = ()

    def tenant_key(self, tenant: str) -> float:
        return self.usage.tenant_share(tenant, self.queue) / self.weight(tenant)
