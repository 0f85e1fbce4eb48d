"""Set up a real SchedulerShard view from nodes and already-running tasks, and run units on it."""

from collections.abc import Sequence

from gosched.common.cluster_state import Resident
from gosched.common.config import PluginWeight, ProfileConfig
from gosched.common.job import Job
from gosched.common.messages import NodeUpserted, ProposalBatch, TaskBound, Unit, UnitBatch
from gosched.common.node import Node
from gosched.scheduler_shard.shard import SchedulerShard


def shard_with(
    nodes: Sequence[Node],
    running: Sequence[tuple[Job, int, str, tuple[tuple[int, int], ...]]] = (),
    profile: ProfileConfig | None = None,
    start_times: dict[str, float] | None = None,
) -> SchedulerShard:
    """A shard whose view holds `nodes` and the tasks in `running` as (job, index, node, gpus)."""
    shard = SchedulerShard(0, profile or ProfileConfig(), clock=lambda: 1000.0)
    changes: list = [NodeUpserted(n) for n in nodes]
    for job, index, node, gpus in running:
        t = (start_times or {}).get(job.id, 0.0)
        changes.append(TaskBound(node, Resident.for_task(job, index, gpus, t)))
    shard.sync(changes, version=len(changes))
    return shard


def run_units(
    shard: SchedulerShard, jobs: Sequence[Job], reclaim: frozenset[str] = frozenset()
) -> ProposalBatch:
    units = [Unit(j, tuple(range(j.total_replicas)), j.min_member, reclaim_from=reclaim) for j in jobs]
    return shard.schedule(UnitBatch(0, units))


def profile_with_scores(*names: str) -> ProfileConfig:
    return ProfileConfig(scores=[PluginWeight(name=n) for n in names])
