"""Table-driven scenarios for the shard's filter, score, gang and preemption rules."""

from dataclasses import dataclass, field

import numpy as np
import pytest

from gosched.common.config import ProfileConfig
from gosched.common.job import Job
from gosched.common.node import Node, NodeState
from tests.builders import make_job, make_node
from tests.shard_helpers import profile_with_scores, run_units, shard_with


@dataclass
class Case:
    name: str
    nodes: list[Node]
    job: Job
    expect_nodes: set[str] | None  # nodes the task may land on; None: unschedulable
    profile: ProfileConfig | None = None
    running: list[tuple[Job, int, str, tuple[tuple[int, int], ...]]] = field(default_factory=list)


def _filler(job_id: str, cpu: str = "1", gpus: int = 0, share: int = 0) -> Job:
    b = make_job(job_id).cpu(cpu)
    if gpus:
        b = b.gpus(gpus)
    if share:
        b = b.gpu_share(share)
    return b.build()


FILTER_CASES = [
    Case(
        "cpu fits only on the big node",
        [make_node("small").cpu("2").build(), make_node("big").cpu("16").build()],
        make_job("j").cpu("4").build(),
        {"big"},
    ),
    Case(
        "memory too large everywhere",
        [make_node("a").mem("8Gi").build(), make_node("b").mem("16Gi").build()],
        make_job("j").cpu("1").mem("32Gi").build(),
        None,
    ),
    Case(
        "whole GPUs: only the node with 4 free",
        [make_node("g2").gpus(2).build(), make_node("g4").gpus(4).build()],
        make_job("j").cpu("1").gpus(4).build(),
        {"g4"},
    ),
    Case(
        "GPU share fits next to another share",
        [make_node("g1").gpus(1).build()],
        make_job("j").cpu("1").gpu_share(500).build(),
        {"g1"},
        running=[(_filler("other", share=500), 0, "g1", ((0, 500),))],
    ),
    Case(
        "GPU share does not fit in the 300 left",
        [make_node("g1").gpus(1).build()],
        make_job("j").cpu("1").gpu_share(500).build(),
        None,
        running=[(_filler("other", share=700), 0, "g1", ((0, 700),))],
    ),
    Case(
        "GPU model match",
        [make_node("a").gpus(8, model="A100").build(), make_node("v").gpus(8, model="V100").build()],
        make_job("j").cpu("1").gpus(1).gpu_model("V100").build(),
        {"v"},
    ),
    Case(
        "GPU model nowhere",
        [make_node("a").gpus(8, model="A100").build()],
        make_job("j").cpu("1").gpus(1).gpu_model("H100").build(),
        None,
    ),
    Case(
        "GPU memory floor",
        [
            make_node("small").gpus(2, memory_mib=16384).build(),
            make_node("big").gpus(2, memory_mib=81920).build(),
        ],
        make_job("j").cpu("1").gpus(1).gpu_memory(40000).build(),
        {"big"},
    ),
    Case(
        "cordoned and not-ready nodes are skipped",
        [
            make_node("c").state(NodeState.CORDONED).build(),
            make_node("nr").state(NodeState.NOT_READY).build(),
            make_node("ok").build(),
        ],
        make_job("j").cpu("1").build(),
        {"ok"},
    ),
    Case(
        "node selector",
        [make_node("a").label(zone="a").build(), make_node("b").label(zone="b").build()],
        make_job("j").cpu("1").selector(zone="b").build(),
        {"b"},
    ),
    Case(
        "required affinity In",
        [make_node("a").label(disk="hdd").build(), make_node("b").label(disk="ssd").build()],
        make_job("j").cpu("1").require("disk", "In", "ssd", "nvme").build(),
        {"b"},
    ),
    Case(
        "required affinity NotIn",
        [make_node("a").label(disk="hdd").build(), make_node("b").label(disk="ssd").build()],
        make_job("j").cpu("1").require("disk", "NotIn", "ssd").build(),
        {"a"},
    ),
    Case(
        "required affinity DoesNotExist",
        [make_node("a").label(gpu="yes").build(), make_node("b").build()],
        make_job("j").cpu("1").require("gpu", "DoesNotExist").build(),
        {"b"},
    ),
    Case(
        "required affinity Gt",
        [make_node("a").label(cores="8").build(), make_node("b").label(cores="64").build()],
        make_job("j").cpu("1").require("cores", "Gt", "32").build(),
        {"b"},
    ),
    Case(
        "preferred affinity breaks the tie",
        [make_node("a").label(zone="a").build(), make_node("b").label(zone="b").build()],
        make_job("j").cpu("1").prefer(50, "zone", "In", "b").build(),
        {"b"},
    ),
    Case(
        "NoSchedule taint repels",
        [make_node("t").taint("gpu", "reserved").build(), make_node("u").cpu("4").build()],
        make_job("j").cpu("1").build(),
        {"u"},
    ),
    Case(
        "toleration admits",
        [make_node("t").taint("gpu", "reserved").build()],
        make_job("j").cpu("1").tolerate("gpu", "reserved").build(),
        {"t"},
    ),
    Case(
        "Exists toleration admits any value",
        [make_node("t").taint("dedicated", "ml", "NoExecute").build()],
        make_job("j").cpu("1").tolerate("dedicated", exists=True).build(),
        {"t"},
    ),
    Case(
        "PreferNoSchedule only lowers the score",
        [make_node("p").taint("spot", "", "PreferNoSchedule").build(), make_node("q").build()],
        make_job("j").cpu("1").build(),
        {"q"},
    ),
    Case(
        "extended resource",
        [make_node("a").build(), make_node("b").extended("fpga", 2).build()],
        make_job("j").cpu("1").extended("fpga", 1).build(),
        {"b"},
    ),
    Case(
        "bin-pack prefers the fuller node",
        [make_node("empty").build(), make_node("busy").build()],
        make_job("j").cpu("1").build(),
        {"busy"},
        profile_with_scores("most_allocated"),
        running=[(_filler("f", "8"), 0, "busy", ())],
    ),
    Case(
        "spread prefers the emptier node",
        [make_node("empty").build(), make_node("busy").build()],
        make_job("j").cpu("1").build(),
        {"empty"},
        profile_with_scores("least_allocated"),
        running=[(_filler("f", "8"), 0, "busy", ())],
    ),
]


