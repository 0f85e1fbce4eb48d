"""`gosched replay`: the FGD paper's "fill until full" experiment on the openb GPU trace.

GPU nodes only; tasks shuffled with a seed, then random copies appended until the GPU demand that
has arrived reaches 130% of the cluster's GPUs; tasks placed one at a time by a real scheduler shard
(the policy is its score chain), never leaving, never retried. The metric is the GPU allocation
ratio, allocated milli-GPU / (cluster GPUs x 1000), at each level of arrived demand.
"""

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gosched.bench.trace import TraceTask
from gosched.common.cluster_state import Resident
from gosched.common.config import PluginWeight, ProfileConfig
from gosched.common.messages import AcceptedUnit, BindReply, NodeUpserted, TaskBound, Unit, UnitBatch
from gosched.common.node import Node
from gosched.common.resources import GPU_MILLI
from gosched.scheduler_shard.shard import SchedulerShard

LEVELS = (0.5, 0.7, 0.9, 1.0, 1.1, 1.3)

# Each policy is a score chain; the filters are the fit checks every policy shares.
POLICIES: dict[str, list[PluginWeight]] = {
    "random": [PluginWeight(name="random")],
    "dot_product": [PluginWeight(name="dot_product")],
    "gpu_clustering": [PluginWeight(name="gpu_clustering")],
    "gpu_packing": [PluginWeight(name="gpu_packing")],
    "best_fit": [PluginWeight(name="best_fit")],
    # FGD as the paper runs it: the fragmentation gradient alone, ties broken at random (as
    # kube-scheduler picks among equal scores). Its task types are learned as ours are; told the
    # trace's whole distribution up front instead, as the paper assumes, it scored lower (docs/).
    "fgd": [PluginWeight(name="gpu_fragmentation"), PluginWeight(name="random", weight=1e-6)],
    # Ours: the fragmentation gradient over learned (GPU, CPU, memory) task types, CPU-only tasks
    # included; a light pull toward GPUs and nodes already in use (gpu_packing: +0.23 points at
    # 100% on seeds 0-9, every seed higher); best fit then balanced allocation break ties.
    "gosched_frag": [
        PluginWeight(name="gpu_fragmentation", weight=1.0),
        PluginWeight(name="gpu_packing", weight=0.05),
        PluginWeight(name="best_fit", weight=0.001),
        PluginWeight(name="balanced_allocation", weight=0.0005),
    ],
}

# Published means at 100% arrived demand (FGD, USENIX ATC'23, default openb workload).
PUBLISHED_AT_100 = {
    "random": 0.863,
    "dot_product": 0.906,
    "gpu_clustering": 0.917,
    "gpu_packing": 0.918,
    "best_fit": 0.929,
    "fgd (paper)": 0.952,
}


def arrival_order(
    tasks: Sequence[TraceTask], total_gpu_milli: int, seed: int, target: float = 1.3
) -> list[TraceTask]:
    """The trace shuffled by `seed`, then random copies until arrived GPU demand reaches `target`."""
    rng = random.Random(seed)
    order = list(tasks)
    rng.shuffle(order)
    demand = sum(t.gpu_demand for t in order)
    while demand < target * total_gpu_milli:
        extra = rng.choice(tasks)
        order.append(extra)
        demand += extra.gpu_demand
    return order


def policy_profile(policy: str) -> ProfileConfig:
    return ProfileConfig(
        name=policy,
        locating=[],
        grouping=[],
        filters=["node_ready", "resources_fit"],
        scores=POLICIES[policy],
        victim_searching=[],
        candidate_sorting=[],
        preemption=False,
    )


def replay_once(
    nodes: Sequence[Node], order: Sequence[TraceTask], policy: str, levels: Sequence[float] = LEVELS
) -> dict[float, float]:
    """Place `order` one task at a time; the allocation ratio when arrived demand reaches each level."""
    shard = SchedulerShard(0, policy_profile(policy), clock=lambda: 0.0)
    shard.sync([NodeUpserted(n) for n in nodes], version=1)
    state = shard.state
    total = int(state.gpu_count[: state.n].sum()) * GPU_MILLI
    out: dict[float, float] = {}
    pending_levels = sorted(levels)
    arrived = 0
    version = 1
    for i, task in enumerate(order):
        job = task.job(f"t{i}")
        batch = shard.schedule(UnitBatch(0, [Unit(job, (0,), 1)]))
        if batch.proposals:
            (placement,) = batch.proposals[0].placements
            version += 1
            bound = TaskBound(placement.node, Resident.for_task(job, 0, placement.gpus, 0.0))
            accepted = AcceptedUnit.of(job.id, 0, [placement], 0.0)
            shard.apply_reply(BindReply([accepted], [], [], [bound], version))
        arrived += task.gpu_demand
        while pending_levels and arrived >= pending_levels[0] * total:
            out[pending_levels.pop(0)] = allocation_ratio(shard)
    for level in pending_levels:  # the workload ended below this level
        out[level] = allocation_ratio(shard)
    return out


def allocation_ratio(shard: SchedulerShard) -> float:
    """Allocated milli-GPU over the cluster's GPUs x 1000."""
    state = shard.state
    total = int(state.gpu_count[: state.n].sum()) * GPU_MILLI
    return float(state.gpu_used_total[: state.n].sum()) / total if total else 0.0


@dataclass(slots=True)
class PolicyResult:
    policy: str
    by_level: dict[float, list[float]]  # level -> ratio per seed

    def mean(self, level: float) -> float:
        return statistics.fmean(self.by_level[level])

    def spread(self, level: float) -> tuple[float, float]:
        return min(self.by_level[level]), max(self.by_level[level])


def run_replay(
    nodes: Sequence[Node],
    tasks: Sequence[TraceTask],
    policies: Sequence[str],
    seeds: Sequence[int],
    progress: Callable[[str], None] | None = None,
) -> list[PolicyResult]:
    total = sum(len(n.gpus) for n in nodes) * GPU_MILLI
    orders = {seed: arrival_order(tasks, total, seed) for seed in seeds}
    results = []
    for policy in policies:
        by_level: dict[float, list[float]] = {level: [] for level in LEVELS}
        for seed in seeds:
            for level, ratio in replay_once(nodes, orders[seed], policy).items():
                by_level[level].append(ratio)
            if progress:
                progress(f"{policy} seed {seed}")
        results.append(PolicyResult(policy, by_level))
    return results


def table(results: Sequence[PolicyResult]) -> str:
    """One line per policy: the mean and [min-max] over seeds at each level, in aligned columns."""
    rows = [["policy", *(f"{int(level * 100)}%" for level in LEVELS)]]
    for r in results:
        cells = [r.policy]
        for level in LEVELS:
            lo, hi = r.spread(level)
            cells.append(f"{r.mean(level):.1%} [{lo:.1%}-{hi:.1%}]")
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(row: list[str]) -> str:
        first = row[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True))])

    return "\n".join(line(row) for row in rows)
