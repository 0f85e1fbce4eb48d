"""Dominant resource fairness across tenants: next job from the tenant with the smallest weighted
dominant share (held + in-flight usage over the cluster capacity, divided by the tenant's weight);
FIFO within a tenant."""

from gosched.dispatcher.queues.base import E
from gosched.dispatcher.queues.tenants import TenantShareQueue


class DrfQueue(TenantShareQueue[E]):
    __slots__ = ()

    def tenant_key(self, tenant: str) -> float:
        return self.usage.tenant_share(tenant) / self.weight(tenant)
