"""Table-driven scenarios for the shard's filter, score, gang and preemption rules."""

from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from gosched.common.cluster_state import Resident
from gosched.common.config import ProfileConfig
from gosched.common.job import Job, NodeSelectorTerm, Requirement, SelectorOp
from gosched.common.messages import BindReply, RejectedUnit
from gosched.common.node import RUNTIME_LABEL, Node, NodeState
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


def _one_term(job: Job, *requirements: tuple[str, ...]) -> Job:
    """`job` with one required-affinity term holding every requirement (key, op, *values)."""
    term = NodeSelectorTerm(tuple(Requirement(k, SelectorOp(op), tuple(v)) for k, op, *v in requirements))
    group = replace(job.groups[0], required_affinity=(term,))
    return replace(job, groups=(group,))


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
    # -- taints and tolerations --
    Case(
        "NoExecute taint repels",
        [make_node("t").taint("dedicated", "ml", "NoExecute").build(), make_node("u").build()],
        make_job("j").cpu("1").build(),
        {"u"},
    ),
    Case(
        "a NoSchedule toleration does not cover a NoExecute taint",
        [make_node("t").taint("gpu", "x", "NoExecute").build()],
        make_job("j").cpu("1").tolerate("gpu", "x", "NoSchedule").build(),
        None,
    ),
    Case(
        "a toleration naming the taint's effect admits",
        [make_node("t").taint("gpu", "x", "NoExecute").build()],
        make_job("j").cpu("1").tolerate("gpu", "x", "NoExecute").build(),
        {"t"},
    ),
    Case(
        "Equal toleration of another value does not admit",
        [make_node("t").taint("gpu", "reserved").build()],
        make_job("j").cpu("1").tolerate("gpu", "other").build(),
        None,
    ),
    Case(
        "Exists toleration of another key does not admit",
        [make_node("t").taint("gpu", "reserved").build()],
        make_job("j").cpu("1").tolerate("spot", exists=True).build(),
        None,
    ),
    Case(
        "every hard taint must be tolerated",
        [make_node("t").taint("a", "1").taint("b", "2", "NoExecute").build()],
        make_job("j").cpu("1").tolerate("a", "1").build(),
        None,
    ),
    Case(
        "an empty-key Exists toleration tolerates every taint",
        [make_node("t").taint("a", "1").taint("b", "2", "NoExecute").build()],
        make_job("j").cpu("1").tolerate(exists=True).build(),
        {"t"},
    ),
    Case(
        "a PreferNoSchedule node is still used when it is the only one",
        [make_node("p").taint("spot", "", "PreferNoSchedule").build()],
        make_job("j").cpu("1").build(),
        {"p"},
    ),
    Case(
        "a tolerated PreferNoSchedule taint costs nothing (tie: first node)",
        [make_node("p").taint("spot", "", "PreferNoSchedule").build(), make_node("q").build()],
        make_job("j").cpu("1").tolerate("spot", exists=True).build(),
        {"p"},
    ),
    # -- node selector --
    Case(
        "node selector needs every label",
        [
            make_node("zone-only").label(zone="a").build(),
            make_node("disk-only").label(disk="ssd").build(),
            make_node("both").label(zone="a", disk="ssd").build(),
        ],
        make_job("j").cpu("1").selector(zone="a", disk="ssd").build(),
        {"both"},
    ),
    Case(
        "node selector on a label no node has",
        [make_node("a").label(zone="a").build()],
        make_job("j").cpu("1").selector(rack="r1").build(),
        None,
    ),
    # -- required / preferred node affinity --
    Case(
        "required affinity Exists",
        [make_node("a").build(), make_node("b").label(gpu="yes").build()],
        make_job("j").cpu("1").require("gpu", "Exists").build(),
        {"b"},
    ),
    Case(
        "required affinity Lt",
        [make_node("a").label(cores="8").build(), make_node("b").label(cores="64").build()],
        make_job("j").cpu("1").require("cores", "Lt", "32").build(),
        {"a"},
    ),
    Case(
        "Gt never matches a non-integer label",
        [make_node("a").label(cores="many").build()],
        make_job("j").cpu("1").require("cores", "Gt", "1").build(),
        None,
    ),
    Case(
        "required terms are ORed",
        [make_node("c").label(zone="c").build(), make_node("b").label(zone="b").build()],
        make_job("j").cpu("1").require("zone", "In", "a").require("zone", "In", "b").build(),
        {"b"},
    ),
    Case(
        "requirements inside one term are ANDed",
        [
            make_node("zone-only").label(zone="a").build(),
            make_node("both").label(zone="a", disk="ssd").build(),
        ],
        _one_term(make_job("j").cpu("1").build(), ("zone", "In", "a"), ("disk", "Exists")),
        {"both"},
    ),
    Case(
        "preferred affinity: the heavier matched term wins",
        [make_node("a").label(zone="a").build(), make_node("b").label(disk="ssd").build()],
        make_job("j").cpu("1").prefer(10, "zone", "In", "a").prefer(80, "disk", "In", "ssd").build(),
        {"b"},
    ),
    Case(
        "preferred affinity never excludes",
        [make_node("a").label(zone="a").build()],
        make_job("j").cpu("1").prefer(100, "zone", "In", "b").build(),
        {"a"},
    ),
    # -- GPUs: models, memory per GPU, shares --
    Case(
        "any of several acceptable models",
        [
            make_node("a").gpus(8, model="A100").build(),
            make_node("v").gpus(8, model="V100").build(),
            make_node("h").gpus(8, model="H100").build(),
        ],
        make_job("j").cpu("1").gpus(1).gpu_model("H100", "V100").build(),
        {"v", "h"},
    ),
    Case(
        "too few GPUs of the wanted model on a mixed node",
        [make_node("mix").gpu(0, model="A100").gpu(1, model="A100").gpu(2, model="V100").build()],
        make_job("j").cpu("1").gpus(2).gpu_model("V100").build(),
        None,
    ),
    Case(
        "GPU memory floor counts GPU by GPU on a mixed node",
        [
            make_node("mix")
            .gpu(0, memory_mib=16384)
            .gpu(1, memory_mib=16384)
            .gpu(2, memory_mib=81920)
            .gpu(3, memory_mib=81920)
            .build()
        ],
        make_job("j").cpu("1").gpus(3).gpu_memory(40000).build(),
        None,
    ),
    Case(
        "GPU memory floor for a GPU share",
        [
            make_node("small").gpus(2, memory_mib=16384).build(),
            make_node("big").gpus(2, memory_mib=81920).build(),
        ],
        make_job("j").cpu("1").gpu_share(250).gpu_memory(40000).build(),
        {"big"},
    ),
    Case(
        "a GPU share needs a GPU",
        [make_node("cpu-only").build()],
        make_job("j").cpu("1").gpu_share(100).build(),
        None,
    ),
    Case(
        "a GPU share cannot use a GPU held whole",
        [make_node("g2").gpus(2).build()],
        make_job("j").cpu("1").gpu_share(500).build(),
        None,
        running=[
            (_filler("whole", gpus=1), 0, "g2", ((0, 1000),)),
            (_filler("part", share=700), 0, "g2", ((1, 700),)),
        ],
    ),
    Case(
        "a whole GPU is not free while a share sits on it",
        [make_node("g2").gpus(2).build()],
        make_job("j").cpu("1").gpus(1).build(),
        None,
        running=[
            (_filler("s0", share=100), 0, "g2", ((0, 100),)),
            (_filler("s1", share=100), 0, "g2", ((1, 100),)),
        ],
    ),
    Case(
        "shares of several tasks fill one GPU exactly",
        [make_node("g1").gpus(1).build()],
        make_job("j").cpu("1").gpu_share(400).build(),
        {"g1"},
        running=[
            (_filler("s0", share=300), 0, "g1", ((0, 300),)),
            (_filler("s1", share=300), 0, "g1", ((0, 300),)),
        ],
    ),
    # -- node state and capacity edges --
    Case(
        "draining nodes are skipped",
        [make_node("d").state(NodeState.DRAINING).build(), make_node("ok").build()],
        make_job("j").cpu("1").build(),
        {"ok"},
    ),
    Case(
        "no ready node at all",
        [
            make_node("d").state(NodeState.DRAINING).build(),
            make_node("c").state(NodeState.CORDONED).build(),
            make_node("nr").state(NodeState.NOT_READY).build(),
        ],
        make_job("j").cpu("1").build(),
        None,
    ),
    Case(
        "a request equal to the free CPU fits",
        [make_node("n").cpu("4").build()],
        make_job("j").cpu("3").build(),
        {"n"},
        running=[(_filler("f", "1"), 0, "n", ())],
    ),
    Case(
        "zero of an extended resource no node has asks for nothing",
        [make_node("a").build()],
        make_job("j").cpu("1").extended("example.com/fpga", 0).build(),
        {"a"},
    ),
    Case(
        "extended resource used up",
        [make_node("b").extended("fpga", 1).build()],
        make_job("j").cpu("1").extended("fpga", 1).build(),
        None,
        running=[(make_job("f").cpu("1").extended("fpga", 1).build(), 0, "b", ())],
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
        "an image goes only to a node that can run containers",
        [make_node("plain").build(), make_node("docker").label(**{RUNTIME_LABEL: "docker"}).build()],
        make_job("j").cpu("1").image("python:3.12").build(),
        {"docker"},
    ),
    Case(
        "an image and no container runtime anywhere",
        [make_node("plain").build()],
        make_job("j").cpu("1").image("python:3.12").build(),
        None,
    ),
    Case(
        "a shell task goes anywhere",
        [make_node("plain").build(), make_node("docker").label(**{RUNTIME_LABEL: "docker"}).build()],
        make_job("j").cpu("1").build(),
        {"plain", "docker"},
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
        if case.job.groups[0].image:
            assert out.unschedulable[0].diagnosis.ruled_out == {"no container runtime": 1}
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


def test_a_gpu_share_on_a_whole_gpu_keeps_the_linked_pair_whole() -> None:
    # GPUs 0-1 and 2-3 are NVLinked pairs on NUMA nodes 0 and 1; GPU 2 is taken. A share that must
    # take a whole GPU takes 3 (its peer is busy), as a one-GPU task would, not 0: the next
    # two-GPU task then still gets the linked pair on one NUMA node.
    node = make_node("n").cpu("32").mem("128Gi").gpus(4, numa_nodes=2, nvlink_pairs=True).build()
    shard = shard_with([node], [(_filler("busy", gpus=1), 0, "n", ((2, 1000),))])
    share = run_units(shard, [make_job("share").cpu("1").mem("1Gi").gpu_share(500).build()])
    assert share.proposals[0].placements[0].gpus == ((3, 500),)
    two = run_units(shard, [make_job("two").cpu("1").mem("1Gi").gpus(2).build()])
    assert two.proposals[0].placements[0].gpus == ((0, 1000), (1, 1000))


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


@pytest.mark.parametrize("labels", [{"app": "web"}, {"app": "web", "tier": "front"}, {"app": "db"}, {}])
def test_a_residents_anti_affinity_repels_a_labelled_job_the_other_way_round(labels: dict[str, str]) -> None:
    """As in Kubernetes, a bound task's rule keeps a job carrying its match labels out of its domain,
    though that job has no rule of its own; a job without them may join it."""
    nodes = [make_node("a").build(), make_node("b").build()]
    guard = make_job("guard").cpu("1").anti_affinity("node", app="web").build()
    shard = shard_with(nodes, [(guard, 0, "a", ())], profile_with_scores("most_allocated"))
    job = make_job("j").cpu("1").labels(**labels).build()
    out = run_units(shard, [job])
    repelled = labels.get("app") == "web"
    assert out.proposals[0].placements[0].node == ("b" if repelled else "a")  # most_allocated: a
    # with b full too, the repelled job fits nowhere, and the diagnosis says why
    full = make_job("full").cpu("32").build()
    running = [(guard, 0, "a", ()), (full, 0, "b", ())]
    shard = shard_with(nodes, running, profile_with_scores("most_allocated"))
    out = run_units(shard, [job])
    if repelled:
        assert out.proposals == [] and "anti-affinity" in out.unschedulable[0].diagnosis.ruled_out
    else:
        assert out.proposals[0].placements[0].node == "a"


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


def test_a_placement_awaiting_the_binder_is_never_a_victim() -> None:
    # "low" is only assumed (in flight, not bound) when "high" looks for room: evicting it would be
    # refused by the binder, and undoing both attempts once put "low" back as a phantom.
    shard = shard_with([make_node("n").cpu("8").build()])
    out = run_units(
        shard, [make_job("low").cpu("8").priority(1).build(), make_job("high").cpu("8").priority(100).build()]
    )
    assert [p.job.id for p in out.proposals] == ["low"]
    assert [u.job_id for u in out.unschedulable] == ["high"]
    # both answers as the binder gives them: "low" refused, so nothing of either stays in the view
    shard.apply_reply(
        BindReply(
            [], [RejectedUnit("low", (0,), "insufficient cpu on n", "resources_fit")], [], [], shard.version
        )
    )
    assert shard.state.task_row == {} and shard.state.cpu_used[0] == 0
    # a bound task of the same priority is a victim as before
    bound = shard_with(
        [make_node("n").cpu("8").build()], [(make_job("low").cpu("8").priority(1).build(), 0, "n", ())]
    )
    out = run_units(bound, [make_job("high").cpu("8").priority(100).build()])
    assert out.proposals[0].placements[0].victims == ("low/0",)


@pytest.mark.parametrize(
    ("in_flight_priority", "keep_cpu", "bound", "settling"),
    [
        (1, 0, [], True),  # the lower-priority task in the way awaits the binder: a victim once bound
        (100, 0, [], False),  # an equal-priority task in flight is no victim either way
        (1, 0, [("other", 1)], False),  # a bound task is evicted instead: no verdict to revisit
        (1, 2, [], False),  # evicting it would not be enough (2 CPUs stay taken): no hope, no retry
    ],
    ids=["lower-in-flight", "equal-in-flight", "bound-victim-found", "not-enough-even-so"],
)
def test_an_unschedulable_verdict_held_back_by_victims_in_flight_is_marked_settling(
    in_flight_priority: int, keep_cpu: int, bound: list[tuple[str, int]], settling: bool
) -> None:
    # The dispatcher retries a settling verdict after its backoff even on an unchanged cluster: the
    # binder binding "low" is no change that wakes dormant jobs, yet it makes "high" placeable.
    nodes = [make_node("n").cpu("8").build()] + [
        make_node(f"b{i}").cpu("8").build() for i, _ in enumerate(bound)
    ]
    running = [(make_job(j).cpu("8").priority(p).build(), 0, f"b{i}", ()) for i, (j, p) in enumerate(bound)]
    if keep_cpu:
        running.append((make_job("keep").cpu(str(keep_cpu)).priority(200).build(), 0, "n", ()))
    shard = shard_with(nodes, running)
    low = make_job("low").cpu(str(8 - keep_cpu)).priority(in_flight_priority).build()
    high = make_job("high").cpu("8").priority(100).build()
    out = run_units(shard, [low, high])
    if bound:
        assert out.proposals[1].placements[0].victims == ("other/0",)
        assert out.unschedulable == []
        return
    assert [u.job_id for u in out.unschedulable] == ["high"]
    assert out.unschedulable[0].settling is settling
    # and "why pending" says so
    assert ("still being bound" in out.unschedulable[0].diagnosis.message()) is settling


def test_partition_first() -> None:
    nodes = [make_node(f"n{i}").build() for i in range(4)]
    shard = shard_with(nodes, profile=profile_with_scores("most_allocated"))
    shard.set_partition(["n2", "n3"])
    out = run_units(shard, [make_job(f"j{i}").cpu("1").build() for i in range(3)])
    assert {p.placements[0].node for p in out.proposals} <= {"n2", "n3"}
    # When the partition is full the shard goes elsewhere.
    out = run_units(shard, [make_job("big").cpu("32").build(), make_job("big2").cpu("32").build()])
    assert len(out.proposals) == 2


def test_victims_are_sought_in_the_own_partition_first() -> None:
    # Every node full of equal low-priority work: with one partition per shard, shards that all
    # took the cluster-wide best victims would all pick n0's, and the binder would refuse all but one.
    nodes = [make_node(f"n{i}").cpu("8").build() for i in range(4)]
    running = [(make_job(f"low{i}").cpu("8").priority(1).build(), 0, f"n{i}", ()) for i in range(4)]
    shard = shard_with(nodes, running)
    shard.set_partition(["n2", "n3"])
    out = run_units(shard, [make_job("high").cpu("8").priority(100).build()])
    placement = out.proposals[0].placements[0]
    assert placement.node in {"n2", "n3"} and placement.victims == (f"low{placement.node[1]}/0",)
    # with its own partition out of victims, the shard goes to the rest of the cluster
    out = run_units(shard, [make_job(f"high{i}").cpu("8").priority(100).build() for i in range(3)])
    nodes_taken = [p.placements[0].node for p in out.proposals]
    assert nodes_taken[0] in {"n2", "n3"} - {placement.node}
    assert sorted(nodes_taken[1:]) == ["n0", "n1"]


def test_a_gang_preempts_only_for_what_free_room_anywhere_cannot_hold() -> None:
    # The own partition's nodes are busy, three nodes beyond it are free: a gang of four needs one
    # victim, not four (the preemption pass used to search the own partition alone first).
    nodes = [make_node(f"n{i}").cpu("8").mem("32Gi").gpus(1).build() for i in range(8)]
    low = [make_job(f"low{i}").cpu("8").mem("16Gi").gpus(1).build() for i in range(5)]
    running = [(low[i], 0, f"n{i}", ((0, 1000),)) for i in range(4)] + [(low[4], 0, "n7", ((0, 1000),))]
    shard = shard_with(nodes, running)
    shard.set_partition(["n0", "n1", "n2", "n3"])
    gang = make_job("gang").cpu("8").mem("16Gi").gpus(1).replicas(4).min_member(4).priority(100).build()
    (proposal,) = run_units(shard, [gang]).proposals
    victims = [v for p in proposal.placements for v in p.victims]
    assert sorted(p.node for p in proposal.placements if not p.victims) == ["n4", "n5", "n6"]
    assert len(victims) == 1 and victims[0] in {"low0/0", "low1/0", "low2/0", "low3/0"}


def test_less_important_victims_beyond_the_own_partition_go_first() -> None:
    # kube-scheduler picks the node whose highest victim priority is lowest, cluster-wide.
    nodes = [make_node(f"n{i}").cpu("8").build() for i in range(4)]
    running = [(make_job(f"p90-{i}").cpu("8").priority(90).build(), 0, f"n{i}", ()) for i in (0, 1)]
    running += [(make_job(f"p0-{i}").cpu("8").priority(0).build(), 0, f"n{i}", ()) for i in (2, 3)]
    shard = shard_with(nodes, running)
    shard.set_partition(["n0", "n1"])
    (proposal,) = run_units(shard, [make_job("high").cpu("8").priority(100).build()]).proposals
    assert proposal.placements[0].victims in (("p0-2/0",), ("p0-3/0",))


def test_pack_domain_places_a_gang_in_one_zone() -> None:
    nodes = [make_node(f"n{i}").cpu("4").label(zone="a" if i % 2 else "b").build() for i in range(6)]
    job = (
        make_job("g").cpu("4").replicas(3).min_member(3).labels(**{"gosched.io/pack-domain": "zone"}).build()
    )
    out = run_units(shard_with(nodes), [job])
    zones = {("a" if int(p.node[1:]) % 2 else "b") for p in out.proposals[0].placements}
    assert len(zones) == 1


def test_an_elastic_pack_domain_gang_takes_the_domain_that_holds_most_of_it() -> None:
    # Zone a has the most free GPUs but CPU for two replicas; zone b holds all four. The first
    # domain where the minimum fits used to win, and the rest waited there for good.
    nodes = [
        make_node("a0").cpu("16").mem("64Gi").gpus(6).label(zone="a").build(),
        make_node("b0").cpu("16").mem("64Gi").gpus(2).label(zone="b").build(),
        make_node("b1").cpu("16").mem("64Gi").gpus(2).label(zone="b").build(),
    ]
    labels = {"gosched.io/pack-domain": "zone"}
    job = make_job("el").cpu("8").mem("8Gi").gpus(1).replicas(4).min_member(2).labels(**labels).build()
    out = run_units(shard_with(nodes), [job])
    assert sorted(p.node for p in out.proposals[0].placements) == ["b0", "b0", "b1", "b1"]
    assert out.unschedulable == []
    # With room for the minimum alone anywhere, the first such domain (most free GPUs) still wins.
    small = make_job("el2").cpu("8").mem("8Gi").gpus(1).replicas(4).min_member(2).labels(**labels).build()
    busy = [(make_job(f"f{i}").cpu("8").build(), 0, n, ()) for i, n in enumerate(["b0", "b1", "b1"])]
    out = run_units(shard_with(nodes, busy), [small])
    assert [p.node for p in out.proposals[0].placements] == ["a0", "a0"]


# -- placement policies: bin-pack vs spread vs balanced on one cluster -------------------------------
def _usage(job_id: str, cpu: str, mem: str) -> Job:
    return make_job(job_id).cpu(cpu).mem(mem).build()


# Four 32-CPU / 128Gi nodes; the task asks for 4 CPU and 16Gi (1/8 of each). After placement:
#   v: cpu 0.25  mem 0.125  (light, a little uneven)
#   w: cpu 0.50  mem 0.50   (half full, even)
#   x: cpu 0.875 mem 0.25   (fullest on average, CPU-heavy)
#   z: cpu 0.16  mem 0.875  (memory-heavy)
POLICY_RUNNING = [
    (_usage("on-v", "4", "0"), 0, "v", ()),
    (_usage("on-w", "12", "48Gi"), 0, "w", ()),
    (_usage("on-x", "24", "16Gi"), 0, "x", ()),
    (_usage("on-z", "1", "96Gi"), 0, "z", ()),
]


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        (("most_allocated",), "x"),  # bin-pack: the highest mean use after placement
        (("least_allocated",), "v"),  # spread: the lowest mean use
        (("balanced_allocation",), "w"),  # balanced: CPU and memory used alike
        (None, "w"),  # the default chain: bin-pack plus balanced
    ],
    ids=["bin-pack", "spread", "balanced", "default"],
)
def test_placement_policies_pick_different_nodes(scores: tuple[str, ...] | None, expected: str) -> None:
    nodes = [make_node(n).build() for n in ("v", "w", "x", "z")]
    profile = profile_with_scores(*scores) if scores else None
    shard = shard_with(nodes, POLICY_RUNNING, profile)
    out = run_units(shard, [make_job("t").cpu("4").mem("16Gi").build()])
    assert out.proposals[0].placements[0].node == expected


