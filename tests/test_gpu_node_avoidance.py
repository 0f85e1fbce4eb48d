"""gpu_node_avoidance: tasks that want no GPU stay off GPU nodes while other nodes fit them.

Each scenario runs on the default profile and on the default profile without the plugin (the old
behaviour): bin-packing alone takes a CPU-only task to the fuller GPU node.
"""

from dataclasses import dataclass, field

import numpy as np
import pytest

from gosched.common.cluster_state import ClusterArrays
from gosched.common.config import DEFAULT_SCORES, PluginWeight, ProfileConfig
from gosched.common.job import Job
from gosched.common.messages import NodeUpserted
from gosched.common.node import Node
from gosched.scheduler_shard.framework import registry
from gosched.scheduler_shard.framework.interfaces import ScorePlugin
from gosched.scheduler_shard.framework.profile import build_profile
from gosched.scheduler_shard.framework.task_class import class_of
from gosched.scheduler_shard.plugins.gpu_node_avoidance import GpuNodeAvoidance
from tests.builders import make_job, make_node
from tests.shard_helpers import run_units, shard_with

NAME = "gpu_node_avoidance"
DEFAULT = ProfileConfig()
WITHOUT = ProfileConfig(scores=[s for s in DEFAULT_SCORES if s.name != NAME])

Running = tuple[Job, int, str, tuple[tuple[int, int], ...]]


def _gpu_job(job_id: str, cpu: str, mem: str, gpus: int = 0, share: int = 0) -> Job:
    b = make_job(job_id).cpu(cpu).mem(mem)
    if gpus:
        b = b.gpus(gpus)
    if share:
        b = b.gpu_share(share)
    return b.build()


def _on(node: str, job: Job, *gpus: int, milli: int = 1000) -> Running:
    return (job, 0, node, tuple((g, milli) for g in gpus))


CPU_TASK = make_job("t").cpu("2").mem("8Gi").build()


@dataclass
class Case:
    name: str
    nodes: list[Node]
    job: Job
    expect: str  # where the default profile puts the task
    expect_without: str  # where it went before the plugin (the profile without it)
    running: list[Running] = field(default_factory=list)


