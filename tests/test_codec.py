"""Tests of common/codec.py: exact round-trips of every model and message type, wire compactness,
corrupt input, and speed."""

import dataclasses
import enum
from types import ModuleType
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gosched.common import cluster_state, job, messages, node, resources, states
from gosched.common.cluster_state import Resident
from gosched.common.codec import (
    CodecError,
    decode,
    decode_job,
    decode_node,
    encode,
    encode_job,
    encode_many,
    encode_node,
)
from gosched.common.job import (
    AntiAffinity,
    GpuTopologyMode,
    Job,
    JobKind,
    NodeSelectorTerm,
    PreferredTerm,
    Requirement,
    SelectorOp,
    TaskPlacement,
    Toleration,
)
from gosched.common.messages import (
    AcceptedUnit,
    BindReply,
    Diagnosis,
    Eviction,
    NodeRemoved,
    NodeUpserted,
    Placement,
    Proposal,
    ProposalBatch,
    QueueFloor,
    RejectedUnit,
    TaskBound,
    TaskReleased,
    TaskUp,
    Unit,
    UnitBatch,
    Unschedulable,
)
from gosched.common.node import Gpu, Node, NodeState, NodeUsage, Taint, TaintEffect
from gosched.common.resources import ResourceRequest
from gosched.common.states import JobState, TaskState
from tests.builders import make_job, make_node
from tests.strategies import job_ids, jobs, nodes, residents

# -- fixtures: one rich value of every type ------------------------------------------------------
RICH_JOB = (
    make_job("train-1")
    .cpu("4")
    .mem("32Gi")
    .gpus(2)
    .gpu_memory(40960)
    .extended("example.com/fpga", 1)
    .gpu_model("A100", "H100")
    .selector(zone="a")
    .require("gen", "In", "ampere", "hopper")
    .require("cores", "Gt", "8")
    .prefer(50, "spot", "DoesNotExist")
    .tolerate("dedicated", "gpu", "NoSchedule")
    .tolerate(exists=True)
    .anti_affinity("node", app="db")
    .replicas(4)
    .group("ps")
    .cpu("500m")
    .gpu_share(250)
    .command("python", "ps.py", "--port", "2222")
    .priority(-5)
    .min_member(5)
    .queue("batch")
    .tenant("team-a")
    .deadline(1.9e9)
    .preemptible(False)
    .labels(team="vision", app="train")
    .disruption_budget(1)
    .submitted(1.7e9)
    .build()
)
RICH_NODE = (
    make_node("gpu-1")
    .gpus(8, model="H100", numa_nodes=2, nvlink_pairs=True)
    .label(zone="a", rack="r7")
    .taint("dedicated", "gpu")
    .taint("spot", effect="PreferNoSchedule")
    .extended("example.com/fpga", 2)
    .state(NodeState.DRAINING)
    .build()
)
RESIDENT = Resident(
    task_id="train-1/0",
    job_id="train-1",
    cpu_milli=4000,
    memory=32 * 2**30,
    gpus=((0, 1000), (1, 1000)),
    extended=(("example.com/fpga", 1),),
    priority=-5,
    preemptible=False,
    queue="batch",
    tenant="team-a",
    start_time=1.7e9 + 0.25,
    job_labels=(("app", "train"),),
    role="main",
    min_member=5,
)
PLACEMENT = Placement(task_index=3, node="gpu-1", gpus=((2, 1000), (3, 1000)), victims=("other/0", "other/1"))
DIAGNOSIS = Diagnosis(total_nodes=1200, ruled_out={"insufficient gpu": 1000, "taint": 200}, note="gang of 5")
UNIT = Unit(
    RICH_JOB,
    (0, 1, 2, 3, 4),
    5,
    attempt=2,
    reclaim_from=frozenset({"batch", "dev"}),
    dispatch_time=3.5,
    floors=(QueueFloor("prod", 4000, 2**34, None),),
)

