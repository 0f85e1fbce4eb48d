"""anti_affinity: keep tasks apart across a topology domain (node, zone, rack...).

With no match labels it spreads the job's own tasks of the group (one per domain); with match
labels it avoids domains holding any task of a job whose labels include them, and, the other way
round as Kubernetes has it, a task whose job carries those labels avoids the domains of the tasks
with such a rule (`ClusterArrays.repellers`).
"""

import numpy as np

from gosched.common.cluster_state import ClusterArrays
from gosched.scheduler_shard.framework.interfaces import Mask, UnitFilterPlugin
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.framework.task_class import TaskClass
from gosched.scheduler_shard.plugins.labels import domain_ids
from gosched.scheduler_shard.unit_context import UnitContext


@register
class AntiAffinityFilter(UnitFilterPlugin):
    name = "anti_affinity"
    reason = "anti-affinity"

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return bool(tc.group.anti_affinity or state.repellers)

    def excluded(self, tc: TaskClass, ctx: UnitContext, state: ClusterArrays) -> Mask | None:
        job = ctx.unit.job
        out = np.zeros(state.n, np.bool_)
        if job.labels and state.repellers:
            _repelled_domains(set(job.labels), state, out)
        for rule in tc.group.anti_affinity:
            domains = domain_ids(state, rule.topology_key)
            taken: set[int] = set()
            if not rule.match_labels:
                rows = [row for row, role in ctx.placed_rows if role == tc.group.role]
                # tasks of the same job and group bound earlier (a gang's later attempt)
                for tid in job.task_ids():
                    row = state.task_row.get(tid)
                    if row is not None and state.residents[row][tid].role == tc.group.role:
                        rows.append(row)
            else:
                wanted = set(rule.match_labels)
                rows = [
                    row
                    for row in range(state.n)
                    for r in state.residents[row].values()
                    if wanted <= set(r.job_labels)
                ]
                if wanted <= set(job.labels):
                    rows.extend(row for row, _ in ctx.placed_rows)
            taken = {int(domains[row]) for row in rows if domains[row] >= 0}
            if taken:
                out |= np.isin(domains, list(taken))
        # None when nothing is excluded: the placer then keeps the class's cached scores.
        return out if out.any() else None


def _repelled_domains(labels: set[tuple[str, str]], state: ClusterArrays, out: Mask) -> None:
    """Mark in `out` the domains of the residents whose rules repel a job with `labels` (the unit's
    own placements of this attempt are in the view, so they count too)."""
    for rule, rows in state.repellers.items():
        if set(rule.match_labels) <= labels:
            domains = domain_ids(state, rule.topology_key)
            taken = domains[list(rows)]
            out |= np.isin(domains, taken[taken >= 0])