@pytest.mark.parametrize("case", FILTER_CASES, ids=lambda c: c.name)
def test_single_task_placement(case: Case) -> None:
    shard = shard_with(case.nodes, case.running, case.profile)
    out = run_units(shard, [case.job])
    if case.expect_nodes is None:
        assert out.proposals == []
        assert len(out.unschedulable) == 1
        assert out.unschedulable[0].diagnosis.ruled_out
    else:
        assert out.unschedulable == []
        (proposal,) = out.proposals
        (placement,) = proposal.placements
        assert placement.node in case.expect_nodes


def test_two_gpus_on_numa_nvlink_pair() -> None:
    # Free GPUs {0,1} on NUMA 0 linked by NVLink, {4,5} on NUMA 1 without NVLink; 2,3,6,7 are busy.
    b = make_node("n")
    for g in range(8):
        b = b.gpu(g, numa=0 if g < 4 else 1, nvlink=((g ^ 1,) if g < 2 else ()))
    node = b.build()
    busy = [(_filler(f"busy{g}", gpus=1), 0, "n", ((g, 1000),)) for g in (2, 3, 6, 7)]
    shard = shard_with([node], busy)
    out = run_units(shard, [make_job("j").cpu("1").gpus(2).build()])
    assert sorted(g for g, _ in out.proposals[0].placements[0].gpus) == [0, 1]


def test_multi_gpu_prefers_node_with_nvlinked_numa_group() -> None:
    plain = make_node("plain").gpus(4, numa_nodes=4).build()  # every GPU on its own NUMA node
    linked = make_node("linked").gpus(4, numa_nodes=2, nvlink_pairs=True).build()
    shard = shard_with([plain, linked], profile=profile_with_scores("gpu_topology"))
    out = run_units(shard, [make_job("j").cpu("1").gpus(2).build()])
    assert out.proposals[0].placements[0].node == "linked"


def test_gpu_share_best_fit_keeps_whole_gpus_free() -> None:
    shard = shard_with([make_node("n").gpus(2).build()], [(_filler("o", share=300), 0, "n", ((1, 300),))])
    out = run_units(shard, [make_job("j").cpu("1").gpu_share(500).build()])
    assert out.proposals[0].placements[0].gpus == ((1, 500),)


def test_fragmentation_score_fills_a_partly_used_node() -> None:
    nodes = [make_node("fresh").gpus(1).build(), make_node("partial").gpus(1).build()]
    running = [(_filler("o", share=500), 0, "partial", ((0, 500),))]
    shard = shard_with(nodes, running, profile_with_scores("gpu_fragmentation"))
    out = run_units(shard, [make_job("j").cpu("1").gpu_share(500).build()])
    assert out.proposals[0].placements[0].node == "partial"


