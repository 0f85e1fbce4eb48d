"""Queue policies, one module each, all behind `PolicyQueue` (push, peek, pop, remove, len)."""

import time
from collections.abc import Callable

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


def make_queue(
    config: QueueConfig, usage: UsageTracker, clock: Callable[[], float] = time.time
) -> PolicyQueue[E]:
    """The queue for `config.policy`; the tenant-fair ones read (and follow) `usage` within their
    own queue, `config.name`; priority reads `clock` (the one that stamps submit_time) to age its
    jobs."""
    policy = config.policy
    if policy == QueuePolicy.FIFO:
        return FifoQueue()
    if policy == QueuePolicy.PRIORITY:
        return PriorityAgingQueue(config.aging_per_s, config.aging_max_s, clock)
    if policy == QueuePolicy.DRF:
        return DrfQueue(usage, config.tenant_weights, queue=config.name)
    if policy == QueuePolicy.FAIR:
        return FairShareQueue(usage, config.tenant_weights, queue=config.name)
    if policy == QueuePolicy.DEADLINE:
        return DeadlineQueue()
    raise ValueError(f"queue {config.name}: unknown policy {policy!r}")
