"""A shard leaves its own partition when its pick there breaks a soft rule a node elsewhere keeps.

Soft rules are the score plugins marked `soft_rule` (gpu_node_avoidance for tasks that want no GPU,
preferred_affinity, taint_prefer_no_schedule). The own partition still comes first whenever it
keeps the rule as well as the rest of the cluster can (nothing preferred, the preferred nodes
elsewhere full, or preferred nodes in the own partition), and packing never pulls a task out of it.

Each case runs one shard of several: its partition is set, the other nodes are the other shards'.
The last test runs two shards between the dispatcher and the binder (runtime.pipeline).
"""

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gosched.common.config import ProfileConfig, Settings
from gosched.common.job import Job
from gosched.common.messages import TaskReleased
from gosched.common.node import Node
from gosched.runtime.pipeline import Pipeline
from tests.builders import make_job, make_node
from tests.shard_helpers import run_units, shard_with

Running = tuple[Job, int, str, tuple[tuple[int, int], ...]]
PACK = {"gosched.io/pack-domain": "rack"}


def _busy(job_id: str, node: str, cpu: str, mem: str = "8Gi") -> Running:
    return (make_job(job_id).cpu(cpu).mem(mem).build(), 0, node, ())


@dataclass
class Case:
    name: str
    nodes: list[Node]
    partition: list[str]
    jobs: list[Job]
    # Per job, the node of each of its placements in task order; None: the job is unschedulable.
    expect: list[list[str] | None]
    running: list[Running] = field(default_factory=list)