def test_anti_affinity_spreads_a_jobs_tasks_over_nodes() -> None:
    nodes = [make_node(f"n{i}").build() for i in range(3)]
    job = make_job("j").cpu("1").replicas(3).min_member(3).anti_affinity("node").build()
    out = run_units(shard_with(nodes, profile=profile_with_scores("most_allocated")), [job])
    assert sorted(p.node for p in out.proposals[0].placements) == ["n0", "n1", "n2"]


def test_anti_affinity_by_zone_and_too_few_zones() -> None:
    nodes = [make_node(f"n{i}").label(zone="a" if i < 2 else "b").build() for i in range(4)]
    ok = make_job("ok").cpu("1").replicas(2).min_member(2).anti_affinity("zone").build()
    out = run_units(shard_with(nodes), [ok])
    zones = {"n0": "a", "n1": "a", "n2": "b", "n3": "b"}
    assert sorted(zones[p.node] for p in out.proposals[0].placements) == ["a", "b"]
    too_many = make_job("big").cpu("1").replicas(3).min_member(3).anti_affinity("zone").build()
    out = run_units(shard_with(nodes), [too_many])
    assert out.proposals == [] and "anti-affinity" in out.unschedulable[0].diagnosis.ruled_out


def test_anti_affinity_across_jobs_by_label() -> None:
    nodes = [make_node("a").build(), make_node("b").build()]
    web = make_job("web1").cpu("1").labels(app="web").build()
    job = make_job("web2").cpu("1").labels(app="web").anti_affinity("node", app="web").build()
    out = run_units(shard_with(nodes, [(web, 0, "a", ())]), [job])
    assert out.proposals[0].placements[0].node == "b"


def test_spark_gang_all_or_nothing_leaves_no_trace() -> None:
    # Room for the driver (2 CPU) and 3 executors (4 CPU each) but not 4.
    nodes = [make_node("a").cpu("8").build(), make_node("b").cpu("6").build()]
    spark = (
        make_job("spark").role("driver").cpu("2").group("executor").cpu("4").replicas(4).min_member(5).build()
    )
    shard = shard_with(nodes)
    before = (shard.state.cpu_used.copy(), dict(shard.state.task_row))
    out = run_units(shard, [spark])
    assert out.proposals == []
    assert "gang needs 5" in out.unschedulable[0].diagnosis.message()
    assert np.array_equal(shard.state.cpu_used, before[0]) and shard.state.task_row == before[1]
    assert shard.inflight == {}
    # One more executor's room: all five are proposed.
    shard2 = shard_with([*nodes, make_node("c").cpu("4").build()])
    out2 = run_units(shard2, [spark])
    assert len(out2.proposals[0].placements) == 5


def test_explain_counts_each_filter() -> None:
    nodes = [make_node(f"cpu{i}").build() for i in range(9)] + [
        make_node("res").gpus(8).taint("gpu", "reserved").build()
    ]
    out = run_units(shard_with(nodes), [make_job("j").cpu("1").gpus(1).build()])
    msg = out.unschedulable[0].diagnosis.message()
    assert msg.startswith("0/10 nodes fit")
    assert "9 too few GPUs" in msg
    assert "1 taint gpu=reserved" in msg


# -- preemption ------------------------------------------------------------------------------
def test_gang_preemption_on_one_node_evicts_both() -> None:
    node = make_node("n").cpu("10").build()
    p1 = make_job("p1").cpu("5").priority(90).build()
    p2 = make_job("p2").cpu("5").priority(80).build()
    shard = shard_with([node], [(p1, 0, "n", ()), (p2, 0, "n", ())])
    gang = make_job("g").cpu("5").replicas(2).min_member(2).priority(100).build()
    out = run_units(shard, [gang])
    placements = out.proposals[0].placements
    assert [p.node for p in placements] == ["n", "n"]
    assert sorted(v for p in placements for v in p.victims) == ["p1/0", "p2/0"]
    # The lower priority one goes first.
    assert placements[0].victims == ("p2/0",)


@dataclass
class PreemptCase:
    name: str
    running: list[Job]
    preemptor: Job
    expect_victims: set[str] | None  # None: no preemption possible
    reclaim: frozenset[str] = frozenset()


