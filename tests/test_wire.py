"""Actor messages survive the trip through common/wire.py unchanged (frozen dataclasses included)."""

import copy
from dataclasses import dataclass

from gosched.common import wire
from gosched.common.cluster_state import Resident
from gosched.common.job import Toleration
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
    RejectedUnit,
    TaskBound,
    TaskReleased,
    Unit,
    UnitBatch,
    Unschedulable,
)
from gosched.common.resources import ResourceRequest
from tests.builders import make_job, make_node


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
