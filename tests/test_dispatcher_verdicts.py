"""The binder's reply as the dispatcher reads it (dispatcher/verdicts.py): the same bytes, its
accepted units left as rows, and the same outcome as reading the BindReply whole."""

import io
from dataclasses import dataclass, fields
from pathlib import Path

from gosched.common import wire
from gosched.common.config import Settings
from gosched.common.messages import (
    AcceptedUnit,
    BindReply,
    BindReplyRows,
    Eviction,
    Placement,
    RejectedUnit,
    UnitBatch,
)
from gosched.dispatcher import verdicts
from gosched.dispatcher.verdicts import ACCEPTED_FIELDS, Verdicts, read_verdicts
from gosched.runtime.ray_actors import DispatcherCore
from gosched.runtime.simulation import sim_nodes
from tests.builders import make_job


def test_an_accepted_row_is_an_accepted_units_fields_in_order() -> None:
    """The rows the binder packs are AcceptedUnit's fields in order; the dispatcher unpacks them so."""
    assert tuple(f.name for f in fields(AcceptedUnit)) == ACCEPTED_FIELDS


def _reply() -> BindReply:
    accepted = [
        AcceptedUnit.of("a", 0, [Placement(0, "n1")], 5.0),
        AcceptedUnit.of("b", 2, [Placement(1, "n2", victims=("x/0",)), Placement(2, "n3")], 6.0),
    ]
    rejected = [RejectedUnit("c", (0, 1), "node gone", "nodes")]
    evicted = [Eviction("x/0", "x", 0, "b")]
    return BindReply(accepted, rejected, evicted, [], 7, shard_id=3)


def _rows(reply: BindReply) -> list[tuple[object, ...]]:
    return [tuple(getattr(a, f) for f in ACCEPTED_FIELDS) for a in reply.accepted]


def test_a_reply_reads_as_its_rows_and_the_rest_as_unpacked() -> None:
    reply = _reply()
    for data in (
        wire.pack(reply),
        wire.pack(BindReplyRows(_rows(reply), reply.rejected, reply.evicted, 7, 3)),
    ):
        # The stream's rebuild of the BindReply is answered by Verdicts itself: no unit object made.
        assert isinstance(verdicts._Reader(io.BytesIO(data)).load(), Verdicts)
        got = read_verdicts(data)
        assert got.accepted == _rows(reply)
        assert (got.rejected, got.evicted, got.shard_id) == (reply.rejected, reply.evicted, 3)


@dataclass(slots=True)
class _Noted(AcceptedUnit):
    note: str = ""


def test_a_reply_packed_whole_reads_as_its_units_rows() -> None:
    """Units of a subclass pack as objects (BindReply.__reduce__): their rows are read off them."""
    reply = _reply()
    reply.accepted = [
        _Noted(a.job_id, a.attempt, a.task_indexes, a.bind_time, a.victims, "n") for a in reply.accepted
    ]
    got = read_verdicts(wire.pack(reply))
    assert got.accepted == _rows(reply) and got.shard_id == 3 and got.rejected == reply.rejected


def _core(tmp_path: Path, name: str) -> DispatcherCore:
    core = DispatcherCore(Settings(store_path=str(tmp_path / f"{name}.db"), shards=1))
    nodes = sim_nodes(4, gpu_every=0)
    core.set_nodes(
        nodes, {"cpu": sum(n.cpu_milli for n in nodes), "memory": sum(n.memory for n in nodes), "gpu": 0}
    )
    return core


def test_the_core_reads_a_reply_as_the_dispatcher_takes_it_whole(tmp_path: Path) -> None:
    """DispatcherCore.report (read_verdicts, on_verdicts) against on_reply of the unpacked BindReply,
    for a reply that binds, binds in part, rejects and evicts."""
    outs = []
    for name in ("rows", "whole"):
        core = _core(tmp_path, name)
        try:
            core.submit_many(
                [
                    make_job("one").cpu("1").build(),
                    make_job("part").cpu("1").replicas(3).build(),
                    make_job("no").cpu("1").build(),
                ]
            )
            _, data = core.next_batch(0)
            batch = wire.unpack(data or b"")
            assert isinstance(batch, UnitBatch)
            first = [u.attempt for u in batch.units]
            reply = BindReply(
                [
                    AcceptedUnit.of("one", first[0], [Placement(0, "n1")], 5.0),
                    AcceptedUnit.of("part", first[1], [Placement(0, "n1"), Placement(1, "n2")], 6.0),
                ],
                [RejectedUnit("no", (0,), "node gone", "nodes"), RejectedUnit("part", (2,), "full", "fit")],
                [Eviction("one/0", "one", 0, "")],
                [],
                1,
                shard_id=0,
            )
            if name == "rows":
                core.report(wire.pack(reply), wire.pack([]), core.binder_incarnation)
            else:
                core.dispatcher.on_reply(reply)
                core.bound_tasks, core.last_bind, core.rejected_units = 3, 6.0, 1
            d = core.dispatcher
            outs.append(
                (
                    {j: (d.task_states(j), d.explain(j)) for j in ("one", "part", "no")},
                    d.pending_count(),
                    d.in_flight_count(),
                    d.waiting_count(),
                    d.usage.usage("queue", "default", "held").tolist(),
                    core.bound_tasks,
                    core.last_bind,
                    core.rejected_units,
                    len(d.timings or ()),
                )
            )
        finally:
            core.store.close()
    assert outs[0] == outs[1]