def test_gpu_memory_floor_takes_the_big_gpus_of_a_mixed_node() -> None:
    node = (
        make_node("mix")
        .gpu(0, memory_mib=16384)
        .gpu(1, memory_mib=16384)
        .gpu(2, memory_mib=81920)
        .gpu(3, memory_mib=81920)
        .build()
    )
    out = run_units(shard_with([node]), [make_job("j").cpu("1").gpus(2).gpu_memory(40000).build()])
    assert sorted(g for g, _ in out.proposals[0].placements[0].gpus) == [2, 3]


def test_gpu_model_takes_the_gpus_of_that_model() -> None:
    node = make_node("mix").gpu(0, model="A100").gpu(1, model="V100").gpu(2, model="A100").build()
    out = run_units(shard_with([node]), [make_job("j").cpu("1").gpus(1).gpu_model("V100").build()])
    assert out.proposals[0].placements[0].gpus == ((1, 1000),)


# -- preemption: more rules ---------------------------------------------------------------------------
PREEMPT_MORE = [
    PreemptCase(
        "equal priority is not lower",
        [make_job("same").cpu("8").priority(100).build()],
        make_job("p").cpu("8").priority(100).build(),
        None,
    ),
    PreemptCase(
        "the non-preemptible stays, the preemptible goes",
        [make_job("np").cpu("4").priority(1).preemptible(False).build(), make_job("low").cpu("4").build()],
        make_job("p").cpu("4").priority(100).build(),
        {"low/0"},
    ),
    PreemptCase(
        "not enough even without every preemptible task",
        [make_job("np").cpu("4").priority(1).preemptible(False).build(), make_job("low").cpu("4").build()],
        make_job("p").cpu("8").priority(100).build(),
        None,
    ),
    PreemptCase(
        "disruption budget 1 allows one victim",
        [make_job("b1").cpu("8").priority(1).disruption_budget(1).build()],
        make_job("p").cpu("8").priority(100).build(),
        {"b1/0"},
    ),
    PreemptCase(
        "each job's budget counts its own tasks only",
        [
            make_job("a").cpu("4").priority(1).disruption_budget(1).build(),
            make_job("b").cpu("4").priority(1).disruption_budget(1).build(),
        ],
        make_job("p").cpu("8").priority(100).build(),
        {"a/0", "b/0"},
    ),
    PreemptCase(
        "zero of an extended resource no node has does not stop preemption",
        [make_job("low").cpu("8").build()],
        make_job("p").cpu("8").extended("example.com/fpga", 0).priority(100).build(),
        {"low/0"},
    ),
    PreemptCase(
        "capacity reclaim spares the preemptor's own queue",
        [make_job("mine").cpu("8").priority(0).queue("q2").build()],
        make_job("p").cpu("8").priority(0).queue("q2").build(),
        None,
        frozenset({"q2"}),
    ),
    PreemptCase(
        "capacity reclaim takes only queues named as borrowing",
        [make_job("other").cpu("8").priority(500).queue("q3").build()],
        make_job("p").cpu("8").priority(0).queue("q2").build(),
        None,
        frozenset({"q1"}),
    ),
]


