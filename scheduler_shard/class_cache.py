"""Filter and score results per task class, kept over all nodes and refreshed row by row.

Static plugins (node metadata only) are computed once per class and metadata generation. Dynamic
ones (usage) are recomputed for the rows the view's dirty log names since the class last looked,
so placing a task costs work on one row plus an argmax, not a pass over every node.

The argmax is remembered too (`ClassCache.remembered_best_row`, for one mask at a time): each
refresh checks the rows it recomputed against the remembered best; a drop in the best row's own
score, a full refresh or another mask forgets it. Bin-packing raises the score of the row just
placed on, so a run of like tasks pays for one argmax over the rows per node filled rather than
one per task.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gosched.common.cluster_state import ClusterArrays
from gosched.common.job import TaskGroup
from gosched.scheduler_shard.framework.interfaces import (
    FilterPlugin,
    Mask,
    RowFilter,
    Rows,
    RowScore,
    ScorePlugin,
)
from gosched.scheduler_shard.framework.profile import Profile
from gosched.scheduler_shard.framework.task_class import TaskClass, class_of

F = npt.NDArray[np.float64]
# A class's whole one-row refresh: the row's effective score, or None where a filter rules it out.
RowEval = Callable[[ClusterArrays, int], float | None]
NEG_INF = -np.inf
MAX_CLASSES = 4096
ALL_ROWS = np.ones(0, np.bool_)  # the remembered argmax's key when it is over every row (a marker)
ALL_ROWS.flags.writeable = False


def best_row(eff: F, rows: npt.NDArray[np.intp] | None) -> int:
    """The highest-scoring row among `rows` (ascending; None = all), ties to the lowest; -1 when
    there is none. The caller checks the score: it may be NEG_INF (nothing fits)."""
    if rows is not None:
        return int(rows[eff[rows].argmax()]) if rows.size else -1
    # An empty view (no node known yet, e.g. before the first sync) fits nothing.
    return int(eff.argmax()) if eff.size else -1


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
    # The one-row refresh as one closure (_row_eval), or None where a plugin has no scalar version.
    row_eval: RowEval | None = None
    # The remembered best_row: over the rows of best_key (a read-only mask, or ALL_ROWS), and its
    # score. None: nothing remembered.
    best_key: npt.NDArray[np.bool_] | None = None
    best: int = -1
    best_score: float = NEG_INF
    # The soft-rule part of the static score (ScorePlugin.soft_rule, weighted as in the total), per
    # row; None when it is the same on every statically feasible row (nothing preferred: the usual
    # case). soft_top is its highest value on such a row.
    soft: F | None = None
    soft_top: float = NEG_INF
    # The statically feasible rows by soft score, highest first (ties: lowest row first), and minus
    # their scores (ascending, for searchsorted); built on first use, dropped with `soft`.
    soft_order: npt.NDArray[np.intp] | None = None
    soft_neg: F | None = None
    # Remembered: no row of soft_none_key (a read-only mask, or ALL_ROWS) with a soft score above
    # soft_none_level is feasible, as of the last refresh (a refresh making such a row feasible
    # forgets it). None: nothing remembered.
    soft_none_key: npt.NDArray[np.bool_] | None = None
    soft_none_level: float = NEG_INF


class ClassCache:
    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.entries: dict[tuple[object, ...], ClassEntry] = {}
        # Bumped when a score plugin's learned model changes: every cached score is then stale.
        self.model_generation = 0
        # The last group asked for and its entry: a batch's units share their job's TaskGroup
        # object (interned, then one object per message), and building and hashing its key cost
        # more than the one-row refresh.
        self._last_group: TaskGroup | None = None
        self._last_entry: ClassEntry | None = None

    def models_changed(self) -> None:
        self.model_generation += 1

    def entry(self, group: TaskGroup, state: ClusterArrays) -> ClassEntry:
        """The class entry of `group`, refreshed to the view's state (this runs once per task
        placed: the usual case, the row the last placement dirtied, is read inline)."""
        entry = self._last_entry
        if group is not self._last_group or entry is None:
            key = group.constraint_key()
            found = self.entries.get(key)
            if found is None:
                if len(self.entries) >= MAX_CLASSES:
                    self.entries.clear()
                found = self.entries[key] = ClassEntry(tc=class_of(group))
            entry = found
            self._last_group, self._last_entry = group, entry
        if (
            entry.meta_gen != state.meta_generation
            or entry.n != state.n
            or entry.state_id != id(state)
            or entry.model_gen != self.model_generation
        ):
            self._full(entry, state)
            return entry
        # state.dirty_since(entry.position), read in place.
        base, log = state.dirty_base, state.dirty_log
        start = entry.position - base
        if start < 0:  # the log was compacted past this entry: too old
            self._full(entry, state)
            return entry
        entry.position = base + len(log)
        new = len(log) - start
        if new == 1:  # the usual case: the row the last placement dirtied
            row = log[-1]
            if row < entry.n:
                # _update for one row, accumulated in Python floats in the same order, with each
                # plugin's scalar version where it has one (numpy calls on one-element arrays
                # cost more than the arithmetic), stopping at the first filter that fails.
                evaluate = entry.row_eval
                score = evaluate(state, row) if evaluate is not None else self._row_score(entry, state, row)
                if (
                    score is not None
                    and row == entry.best
                    and score >= entry.best_score
                    and entry.best_key is not None
                    and entry.soft_none_key is None
                ):
                    # _store_row's usual case inline: packing raised the remembered best row's
                    # score, so it is still the best.
                    entry.eff[row] = entry.best_score = score
                else:
                    _store_row(entry, row, score)
        elif new > 0:
            idx = np.unique(np.array(log[start:], np.int64))
            idx = idx[idx < entry.n]
            self._update(entry, state, idx)
        return entry

    def remembered_best_row(
        self, entry: ClassEntry, mask: Mask | None, rows: npt.NDArray[np.intp] | None
    ) -> int:
        """best_row(entry.eff, rows) where `rows` are the rows of `mask` (None: every row), as of
        the entry's last refresh: call it right after entry(). Remembered for read-only masks (a
        mask that can change in place cannot be known by its identity)."""
        key = ALL_ROWS if mask is None else mask
        if entry.best_key is key:
            return entry.best
        row = best_row(entry.eff, rows)
        if row >= 0 and (mask is None or not mask.flags.writeable):
            entry.best_key, entry.best, entry.best_score = key, row, float(entry.eff[row])
        return row

    def _full(self, entry: ClassEntry, state: ClusterArrays) -> None:
        tc, n, all_rows = entry.tc, state.n, slice(0, state.n)
        ok = np.ones(n, np.bool_)
        for f in self.profile.static_filters:
            if f.relevant(tc, state):
                ok &= f.filter(tc, state, all_rows)
        score = np.zeros(n, np.float64)
        soft: F | None = None
        dyn_scores = []
        for plugin, weight in self.profile.scores:
            if not plugin.relevant(tc, state):
                continue
            if plugin.dynamic:
                dyn_scores.append((plugin, weight))
                continue
            weighted = weight * plugin.score(tc, state, all_rows)
            score += weighted
            if plugin.soft_rule:
                soft = weighted if soft is None else soft + weighted
        entry.static_ok, entry.static_score = ok, score
        entry.soft, entry.soft_top = _soft_part(soft, ok)
        entry.soft_order = entry.soft_neg = entry.soft_none_key = None
        entry.dyn_filters = [f for f in self.profile.dynamic_filters if f.relevant(tc, state)]
        entry.dyn_scores = dyn_scores
        entry.row_filters = [f.row_filter(tc) for f in entry.dyn_filters]
        entry.row_scores = [p.row_score(tc) for p, _ in dyn_scores]
        entry.row_eval = _cpu_memory_row_eval(entry, state) or _row_eval(entry)
        entry.eff = np.full(n, NEG_INF)
        entry.best_key = None
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
        if entry.best_key is not None and isinstance(rows, np.ndarray):
            _note_rows(entry, rows)
        if entry.soft_none_key is not None:
            assert entry.soft is not None
            if (ok & (entry.soft[rows] > entry.soft_none_level)).any():
                entry.soft_none_key = None  # a row above the remembered level fits now

    @staticmethod
    def _row_score(entry: ClassEntry, state: ClusterArrays, row: int) -> float | None:
        """The one-row refresh where some plugin has no scalar version (its vector on one row)."""
        if not entry.static_ok.item(row) or not passes_dynamic_filters(entry, state, row):
            return None
        tc, one = entry.tc, None
        score: float = entry.static_score.item(row)
        for (plugin, weight), row_score in zip(entry.dyn_scores, entry.row_scores, strict=True):
            if row_score is not None:
                score += weight * row_score(state, row)
            else:
                one = np.array([row], np.int64) if one is None else one
                score += weight * float(plugin.score(tc, state, one)[0])
        return score

    def softer_row(self, entry: ClassEntry, eff: F, row: int, own: Mask, wider: Mask | None) -> int:
        """A row of `wider` (None: every row) outside `own` to take instead of `row`, the best of
        `own` for `eff` (entry.eff or a copy the unit filters ruled more rows out of), or -1 to keep
        `row`: call it right after entry(), only when entry.soft is set and row's soft score is
        below entry.soft_top.

        Leave `own` when the fitting rows of `wider` reach a higher soft score than any fitting row
        of `own` does; then take the best total score among the rows above that (all outside `own`).
        Packing never moves a task out of `own`: a row elsewhere must keep the soft rules better.
        Costs a gather over the rows scoring above `row`'s, and nothing while remembered that none
        of them fits."""
        soft = entry.soft
        assert soft is not None
        level = soft.item(row)
        key = ALL_ROWS if wider is None else wider
        if entry.soft_none_key is key and level >= entry.soft_none_level:
            return -1
        order, neg = self._soft_order(entry)
        k = int(np.searchsorted(neg, -level, side="left"))  # the rows scoring above `level`
        above = order[:k]  # highest first; rows ascending within a score
        scores = eff[above]
        fits = scores != NEG_INF
        if wider is not None:
            fits &= wider[above]
        above = above[fits]
        if not above.size:
            if eff is entry.eff and (wider is None or not wider.flags.writeable):
                entry.soft_none_key, entry.soft_none_level = key, level
            return -1
        scores = scores[fits]
        mine = own[above]
        if mine.any():  # leave only for rows above the best the own rows reach
            minus = neg[:k][fits]  # minus their soft scores, ascending
            keep = minus < minus[int(mine.argmax())]
            above, scores = above[keep], scores[keep]
            if not above.size:
                return -1
        # The best total score, ties to the lowest row (`above` is ascending within a soft score).
        return int(above[scores == scores.max()].min())

    def _soft_order(self, entry: ClassEntry) -> tuple[npt.NDArray[np.intp], F]:
        if entry.soft_order is None or entry.soft_neg is None:
            assert entry.soft is not None
            rows = np.flatnonzero(entry.static_ok)
            neg = -entry.soft[rows]
            by = np.argsort(neg, kind="stable")
            entry.soft_order, entry.soft_neg = rows[by], neg[by]
        return entry.soft_order, entry.soft_neg

    def oldest_position(self) -> int | None:
        return min((e.position for e in self.entries.values()), default=None)


def _row_eval(entry: ClassEntry) -> RowEval | None:
    """The entry's one-row refresh as one closure over its arrays and scalar plugins, when every
    dynamic plugin has a scalar version: the same checks and sums in the same order as
    ClassCache._row_score, without its per-call lookups and zips (it runs once per task placed)."""
    if any(f is None for f in entry.row_filters) or any(s is None for s in entry.row_scores):
        return None
    static_ok, static_score = entry.static_ok, entry.static_score
    filters = tuple(f for f in entry.row_filters if f is not None)
    weights = [weight for _, weight in entry.dyn_scores]
    scores = tuple((w, s) for w, s in zip(weights, entry.row_scores, strict=True) if s is not None)

    def evaluate(state: ClusterArrays, row: int) -> float | None:
        if not static_ok.item(row):
            return None
        for fits in filters:
            if not fits(state, row):
                return None
        score: float = static_score.item(row)
        for weight, row_score in scores:
            score += weight * row_score(state, row)
        return score

    return evaluate


def _cpu_memory_row_eval(entry: ClassEntry, state: ClusterArrays) -> RowEval | None:
    """The one-row refresh for a class whose every dynamic filter and score reads nothing of the row
    but its cpu and memory (FilterPlugin.fits_cpu_memory_only, ScorePlugin.fraction_score): the
    four values are read once for all of them, not once per plugin. The same verdict and float as
    _row_eval (the same checks, fractions and sums in the same order); None for any other class.

    It reads `state`'s arrays through memoryviews taken now (an index into one costs about 60% of
    ndarray.item): valid for as long as the entry is, since the view's arrays are replaced only
    when it grows a row, and a new row count, like a new view, rebuilds the entry (_full)."""
    tc = entry.tc
    if not entry.dyn_filters and not entry.dyn_scores:
        return None
    if not all(f.fits_cpu_memory_only(tc) for f in entry.dyn_filters):
        return None
    forms = [p.fraction_score(tc) for p, _ in entry.dyn_scores]
    terms = tuple((weight, form) for (_, weight), form in zip(entry.dyn_scores, forms, strict=True) if form)
    if len(terms) != len(forms):
        return None
    # The static score where the static filters pass, -inf elsewhere: one read for both (static
    # scores are finite).
    static_base = np.where(entry.static_ok, entry.static_score, NEG_INF).data
    cpu_used, cpu_caps = state.cpu_used.data, state.cpu_cap.data
    mem_used, mem_caps = state.mem_used.data, state.mem_cap.data
    cpu, mem = tc.request.cpu_milli, tc.request.memory
    check_fit = bool(entry.dyn_filters)

    def evaluate(_: ClusterArrays, row: int) -> float | None:
        score: float = static_base[row]
        if score == NEG_INF:
            return None
        cpu_after, cpu_cap = cpu_used[row] + cpu, cpu_caps[row]
        mem_after, mem_cap = mem_used[row] + mem, mem_caps[row]
        if check_fit and (cpu_after > cpu_cap or (mem and mem_after > mem_cap)):
            return None
        # max(capacity, 1) as a conditional: the builtin's call costs more than the division.
        cpu_frac = cpu_after / (cpu_cap if cpu_cap > 1 else 1)
        mem_frac = mem_after / (mem_cap if mem_cap > 1 else 1)
        for weight, form in terms:
            score += weight * form(cpu_frac, mem_frac)
        return score

    return evaluate


def _soft_part(soft: F | None, ok: npt.NDArray[np.bool_]) -> tuple[F | None, float]:
    """The class's soft-rule scores and their top over the statically feasible rows, or (None,
    -inf) when they do not differ there: then no row can keep the soft rules better than another."""
    if soft is None:
        return None, NEG_INF
    feasible = soft[ok]
    if not feasible.size:
        return None, NEG_INF
    top = float(feasible.max())
    if top == float(feasible.min()):
        return None, NEG_INF
    return soft, top


def _store_row(entry: ClassEntry, row: int, score: float | None) -> None:
    """Keep `row`'s one-row refresh, `score` (None: a filter rules the row out)."""
    if score is None:
        entry.eff[row] = NEG_INF
        if entry.best_key is not None:
            _note_row(entry, row, NEG_INF)
        return
    entry.eff[row] = score
    if entry.best_key is not None:
        _note_row(entry, row, score)
    if entry.soft_none_key is not None:
        assert entry.soft is not None
        if entry.soft.item(row) > entry.soft_none_level:
            entry.soft_none_key = None  # a row above the remembered level fits now


