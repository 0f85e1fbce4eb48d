"""The binder's check stages, run in order over one proposal's placements.

Each stage has a `name` and, called with the unit under check and its placements still passing,
returns one verdict per placement: None (passes) or the reason it fails. The runner (binder.py)
applies the gang check between stages. Stages see the authoritative arrays as they are after the
earlier proposals of the batch were applied, and `BatchScope` for what those proposals claimed.

Static checks shared with the vectorised fast path live here too (`request_error`, `gpu_shape_error`)
so that both paths judge a placement the same way.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gosched.binder.state import BinderState
from gosched.common.cluster_state import MAX_GPUS, ClusterArrays, Resident
from gosched.common.job import AntiAffinity, Job, task_id
from gosched.common.messages import Floor, Placement, Proposal, floor_kept
from gosched.common.resources import GPU_MILLI, ResourceRequest


# -- static checks (also used by the fast path) -----------------------------------------------------
def request_error(req: ResourceRequest) -> str | None:
    """A request the binder cannot account for (negative amounts, both GPU forms)."""
    if req.cpu_milli < 0 or req.memory < 0 or req.gpus < 0 or req.gpu_milli < 0:
        return "request has a negative amount"
    if any(amount < 0 for _, amount in req.extended):
        return "request has a negative extended amount"
    if req.gpus and req.gpu_milli:
        return "request asks for whole GPUs and a GPU share at once"
    return None


def gpu_shape_error(req: ResourceRequest, gpus: tuple[tuple[int, int], ...]) -> str | None:
    """The proposed (GPU index, milli) pairs do not match the request's GPU demand."""
    if req.gpus:
        if len(gpus) != req.gpus or any(m != GPU_MILLI for _, m in gpus):
            return f"GPU assignment {list(gpus)} does not give {req.gpus} whole GPU(s)"
    elif req.gpu_milli:
        if len(gpus) != 1 or gpus[0][1] != req.gpu_milli:
            return f"GPU assignment {list(gpus)} does not give a {req.gpu_milli}m share of one GPU"
    elif gpus:
        return f"GPU assignment {list(gpus)} for a task that asks for no GPU"
    seen: set[int] = set()
    for g, _ in gpus:
        if not 0 <= g < MAX_GPUS:
            return f"no GPU {g}"
        if g in seen:
            return "a GPU is assigned twice"
        seen.add(g)
    return None


def gang_need(proposal: Proposal, truth: BinderState) -> int:
    """Placements the unit needs: its min_needed, plus one for each task the dispatcher counted
    as held that is no longer resident (the gang lost members while the unit was in flight)."""
    resident = len(truth.job_tasks.get(proposal.job.id, ()))
    return max(1, proposal.min_needed + max(0, proposal.held - resident))


# -- per-unit scratch --------------------------------------------------------------------------------
@dataclass(slots=True)
class BatchScope:
    """What the earlier proposals of the batch did (the arrays already show it)."""

    # The binder version of the view the batch was planned on (ProposalBatch.seen_version); None
    # outside a commit (gang breaks of lost nodes check no plan).
    seen_version: int | None = None
    claimed_victims: set[str] = field(default_factory=set)  # victims named and evicted
    evicted: set[str] = field(default_factory=set)  # every task evicted so far (gang breaks included)
    placed: set[str] = field(default_factory=set)  # tasks bound so far


@dataclass(slots=True)
class Candidate:
    """One placement of the unit under check, with what the stages learn about it."""

    pos: int  # position in proposal.placements
    placement: Placement
    task_id: str
    request: ResourceRequest | None = None
    row: int = -1


@dataclass(slots=True)
class Credit:
    """Resources on one node that the unit's victims will free (or its earlier placements took)."""

    cpu: int = 0
    memory: int = 0
    extended: dict[str, int] = field(default_factory=dict)
    gpus: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class UnitCheck:
    proposal: Proposal
    state: BinderState
    scope: BatchScope
    # Filled by victims_valid: victims of the placements that passed it, and what they free per row.
    victims: dict[str, int] = field(default_factory=dict)  # victim task id -> row
    credit: dict[int, Credit] = field(default_factory=dict)

    @property
    def job(self) -> Job:
        return self.proposal.job