@pytest.mark.parametrize("case", PREEMPT_MORE, ids=lambda c: c.name)
def test_more_preemption_rules(case: PreemptCase) -> None:
    test_preemption_rules(case)


@pytest.mark.parametrize(
    ("budget", "expect_victims"),
    [(None, {"v/0", "v/1"}), (2, {"v/0", "v/1"}), (1, None), (0, None)],
    ids=["no-budget", "budget-2", "budget-1", "budget-0"],
)
def test_disruption_budget_of_a_job_with_two_tasks_on_one_node(
    budget: int | None, expect_victims: set[str] | None
) -> None:
    b = make_job("v").cpu("4").replicas(2).priority(1)
    victim = (b if budget is None else b.disruption_budget(budget)).build()
    shard = shard_with([make_node("n").cpu("8").build()], [(victim, 0, "n", ()), (victim, 1, "n", ())])
    out = run_units(shard, [make_job("p").cpu("8").priority(100).build()])
    if expect_victims is None:
        assert out.proposals == []
    else:
        assert set(out.proposals[0].placements[0].victims) == expect_victims


@pytest.mark.parametrize(
    ("budget", "placed"), [(None, 2), (2, 2), (1, 0)], ids=["no-budget", "budget-2", "budget-1"]
)
def test_disruption_budget_holds_across_a_gangs_placements(budget: int | None, placed: int) -> None:
    # v has one task on each node; the gang needs both nodes, so both of v's tasks.
    nodes = [make_node("n1").cpu("8").build(), make_node("n2").cpu("8").build()]
    b = make_job("v").cpu("8").replicas(2).priority(1)
    victim = (b if budget is None else b.disruption_budget(budget)).build()
    shard = shard_with(nodes, [(victim, 0, "n1", ()), (victim, 1, "n2", ())])
    gang = make_job("g").cpu("8").replicas(2).min_member(2).priority(100).build()
    out = run_units(shard, [gang])
    assert sum(len(p.placements) for p in out.proposals) == placed