def _note_row(entry: ClassEntry, row: int, score: float) -> None:
    """Keep the remembered argmax true after `row` was rescored to `score`."""
    key = entry.best_key
    assert key is not None
    if key is not ALL_ROWS and not (row < len(key) and key[row]):
        return
    best = entry.best
    if row == best:
        if score >= entry.best_score:  # every other row is at most its old score: still the best
            entry.best_score = score
        else:
            entry.best_key = None
    elif score > entry.best_score or (score == entry.best_score and row < best):
        entry.best, entry.best_score = row, score


def _note_rows(entry: ClassEntry, rows: npt.NDArray[np.int64]) -> None:
    """_note_row for the rows (ascending) of one vector refresh."""
    key = entry.best_key
    assert key is not None
    if key is not ALL_ROWS:
        rows = rows[rows < len(key)]
        rows = rows[key[rows]]
    if not rows.size:
        return
    eff, best = entry.eff, entry.best
    if best in rows:
        if eff[best] < entry.best_score:
            entry.best_key = None
            return
        entry.best_score = float(eff[best])
    scores = eff[rows]
    at = int(scores.argmax())
    top, row = float(scores[at]), int(rows[at])
    if top > entry.best_score or (top == entry.best_score and row < entry.best):
        entry.best, entry.best_score = row, top


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