VALUES: list[tuple[str, object]] = [
    ("QueueFloor", QueueFloor("prod", None, 1, 2000)),
    ("ResourceRequest", ResourceRequest(1, 2, 3, 0, 4, (("a", 1), ("b", 2)))),
    ("Requirement", Requirement("cores", SelectorOp.GT, ("8",))),
    ("Requirement-no-values", Requirement("spot", SelectorOp.EXISTS)),
    ("NodeSelectorTerm", NodeSelectorTerm((Requirement("a", SelectorOp.IN, ("x", "y")),))),
    ("PreferredTerm", PreferredTerm(7, NodeSelectorTerm((Requirement("a", SelectorOp.NOT_IN, ("x",)),)))),
    ("Toleration", Toleration("k", "Equal", "v", TaintEffect.NO_EXECUTE)),
    ("Toleration-any-effect", Toleration("", "Exists")),
    ("AntiAffinity", AntiAffinity("zone", (("app", "db"),))),
    ("TaskGroup", RICH_JOB.groups[0]),
    ("Job", RICH_JOB),
    ("Job-minimal", make_job("j").cpu(1).build()),
    ("TaskPlacement", TaskPlacement("gpu-1", ((0, 500),))),
    ("Taint", Taint("k", "v", TaintEffect.PREFER_NO_SCHEDULE)),
    ("Gpu", Gpu(3, "GPU-x", "A100", 81920, 1, (2, 5))),
    ("Node", RICH_NODE),
    ("Node-cpu-only", make_node("cpu-1").build()),
    ("NodeUsage", NodeUsage(1000, 2**30, [0, 500, 1000])),
    ("Resident", RESIDENT),
    ("Unit", UNIT),
    ("UnitBatch", UnitBatch(3, [UNIT, Unit(make_job("j2").cpu(1).build(), (0,), 1)])),
    ("Placement", PLACEMENT),
    ("Proposal", Proposal(RICH_JOB, [PLACEMENT, Placement(0, "n2")], 5, attempt=1, dispatch_time=2.0)),
    ("Diagnosis", DIAGNOSIS),
    ("Unschedulable", Unschedulable("j", (0, 1), DIAGNOSIS, attempt=4)),
    (
        "ProposalBatch",
        ProposalBatch(1, 42, [Proposal(RICH_JOB, [PLACEMENT], 1)], [Unschedulable("j", (0,), DIAGNOSIS)]),
    ),
    ("NodeUpserted", NodeUpserted(RICH_NODE)),
    ("NodeRemoved", NodeRemoved("gpu-1")),
    ("TaskBound", TaskBound("gpu-1", RESIDENT)),
    ("TaskReleased", TaskReleased("train-1/0", "preempted")),
    ("TaskUp", TaskUp("train-1/0")),
    ("AcceptedUnit", AcceptedUnit.of("train-1", 0, [PLACEMENT], 1.7e9)),
    ("RejectedUnit", RejectedUnit("train-1", (0, 1), "GPU 2 is not free", "gpu")),
    ("Eviction", Eviction("other/0", "other", 0, "train-1")),
    (
        "BindReply",
        BindReply(
            accepted=[AcceptedUnit.of("train-1", 0, [PLACEMENT], 1.0)],
            rejected=[RejectedUnit("j", (0,), "r", "s")],
            evicted=[Eviction("other/0", "other", 0, "train-1")],
            changes=[
                NodeUpserted(RICH_NODE),
                TaskBound("gpu-1", RESIDENT),
                TaskReleased("other/0", "preempted"),
                NodeRemoved("old"),
            ],
            version=99,
            resync=True,
        ),
    ),
    ("BindReply-empty", BindReply([], [], [], [], 0)),
    # enums and plain data at the top level
    ("SelectorOp", SelectorOp.DOES_NOT_EXIST),
    ("JobKind", JobKind.SERVICE),
    ("TaintEffect", TaintEffect.NO_SCHEDULE),
    ("NodeState", NodeState.NOT_READY),
    ("TaskState", TaskState.PREEMPTED),
    ("JobState", JobState.RUNNING),
    ("GpuTopologyMode", GpuTopologyMode.SINGLE_NUMA_NVLINK),
    ("None", None),
    ("bool", True),
    ("int", -(2**63)),
    ("uint64", 2**64 - 1),
    ("float", 0.1),
    ("str", "héllo ✓"),
    ("bytes", b"\x00\xff"),
    ("list", [1, "a", None]),
    ("tuple", (1, "a", None)),
    ("empty-tuple", ()),
    ("nested-tuples", ((1, 2), [3, (4,)])),
    ("frozenset", frozenset({"a", "b"})),
    ("set", {1, 2}),
    ("dict", {"a": 1, "b": [2]}),
    ("dict-odd-keys", {1: "x", (2, "y"): "z", TaskState.BOUND: 3, None: 0}),
    ("list-of-changes", [NodeRemoved("a"), TaskReleased("t/0", "lost")]),
    ("dict-of-jobs", {"train-1": RICH_JOB}),
]