def test_gpu_preemption_evicts_only_the_share_in_the_way() -> None:
    # Two GPUs, each half used by a low-priority share: one whole GPU needs only one of them gone,
    # and the lower-priority one goes.
    node = make_node("n").gpus(2).build()
    a = make_job("a").cpu("1").gpu_share(500).priority(10).build()
    b = make_job("b").cpu("1").gpu_share(500).priority(20).build()
    shard = shard_with([node], [(a, 0, "n", ((0, 500),)), (b, 0, "n", ((1, 500),))])
    out = run_units(shard, [make_job("p").cpu("1").gpus(1).priority(100).build()])
    (placement,) = out.proposals[0].placements
    assert placement.victims == ("a/0",) and placement.gpus == ((0, 1000),)


def test_a_failed_preempting_gang_leaves_no_trace() -> None:
    # The first task of the gang preempts v on n1; the second finds nothing to preempt on n2 (its
    # task is not preemptible): the attempt is abandoned and v is back, the view exactly as before.
    from gosched.binder.state import arrays_view

    nodes = [make_node("n1").cpu("8").build(), make_node("n2").cpu("8").build()]
    v = make_job("v").cpu("8").priority(1).build()
    pinned = make_job("pinned").cpu("8").priority(1).preemptible(False).build()
    shard = shard_with(nodes, [(v, 0, "n1", ()), (pinned, 0, "n2", ())])
    before = arrays_view(shard.state)
    gang = make_job("g").cpu("8").replicas(2).min_member(2).priority(100).build()
    out = run_units(shard, [gang])
    assert out.proposals == [] and out.unschedulable[0].job_id == "g"
    assert arrays_view(shard.state) == before
    assert shard.inflight == {}
    assert shard.state.task_row["v/0"] == shard.state.row_of["n1"]


