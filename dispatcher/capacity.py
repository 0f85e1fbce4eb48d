"""Capacity across queues: guarantees, borrowing up to max_share, and who must give back.

Shares are dominant shares of the cluster (held + in-flight usage). Picking the next queue:

1. queues below their guarantee, smallest share/guarantee first;
2. then queues that may borrow (share below max_share), smallest share/entitlement first, so
   spare room is split in proportion to guarantees (as YARN's capacity scheduler orders queues by
   used over configured capacity). A queue's entitlement is its guarantee; a queue without one is
   entitled to an equal part of what the guarantees leave unpromised (a sliver if nothing is), so
   queues without guarantees still take turns by share among themselves.

A unit may not take its queue above max_share (max_share 1.0 is not enforced here: the whole
cluster is the binder's limit, and a full cluster must still let priority preemption happen).
A unit of a queue below its guarantee may reclaim from the queues above theirs (borrowing), if
its queue's share with the unit stays within the guarantee: reclaim gives a guarantee back, it
does not take a queue past it (else two queues reclaiming from each other would never settle).
For reclaim the queue's share is what it holds plus its reclaiming units in flight, not its other
units in flight: a gang past the guarantee tried on free room claims nothing, and must not stop
the units behind it from reclaiming (the dispatcher's `_claims`).

Guarantees protect against other queues' preemption too: every unit carries, in `Unit.floors`,
the floor of each queue with a guarantee (`QueueFloor`): usage a shard's cross-queue
evictions must leave that queue, whether they reclaim or preempt by priority. So reclaim takes
only what others borrow, and a borrower never takes from a queue within its guarantee. Reclaim
asks no priority: a guarantee is the queue's share against the others, whatever the priorities of
the borrowers' tasks (Volcano's reclaim action, YARN's preemption between queues). Inside a queue
priority decides, and the unit's own queue's floor is there only for one case: a swap by priority
(a CPU task evicting a GPU task of its own queue) must not take the queue from its floor to below
it while another queue borrows, or it would reclaim from the borrower, whose higher-priority
tasks would then preempt it back, round after round. With none borrowing there is nothing to
reclaim, and the swap goes by priority (the shard's Pricer, scheduler_shard/preemption.py).
"""

import math
from collections.abc import Sequence

from gosched.common.config import QueueConfig
from gosched.common.messages import QueueFloor

EPS = 1e-9
NOT_ELIGIBLE = float("inf")
# The entitlement of a queue without a guarantee when the guarantees promise the whole cluster.
MIN_ENTITLEMENT = 1e-3


class CapacityPlanner:
    __slots__ = ("capped", "entitled", "guarantees", "max_shares", "names", "shares_matter")

    def __init__(self, queues: Sequence[QueueConfig]) -> None:
        self.names = [q.name for q in queues]
        self.guarantees = [q.guarantee for q in queues]
        self.max_shares = [q.max_share for q in queues]
        # Queues whose every unit must be checked against max_share (fits() is always true for 1).
        self.capped = [m < 1.0 for m in self.max_shares]
        # Whether a queue's share can change the dispatcher's answers: a lone queue with neither a
        # cap nor a guarantee keeps the same rank and never reclaims, whatever its share.
        self.shares_matter = len(queues) > 1 or any(self.capped) or any(g > 0 for g in self.guarantees)
        unpromised = max(0.0, 1.0 - sum(self.guarantees))
        n_without = sum(1 for g in self.guarantees if g <= 0)
        equal_part = max(unpromised / n_without, MIN_ENTITLEMENT) if n_without else MIN_ENTITLEMENT
        # What each queue's borrowing is measured against (module docstring).
        self.entitled = [g if g > 0 else equal_part for g in self.guarantees]

    def rank(self, i: int, share: float) -> float:
        """Order key of queue i at `share` (smaller first); NOT_ELIGIBLE when it may not take more.

        Keys below -1 are queues under their guarantee (share/guarantee - 2), the rest borrow
        (share/entitlement, at least 0).
        """
        g = self.guarantees[i]
        if share < g - EPS:
            return share / g - 2.0
        if self.max_shares[i] >= 1.0 or share < self.max_shares[i] - EPS:
            return share / self.entitled[i]
        return NOT_ELIGIBLE

    def borrow_rank(self, i: int, share: float) -> float:
        """rank() of a borrowing queue, its max_share aside: the order of a queue at its cap whose
        head may shed the queue's own tasks to get within it (dispatcher/shedding.py)."""
        return share / self.entitled[i]

    def below_guarantee(self, i: int, share: float) -> bool:
        return share < self.guarantees[i] - EPS

    def fits(self, i: int, share_after: float) -> bool:
        """May queue i reach `share_after`?"""
        m = self.max_shares[i]
        return m >= 1.0 or share_after <= m + EPS

    def may_reclaim(self, i: int, share: float, share_after: float) -> bool:
        """A unit of queue i reclaims only to give its guarantee back: below it now, and within it
        with the unit (one that would borrow anyway uses free room and priority, as borrowers do)."""
        g = self.guarantees[i]
        return share < g - EPS and share_after <= g + EPS

    def floors(self, capacity: tuple[int, int, int]) -> list[tuple[QueueFloor, ...]]:
        """Per queue i: the floors of the queues with a guarantee (module docstring), its own
        included: a unit may not swap its own queue from its floor to below it while another
        queue borrows either."""
        if not any(capacity):
            return [() for _ in self.names]
        floors = tuple(
            floor_of(n, g, capacity) for n, g in zip(self.names, self.guarantees, strict=True) if g > 0
        )
        return [floors for _ in self.names]

    def borrowing(self, shares: Sequence[float]) -> frozenset[str]:
        """Queues above their guarantee: their preemptible tasks may be reclaimed."""
        return frozenset(
            n for n, s, g in zip(self.names, shares, self.guarantees, strict=True) if s > g + EPS
        )


def floor_of(name: str, guarantee: float, capacity: tuple[int, int, int]) -> QueueFloor:
    """The usage at which the queue's dominant share reaches `guarantee` (None where the cluster
    has none of a resource: it counts in no share)."""
    cpu, memory, gpu = (math.ceil(guarantee * c - EPS) if c else None for c in capacity)
    return QueueFloor(name, cpu, memory, gpu)
