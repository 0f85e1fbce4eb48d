"""apply_changes places runs of bindings together; the result must equal applying one by one."""

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gosched.common.changes import apply_change, apply_changes
from gosched.common.cluster_state import _ARRAYS, NO_VICTIM, ClusterArrays, PlainUsage, Resident
from gosched.common.messages import Change, NodeRemoved, NodeUpserted, TaskBound, TaskReleased
from tests.builders import make_node

NODES = [
    make_node("cpu").cpu("64").build(),
    make_node("gpu").cpu("64").gpus(4, model="A100").build(),
    make_node("ext").cpu("64").extended("fpga", 4).build(),
    make_node("ext2").cpu("64").extended("tpu", 4).build(),  # a second name: a second column
]
EXTENDED = {"ext": "fpga", "ext2": "tpu"}
NAMES = [n.name for n in NODES]


@st.composite
def bindings(draw: st.DrawFn) -> TaskBound:
    node = draw(st.sampled_from([*NAMES * 4, "unknown"]))  # now and then a node the view lacks
    gpus: tuple[tuple[int, int], ...] = ()
    if node == "gpu" and draw(st.booleans()):
        picked = draw(st.lists(st.integers(0, 3), min_size=1, max_size=2, unique=True))
        gpus = tuple((g, draw(st.sampled_from([250, 500, 1000]))) for g in sorted(picked))
    extended = (
        ((EXTENDED[node], draw(st.integers(1, 2))),) if node in EXTENDED and draw(st.booleans()) else ()
    )
    # Mostly a task of its own (numbered later; the numpy path), sometimes one of a few that are
    # bound twice, released and bound again (the one-by-one path).
    task = draw(st.sampled_from([-1] * 12 + list(range(6))))
    return TaskBound(
        node,
        Resident(
            f"j{task}/0",
            f"j{task}",
            draw(st.integers(0, 4000)),
            draw(st.integers(0, 2**30)),
            gpus,
            extended,
            priority=draw(st.integers(-5, 5)),
            preemptible=draw(st.booleans()),
        ),
    )


other_changes = st.one_of(
    st.builds(TaskReleased, st.integers(0, 5).map(lambda t: f"j{t}/0")),
    st.builds(NodeRemoved, st.sampled_from(NAMES)),
    st.builds(NodeUpserted, st.sampled_from(NODES)),
)
# Runs of bindings, many long enough for the numpy path (8 or more), between other changes.
change_lists = st.lists(
    st.tuples(
        st.one_of(
            st.lists(bindings(), min_size=1, max_size=7), st.lists(bindings(), min_size=8, max_size=30)
        ),
        st.lists(other_changes, max_size=2),
    ),
    max_size=5,
).map(lambda parts: _numbered([change for run, others in parts for change in (*run, *others)]))


def _numbered(changes: list[Change]) -> list[Change]:
    """Give each binding drawn as a task of its own (id j-1) a distinct id."""
    out: list[Change] = []
    for k, change in enumerate(changes):
        if isinstance(change, TaskBound) and change.resident.job_id == "j-1":
            r = change.resident
            change = TaskBound(change.node, replace(r, task_id=f"u{k}/0", job_id=f"u{k}"))
        out.append(change)
    return out


def fresh_view() -> ClusterArrays:
    state = ClusterArrays()
    for node in NODES:
        state.upsert_node(node)
    return state


def assert_same_view(a: ClusterArrays, b: ClusterArrays) -> None:
    for name in _ARRAYS:
        assert np.array_equal(getattr(a, name)[: a.n], getattr(b, name)[: b.n]), name
    assert a.task_row == b.task_row
    assert a.residents == b.residents
    assert a.dirty_log == b.dirty_log


@settings(max_examples=300, deadline=None)
@given(change_lists)
def test_batched_bindings_equal_one_by_one(changes: list[Change]) -> None:
    batched, single = fresh_view(), fresh_view()
    apply_changes(batched, changes)
    for change in changes:
        apply_change(single, change)
    assert_same_view(batched, single)


def test_a_long_run_of_bindings_adds_usage_per_node() -> None:
    state = fresh_view()
    changes: list[Change] = [
        TaskBound("gpu", Resident(f"t{i}/0", f"t{i}", 1000, 2**20, ((i % 4, 250),), priority=i))
        for i in range(12)
    ]
    apply_changes(state, changes)
    row = state.row_of["gpu"]
    assert state.cpu_used[row] == 12_000 and state.mem_used[row] == 12 * 2**20
    assert state.gpu_free[row, :4].tolist() == [250, 250, 250, 250]  # three quarters used on each
    assert (state.free_whole[row], state.max_share[row], state.gpu_used_total[row]) == (0, 250, 3000)
    assert state.min_victim_priority[row] == 0
    assert len(state.residents[row]) == 12 and state.dirty_log[-12:] == [row] * 12


@settings(max_examples=200, deadline=None)
@given(change_lists, st.lists(st.booleans(), min_size=40, max_size=40))
def test_min_victim_priority_is_exact_whenever_read(changes: list[Change], reads: list[bool]) -> None:
    # A release leaves its row's bound to be recounted on the next read (a node's thousands of
    # equal-priority tasks released one by one were recounted each time): reads at any point see
    # the exact minimum.
    state = fresh_view()
    for k, change in enumerate(changes):
        apply_change(state, change)
        if reads[k % len(reads)] or k == len(changes) - 1:
            got = state.min_victim_priority
            for row in range(state.n):
                prios = [r.priority for r in state.residents[row].values() if r.preemptible]
                assert got[row] == (min(prios) if prios else NO_VICTIM), (k, row)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(NAMES), st.integers(0, 4000), st.integers(-5, 5), st.booleans()),
        max_size=30,
    )
)
def test_plain_columns_place_as_the_records_do(drawn: list[tuple[str, int, int, bool]]) -> None:
    """The binder's fast path gives place_many its residents' usage as columns (PlainUsage) and
    each one's victim priority: the same state as place_many reading the records."""
    by_record, by_columns = fresh_view(), fresh_view()
    rows = [by_record.row_of[node] for node, *_ in drawn]
    residents = [
        Resident(f"p{k}/0", f"p{k}", cpu, cpu * 2**10, priority=prio, preemptible=pre)
        for k, (_, cpu, prio, pre) in enumerate(drawn)
    ]
    by_record.place_many(rows, residents)
    plain = PlainUsage(
        [r.task_id for r in residents],
        np.array([r.cpu_milli for r in residents], np.int64),
        np.array([r.memory for r in residents], np.int64),
    )
    offers = [r.priority if r.preemptible else NO_VICTIM for r in residents]
    by_columns.place_many(rows, residents, plain, offers)
    assert_same_view(by_columns, by_record)
