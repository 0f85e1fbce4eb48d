"""Plugin kinds of the two-level framework.

Unit level: Locating (which node sets to try, in order) and Grouping (split a node set into
topology domains for a gang). Task level: Filter and Score, vectorised over node rows. Preemption:
VictimSearching (who may be evicted) and CandidateSorting (which node's victims to take).

Filters and scores work on many rows at once and must depend only on the rows they are given, so
a cached result can be refreshed row by row. A score is normalised by its plugin to [0, 100]
against a fixed scale (never the observed max), which keeps that property; the profile weights it.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from gosched.common.cluster_state import ClusterArrays, Resident
from gosched.common.messages import Unit
from gosched.scheduler_shard.framework.task_class import TaskClass

if TYPE_CHECKING:
    from gosched.scheduler_shard.unit_context import UnitContext

Rows = npt.NDArray[np.int64] | slice
Mask = npt.NDArray[np.bool_]
Scores = npt.NDArray[np.float64]
# One-row versions of filter() and score(), on plain Python scalars, for the per-task refresh of the
# row a placement dirtied: numpy calls on one-element arrays cost more than the arithmetic itself.
RowFilter = Callable[[ClusterArrays, int], bool]
RowScore = Callable[[ClusterArrays, int], float]
# A one-row score of a class that asks for cpu and memory alone, as a function of the row's cpu and
# memory fractions in use after placement ((used + request) / max(capacity, 1), Python floats).
FractionScore = Callable[[float, float], float]


class FilterPlugin:
    name = ""
    reason = ""  # what a ruled-out node is told, e.g. "insufficient GPU"
    dynamic = False  # True: depends on usage, refreshed per changed row; False: node metadata only
    # Preemption cannot make a node pass an unresolvable filter (selectors, taints, models).
    resolvable_by_preemption = False

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return True

    def filter(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Mask:
        raise NotImplementedError

    def explain(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> list[tuple[str, Mask]]:
        """(reason, rows it rules out) pairs; by default one reason for the whole filter."""
        return [(self.reason, ~self.filter(tc, state, rows))]

    def row_filter(self, tc: TaskClass) -> RowFilter | None:
        """filter() for one row, for this class (the same verdict); None: no scalar version."""
        return None

    def fits_cpu_memory_only(self, tc: TaskClass) -> bool:
        """True when, for this class, filter() on a row says exactly whether the request's cpu and
        memory fit what the row has free, and reads nothing else (resources_fit for the usual
        task). The class cache then checks it from the same reads as the fraction scores."""
        return False


class ScorePlugin:
    name = ""
    dynamic = False
    # A soft rule: a preference about nodes (one the task states, or one kept for it, such as staying
    # off GPU nodes), not a packing, spreading or balance score. A shard leaves its own partition when
    # its pick there scores lower on its soft rules (weighted, summed) than a node elsewhere that fits
    # (placer.py). Read only for static plugins: a dynamic one is never treated as a soft rule.
    soft_rule = False

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return True

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        raise NotImplementedError

    def row_score(self, tc: TaskClass) -> RowScore | None:
        """score() for one row, for this class (the same float); None: no scalar version."""
        return None

    def fraction_score(self, tc: TaskClass) -> FractionScore | None:
        """score() for one row as a function of its cpu and memory fractions after placement, when
        for this class it reads nothing else (the same float); None otherwise. The class cache
        reads the row once for every such plugin of a class, rather than once per plugin."""
        return None


class UnitFilterPlugin:
    """A filter that depends on where the unit's own tasks (and others' residents) already are."""

    name = ""
    reason = ""

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return True

    def excluded(self, tc: TaskClass, ctx: "UnitContext", state: ClusterArrays) -> Mask | None:
        """Mask over all rows of nodes this task must avoid, or None for none."""
        raise NotImplementedError


class LocatingPlugin:
    name = ""

    def locate(
        self, unit: Unit, own_rows: npt.NDArray[np.int64] | None, state: ClusterArrays
    ) -> list[Mask | None]:
        """Node sets (row masks; None = every node) to try in order. A mask may be returned again
        for later units (the placer caches its row list when the mask is read-only), so a caller
        must never change one."""
        raise NotImplementedError


class GroupingPlugin:
    name = ""

    def groups(self, unit: Unit, state: ClusterArrays) -> list[Mask] | None:
        """Topology domains to try the whole gang in, best first; None when not applicable."""
        raise NotImplementedError

    def explain(self, unit: Unit, state: ClusterArrays) -> list[tuple[str, Mask]]:
        """(reason, rows) for "why pending": the rows groups() kept the unit off, and why. Asked
        only when the unit failed."""
        return []


class VictimSearchingPlugin:
    name = ""

    def eligible(self, unit: Unit, victim: Resident) -> bool:
        raise NotImplementedError

    def rows_with_victims(self, unit: Unit, state: ClusterArrays) -> Mask | None:
        """Rows that may hold a victim this plugin finds eligible (a vector pre-filter for the
        per-node search); None when the plugin cannot tell."""
        return None


@dataclass(slots=True)
class Candidate:
    """A node on which the task fits once `victims` are gone."""

    row: int
    victims: list[Resident]
    # Outside the shard's own partition: at equal harm, victims in the own partition go first
    # (another shard, searching its own, is then unlikely to pick the same ones).
    remote: bool = False

    @property
    def max_priority(self) -> int:
        return max((v.priority for v in self.victims), default=-(2**62))

    @property
    def priority_sum(self) -> int:
        return sum(v.priority for v in self.victims)

    @property
    def earliest_start(self) -> float:
        return min((v.start_time for v in self.victims), default=float("inf"))


class CandidateSortingPlugin:
    name = ""

    def sort(self, candidates: list[Candidate]) -> list[Candidate]:
        raise NotImplementedError
