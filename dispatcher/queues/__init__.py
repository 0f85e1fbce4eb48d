"""Queue policies, one module each, all behind `PolicyQueue` (push, peek, pop, remove, len)."""

from gosched.common.config import QueueConfig, QueuePolicy
from gosched.dispatcher.queues.base import E, HeapQueue, PolicyQueue, QueueEntry
from gosched.dispatcher.queues.deadline import DeadlineQueue
from gosched.dispatcher.queues.drf import DrfQueue
from gosched.dispatcher.queues.fair import FairShareQueue
from gosched.dispatcher.queues.fifo import FifoQueue
from gosched.dispatcher.queues.priority import PriorityAgingQueue
from gosched.dispatcher.queues.tenants import TenantShareQueue
from gosched.dispatcher.usage import UsageTracker

__all__ = [
    "DeadlineQueue",
    "DrfQueue",
    "FairShareQueue",
    "FifoQueue",
    "HeapQueue",
    "PolicyQueue",
    "PriorityAgingQueue",
    "QueueEntry",
    "TenantShareQueue",
    "make_queue",
]


def make_queue(config: QueueConfig, usage: UsageTracker) -> PolicyQueue[E]:
    """The queue for `config.policy`; the tenant-fair ones read (and follow) `usage`."""
    policy = config.policy
    if policy == QueuePolicy.FIFO:
        return FifoQueue()
    if policy == QueuePolicy.PRIORITY:
        return PriorityAgingQueue(config.aging_per_s)
    if policy == QueuePolicy.DRF:
        return DrfQueue(usage, config.tenant_weights)
    if policy == QueuePolicy.FAIR:
        return FairShareQueue(usage, config.tenant_weights)
    if policy == QueuePolicy.DEADLINE:
        return DeadlineQueue()
    raise ValueError(f"queue {config.name}: unknown policy {policy!r}")