PREEMPT_CASES = [
    PreemptCase(
        "lower priority only",
        [make_job("hi").cpu("8").priority(200).build()],
        make_job("p").cpu("8").priority(100).build(),
        None,
    ),
    PreemptCase(
        "non-preemptible is safe",
        [make_job("np").cpu("8").priority(1).preemptible(False).build()],
        make_job("p").cpu("8").priority(100).build(),
        None,
    ),
    PreemptCase(
        "reprieve keeps the task not needed",
        [make_job("a").cpu("4").priority(10).build(), make_job("b").cpu("4").priority(20).build()],
        make_job("p").cpu("4").priority(100).build(),
        {"a/0"},
    ),
    PreemptCase(
        "disruption budget 0 protects",
        [make_job("b0").cpu("8").priority(1).disruption_budget(0).build()],
        make_job("p").cpu("8").priority(100).build(),
        None,
    ),
    PreemptCase(
        "capacity reclaim ignores priority",
        [make_job("borrow").cpu("8").priority(500).queue("q1").build()],
        make_job("p").cpu("8").priority(0).queue("q2").build(),
        {"borrow/0"},
        frozenset({"q1"}),
    ),
]


@pytest.mark.parametrize("case", PREEMPT_CASES, ids=lambda c: c.name)
def test_preemption_rules(case: PreemptCase) -> None:
    shard = shard_with([make_node("n").cpu("8").build()], [(j, 0, "n", ()) for j in case.running])
    out = run_units(shard, [case.preemptor], reclaim=case.reclaim)
    if case.expect_victims is None:
        assert out.proposals == []
    else:
        assert {v for p in out.proposals[0].placements for v in p.victims} == case.expect_victims


def test_candidate_sorting_prefers_lowest_victim_priority_then_fewest() -> None:
    nodes = [make_node(n).cpu("8").build() for n in ("x", "y", "z")]
    running = [
        (make_job("x1").cpu("8").priority(50).build(), 0, "x", ()),
        (make_job("y1").cpu("4").priority(10).build(), 0, "y", ()),
        (make_job("y2").cpu("4").priority(10).build(), 0, "y", ()),
        (make_job("z1").cpu("8").priority(10).build(), 0, "z", ()),
    ]
    out = run_units(shard_with(nodes, running), [make_job("p").cpu("8").priority(100).build()])
    (placement,) = out.proposals[0].placements
    # y and z both top out at priority 10; z has the lower priority sum (10 < 20).
    assert placement.node == "z" and placement.victims == ("z1/0",)


def test_latest_start_time_breaks_ties() -> None:
    nodes = [make_node(n).cpu("8").build() for n in ("old", "young")]
    old = make_job("old").cpu("8").priority(10).build()
    young = make_job("young").cpu("8").priority(10).build()
    shard = shard_with(
        nodes, [(old, 0, "old", ()), (young, 0, "young", ())], start_times={"old": 1.0, "young": 500.0}
    )
    out = run_units(shard, [make_job("p").cpu("8").priority(100).build()])
    assert out.proposals[0].placements[0].node == "young"


def test_victim_not_claimed_twice_within_a_shard() -> None:
    shard = shard_with(
        [make_node("n").cpu("8").build()], [(make_job("v").cpu("8").priority(1).build(), 0, "n", ())]
    )
    p1 = make_job("p1").cpu("8").priority(100).build()
    p2 = make_job("p2").cpu("8").priority(100).build()
    out = run_units(shard, [p1, p2])
    assert len(out.proposals) == 1 and out.proposals[0].placements[0].victims == ("v/0",)
    assert out.unschedulable[0].job_id == "p2"


def test_partition_first() -> None:
    nodes = [make_node(f"n{i}").build() for i in range(4)]
    shard = shard_with(nodes, profile=profile_with_scores("most_allocated"))
    shard.set_partition(["n2", "n3"])
    out = run_units(shard, [make_job(f"j{i}").cpu("1").build() for i in range(3)])
    assert {p.placements[0].node for p in out.proposals} <= {"n2", "n3"}
    # When the partition is full the shard goes elsewhere.
    out = run_units(shard, [make_job("big").cpu("32").build(), make_job("big2").cpu("32").build()])
    assert len(out.proposals) == 2


def test_pack_domain_places_a_gang_in_one_zone() -> None:
    nodes = [make_node(f"n{i}").cpu("4").label(zone="a" if i % 2 else "b").build() for i in range(6)]
    job = (
        make_job("g").cpu("4").replicas(3).min_member(3).labels(**{"gosched.io/pack-domain": "zone"}).build()
    )
    out = run_units(shard_with(nodes), [job])
    zones = {("a" if int(p.node[1:]) % 2 else "b") for p in out.proposals[0].placements}
    assert len(zones) == 1
