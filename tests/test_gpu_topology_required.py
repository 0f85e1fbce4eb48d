"""The required GPU topology modes (TaskGroup.gpu_topology: single-numa, single-numa-nvlink) end to
end: the spec, the gRPC types, the store's codec, the shard's filters and GPU choice (preemption
included), "why pending", the binder against a stale view, and the in-process pipeline."""

import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gosched.api import convert
from gosched.cli.submit_spec import JobFlags, flag_for
from gosched.common.cluster_state import ClusterArrays, Resident
from gosched.common.codec import decode, encode
from gosched.common.config import Settings
from gosched.common.errors import SpecError
from gosched.common.job import GpuTopologyMode, Job
from gosched.common.messages import Unit, UnitBatch
from gosched.common.node import Gpu, Node
from gosched.common.spec import job_from_spec, job_to_spec
from gosched.common.states import TaskState
from gosched.proto.v1 import types_pb2 as pb
from gosched.runtime.pipeline import Pipeline
from gosched.runtime.simulation import hgx_node, sim_nodes
from gosched.scheduler_shard.framework.task_class import class_of
from gosched.scheduler_shard.gpu_assign import choose_gpus, rule_fits
from gosched.scheduler_shard.plugins.gpu_topology import GpuTopologyFit, GpuTopologyHardware
from tests.builders import make_job
from tests.shard_helpers import run_units, shard_with
from tests.test_binder import commit, open_binder, outcome

PREFERRED = GpuTopologyMode.PREFERRED
SINGLE = GpuTopologyMode.SINGLE_NUMA
NVLINK = GpuTopologyMode.SINGLE_NUMA_NVLINK
FIELD = "groups[0].gpu_topology"


def topo_job(
    job_id: str,
    gpus: int,
    mode: GpuTopologyMode,
    *,
    share: int = 0,
    models: tuple[str, ...] = (),
    gpu_memory_mib: int = 0,
    priority: int = 0,
    preemptible: bool = True,
) -> Job:
    b = make_job(job_id).cpu(1).priority(priority).preemptible(preemptible)
    b = b.gpu_share(share) if share else b.gpus(gpus)
    if models:
        b = b.gpu_model(*models)
    if gpu_memory_mib:
        b = b.gpu_memory(gpu_memory_mib)
    job = b.build()
    return replace(job, groups=(replace(job.groups[0], gpu_topology=mode),))


def numa_of(node: Node) -> dict[int, int]:
    return {g.index: g.numa_node for g in node.gpus}


def linked(node: Node, gpus: set[int]) -> bool:
    """Whether `gpus` reach each other over NVLink links among themselves."""
    peers = {g.index: set(g.nvlink_peers) & gpus for g in node.gpus}
    start = min(gpus)
    seen, todo = {start}, [start]
    while todo:
        for p in peers[todo.pop()] - seen:
            seen.add(p)
            todo.append(p)
    return seen == gpus


def keeps_rule(node: Node, gpus: set[int], mode: GpuTopologyMode) -> bool:
    numas = {numa_of(node)[g] for g in gpus}
    if mode is PREFERRED or len(gpus) < 2:
        return True
    one_numa = len(numas) == 1 and min(numas) >= 0
    return one_numa and (mode is not NVLINK or linked(node, gpus))


# == the spec ======================================================================================
def spec(**group: object) -> dict[str, object]:
    return {"id": "t", "groups": [{"command": "train", "cpu": 1, **group}]}


@pytest.mark.parametrize("mode", list(GpuTopologyMode))
def test_each_mode_parses_and_round_trips_through_the_spec(mode: GpuTopologyMode) -> None:
    job = job_from_spec(spec(gpus=4, gpu_topology=mode.value))
    assert job.groups[0].gpu_topology is mode
    again = job_to_spec(job)
    assert again["groups"][0].get("gpu_topology", "preferred") == mode.value  # type: ignore[index]
    assert ("gpu_topology" in again["groups"][0]) is (mode is not PREFERRED)  # type: ignore[index]
    assert job_from_spec(again) == job