class Stage(Protocol):
    name: str

    def __call__(self, unit: UnitCheck, candidates: Sequence[Candidate]) -> list[str | None]: ...


# -- the stages --------------------------------------------------------------------------------------
class TaskValid:
    """The task exists in its job, is proposed once, and is not bound already (or in this batch)."""

    name = "task_valid"

    def __call__(self, unit: UnitCheck, candidates: Sequence[Candidate]) -> list[str | None]:
        job = unit.job
        if job.id in unit.state.cancelled:
            return [f"job {job.id} was cancelled"] * len(candidates)
        total = job.total_replicas
        seen: set[int] = set()
        task_row = unit.state.arrays.task_row
        scope = unit.scope
        out: list[str | None] = []
        for c in candidates:
            idx = c.placement.task_index
            if not 0 <= idx < total:
                out.append(f"job {job.id} has no task {idx}")
                continue
            if idx in seen:
                out.append(f"task {c.task_id} is proposed twice")
                continue
            seen.add(idx)
            c.request = job.group_of(idx).resources
            bad = request_error(c.request)
            if bad is not None:
                out.append(f"task {c.task_id}: {bad}")
            elif c.task_id in scope.placed:
                out.append(f"task {c.task_id} was bound by an earlier proposal in this batch")
            elif c.task_id in scope.evicted:
                out.append(f"task {c.task_id} was evicted earlier in this batch")
            elif c.task_id in task_row:
                node = unit.state.node_name(task_row[c.task_id])
                out.append(f"task {c.task_id} is already bound to {node}")
            else:
                out.append(None)
        return out


class NodeExists:
    name = "node_exists"

    def __call__(self, unit: UnitCheck, candidates: Sequence[Candidate]) -> list[str | None]:
        row_of = unit.state.arrays.row_of
        out: list[str | None] = []
        for c in candidates:
            row = row_of.get(c.placement.node)
            if row is None:
                out.append(f"node {c.placement.node} is gone")
            else:
                c.row = row
                out.append(None)
        return out


class NodeSchedulable:
    name = "node_schedulable"

    def __call__(self, unit: UnitCheck, candidates: Sequence[Candidate]) -> list[str | None]:
        a = unit.state.arrays
        out: list[str | None] = []
        for c in candidates:
            if a.schedulable[c.row]:
                out.append(None)
            else:
                node = a.nodes[c.row]
                state = "gone" if node is None else node.state.value
                out.append(f"node {c.placement.node} is {state}")
        return out


class NodeCurrent:
    """The node's labels, taints and GPUs are those the shard planned on: they changed, or the node
    was removed and added again, after the batch's view (BinderState.rules_version). The binder
    does not check selectors, affinity, tolerations or GPU models itself; a plan made on older
    rules is refused, and the shard plans again on the new ones."""

    name = "node_current"

    def __call__(self, unit: UnitCheck, candidates: Sequence[Candidate]) -> list[str | None]:
        seen = unit.scope.seen_version
        if seen is None:
            return [None] * len(candidates)
        changed = unit.state.rules_version
        return [
            None
            if changed[c.row] <= seen
            else f"node {c.placement.node} changed (labels, taints or GPUs) after the plan's view"
            for c in candidates
        ]