# -- candidate sorting, key by key ----------------------------------------------------------------------
def _victim(name: str, priority: int, start: float = 0.0) -> Resident:
    return Resident(f"{name}/0", name, 1000, 0, priority=priority, start_time=start)


SORT_CASES = [
    # (name, {row: victims}, expected first row)
    ("no victims first", {0: [_victim("a", 1)], 1: []}, 1),
    ("lowest highest-victim priority", {0: [_victim("a", 1), _victim("b", 50)], 1: [_victim("c", 40)]}, 1),
    (
        "then the lowest priority sum",
        {0: [_victim("a", 30), _victim("b", 30)], 1: [_victim("c", 30), _victim("d", 10)]},
        1,
    ),
    (
        "then the fewest victims",
        {0: [_victim("a", 10), _victim("b", 0), _victim("c", 0)], 1: [_victim("d", 10)]},
        1,
    ),
    (
        "then the latest earliest start",
        {0: [_victim("a", 10, start=5.0)], 1: [_victim("b", 10, start=50.0)]},
        1,
    ),
    ("a full tie keeps the lower row", {0: [_victim("a", 10)], 1: [_victim("b", 10)]}, 0),
]


@pytest.mark.parametrize(("name", "by_row", "first"), SORT_CASES, ids=[c[0] for c in SORT_CASES])
def test_lexicographic_candidate_sorting(name: str, by_row: dict[int, list[Resident]], first: int) -> None:
    from gosched.scheduler_shard.framework.interfaces import Candidate
    from gosched.scheduler_shard.plugins.preemption import Lexicographic

    for order in (list(by_row.items()), list(reversed(by_row.items()))):
        ranked = Lexicographic().sort([Candidate(row, victims) for row, victims in order])
        assert ranked[0].row == first


