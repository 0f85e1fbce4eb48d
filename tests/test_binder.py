"""The binder: check stages, gang rules, two-phase preemption, change log, recovery, fast path.

Real SQLite stores in tmp_path; no mocks. Scenarios run on both paths (vectorised and sequential).
"""

import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gosched.binder.binder import EPOCH_BITS, Binder, next_epoch
from gosched.binder.fastpath import find_clean
from gosched.binder.stages import STAGE_NAMES, gpu_shape_error
from gosched.binder.state import arrays_view, make_resident
from gosched.common import wire
from gosched.common.changes import apply_changes
from gosched.common.cluster_state import MAX_GPUS, ClusterArrays, Resident
from gosched.common.config import ProfileConfig
from gosched.common.fast_pickle import rows_of
from gosched.common.job import Job, TaskGroup
from gosched.common.messages import (
    AcceptedUnit,
    BindReply,
    BindReplyRows,
    NodeRemoved,
    NodeUpserted,
    Placement,
    Proposal,
    ProposalBatch,
    QueueFloor,
    TaskBound,
    TaskReleased,
    Unit,
    UnitBatch,
)
from gosched.common.node import Node, NodeState
from gosched.common.resources import GPU_MILLI, ResourceRequest
from gosched.common.states import TaskState
from gosched.common.store import Store
from gosched.scheduler_shard.shard import SchedulerShard
from tests.builders import NodeBuilder, make_job, make_node

GiB = 2**30


class Clock:
    """Deterministic time: every reading is one second after the last."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def open_binder(path: Path, *, vectorised: bool = True, max_log_entries: int = 1_000_000) -> Binder:
    return Binder(Store(path), clock=Clock(), vectorised=vectorised, max_log_entries=max_log_entries)


def at(
    idx: int, node: str, gpus: tuple[tuple[int, int], ...] = (), victims: tuple[str, ...] = ()
) -> Placement:
    return Placement(idx, node, gpus, victims)


def prop(job: Job, *placements: Placement, min_needed: int | None = None) -> Proposal:
    return Proposal(job, list(placements), job.min_member if min_needed is None else min_needed)


def commit(b: Binder, *proposals: Proposal, seen: int | None = None) -> BindReply:
    return b.commit(ProposalBatch(0, b.version if seen is None else seen, list(proposals)))


def assert_consistent(a: ClusterArrays) -> None:
    """No node over-committed, and usage is exactly the residents' sum."""
    for row in range(a.n):
        if not a.alive[row]:
            continue
        residents = list(a.residents[row].values())
        assert a.cpu_used[row] == sum(r.cpu_milli for r in residents) <= a.cpu_cap[row]
        assert a.mem_used[row] == sum(r.memory for r in residents) <= a.mem_cap[row]
        for col, name in enumerate(a.extended_names):
            held = sum(amount for r in residents for n, amount in r.extended if n == name)
            assert a.ext_used[row, col] == held <= a.ext_cap[row, col]
        for g in range(MAX_GPUS):
            if a.gpu_exists[row, g]:
                held = sum(m for r in residents for gg, m in r.gpus if gg == g)
                assert a.gpu_free[row, g] == GPU_MILLI - held >= 0


def outcome(
    reply: BindReply,
) -> tuple[dict[str, list[int]], list[tuple[str, str, tuple[int, ...]]], list[tuple[str, str]]]:
    accepted = {a.job_id: sorted(a.task_indexes) for a in reply.accepted}
    rejected = sorted((r.job_id, r.stage, tuple(sorted(r.task_indexes))) for r in reply.rejected)
    evicted = [(e.task_id, e.preemptor) for e in reply.evicted]
    return accepted, rejected, evicted


# -- table-driven stage scenarios ------------------------------------------------------------------
@dataclass
class Case:
    nodes: list[Node]
    batch: list[Proposal]
    accepted: dict[str, list[int]] = field(default_factory=dict)
    rejected: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    evicted: list[tuple[str, str]] = field(default_factory=list)
    before: list[Proposal] = field(default_factory=list)  # committed first, all accepted
    started: tuple[str, ...] = ()  # then reported running by their agents


def cpu_job(job_id: str, cpu: str, **kw: object) -> Job:
    b = make_job(job_id).cpu(cpu).mem("1Gi")
    for name, value in kw.items():
        getattr(b, name)(value)
    return b.build()


N4 = make_node("n1").cpu("4").mem("16Gi").gpus(2).extended("rdma", 1).build()
N4B = replace(N4, name="n2")
LOW = cpu_job("low", "4")
SVC = make_job("svc").cpu("4").mem("1Gi").replicas(2).disruption_budget(1).build()
H1 = cpu_job("h1", "4", priority=100)
LOW_N2 = cpu_job("low2", "4")
FILL3 = cpu_job("fill", "3", priority=500)
SMALL_LOW = cpu_job("small", "1")
PINNED = cpu_job("pinned", "4", preemptible=False)
GANG = make_job("g").cpu("2").mem("1Gi").replicas(3).min_member(3).build()
GANG2 = make_job("gb").cpu("4").mem("1Gi").replicas(2).min_member(2).build()
HOLD_GPU0 = make_job("hold").cpu("1").gpus(1).build()
ZONE_A = [make_node(f"a{i}").cpu("4").mem("16Gi").label(zone="a").build() for i in range(2)]
# Two tasks that keep jobs labelled app=web out of their zone (they carry no such label themselves).
ZONE_GUARD = (
    make_job("zg")
    .cpu("2")
    .mem("1Gi")
    .replicas(2)
    .min_member(1)
    .priority(100)
    .anti_affinity("zone", app="web")
    .build()
)


def db_job(job_id: str, topology: str = "node") -> Job:
    """A task repelling every task of a job labelled app=db (itself included) in its domain."""
    return make_job(job_id).cpu("1").mem("1Gi").labels(app="db").anti_affinity(topology, app="db").build()


def guard_job(job_id: str) -> Job:
    """A task that keeps jobs labelled app=web off its node; it carries no such label itself."""
    return make_job(job_id).cpu("1").mem("1Gi").anti_affinity("node", app="web").build()


def web_job(job_id: str) -> Job:
    """A task of a job labelled app=web, with no rule of its own."""
    return make_job(job_id).cpu("1").mem("1Gi").labels(app="web").build()


# Queue a holds 8 cpus on n1 and n2 (two tasks, or one gang of two); its floor is 4 cpus.
QA1 = cpu_job("qa1", "4", queue="a")
QA2 = cpu_job("qa2", "4", queue="a")
QA_GANG = make_job("ga").cpu("4").mem("1Gi").replicas(2).min_member(2).queue("a").build()
A_FLOOR = (QueueFloor("a", 4000, None, None),)


def floored(p: Proposal, floors: tuple[QueueFloor, ...] = A_FLOOR) -> Proposal:
    return replace(p, floors=floors)


PS_AND_WORKER = (
    make_job("pw")
    .cpu("1")
    .mem("1Gi")
    .role("ps")
    .anti_affinity("node")
    .group("worker")
    .cpu("1")
    .mem("1Gi")
    .build()
)
SPREAD3 = make_job("spread").cpu("1").mem("1Gi").replicas(3).min_member(2).anti_affinity("node").build()

