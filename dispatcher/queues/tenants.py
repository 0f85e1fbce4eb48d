"""Shared machinery of the tenant-fair policies (drf, fair): next job from the neediest tenant.

Neediest by the tenant's usage within this queue (`queue`, the queue's name), not over the cluster:
as in YARN's hierarchical fair scheduling, the queues split the cluster (guarantees, caps) and each
queue splits its part among its tenants, so a tenant's work in another queue must not cost it its
turn here. The queue subscribes to its own queue's usage only.

Each tenant has its own FIFO (a heap on submission sequence, so requeued jobs keep their place).
Tenants are ordered by (key, sequence of their head job) in a heap whose items go stale when the
tenant's usage or head changes; the usage tracker tells the queue which tenants changed, and those
are re-keyed on the next peek. Stale items are skipped by version, so a pop is O(log tenants).
"""

import heapq
from collections.abc import Mapping
from typing import Generic, TypeVar

from gosched.dispatcher.queues.base import QueueEntry
from gosched.dispatcher.usage import UsageTracker

E = TypeVar("E", bound=QueueEntry)


class TenantShareQueue(Generic[E]):
    """FIFO within a tenant; across tenants, smallest `tenant_key` first (ties: older head job).

    `queue` names the queue whose usage ranks the tenants (`make_queue` passes the config's name);
    None ranks them by their usage over every queue (a queue used on its own, outside a dispatcher).
    """

    __slots__ = (
        "_by_tenant",
        "_dirty",
        "_live",
        "_members",
        "_tenant_heap",
        "_token",
        "_ver",
        "_version",
        "queue",
        "usage",
        "weights",
    )

    def __init__(
        self, usage: UsageTracker, weights: Mapping[str, float] | None = None, queue: str | None = None
    ) -> None:
        self.usage = usage
        self.queue = queue
        self.weights = dict(weights or {})
        self._by_tenant: dict[str, list[tuple[int, int, E]]] = {}  # tenant -> heap of (seq, token, entry)
        self._live: dict[str, int] = {}  # tenant -> live entries
        self._members: dict[str, tuple[int, str]] = {}  # job id -> (token, tenant)
        self._tenant_heap: list[tuple[float, int, int, str]] = []  # (key, head seq, version, tenant)
        self._ver: dict[str, int] = {}  # tenant -> version of its one valid tenant-heap item
        self._version = 0
        self._token = 0
        self._dirty: set[str] = set()
        usage.subscribe(self._on_usage, queue)

    # -- policy -------------------------------------------------------------------------------------
    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def tenant_key(self, tenant: str) -> float:
        """Smaller goes first. Subclasses: the tenant's (weighted) usage share within `queue`."""
        raise NotImplementedError

    # -- queue interface ----------------------------------------------------------------------------
    def push_many(self, entries: list[E]) -> None:
        for entry in entries:
            self.push(entry)

    def push(self, entry: E) -> None:
        tenant = entry.job.tenant
        old = self._members.get(entry.job_id)
        if old is not None:
            self._drop(old[1])
        self._token += 1
        self._members[entry.job_id] = (self._token, tenant)
        heap = self._by_tenant.get(tenant)
        if heap is None:
            heap = self._by_tenant[tenant] = []
        heapq.heappush(heap, (entry.seq, self._token, entry))
        self._live[tenant] = self._live.get(tenant, 0) + 1
        self._dirty.add(tenant)

    def peek(self) -> E | None:
        if self._dirty:
            self._refresh()
        th = self._tenant_heap
        while th:
            _, _, version, tenant = th[0]
            if self._ver.get(tenant) == version:
                head = self._head(tenant)
                if head is not None:
                    return head
            heapq.heappop(th)
        return None

    def pop(self) -> E | None:
        entry = self.peek()
        if entry is None:
            return None
        tenant = entry.job.tenant
        heapq.heappop(self._by_tenant[tenant])
        del self._members[entry.job_id]
        self._drop(tenant)
        return entry

    def remove(self, job_id: str) -> bool:
        member = self._members.pop(job_id, None)
        if member is None:
            return False
        self._drop(member[1])
        return True

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._members

    # -- internals ----------------------------------------------------------------------------------
    def _drop(self, tenant: str) -> None:
        """One live entry of `tenant` is gone (popped, removed or replaced)."""
        left = self._live[tenant] - 1
        if left:
            self._live[tenant] = left
            self._dirty.add(tenant)
        else:
            del self._live[tenant]
            del self._by_tenant[tenant]
            self._ver.pop(tenant, None)
            self._dirty.discard(tenant)

    def _head(self, tenant: str) -> E | None:
        heap = self._by_tenant.get(tenant)
        members = self._members
        while heap:
            _, token, entry = heap[0]
            member = members.get(entry.job_id)
            if member is not None and member[0] == token:
                return entry
            heapq.heappop(heap)
        return None

    def _on_usage(self, tenant: str | None) -> None:
        if tenant is None:
            self._dirty.update(self._live)
        elif tenant in self._live:
            self._dirty.add(tenant)

    def _refresh(self) -> None:
        th = self._tenant_heap
        if len(th) > 4 * len(self._live) + 64:
            th.clear()
            self._dirty.update(self._live)
        for tenant in self._dirty:
            head = self._head(tenant)
            if head is None:
                continue
            self._version += 1
            self._ver[tenant] = self._version
            heapq.heappush(th, (self.tenant_key(tenant), head.seq, self._version, tenant))
        self._dirty.clear()