class VictimsValid:
    """Every victim is still bound to the placement's node, preemptible, of another job, and not
    claimed by an earlier proposal of the batch. Records the victims and what they free per node."""

    name = "victims_valid"

    def __call__(self, unit: UnitCheck, candidates: Sequence[Candidate]) -> list[str | None]:
        scope = unit.scope
        state = unit.state
        job_id = unit.job.id
        out: list[str | None] = []
        for c in candidates:
            reason = None
            for v in c.placement.victims:
                if v in scope.claimed_victims:
                    reason = f"victim {v} was already claimed by an earlier proposal in this batch"
                    break
                if v in scope.evicted:
                    reason = f"victim {v} was already evicted earlier in this batch"
                    break
                got = state.resident(v)
                if got is None:
                    reason = f"victim {v} is no longer bound"
                    break
                row, r = got
                if row != c.row:
                    reason = f"victim {v} is bound to {state.node_name(row)}, not {c.placement.node}"
                    break
                if r.job_id == job_id:
                    reason = f"victim {v} belongs to the preempting job"
                    break
                if not r.preemptible:
                    reason = f"victim {v} is not preemptible"
                    break
            out.append(reason)
            if reason is None:
                for v in c.placement.victims:
                    if v in unit.victims:
                        continue
                    got = state.resident(v)
                    assert got is not None  # checked just above
                    row, r = got
                    unit.victims[v] = row
                    credit = unit.credit.get(row)
                    if credit is None:
                        credit = unit.credit[row] = Credit()
                    credit.cpu += r.cpu_milli
                    credit.memory += r.memory
                    for name, amount in r.extended:
                        credit.extended[name] = credit.extended.get(name, 0) + amount
                    for g, milli in r.gpus:
                        credit.gpus[g] = credit.gpus.get(g, 0) + milli
        return out


class QueueFloorsHold:
    """Evicting the unit's victims leaves every other guaranteed queue at or above its floor in
    some resource (the floors the dispatcher gave the unit, `Proposal.floors`), gang breaks
    included, as the shard's victim pricing judged it. Shards price on views that can be a round
    behind one another's evictions; the truth is checked here.

    Victims are evicted per node (every victim on a node the unit keeps a placement on), so the
    verdict is per node too: in the order the placements name them, a node whose victims would take
    a queue below its floor, with those of the nodes kept before it, fails all its placements, and
    its victims are no longer counted (victims and credit) by the stages after this one."""

    name = "queue_floors"

    def __call__(self, unit: UnitCheck, candidates: Sequence[Candidate]) -> list[str | None]:
        own = unit.job.queue
        floors = {
            f.queue: (f.cpu_milli, f.memory, f.gpu_milli) for f in unit.proposal.floors if f.queue != own
        }
        if not floors or not unit.victims:
            return [None] * len(candidates)
        state = unit.state
        return _judge_rows(
            unit,
            candidates,
            lambda r: r.queue in floors,
            lambda victims: _floor_broken(state, floors, victims),
        )


class DisruptionBudgetsHold:
    """Evicting the unit's victims takes no job with a disruption_budget past it: its tasks down
    already (evicted or lost and not running since, earlier evictions of this batch included) and
    those this unit takes down (its victims, and the rest of each gang they break) stay within
    the budget, as the shard's victim pricing judged it on its view. Per node, as queue_floors."""

    name = "disruption_budgets"

    def __call__(self, unit: UnitCheck, candidates: Sequence[Candidate]) -> list[str | None]:
        if not unit.victims:
            return [None] * len(candidates)
        state = unit.state
        return _judge_rows(
            unit,
            candidates,
            lambda r: r.disruption_budget is not None,
            lambda victims: _budget_broken(state, victims),
        )