CASES: dict[str, Case] = {
    "node_gone": Case([N4], [prop(cpu_job("a", "1"), at(0, "ghost"))], rejected=[("a", "node_exists", (0,))]),
    "node_cordoned": Case(
        [replace(N4, state=NodeState.CORDONED)],
        [prop(cpu_job("a", "1"), at(0, "n1"))],
        rejected=[("a", "node_schedulable", (0,))],
    ),
    "node_not_ready": Case(
        [replace(N4, state=NodeState.NOT_READY)],
        [prop(cpu_job("a", "1"), at(0, "n1"))],
        rejected=[("a", "node_schedulable", (0,))],
    ),
    "node_draining": Case(
        [replace(N4, state=NodeState.DRAINING)],
        [prop(cpu_job("a", "1"), at(0, "n1"))],
        rejected=[("a", "node_schedulable", (0,))],
    ),
    "last_free_gpu_two_proposals_first_wins": Case(
        [N4],
        [
            prop(make_job("x").cpu("1").gpus(1).build(), at(0, "n1", ((1, 1000),))),
            prop(make_job("y").cpu("1").gpus(1).build(), at(0, "n1", ((1, 1000),))),
        ],
        accepted={"x": [0]},
        rejected=[("y", "gpus_free", (0,))],
        before=[prop(HOLD_GPU0, at(0, "n1", ((0, 1000),)))],
    ),
    "cpu_conflict_first_wins": Case(
        [N4],
        [prop(cpu_job("a", "3"), at(0, "n1")), prop(cpu_job("b", "3"), at(0, "n1"))],
        accepted={"a": [0]},
        rejected=[("b", "resources_fit", (0,))],
    ),
    "memory_conflict": Case(
        [N4],
        [
            prop(make_job("a").mem("10Gi").build(), at(0, "n1")),
            prop(make_job("b").mem("10Gi").build(), at(0, "n1")),
        ],
        accepted={"a": [0]},
        rejected=[("b", "resources_fit", (0,))],
    ),
    "extended_conflict": Case(
        [N4],
        [
            prop(make_job("a").cpu("1").extended("rdma", 1).build(), at(0, "n1")),
            prop(make_job("b").cpu("1").extended("rdma", 1).build(), at(0, "n1")),
        ],
        accepted={"a": [0]},
        rejected=[("b", "resources_fit", (0,))],
    ),
    "unknown_extended": Case(
        [N4],
        [prop(make_job("a").extended("fpga", 1).build(), at(0, "n1"))],
        rejected=[("a", "resources_fit", (0,))],
    ),
    "gpu_index_taken": Case(
        [N4],
        [
            prop(make_job("x").cpu("1").gpus(1).build(), at(0, "n1", ((0, 1000),))),
            prop(make_job("y").cpu("1").gpus(1).build(), at(0, "n1", ((1, 1000),))),
        ],
        before=[prop(HOLD_GPU0, at(0, "n1", ((0, 1000),)))],
        accepted={"y": [0]},
        rejected=[("x", "gpus_free", (0,))],
    ),
    "gpu_shares_fill_one_gpu": Case(
        [N4],
        [prop(make_job(f"s{i}").gpu_share(400).build(), at(0, "n1", ((0, 400),))) for i in range(3)],
        accepted={"s0": [0], "s1": [0]},
        rejected=[("s2", "gpus_free", (0,))],
    ),
    "gpu_assignment_must_match_request": Case(
        [N4],
        [prop(make_job("a").gpus(2).build(), at(0, "n1", ((0, 1000),)))],
        rejected=[("a", "gpus_free", (0,))],
    ),
    "gpus_for_a_cpu_task": Case(
        [N4], [prop(cpu_job("a", "1"), at(0, "n1", ((0, 1000),)))], rejected=[("a", "gpus_free", (0,))]
    ),
    "no_such_gpu": Case(
        [N4],
        [prop(make_job("a").gpus(1).build(), at(0, "n1", ((5, 1000),)))],
        rejected=[("a", "gpus_free", (0,))],
    ),
    "victims_valid": Case(
        [N4],
        [prop(cpu_job("high", "4", priority=100), at(0, "n1", victims=("low/0",)))],
        before=[prop(LOW, at(0, "n1"))],
        accepted={"high": [0]},
        evicted=[("low/0", "high")],
    ),
    # A job's disruption budget counts its tasks down at once (evicted or lost, not bound since),
    # as a Kubernetes PodDisruptionBudget does, not the tasks of one preemption.
    "disruption_budget_counts_the_tasks_down_before": Case(
        [N4, N4B],
        [prop(cpu_job("h2", "4", priority=100), at(0, "n2", victims=("svc/1",)))],
        before=[prop(SVC, at(0, "n1"), at(1, "n2")), prop(H1, at(0, "n1", victims=("svc/0",)))],
        rejected=[("h2", "disruption_budgets", (0,))],
    ),
    "disruption_budget_counts_the_batchs_earlier_evictions": Case(
        [N4, N4B],
        [
            prop(H1, at(0, "n1", victims=("svc/0",))),
            prop(cpu_job("h2", "4", priority=100), at(0, "n2", victims=("svc/1",))),
        ],
        before=[prop(SVC, at(0, "n1"), at(1, "n2"))],
        accepted={"h1": [0]},
        rejected=[("h2", "disruption_budgets", (0,))],
        evicted=[("svc/0", "h1")],
    ),
    "disruption_budget_has_room_again_once_the_task_runs_again": Case(
        [N4, N4B, replace(N4, name="n3")],
        [prop(cpu_job("h2", "4", priority=100), at(0, "n2", victims=("svc/1",)))],
        before=[
            prop(SVC, at(0, "n1"), at(1, "n2")),
            prop(H1, at(0, "n1", victims=("svc/0",))),
            prop(SVC, at(0, "n3")),  # svc/0 is bound again
        ],
        started=("svc/0",),  # and runs
        accepted={"h2": [0]},
        evicted=[("svc/1", "h2")],
    ),
    "disruption_budget_counts_the_task_bound_again_until_it_runs": Case(
        [N4, N4B, replace(N4, name="n3")],
        [prop(cpu_job("h2", "4", priority=100), at(0, "n2", victims=("svc/1",)))],
        before=[
            prop(SVC, at(0, "n1"), at(1, "n2")),
            prop(H1, at(0, "n1", victims=("svc/0",))),
            prop(SVC, at(0, "n3")),
        ],
        rejected=[("h2", "disruption_budgets", (0,))],
    ),
    "disruption_budget_lets_a_victim_down_already_go_again": Case(
        [N4, N4B, replace(N4, name="n3")],
        [prop(cpu_job("h2", "4", priority=100), at(0, "n3", victims=("svc/0",)))],
        before=[
            prop(SVC, at(0, "n1"), at(1, "n2")),
            prop(H1, at(0, "n1", victims=("svc/0",))),
            prop(SVC, at(0, "n3")),  # bound again, not yet running: down still, evicting it adds none
        ],
        accepted={"h2": [0]},
        evicted=[("svc/0", "h2")],
    ),
    "disruption_budget_counts_the_gang_a_victim_breaks": Case(
        [N4, N4B],
        [prop(H1, at(0, "n1", victims=("svcg/0",)))],
        before=[prop(replace(SVC, id="svcg", min_member=2), at(0, "n1"), at(1, "n2"))],
        rejected=[("h1", "disruption_budgets", (0,))],
    ),
    "queue_floor_holds": Case(
        [N4, N4B],
        [floored(prop(cpu_job("qb", "4", priority=100, queue="b"), at(0, "n1", victims=("qa1/0",))))],
        before=[prop(QA1, at(0, "n1")), prop(QA2, at(0, "n2"))],
        accepted={"qb": [0]},
        evicted=[("qa1/0", "qb")],
    ),
    "queue_floor_refuses_the_node_that_would_break_it": Case(
        [N4, N4B],
        [
            floored(
                prop(
                    make_job("qb").cpu("4").mem("1Gi").replicas(2).priority(100).queue("b").build(),
                    at(0, "n1", victims=("qa1/0",)),
                    at(1, "n2", victims=("qa2/0",)),
                    min_needed=1,
                )
            )
        ],
        before=[prop(QA1, at(0, "n1")), prop(QA2, at(0, "n2"))],
        accepted={"qb": [0]},
        rejected=[("qb", "queue_floors", (1,))],
        evicted=[("qa1/0", "qb")],
    ),
    "queue_floor_counts_the_gang_a_victim_breaks": Case(
        [N4, N4B],
        [floored(prop(cpu_job("qb", "4", priority=100, queue="b"), at(0, "n1", victims=("ga/0",))))],
        before=[prop(QA_GANG, at(0, "n1"), at(1, "n2"))],
        rejected=[("qb", "queue_floors", (0,))],
    ),
    "queue_floor_judged_in_batch_order_not_after_the_fast_path": Case(
        # qa2 comes after qb in the batch: bound early by the fast path, it would lift queue a
        # to 8 cpus and let qb take a below its floor (found by the hypothesis test below).
        [N4, N4B],
        [
            floored(prop(cpu_job("qb", "4", priority=100, queue="b"), at(0, "n1", victims=("qa1/0",)))),
            prop(QA2, at(0, "n2")),
        ],
        before=[prop(QA1, at(0, "n1"))],
        accepted={"qa2": [0]},
        rejected=[("qb", "queue_floors", (0,))],
    ),
    "queue_floor_of_the_preemptors_own_queue_is_not_its_limit": Case(
        [N4, N4B],
        [
            floored(
                prop(cpu_job("qa3", "4", priority=100, queue="a"), at(0, "n1", victims=("qa1/0",))),
                (QueueFloor("a", 8000, None, None),),
            )
        ],
        before=[prop(QA1, at(0, "n1")), prop(QA2, at(0, "n2"))],
        accepted={"qa3": [0]},
        evicted=[("qa1/0", "qa3")],
    ),
    "victim_on_another_node": Case(
        [N4, N4B],
        [prop(cpu_job("high", "1", priority=100), at(0, "n1", victims=("low2/0",)))],
        before=[prop(LOW_N2, at(0, "n2"))],
        rejected=[("high", "victims_valid", (0,))],
    ),
    "victim_already_evicted_by_earlier_proposal": Case(
        [N4],
        [
            prop(cpu_job("h1", "4", priority=100), at(0, "n1", victims=("low/0",))),
            prop(cpu_job("h2", "4", priority=100), at(0, "n1", victims=("low/0",))),
        ],
        before=[prop(LOW, at(0, "n1"))],
        accepted={"h1": [0]},
        rejected=[("h2", "victims_valid", (0,))],
        evicted=[("low/0", "h1")],
    ),
    "victim_not_bound": Case(
        [N4],
        [prop(cpu_job("high", "1"), at(0, "n1", victims=("nobody/0",)))],
        rejected=[("high", "victims_valid", (0,))],
    ),
    "victim_not_preemptible": Case(
        [N4],
        [prop(cpu_job("high", "4", priority=100), at(0, "n1", victims=("pinned/0",)))],
        before=[prop(PINNED, at(0, "n1"))],
        rejected=[("high", "victims_valid", (0,))],
    ),
    "victim_too_small_evicts_nothing": Case(
        [N4],
        [prop(cpu_job("high", "4", priority=100), at(0, "n1", victims=("small/0",)))],
        before=[prop(FILL3, at(0, "n1")), prop(SMALL_LOW, at(0, "n1"))],
        rejected=[("high", "resources_fit", (0,))],
    ),
    "victims_make_room_for_two_placements": Case(
        [N4],
        [
            prop(
                make_job("pair").cpu("2").mem("1Gi").replicas(2).min_member(2).priority(100).build(),
                at(0, "n1", victims=("low/0",)),
                at(1, "n1"),
            )
        ],
        before=[prop(LOW, at(0, "n1"))],
        accepted={"pair": [0, 1]},
        evicted=[("low/0", "pair")],
    ),
    "gang_rejects_whole_unit": Case(
        [N4, N4B],
        [prop(GANG, at(0, "n1"), at(1, "n1"), at(2, "n2"))],
        before=[prop(LOW_N2, at(0, "n2"))],
        rejected=[("g", "resources_fit", (0, 1, 2))],
    ),
    "gang_drops_extras": Case(
        [N4, N4B],
        [prop(GANG, at(0, "n1"), at(1, "n1"), at(2, "n2"), min_needed=2)],
        before=[prop(LOW_N2, at(0, "n2"))],
        accepted={"g": [0, 1]},
        rejected=[("g", "resources_fit", (2,))],
    ),
    "gang_drop_at_node_exists": Case(
        [N4],
        [prop(GANG, at(0, "n1"), at(1, "ghost"), min_needed=1)],
        accepted={"g": [0]},
        rejected=[("g", "node_exists", (1,))],
    ),
    "earlier_placement_of_the_unit_counts": Case(
        [N4],
        [prop(make_job("two").cpu("3").replicas(2).build(), at(0, "n1"), at(1, "n1"), min_needed=1)],
        accepted={"two": [0]},
        rejected=[("two", "resources_fit", (1,))],
    ),
    "same_gpu_twice_in_a_unit": Case(
        [N4],
        [
            prop(
                make_job("two").cpu("1").gpus(1).replicas(2).build(),
                at(0, "n1", ((0, 1000),)),
                at(1, "n1", ((0, 1000),)),
                min_needed=1,
            )
        ],
        accepted={"two": [0]},
        rejected=[("two", "gpus_free", (1,))],
    ),
    "fewer_placements_than_needed": Case(
        [N4], [prop(GANG, at(0, "n1"), at(1, "n1"))], rejected=[("g", "task_valid", (0, 1))]
    ),
    "task_already_bound": Case(
        [N4],
        [prop(cpu_job("a", "1"), at(0, "n1"))],
        before=[prop(cpu_job("a", "1"), at(0, "n1"))],
        rejected=[("a", "task_valid", (0,))],
    ),
    "task_twice_in_a_batch": Case(
        [N4],
        [prop(cpu_job("a", "1"), at(0, "n1")), prop(cpu_job("a", "1"), at(0, "n1"))],
        accepted={"a": [0]},
        rejected=[("a", "task_valid", (0,))],
    ),
    "no_such_task": Case([N4], [prop(cpu_job("a", "1"), at(5, "n1"))], rejected=[("a", "task_valid", (5,))]),
    "gang_break": Case(
        [N4, N4B],
        [prop(cpu_job("high", "4", priority=100), at(0, "n1", victims=("gb/0",)))],
        before=[prop(GANG2, at(0, "n1"), at(1, "n2"))],
        accepted={"high": [0]},
        evicted=[("gb/0", "high"), ("gb/1", "")],
    ),
    # Two shards, each blind to the other, put repelling tasks on one node: the second is refused.
    "anti_affinity_across_jobs": Case(
        [N4, N4B],
        [prop(db_job("y"), at(0, "n1")), prop(db_job("z"), at(0, "n2"))],
        before=[prop(db_job("x"), at(0, "n1"))],
        accepted={"z": [0]},
        rejected=[("y", "anti_affinity", (0,))],
    ),
    # A job without the labels may sit beside them; one repelled by a rule in the batch may not
    # jump ahead of it on the fast path (batch order decides, as on the sequential path).
    "anti_affinity_unlabelled_and_batch_order": Case(
        [N4],
        [
            prop(db_job("y"), at(0, "n1")),
            prop(cpu_job("plain", "1"), at(0, "n1")),
            prop(db_job("z"), at(0, "n1")),
        ],
        accepted={"y": [0], "plain": [0]},
        rejected=[("z", "anti_affinity", (0,))],
    ),
    # By zone: a node of the same zone is the same domain.
    "anti_affinity_by_zone": Case(
        ZONE_A,
        [prop(db_job("y", "zone"), at(0, "a1"))],
        before=[prop(db_job("x", "zone"), at(0, "a0"))],
        rejected=[("y", "anti_affinity", (0,))],
    ),
    # The job's own tasks: two on one node lose one placement; the gang (min 2) still binds.
    "anti_affinity_within_the_unit": Case(
        [N4, N4B],
        [prop(SPREAD3, at(0, "n1"), at(1, "n1"), at(2, "n2"))],
        accepted={"spread": [0, 2]},
        rejected=[("spread", "anti_affinity", (1,))],
    ),
    # The other way round: a job carrying the labels may not join a task whose rule repels them,
    # whether that task is bound already or placed earlier in the batch; elsewhere it may.
    "anti_affinity_a_residents_rule_repels_a_labelled_job": Case(
        [N4, N4B],
        [prop(web_job("w1"), at(0, "n1")), prop(web_job("w2"), at(0, "n2"))],
        before=[prop(guard_job("g1"), at(0, "n1"))],
        accepted={"w2": [0]},
        rejected=[("w1", "anti_affinity", (0,))],
    ),
    "anti_affinity_a_rule_earlier_in_the_batch_repels_a_labelled_job": Case(
        [N4],
        [
            prop(guard_job("g1"), at(0, "n1")),
            prop(web_job("w1"), at(0, "n1")),
            prop(cpu_job("plain", "1"), at(0, "n1")),
        ],
        accepted={"g1": [0], "plain": [0]},
        rejected=[("w1", "anti_affinity", (0,))],
    ),
    "anti_affinity_a_repelling_victim_gone": Case(
        [N4],
        [prop(replace(web_job("w1"), priority=100), at(0, "n1", victims=("g1/0",)))],
        before=[prop(guard_job("g1"), at(0, "n1"))],
        accepted={"w1": [0]},
        evicted=[("g1/0", "w1")],
    ),
    # A group's spread rule (no match labels) keeps apart that group's tasks only: another group
    # of the job may share the node, after it in the unit as before it.
    "anti_affinity_a_spread_rule_leaves_other_groups_alone": Case(
        [N4],
        [prop(PS_AND_WORKER, at(0, "n1"), at(1, "n1"))],
        accepted={"pw": [0, 1]},
    ),
    # A victim counted as gone by the anti-affinity stage, whose own placement a later stage drops
    # (a0 is full once the victim's room is taken: 2 cpus needed, 1 freed), stays: it still repels
    # the unit's other placement in its zone, which is then refused too.
    "anti_affinity_a_victim_kept_by_a_later_stage_still_repels": Case(
        ZONE_A,
        [prop(ZONE_GUARD, at(0, "a0", victims=("x/0",)), at(1, "a1"), min_needed=1)],
        before=[prop(web_job("x"), at(0, "a0")), prop(cpu_job("hog", "3"), at(0, "a0"))],
        rejected=[("zg", "anti_affinity", (0, 1))],
    ),
    # A victim being evicted no longer repels.
    "anti_affinity_victim_gone": Case(
        [N4],
        [prop(replace(db_job("y"), priority=100), at(0, "n1", victims=("x/0",)))],
        before=[prop(db_job("x"), at(0, "n1"))],
        accepted={"y": [0]},
        evicted=[("x/0", "y")],
    ),
}


