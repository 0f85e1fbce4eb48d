"""What a unit's attempt has done in the shard's view, kept as a log so it can be undone and redone.

A proposal's placements and evictions stay assumed in the view until the binder answers; to apply
the binder's changes underneath them, the view undoes every assumption, applies the changes, and
redoes the assumptions still in flight.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gosched.common.cluster_state import ClusterArrays, Resident
from gosched.common.messages import AcceptedUnit, Placement, Unit

if TYPE_CHECKING:
    from gosched.scheduler_shard.preemption import Census

PLACE = "place"
EVICT = "evict"
# A step that real changes made moot (its victim was released, or its task bound, by the binder):
# redo and undo both skip it. Undoing a moot eviction would put back a task the binder no longer
# has, and nothing would ever take it out of the view again.
MOOT = "moot"


@dataclass(slots=True)
class UnitContext:
    unit: Unit
    placements: list[Placement] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # each placement's row
    log: list[tuple[str, str, Resident]] = field(default_factory=list)  # (action, node name, resident)
    victims_by_job: dict[str, int] = field(default_factory=dict)
    # The victim search passed over a task it could have evicted, because it awaits the binder.
    victims_in_flight: bool = False
    # A disruption budget refused victims on counts this shard's plans in flight may change (they
    # evict its tasks, or bind its tasks down again): the verdict holds until they are answered.
    budget_in_flight: bool = False
    # Why the victim search found no candidate though lower-priority tasks were in the way: the
    # rules that protect them (a job's disruption budget, a queue's guarantee), for "why pending".
    protected: dict[str, int] = field(default_factory=dict)  # reason -> nodes
    # Jobs and queues in the view before this unit's evictions (preemption.Census), built once
    # the unit's victims need pricing.
    census: "Census | None" = None

    def __init__(
        self,
        unit: Unit,
        placements: list[Placement] | None = None,
        rows: list[int] | None = None,
        log: list[tuple[str, str, Resident]] | None = None,
    ) -> None:
        # By hand rather than the dataclass's: one is made per unit scheduled, and the generated
        # __init__ calls a factory per field with a default (a third of its cost).
        self.unit = unit
        self.placements = [] if placements is None else placements
        self.rows = [] if rows is None else rows
        self.log = [] if log is None else log
        self.victims_by_job = {}
        self.victims_in_flight = False
        self.budget_in_flight = False
        self.protected = {}
        self.census = None

    def place(self, state: ClusterArrays, row: int, resident: Resident, placement: Placement) -> None:
        state.place(row, resident)
        self.log.append((PLACE, placement.node, resident))
        self.placements.append(placement)
        self.rows.append(row)

    @property
    def placed_rows(self) -> list[tuple[int, str]]:
        """(row, role) of each placement (anti-affinity asks; built on demand, not per task)."""
        group_of = self.unit.job.group_of
        return [(row, group_of(p.task_index).role) for row, p in zip(self.rows, self.placements, strict=True)]

    def evict(self, state: ClusterArrays, resident: Resident) -> None:
        released = state.release(resident.task_id)
        assert released is not None, f"victim {resident.task_id} is not resident"
        node = state.nodes[released[0]]
        assert node is not None
        self.log.append((EVICT, node.name, resident))
        self.victims_by_job[resident.job_id] = self.victims_by_job.get(resident.job_id, 0) + 1

    def bound_as_planned(self, accepted: AcceptedUnit) -> bool:
        """The binder bound every placement of this attempt (the answer may be for an earlier
        attempt of the job than the one held here), and the attempt evicted nothing: the view
        already holds what the binder's changes for it will say. The binder binds a placement
        where it was proposed or not at all, so the task indexes tell."""
        # Loops rather than a tuple and a generator: this runs once per unit answered.
        indexes, placements = accepted.task_indexes, self.placements
        if accepted.attempt != self.unit.attempt or len(indexes) != len(placements):
            return False
        for index, placement in zip(indexes, placements, strict=True):
            if index != placement.task_index:
                return False
        for action, _, _ in self.log:  # noqa: SIM110 (no generator per unit answered)
            if action != PLACE:
                return False
        return True

    def drop_stale(self, state: ClusterArrays, task_id: str) -> None:
        """The unit's own task is still resident in this (stale) view: the dispatcher sends only
        tasks that hold nothing, so the binder has released it and this view has not heard yet.
        Take it out for the attempt, logged like an eviction (undo puts it back, and the binder's
        release then removes it for good); not a victim, so no disruption budget is charged."""
        row = state.task_row[task_id]
        resident = state.residents[row][task_id]
        node = state.nodes[row]
        assert node is not None
        state.release(task_id)
        self.log.append((EVICT, node.name, resident))

    def undo(self, state: ClusterArrays) -> None:
        """Revert this attempt's effects on the view, newest first (the log is kept for redo)."""
        for action, node, resident in reversed(self.log):
            if action == PLACE:
                state.release(resident.task_id)
            elif action == EVICT and resident.task_id not in state.task_row and node in state.row_of:
                state.place(state.row_of[node], resident)

    def redo(self, state: ClusterArrays) -> None:
        """Re-assume this attempt on a refreshed view (undone, then changed underneath); a step
        that the changes made moot is skipped, and marked so that no later undo reverts it."""
        for i, (action, node, resident) in enumerate(self.log):
            row = state.row_of.get(node)
            if action == PLACE and row is not None and resident.task_id not in state.task_row:
                state.place(row, resident)
            elif action == EVICT and row is not None and state.task_row.get(resident.task_id) == row:
                state.release(resident.task_id)
            elif action != MOOT:
                self.log[i] = (MOOT, node, resident)

    def rollback(self, state: ClusterArrays) -> None:
        """Abandon the attempt: undo it and forget it."""
        self.undo(state)
        self.log.clear()
        self.placements.clear()
        self.rows.clear()
        self.victims_by_job.clear()
        self.census = None  # it counted steps now undone

    def rollback_to(self, state: ClusterArrays, mark: tuple[int, int]) -> None:
        """Undo the steps after `mark` (from `checkpoint`)."""
        log_len, placed = mark
        tail = UnitContext(self.unit, log=self.log[log_len:])
        tail.undo(state)
        for action, _, resident in self.log[log_len:]:
            if action == EVICT and resident.job_id != self.unit.job.id:
                self.victims_by_job[resident.job_id] -= 1
        del self.log[log_len:]
        del self.placements[placed:]
        del self.rows[placed:]
        if self.census is not None and self.census.seen > log_len:
            self.census = None  # it counted steps now undone

    def checkpoint(self) -> tuple[int, int]:
        return len(self.log), len(self.placements)