def test_the_default_is_preferred_and_the_flat_form_takes_the_field() -> None:
    assert job_from_spec(spec(gpus=2)).groups[0].gpu_topology is PREFERRED
    flat = job_from_spec({"id": "f", "command": "x", "gpus": 2, "gpu_topology": "single-numa"})
    assert flat.groups[0].gpu_topology is SINGLE


@pytest.mark.parametrize(
    ("group", "reason"),
    [
        ({"gpus": 2, "gpu_topology": "nvlink"}, "must be one of preferred, single-numa, single-numa-nvlink"),
        ({"gpus": 2, "gpu_topology": "single_numa"}, "must be one of preferred, single-numa"),
        ({"gpus": 2, "gpu_topology": 1}, "got an integer (1)"),
        ({"gpus": 2, "gpu_topology": None}, "got null"),
        ({"gpu_topology": "single-numa"}, "single-numa needs a GPU request (gpus, gpu_share or gpu_milli)"),
        ({"gpu_topology": "single-numa-nvlink"}, "single-numa-nvlink needs a GPU request"),
    ],
)
def test_a_bad_gpu_topology_is_an_error_naming_the_field(group: dict[str, object], reason: str) -> None:
    with pytest.raises(SpecError) as err:
        job_from_spec(spec(**group))
    assert err.value.field == FIELD
    assert reason in str(err.value)


@pytest.mark.parametrize("group", [{"gpus": 1}, {"gpus": "0.5"}, {"gpu_milli": 250}, {"gpus": 8}])
def test_a_required_mode_is_accepted_on_any_gpu_request(group: dict[str, object]) -> None:
    # One GPU or a share of one is on one NUMA node by itself: accepted, and the rule idle for it.
    job = job_from_spec(spec(gpu_topology="single-numa-nvlink", **group))
    g = job.groups[0]
    assert g.gpu_topology is NVLINK
    assert g.gpu_topology_rule is (NVLINK if g.resources.gpus >= 2 else PREFERRED)


def test_preferred_on_a_cpu_task_is_accepted_as_the_default_is() -> None:
    assert job_from_spec(spec(gpu_topology="preferred")).groups[0].gpu_topology is PREFERRED


def test_the_mode_splits_task_classes_only_where_it_binds() -> None:
    two = [topo_job("a", 2, m).groups[0] for m in GpuTopologyMode]
    assert len({g.constraint_key() for g in two}) == 3
    one = [topo_job("b", 1, m).groups[0] for m in GpuTopologyMode]
    assert len({g.constraint_key() for g in one}) == 1


def test_the_submit_flag_sets_the_field_and_errors_name_the_flag() -> None:
    flags = JobFlags(command=("x",), gpus="2", gpu_topology="single-numa")
    assert flags.task_fields()["gpu_topology"] == "single-numa"
    assert flag_for(FIELD.removeprefix("groups[0].")) == "--gpu-topology"


# == gRPC types and the store =====================================================================
@pytest.mark.parametrize("mode", list(GpuTopologyMode))
def test_the_mode_round_trips_through_proto(mode: GpuTopologyMode) -> None:
    job = topo_job("p", 4, mode)
    msg = convert.job_to_proto_spec(job)
    assert msg.groups[0].gpu_topology == ("" if mode is PREFERRED else mode.value)
    again = pb.JobSpec.FromString(msg.SerializeToString())
    assert convert.job_from_proto(again) == job
    assert convert.job_from_proto(convert.job_spec_from_dict(job_to_spec(job))) == job


def test_a_bad_mode_in_proto_is_a_spec_error_naming_the_field() -> None:
    msg = convert.job_to_proto_spec(topo_job("p", 2, SINGLE))
    msg.groups[0].gpu_topology = "numa"
    with pytest.raises(SpecError) as err:
        convert.job_from_proto(msg)
    assert err.value.field == FIELD