@pytest.mark.parametrize("vectorised", [True, False], ids=["vectorised", "sequential"])
def test_a_proposal_of_a_job_cancelled_in_flight_is_refused_and_evicts_nothing(
    tmp_path: Path, vectorised: bool
) -> None:
    b = open_binder(tmp_path / "gs.db", vectorised=vectorised)
    b.add_nodes([N4, N4B])
    assert not commit(b, prop(LOW, at(0, "n1"))).rejected
    high = cpu_job("high", "4", priority=100)
    plain = cpu_job("plain", "1")
    assert b.cancel_job("high", []) == []  # cancelled while its unit was planned
    reply = commit(
        b,
        prop(high, at(0, "n1", victims=("low/0",))),
        prop(cpu_job("gone", "1"), at(0, "n2")),
        prop(plain, at(0, "n2")),
    )
    accepted, rejected, evicted = outcome(reply)
    assert rejected == [("high", "task_valid", (0,))] and evicted == []
    assert accepted == {"gone": [0], "plain": [0]}  # the others are untouched
    assert b.resident("low/0") is not None
    # A cancelled job's clean proposal is refused too (the fast path leaves it to the stages).
    b.cancel_job("late", [])
    reply = commit(b, prop(cpu_job("late", "1"), at(0, "n2")))
    assert outcome(reply)[1] == [("late", "task_valid", (0,))]
    assert b.resident("late/0") is None


