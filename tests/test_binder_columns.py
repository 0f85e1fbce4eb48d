"""The binder's reading of the usual batch from its columns (Binder.commit_columns, fastpath.
usual_batch) answers, keeps and writes exactly what committing the batch's objects does, and
leaves every other batch, untouched, to the object path."""

from collections.abc import Callable
from dataclasses import replace
from itertools import count, repeat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gosched.binder.binder import Binder
from gosched.binder.fastpath import usual_batch
from gosched.common import wire
from gosched.common.job import AntiAffinity
from gosched.common.messages import (
    BindReply,
    BindReplyRows,
    Placement,
    Proposal,
    ProposalBatch,
    ProposalColumns,
    unpack_proposals,
)
from gosched.common.node import Node, NodeState
from gosched.common.states import TaskState
from gosched.common.store import Store
from gosched.runtime.packed_changes import PackedChanges
from gosched.runtime.ray_actors import BinderCore
from tests.builders import make_job, make_node

NODES = [f"n{i}" for i in range(8)]


class _Writer:
    """What the binder hands its store writer, kept (Binder.commit_columns wants a writer)."""

    def __init__(self) -> None:
        self.writes: list[tuple[Any, ...]] = []

    def write(self, version: int, bound: Any, states: Any, now: float) -> None:
        self.writes.append((version, list(bound), list(states), now))

    def write_plain(self, version: int, task_ids: Any, nodes: Any, now: float) -> None:
        """As writer_child makes the rows of write_plain's frame."""
        self.write(version, list(zip(task_ids, nodes, repeat(()))), [], now)

    def drain(self) -> None:
        """Nothing is in flight."""


