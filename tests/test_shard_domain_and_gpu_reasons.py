"""A pack-domain gang placed in parts stays in its domain; "why pending" names the real cause for
pack domains (a missing label, the domain the gang is pinned to) and for GPU model and memory
found on different GPUs of a node."""

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gosched.common.config import ProfileConfig, Settings
from gosched.common.job import Job
from gosched.common.messages import Unit, UnitBatch
from gosched.common.node import Node
from gosched.runtime.pipeline import Pipeline
from tests.builders import make_job, make_node, zone_node
from tests.shard_helpers import shard_with

PACK = "gosched.io/pack-domain"
PINNED_TO_A = "outside zone=a, where the job's bound tasks are (waiting for room there)"


def _gang(replicas: int, min_member: int, key: str = "zone") -> Job:
    return make_job("g").cpu("1").replicas(replicas).min_member(min_member).labels(**{PACK: key}).build()


def _zone(name: str, zone: str | None, cpu: str = "1") -> Node:
    return zone_node(name, zone, cpu)


@dataclass
class DomainCase:
    name: str
    nodes: list[Node]
    bound: dict[int, str]  # the gang's tasks already bound: index -> node
    expect_node: str | None  # where the unit's one task goes; None: it waits
    ruled_out: dict[str, int] = field(default_factory=dict)  # when it waits


# Zone b always has the most free CPU, so ranking domains by free room alone would pick it.
DOMAIN_CASES = [
    DomainCase(
        "the rest of a partly bound gang joins its zone",
        [
            _zone("a1", "a"),
            _zone("a2", "a"),
            _zone("a3", "a", "2"),
            _zone("b1", "b", "8"),
            _zone("b2", "b", "8"),
        ],
        {0: "a1", 1: "a2", 2: "a3"},
        "a3",
    ),
    DomainCase(
        "the rest of a partly bound gang waits when its zone is full",
        [_zone("a1", "a"), _zone("a2", "a"), _zone("a3", "a"), _zone("b1", "b", "8"), _zone("b2", "b", "8")],
        {0: "a1", 1: "a2", 2: "a3"},
        None,
        {"insufficient cpu": 3, PINNED_TO_A: 2},
    ),
    DomainCase(
        "a gang already split goes to the zone holding most of it",
        [_zone("a1", "a", "2"), _zone("a2", "a", "2"), _zone("b1", "b", "8"), _zone("b2", "b", "8")],
        {0: "a1", 1: "a2", 2: "b1"},
        "a1",
    ),
    DomainCase(
        "a cluster without the pack-domain label",
        [_zone("x", None, "4")],
        {},
        None,
        {"missing label 'zone' (gosched.io/pack-domain)": 1},
    ),
    DomainCase(
        "only unlabelled nodes have room",
        [_zone("a1", "a", "0"), _zone("b1", "b", "0"), _zone("x", None, "4")],
        {},
        None,
        {"node too small for cpu": 2, "missing label 'zone' (gosched.io/pack-domain)": 1},
    ),
]


@pytest.mark.parametrize("case", DOMAIN_CASES, ids=lambda c: c.name)
def test_pack_domain_of_a_partly_bound_gang(case: DomainCase) -> None:
    job = _gang(4, 2)
    shard = shard_with(case.nodes, [(job, i, node, ()) for i, node in case.bound.items()])
    rest = tuple(i for i in range(job.total_replicas) if i not in case.bound)
    need = max(1, job.min_member - len(case.bound))
    out = shard.schedule(UnitBatch(0, [Unit(job, rest[:1], need, held=len(case.bound))]))
    if case.expect_node is not None:
        assert out.unschedulable == []
        assert [p.node for p in out.proposals[0].placements] == [case.expect_node]
    else:
        assert out.proposals == []
        assert out.unschedulable[0].diagnosis.ruled_out == case.ruled_out


def test_partly_placed_pack_gang_never_leaves_its_zone(tmp_path: Path) -> None:
    # The reviewer's scenario: three of four tasks land in zone a (b1 is taken); once b1 frees,
    # the fourth must not go to zone b, and "why pending" says where it waits.
    nodes = [_zone(n, n[0]) for n in ("a1", "a2", "a3", "b1", "b2")]
    p = Pipeline(Settings(store_path=str(tmp_path / "gs.db"), retry_backoff_s=0.0, shards=1), nodes=nodes)
    p.submit(make_job("blk").cpu("1").selector(zone="b").build())
    p.run_until_idle()
    p.submit(_gang(4, 2))
    p.run_until_idle(wait_backoff=True)
    p.cancel("blk")
    p.run_until_idle(wait_backoff=True)
    state = p.binder.state
    placed = {}
    for i in range(4):
        row = state.task_row.get(f"g/{i}")
        node = None if row is None else state.nodes[row]
        placed[i] = None if node is None else node.name
    assert sorted(n for n in placed.values() if n is not None) == ["a1", "a2", "a3"]
    assert "2 outside zone=a, where the job's bound tasks are" in p.dispatcher.explain("g")


MINIMAL_FILTERS = ProfileConfig(filters=["node_ready", "resources_fit"])


@dataclass
class GpuReasonCase:
    name: str
    nodes: list[Node]
    job: Job
    ruled_out: dict[str, int]
    profile: ProfileConfig | None = None
    running: list[tuple[Job, int, str, tuple[tuple[int, int], ...]]] = field(default_factory=list)


def _mixed() -> Node:
    # The A100 is too small; the big GPU is a V100.
    return (
        make_node("mix").gpu(0, model="V100", memory_mib=81920).gpu(1, model="A100", memory_mib=16000).build()
    )


A100_40G = make_job("j").cpu("1").gpus(1).gpu_model("A100").gpu_memory(40000).build()
MODEL_MEMORY = "no GPU of the wanted model with enough memory"

GPU_REASON_CASES = [
    GpuReasonCase(
        "model and memory on different GPUs; a fitting GPU busy elsewhere",
        [_mixed(), make_node("big").gpu(0, model="A100", memory_mib=81920).build()],
        A100_40G,
        {MODEL_MEMORY: 1, "insufficient GPU": 1},
        running=[(make_job("o").cpu("1").gpus(1).build(), 0, "big", ((0, 1000),))],
    ),
    GpuReasonCase(
        "model and memory on different GPUs, fit check alone",
        [_mixed()],
        A100_40G,
        {MODEL_MEMORY: 1},
        MINIMAL_FILTERS,
    ),
    GpuReasonCase(
        "GPU memory too small, fit check alone",
        [make_node("small").gpus(2, memory_mib=16000).build()],
        make_job("j").cpu("1").gpus(1).gpu_memory(40000).build(),
        {"GPU memory too small": 1},
        MINIMAL_FILTERS,
    ),
    GpuReasonCase(
        "GPU model missing, fit check alone",
        [make_node("v").gpus(2, model="V100").build()],
        make_job("j").cpu("1").gpus(1).gpu_model("A100").build(),
        {"no GPU of the wanted model": 1},
        MINIMAL_FILTERS,
    ),
]


@pytest.mark.parametrize("case", GPU_REASON_CASES, ids=lambda c: c.name)
def test_gpu_model_and_memory_reasons(case: GpuReasonCase) -> None:
    shard = shard_with(case.nodes, case.running, case.profile)
    job = case.job
    out = shard.schedule(UnitBatch(0, [Unit(job, tuple(range(job.total_replicas)), job.min_member)]))
    assert out.proposals == []
    assert out.unschedulable[0].diagnosis.ruled_out == case.ruled_out