# A node changed between a shard's view and the binder's check: what the shard's filters read and
# the binder does not check again (labels, taints, GPU models) refuses the plan; what the binder
# checks itself (capacity, state) does not.
def n1(cpu: str = "4", model: str = "A100") -> NodeBuilder:
    return make_node("n1").cpu(cpu).mem("16Gi").gpus(1, model=model)


NODE_CHANGES: dict[str, tuple[Node, bool]] = {
    "tainted": (n1().taint("dedicated", "x", "NoExecute").build(), True),
    "relabelled": (n1().label(zone="b").build(), True),
    "GPU model changed": (n1(model="H100").build(), True),
    "grown": (n1(cpu="8").build(), False),
    "the same node again": (n1().build(), False),
}


@pytest.mark.parametrize("vectorised", [True, False], ids=["vectorised", "sequential"])
@pytest.mark.parametrize("change", list(NODE_CHANGES))
def test_a_plan_made_before_a_nodes_rules_changed_is_refused(
    tmp_path: Path, change: str, vectorised: bool
) -> None:
    b = open_binder(tmp_path / "gs.db", vectorised=vectorised)
    b.add_nodes([n1().build(), N4B])
    view = b.version  # the shard plans on this view
    node, refused = NODE_CHANGES[change]
    b.add_nodes([node])
    reply = commit(b, prop(cpu_job("j", "1"), at(0, "n1")), prop(cpu_job("k", "1"), at(0, "n2")), seen=view)
    accepted, rejected, _ = outcome(reply)
    assert accepted == ({"k": [0]} if refused else {"j": [0], "k": [0]})
    assert rejected == ([("j", "node_current", (0,))] if refused else [])
    if refused:
        assert "changed (labels, taints or GPUs)" in reply.rejected[0].reason
        # planned again on the new view, it goes through
        assert outcome(commit(b, prop(cpu_job("j", "1"), at(0, "n1"))))[0] == {"j": [0]}


@pytest.mark.parametrize("vectorised", [True, False], ids=["vectorised", "sequential"])
def test_a_plan_on_a_node_removed_and_added_again_or_older_than_a_restart_is_refused(
    tmp_path: Path, vectorised: bool
) -> None:
    b = open_binder(tmp_path / "gs.db", vectorised=vectorised)
    b.add_nodes([N4, N4B])
    view = b.version
    b.remove_node("n1")
    b.add_nodes([N4])  # same name, another machine for all the binder knows
    reply = commit(b, prop(cpu_job("j", "1"), at(0, "n1")), prop(cpu_job("k", "1"), at(0, "n2")), seen=view)
    assert outcome(reply)[:2] == ({"k": [0]}, [("j", "node_current", (0,))])
    b.store.close()
    again = open_binder(tmp_path / "gs.db", vectorised=vectorised)  # recovered: no older view is known
    reply = commit(again, prop(cpu_job("m", "1"), at(0, "n2")), seen=again.version - 1)
    assert outcome(reply)[:2] == ({}, [("m", "node_current", (0,))])
    assert outcome(commit(again, prop(cpu_job("m", "1"), at(0, "n2"))))[0] == {"m": [0]}


def test_a_shards_plan_in_flight_when_a_node_is_tainted_noexecute_lands_elsewhere(tmp_path: Path) -> None:
    """The race end to end with a real shard: it plans on its view, the node is tainted NoExecute
    (the control plane evicts its intolerant tasks then), the binder refuses the plan in flight,
    and the shard, on the reply's changes, plans the task on the other node."""
    b = open_binder(tmp_path / "gs.db")
    b.add_nodes([make_node("n1").cpu("4").mem("16Gi").build()])
    shard = SchedulerShard(0, ProfileConfig(), clock=lambda: 1.0)
    shard.sync(*b.changes_since(0))
    job = cpu_job("j", "1")
    batch = shard.schedule(UnitBatch(0, [Unit(job, (0,), 1)]))
    assert [pl.node for p in batch.proposals for pl in p.placements] == ["n1"]
    b.add_nodes([make_node("n1").cpu("4").mem("16Gi").taint("gpu-only", "", "NoExecute").build()])
    b.add_nodes([make_node("n2").cpu("4").mem("16Gi").build()])
    reply = b.commit(batch)
    assert [(r.job_id, r.stage) for r in reply.rejected] == [("j", "node_current")]
    shard.apply_reply(reply)
    again = shard.schedule(UnitBatch(0, [Unit(job, (0,), 1, attempt=1)]))
    assert [pl.node for p in again.proposals for pl in p.placements] == ["n2"]
    assert outcome(b.commit(again))[0] == {"j": [0]}


