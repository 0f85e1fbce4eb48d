"""Preemption clears anti-affinity, as kube-scheduler's does: a node excluded only because of
lower-priority tasks on it that repel the preemptor (or that it repels) is a candidate, with those
tasks as victims. A task elsewhere in the domain, one no eviction may take (priority, budget, not
preemptible, in flight), or one of the preemptor's own job keeps the node excluded."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gosched.common.cluster_state import ClusterArrays
from gosched.common.config import Settings
from gosched.common.job import AntiAffinity, Job, TaskGroup
from gosched.common.messages import Placement, Proposal, ProposalBatch, Unit, UnitBatch
from gosched.common.node import Node
from gosched.common.resources import ResourceRequest
from gosched.common.states import TaskState
from gosched.runtime.pipeline import Pipeline
from gosched.scheduler_shard.framework.task_class import class_of
from gosched.scheduler_shard.plugins.anti_affinity import AntiAffinityFilter
from gosched.scheduler_shard.unit_context import UnitContext
from tests.builders import JobBuilder, make_job, make_node, zone_node
from tests.shard_helpers import run_units, shard_with

Running = list[tuple[Job, int, str, tuple[tuple[int, int], ...]]]
WEB = {"app": "web"}


def web(job_id: str, priority: int = 1, cpu: str = "1") -> JobBuilder:
    """A task whose job carries app=web."""
    return make_job(job_id).cpu(cpu).priority(priority).labels(**WEB)


def guard(job_id: str, priority: int = 1, cpu: str = "1", key: str = "node") -> JobBuilder:
    """A task whose rule repels app=web from its domain."""
    return make_job(job_id).cpu(cpu).priority(priority).anti_affinity(key, **WEB)


def avoids_web(cpu: str = "2", key: str = "node") -> Job:
    """The preemptor, by its own rule."""
    return make_job("p").cpu(cpu).priority(100).anti_affinity(key, **WEB).build()


def is_web(cpu: str = "2") -> Job:
    """The preemptor, repelled by the residents' rules."""
    return make_job("p").cpu(cpu).priority(100).labels(**WEB).build()


def node(name: str, cpu: str = "8", zone: str | None = None) -> Node:
    return zone_node(name, zone, cpu)


@dataclass
class Case:
    name: str
    nodes: list[Node]
    running: Running
    preemptor: Job
    placed: dict[str, set[str]] | None  # node -> victims of the placement there; None: unschedulable
    said: str = ""  # what "why pending" says besides, when unschedulable


def _on(node_name: str, *jobs: Job) -> Running:
    return [(j, 0, node_name, ()) for j in jobs]


