"""Actor messages survive the trip through common/wire.py unchanged (frozen dataclasses included)."""

import copy
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gosched.common import wire
from gosched.common.cluster_state import Resident
from gosched.common.fast_pickle import objects_from, rows_of
from gosched.common.job import Job, Toleration
from gosched.common.messages import (
    AcceptedUnit,
    BindReply,
    ChangeList,
    Diagnosis,
    Eviction,
    NodeRemoved,
    NodeUpserted,
    Placement,
    Proposal,
    ProposalBatch,
    RejectedUnit,
    TaskBound,
    TaskReleased,
    Unit,
    UnitBatch,
    Unschedulable,
    _bind_reply,
    _proposal_batch,
    _unit_batch,
)
from gosched.common.resources import ResourceRequest
from tests.builders import make_job, make_node
from tests.strategies import jobs


def test_batches_round_trip_equal_and_hash_equal() -> None:
    jobs = [
        make_job("a").cpu("2").gpus(1).priority(100).selector(zone="z1").labels(app="web").build(),
        make_job("b").cpu("500m").tolerate("gpu").build(),
    ]
    units = UnitBatch(3, [Unit(job=j, task_indexes=(0,), min_needed=1) for j in jobs])
    back = wire.unpack(wire.pack(units))
    assert back == units
    assert [hash(u.job) for u in back.units] == [hash(j) for j in jobs]  # type: ignore[attr-defined]
    planned = ProposalBatch(3, 7, [Proposal(jobs[0], [], 1, 0, 0.0, 0)])
    assert wire.unpack(wire.pack(planned)) == planned


def test_frozen_objects_copy_and_stay_frozen() -> None:
    req = ResourceRequest(cpu_milli=1500, memory=2**30, gpus=2)
    back = wire.unpack(wire.pack(req))
    assert back == req and copy.deepcopy(req) == req and copy.copy(req) == req
    try:
        back.cpu_milli = 1  # type: ignore[attr-defined]
    except AttributeError:
        pass
    else:
        raise AssertionError("an unpickled frozen dataclass must stay frozen")


@dataclass(frozen=True)
class _ExtendedToleration(Toleration):
    extra: int = 5


def test_a_subclass_with_more_fields_keeps_them() -> None:
    tol = _ExtendedToleration("gpu", "Equal", "yes", None, extra=7)
    back = wire.unpack(wire.pack(tol))
    assert back == tol and back.extra == 7  # type: ignore[attr-defined]


def test_every_message_type_round_trips_equal() -> None:
    job = make_job("g").cpu("1").gpus(1).replicas(2).min_member(2).labels(team="x").build()
    placement = Placement(1, "n1", ((0, 1000),), ("v/0",))
    resident = Resident.for_task(job, 1, ((0, 1000),), 12.5)
    node = make_node("n1").cpu("8").gpus(2).label(zone="z1").taint("gpu", "yes").build()
    messages: list[object] = [
        Unit(job, (0, 1), 2, 3, frozenset({"q"}), 1.5, 1),
        Proposal(job, [placement], 2, 3, 1.5, 1),
        ProposalBatch(2, 9, [], [Unschedulable("g", (0,), Diagnosis(10, {"insufficient cpu": 10}, "n"), 1)]),
        BindReply(
            [AcceptedUnit.of("g", 0, [placement], 3.0)],
            [RejectedUnit("g", (0,), "why", "stage")],
            [Eviction("v/0", "v", 0, "g")],
            [
                NodeUpserted(node),
                NodeRemoved("n2"),
                TaskBound("n1", resident),
                TaskReleased("v/0", "preempted"),
            ],
            12,
            True,
        ),
    ]
    for message in messages:
        back = wire.unpack(wire.pack(message))
        assert type(back) is type(message) and back == message


# -- batches packed as columns ---------------------------------------------------------------------
gpu_pairs = st.lists(st.tuples(st.integers(0, 15), st.integers(1, 1000)), max_size=2).map(tuple)
placements = st.builds(
    Placement,
    st.integers(0, 50),
    st.sampled_from(["n1", "n2", "node-ü"]),
    gpu_pairs,
    st.lists(st.sampled_from(["v/0", "w/3"]), max_size=2).map(tuple),
)
times = st.floats(0, 4e9, allow_nan=False)