@pytest.mark.parametrize("vectorised", [True, False], ids=["vectorised", "sequential"])
@pytest.mark.parametrize("name", list(CASES))
def test_stage_scenarios(tmp_path: Path, name: str, vectorised: bool) -> None:
    case = CASES[name]
    b = open_binder(tmp_path / "gs.db", vectorised=vectorised)
    b.add_nodes(case.nodes)
    for p in case.before:
        assert not commit(b, p).rejected
    if case.started:
        b.started(case.started)
    reply = commit(b, *case.batch)
    accepted, rejected, evicted = outcome(reply)
    assert accepted == case.accepted
    assert rejected == sorted(case.rejected)
    assert evicted == case.evicted
    assert {r.stage for r in reply.rejected} <= set(STAGE_NAMES)
    assert_consistent(b.state)
    # what was accepted is bound exactly as proposed; nothing of a rejected unit is
    proposed = {(p.job.id, pl.task_index): pl for p in case.batch for pl in p.placements}
    for acc in reply.accepted:
        for i in acc.task_indexes:
            pl = proposed[acc.job_id, i]
            got = b.resident(f"{acc.job_id}/{i}")
            assert got is not None and got[0] == pl.node and got[1].gpus == pl.gpus
    for job_id, _, indexes in case.rejected:
        if job_id not in case.accepted and not any(p.job.id == job_id for p in case.before):
            assert all(b.resident(f"{job_id}/{i}") is None for i in indexes)
    for task, _ in case.evicted:
        assert b.resident(task) is None


def test_rejection_names_reason_and_the_gang_count(tmp_path: Path) -> None:
    b = open_binder(tmp_path / "gs.db")
    b.add_nodes([N4])
    reply = commit(b, prop(GANG, at(0, "n1"), at(1, "n1"), at(2, "n1")))
    (rej,) = reply.rejected
    assert rej.stage == "resources_fit"
    assert "insufficient cpu on n1" in rej.reason and "2 of 3 placements left, 3 needed" in rej.reason
    assert reply.accepted == [] and reply.changes == []


# -- preemption ---------------------------------------------------------------------------------------
def test_two_phase_preemption_evicts_then_binds(tmp_path: Path) -> None:
    path = tmp_path / "gs.db"
    b = open_binder(path)
    b.add_nodes([N4])
    commit(b, prop(LOW, at(0, "n1")))
    v0 = b.version
    high = cpu_job("high", "4", priority=100)
    reply = commit(b, prop(high, at(0, "n1", victims=("low/0",))), seen=v0)
    assert [(e.task_id, e.job_id, e.task_index, e.preemptor) for e in reply.evicted] == [
        ("low/0", "low", 0, "high")
    ]
    # the changes: the victim released first, then the preemptor bound
    assert [type(c) for c in reply.changes] == [TaskReleased, TaskBound]
    assert reply.changes[0] == TaskReleased("low/0", "preempted")
    bound = reply.changes[1]
    assert isinstance(bound, TaskBound) and bound.node == "n1" and bound.resident.task_id == "high/0"
    assert reply.version == v0 + 2
    assert b.store.task_state("low/0") == TaskState.PREEMPTED
    assert b.store.task_state("high/0") == TaskState.BOUND
    assert b.store.load_version() == b.version


def test_gang_break_evicts_the_rest_of_the_gang_everywhere(tmp_path: Path) -> None:
    b = open_binder(tmp_path / "gs.db")
    b.add_nodes([N4, N4B, replace(N4, name="n3")])
    gang = make_job("gang").cpu("1").replicas(3).min_member(2).build()
    commit(b, prop(gang, at(0, "n1"), at(1, "n2"), at(2, "n3")))
    # evicting one leaves 2 >= min_member: no break
    reply = commit(b, prop(cpu_job("h1", "4", priority=9), at(0, "n1", victims=("gang/0",))))
    assert outcome(reply)[2] == [("gang/0", "h1")]
    # evicting another leaves 1 < 2: the last one goes too, reported with no preemptor
    reply = commit(b, prop(cpu_job("h2", "4", priority=9), at(0, "n2", victims=("gang/1",))))
    assert outcome(reply)[2] == [("gang/1", "h2"), ("gang/2", "")]
    assert b.resident("gang/2") is None
    assert b.store.task_state("gang/2") == TaskState.PREEMPTED
    assert int(b.state.cpu_used[b.state.row_of["n3"]]) == 0


# -- nodes ------------------------------------------------------------------------------------------------
def test_remove_node_reports_lost_tasks_and_breaks_gangs(tmp_path: Path) -> None:
    b = open_binder(tmp_path / "gs.db")
    b.add_nodes([N4, N4B])
    gang = make_job("gang").cpu("1").replicas(2).min_member(2).build()
    solo = cpu_job("solo", "1")
    commit(b, prop(gang, at(0, "n1"), at(1, "n2")), prop(solo, at(0, "n1")))
    v = b.version
    lost = b.remove_node("n1")
    assert sorted(lost) == ["gang/0", "gang/1", "solo/0"]
    changes, version, resync = b.changes_since(v)
    assert not resync and version == v + 4
    assert changes == [
        TaskReleased("gang/0", "lost"),
        TaskReleased("solo/0", "lost"),
        NodeRemoved("n1"),
        TaskReleased("gang/1", "preempted"),
    ]
    assert b.store.task_state("solo/0") == TaskState.PENDING
    assert b.store.task_state("gang/1") == TaskState.PREEMPTED
    assert [n.name for n in b.store.load_nodes()] == ["n2"]
    with pytest.raises(KeyError):
        b.remove_node("n1")


def test_node_state_and_invalid_nodes(tmp_path: Path) -> None:
    b = open_binder(tmp_path / "gs.db")
    b.add_nodes([N4])
    v = b.version
    b.set_node_state("n1", NodeState.CORDONED)
    (change,) = b.changes_since(v)[0]
    assert isinstance(change, NodeUpserted) and change.node.state == NodeState.CORDONED
    assert not b.state.schedulable[0]
    assert b.store.load_nodes()[0].state == NodeState.CORDONED
    big = make_node("big").gpus(MAX_GPUS + 1).build()
    with pytest.raises(ValueError):
        b.add_nodes([make_node("ok").build(), big])
    assert "ok" not in b.state.row_of and b.version == v + 1  # nothing applied
    with pytest.raises(KeyError):
        b.set_node_state("ghost", NodeState.READY)


# -- release -----------------------------------------------------------------------------------------------
def test_release_frees_resources(tmp_path: Path) -> None:
    b = open_binder(tmp_path / "gs.db")
    b.add_nodes([N4])
    job = make_job("j").cpu("1").mem("2Gi").gpus(1).extended("rdma", 1).build()
    commit(b, prop(job, at(0, "n1", ((1, 1000),))))
    row = b.state.row_of["n1"]
    assert (b.state.cpu_used[row], b.state.gpu_free[row, 1], b.state.free_whole[row]) == (1000, 0, 1)
    v = b.version
    assert b.release(["j/0", "j/0", "nobody/0"], "succeeded") == ["j/0"]
    assert (b.state.cpu_used[row], b.state.mem_used[row], b.state.gpu_free[row, 1]) == (0, 0, 1000)
    assert b.state.free_whole[row] == 2 and int(b.state.ext_used[row].sum()) == 0
    assert b.changes_since(v) == ([TaskReleased("j/0", "succeeded")], v + 1, False)
    assert b.store.task_state("j/0") == TaskState.SUCCEEDED
    assert b.release(["j/0"], "failed") == []  # not bound any more: nothing to do
    with pytest.raises(ValueError):
        b.release(["j/0"], "exploded")
    # the freed GPU can be bound again
    again = make_job("k").cpu("4").gpus(1).build()
    assert outcome(commit(b, prop(again, at(0, "n1", ((1, 1000),)))))[0] == {"k": [0]}