# -- a unit whose own task the view still shows as resident -------------------------------------------
@pytest.mark.parametrize("answer", ["rejected", "accepted"])
def test_a_units_task_still_resident_in_a_stale_view_is_not_counted_twice(answer: str) -> None:
    # The binder released a/0 (evicted, or its gang broken) and the dispatcher queued it again, but
    # this shard has not heard of the release yet. Its view must not count a/0 twice, nor keep a
    # phantom of it once the binder's changes arrive.
    from gosched.binder.state import arrays_view
    from gosched.common.messages import AcceptedUnit, BindReply, RejectedUnit, TaskBound, TaskReleased

    nodes = [make_node("n1").cpu("8").build(), make_node("n2").cpu("8").build()]
    a = make_job("a").cpu("4").build()
    shard = shard_with(nodes, [(a, 0, "n1", ())])
    out = run_units(shard, [a])
    (placement,) = out.proposals[0].placements
    assert int(shard.state.cpu_used[:2].sum()) == 4000  # once, where the new attempt put it
    assert sum(len(r) for r in shard.state.residents[:2]) == 1
    released = TaskReleased("a/0", "preempted")
    if answer == "rejected":
        reply = BindReply([], [RejectedUnit("a", (0,), "stale", "resources_fit")], [], [released], 3)
        expected = shard_with(nodes)
    else:
        bound = TaskBound(placement.node, Resident.for_task(a, 0, (), 1000.0))
        reply = BindReply([AcceptedUnit.of("a", 0, [placement], 1000.0)], [], [], [released, bound], 4)
        expected = shard_with(nodes, [(a, 0, placement.node, ())], start_times={"a": 1000.0})
    shard.apply_reply(reply)
    assert shard.inflight == {}
    assert arrays_view(shard.state) == arrays_view(expected.state)


@pytest.mark.parametrize("n2_used", ["0", "1", "2", "3", "4"])
def test_a_units_stale_task_is_not_proposed_back_into_its_old_slot(n2_used: str) -> None:
    # This view still shows a/0 on n1, but the binder released it (evicted: its preemptor now holds
    # that room). The retry must not count on n1's room, whatever n2's load, or it comes back as a
    # refused proposal (a conflict) from every shard that has not heard of the eviction yet.
    nodes = [make_node("n1").cpu("8").build(), make_node("n2").cpu("8").build()]
    a = make_job("a").cpu("4").build()
    residents = [(a, 0, "n1", ())]
    if n2_used != "0":
        residents.append((make_job("b").cpu(n2_used).build(), 0, "n2", ()))
    shard = shard_with(nodes, residents)
    out = run_units(shard, [a])
    assert [p.node for p in out.proposals[0].placements] == ["n2"]


def test_a_unit_whose_only_room_is_its_stale_slot_waits_for_a_fresh_view() -> None:
    from gosched.binder.state import arrays_view

    nodes = [make_node("n1").cpu("8").build(), make_node("n2").cpu("8").build()]
    a = make_job("a").cpu("4").build()
    full = make_job("full").cpu("6").build()
    shard = shard_with(nodes, [(a, 0, "n1", ()), (full, 0, "n2", ())])
    before = arrays_view(shard.state)
    out = run_units(shard, [a])
    assert out.proposals == [] and [u.job_id for u in out.unschedulable] == ["a"]
    assert arrays_view(shard.state) == before and shard.inflight == {}