CASES = [
    # -- case 1: GPU-node avoidance ---------------------------------------------------------------
    Case(
        "a CPU-only task leaves a GPU-only partition for a free CPU node elsewhere",
        [
            make_node("g0").gpus(4).build(),
            make_node("g1").gpus(4).build(),
            make_node("c0").build(),
            make_node("c1").build(),
        ],
        ["g0", "g1"],
        [make_job("cpu").cpu("2").mem("8Gi").build()],
        [["c0"]],
    ),
    Case(
        "so the GPU job that follows still finds its node's CPU and memory",
        [make_node("g0").gpus(4).build(), make_node("c0").build(), make_node("c1").build()],
        ["g0"],
        [
            make_job("cpu-a").cpu("20").mem("64Gi").build(),
            make_job("cpu-b").cpu("20").mem("64Gi").build(),
            make_job("train").cpu("30").mem("100Gi").gpus(4).build(),
        ],
        [["c0"], ["c1"], ["g0"]],
    ),
    Case(
        "among GPU nodes only, the one with the fewest GPUs elsewhere beats the own 8-GPU node",
        [make_node("g8").gpus(8).build(), make_node("g1").gpus(1).build()],
        ["g8"],
        [make_job("cpu").cpu("2").mem("8Gi").build()],
        [["g1"]],
    ),
    Case(
        "a gang decides per task: its CPU launcher leaves, its GPU workers stay in the partition",
        [
            make_node("g0").gpus(4).build(),
            make_node("g1").gpus(4).build(),
            make_node("c0").build(),
            make_node("g2").gpus(4).build(),
        ],
        ["g0", "g1"],
        [
            make_job("gang")
            .role("worker")
            .cpu("8")
            .mem("32Gi")
            .gpus(4)
            .replicas(2)
            .group("launcher")
            .cpu("1")
            .mem("2Gi")
            .min_member(3)
            .build()
        ],
        [["g0", "g1", "c0"]],
    ),
    Case(
        "a pack-domain gang leaves only within its domain (rack r1), never for a CPU node beyond",
        [
            make_node("g0").gpus(4).label(rack="r1").build(),
            make_node("c9").label(rack="r2").build(),
            make_node("c1").label(rack="r1").build(),
        ],
        ["g0"],
        [make_job("pg").cpu("2").mem("8Gi").replicas(2).min_member(2).labels(**PACK).build()],
        [["c1", "c1"]],
    ),
    # -- case 2: preferred node affinity and PreferNoSchedule taints ------------------------------
    Case(
        "a preferred zone wholly outside the partition wins over the partition's other zone",
        [
            make_node("a0").label(zone="a").build(),
            make_node("a1").label(zone="a").build(),
            make_node("b0").label(zone="b").build(),
            make_node("b1").label(zone="b").build(),
        ],
        ["a0", "a1"],
        [make_job("pref").cpu("1").prefer(100, "zone", "In", "b").build()],
        [["b0"]],
    ),
    Case(
        "the better of two weighted preferences elsewhere beats the lesser one kept at home",
        [
            make_node("a0").label(zone="a", disk="hdd").build(),
            make_node("b0").label(zone="b", disk="ssd").build(),
            make_node("b1").label(zone="b", disk="hdd").build(),
        ],
        ["a0", "b1"],
        [make_job("pref").cpu("1").prefer(10, "zone", "In", "b").prefer(90, "disk", "In", "ssd").build()],
        [["b0"]],
    ),
    Case(
        "PreferNoSchedule on every node of the partition: an untainted node elsewhere",
        [
            make_node("p0").taint("spot", "", "PreferNoSchedule").build(),
            make_node("p1").taint("spot", "", "PreferNoSchedule").build(),
            make_node("q0").build(),
        ],
        ["p0", "p1"],
        [make_job("j").cpu("1").build()],
        [["q0"]],
    ),
    Case(
        "a tolerated PreferNoSchedule taint is no reason to leave",
        [make_node("p0").taint("spot", "", "PreferNoSchedule").build(), make_node("q0").build()],
        ["p0"],
        [make_job("j").cpu("1").tolerate("spot", exists=True).build()],
        [["p0"]],
    ),
    # -- the own partition still comes first ------------------------------------------------------
    Case(
        "control: nothing preferred, the partition's node though a fuller one is elsewhere",
        [make_node(f"n{i}").build() for i in range(4)],
        ["n2", "n3"],
        [make_job("j").cpu("1").mem("2Gi").build()],
        [["n2"]],
        running=[_busy("other", "n0", "16")],
    ),
    Case(
        "control: the own pick keeps the preference; a fuller matching node elsewhere does not pull",
        [
            make_node("a0").label(zone="a").build(),
            make_node("b0").label(zone="b").build(),
            make_node("b1").label(zone="b").build(),
        ],
        ["b1"],
        [make_job("pref").cpu("1").prefer(100, "zone", "In", "b").build()],
        [["b1"]],
        running=[_busy("other", "b0", "16")],
    ),
    Case(
        "control: a CPU node in the partition keeps the rule; fuller CPU nodes elsewhere do not pull",
        [make_node("c0").build(), make_node("g0").gpus(4).build(), make_node("c1").build()],
        ["c1", "g0"],
        [make_job("cpu").cpu("2").mem("8Gi").build()],
        [["c1"]],
        running=[_busy("other", "c0", "16", "64Gi")],
    ),
    Case(
        "control: the partition keeps the preference on some node: the usual weighing decides there",
        # One shard with the whole cluster picks a0 too: packing outweighs a 10-point preference.
        # Leaving would take b0, which keeps the rule no better than the own b1.
        [
            make_node("a0").label(zone="a").build(),
            make_node("b0").label(zone="b").build(),
            make_node("b1").label(zone="b").build(),
        ],
        ["a0", "b1"],
        [
            make_job("pref")
            .cpu("1")
            .mem("2Gi")
            .prefer(10, "zone", "In", "b")
            .prefer(90, "disk", "In", "ssd")
            .build()
        ],
        [["a0"]],
        running=[_busy("other", "a0", "16", "64Gi")],
    ),
    Case(
        "the preferred zone elsewhere is full: the partition's node",
        [
            make_node("a0").label(zone="a").build(),
            make_node("a1").label(zone="a").build(),
            make_node("b0").cpu("4").label(zone="b").build(),
        ],
        ["a0", "a1"],
        [make_job("pref").cpu("1").prefer(100, "zone", "In", "b").build()],
        [["a0"]],
        running=[_busy("other", "b0", "4")],
    ),
    Case(
        "the CPU nodes elsewhere are full: the partition's GPU node",
        [make_node("g0").gpus(4).build(), make_node("c0").cpu("4").build()],
        ["g0"],
        [make_job("cpu").cpu("2").mem("8Gi").build()],
        [["g0"]],
        running=[_busy("other", "c0", "3")],
    ),
    Case(
        "room for two tasks on the preferred node elsewhere: the third stays in the partition",
        [
            make_node("a0").label(zone="a").build(),
            make_node("b0").cpu("2").label(zone="b").build(),
        ],
        ["a0"],
        [make_job(f"p{i}").cpu("1").prefer(100, "zone", "In", "b").build() for i in range(3)],
        [["b0"], ["b0"], ["a0"]],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_partition_soft_rules(case: Case) -> None:
    shard = shard_with(case.nodes, case.running, ProfileConfig())
    shard.set_partition(case.partition)
    out = run_units(shard, case.jobs)
    placed = {
        p.job.id: [pl.node for pl in sorted(p.placements, key=lambda pl: pl.task_index)]
        for p in out.proposals
    }
    got = [placed.get(job.id) for job in case.jobs]
    assert got == case.expect
    assert {u.job_id for u in out.unschedulable} == {
        j.id for j, e in zip(case.jobs, case.expect, strict=True) if e is None
    }


def test_without_a_partition_nothing_changes() -> None:
    # One shard (no partition): the same cluster-wide best node as before, preference or not.
    nodes = [make_node("a0").label(zone="a").build(), make_node("b0").label(zone="b").build()]
    out = run_units(shard_with(nodes), [make_job("pref").cpu("1").prefer(100, "zone", "In", "b").build()])
    assert out.proposals[0].placements[0].node == "b0"


@pytest.mark.parametrize("one_row", [False, True], ids=["vector-refresh", "one-row-refresh"])
def test_the_verdict_that_nothing_better_fits_is_forgotten_when_room_frees_elsewhere(one_row: bool) -> None:
    # The preferred node elsewhere is full: the task stays home, and the class remembers that no
    # better node fits. Once the other task's room is released, the next task goes there again.
    nodes = [make_node("a0").label(zone="a").build(), make_node("b0").cpu("2").label(zone="b").build()]
    shard = shard_with(nodes, [_busy("other", "b0", "2")])
    shard.set_partition(["a0"])
    pref = make_job("p0").cpu("1").prefer(100, "zone", "In", "b").build()
    assert run_units(shard, [pref]).proposals[0].placements[0].node == "a0"
    group = pref.groups[0]
    assert shard.cache.entries[group.constraint_key()].soft_none_key is not None  # remembered
    if one_row:  # refresh now (a0, placed on): the release is then the one row of the next refresh
        shard.cache.entry(group, shard.state)
    shard.sync([TaskReleased("other/0", "succeeded")], shard.version + 1)
    pref1 = make_job("p1").cpu("1").prefer(100, "zone", "In", "b").build()
    assert run_units(shard, [pref1]).proposals[0].placements[0].node == "b0"


def test_two_shards_through_the_pipeline_keep_cpu_tasks_off_the_gpu_nodes(tmp_path: Path) -> None:
    # Dispatcher, two shards and the binder: the partitioner gives shard 1 the GPU node g1 alone.
    # Its CPU tasks took g1's CPU and memory, and the second 4-GPU job then fitted nowhere.
    nodes = [make_node("g0").gpus(4).build(), make_node("g1").gpus(4).build(), make_node("c0").build()]
    settings = Settings(store_path=str(tmp_path / "gs.db"), retry_backoff_s=0.0, shards=2)
    p = Pipeline(settings, nodes=nodes)
    assert [p.dispatcher.partitions.partition_of(s) for s in range(2)] == [["c0", "g0"], ["g1"]]
    p.submit_many([make_job(f"cpu{i}").cpu("4").mem("8Gi").build() for i in range(6)])
    p.run_until_idle()
    p.submit_many([make_job(f"train{i}").cpu("32").mem("128Gi").gpus(4).build() for i in range(2)])
    p.run_until_idle()
    state = p.binder.state
    where = {task: state.nodes[row].name for task, row in state.task_row.items()}
    assert {where.get(f"cpu{i}/0") for i in range(6)} == {"c0"}
    assert {where.get("train0/0"), where.get("train1/0")} == {"g0", "g1"}