def _same(a: object, b: object) -> bool:
    """Equal, and of the same types all the way down (so a tuple never comes back as a list)."""
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a):
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())  # type: ignore[attr-defined,index]
    return a == b


@pytest.mark.parametrize("value", [v for _, v in VALUES], ids=[name for name, _ in VALUES])
def test_round_trip(value: object) -> None:
    data = encode(value)
    assert isinstance(data, bytes)
    back = decode(data)
    assert back == value
    assert _same(back, value)


def _dataclasses_in(module: ModuleType) -> set[type]:
    return {
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__
    }


def test_every_model_and_message_type_is_covered() -> None:
    covered = {type(v) for _, v in VALUES}
    wanted = set().union(*(_dataclasses_in(m) for m in (job, node, resources, messages, cluster_state)))
    wanted.discard(cluster_state.ClusterArrays)  # numpy arrays: never sent, rebuilt from changes
    assert wanted - covered == set()
    enums = {
        obj
        for m in (job, node, states)
        for obj in vars(m).values()
        if isinstance(obj, type) and issubclass(obj, enum.Enum) and obj.__module__ == m.__name__
    }
    assert enums - covered == set()


def test_tuple_fields_come_back_as_tuples_and_lists_as_lists() -> None:
    reply = decode(encode(dict(VALUES)["BindReply"]))
    assert isinstance(reply, BindReply)
    assert type(reply.accepted) is list
    assert type(reply.accepted[0].task_indexes) is tuple
    assert type(reply.accepted[0].victims[0]) is tuple  # PLACEMENT named victims
    unit = decode(encode(UNIT))
    assert isinstance(unit, Unit)
    assert type(unit.reclaim_from) is frozenset
    assert type(unit.job.groups[0].tolerations) is tuple
    usage = decode(encode(NodeUsage(1, 2, [3])))
    assert isinstance(usage, NodeUsage)
    assert type(usage.gpu_used_milli) is list


def test_enums_come_back_as_members() -> None:
    back = decode_job(encode_job(RICH_JOB))
    assert back.kind is JobKind.BATCH
    assert back.groups[0].required_affinity[0].requirements[0].op is SelectorOp.IN
    assert back.groups[0].tolerations[0].effect is TaintEffect.NO_SCHEDULE
    assert back.groups[0].tolerations[1].effect is None
    assert decode_node(encode_node(RICH_NODE)).state is NodeState.DRAINING


def test_typed_helpers() -> None:
    assert decode_job(encode_job(RICH_JOB)) == RICH_JOB
    assert decode_node(encode_node(RICH_NODE)) == RICH_NODE
    assert encode_job(RICH_JOB) == encode(RICH_JOB)
    with pytest.raises(CodecError, match="expected an encoded Job, got Node"):
        decode_job(encode_node(RICH_NODE))
    with pytest.raises(CodecError, match="expected an encoded Node, got str"):
        decode_node(encode("gpu-1"))