def test_a_failed_attempt_puts_the_stale_resident_back() -> None:
    from gosched.binder.state import arrays_view

    nodes = [make_node("n1").cpu("8").build()]
    gang = make_job("g").cpu("6").replicas(2).min_member(2).build()
    shard = shard_with(nodes, [(gang, 0, "n1", ())])
    before = arrays_view(shard.state)
    out = run_units(shard, [gang])  # both tasks do not fit on one 8-CPU node
    assert out.proposals == []
    assert arrays_view(shard.state) == before and shard.inflight == {}


def test_a_shard_that_knows_no_node_yet_answers_unschedulable() -> None:
    """Before its first sync a shard's view is empty: the unit comes back unschedulable, no crash."""
    shard = shard_with([])
    batch = run_units(shard, [make_job("early").cpu("1").build()])
    assert not batch.proposals
    assert [u.job_id for u in batch.unschedulable] == ["early"]
    assert batch.unschedulable[0].diagnosis.total_nodes == 0


# -- settling a reply: a unit bound as planned stays in the view -------------------------------------
@pytest.mark.parametrize(
    ("answer", "bound_indexes"),
    [
        ("all bound", (0, 1)),  # kept as assumed; the binder's records (start time 2000) swapped in
        ("one dropped", (0,)),  # undone, then the binder's one binding applied
        ("rejected", ()),  # undone, nothing applied
    ],
)
def test_a_settled_reply_leaves_the_view_equal_to_the_binders_changes(
    answer: str, bound_indexes: tuple[int, ...]
) -> None:
    from gosched.binder.state import arrays_view
    from gosched.common.messages import AcceptedUnit, BindReply, RejectedUnit, TaskBound

    nodes = [make_node("n1").cpu("8").gpus(2).build(), make_node("n2").cpu("8").gpus(2).build()]
    gang = make_job("g").cpu("2").gpus(1).replicas(2).min_member(1).build()
    shard = shard_with(nodes)
    (proposal,) = run_units(shard, [gang]).proposals
    by_index = {p.task_index: p for p in proposal.placements}
    assert sorted(by_index) == [0, 1]
    kept = [by_index[i] for i in bound_indexes]
    changes: list = [TaskBound(p.node, Resident.for_task(gang, p.task_index, p.gpus, 2000.0)) for p in kept]
    dropped = tuple(i for i in (0, 1) if i not in bound_indexes)
    accepted = [AcceptedUnit.of("g", 0, kept, 2000.0)] if kept else []
    rejected = [RejectedUnit("g", dropped, "gpu taken", "gpus_free")] if dropped else []
    shard.apply_reply(BindReply(accepted, rejected, [], changes, len(nodes) + len(changes)))

    expected = shard_with(
        nodes, [(gang, p.task_index, p.node, p.gpus) for p in kept], start_times={"g": 2000.0}
    )
    assert shard.inflight == {}
    assert arrays_view(shard.state) == arrays_view(expected.state)


@pytest.mark.parametrize("seed", range(4))
def test_changes_beside_the_assumptions_apply_on_top_as_they_would_underneath(seed: int) -> None:
    """sync() skips undoing and redoing live attempts when no change names a task they placed or
    evicted: the view must come out exactly as by the careful path (undo, apply, redo)."""
    import copy
    import random

    from gosched.binder.state import arrays_view
    from gosched.common.changes import apply_changes
    from gosched.common.messages import TaskBound, TaskReleased
    from gosched.scheduler_shard import shard as shard_module

    rng = random.Random(seed)
    nodes = [make_node(f"n{i}").cpu("16").mem("64Gi").gpus(4).build() for i in range(6)]
    running = [make_job(f"r{i}").cpu("2").mem("1Gi").priority(rng.randint(0, 5)).build() for i in range(10)]
    shard = shard_with(nodes, [(j, 0, rng.choice(nodes).name, ()) for j in running])
    pending = [make_job(f"p{i}").cpu("1").mem("1Gi").gpus(rng.choice([0, 1])).build() for i in range(8)]
    run_units(shard, pending)  # live assumptions
    assert len(shard.inflight) == 8
    newcomers = [make_job(f"x{i}").cpu("1").gpus(1).priority(rng.randint(0, 5)).build() for i in range(5)]
    changes: list = [TaskReleased(j.id + "/0", "succeeded") for j in rng.sample(running, 4)]
    changes += [
        TaskBound(rng.choice(nodes).name, Resident.for_task(j, 0, ((3, 1000),), 5.0)) for j in newcomers
    ]
    rng.shuffle(changes)

    careful = copy.deepcopy(shard)
    live = list(careful.inflight.values())
    for ctx in reversed(live):
        ctx.undo(careful.state)
    apply_changes(careful.state, changes)
    for ctx in live:
        ctx.redo(careful.state)

    assert not shard_module._touches_assumptions(list(shard.inflight.values()), changes)
    shard.sync(changes, version=99)
    assert arrays_view(shard.state) == arrays_view(careful.state)
    n = shard.state.n
    assert (shard.state.min_victim_priority[:n] == careful.state.min_victim_priority[:n]).all()


def test_a_change_naming_an_assumed_task_takes_the_careful_path() -> None:
    from gosched.common.messages import NodeRemoved, TaskBound, TaskReleased
    from gosched.scheduler_shard import shard as shard_module

    nodes = [make_node("n1").cpu("8").build(), make_node("n2").cpu("4").build()]
    victim = make_job("v").cpu("8").priority(0).build()
    other = make_job("o").cpu("1").build()
    shard = shard_with(nodes, [(victim, 0, "n1", ()), (other, 0, "n2", ())])
    hi = make_job("hi").cpu("8").priority(100).build()
    (proposal,) = run_units(shard, [hi]).proposals
    assert proposal.placements[0].victims == ("v/0",)  # the attempt evicted v/0 in the view
    live = list(shard.inflight.values())
    assert shard_module._touches_assumptions(live, [TaskReleased("v/0", "succeeded")])  # evicted
    bound = TaskBound("n1", Resident.for_task(hi, 0, (), 1.0))
    assert shard_module._touches_assumptions(live, [bound])  # placed
    assert shard_module._touches_assumptions(live, [NodeRemoved("n2")])  # any node change
    assert not shard_module._touches_assumptions(live, [TaskReleased("o/0", "succeeded")])
    assert not shard_module._touches_assumptions(live, [])


