"""What this shard's plans still at the binder hold in its view: the tasks they placed (never
victims: they are not bound) and the budgeted tasks they evict (down once the binder commits, so
a job's disruption budget counts them now). Built on first use within one schedule() call (only
the victim search asks) and kept up to date as the call places and drops units."""

from collections.abc import Mapping
from collections.abc import Set as AbstractSet

from gosched.common.cluster_state import Resident
from gosched.scheduler_shard.unit_context import EVICT, PLACE, UnitContext

_NONE: frozenset[str] = frozenset()


class InFlightPlans:
    __slots__ = ("_evicting", "_inflight", "_placed", "asked")

    def __init__(self, inflight: Mapping[str, UnitContext]) -> None:
        self._inflight = inflight
        self._placed: set[str] | None = None  # None: not asked for yet in this call
        self._evicting: dict[str, set[str]] | None = None  # job id -> its budgeted tasks evicted
        # Either was asked for: add and forget have something to keep up to date (the caller
        # reads this before calling them, so a call with no victim search pays nothing more).
        self.asked = False

    def placed(self) -> set[str]:
        """The task ids the plans in flight placed."""
        if self._placed is None:
            self.asked = True
            self._placed = {r.task_id for ctx in self._inflight.values() for r in _placed(ctx)}
        return self._placed

    def evicting(self, job_id: str) -> AbstractSet[str]:
        """The tasks of `job_id` (a job with a disruption budget) the plans in flight evict."""
        if self._evicting is None:
            self.asked = True
            self._evicting = {}
            for ctx in self._inflight.values():
                self._note_evictions(ctx)
        return self._evicting.get(job_id, _NONE)

    def add(self, ctx: UnitContext) -> None:
        if self._placed is not None:
            self._placed.update(r.task_id for r in _placed(ctx))
        if self._evicting is not None:
            self._note_evictions(ctx)

    def forget(self, ctx: UnitContext) -> None:
        if self._placed is not None:
            self._placed.difference_update(r.task_id for r in _placed(ctx))
        if self._evicting is not None:
            for r in _budgeted_victims(ctx):
                tasks = self._evicting.get(r.job_id)
                if tasks is not None:
                    tasks.discard(r.task_id)

    def _note_evictions(self, ctx: UnitContext) -> None:
        assert self._evicting is not None
        for r in _budgeted_victims(ctx):
            self._evicting.setdefault(r.job_id, set()).add(r.task_id)


def _placed(ctx: UnitContext) -> list[Resident]:
    return [resident for action, _, resident in ctx.log if action == PLACE]


def _budgeted_victims(ctx: UnitContext) -> list[Resident]:
    # drop_stale logs the unit's own stale task as an eviction: not a victim, charged to no budget.
    own = ctx.unit.job.id
    return [
        r
        for action, _, r in ctx.log
        if action == EVICT and r.disruption_budget is not None and r.job_id != own
    ]
