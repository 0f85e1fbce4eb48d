"""Applying the binder's change log to a ClusterArrays (the shards' views; the binder's recovery)."""

from gosched.common.cluster_state import ClusterArrays
from gosched.common.messages import Change, NodeRemoved, NodeUpserted, TaskBound, TaskReleased


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
            state.residents[row][resident.task_id] = resident
    elif isinstance(change, TaskReleased):
        state.release(change.task_id)
    elif isinstance(change, NodeUpserted):
        state.upsert_node(change.node)
    elif isinstance(change, NodeRemoved) and change.name in state.row_of:
        state.remove_node(change.name)


def apply_changes(state: ClusterArrays, changes: list[Change]) -> None:
    for change in changes:
        apply_change(state, change)