CASES = [
    Case(
        "a CPU-only task takes the node without GPUs when both fit",
        [make_node("gpu").gpus(8).build(), make_node("cpu").build()],
        CPU_TASK,
        "cpu",
        "gpu",  # bin-pack: the GPU node is fuller
        [_on("gpu", _gpu_job("train", "16", "64Gi", gpus=2), 0, 1)],
    ),
    Case(
        "it does so against the strongest bin-pack pull: a nearly full 1-GPU node",
        [make_node("gpu").gpus(1).build(), make_node("cpu").build()],
        CPU_TASK,
        "cpu",
        "gpu",
        [_on("gpu", _gpu_job("train", "29", "118Gi", gpus=1), 0)],
    ),
    Case(
        "a GPU node whose GPUs are all in use is still avoided",
        [make_node("gpu").gpus(2).build(), make_node("cpu").build()],
        CPU_TASK,
        "cpu",
        "gpu",
        [_on("gpu", _gpu_job("train", "16", "64Gi", gpus=2), 0, 1)],
    ),
    Case(
        "a CPU-only task without a memory request is avoided too",
        [make_node("gpu").gpus(4).build(), make_node("cpu").build()],
        make_job("t").cpu("2").build(),
        "cpu",
        "gpu",
        [_on("gpu", _gpu_job("train", "16", "64Gi", gpus=1), 0)],
    ),
    Case(
        "a preference, not a filter: the GPU node when only it fits",
        [make_node("gpu").gpus(8).build(), make_node("cpu").cpu("1").build()],
        CPU_TASK,
        "gpu",
        "gpu",
        [_on("gpu", _gpu_job("train", "16", "64Gi", gpus=2), 0, 1)],
    ),
    Case(
        "with only GPU nodes fitting, the one with the fewest GPUs",
        [make_node("g8").gpus(8).build(), make_node("g1").gpus(1).build(), make_node("cpu").cpu("1").build()],
        CPU_TASK,
        "g1",
        "g8",
        [_on("g8", _gpu_job("train", "16", "64Gi", gpus=2), 0, 1)],
    ),
    Case(
        "a whole-GPU task is unaffected",
        [make_node("g8").gpus(8).build(), make_node("g1").gpus(1).build(), make_node("cpu").build()],
        _gpu_job("t", "2", "8Gi", gpus=1),
        "g8",
        "g8",
        [_on("g8", _gpu_job("train", "16", "64Gi", gpus=2), 0, 1)],
    ),
    Case(
        "a GPU-share task is unaffected",
        [make_node("g1").gpus(1).build(), make_node("g8").gpus(8).build(), make_node("cpu").build()],
        _gpu_job("t", "2", "8Gi", share=500),
        "g8",
        "g8",
        [_on("g8", _gpu_job("infer", "16", "64Gi", share=500), 0, milli=500)],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("with_plugin", [True, False], ids=["default", "without-plugin"])
def test_cpu_only_tasks_avoid_gpu_nodes(case: Case, with_plugin: bool) -> None:
    shard = shard_with(case.nodes, case.running, DEFAULT if with_plugin else WITHOUT)
    out = run_units(shard, [case.job])
    assert out.unschedulable == []
    (proposal,) = out.proposals
    (placement,) = proposal.placements
    assert placement.node == (case.expect if with_plugin else case.expect_without)


def test_the_default_profile_weights_it_above_bin_packing() -> None:
    weights = {s.name: s.weight for s in DEFAULT_SCORES}
    assert NAME in weights
    assert [p.name for p, _ in build_profile(DEFAULT).scores].count(NAME) == 1
    # A node without GPUs scores 100, a 1-GPU node 50: the weighted gap must exceed the most that
    # most_allocated plus balanced_allocation, weight 1 each, can differ by for a CPU-only task:
    # together they score 100 + 100 * min(cpu, memory fraction), so by at most 100.
    assert weights["most_allocated"] == weights["balanced_allocation"] == 1.0
    assert weights[NAME] * (100.0 - 50.0) > 100.0


def test_a_weight_of_zero_turns_it_off() -> None:
    nodes, running = CASES[0].nodes, CASES[0].running
    scores = [PluginWeight(name=s.name, weight=0.0 if s.name == NAME else s.weight) for s in DEFAULT_SCORES]
    shard = shard_with(nodes, running, ProfileConfig(scores=scores))
    assert run_units(shard, [CPU_TASK]).proposals[0].placements[0].node == "gpu"


def test_a_node_that_gains_gpus_is_avoided_from_then_on() -> None:
    """The score is static (node metadata), cached per view and metadata generation: a node
    re-registered with GPUs is rescored."""
    a, b = make_node("a").build(), make_node("b").build()
    shard = shard_with([a, b], [], DEFAULT)
    assert run_units(shard, [make_job("t1").cpu("1").build()]).proposals[0].placements[0].node == "a"
    shard.inflight.clear()  # answered (rejected): nothing of it stays assumed
    shard.sync([NodeUpserted(make_node("a").gpus(4).build())], 100)
    assert run_units(shard, [make_job("t2").cpu("1").build()]).proposals[0].placements[0].node == "b"


# -- the plugin itself ---------------------------------------------------------------------------------
def _state(*nodes: Node) -> ClusterArrays:
    state = ClusterArrays()
    for n in nodes:
        state.upsert_node(n)
    return state


def test_registered_by_name_as_a_static_score() -> None:
    plugin = registry.create(NAME, ScorePlugin)
    assert isinstance(plugin, GpuNodeAvoidance)
    assert plugin.dynamic is False  # scored once per class and metadata generation, not per placement


def test_scores_nodes_by_their_gpu_count() -> None:
    state = _state(*(make_node(f"g{k}").gpus(k).build() for k in (0, 1, 2, 4, 8)))
    plugin = GpuNodeAvoidance()
    cpu = class_of(CPU_TASK.groups[0])
    assert plugin.relevant(cpu, state)
    assert plugin.score(cpu, state, slice(0, state.n)).tolist() == [100.0, 50.0, 25.0, 12.5, 6.25]
    assert plugin.score(cpu, state, np.array([4, 0])).tolist() == [6.25, 100.0]


@pytest.mark.parametrize(
    "job", [_gpu_job("w", "2", "8Gi", gpus=2), _gpu_job("s", "2", "8Gi", share=300)], ids=["whole", "share"]
)
def test_a_gpu_task_gets_a_constant(job: Job) -> None:
    state = _state(make_node("cpu").build(), make_node("g1").gpus(1).build(), make_node("g8").gpus(8).build())
    plugin = GpuNodeAvoidance()
    tc = class_of(job.groups[0])
    assert not plugin.relevant(tc, state)
    scores = plugin.score(tc, state, slice(0, state.n))
    assert len(set(scores.tolist())) == 1


@pytest.mark.parametrize(
    "nodes",
    [
        [make_node("a").build(), make_node("b").build()],  # no GPU node: the benchmark's cluster
        [make_node("a").gpus(8).build(), make_node("b").gpus(8).build()],  # one GPU size only
    ],
    ids=["no-gpu-nodes", "same-gpu-nodes"],
)
def test_not_relevant_where_every_node_scores_alike(nodes: list[Node]) -> None:
    state = _state(*nodes)
    assert not GpuNodeAvoidance().relevant(class_of(CPU_TASK.groups[0]), state)


def test_a_removed_node_does_not_make_it_relevant() -> None:
    state = _state(make_node("a").gpus(8).build(), make_node("b").gpus(8).build(), make_node("c").build())
    plugin = GpuNodeAvoidance()
    cpu = class_of(CPU_TASK.groups[0])
    assert plugin.relevant(cpu, state)
    state.remove_node("c")  # a tombstone row: no GPUs, but not a node
    assert not plugin.relevant(cpu, state)


def test_the_scores_are_computed_once_per_metadata_generation() -> None:
    state = _state(make_node("a").gpus(8).build(), make_node("b").build())
    plugin = GpuNodeAvoidance()
    cpu = class_of(CPU_TASK.groups[0])
    first = plugin.score(cpu, state, slice(0, state.n))
    other = class_of(make_job("o").cpu("3").build().groups[0])
    assert np.shares_memory(first, plugin.score(other, state, slice(0, state.n)))  # shared by classes
    state.upsert_node(make_node("b").gpus(2).build())
    assert plugin.score(cpu, state, slice(0, state.n)).tolist() == [6.25, 25.0]