def test_wire_format_is_positional() -> None:
    data = encode(Taint("dedicated", "gpu", TaintEffect.NO_EXECUTE))
    tag, *fields = msgpack.unpackb(data)
    assert isinstance(tag, int)
    assert fields == ["dedicated", "gpu", "NoExecute"]
    assert b"tenant" not in encode(RICH_JOB)  # no field names on the wire
    assert len(encode(make_job("j").cpu(1).build())) < 90  # a minimal job: ~85 bytes


def test_older_data_without_trailing_fields_gets_defaults() -> None:
    tag, *fields = msgpack.unpackb(encode(Placement(3, "n1", ((0, 1000),), ("x/0",))))
    older = msgpack.packb([tag, *fields[:2]])  # written before gpus and victims existed
    assert decode(older) == Placement(3, "n1")


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never used in msgpack
        encode(RICH_JOB)[:-5],  # truncated
        encode(RICH_JOB) + b"\x00",  # trailing bytes
        msgpack.packb([127, 1, 2]),  # unknown tag
        msgpack.packb([5, 1]),  # unknown marker
        msgpack.packb([4, 99, "x"]),  # unknown enum tag
        msgpack.packb([4, 1, "Near"]),  # unknown enum value
        msgpack.packb([]),
        msgpack.packb([["x"]]),
    ],
    ids=[
        "empty",
        "reserved-byte",
        "truncated",
        "trailing",
        "unknown-tag",
        "unknown-marker",
        "unknown-enum",
        "bad-enum-value",
        "empty-array",
        "array-head",
    ],
)
def test_corrupt_data_raises_codec_error(data: bytes) -> None:
    with pytest.raises(CodecError):
        decode(data)


@pytest.mark.parametrize(
    "value",
    [object(), cluster_state.ClusterArrays(capacity=1), [1, object()], {"k": 1j}, Taint(object()), 2**64],  # type: ignore[arg-type]
    ids=["object", "cluster-arrays", "nested-object", "complex", "wrong-field-type", "int-too-large"],
)
def test_unencodable_values_raise_codec_error(value: Any) -> None:
    with pytest.raises(CodecError, match="cannot encode"):
        encode(value)


def test_10000_jobs_round_trip() -> None:
    # No wall-clock bound here: it failed on a loaded 2-core machine (2.36 s for a 2 s bound), and
    # speed is measured by the benchmarks (admission and restore decode every job), not by tests.
    many = [replace_id(RICH_JOB, f"train-{i}") for i in range(10_000)]
    blobs = [encode_job(j) for j in many]
    assert len(set(blobs)) == len(many)
    assert [decode_job(b) for b in blobs] == many


def replace_id(j: Job, job_id: str) -> Job:
    return dataclasses.replace(j, id=job_id)