def test_an_answer_for_an_earlier_attempt_does_not_settle_the_one_held_now() -> None:
    """The job came back (attempt 1, another task) before the answer to attempt 0 was applied:
    that answer must not keep attempt 1's placement as bound, whatever their count."""
    from gosched.binder.state import arrays_view
    from gosched.common.messages import AcceptedUnit, BindReply, RejectedUnit, TaskBound, Unit, UnitBatch

    nodes = [make_node("n1").cpu("8").build(), make_node("n2").cpu("8").build()]
    job = make_job("j").cpu("4").replicas(2).min_member(1).build()
    shard = shard_with(nodes)
    (first,) = shard.schedule(UnitBatch(0, [Unit(job, (0,), 1)])).proposals
    shard.schedule(UnitBatch(0, [Unit(job, (1,), 1, attempt=1)]))  # replaces attempt 0's context
    bound = first.placements[0]
    change = TaskBound(bound.node, Resident.for_task(job, bound.task_index, bound.gpus, 5.0))
    shard.apply_reply(BindReply([AcceptedUnit.of("j", 0, [bound], 5.0)], [], [], [change], 3))
    shard.apply_reply(BindReply([], [RejectedUnit("j", (1,), "no room", "resources_fit")], [], [], 3))
    expected = shard_with(nodes, [(job, bound.task_index, bound.node, ())], start_times={"j": 5.0})
    assert arrays_view(shard.state) == arrays_view(expected.state)


@pytest.mark.parametrize("answer", ["rejected", "accepted"])
def test_a_victim_released_while_its_eviction_awaits_the_binder_stays_released(answer: str) -> None:
    """Pipelined rounds: "high" plans to evict "low"; before the binder answers, a reply for an
    earlier batch says "low" was released (another shard's preemptor took it). The eviction is
    then moot, and answering "high" must not put "low" back into the view: a resident that the
    binder no longer has would make the shard see the node full (or a GPU taken) for ever."""
    from gosched.binder.state import arrays_view
    from gosched.common.messages import AcceptedUnit, TaskBound, TaskReleased

    low = make_job("low").cpu("8").priority(1).build()
    shard = shard_with([make_node("n").cpu("8").build()], [(low, 0, "n", ())])
    out = run_units(shard, [make_job("high").cpu("8").priority(100).build()])
    (placement,) = out.proposals[0].placements
    assert placement.victims == ("low/0",)
    shard.sync([TaskReleased("low/0", "preempted")], shard.version + 1)  # the earlier batch's reply
    if answer == "rejected":
        reason = "victim low/0 is no longer bound"
        shard.apply_reply(
            BindReply([], [RejectedUnit("high", (0,), reason, "victims_valid")], [], [], shard.version)
        )
        expected = shard_with([make_node("n").cpu("8").build()])
    else:  # the binder's changes for it: its binding (the victim's release came already)
        bound = TaskBound("n", Resident.for_task(out.proposals[0].job, 0, (), 1000.0))
        accepted = AcceptedUnit.of("high", 0, [placement], 1000.0)
        reply = BindReply([accepted], [], [], [bound], shard.version + 1)
        shard.apply_reply(reply)
        job = out.proposals[0].job
        expected = shard_with(
            [make_node("n").cpu("8").build()], [(job, 0, "n", ())], start_times={"high": 1000.0}
        )
    assert "low/0" not in shard.state.task_row
    assert arrays_view(shard.state) == arrays_view(expected.state)


@pytest.mark.parametrize("order", ["plain first", "spread first", "both in one job"])
def test_anti_affinity_holds_for_its_own_group_only_whatever_shares_the_shard(order: str) -> None:
    # Groups equal but for anti-affinity (or role) must not share its verdicts in the class cache.
    nodes = [make_node(f"n{i}").cpu("8").build() for i in range(4)]
    plain = make_job("plain").cpu("1").replicas(3).build()
    spread = make_job("spread").cpu("1").replicas(3).anti_affinity("node").build()
    shard = shard_with(nodes, profile=profile_with_scores("most_allocated"))
    if order == "both in one job":
        tf = (
            make_job("tf")
            .role("ps")
            .cpu("1")
            .group("worker")
            .cpu("1")
            .replicas(3)
            .anti_affinity("node")
            .build()
        )
        placed = {p.task_index: p.node for p in run_units(shard, [tf]).proposals[0].placements}
        workers = [placed[i] for i in range(4) if tf.group_of(i).role == "worker"]
        assert len(set(workers)) == 3, placed  # one worker per node; the ps goes where it packs
        # The attempt's (row, role) pairs, which the filter reads, follow its placements.
        rows = shard.state.row_of
        roles = {0: "ps", 1: "worker", 2: "worker", 3: "worker"}
        assert shard.inflight["tf"].placed_rows == [(rows[node], roles[i]) for i, node in placed.items()]
        return
    jobs = [plain, spread] if order == "plain first" else [spread, plain]
    out = run_units(shard, jobs)
    nodes_of = {p.job.id: sorted(pl.node for pl in p.placements) for p in out.proposals}
    assert len(set(nodes_of["spread"])) == 3  # spread, whatever came before it
    assert len(set(nodes_of["plain"])) == 1  # packed: the other job's rule is not its own