CASES = [
    Case(
        "its rule: the repelled task goes",
        [node("n")],
        _on("n", web("w").build()),
        avoids_web(),
        {"n": {"w/0"}},
    ),
    Case(
        "their rule: the repelling task goes",
        [node("n")],
        _on("n", guard("g").build()),
        is_web(),
        {"n": {"g/0"}},
    ),
    Case("equal priority stays", [node("n")], _on("n", web("w", 100).build()), avoids_web(), None),
    Case("higher priority stays", [node("n")], _on("n", guard("g", 200).build()), is_web(), None),
    Case(
        "a disruption budget of 0 protects it",
        [node("n")],
        _on("n", web("w").disruption_budget(0).build()),
        avoids_web(),
        None,
        "no preemption: evicting lower-priority tasks would break job w's disruption budget (0) on 1 node",
    ),
    Case(
        "not preemptible stays", [node("n")], _on("n", guard("g").preemptible(False).build()), is_web(), None
    ),
    Case(
        "room and the rule together",
        [node("n")],
        _on("n", web("w").build(), make_job("fill").cpu("7").priority(1).build()),
        avoids_web(cpu="7"),
        {"n": {"w/0", "fill/0"}},
    ),
    Case(
        "the repelled task's room is enough: the rest is reprieved",
        [node("n")],
        _on(
            "n",
            web("w").build(),
            make_job("keep").cpu("3").priority(5).build(),
            make_job("fill").cpu("4").priority(1).build(),
        ),
        avoids_web(cpu="1"),
        {"n": {"w/0"}},
    ),
    Case(
        "a free node that keeps the rule beats any eviction",
        [node("n"), node("m")],
        _on("n", web("w").build()),
        avoids_web(),
        {"m": set()},
    ),
    Case(
        "zone rule, the one conflicting task on the node: it goes",
        [node("n1", zone="a"), node("n2", cpu="1", zone="a")],
        _on("n1", web("w").build()),
        avoids_web(key="zone"),
        {"n1": {"w/0"}},
    ),
    Case(
        "zone rule, the conflicting task on another node of the zone: no candidate",
        [node("n1", zone="a"), node("n2", cpu="2", zone="a")],
        _on("n2", web("w").build()),
        avoids_web(cpu="4", key="zone"),
        None,
    ),
    Case(
        "zone rule, the other way: a repelling task on another node of the zone",
        [node("n1", zone="a"), node("n2", cpu="2", zone="a")],
        _on("n2", guard("g", key="zone").build()),
        is_web(cpu="4"),
        None,
    ),
    Case(
        "zone rule, conflicting tasks on two nodes of the zone: evicting one clears nothing",
        [node("n1", zone="a"), node("n2", zone="a")],
        _on("n1", web("w1").build()) + _on("n2", web("w2").build()),
        avoids_web(key="zone"),
        None,
    ),
    Case(
        "a node in no zone is no domain: free room, no eviction",
        [node("n1", zone="a"), node("n2")],
        _on("n1", web("w").build()),
        avoids_web(key="zone"),
        {"n2": set()},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_preemption_clears_anti_affinity(case: Case) -> None:
    shard = shard_with(case.nodes, case.running)
    out = run_units(shard, [case.preemptor])
    if case.placed is None:
        assert out.proposals == []
        assert [u.job_id for u in out.unschedulable] == ["p"]
        assert "anti-affinity" in out.unschedulable[0].diagnosis.message()
        assert case.said in out.unschedulable[0].diagnosis.message()
        return
    (proposal,) = out.proposals
    assert {p.node: set(p.victims) for p in proposal.placements} == case.placed


def test_a_gang_of_repelling_replicas_keeps_apart_and_clears_a_node_for_the_second() -> None:
    # Two replicas that repel each other (their job carries the labels its rule names): one takes
    # the free node, the other evicts the lower-priority web task; never both on one node.
    gang = make_job("p").cpu("2").replicas(2).min_member(2).priority(100).labels(**WEB).anti_affinity(**WEB)
    shard = shard_with([node("n"), node("m")], _on("n", web("w").build()))
    (proposal,) = run_units(shard, [gang.build()]).proposals
    assert {p.node: set(p.victims) for p in proposal.placements} == {"m": set(), "n": {"w/0"}}


def test_the_preemptors_own_task_on_the_node_is_never_a_victim() -> None:
    # Spread over nodes (no match labels): a bound task of the same job keeps n excluded.
    job = make_job("p").cpu("2").replicas(2).min_member(1).priority(100).anti_affinity().build()
    shard = shard_with([node("n")], [(job, 0, "n", ())])
    out = shard.schedule(UnitBatch(0, [Unit(job, (1,), 1, held=0)]))
    assert out.proposals == [] and out.unschedulable[0].task_indexes == (1,)


@pytest.mark.parametrize("preemptor", [avoids_web(), is_web()], ids=["its rule", "their rule"])
def test_a_task_in_flight_is_no_victim_and_the_verdict_is_retried(preemptor: Job) -> None:
    # The conflicting task is planned in the same batch (awaiting the binder): not evictable yet.
    in_flight = web("w").build() if preemptor.labels == () else guard("g").build()
    shard = shard_with([node("n")])
    out = run_units(shard, [in_flight, preemptor])
    assert [p.job.id for p in out.proposals] == [in_flight.id]
    (verdict,) = out.unschedulable
    assert verdict.job_id == "p" and verdict.settling is True
    assert "still being bound" in verdict.diagnosis.message()


# -- the rows evicting can clear are rows the filter excludes, found from the same rules ------------------
MATCH = [(("app", "web"),), (("app", "db"),)]
LABELS = st.sampled_from([(), *MATCH])
RULES = st.lists(
    st.builds(AntiAffinity, st.sampled_from(["node", "zone"]), st.sampled_from([(), *MATCH])), max_size=2
)


@settings(max_examples=200, deadline=None)
@given(
    zones=st.lists(st.sampled_from(["a", "b", None]), min_size=1, max_size=4),
    residents=st.lists(st.tuples(st.integers(0, 3), LABELS, RULES, st.booleans()), max_size=6),
    labels=LABELS,
    rules=RULES,
)
def test_evictable_blockers_agree_with_the_filter(
    zones: list[str | None],
    residents: list[tuple[int, tuple[tuple[str, str], ...], list[AntiAffinity], bool]],
    labels: tuple[tuple[str, str], ...],
    rules: list[AntiAffinity],
) -> None:
    nodes = [node(f"n{i}", cpu="64", zone=z) for i, z in enumerate(zones)]
    group = TaskGroup("main", 2, ResourceRequest(cpu_milli=1000), ("true",), anti_affinity=tuple(rules))
    job = Job(id="p", groups=(group,), labels=labels, priority=100)
    running: Running = []
    for i, (at, their_labels, their_rules, own) in enumerate(residents):
        if own:  # a task of the preemptor's own job (index 0), bound earlier
            if not any(j.id == "p" for j, *_ in running):
                running.append((job, 0, f"n{at % len(nodes)}", ()))
            continue
        g = TaskGroup("main", 1, ResourceRequest(cpu_milli=1000), ("true",), anti_affinity=tuple(their_rules))
        running.append((Job(id=f"r{i}", groups=(g,), labels=their_labels), 0, f"n{at % len(nodes)}", ()))
    shard = shard_with(nodes, running)
    state = shard.state
    ctx = UnitContext(Unit(job, (1,), 1))
    tc = class_of(group)
    aa = AntiAffinityFilter()
    excluded = aa.excluded(tc, ctx, state) if aa.relevant(tc, state) else None
    excluded_rows = set() if excluded is None else set(np.flatnonzero(excluded).tolist())
    blocked = aa.evictable_blockers(tc, ctx, state)
    assert set(blocked) <= excluded_rows
    for row, tasks in blocked.items():
        assert tasks and all(r.job_id != "p" and state.task_row[r.task_id] == row for r in tasks)
        # Without those tasks the row is no longer excluded (what the binder's check will find).
        for r in tasks:
            state.release(r.task_id)
        again = aa.excluded(tc, ctx, state)
        assert again is None or not again[row]
        for r in tasks:
            state.place(row, r)
    # And a row left out stays excluded with every task of other jobs on it gone.
    for row in excluded_rows - set(blocked):
        others = [r for r in state.residents[row].values() if r.job_id != "p"]
        for r in others:
            state.release(r.task_id)
        again = aa.excluded(tc, ctx, state)
        assert again is not None and again[row]
        for r in others:
            state.place(row, r)


# -- end to end: the binder accepts what the shard proposes, and refuses a conflict not cleared ----------
def _pipeline(tmp_path: Path, nodes: list[Node]) -> Pipeline:
    s = Settings(
        store_path=str(tmp_path / "gs.db"), retry_backoff_s=0.0, shards=1, unschedulable_retry_s=3600.0
    )
    return Pipeline(s, nodes=nodes)


def _bound_on(p: Pipeline, task_id: str) -> str | None:
    row = p.binder.state.task_row.get(task_id)
    found = None if row is None else p.binder.state.nodes[row]
    return None if found is None else found.name


@pytest.mark.parametrize(
    ("resident", "preemptor"),
    [(web("w").build(), avoids_web()), (guard("w").build(), is_web())],
    ids=["its rule", "their rule"],
)
def test_the_binder_binds_a_preemptor_whose_victim_cleared_the_rule(
    tmp_path: Path, resident: Job, preemptor: Job
) -> None:
    p = _pipeline(tmp_path, [node("n")])
    p.submit(resident)
    p.run_until_idle()
    p.submit(preemptor)
    p.run_until_idle(wait_backoff=True)
    assert _bound_on(p, "p/0") == "n"
    assert p.dispatcher.task_states("w") == [TaskState.PENDING]  # evicted; n now repels it


def test_the_binder_refuses_a_proposal_that_evicts_the_wrong_task(tmp_path: Path) -> None:
    # A proposal naming a victim that is not the conflicting task: the rule still breaks.
    p = _pipeline(tmp_path, [node("n")])
    p.submit_many([web("w").build(), make_job("other").cpu("1").priority(1).build()])
    p.run_until_idle()
    binder = p.binder
    high = avoids_web()
    wrong = Proposal(high, [Placement(0, "n", (), ("other/0",))], 1)
    reply = binder.commit(ProposalBatch(0, binder.version, [wrong]))
    assert [(r.job_id, r.stage) for r in reply.rejected] == [("p", "anti_affinity")]
    assert _bound_on(p, "other/0") == "n" and _bound_on(p, "w/0") == "n"
    right = Proposal(high, [Placement(0, "n", (), ("w/0",))], 1)
    reply = binder.commit(ProposalBatch(0, binder.version, [right]))
    assert reply.rejected == [] and [e.task_id for e in reply.evicted] == ["w/0"]


# -- invariant: whatever preemption plans, the truth keeps every anti-affinity rule -----------------------
def rule_broken(a: ClusterArrays) -> str | None:
    """Two bound tasks in one domain that a rule of one of them forbids (both ways: the holder's
    rule names the other's labels)."""
    tasks = [(row, r) for row in range(a.n) for r in a.residents[row].values()]
    zones = a.label_values("zone")
    for row, r in tasks:
        for rule in r.repels:
            for other_row, o in tasks:
                if o is r or not set(rule.match_labels) <= set(o.job_labels):
                    continue
                same = (
                    other_row == row
                    if rule.topology_key == "node"
                    else (zones[row] is not None and zones[row] == zones[other_row])
                )
                if same:
                    return f"{r.task_id} and {o.task_id} share a {rule.topology_key}"
    return None


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[Node], list[Job], list[Job]]:
    nodes = [
        make_node(f"n{i}").cpu(str(draw(st.integers(2, 8)))).label(zone=draw(st.sampled_from("ab"))).build()
        for i in range(draw(st.integers(1, 4)))
    ]

    def job(prefix: str, i: int, priorities: list[int]) -> Job:
        labels = draw(st.sampled_from([(), (("app", "web"),), (("app", "db"),)]))
        rules = draw(
            st.lists(
                st.builds(
                    AntiAffinity,
                    st.sampled_from(["node", "zone"]),
                    st.sampled_from([(("app", "web"),), (("app", "db"),)]),
                ),
                max_size=1,
            )
        )
        replicas = draw(st.integers(1, 2))
        req = ResourceRequest(cpu_milli=draw(st.integers(1, 4)) * 1000)
        return Job(
            id=f"{prefix}{i}",
            groups=(TaskGroup("main", replicas, req, ("true",), anti_affinity=tuple(rules)),),
            labels=labels,
            min_member=draw(st.integers(1, replicas)),
            priority=draw(st.sampled_from(priorities)),
            disruption_budget=draw(st.sampled_from([None, None, 0, 1])),
        )

    first = [job("low", i, [0, 10]) for i in range(draw(st.integers(1, 6)))]
    second = [job("high", i, [10, 100]) for i in range(draw(st.integers(1, 4)))]
    return nodes, first, second


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(work=workloads(), shards=st.integers(1, 2))
def test_no_preemption_plan_breaks_an_anti_affinity_rule_in_the_truth(
    tmp_path_factory: pytest.TempPathFactory, work: tuple[list[Node], list[Job], list[Job]], shards: int
) -> None:
    nodes, first, second = work
    path = tmp_path_factory.mktemp("aa")
    s = Settings(store_path=str(path / "gs.db"), retry_backoff_s=0.0, shards=shards)
    p = Pipeline(s, nodes=nodes)
    try:
        p.submit_many(first)
        p.run_until_idle()
        assert rule_broken(p.binder.state) is None
        p.submit_many(second)
        for _ in range(50):
            if not p.step():
                break
            assert rule_broken(p.binder.state) is None
    finally:
        p.close()