# -- generated values ------------------------------------------------------------------------------
placements = st.builds(
    Placement,
    task_index=st.integers(0, 1000),
    node=st.text(max_size=10),
    gpus=st.lists(st.tuples(st.integers(0, 15), st.integers(1, 1000)), max_size=3).map(tuple),
    victims=st.lists(st.text(max_size=10), max_size=3).map(tuple),
)
changes = st.one_of(
    st.builds(NodeUpserted, nodes),
    st.builds(NodeRemoved, st.text(max_size=10)),
    st.builds(TaskBound, st.text(max_size=10), residents),
    st.builds(TaskReleased, st.text(max_size=10), st.sampled_from(["preempted", "succeeded", "lost"])),
    st.builds(TaskUp, st.text(max_size=10)),
)
bind_replies = st.builds(
    BindReply,
    accepted=st.lists(
        st.builds(
            AcceptedUnit.of,
            job_ids,
            st.integers(0, 9),
            st.lists(placements, max_size=3),
            st.floats(allow_nan=False),
        ),
        max_size=3,
    ),
    rejected=st.lists(
        st.builds(RejectedUnit, job_ids, st.lists(st.integers(0, 99)).map(tuple), st.text(), st.text()),
        max_size=2,
    ),
    evicted=st.lists(st.builds(Eviction, st.text(), job_ids, st.integers(0, 99), st.text()), max_size=2),
    changes=st.lists(changes, max_size=4),
    version=st.integers(0, 2**63 - 1),
    resync=st.booleans(),
)
unit_batches = st.builds(
    UnitBatch,
    shard_id=st.integers(0, 255),
    units=st.lists(
        st.builds(
            Unit,
            job=jobs(),
            task_indexes=st.lists(st.integers(0, 100), max_size=5).map(tuple),
            min_needed=st.integers(0, 100),
            attempt=st.integers(0, 10),
            reclaim_from=st.frozensets(st.text(max_size=5), max_size=3),
            dispatch_time=st.floats(allow_nan=False),
        ),
        max_size=2,
    ),
)


@settings(max_examples=200, deadline=None)
@given(jobs())
def test_job_round_trip_generated(j: Job) -> None:
    back = decode_job(encode_job(j))
    assert back == j
    assert _same(back, j)


@settings(max_examples=200, deadline=None)
@given(nodes)
def test_node_round_trip_generated(n: Node) -> None:
    assert _same(decode_node(encode_node(n)), n)


@settings(max_examples=100, deadline=None)
@given(st.one_of(bind_replies, unit_batches))
def test_message_round_trip_generated(message: object) -> None:
    assert _same(decode(encode(message)), message)


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.one_of(
            st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False), st.text()
        ),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.lists(inner, max_size=3).map(tuple),
            st.dictionaries(st.text(max_size=5), inner, max_size=3),
            st.frozensets(st.text(max_size=5), max_size=3),
        ),
        max_leaves=20,
    )
)
def test_plain_data_round_trip_generated(value: object) -> None:
    assert _same(decode(encode(value)), value)


def test_a_shared_group_encodes_as_a_fresh_one_would() -> None:
    # The codec remembers the encoding of shared task groups by identity (the dispatcher interns
    # them): the bytes must not depend on whether the group was seen before, nor leak from an
    # equal-looking but different group.
    first = make_job("a").cpu("2").gpus(1).replicas(2).build()
    shared = dataclasses.replace(first, id="b")  # the same group object
    other = make_job("c").cpu("3").gpus(1).replicas(2).build()
    fresh = [encode_job(j) for j in (first, shared, other)]
    again = [encode_job(j) for j in (first, shared, other)]
    assert again == fresh
    assert decode_job(again[1]) == shared and decode_job(again[2]) == other
    rebuilt = dataclasses.replace(shared, groups=tuple(dataclasses.replace(g) for g in shared.groups))
    assert encode_job(rebuilt) == again[1]  # equal groups, other objects: same bytes


def test_encode_many_gives_the_bytes_encode_gives_each() -> None:
    # One packer for a whole batch (the store encodes every job submitted): no state of one
    # object's packing may reach the next one's bytes.
    jobs = [make_job(f"j{i}").cpu(str(i + 1)).replicas(i + 1).build() for i in range(3)]
    values: list[object] = [*jobs, jobs[0], {"a": (1, 2)}, [frozenset({"x"})], JobState.RUNNING, None]
    assert encode_many(values) == [encode(v) for v in values]
    assert encode_many([]) == []
    for bad in (object(), 2**70):  # an unregistered class; msgpack's own refusal
        with pytest.raises(CodecError) as many:
            encode_many([jobs[0], bad])
        with pytest.raises(CodecError) as one:
            encode(bad)
        assert str(many.value) == str(one.value)  # encode's error, naming what failed
