"""Applying the binder's change log to a ClusterArrays (the shards' views; the binder's recovery)."""

from gosched.common.cluster_state import ClusterArrays, Resident
from gosched.common.disruptions import DOWN, DOWN_REASONS
from gosched.common.job import split_task_id
from gosched.common.messages import Change, NodeRemoved, NodeUpserted, TaskBound, TaskReleased, TaskUp


def apply_change(state: ClusterArrays, change: Change) -> None:
    """Apply one change; idempotent for tasks (a bound task already resident keeps its usage)."""
    if isinstance(change, TaskBound):
        resident = change.resident
        row = state.row_of.get(change.node)
        held = state.task_row.get(resident.task_id)
        if held is None:
            if row is not None:
                state.place(row, resident)
        elif held == row and state.residents[row][resident.task_id].gpus == resident.gpus:
            # A shard's own placement, bound as planned: same usage; keep the binder's record.
            state.swap_record(row, resident)
    elif isinstance(change, TaskReleased):
        reason = change.reason
        if reason == DOWN:
            # The binder's note after an eviction or a loss (released by the change before it), or
            # a snapshot's, whose task may be bound again and not yet running: it releases nothing.
            state.down_tasks.add(split_task_id(change.task_id)[0], change.task_id)
            return
        state.release(change.task_id)
        if reason not in DOWN_REASONS and state.down_tasks:  # it ended (finished, its job cancelled)
            state.down_tasks.discard_many((change.task_id,))
    elif isinstance(change, TaskUp):
        if state.down_tasks:
            state.down_tasks.discard_many((change.task_id,))
    elif isinstance(change, NodeUpserted):
        state.upsert_node(change.node)
    elif isinstance(change, NodeRemoved) and change.name in state.row_of:
        state.remove_node(change.name)


def apply_changes(state: ClusterArrays, changes: list[Change]) -> None:
    """Apply changes in order; each run of bindings is placed at once (see _apply_bindings)."""
    i, n = 0, len(changes)
    while i < n:
        if type(changes[i]) is not TaskBound:
            apply_change(state, changes[i])
            i += 1
            continue
        j = i + 1
        while j < n and type(changes[j]) is TaskBound:
            j += 1
        _apply_bindings(state, changes if (i, j) == (0, n) else changes[i:j])  # type: ignore[arg-type]
        i = j


def _apply_bindings(state: ClusterArrays, bindings: list[TaskBound]) -> None:
    """apply_change for consecutive bindings, the new ones placed together with numpy.

    Every shard applies every binding in the cluster, so this is its largest per-task cost at
    8 shards; one place() each cost about 3.6 us. Same result as one by one.
    """
    row_of = state.row_of.get
    held_at = state.task_row.get
    residents = state.residents
    rows: list[int] = []
    fresh: list[Resident] = []
    for change in bindings:
        resident = change.resident
        row = row_of(change.node)
        held = held_at(resident.task_id)
        if held is None:
            if row is not None:
                rows.append(row)
                fresh.append(resident)
        elif held == row:
            old = residents[row][resident.task_id]
            if old.gpus == resident.gpus:  # as in apply_change (swap_record, inlined)
                residents[row][resident.task_id] = resident
                if old.priority != resident.priority or old.preemptible != resident.preemptible:
                    state.stale_victim_rows.add(row)
    if len({r.task_id for r in fresh}) != len(fresh):
        # One task bound twice in the run: one by one, the second finds the first and keeps it.
        for change in bindings:
            apply_change(state, change)
        return
    state.place_many(rows, fresh)
