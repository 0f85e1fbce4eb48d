"""anti_affinity: keep tasks apart across a topology domain (node, zone, rack...).

With no match labels it spreads the job's own tasks of the group (one per domain); with match
labels it avoids domains holding any task of a job whose labels include them, and, the other way
round as Kubernetes has it, a task whose job carries those labels avoids the domains of the tasks
with such a rule (`ClusterArrays.repellers`).

For preemption, `evictable_blockers` says which excluded nodes evicting tasks on the node itself
would clear (kube-scheduler takes the lower-priority pods off a node and filters it again).
"""

import numpy as np
import numpy.typing as npt

from gosched.common.cluster_state import ClusterArrays, Resident
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

    def evictable_blockers(
        self, tc: TaskClass, ctx: UnitContext, state: ClusterArrays
    ) -> dict[int, list[Resident]]:
        """The rows `excluded` rules out only for tasks of other jobs on that very row, each with
        those tasks: evicting them clears every rule there, as kube-scheduler's preemption finds by
        taking the lower-priority pods off the node and running the filters again. A row is left
        out when a domain of it holds a conflicting task on another row (kube-scheduler evicts on
        the candidate node alone) or one of the unit's own job (never a victim). Whether the tasks
        may go (priority, budgets, floors, in flight) is the victim search's to say. Only asked
        when preempting: it goes resident by resident."""
        own = ctx.unit.job.id
        conflicts = _conflicts(tc, ctx, state)
        # Only a row holding every conflict of some domain can be cleared; then it must be so for
        # each rule whose domain of it holds any.
        rows: set[int] = set()
        for _, by_domain in conflicts:
            for pairs in by_domain.values():
                first = pairs[0][0]
                if all(row == first and r is not None and r.job_id != own for row, r in pairs):
                    rows.add(first)
        out: dict[int, list[Resident]] = {}
        for row in rows:
            blockers: dict[str, Resident] = {}
            for domains, by_domain in conflicts:
                domain = int(domains[row])
                found = by_domain.get(domain) if domain >= 0 else None
                if not found:
                    continue
                if not all(other == row and r is not None and r.job_id != own for other, r in found):
                    break
                for _, r in found:
                    assert r is not None  # checked just above
                    blockers[r.task_id] = r
            else:
                out[row] = list(blockers.values())
        return out


# Per rule that applies: each row's domain id, and per domain the (row, task) pairs in conflict
# with the task; None for the task: one of the unit's own placements of this attempt.
Conflicts = list[tuple[npt.NDArray[np.int64], dict[int, list[tuple[int, Resident | None]]]]]


def _conflicts(tc: TaskClass, ctx: UnitContext, state: ClusterArrays) -> Conflicts:
    """What `excluded` rules out, task by task: the same rules, both ways."""
    job = ctx.unit.job
    out: Conflicts = []

    def add(
        domains: npt.NDArray[np.int64],
        by: dict[int, list[tuple[int, Resident | None]]],
        row: int,
        r: Resident | None,
    ) -> None:
        domain = int(domains[row])
        if domain >= 0:
            by.setdefault(domain, []).append((row, r))

    if job.labels and state.repellers:
        labels = set(job.labels)
        for rule, held in state.repellers.items():
            if set(rule.match_labels) <= labels:
                domains = domain_ids(state, rule.topology_key)
                by: dict[int, list[tuple[int, Resident | None]]] = {}
                for row in held:
                    for r in state.residents[row].values():
                        if rule in r.repels:
                            add(domains, by, row, r)
                out.append((domains, by))
    for rule in tc.group.anti_affinity:
        domains = domain_ids(state, rule.topology_key)
        by = {}
        if not rule.match_labels:
            role = tc.group.role
            for row, placed_role in ctx.placed_rows:
                if placed_role == role:
                    add(domains, by, row, None)
            for tid in job.task_ids():  # tasks of the same job and group bound earlier
                bound = state.task_row.get(tid)
                if bound is not None:
                    r = state.residents[bound][tid]
                    if r.role == role:
                        add(domains, by, bound, r)
        else:
            wanted = set(rule.match_labels)
            for row in range(state.n):
                for r in state.residents[row].values():
                    if wanted <= set(r.job_labels):
                        add(domains, by, row, r)
            if wanted <= set(job.labels):
                for row, _ in ctx.placed_rows:
                    add(domains, by, row, None)
        out.append((domains, by))
    return out


def _repelled_domains(labels: set[tuple[str, str]], state: ClusterArrays, out: Mask) -> None:
    """Mark in `out` the domains of the residents whose rules repel a job with `labels` (the unit's
    own placements of this attempt are in the view, so they count too)."""
    for rule, rows in state.repellers.items():
        if set(rule.match_labels) <= labels:
            domains = domain_ids(state, rule.topology_key)
            taken = domains[list(rows)]
            out |= np.isin(domains, taken[taken >= 0])