def test_the_store_keeps_the_mode_and_reads_older_groups_as_preferred() -> None:
    job = topo_job("s", 4, NVLINK)
    assert decode(encode(job)) == job
    assert decode(encode(job)).groups[0].gpu_topology is NVLINK
    tag, *fields = msgpack.unpackb(encode(job.groups[0]))
    older = msgpack.packb([tag, *fields[:-1]])  # a group stored before the field existed
    assert decode(older) == replace(job.groups[0], gpu_topology=PREFERRED)


# == the shard: table-driven scenarios =============================================================
A100, H100 = "A100", "H100"
GIB_MIB = 1024


def custom_node(name: str, gpus: list[tuple[str, int, int]], pairs: bool = True) -> Node:
    """GPUs as (model, NUMA node, memory GiB), NVLinked in pairs (0-1, 2-3, ...) with `pairs`."""
    n = len(gpus)
    return Node(
        name=name,
        cpu_milli=64_000,
        memory=512 * 2**30,
        gpus=tuple(
            Gpu(
                index=i,
                model=model,
                numa_node=numa,
                memory_mib=mem * GIB_MIB,
                nvlink_peers=(i ^ 1,) if pairs and (i ^ 1) < n else (),
            )
            for i, (model, numa, mem) in enumerate(gpus)
        ),
    )


HGX = hgx_node("hgx")
HGX_B = hgx_node("hgx-b")
HGX_VM = hgx_node("hgx-vm", numa_known=False)
PAIRS = sim_nodes(1, prefix="pairs")[0]  # 8 A100, NUMA 0: 0-3, 1: 4-7, NVLink pairs 0-1, 2-3, ...
# H100s 0,1 (NUMA 0) and 4,5 (NUMA 1); A100s 2,3 (NUMA 0) and 6,7 (NUMA 1)
MIXED = custom_node(
    "mixed", [(H100, 0, 80)] * 2 + [(A100, 0, 80)] * 2 + [(H100, 1, 80)] * 2 + [(A100, 1, 80)] * 2
)
# 40 GiB GPUs on NUMA 0, 80 GiB ones on NUMA 1
MEMORY = custom_node("memory", [(A100, 0, 40)] * 4 + [(A100, 1, 80)] * 4)
# 80 GiB GPUs 0-3 (NUMA 0) and 4-5 (NUMA 1); 40 GiB GPUs 6-7 (NUMA 1)
MEMORY_2 = custom_node("memory-2", [(A100, 0, 80)] * 4 + [(A100, 1, 80)] * 2 + [(A100, 1, 40)] * 2)

BUSY = make_job("busy").cpu(1).gpus(1).replicas(16).preemptible(False).build()
LOW = make_job("low").cpu(1).gpus(1).replicas(8).priority(1).build()
HALF = make_job("half").cpu(1).gpu_share(500).replicas(8).preemptible(False).build()


def held(
    node: Node, gpus: list[int], job: Job = BUSY, start: int = 0
) -> list[tuple[Job, int, str, tuple[tuple[int, int], ...]]]:
    """Tasks of `job` (from its task `start` on) holding `gpus` of `node`, one GPU (or share) each."""
    milli = job.groups[0].resources.gpu_milli or 1000
    return [(job, start + i, node.name, ((g, milli),)) for i, g in enumerate(gpus)]


@dataclass
class Scenario:
    nodes: list[Node]
    job: Job
    running: list[tuple[Job, int, str, tuple[tuple[int, int], ...]]] = field(default_factory=list)
    node: str | None = None  # where the task goes; None: it waits
    gpus: set[int] | None = None  # exactly these GPUs (None: any set keeping the rule)
    reason: str = ""  # waiting: the reason "why pending" gives (for every node here)
    victims: set[str] | None = None


def r(what: str, mode: GpuTopologyMode) -> str:
    return f"{what} (gpu_topology: {mode.value})"


