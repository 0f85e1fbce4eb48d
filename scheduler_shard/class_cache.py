"""Filter and score results per task class, kept over all nodes and refreshed row by row.

Static plugins (node metadata only) are computed once per class and metadata generation. Dynamic
ones (usage) are recomputed for the rows the view's dirty log names since the class last looked,
so placing a task costs work on one row plus an argmax, not a pass over every node.
"""

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gosched.common.cluster_state import ClusterArrays
from gosched.common.job import TaskGroup
from gosched.scheduler_shard.framework.interfaces import FilterPlugin, RowFilter, Rows, RowScore, ScorePlugin
from gosched.scheduler_shard.framework.profile import Profile
from gosched.scheduler_shard.framework.task_class import TaskClass, class_of

F = npt.NDArray[np.float64]
NEG_INF = -np.inf
MAX_CLASSES = 4096


@dataclass(slots=True)
class ClassEntry:
    tc: TaskClass
    meta_gen: int = -1
    model_gen: int = -1  # the cache's model generation the scores were computed under
    n: int = 0
    position: int = 0
    state_id: int = 0
    static_ok: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, np.bool_))
    static_score: F = field(default_factory=lambda: np.zeros(0))
    eff: F = field(default_factory=lambda: np.zeros(0))  # score where feasible, -inf elsewhere
    dyn_filters: list[FilterPlugin] = field(default_factory=list)
    dyn_scores: list[tuple[ScorePlugin, float]] = field(default_factory=list)
    # Each dynamic plugin's scalar one-row version, or None where it has none (the vector is used).
    row_filters: list[RowFilter | None] = field(default_factory=list)
    row_scores: list[RowScore | None] = field(default_factory=list)


class ClassCache:
    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.entries: dict[tuple[object, ...], ClassEntry] = {}
        # Bumped when a score plugin's learned model changes: every cached score is then stale.
        self.model_generation = 0

    def models_changed(self) -> None:
        self.model_generation += 1

    def entry(self, group: TaskGroup, state: ClusterArrays) -> ClassEntry:
        key = group.constraint_key()
        entry = self.entries.get(key)
        if entry is None:
            if len(self.entries) >= MAX_CLASSES:
                self.entries.clear()
            entry = self.entries[key] = ClassEntry(tc=class_of(group))
        self.refresh(entry, state)
        return entry

    def refresh(self, entry: ClassEntry, state: ClusterArrays) -> None:
        if (
            entry.meta_gen != state.meta_generation
            or entry.n != state.n
            or entry.state_id != id(state)
            or entry.model_gen != self.model_generation
        ):
            self._full(entry, state)
            return
        rows, position = state.dirty_since(entry.position)
        if position < 0:
            self._full(entry, state)
            return
        entry.position = position
        if len(rows) == 1:  # the usual case: the row the last placement dirtied
            if rows[0] < entry.n:
                self._update_row(entry, state, rows[0])
        elif rows:
            idx = np.unique(np.array(rows, np.int64))
            idx = idx[idx < entry.n]
            self._update(entry, state, idx)

    def _full(self, entry: ClassEntry, state: ClusterArrays) -> None:
        tc, n, all_rows = entry.tc, state.n, slice(0, state.n)
        ok = np.ones(n, np.bool_)
        for f in self.profile.static_filters:
            if f.relevant(tc, state):
                ok &= f.filter(tc, state, all_rows)
        score = np.zeros(n, np.float64)
        dyn_scores = []
        for plugin, weight in self.profile.scores:
            if not plugin.relevant(tc, state):
                continue
            if plugin.dynamic:
                dyn_scores.append((plugin, weight))
            else:
                score += weight * plugin.score(tc, state, all_rows)
        entry.static_ok, entry.static_score = ok, score
        entry.dyn_filters = [f for f in self.profile.dynamic_filters if f.relevant(tc, state)]
        entry.dyn_scores = dyn_scores
        entry.row_filters = [f.row_filter(tc) for f in entry.dyn_filters]
        entry.row_scores = [p.row_score(tc) for p, _ in dyn_scores]
        entry.eff = np.full(n, NEG_INF)
        entry.meta_gen, entry.n, entry.state_id = state.meta_generation, n, id(state)
        entry.model_gen = self.model_generation
        entry.position = state.dirty_position
        self._update(entry, state, all_rows)

    def _update(self, entry: ClassEntry, state: ClusterArrays, rows: Rows) -> None:
        tc = entry.tc
        ok = entry.static_ok[rows]
        for f in entry.dyn_filters:
            ok = ok & f.filter(tc, state, rows)
        score = entry.static_score[rows]
        for plugin, weight in entry.dyn_scores:
            score = score + weight * plugin.score(tc, state, rows)
        entry.eff[rows] = np.where(ok, score, NEG_INF)

    def _update_row(self, entry: ClassEntry, state: ClusterArrays, row: int) -> None:
        """_update for one row, accumulated in Python floats in the same order, with each plugin's
        scalar version where it has one (numpy calls on one-element arrays cost more than the
        arithmetic), stopping at the first filter that fails."""
        if not entry.static_ok[row] or not passes_dynamic_filters(entry, state, row):
            entry.eff[row] = NEG_INF
            return
        tc, one = entry.tc, None
        score = float(entry.static_score[row])
        for (plugin, weight), row_score in zip(entry.dyn_scores, entry.row_scores, strict=True):
            if row_score is not None:
                score += weight * row_score(state, row)
            else:
                one = np.array([row], np.int64) if one is None else one
                score += weight * float(plugin.score(tc, state, one)[0])
        entry.eff[row] = score

    def oldest_position(self) -> int | None:
        return min((e.position for e in self.entries.values()), default=None)


def passes_dynamic_filters(entry: ClassEntry, state: ClusterArrays, row: int) -> bool:
    """The class's dynamic filters on one row, each plugin's scalar version where it has one,
    stopping at the first that fails (the one-row refresh and the victim search both ask this)."""
    one = None
    for f, fits in zip(entry.dyn_filters, entry.row_filters, strict=True):
        if fits is not None:
            ok = fits(state, row)
        else:
            one = np.array([row], np.int64) if one is None else one
            ok = bool(f.filter(entry.tc, state, one)[0])
        if not ok:
            return False
    return True
