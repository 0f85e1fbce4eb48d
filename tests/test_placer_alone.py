"""The placer's shortcut for a one-task unit (Placer._place_alone) proposes what its full path
would: the same nodes, in the same order, for any mix of requests, priorities and full nodes."""

from hypothesis import given, settings
from hypothesis import strategies as st

from gosched.common.job import Job
from gosched.common.messages import ProposalBatch
from gosched.common.node import Node
from gosched.scheduler_shard.shard import SchedulerShard
from tests.builders import make_job, make_node
from tests.shard_helpers import run_units, shard_with


def _full_path_only(shard: SchedulerShard) -> SchedulerShard:
    # The shortcut declines (as it does for any unit it cannot judge): the full path places all.
    shard.placer._place_alone = lambda ctx, state: False  # type: ignore[method-assign]
    return shard


def _placements(batch: ProposalBatch) -> list[tuple[str, int, str, tuple[str, ...]]]:
    return [(p.job.id, pl.task_index, pl.node, pl.victims) for p in batch.proposals for pl in p.placements]


node_sizes = st.lists(st.sampled_from(["1", "2", "4", "8"]), min_size=1, max_size=6)
job_specs = st.lists(
    st.tuples(st.sampled_from(["500m", "1", "2", "3"]), st.sampled_from([0, 10, 100]), st.integers(1, 2)),
    min_size=1,
    max_size=12,
)


def _cluster(sizes: list[str]) -> list[Node]:
    return [make_node(f"n{i}").cpu(size).mem("16Gi").build() for i, size in enumerate(sizes)]


def _jobs(specs: list[tuple[str, int, int]], prefix: str) -> list[Job]:
    return [
        make_job(f"{prefix}{i}").cpu(cpu).mem("1Gi").priority(priority).replicas(replicas).build()
        for i, (cpu, priority, replicas) in enumerate(specs)
    ]


@settings(max_examples=60, deadline=None)
@given(sizes=node_sizes, first=job_specs, second=job_specs)
def test_the_one_task_shortcut_proposes_what_the_full_path_does(
    sizes: list[str], first: list[tuple[str, int, int]], second: list[tuple[str, int, int]]
) -> None:
    # Two batches: the second meets nodes the first filled (its placements stay assumed in the
    # view), and higher priorities preempt through the full path, which the shortcut leaves it.
    nodes = _cluster(sizes)
    fast, full = shard_with(nodes), _full_path_only(shard_with(nodes))
    for specs, prefix in ((first, "a"), (second, "b")):
        jobs = _jobs(specs, prefix)
        got, want = run_units(fast, jobs), run_units(full, jobs)
        assert _placements(got) == _placements(want)
        assert [(u.job_id, u.task_indexes) for u in got.unschedulable] == [
            (u.job_id, u.task_indexes) for u in want.unschedulable
        ]