def test_each_new_extended_resource_name_gets_its_own_column(tmp_path: Path) -> None:
    # A second name widens the arrays; writing through the old array once raised IndexError.
    b = open_binder(tmp_path / "gs.db")
    b.add_nodes([make_node("a").cpu("4").extended("fpga", 2).build()])
    b.add_nodes([make_node("b").cpu("4").extended("tpu", 3).build()])
    tpu = make_job("t").cpu("1").extended("tpu", 2).build()
    fpga = make_job("f").cpu("1").extended("fpga", 2).build()
    assert outcome(commit(b, prop(tpu, at(0, "b")), prop(fpga, at(0, "a"))))[0] == {"f": [0], "t": [0]}
    assert_consistent(b.state)
    # a third name first seen on a resident (no node has it) still gets a column of its own
    b.state.place(b.state.row_of["a"], Resident("x/0", "x", 0, 0, extended=(("gaudi", 1),)))
    assert b.state.extended_names == ["fpga", "tpu", "gaudi"]
    assert b.state.release("x/0") is not None
    assert b.release(["t/0", "f/0"], "succeeded") == ["t/0", "f/0"]
    assert int(b.state.ext_used.sum()) == 0


# -- change log ---
def test_changes_since_returns_exactly_the_changes_after_a_version(tmp_path: Path) -> None:
    b = open_binder(tmp_path / "gs.db")
    seen: list[tuple[int, list[object]]] = []  # (version before, changes the step made)

    def step(action: Callable[[], object]) -> None:
        before = b.version
        action()
        changes, version, resync = b.changes_since(before)
        assert not resync and version == b.version == before + len(changes)
        seen.append((before, list(changes)))

    step(lambda: b.add_nodes([N4, N4B]))
    step(lambda: commit(b, prop(LOW, at(0, "n1")), prop(cpu_job("x", "1"), at(0, "n2"))))
    step(lambda: commit(b, prop(cpu_job("bad", "1"), at(0, "ghost"))))  # rejected: no change
    step(lambda: commit(b, prop(cpu_job("high", "4"), at(0, "n1", victims=("low/0",)))))
    step(lambda: b.release(["x/0"], "succeeded"))
    step(lambda: b.set_node_state("n2", NodeState.DRAINING))
    step(lambda: b.remove_node("n2"))
    assert seen[2][1] == []
    for i, (before, _) in enumerate(seen):
        expected = [c for _, changes in seen[i:] for c in changes]
        assert b.changes_since(before) == (expected, b.version, False)
    assert b.changes_since(b.version) == ([], b.version, False)
    # a reply carries everything since the shard's view, its own changes included
    v = b.version
    reply = commit(b, prop(cpu_job("y", "1"), at(0, "n1")), seen=seen[-1][0])
    assert reply.changes == seen[-1][1] + b.changes_since(v)[0] and not reply.resync


def test_resync_when_the_shard_is_older_than_the_log(tmp_path: Path) -> None:
    b = open_binder(tmp_path / "gs.db", max_log_entries=4)
    b.add_nodes([N4, N4B])
    for i in range(6):
        commit(b, prop(cpu_job(f"j{i}", "1"), at(0, "n1" if i % 2 else "n2")))
    b.release(["j0/0"], "succeeded")
    assert b.log.oldest_version() > 0
    changes, version, resync = b.changes_since(0)
    assert resync and version == b.version
    assert changes[:2] == [NodeUpserted(N4), NodeUpserted(N4B)]
    assert all(isinstance(c, TaskBound) for c in changes[2:]) and len(changes) == 2 + 5
    # a shard rebuilding from the snapshot sees exactly the binder's state
    cache = ClusterArrays()
    apply_changes(cache, changes)
    assert arrays_view(cache) == b.view()
    reply = commit(b, prop(cpu_job("late", "1"), at(0, "n1")), seen=0)
    assert reply.resync and reply.version == b.version
    cache = ClusterArrays()
    apply_changes(cache, reply.changes)
    assert arrays_view(cache) == b.view()
    # a version from the future (a binder that lost its log) also forces a resync
    assert b.changes_since(b.version + 10)[2]


def test_the_log_stays_bounded(tmp_path: Path) -> None:
    b = open_binder(tmp_path / "gs.db", max_log_entries=10)
    b.add_nodes([make_node("n").cpu("1000").build()])
    for i in range(50):
        commit(b, prop(cpu_job(f"j{i}", "1"), at(0, "n")))
    assert len(b.log) <= 11 and b.version == 51
    assert not b.changes_since(b.version - 10)[2]


# -- recovery ---
def test_restart_recovers_arrays_residents_and_version(tmp_path: Path) -> None:
    path = tmp_path / "gs.db"
    b = open_binder(path)
    share = make_job("share").cpu("1").gpu_share(300).build()
    b.add_nodes([N4, N4B, replace(N4, name="n3")])
    commit(
        b,
        prop(HOLD_GPU0, at(0, "n1", ((0, 1000),))),
        prop(share, at(0, "n1", ((1, 300),))),
        prop(GANG2, at(0, "n2"), at(1, "n3")),
        prop(make_job("rd").cpu("1").extended("rdma", 1).build(), at(0, "n2")),
    )
    commit(
        b, prop(cpu_job("high", "4", priority=1), at(0, "n2", victims=("gb/0",)))
    )  # gang break: n3 empties
    b.release(["share/0"], "succeeded")
    b.set_node_state("n3", NodeState.CORDONED)
    b.add_nodes([make_node("n4").cpu("2").build()])
    b.remove_node("n4")
    assert b.resident("gb/1") is None
    again = open_binder(path)
    assert again.view() == b.view()
    assert again.version == next_epoch(b.version) == 2**EPOCH_BITS  # a new incarnation's versions
    assert again.snapshot_nodes() == b.snapshot_nodes()
    assert again.changes_since(again.version) == ([], again.version, False)
    for seen in (b.version, b.version + 5):  # the last incarnation's views, durable or not, resync
        assert again.changes_since(seen)[2]
    assert open_binder(path).version == 2 * 2**EPOCH_BITS  # even with no change in between
    resident = again.resident("hold/0")
    assert resident is not None and resident[1] == b.resident("hold/0")[1]  # type: ignore[index]
    # and it goes on from there: the same answers as the live one
    p = prop(make_job("next").cpu("1").gpus(1).build(), at(0, "n1", ((1, 1000),)))
    assert outcome(commit(again, p)) == outcome(commit(b, p))


def test_jobs_not_yet_stored_are_stored_with_their_binding(tmp_path: Path) -> None:
    path = tmp_path / "gs.db"
    b = open_binder(path)
    b.add_nodes([N4])
    job = cpu_job("unstored", "1")
    commit(b, prop(job, at(0, "n1")))
    assert b.store.get_job("unstored") == job
    assert open_binder(path).view() == b.view()


