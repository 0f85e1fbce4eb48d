"""Preemption plugins: who may be evicted (victim searching) and which node's victims to take.

priority_victims: preemptible tasks of lower priority. capacity_reclaim: preemptible tasks of a
queue that borrows beyond its guarantee, when the preemptor's queue reclaims (the dispatcher says
which queues in Unit.reclaim_from), whatever their priority. lexicographic: fewest-harm order.
"""

import numpy as np

from gosched.common.cluster_state import ClusterArrays, Resident
from gosched.common.messages import Unit
from gosched.scheduler_shard.framework.interfaces import (
    Candidate,
    CandidateSortingPlugin,
    Mask,
    VictimSearchingPlugin,
)
from gosched.scheduler_shard.framework.registry import register


@register
class PriorityVictims(VictimSearchingPlugin):
    name = "priority_victims"

    def eligible(self, unit: Unit, victim: Resident) -> bool:
        return victim.preemptible and victim.priority < unit.job.priority and victim.job_id != unit.job.id

    def rows_with_victims(self, unit: Unit, state: ClusterArrays) -> Mask | None:
        return state.min_victim_priority[: state.n] < unit.job.priority


@register
class CapacityReclaim(VictimSearchingPlugin):
    name = "capacity_reclaim"

    def eligible(self, unit: Unit, victim: Resident) -> bool:
        return victim.preemptible and victim.queue in unit.reclaim_from and victim.queue != unit.job.queue

    def rows_with_victims(self, unit: Unit, state: ClusterArrays) -> Mask | None:
        if not unit.reclaim_from:
            return np.zeros(state.n, np.bool_)
        return None


@register
class Lexicographic(CandidateSortingPlugin):
    """No victims first, then the lowest highest-victim priority, the lowest priority sum, the
    fewest victims, and the latest earliest start among the victims (evict young work)."""

    name = "lexicographic"

    def sort(self, candidates: list[Candidate]) -> list[Candidate]:
        return sorted(
            candidates,
            key=lambda c: (
                bool(c.victims),
                c.max_priority,
                c.priority_sum,
                len(c.victims),
                -c.earliest_start,
                c.row,
            ),
        )