class _Side:
    """A binder answered as the binder actor answers: verdict bytes, change segments, writes."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.writer = _Writer()
        self.clock = count(1000.0, 0.5)
        self.binder = Binder(Store(str(tmp / f"{name}.db")), clock=self.clock.__next__, writer=self.writer)  # type: ignore[arg-type]
        self.binder.add_nodes(
            [make_node(n).cpu("4").mem("8Gi").build() for n in NODES[:-1]]
            + [make_node(NODES[-1]).cpu("4").mem("8Gi").gpus(2).extended("example.com/fpga", 2).build()]
        )
        self.packed = PackedChanges()
        self.columns = 0  # commits the column path took

    def commit(self, data: bytes, *, columns: bool) -> tuple[bytes, list[bytes]]:
        got = unpack_proposals(data) if columns else wire.unpack(data)
        assert isinstance(got, ProposalColumns | ProposalBatch)
        reply = self.binder.commit_columns(got) if isinstance(got, ProposalColumns) else None
        if reply is None:
            planned = got.batch() if isinstance(got, ProposalColumns) else got
            reply = self.binder.commit(planned, with_changes=False, rows_only=True)
        else:
            self.columns += 1
        rows = self.binder.last_bound
        verdicts = (
            BindReplyRows(rows.accepted, reply.rejected, reply.evicted, reply.version, reply.shard_id)
            if rows is not None
            else BindReply(
                reply.accepted, reply.rejected, reply.evicted, [], reply.version, shard_id=reply.shard_id
            )
        )
        segments, _, _ = self.packed.since(self.binder, got.seen_version)
        return wire.pack(verdicts), segments


def _assert_same(a: Binder, b: Binder) -> None:
    assert a.view() == b.view()
    assert a.version == b.version
    assert a.truth.job_tasks == b.truth.job_tasks
    assert a.changes_since(0)[0] == b.changes_since(0)[0]
    assert np.array_equal(a.state.min_victim_priority, b.state.min_victim_priority)
    assert a.state.task_row == b.state.task_row


SHARED = make_job("shape").cpu("500m").mem("256Mi").replicas(3).build()
# What may make a batch unusual, one proposal at a time (see _proposal).
ODD = [
    "priority",  # its job's priority is not the others'
    "gpu",  # asks for a GPU
    "fpga",  # asks for an extended resource
    "victim",  # names a victim
    "twice",  # proposes the task of the proposal before it
    "bound",  # proposes a task already bound
    "ghost",  # on no known node
    "index",  # a task index past the job's tasks
    "held",  # its unit held tasks
    "need2",  # needs two placements
    "two",  # has two placements
    "none",  # has no placement
    "anti",  # its group has an anti-affinity rule
    "groups",  # its job has two groups
    "standing",  # its standing is not the others'
    "heavy",  # asks for more cpu than a node has
    "labels",  # its job carries labels
]


def _proposal(job_id: str, node: str, attempt: int, odd: str | None, bound: list[str]) -> Proposal:
    job = replace(SHARED, id=job_id)  # the same field objects: the usual batch's jobs share them
    placements = [Placement(0, node)]
    min_needed, held, standing = 1, 0, None
    if odd == "priority":
        job = replace(job, priority=7)
    elif odd in ("gpu", "fpga", "heavy", "groups", "anti"):
        maker = make_job(job_id).cpu("500m").mem("256Mi").replicas(3)
        if odd == "gpu":
            maker = maker.gpus(1)
        elif odd == "fpga":
            maker = maker.extended("example.com/fpga", 1)
        elif odd == "heavy":
            maker = maker.cpu("5")
        job = maker.build()
        if odd == "groups":
            job = replace(job, groups=(*job.groups, replace(job.groups[0], role="side")))
        elif odd == "anti":
            rule = AntiAffinity("node", (("app", "x"),))
            job = replace(job, groups=(replace(job.groups[0], anti_affinity=(rule,)),))
        if odd == "gpu":
            placements = [Placement(0, NODES[-1], ((0, 1000),))]
    elif odd == "victim" and bound:
        placements = [Placement(0, node, (), (bound[0],))]
    elif odd == "bound" and bound:
        jid, _, idx = bound[-1].rpartition("/")
        job = replace(SHARED, id=jid)
        placements = [Placement(int(idx), node)]
    elif odd == "ghost":
        placements = [Placement(0, "ghost")]
    elif odd == "index":
        placements = [Placement(3, node)]
    elif odd == "held":
        held = 2
    elif odd == "need2":
        min_needed = 2
    elif odd == "two":
        placements = [Placement(0, node), Placement(1, node)]
    elif odd == "none":
        placements = []
    elif odd == "standing":
        standing = 9
    elif odd == "labels":
        job = replace(job, labels=(("app", "x"),))
    return Proposal(job, placements, min_needed, attempt, 5.0, held, (), standing)


@st.composite
def _batches(draw: st.DrawFn, batch_no: int, bound: list[str]) -> list[Proposal]:
    proposals: list[Proposal] = []
    odd = draw(st.one_of(st.none(), st.sampled_from(ODD)))  # one odd proposal at most: most stay usual
    n = draw(st.integers(0, 9))
    at = draw(st.integers(0, max(0, n - 1)))
    for i in range(n):
        node = draw(st.sampled_from(NODES[:-1]))
        attempt = draw(st.sampled_from([0, 0, 1]))
        proposals.append(_proposal(f"b{batch_no}j{i}", node, attempt, odd if i == at else None, bound))
    if odd == "twice" and len(proposals) > 1:
        proposals[at] = proposals[at - 1]
    return proposals


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_column_path_answers_as_the_object_path(
    tmp_path_factory: pytest.TempPathFactory, data: Any
) -> None:
    tmp = tmp_path_factory.mktemp("columns")
    cols, objs = _Side(tmp, "cols"), _Side(tmp, "objs")
    draw = data.draw
    for batch_no in range(draw(st.integers(1, 6))):
        bound = sorted(cols.binder.state.task_row)
        between = draw(st.sampled_from(["none", "none", "cordon", "release", "cancel", "stale", "repeller"]))
        seen = cols.binder.version
        if between == "cordon":
            name = draw(st.sampled_from(NODES))
            for side in (cols, objs):
                side.binder.set_node_state(name, NodeState.CORDONED)
        elif between == "release" and bound:
            for side in (cols, objs):
                side.binder.release(bound[:2], "succeeded")
        elif between == "cancel":
            for side in (cols, objs):
                side.binder.cancel_job(f"b{batch_no}j0", [])
        elif between == "stale":  # planned on a view from before a node's labels changed
            for side in (cols, objs):
                side.binder.add_nodes([_labelled(NODES[0], batch_no)])
        elif between == "repeller":
            for side in (cols, objs):
                _repeller(side, str(batch_no))
            seen = cols.binder.version
        batch = ProposalBatch(draw(st.integers(0, 3)), seen, draw(_batches(batch_no, bound)))
        data_bytes = wire.pack(batch)
        assert cols.commit(data_bytes, columns=True) == objs.commit(data_bytes, columns=False)
        assert cols.writer.writes == objs.writer.writes
        _assert_same(cols.binder, objs.binder)
        for side in (cols, objs):
            side.binder.store.set_task_states(
                [(t, TaskState.PENDING) for t in sorted(side.binder.state.task_row)]
            )
    assert next(cols.clock) == next(objs.clock)  # the column path read the clock as often


def _labelled(name: str, k: int) -> Node:
    return make_node(name).cpu("4").mem("8Gi").label(zone=f"z{k}").build()


def _repeller(side: _Side, name: str) -> None:
    """A resident of `name` whose rule repels the jobs labelled app=x."""
    job = make_job(f"r-{name}").cpu("100m").build()
    job = replace(
        job, groups=(replace(job.groups[0], anti_affinity=(AntiAffinity("node", (("app", "x"),)),)),)
    )
    side.binder.commit(ProposalBatch(0, side.binder.version, [Proposal(job, [Placement(0, NODES[1])], 1)]))


def test_a_repelled_label_or_a_node_changed_since_the_view_is_not_usual(tmp_path: Path) -> None:
    side = _Side(tmp_path, "rules")
    labelled = ProposalBatch(0, 0, [_proposal(f"l{i}", NODES[2], 0, "labels", []) for i in range(3)])
    got = unpack_proposals(wire.pack(replace(labelled, seen_version=side.binder.version)))
    assert isinstance(got, ProposalColumns) and usual_batch(side.binder.truth, got) is not None
    _repeller(side, "one")
    got = unpack_proposals(wire.pack(replace(labelled, seen_version=side.binder.version)))
    assert isinstance(got, ProposalColumns) and usual_batch(side.binder.truth, got) is None
    plain = unpack_proposals(wire.pack(_usual(3, side.binder.version)))
    assert isinstance(plain, ProposalColumns) and usual_batch(side.binder.truth, plain) is not None
    side.binder.add_nodes([_labelled(NODES[0], 1)])
    stale = unpack_proposals(wire.pack(_usual(3, side.binder.version - 1)))  # _usual uses n0
    assert isinstance(stale, ProposalColumns) and usual_batch(side.binder.truth, stale) is None


def _usual(n: int, seen: int) -> ProposalBatch:
    return ProposalBatch(1, seen, [_proposal(f"u{i}", NODES[i % 4], i % 2, None, []) for i in range(n)])


def test_the_usual_batch_takes_the_column_path_and_an_odd_one_leaves_all_as_it_was(tmp_path: Path) -> None:
    cols, objs = _Side(tmp_path, "cols"), _Side(tmp_path, "objs")
    usual = wire.pack(_usual(12, cols.binder.version))
    assert cols.commit(usual, columns=True) == objs.commit(usual, columns=False)
    assert cols.columns == 1 and cols.binder.last_bound is not None
    for odd in ODD:
        planned = _usual(5, cols.binder.version)
        bound = sorted(cols.binder.state.task_row)
        planned.proposals.append(_proposal(f"{odd}-odd", NODES[5], 0, odd, bound))
        if odd == "twice":
            planned.proposals.append(planned.proposals[-1])
        got = unpack_proposals(wire.pack(planned))
        assert isinstance(got, ProposalColumns)
        if odd == "labels":  # labels alone are usual: no rule repels them here
            continue
        before = (cols.binder.version, cols.binder.view(), dict(cols.binder.truth.job_tasks))
        assert usual_batch(cols.binder.truth, got) is None, odd
        assert cols.binder.commit_columns(got) is None, odd
        assert (cols.binder.version, cols.binder.view(), dict(cols.binder.truth.job_tasks)) == before
    assert next(cols.clock) == next(objs.clock)


def test_a_batch_of_many_tasks_on_one_node_is_hot_as_a_whole(tmp_path: Path) -> None:
    """Nine tasks of 500m on a node of 4 cpu: each fits alone, the batch does not."""
    side = _Side(tmp_path, "hot")
    planned = ProposalBatch(
        0, side.binder.version, [_proposal(f"h{i}", NODES[0], 0, None, []) for i in range(9)]
    )
    got = unpack_proposals(wire.pack(planned))
    assert isinstance(got, ProposalColumns) and usual_batch(side.binder.truth, got) is None
    fits = unpack_proposals(wire.pack(replace(planned, proposals=planned.proposals[:8])))
    assert isinstance(fits, ProposalColumns) and usual_batch(side.binder.truth, fits) is not None


def test_without_a_writer_the_columns_go_the_object_path(tmp_path: Path) -> None:
    binder = Binder(Store(str(tmp_path / "plain.db")))
    binder.add_nodes([make_node(n).cpu("4").build() for n in NODES])
    got = unpack_proposals(wire.pack(_usual(3, binder.version)))
    assert isinstance(got, ProposalColumns) and binder.commit_columns(got) is None


class _OddBatch(ProposalBatch):
    """A subclass: packed object by object."""


def test_a_batch_packed_object_by_object_comes_back_as_one() -> None:
    got = unpack_proposals(wire.pack(_OddBatch(0, 3, [_proposal("o", NODES[0], 0, None, [])])))
    assert type(got) is _OddBatch
    with pytest.raises(TypeError):
        unpack_proposals(wire.pack([1, 2]))


@pytest.mark.parametrize("odd", [None, "victim"])
def test_the_binder_actor_answers_the_same_either_way(tmp_path: Path, odd: str | None) -> None:
    """BinderCore.commit, with its store writer, against one whose column path is turned off."""

    class Drop:
        def remote(self, *args: object) -> None:
            """Reports go nowhere."""

    class NoDispatcher:
        report = Drop()

    cores = [BinderCore(str(tmp_path / f"{k}.db"), NoDispatcher(), on_writer_failure=None) for k in range(2)]
    off: Callable[[object], None] = lambda batch: None  # noqa: E731
    setattr(cores[1].binder, "commit_columns", off)  # noqa: B010
    try:
        answers = []
        for core in cores:
            core.add_nodes([make_node(n).cpu("4").mem("8Gi").build() for n in NODES])
            core.binder.clock = count(50.0).__next__
            first = _usual(6, core.binder.version)
            core.store.add_jobs([p.job for p in first.proposals])
            _, verdicts, segments, version, _ = core.commit(wire.pack(first))
            second = _usual(6, version)
            second.proposals[:] = [
                replace(p, job=replace(p.job, id=f"s{i}")) for i, p in enumerate(second.proposals)
            ]
            if odd:
                second.proposals.append(_proposal("v", NODES[1], 0, odd, sorted(core.binder.state.task_row)))
            core.store.add_jobs([p.job for p in second.proposals])
            _, verdicts2, segments2, version2, _ = core.commit(wire.pack(second))
            core.flush()
            answers.append((verdicts, segments, version, verdicts2, segments2, version2))
        assert answers[0] == answers[1]
        assert cores[0].binder.view() == cores[1].binder.view()
        stored = [sorted(c.store.load_bound(), key=lambda b: (b.job.id, b.idx)) for c in cores]
        assert [(b.job.id, b.idx, b.node) for b in stored[0]] == [
            (b.job.id, b.idx, b.node) for b in stored[1]
        ]
    finally:
        for core in cores:
            core.close()