def _judge_rows(
    unit: UnitCheck,
    candidates: Sequence[Candidate],
    ruled: Callable[[Resident], bool],
    broken: Callable[[list[Resident]], str | None],
) -> list[str | None]:
    """A rule over the unit's victims judged node by node, in the order the placements name them:
    a node whose `ruled` victims, with those of the nodes kept before it, are `broken` fails all its
    placements, and its victims are no longer counted (victims and credit) by the stages after."""
    residents = unit.state.arrays.residents
    by_row: dict[int, list[Resident]] = {}
    for v, row in unit.victims.items():
        r = residents[row][v]
        if ruled(r):
            by_row.setdefault(row, []).append(r)
    if not by_row:
        return [None] * len(candidates)
    kept: list[Resident] = []
    refused: dict[int, str] = {}
    for row in dict.fromkeys(c.row for c in candidates):
        victims = by_row.get(row)
        if not victims:
            continue
        reason = broken([*kept, *victims])
        if reason is None:
            kept.extend(victims)
        else:
            refused[row] = reason
    for row in refused:
        for v in [v for v, r in unit.victims.items() if r == row]:
            del unit.victims[v]
        unit.credit.pop(row, None)
    return [refused.get(c.row) for c in candidates]


def _gone_with(state: BinderState, direct: list[Resident]) -> list[Resident]:
    """The residents of one job that evicting `direct` takes: them, or every one if they leave
    its gang below min_member (the binder then breaks it)."""
    first = direct[0]
    resident = state.job_tasks.get(first.job_id, set())
    if first.min_member > 1 and len(resident) - len(direct) < first.min_member:
        return [got[1] for got in map(state.resident, resident) if got is not None]
    return direct


def _by_job(victims: list[Resident]) -> dict[str, list[Resident]]:
    out: dict[str, list[Resident]] = {}
    for r in victims:
        out.setdefault(r.job_id, []).append(r)
    return out


def _budget_broken(state: BinderState, victims: list[Resident]) -> str | None:
    """Why evicting `victims` takes a job past its disruption budget, or None."""
    down = state.arrays.down_tasks
    for job_id, direct in _by_job(victims).items():
        budget = direct[0].disruption_budget
        assert budget is not None  # only such victims are judged
        already = down.count(job_id)
        # A victim bound again and not yet running is down already: evicting it adds none.
        going = sum(1 for r in _gone_with(state, direct) if r.task_id not in down)
        if already + going > budget:
            return (
                f"evicting its victims would take job {job_id} past its disruption budget "
                f"({budget}, {already} down already)"
            )
    return None


def _floor_broken(state: BinderState, floors: dict[str, Floor], victims: list[Resident]) -> str | None:
    """Why evicting `victims` (and the rest of each gang they leave below its min_member) takes a
    queue below its floor in every resource, or None."""
    taken: dict[str, list[int]] = {}
    for direct in _by_job(victims).values():
        acc = taken.setdefault(direct[0].queue, [0, 0, 0])
        for r in _gone_with(state, direct):  # the gang breaks
            acc[0] += r.cpu_milli
            acc[1] += r.memory
            acc[2] += sum(m for _, m in r.gpus)
    for queue, lost in taken.items():
        held = state.queue_usage(queue)
        if not floor_kept([h - x for h, x in zip(held, lost, strict=True)], floors[queue]):
            return f"evicting its victims would take queue {queue} below its guaranteed share"
    return None


class ResourcesFit:
    """cpu, memory and extended resources fit on the node, counting the unit's victims there as gone
    and its earlier placements there as taken."""

    name = "resources_fit"

    def __call__(self, unit: UnitCheck, candidates: Sequence[Candidate]) -> list[str | None]:
        a = unit.state.arrays
        taken: dict[int, Credit] = {}
        none = Credit()
        out: list[str | None] = []
        for c in candidates:
            req = c.request
            assert req is not None
            row = c.row
            freed = unit.credit.get(row, none)
            used = taken.get(row, none)
            reason = None
            if a.cpu_used[row] + used.cpu + req.cpu_milli - freed.cpu > a.cpu_cap[row]:
                reason = f"insufficient cpu on {c.placement.node}"
            elif a.mem_used[row] + used.memory + req.memory - freed.memory > a.mem_cap[row]:
                reason = f"insufficient memory on {c.placement.node}"
            else:
                for name, amount in req.extended:
                    if not amount:
                        continue
                    col = a.ext_col(name)
                    if col is None:
                        reason = f"insufficient {name} on {c.placement.node}"
                        break
                    have = a.ext_cap[row, col] - a.ext_used[row, col] + freed.extended.get(name, 0)
                    if used.extended.get(name, 0) + amount > have:
                        reason = f"insufficient {name} on {c.placement.node}"
                        break
            out.append(reason)
            if reason is None:
                t = taken.get(row)
                if t is None:
                    t = taken[row] = Credit()
                t.cpu += req.cpu_milli
                t.memory += req.memory
                for name, amount in req.extended:
                    t.extended[name] = t.extended.get(name, 0) + amount
        return out