SCENARIOS = {
    "single-numa: the NUMA node with room": Scenario(
        [HGX], topo_job("t", 3, SINGLE), held(HGX, [0, 1, 4]), node="hgx", gpus={5, 6, 7}
    ),
    "preferred: spreads when no NUMA node has room (today's behaviour)": Scenario(
        [HGX], topo_job("t", 4, PREFERRED), held(HGX, [0, 1, 4, 5]), node="hgx", gpus={2, 3, 6, 7}
    ),
    "single-numa: waits when only a spread set is free": Scenario(
        [HGX],
        topo_job("t", 4, SINGLE),
        held(HGX, [0, 1, 4, 5]),
        reason=r("insufficient free GPUs on one NUMA node", SINGLE),
    ),
    "single-numa: the node whose NUMA node has room, not the spread one": Scenario(
        [HGX, HGX_B],
        topo_job("t", 4, SINGLE),
        held(HGX, [0, 1, 4, 5]) + held(HGX_B, [0, 1, 2], start=4),
        node="hgx-b",
        gpus={4, 5, 6, 7},
    ),
    "single-numa: 8 GPUs never fit a 2-socket node": Scenario(
        [HGX], topo_job("t", 8, SINGLE), reason=r("too few GPUs on one NUMA node", SINGLE)
    ),
    "preferred: 8 GPUs take the whole node": Scenario(
        [HGX], topo_job("t", 8, PREFERRED), node="hgx", gpus=set(range(8))
    ),
    "nvlink on NVSwitch: four on one socket": Scenario([HGX], topo_job("t", 4, NVLINK), node="hgx"),
    "nvlink on NVSwitch: 8 never fit a 2-socket node": Scenario(
        [HGX], topo_job("t", 8, NVLINK), reason=r("too few NVLinked GPUs on one NUMA node", NVLINK)
    ),
    "nvlink on pairs: the free linked pair": Scenario(
        [PAIRS], topo_job("t", 2, NVLINK), held(PAIRS, [0, 2, 5]), node=PAIRS.name, gpus={6, 7}
    ),
    "single-numa on pairs: an unlinked pair on one NUMA node will do": Scenario(
        [PAIRS], topo_job("t", 2, SINGLE), held(PAIRS, [0, 2, 5, 7]), node=PAIRS.name
    ),
    "nvlink on pairs: waits while no linked pair is free": Scenario(
        [PAIRS],
        topo_job("t", 2, NVLINK),
        held(PAIRS, [0, 2, 5, 7]),
        reason=r("insufficient free NVLinked GPUs on one NUMA node", NVLINK),
    ),
    "nvlink on pairs: 4 GPUs never link": Scenario(
        [PAIRS], topo_job("t", 4, NVLINK), reason=r("too few NVLinked GPUs on one NUMA node", NVLINK)
    ),
    "unknown NUMA: single-numa waits, saying why": Scenario(
        [HGX_VM], topo_job("t", 2, SINGLE), reason=r("GPU NUMA node unknown", SINGLE)
    ),
    "unknown NUMA: nvlink waits, saying why": Scenario(
        [HGX_VM], topo_job("t", 2, NVLINK), reason=r("GPU NUMA node unknown", NVLINK)
    ),
    "unknown NUMA: preferred is placed": Scenario([HGX_VM], topo_job("t", 2, PREFERRED), node="hgx-vm"),
    "unknown NUMA: one GPU under single-numa is placed": Scenario(
        [HGX_VM], topo_job("t", 1, SINGLE), node="hgx-vm"
    ),
    "fractional: a share under single-numa is placed (the rule is idle)": Scenario(
        [HGX_VM], topo_job("t", 0, SINGLE, share=500), node="hgx-vm"
    ),
    "fractional: shares in use leave the other NUMA node's whole GPUs": Scenario(
        [HGX], topo_job("t", 4, SINGLE), held(HGX, [0, 1], HALF), node="hgx", gpus={4, 5, 6, 7}
    ),
    "fractional: a share on each NUMA node keeps a 4-GPU task out": Scenario(
        [HGX],
        topo_job("t", 4, SINGLE),
        held(HGX, [0, 4], HALF),
        reason=r("insufficient free GPUs on one NUMA node", SINGLE),
    ),
    "models: the wanted model spread 2+2 never fits 4": Scenario(
        [MIXED], topo_job("t", 4, SINGLE, models=(H100,)), reason=r("too few GPUs on one NUMA node", SINGLE)
    ),
    "models: preferred spreads over the wanted model": Scenario(
        [MIXED], topo_job("t", 4, PREFERRED, models=(H100,)), node="mixed", gpus={0, 1, 4, 5}
    ),
    "models: two of the wanted model on one NUMA node": Scenario(
        [MIXED], topo_job("t", 2, SINGLE, models=(H100,)), held(MIXED, [0]), node="mixed", gpus={4, 5}
    ),
    "memory: the NUMA node of the big GPUs": Scenario(
        [MEMORY],
        topo_job("t", 3, SINGLE, gpu_memory_mib=80 * GIB_MIB),
        held(MEMORY, [4]),
        node="memory",
        gpus={5, 6, 7},
    ),
    "memory: small GPUs free on one NUMA node do not count": Scenario(
        [MEMORY_2],
        topo_job("t", 3, SINGLE, gpu_memory_mib=80 * GIB_MIB),
        held(MEMORY_2, [0, 1]),
        reason=r("insufficient free GPUs on one NUMA node", SINGLE),
    ),
    "preemption: evicts on one NUMA node rather than spread": Scenario(
        [HGX],
        topo_job("t", 4, SINGLE, priority=100),
        held(HGX, [0, 1, 4, 5], LOW),
        node="hgx",
        gpus={4, 5, 6, 7},
        victims={"low/2", "low/3"},  # at equal harm, the first reprieved stay
    ),
    "preemption: preferred takes the free spread set, no victim": Scenario(
        [HGX],
        topo_job("t", 4, PREFERRED, priority=100),
        held(HGX, [0, 1, 4, 5], LOW),
        node="hgx",
        gpus={2, 3, 6, 7},
        victims=set(),
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(name: str) -> None:
    sc = SCENARIOS[name]
    out = run_units(shard_with(sc.nodes, sc.running), [sc.job])
    mode = sc.job.groups[0].gpu_topology_rule
    if sc.node is None:
        assert not out.proposals
        (verdict,) = out.unschedulable
        assert verdict.diagnosis is not None
        assert verdict.diagnosis.ruled_out == {sc.reason: len(sc.nodes)}
        return
    assert not out.unschedulable
    (placement,) = out.proposals[0].placements
    assert placement.node == sc.node
    node = next(n for n in sc.nodes if n.name == sc.node)
    gpus = {g for g, _ in placement.gpus}
    assert len(gpus) == max(1, sc.job.groups[0].resources.gpus)
    assert keeps_rule(node, gpus, mode)
    if sc.gpus is not None:
        assert gpus == sc.gpus
    if sc.victims is not None:
        assert set(placement.victims) == sc.victims


def test_the_reason_is_one_a_reservation_may_wait_on_only_while_room_may_come() -> None:
    from gosched.dispatcher.reservation import room_may_come

    busy = run_units(shard_with([HGX], held(HGX, [0, 1, 4, 5])), [topo_job("t", 4, SINGLE)])
    never = run_units(shard_with([HGX]), [topo_job("t", 8, SINGLE)])
    assert room_may_come(busy.unschedulable[0].diagnosis)
    assert not room_may_come(never.unschedulable[0].diagnosis)


def test_tasks_of_one_batch_see_each_others_gpus_taken() -> None:
    # The class cache refreshes the row each placement dirties through the filter's scalar
    # version: the third 4-GPU task must not be proposed on a node whose NUMA nodes are both used.
    jobs = [topo_job(f"t{i}", 4, SINGLE) for i in range(3)]
    out = run_units(shard_with([HGX]), jobs)
    placed = [{g for g, _ in p.placements[0].gpus} for p in out.proposals]
    assert sorted(map(sorted, placed)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [u.job_id for u in out.unschedulable] == ["t2"]
    assert out.unschedulable[0].diagnosis is not None
    assert out.unschedulable[0].diagnosis.ruled_out == {"insufficient GPU": 1}


def test_a_profile_without_the_filters_still_never_spreads_a_required_task() -> None:
    # choose_gpus keeps the rule whatever the profile: the task is left unplaced, never spread.
    from gosched.common.config import MINIMAL_PROFILE

    shard = shard_with([HGX], held(HGX, [0, 1, 4, 5]), profile=MINIMAL_PROFILE)
    out = run_units(shard, [topo_job("t", 4, SINGLE)])
    assert not out.proposals and [u.job_id for u in out.unschedulable] == ["t"]


# == the filters, their scalar twin and the GPU choice agree ======================================
@st.composite
def topology_nodes(draw: st.DrawFn, name: str) -> Node:
    n = draw(st.integers(1, 10))
    numa = draw(st.lists(st.sampled_from([-1, 0, 1, 2, 7]), min_size=n, max_size=n))
    models = draw(st.lists(st.sampled_from([A100, H100]), min_size=n, max_size=n))
    edges = draw(st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=20))
    peers: dict[int, set[int]] = {i: set() for i in range(n)}
    for a, b in edges:
        if a != b:
            peers[a].add(b)
            peers[b].add(a)
    gpus = tuple(
        Gpu(index=i, model=models[i], numa_node=numa[i], memory_mib=1, nvlink_peers=tuple(sorted(peers[i])))
        for i in range(n)
    )
    return Node(name=name, cpu_milli=64_000, memory=2**36, gpus=gpus)


def brute_force(node: Node, free: set[int], k: int, mode: GpuTopologyMode) -> bool:
    return any(keeps_rule(node, set(c), mode) for c in itertools.combinations(sorted(free), k))


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    k=st.integers(2, 6),
    mode=st.sampled_from([SINGLE, NVLINK]),
    models=st.sampled_from([(), (A100,)]),
)
def test_filters_scalar_check_and_gpu_choice_agree(
    data: st.DataObject, k: int, mode: GpuTopologyMode, models: tuple[str, ...]
) -> None:
    nodes = [data.draw(topology_nodes(f"n{i}")) for i in range(data.draw(st.integers(1, 4)))]
    state = ClusterArrays()
    for node in nodes:
        state.upsert_node(node)
    busy: dict[str, set[int]] = {}
    for row, node in enumerate(nodes):
        taken = data.draw(st.sets(st.sampled_from([g.index for g in node.gpus])))
        busy[node.name] = taken
        for g in taken:
            state.place(row, Resident.for_task(BUSY, g, ((g, 1000),), 0.0))
    tc = class_of(topo_job("t", k, mode, models=models).groups[0])
    rows = np.arange(len(nodes), dtype=np.int64)
    hardware = GpuTopologyHardware().filter(tc, state, rows)
    fit = GpuTopologyFit().filter(tc, state, rows)
    for row, node in enumerate(nodes):
        usable = {g.index for g in node.gpus if not models or g.model in models}
        free = usable - busy[node.name]
        assert bool(hardware[row]) == brute_force(node, usable, k, mode)
        assert bool(fit[row]) == brute_force(node, free, k, mode) == rule_fits(tc, state, row)
        chosen = choose_gpus(tc, state, row)
        assert (chosen is not None) == bool(fit[row])
        if chosen is not None:
            gpus = {g for g, _ in chosen}
            assert len(gpus) == k and gpus <= free and keeps_rule(node, gpus, mode)


@settings(max_examples=25, deadline=None)
@given(
    plan=st.lists(
        st.tuples(st.sampled_from(list(GpuTopologyMode)), st.integers(1, 8), st.integers(0, 100)),
        min_size=1,
        max_size=14,
    ),
    vm=st.booleans(),
)
def test_every_placement_of_a_required_task_keeps_its_rule(
    plan: list[tuple[GpuTopologyMode, int, int]], vm: bool
) -> None:
    nodes = [hgx_node("h0"), hgx_node("h1", numa_known=not vm), *sim_nodes(1, prefix="p")]
    shard = shard_with(nodes)
    jobs = [topo_job(f"j{i}", k, mode, priority=prio) for i, (mode, k, prio) in enumerate(plan)]
    by_name = {n.name: n for n in nodes}
    for i in range(0, len(jobs), 4):  # several batches: later ones see (and may evict) earlier ones
        units = [Unit(j, (0,), 1) for j in jobs[i : i + 4]]
        out = shard.schedule(UnitBatch(0, units))
        for proposal in out.proposals:
            mode = proposal.job.groups[0].gpu_topology_rule
            for pl in proposal.placements:
                assert keeps_rule(by_name[pl.node], {g for g, _ in pl.gpus}, mode)


# == the binder: a plan on a stale topology ========================================================
@pytest.mark.parametrize("vectorised", [True, False], ids=["vectorised", "sequential"])
def test_a_plan_made_before_the_gpus_numa_layout_changed_is_refused(tmp_path: Path, vectorised: bool) -> None:
    """The GPU set keeps the rule on the node the shard saw; the node registers again with its GPUs
    on other NUMA nodes, where that set would span two: node_current refuses it (the binder
    trusts the shard's topology filters for the node generation they ran on), and planned again
    on the new view the task gets a set that keeps the rule there."""
    b = open_binder(tmp_path / "gs.db", vectorised=vectorised)
    b.add_nodes([hgx_node("h")])
    shard = shard_with([])
    shard.sync(*b.changes_since(0))
    job = topo_job("j", 2, SINGLE)
    batch = shard.schedule(UnitBatch(0, [Unit(job, (0,), 1)]))
    planned = {g for g, _ in batch.proposals[0].placements[0].gpus}
    interleaved = replace(
        hgx_node("h"),
        gpus=tuple(replace(g, numa_node=g.index % 2) for g in hgx_node("h").gpus),  # NUMA 0: even GPUs
    )
    assert not keeps_rule(interleaved, planned, SINGLE)
    b.add_nodes([interleaved])
    reply = b.commit(batch)
    assert [(r.job_id, r.stage) for r in reply.rejected] == [("j", "node_current")]
    shard.apply_reply(reply)
    again = shard.schedule(UnitBatch(0, [Unit(job, (0,), 1, attempt=1)]))
    gpus = {g for g, _ in again.proposals[0].placements[0].gpus}
    assert keeps_rule(interleaved, gpus, SINGLE)
    assert outcome(commit(b, *again.proposals))[0] == {"j": [0]}


# == end to end through the in-process pipeline ====================================================
def bound_gpus(p: Pipeline, task_id: str) -> tuple[str, set[int]] | None:
    state = p.binder.state
    row = state.task_row.get(task_id)
    if row is None:
        return None
    node = state.nodes[row]
    assert node is not None
    return node.name, {g for g, _ in state.residents[row][task_id].gpus}


def test_pipeline_binds_a_required_task_on_one_numa_node_or_keeps_it_waiting(tmp_path: Path) -> None:
    node = hgx_node("h100-0")
    p = Pipeline(Settings(store_path=str(tmp_path / "gs.db"), retry_backoff_s=0.0, shards=2), nodes=[node])
    p.submit_many([topo_job("a", 3, SINGLE), topo_job("b", 3, SINGLE)])
    p.run_until_idle()
    for tid in ("a/0", "b/0"):
        got = bound_gpus(p, tid)
        assert got is not None and keeps_rule(node, got[1], SINGLE)
    # One GPU free on each NUMA node: two would fit spread, not under the rule.
    p.submit(topo_job("c", 2, SINGLE))
    p.run_until_idle()
    assert p.dispatcher.task_states("c") == [TaskState.PENDING]
    assert "insufficient free GPUs on one NUMA node (gpu_topology: single-numa)" in p.dispatcher.explain("c")
    # "a" ends: its NUMA node has room again, and "c" gets two GPUs there.
    (a_numa,) = {numa_of(node)[g] for g in bound_gpus(p, "a/0")[1]}  # type: ignore[index]
    p.complete(["a/0"])
    p.run_until_idle(wait_backoff=True)
    got = bound_gpus(p, "c/0")
    assert got is not None and keeps_rule(node, got[1], SINGLE)
    assert {numa_of(node)[g] for g in got[1]} == {a_numa}
    p.close()
