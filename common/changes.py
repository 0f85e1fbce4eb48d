"""Applying the binder's change log to a ClusterArrays (the shards' views; the binder's recovery)."""

from gosched.common.cluster_state import ClusterArrays
from gosched.common.messages import Change, NodeRemoved, NodeUpserted, TaskBound, TaskReleased


def apply_change(state: ClusterArrays, change: Change) -> None:
    """Apply one change; idempotent for tasks (a bound task already resident is left as it is)."""
    if isinstance(change, TaskBound):
        if change.resident.task_id in state.task_row:
            return
        row = state.row_of.get(change.node)
        if row is not None:
            state.place(row, change.resident)
    elif isinstance(change, TaskReleased):
        state.release(change.task_id)
    elif isinstance(change, NodeUpserted):
        state.upsert_node(change.node)
    elif isinstance(change, NodeRemoved) and change.name in state.row_of:
        state.remove_node(change.name)


def apply_changes(state: ClusterArrays, changes: list[Change]) -> None:
    for change in changes:
        apply_change(state, change)
