"""The binder actor's cuts of the fast path change nothing it answers or keeps: a commit with
`rows_only` leaves the same truth and packs the same verdicts as one that makes AcceptedUnits, and
place_many takes its victim priorities as one int or an array, and its rows as an array, with the
same state as reading them from the records."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gosched.binder.binder import Binder
from gosched.common import wire
from gosched.common.cluster_state import NO_VICTIM, PlainUsage, Resident
from gosched.common.fast_pickle import rows_of
from gosched.common.job import task_id
from gosched.common.messages import (
    AcceptedUnit,
    BindReply,
    BindReplyRows,
    ChangeList,
    Placement,
    Proposal,
    ProposalBatch,
    TaskBoundRows,
)
from gosched.common.store import Store
from tests.builders import make_job, make_node
from tests.test_changes import NAMES, assert_same_view, fresh_view


def _batch(seen: int, kinds: list[tuple[int, bool, int]]) -> ProposalBatch:
    """One proposal per kind (priority, preemptible, tasks), each task on its own node."""
    proposals = []
    node = 0
    for k, (prio, pre, tasks) in enumerate(kinds):
        job = make_job(f"j{k}").cpu("1").replicas(tasks).priority(prio).preemptible(pre).build()
        placements = [Placement(i, f"n{node + i}") for i in range(tasks)]
        node += tasks
        proposals.append(Proposal(job, placements, tasks, attempt=k % 3))
    return ProposalBatch(0, seen, proposals)


def _binder(tmp: Path, name: str, nodes: int) -> Binder:
    binder = Binder(Store(str(tmp / f"{name}.db")), clock=lambda: 1000.5)
    binder.add_nodes([make_node(f"n{i}").cpu("4").build() for i in range(nodes)])
    return binder


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 5, -3]), st.booleans(), st.integers(1, 3)), max_size=40))
def test_rows_only_keeps_the_same_truth_and_verdicts(
    tmp_path_factory: pytest.TempPathFactory, kinds: list[tuple[int, bool, int]]
) -> None:
    tmp = tmp_path_factory.mktemp("rows")
    nodes = sum(t for *_, t in kinds) + 1
    objects, rows = _binder(tmp, "objects", nodes), _binder(tmp, "rows", nodes)
    batch = _batch(objects.version, kinds)
    by_objects = objects.commit(batch, with_changes=False)
    as_objects = objects.last_bound
    again = wire.unpack(wire.pack(batch))  # its own objects, as a shard's batch arrives
    assert isinstance(again, ProposalBatch)
    by_rows = rows.commit(again, with_changes=False, rows_only=True)
    as_rows = rows.last_bound
    assert as_objects is not None and as_rows is not None
    assert by_rows.accepted == [] and len(by_objects.accepted) == len(kinds)
    assert as_rows.accepted == as_objects.accepted == rows_of(AcceptedUnit, by_objects.accepted)
    packed = BindReplyRows(as_rows.accepted, by_rows.rejected, by_rows.evicted, by_rows.version, 0)
    assert wire.pack(packed) == wire.pack(
        BindReply(by_objects.accepted, [], [], [], by_objects.version, shard_id=0)
    )
    assert wire.pack(TaskBoundRows(as_rows.nodes, as_rows.rows)) == wire.pack(
        ChangeList(objects.changes_since(batch.seen_version)[0])
    )
    assert rows.view() == objects.view()
    assert np.array_equal(rows.state.min_victim_priority, objects.state.min_victim_priority)
    assert rows.truth.job_tasks == objects.truth.job_tasks


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(NAMES), st.integers(0, 4000)), max_size=30),
    st.sampled_from([0, 7, -2]),
    st.booleans(),
)
def test_one_victim_priority_for_all_and_a_row_array(
    drawn: list[tuple[str, int]], prio: int, pre: bool
) -> None:
    """Every resident offering the same priority (one int) or a column of them (an array), with
    the rows as an array too: the same state as place_many reading the records."""
    by_record, by_int, by_array = fresh_view(), fresh_view(), fresh_view()
    rows = [by_record.row_of[node] for node, _ in drawn]
    residents = [
        Resident(f"p{k}/0", f"p{k}", cpu, cpu * 2**10, priority=prio, preemptible=pre)
        for k, (_, cpu) in enumerate(drawn)
    ]
    by_record.place_many(rows, residents)
    plain = PlainUsage(
        [r.task_id for r in residents],
        np.array([r.cpu_milli for r in residents], np.int64),
        np.array([r.memory for r in residents], np.int64),
    )
    offer = prio if pre else NO_VICTIM
    row_array = np.array(rows, np.int64)
    by_int.place_many(rows, residents, plain, offer, row_array)
    by_array.place_many(rows, residents, plain, np.full(len(rows), offer, np.int64), row_array)
    assert_same_view(by_int, by_record)
    assert_same_view(by_array, by_record)


def test_task_ids_past_the_made_suffixes(tmp_path: Path) -> None:
    """The fast path makes "/index" from strings kept for the usual indexes: past them, and for
    every index, its task ids are task_id()'s."""
    binder = _binder(tmp_path, "ids", 4)
    job = make_job("big").cpu("0.1").replicas(5000).build()
    indexes = [0, 9, 4095, 4096, 4999]
    batch = ProposalBatch(0, binder.version, [Proposal(job, [Placement(i, f"n{i % 4}") for i in indexes], 1)])
    reply = binder.commit(batch)
    assert reply.accepted[0].task_indexes == tuple(indexes)
    assert sorted(binder.truth.job_tasks["big"]) == sorted(task_id("big", i) for i in indexes)
    assert [c.resident.task_id for c in reply.changes] == [task_id("big", i) for i in indexes]  # type: ignore[union-attr]
