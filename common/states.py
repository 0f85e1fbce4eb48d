"""Task lifecycle: the states and the only legal transitions between them."""

import enum

from gosched.common.errors import IllegalTransition


class TaskState(enum.StrEnum):
    PENDING = "pending"
    SCHEDULED = "scheduled"  # proposed by a shard, not yet committed
    BOUND = "bound"  # committed by the binder to a node
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"


S = TaskState
LEGAL: dict[TaskState, frozenset[TaskState]] = {
    S.PENDING: frozenset({S.SCHEDULED, S.BOUND, S.CANCELLED}),
    # scheduled -> pending: the binder rejected the proposal; the task goes back to the queue.
    S.SCHEDULED: frozenset({S.BOUND, S.PENDING, S.CANCELLED}),
    # bound -> pending: its node was lost before it started; it is scheduled again.
    S.BOUND: frozenset({S.RUNNING, S.PREEMPTED, S.CANCELLED, S.FAILED, S.PENDING, S.SUCCEEDED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.PREEMPTED, S.CANCELLED, S.PENDING}),
    # a preempted task is requeued: it starts a new attempt from pending.
    S.PREEMPTED: frozenset({S.PENDING, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}

TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
# States in which a task holds node resources.
HOLDS_RESOURCES = frozenset({S.BOUND, S.RUNNING})


def check_transition(task_id: str, current: TaskState, target: TaskState) -> None:
    """Raise IllegalTransition unless current -> target is a legal edge."""
    if target not in LEGAL[current]:
        raise IllegalTransition(
            f"task {task_id}: {current.value} -> {target.value} is not a legal transition"
        )


class JobState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"  # at least min_member tasks hold resources
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
