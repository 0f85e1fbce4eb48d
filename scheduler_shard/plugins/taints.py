"""taint_toleration filter (NoSchedule / NoExecute) and taint_prefer_no_schedule score."""

import numpy as np

from gosched.common.cluster_state import ClusterArrays
from gosched.common.job import Toleration, tolerates
from gosched.common.node import Taint, TaintEffect
from gosched.scheduler_shard.framework.interfaces import FilterPlugin, Mask, Rows, ScorePlugin, Scores
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.framework.task_class import TaskClass
from gosched.scheduler_shard.plugins.labels import taint_groups

HARD = (TaintEffect.NO_SCHEDULE, TaintEffect.NO_EXECUTE)


def first_untolerated(tolerations: tuple[Toleration, ...], taints: tuple[Taint, ...]) -> Taint | None:
    for taint in taints:
        if taint.effect in HARD and not tolerates(tolerations, taint):
            return taint
    return None


@register
class TaintToleration(FilterPlugin):
    name = "taint_toleration"
    reason = "untolerated taint"

    def filter(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Mask:
        ok = np.ones(state.n, np.bool_)
        for taints, set_rows in taint_groups(state):
            if first_untolerated(tc.group.tolerations, taints) is not None:
                ok[set_rows] = False
        return ok[rows]

    def explain(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> list[tuple[str, Mask]]:
        # One reason per distinct taint, e.g. "taint gpu=reserved", as `explain` shows it.
        by_reason: dict[str, np.ndarray] = {}
        for taints, set_rows in taint_groups(state):
            taint = first_untolerated(tc.group.tolerations, taints)
            if taint is not None:
                reason = f"taint {taint.key}={taint.value}" if taint.value else f"taint {taint.key}"
                by_reason.setdefault(reason, np.zeros(state.n, np.bool_))[set_rows] = True
        return [(reason, mask[rows]) for reason, mask in by_reason.items()]


@register
class TaintPreferNoSchedule(ScorePlugin):
    """100 minus 100 per untolerated PreferNoSchedule taint (floored at 0)."""

    name = "taint_prefer_no_schedule"
    soft_rule = True

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        counts = np.zeros(state.n, np.float64)
        for taints, set_rows in taint_groups(state):
            soft = [t for t in taints if t.effect == TaintEffect.PREFER_NO_SCHEDULE]
            counts[set_rows] = sum(1 for t in soft if not tolerates(tc.group.tolerations, t))
        return np.clip(100.0 - 100.0 * counts, 0.0, 100.0)[rows]
