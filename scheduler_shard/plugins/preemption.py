"""Preemption plugins: who may be evicted (victim searching) and which node's victims to take.

priority_victims: preemptible tasks of lower priority, not for a gang's tasks past its min_member
(`ForStarvingJobs`). capacity_reclaim: preemptible tasks of a queue that borrows beyond its
guarantee, when the preemptor's queue reclaims (the dispatcher says which queues in
Unit.reclaim_from), whatever their priority, for any task of the unit. Either way a task of another
queue is a victim only while its queue stays at or above its guarantee floor (see `quota_of`;
checked per victim set in scheduler_shard/preemption.py). lexicographic: fewest-harm order.
"""

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from gosched.common.cluster_state import ClusterArrays, Resident
from gosched.common.messages import Floor, QueueFloor, Unit
from gosched.scheduler_shard.framework.interfaces import (
    Candidate,
    CandidateSortingPlugin,
    Mask,
    VictimSearchingPlugin,
)
from gosched.scheduler_shard.framework.registry import register


class Quota(NamedTuple):
    """A unit's cross-queue rules: the queues it may reclaim from, and each guaranteed queue's
    floor (its usage must stay at or above the floor in some resource)."""

    reclaim: frozenset[str]
    floors: dict[str, Floor]


@lru_cache(maxsize=256)
def _quota(reclaim: frozenset[str], floors: tuple[QueueFloor, ...]) -> Quota:
    return Quota(reclaim, {f.queue: (f.cpu_milli, f.memory, f.gpu_milli) for f in floors})


def quota_of(unit: Unit) -> Quota:
    """The unit's reclaim_from and floors (cached: the units of a round share them)."""
    return _quota(unit.reclaim_from, unit.floors)


class ForStarvingJobs:
    """Marks a VictimSearching plugin whose victims serve no gang (min_member above 1) past its
    minimum: the tasks of an elastic gang past it take free room only (Volcano's gang rule for its
    preempt action; a job of min_member 1 is no gang, and each of its tasks may preempt).
    Capacity reclaim is no such plugin: a queue below its guarantee takes room back for any of its
    tasks (Volcano's reclaim action asks no job whether it starves)."""


@register
class PriorityVictims(VictimSearchingPlugin, ForStarvingJobs):
    name = "priority_victims"

    def eligible(self, unit: Unit, victim: Resident) -> bool:
        job = unit.job
        # victim.priority <= defends_with: min_victim_priority below stays a valid bound.
        if not victim.preemptible or victim.job_id == job.id:
            return False
        return victim.defends_with(job.queue) < job.priority

    def rows_with_victims(self, unit: Unit, state: ClusterArrays) -> Mask | None:
        return state.min_victim_priority[: state.n] < unit.job.priority


@register
class CapacityReclaim(VictimSearchingPlugin):
    name = "capacity_reclaim"

    def eligible(self, unit: Unit, victim: Resident) -> bool:
        return (
            victim.preemptible and victim.queue != unit.job.queue and victim.queue in quota_of(unit).reclaim
        )

    def rows_with_victims(self, unit: Unit, state: ClusterArrays) -> Mask | None:
        if not quota_of(unit).reclaim:
            return np.zeros(state.n, np.bool_)
        return None


@register
class Lexicographic(CandidateSortingPlugin):
    """No victims first, then the lowest highest-victim priority, the lowest priority sum, the
    fewest victims, the shard's own partition, and the latest earliest start among the victims
    (evict young work). Sum and count take in the tasks of the gangs the eviction breaks (`lost`),
    which go with it."""

    name = "lexicographic"

    def sort(self, candidates: list[Candidate]) -> list[Candidate]:
        return sorted(candidates, key=_harm)


@dataclass(slots=True)
class PricedCandidate(Candidate):
    """A candidate with what its eviction takes in all: tasks, and their priorities summed (the
    victims, and every bound task of a gang the victims leave below its min_member)."""

    lost: int = 0
    lost_priority: int = 0


def _harm(c: Candidate) -> tuple[bool, int, int, int, bool, float, int]:
    if isinstance(c, PricedCandidate):
        lost, lost_priority = c.lost, c.lost_priority
    else:
        lost, lost_priority = len(c.victims), c.priority_sum
    return (bool(c.victims), c.max_priority, lost_priority, lost, c.remote, -c.earliest_start, c.row)