@given(
    st.lists(
        st.tuples(jobs(), st.lists(placements, max_size=3), st.integers(0, 5), times, st.integers(0, 4)),
        max_size=6,
    ),
    st.integers(0, 15),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_batches_of_any_jobs_and_placements_round_trip_as_columns(rows: list, shard: int) -> None:
    units = UnitBatch(
        shard,
        [Unit(j, tuple(p.task_index for p in ps), 1, a, frozenset({"q"}), t, h) for j, ps, a, t, h in rows],
    )
    planned = ProposalBatch(
        shard,
        42,
        [Proposal(j, ps, max(1, len(ps)), a, t, h) for j, ps, a, t, h in rows],
        [Unschedulable("u", (0,), Diagnosis(3), 1, True)],
    )
    reply = BindReply(
        [AcceptedUnit.of(j.id, a, ps, t) for j, ps, a, t, _ in rows], [], [], [], 5, False, shard
    )
    for message, packer in ((units, _unit_batch), (planned, _proposal_batch), (reply, _bind_reply)):
        assert message.__reduce__()[0] is packer  # the columnar form, not object by object
        back = wire.unpack(wire.pack(message))
        assert type(back) is type(message) and back == message
    # Each proposal keeps its own placements, in order, however many it has.
    back_planned = wire.unpack(wire.pack(planned))
    assert [len(p.placements) for p in back_planned.proposals] == [len(ps) for _, ps, *_ in rows]


def test_a_proposal_batch_folds_a_column_of_one_object_and_keeps_what_is_shared() -> None:
    """A column holding one object throughout travels once; one of equal but distinct objects, or
    of equal values of other types (0, False, 0.0), does not: what comes back shares exactly what
    was shared, which the binder's replies (packed with a memo) depend on."""
    groups = make_job("x").cpu("1").build().groups
    queue, twin = "q-shared", "".join(["q-", "shared"])
    assert queue == twin and queue is not twin
    jobs = [
        Job(f"j{i}", groups, tenant="t", queue=queue if i else twin, priority=(0, False, 0)[i])
        for i in range(3)
    ]
    node = "n1"
    planned = ProposalBatch(
        1, 5, [Proposal(j, [Placement(0, node)], 1, 0, (0.0, 0, 0.0)[i]) for i, j in enumerate(jobs)]
    )
    _, (_, _, n, counts, job_columns, placement_columns, rest, _) = planned.__reduce__()
    assert n == 3 and counts is None
    assert job_columns[1] == (groups,) and job_columns[2] == ("t",)  # folded
    assert len(job_columns[3]) == 3 and len(job_columns[4]) == 3  # equal, not the same: kept
    assert placement_columns[1] == (node,) and len(rest[2]) == 3
    back = wire.unpack(wire.pack(planned))
    assert isinstance(back, ProposalBatch) and back == planned
    got = [p.job for p in back.proposals]
    assert got[0].groups is got[1].groups is got[2].groups
    assert got[1].queue is got[2].queue and got[0].queue is not got[1].queue
    assert [type(j.priority) for j in got] == [int, bool, int]
    assert [type(p.dispatch_time) for p in back.proposals] == [float, int, float]
    assert back.proposals[0].placements[0].node is back.proposals[2].placements[0].node


def test_a_change_list_keeps_its_order_around_bindings() -> None:
    job = make_job("g").cpu("1").replicas(3).build()
    node = make_node("n1").cpu("8").build()
    bound = [TaskBound(f"n{i}", Resident.for_task(job, i, ((i, 500),), float(i))) for i in range(3)]
    mixed = [
        bound[0],
        TaskReleased("g/0", "preempted"),
        NodeUpserted(node),
        bound[1],
        bound[2],
        NodeRemoved("n9"),
    ]
    for changes in (mixed, bound, [TaskReleased("x/1", "lost")], []):
        back = wire.unpack(wire.pack(ChangeList(changes)))
        assert type(back) is list and back == changes


@dataclass(slots=True)
class _NamedResident(Resident):
    nickname: str = ""


def test_a_subclass_inside_a_batch_is_packed_whole_and_keeps_its_class() -> None:
    job = make_job("g").cpu("1").build()
    odd = TaskBound("n1", _NamedResident("g/0", "g", 1000, 0, nickname="x"))
    changes = [TaskBound("n1", Resident.for_task(job, 0, (), 1.0)), odd]
    back = wire.unpack(wire.pack(ChangeList(changes)))
    assert back == changes and type(back[1].resident) is _NamedResident  # type: ignore[attr-defined]
    assert rows_of(Resident, [odd.resident]) is None


def test_rows_rebuild_the_objects_they_were_read_from() -> None:
    jobs_ = [make_job(f"j{i}").cpu("1").priority(i).build() for i in range(3)]
    rows = rows_of(Job, jobs_)
    assert rows is not None and [r[0] for r in rows] == ["j0", "j1", "j2"]
    back = objects_from(Job, rows)
    assert back == jobs_ and [hash(j) for j in back] == [hash(j) for j in jobs_]
    assert objects_from(Placement, rows_of(Placement, [Placement(1, "n")]) or []) == [Placement(1, "n")]