def test_empty_and_fast_batches(tmp_path: Path) -> None:
    b = open_binder(tmp_path / "gs.db")
    b.add_nodes([make_node(f"n{i}").cpu("8").gpus(8).build() for i in range(64)])
    reply = commit(b)
    assert reply.accepted == reply.rejected == reply.changes == []
    jobs = [make_job(f"j{i}").cpu("1").gpus(1).build() for i in range(512)]
    props = [prop(j, at(0, f"n{i % 64}", ((i // 64, 1000),))) for i, j in enumerate(jobs)]
    reply = commit(b, *props)
    assert len(reply.accepted) == 512 and not reply.rejected
    assert_consistent(b.state)
    assert int(b.state.free_whole[:64].sum()) == 0


# -- property: random batches ------------------------------------------------------------------------------
NODE_NAMES = ["n0", "n1", "n2", "n3", "n4"]


@st.composite
def clusters(draw: st.DrawFn) -> list[Node]:
    nodes = []
    for name in NODE_NAMES[: draw(st.integers(1, len(NODE_NAMES)))]:
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
        node = make_node(name).cpu(draw(st.integers(2, 16))).mem(draw(st.integers(2, 16)) * GiB).gpus(gpus)
        if draw(st.booleans()):
            node = node.extended("rdma", draw(st.integers(1, 3)))
        if draw(st.integers(0, 9)) == 0:
            node = node.state(NodeState.CORDONED)
        nodes.append(node.build())
    return nodes


@st.composite
def random_jobs(draw: st.DrawFn, job_id: str) -> Job:
    kind = draw(st.sampled_from(["cpu", "whole", "share"]))
    req = ResourceRequest(
        cpu_milli=draw(st.integers(0, 4)) * 500,
        memory=draw(st.integers(0, 4)) * GiB // 2,
        gpus=draw(st.integers(1, 2)) if kind == "whole" else 0,
        gpu_milli=draw(st.sampled_from([250, 500, 750])) if kind == "share" else 0,
        extended=(("rdma", 1),) if draw(st.integers(0, 4)) == 0 else (),
    )
    replicas = draw(st.integers(1, 3))
    return Job(
        id=job_id,
        groups=(TaskGroup("main", replicas, req, ("true",)),),
        min_member=draw(st.integers(1, replicas)),
        priority=draw(st.integers(0, 2)),
        preemptible=draw(st.integers(0, 5)) > 0,
        queue=draw(st.sampled_from(["a", "b"])),
    )


def random_gpus(draw: st.DrawFn, req: ResourceRequest, node: Node | None) -> tuple[tuple[int, int], ...]:
    if draw(st.integers(0, 14)) == 0:  # nonsense, now and then
        n = draw(st.integers(0, 2))
        return tuple((draw(st.integers(0, 9)), draw(st.sampled_from([0, 250, 1000]))) for _ in range(n))
    have = list(range(len(node.gpus))) if node is not None and node.gpus else [0, 1]
    if req.gpus:
        if req.gpus > len(have):
            have = list(range(req.gpus))
        chosen = draw(st.lists(st.sampled_from(have), min_size=req.gpus, max_size=req.gpus, unique=True))
        return tuple((g, GPU_MILLI) for g in chosen)
    if req.gpu_milli:
        return ((draw(st.sampled_from(have)), req.gpu_milli),)
    return ()


def random_proposal(draw: st.DrawFn, job: Job, binder: Binder) -> Proposal:
    """Mostly plausible (as a shard with a slightly stale view would propose), sometimes not."""
    nodes = {n.name: n for n in binder.snapshot_nodes()}
    total = job.total_replicas
    indexes = draw(st.permutations(range(total)))[: draw(st.integers(1, total))]
    if draw(st.integers(0, 14)) == 0:
        indexes = [*indexes, draw(st.sampled_from([indexes[0], total]))]  # a duplicate or no such task
    placements = []
    for idx in indexes:
        if draw(st.integers(0, 19)) == 0:
            name = "ghost"
        else:
            name = draw(st.sampled_from(sorted(nodes) or ["ghost"]))
        victims: tuple[str, ...] = ()
        if draw(st.integers(0, 2)) == 0:
            here = binder.state.residents[binder.state.row_of[name]] if name in binder.state.row_of else {}
            pool = sorted(here) if here and draw(st.integers(0, 5)) else sorted(binder.state.task_row)
            if pool:
                victims = tuple(draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2, unique=True)))
            if draw(st.integers(0, 9)) == 0:
                victims += ("nobody/0",)
        gpus = random_gpus(draw, job.groups[0].resources, nodes.get(name))
        placements.append(Placement(idx, name, gpus, victims))
    min_needed = job.min_member if draw(st.integers(0, 3)) else draw(st.integers(0, total))
    floors: tuple[QueueFloor, ...] = ()
    if any(pl.victims for pl in placements):  # as a shard sends them: only with an eviction
        floors = tuple(
            QueueFloor(q, draw(st.integers(0, 8)) * 500, None, draw(st.sampled_from([None, 500])))
            for q in ("a", "b")
            if draw(st.booleans())
        )
    return Proposal(job, placements, min_needed, floors=floors)


def node_of(b: Binder, task: str) -> str | None:
    got = b.resident(task)
    return None if got is None else got[0]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), data=st.data())
def test_random_batches_keep_every_invariant(nodes: list[Node], data: st.DataObject) -> None:
    draw = data.draw
    with tempfile.TemporaryDirectory() as tmp:
        fast = open_binder(Path(tmp) / "fast.db", max_log_entries=12)
        slow = open_binder(Path(tmp) / "slow.db", vectorised=False, max_log_entries=12)
        both = (fast, slow)
        for b in both:
            b.add_nodes(nodes)
        cache, cache_version = ClusterArrays(), 0  # a shard's view, fed only by replies
        proposed: list[Job] = []
        ended: set[str] = set()

        def requeue(task_ids: list[str]) -> None:
            """What the dispatcher writes on the binder's report of an eviction or a loss: the
            task goes back to pending, from where the store lets a binding take it again."""
            for binder in both:
                binder.store.set_task_states([(t, TaskState.PENDING) for t in task_ids])

        for batch_no in range(draw(st.integers(1, 8))):
            residents = sorted(fast.state.task_row)
            # now and then: tasks end, or a node changes, between batches
            if residents and draw(st.integers(0, 3)) == 0:
                done = draw(st.lists(st.sampled_from(residents), max_size=3, unique=True))
                assert fast.release(done, "succeeded") == slow.release(done, "succeeded")
                ended.update(done)  # never dispatched again
            if draw(st.integers(0, 5)) == 0:
                name = draw(st.sampled_from([n.name for n in fast.snapshot_nodes()]))
                state = draw(st.sampled_from(list(NodeState)))
                for b in both:
                    b.set_node_state(name, state)
            if len(fast.snapshot_nodes()) > 1 and draw(st.integers(0, 7)) == 0:
                name = draw(st.sampled_from([n.name for n in fast.snapshot_nodes()]))
                released = fast.remove_node(name)
                assert released == slow.remove_node(name)
                requeue(released)
            batch: list[Proposal] = []
            for i in range(draw(st.integers(1, 12))):
                if proposed and draw(st.integers(0, 9)) == 0:
                    job = draw(st.sampled_from(proposed))  # again: mostly bound already
                else:
                    job = draw(random_jobs(f"b{batch_no}p{i}"))
                    proposed.append(job)
                p = random_proposal(draw, job, fast)
                kept = [pl for pl in p.placements if f"{job.id}/{pl.task_index}" not in ended]
                if kept:
                    batch.append(replace(p, placements=kept))
            if not batch:
                continue
            seen = cache_version
            before = {
                t: node_of(fast, t)
                for p in batch
                for t in (f"{p.job.id}/{pl.task_index}" for pl in p.placements)
            }
            r_fast = fast.commit(ProposalBatch(0, seen, batch))
            r_slow = slow.commit(ProposalBatch(0, seen, batch))

            # the vectorised path and the sequential path agree exactly
            assert r_fast == r_slow
            assert fast.view() == slow.view()
            assert_consistent(fast.state)
            for queue in ("a", "b"):  # kept up to date from the first floor asked: a full count
                held = [
                    r for rs in fast.state.residents[: fast.state.n] for r in rs.values() if r.queue == queue
                ]
                full = (
                    sum(r.cpu_milli for r in held),
                    sum(r.memory for r in held),
                    sum(m for r in held for _, m in r.gpus),
                )
                assert fast.truth.queue_usage(queue) == full

            # every proposal: accepted with >= min_needed, or rejected whole with nothing applied
            evicted = {e.task_id for e in r_fast.evicted}
            for p in batch:
                all_idx = tuple(pl.task_index for pl in p.placements)
                acc = [a for a in r_fast.accepted if a.job_id == p.job.id]
                rej = [r for r in r_fast.rejected if r.job_id == p.job.id]
                if len([q for q in batch if q.job.id == p.job.id]) > 1:
                    continue  # the same job twice in one batch: answers cannot be told apart
                if acc:
                    (a,) = acc
                    assert len(a.task_indexes) >= max(1, p.min_needed)
                    assert a.attempt == p.attempt
                    dropped = [i for r in rej for i in r.task_indexes]
                    assert sorted([*a.task_indexes, *dropped]) == sorted(all_idx)
                    nodes_at: dict[int, set[str]] = {}  # a task may be proposed twice: one is bound
                    for pl in p.placements:
                        nodes_at.setdefault(pl.task_index, set()).add(pl.node)
                    for i in a.task_indexes:
                        task = f"{p.job.id}/{i}"
                        if task not in evicted:
                            assert node_of(fast, task) in nodes_at[i]
                else:
                    assert len(rej) == 1 and rej[0].task_indexes == all_idx
                    for pl in p.placements:
                        task = f"{p.job.id}/{pl.task_index}"
                        if before.get(task) is None:
                            assert node_of(fast, task) is None
            for task in evicted:
                assert fast.resident(task) is None
            requeue(sorted(evicted))

            # the shard view built from replies alone equals the binder (some replies are missed)
            if draw(st.integers(0, 2)) > 0:
                if r_fast.resync:
                    cache = ClusterArrays()
                apply_changes(cache, r_fast.changes)
                cache_version = r_fast.version
                assert arrays_view(cache) == fast.view()

        # a binder reopened on the same store equals the live one
        for b, name in ((fast, "fast.db"), (slow, "slow.db")):
            again = open_binder(Path(tmp) / name)
            assert again.view() == b.view()
            assert again.version == next_epoch(b.version)
            again.store.close()
        for b in both:
            b.store.close()


def test_fast_path_takes_the_clean_proposals_of_a_conflicted_batch(tmp_path: Path) -> None:
    nodes = [N4, N4B, replace(N4, name="n3"), replace(N4, name="n4", state=NodeState.CORDONED)]
    nodes += [replace(N4, name=f"idle{i}") for i in range(20)]  # rows the batch never touches
    b = open_binder(tmp_path / "gs.db")
    b.add_nodes(nodes)
    commit(b, prop(LOW, at(0, "n3")))
    batch = [
        prop(cpu_job("a", "3"), at(0, "n1")),  # a and b over-commit n1 together: n1 is hot
        prop(cpu_job("b", "3"), at(0, "n1")),
        prop(cpu_job("c", "3"), at(0, "n2")),  # clean
        prop(cpu_job("d", "4", priority=9), at(0, "n3", victims=("low/0",))),  # names a victim
        prop(cpu_job("e", "1"), at(0, "ghost")),  # no such node
        prop(cpu_job("f", "1"), at(0, "n4")),  # fits, but the node is cordoned
        prop(cpu_job("g", "1"), at(0, "idle7")),  # clean, on a row far from the others
    ]
    clean = find_clean(b.truth, batch, b.version)
    assert clean.index == [2, 6]
    assert clean.tids == ["c/0", "g/0"] and clean.rows == [b.state.row_of["n2"], b.state.row_of["idle7"]]
    reply = commit(b, *batch)
    assert outcome(reply)[0] == {"a": [0], "c": [0], "d": [0], "g": [0]}
    assert [a.job_id for a in reply.accepted] == ["a", "c", "d", "g"]  # batch order, whatever the path
    seq = open_binder(tmp_path / "seq.db", vectorised=False)
    seq.add_nodes(nodes)
    commit(seq, prop(LOW, at(0, "n3")))
    assert commit(seq, *batch) == reply
    assert seq.view() == b.view()


def test_fast_path_residents_are_the_records_for_task_makes(tmp_path: Path) -> None:
    """The fast path writes its Residents' fields itself: every field, as Resident.for_task."""
    b = open_binder(tmp_path / "gs.db")
    b.add_nodes([N4, N4B])
    gang = (
        make_job("gang")
        .cpu("1")
        .mem("1Gi")
        .extended("rdma", 1)
        .group("worker")
        .cpu("500m")
        .mem("2Gi")
        .gpus(1)
        .replicas(2)
        .priority(7)
        .preemptible(False)
        .queue("q1")
        .tenant("t1")
        .labels(app="x")
        .min_member(3)
        .disruption_budget(1)
        .build()
    )
    proposal = Proposal(
        gang, [at(0, "n1"), at(1, "n1", ((0, GPU_MILLI),)), at(2, "n2", ((1, GPU_MILLI),))], 3, standing=9
    )
    batch = [proposal, prop(cpu_job("plain", "1"), at(0, "n2"))]

    assert find_clean(b.truth, batch, b.version).index == [0, 1]
    reply = commit(b, *batch)
    now = reply.accepted[0].bind_time
    expected = [Resident.for_task(gang, pl.task_index, pl.gpus, now, 9) for pl in proposal.placements]
    expected.append(Resident.for_task(batch[1].job, 0, (), now))
    assert [c.resident for c in reply.changes if isinstance(c, TaskBound)] == expected
    assert [b.resident(r.task_id) for r in expected] == list(
        zip(["n1", "n1", "n2", "n2"], expected, strict=True)
    )


def test_fast_path_rows_are_its_residents_field_values(tmp_path: Path) -> None:
    """A batch bound whole by the fast path keeps each binding's node and its resident's field
    values (BoundRows), which the change segments pack instead of the records: they must be what
    rows_of reads from the records, for exactly the versions the batch took."""
    b = open_binder(tmp_path / "gs.db")
    b.add_nodes([N4, N4B])
    gang = make_job("gang").cpu("1").extended("rdma", 1).gpus(1).replicas(2).labels(app="x").build()
    batch = [
        Proposal(gang, [at(0, "n1", ((0, GPU_MILLI),)), at(1, "n2", ((1, GPU_MILLI),))], 2, standing=4),
        prop(cpu_job("plain", "1"), at(0, "n2")),
    ]
    before = b.version
    reply = commit(b, *batch)
    bound = b.last_bound
    assert bound is not None and (bound.start, bound.end) == (before, b.version)
    residents = [c.resident for c in reply.changes if isinstance(c, TaskBound)]
    assert bound.rows == rows_of(Resident, residents)
    assert bound.nodes == ["n1", "n2", "n2"]
    assert bound.accepted == rows_of(AcceptedUnit, reply.accepted)
    # Packed from the rows, the verdicts are the same bytes as packed from the reply's units.
    verdicts = BindReply(reply.accepted, reply.rejected, reply.evicted, [], reply.version, shard_id=0)
    from_rows = BindReplyRows(bound.accepted, reply.rejected, reply.evicted, reply.version, 0)
    assert wire.pack(from_rows) == wire.pack(verdicts)
    # A batch the stages take part in keeps none: its changes are not all fast-path bindings.
    commit(b, prop(cpu_job("big", "64"), at(0, "n1")))
    assert b.last_bound is None


def test_a_failed_write_stops_the_binder(tmp_path: Path) -> None:
    b = open_binder(tmp_path / "gs.db")
    b.add_nodes([N4])
    b.store.close()
    with pytest.raises(sqlite3.ProgrammingError):
        commit(b, prop(cpu_job("a", "1"), at(0, "n1")))
    with pytest.raises(RuntimeError, match="new Binder"):
        commit(b, prop(cpu_job("b", "1"), at(0, "n1")))
    again = open_binder(tmp_path / "gs.db")  # the store still holds the last good state
    assert again.resident("a/0") is None and again.version == next_epoch(1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), data=st.data())
def test_resources_and_gpu_stages_agree_with_cluster_arrays_fits(
    nodes: list[Node], data: st.DataObject
) -> None:
    """For one placement without victims, the binder accepts exactly when ClusterArrays.fits says so."""
    draw = data.draw
    with tempfile.TemporaryDirectory() as tmp:
        b = open_binder(Path(tmp) / "gs.db")
        b.add_nodes(nodes)
        for i in range(draw(st.integers(0, 6))):  # some load first
            commit(b, random_proposal(draw, draw(random_jobs(f"pre{i}")), b))
        job = draw(random_jobs("probe"))
        name = draw(st.sampled_from([n.name for n in nodes]))
        node = next(n for n in nodes if n.name == name)
        req = job.groups[0].resources
        gpus = random_gpus(draw, req, node)
        assume(gpu_shape_error(req, gpus) is None)
        row = b.state.row_of[name]
        expected = b.state.fits(row, make_resident(job, 0, gpus, 0.0)) is None and bool(
            b.state.schedulable[row]
        )
        reply = commit(b, prop(job, at(0, name, gpus), min_needed=1))
        assert bool(reply.accepted) == expected, reply.rejected
        b.store.close()
