"""node_selector, node_affinity (required) filters and preferred_affinity score."""

import numpy as np

from gosched.common.cluster_state import ClusterArrays
from gosched.common.job import Requirement, SelectorOp
from gosched.scheduler_shard.framework.interfaces import FilterPlugin, Mask, Rows, ScorePlugin, Scores
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.framework.task_class import TaskClass
from gosched.scheduler_shard.plugins.labels import requirement_mask, term_mask


@register
class NodeSelector(FilterPlugin):
    name = "node_selector"
    reason = "node selector mismatch"

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return bool(tc.group.node_selector)

    def filter(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Mask:
        mask = np.ones(state.n, np.bool_)
        for key, value in tc.group.node_selector:
            mask &= requirement_mask(state, Requirement(key, SelectorOp.IN, (value,)))
        return mask[rows]


@register
class NodeAffinity(FilterPlugin):
    name = "node_affinity"
    reason = "node affinity mismatch"

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return bool(tc.group.required_affinity)

    def filter(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Mask:
        mask = np.zeros(state.n, np.bool_)
        for term in tc.group.required_affinity:  # terms are ORed
            mask |= term_mask(state, term)
        return mask[rows]


@register
class PreferredAffinity(ScorePlugin):
    """Sum of the weights of matched preferred terms, over the sum of all weights, times 100."""

    name = "preferred_affinity"
    soft_rule = True

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return bool(tc.group.preferred_affinity)

    def score(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Scores:
        total = np.zeros(state.n, np.float64)
        weights = 0
        for pref in tc.group.preferred_affinity:
            total += pref.weight * term_mask(state, pref.term)
            weights += pref.weight
        return (100.0 * total / max(1, weights))[rows]