class GpusFree:
    """The exact (GPU index, milli) pairs proposed match the request and are free (victims counted
    as gone, earlier placements of the unit as taken)."""

    name = "gpus_free"

    def __call__(self, unit: UnitCheck, candidates: Sequence[Candidate]) -> list[str | None]:
        a = unit.state.arrays
        taken: dict[tuple[int, int], int] = {}
        out: list[str | None] = []
        for c in candidates:
            req = c.request
            assert req is not None
            gpus = c.placement.gpus
            reason = gpu_shape_error(req, gpus)
            if reason is None and gpus:
                row = c.row
                freed = unit.credit.get(row)
                for g, milli in gpus:
                    if not a.gpu_exists[row, g]:
                        reason = f"no GPU {g} on {c.placement.node}"
                        break
                    free = int(a.gpu_free[row, g]) - taken.get((row, g), 0)
                    if freed is not None:
                        free += freed.gpus.get(g, 0)
                    if free < milli:
                        reason = f"GPU {g} on {c.placement.node} is not free"
                        break
                if reason is None:
                    for g, milli in gpus:
                        taken[(row, g)] = taken.get((row, g), 0) + milli
            out.append(reason)
        return out


class AntiAffinityHolds:
    """The task's anti-affinity rules still hold against the truth: shards plan in parallel, each
    blind to what the others propose, so two of them can put repelling tasks in one domain.

    The rules mean what the shard's anti_affinity filter means: per topology domain (a node label;
    "node" is the node itself, a node without the label is in no domain), with no match labels the
    job's own tasks of the group's role repel each other, with match labels every task whose job
    carries them all is repelled, both ways: nor is such a task placed in the domain of a task
    with the rule. The unit's victims count as gone, its earlier placements as there.
    """

    name = "anti_affinity"

    def __init__(self) -> None:
        # Per topology key: the arrays and node generation it was built for, each row's domain and
        # each domain's rows (a node scan, redone only when nodes change).
        self._domains: dict[str, tuple[ClusterArrays, int, list[str | None], dict[str, list[int]]]] = {}

    def __call__(self, unit: UnitCheck, candidates: Sequence[Candidate]) -> list[str | None]:
        job = unit.job
        a = unit.state.arrays
        labels = set(job.labels)
        # The other way round: residents, and the unit's own placements passed so far, whose
        # rules repel a task of this job.
        repellers = self._repellers(unit, a, labels) if labels and a.repellers else []
        if not repellers and not any(g.anti_affinity for g in job.groups):
            return [None] * len(candidates)
        kept: list[tuple[int, str]] = []  # (row, role) of the unit's placements passed so far
        out: list[str | None] = []
        for c in candidates:
            group = job.group_of(c.placement.task_index)
            reason = None
            for rule in group.anti_affinity:
                reason = self._conflict(unit, a, rule, group.role, c.row, kept)
                if reason is not None:
                    reason = f"anti-affinity on {rule.topology_key}: {reason}"
                    break
            if reason is None and repellers:
                reason = self._repelled(a, repellers, c.row)
            out.append(reason)
            if reason is None:
                kept.append((c.row, group.role))
                repellers.extend(
                    (c.row, rule)
                    for rule in group.anti_affinity
                    if rule.match_labels and set(rule.match_labels) <= labels
                )
        return out

    @staticmethod
    def _repellers(
        unit: UnitCheck, a: ClusterArrays, labels: set[tuple[str, str]]
    ) -> list[tuple[int, AntiAffinity]]:
        """(row, rule) of each match-label rule held on a row that repels a job with `labels`, the
        unit's victims counted as gone."""
        gone: dict[tuple[AntiAffinity, int], int] = {}
        for tid, row in unit.victims.items():
            for rule in a.residents[row][tid].repels:
                gone[rule, row] = gone.get((rule, row), 0) + 1
        return [
            (row, rule)
            for rule, rows in a.repellers.items()
            if set(rule.match_labels) <= labels
            for row, held in rows.items()
            if held > gone.get((rule, row), 0)
        ]

    def _repelled(self, a: ClusterArrays, repellers: list[tuple[int, AntiAffinity]], row: int) -> str | None:
        for other, rule in repellers:
            row_domain, _ = self._domain_map(a, rule.topology_key)
            domain = row_domain[row]
            if domain is not None and row_domain[other] == domain:
                return (
                    f"anti-affinity on {rule.topology_key}: a task in {domain} repels labels "
                    f"{dict(rule.match_labels)}"
                )
        return None

    def _conflict(
        self,
        unit: UnitCheck,
        a: ClusterArrays,
        rule: AntiAffinity,
        role: str,
        row: int,
        kept: list[tuple[int, str]],
    ) -> str | None:
        row_domain, members = self._domain_map(a, rule.topology_key)
        domain = row_domain[row]
        if domain is None:
            return None
        rows = members[domain]
        job = unit.job
        wanted = set(rule.match_labels)
        for other in rows:
            for r in a.residents[other].values():
                if r.task_id in unit.victims:
                    continue
                if wanted:
                    if wanted <= set(r.job_labels):
                        return f"{r.task_id} (labels {dict(rule.match_labels)}) is in {domain}"
                elif r.job_id == job.id and r.role == role:
                    return f"{r.task_id} of the same job is in {domain}"
        own = not wanted or wanted <= set(job.labels)
        for other, other_role in kept:
            if own and row_domain[other] == domain and (wanted or other_role == role):
                return f"another task of the unit is placed in {domain}"
        return None

    def _domain_map(self, a: ClusterArrays, key: str) -> tuple[list[str | None], dict[str, list[int]]]:
        cached = self._domains.get(key)
        if cached is not None and cached[0] is a and cached[1] == a.meta_generation:
            return cached[2], cached[3]
        if key == "node":  # each node its own domain, as the shard's domain_ids has it
            row_domain = [None if node is None else node.name for node in a.nodes[: a.n]]
        else:
            row_domain = a.label_values(key)[: a.n]
        members: dict[str, list[int]] = {}
        for row, domain in enumerate(row_domain):
            if domain is not None:
                members.setdefault(domain, []).append(row)
        self._domains[key] = (a, a.meta_generation, row_domain, members)
        return row_domain, members


DEFAULT_STAGES: tuple[Stage, ...] = (
    TaskValid(),
    NodeExists(),
    NodeSchedulable(),
    NodeCurrent(),
    VictimsValid(),
    QueueFloorsHold(),
    DisruptionBudgetsHold(),
    AntiAffinityHolds(),
    ResourcesFit(),
    GpusFree(),
)
STAGE_NAMES = tuple(s.name for s in DEFAULT_STAGES)
# Stages that count a unit's victims as gone on nodes other than the placement's own (the others
# credit a placement only with its own node's victims): the binder judges them again when a later
# stage drops a placement and with it the eviction of its node's victims.
ACROSS_NODES = frozenset({AntiAffinityHolds.name})


def candidates_of(proposal: Proposal) -> list[Candidate]:
    jid = proposal.job.id
    return [Candidate(i, p, task_id(jid, p.task_index)) for i, p in enumerate(proposal.placements)]
