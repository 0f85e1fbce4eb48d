"""Elastic gangs and preemption (Volcano's gang rule): a gang (min_member above 1) preempts by
priority only below its min_member; its tasks past the minimum take free room only (capacity
reclaim still serves them). A job of min_member 1 is no gang: each task preempts, as a pod does. A
victim job's tasks past its own min_member cost just themselves (no gang break)."""

from dataclasses import dataclass
from pathlib import Path

import pytest

from gosched.common.config import QueueConfig, Settings
from gosched.common.job import Job
from gosched.common.messages import Unit, UnitBatch
from gosched.common.states import TaskState
from gosched.runtime.pipeline import Pipeline
from gosched.scheduler_shard.preemption import Pricer
from gosched.scheduler_shard.unit_context import UnitContext
from tests.builders import make_job, make_node
from tests.shard_helpers import shard_with

Running = list[tuple[Job, int, str, tuple[tuple[int, int], ...]]]


def _low(job_id: str, cpu: str = "4", priority: int = 1) -> Job:
    return make_job(job_id).cpu(cpu).priority(priority).build()


@dataclass
class ElasticCase:
    name: str
    nodes: list[str]  # 8-CPU nodes
    running: Running
    job: Job  # priority 100
    held: int  # the job's tasks already bound (Unit.held): those in `running` of its id
    placed: int  # tasks of the unit placed
    victims: set[str]
    past_minimum: bool  # the verdict on the rest says it waits for free room


def _preemptor(replicas: int, min_member: int) -> Job:
    return make_job("hi").cpu("4").replicas(replicas).min_member(min_member).priority(100).build()


# n0 has room for one 4-CPU task; n1 and n2 are full of lower-priority 4-CPU tasks.
FULL: Running = [
    (_low("a"), 0, "n0", ()),
    (_low("b"), 0, "n1", ()),
    (_low("c"), 0, "n1", ()),
    (_low("d"), 0, "n2", ()),
    (_low("e"), 0, "n2", ()),
]
ELASTIC = [
    ElasticCase(
        "extras past the minimum take free room only",
        ["n0", "n1", "n2"],
        [*FULL[:3], (_low("d", priority=200), 0, "n2", ()), (_low("e", priority=200), 0, "n2", ())],
        _preemptor(3, 2),
        held=0,
        placed=2,  # one on free room, one by preemption; the third waits, though b or c could go
        victims={"b/0"},
        past_minimum=True,
    ),
    ElasticCase(
        "a job of min_member 1 is no gang: each task preempts",
        ["n0", "n1", "n2"],
        FULL,
        _preemptor(3, 1),
        held=0,
        placed=3,
        victims={"b/0", "c/0"},
        past_minimum=False,
    ),
    ElasticCase(
        "a retry of a job of min_member 1 with tasks bound preempts for the rest",
        ["n1", "n2"],
        [(_preemptor(3, 1), 0, "n1", ()), *FULL[1:2], *FULL[3:]],
        _preemptor(3, 1),
        held=1,
        placed=2,
        victims={"b/0", "d/0"},
        past_minimum=False,
    ),
    ElasticCase(
        "a starving gang preempts up to its minimum, no further",
        ["n0", "n1", "n2"],
        FULL,
        _preemptor(4, 3),
        held=0,
        placed=3,  # one on free room, two by preemption; the fourth waits
        victims={"b/0", "c/0"},
        past_minimum=True,
    ),
    ElasticCase(
        "a gang needing all its tasks preempts for all",
        ["n0", "n1", "n2"],
        FULL,
        _preemptor(3, 3),
        held=0,
        placed=3,
        victims={"b/0", "c/0"},
        past_minimum=False,
    ),
    ElasticCase(
        "a single task preempts as before",
        ["n1"],
        [(_low("b"), 0, "n1", ()), (_low("c"), 0, "n1", ())],
        _preemptor(1, 1),
        held=0,
        placed=1,
        victims={"b/0"},
        past_minimum=False,
    ),
    ElasticCase(
        "a retry of a gang whose bound tasks reach its minimum preempts nothing",
        ["n1", "n2"],
        [(_preemptor(4, 2), 0, "n1", ()), (_preemptor(4, 2), 1, "n1", ()), *FULL[3:]],
        _preemptor(4, 2),
        held=2,
        placed=0,
        victims=set(),
        past_minimum=True,
    ),
    ElasticCase(
        "a retry of a gang still below its minimum preempts for the rest of it",
        ["n1", "n2"],
        [(_preemptor(4, 3), 0, "n1", ()), (_preemptor(4, 3), 1, "n1", ()), *FULL[3:]],
        _preemptor(4, 3),
        held=2,
        placed=1,
        victims={"d/0"},
        past_minimum=True,
    ),
]


@pytest.mark.parametrize("case", ELASTIC, ids=lambda c: c.name)
def test_only_a_job_below_its_min_member_preempts(case: ElasticCase) -> None:
    shard = shard_with([make_node(n).cpu("8").build() for n in case.nodes], case.running)
    job = case.job
    rest = tuple(i for i in range(job.total_replicas) if f"hi/{i}" not in shard.state.task_row)
    need = min(max(1, job.min_member - case.held), len(rest))
    out = shard.schedule(UnitBatch(0, [Unit(job, rest, need, held=case.held)]))
    placements = [p for proposal in out.proposals for p in proposal.placements]
    assert len(placements) == case.placed
    victims = {v for p in placements for v in p.victims}
    if case.victims:
        # which of the equal lower-priority tasks go is the sorting's: their count is the rule
        assert len(victims) == len(case.victims) and victims <= {"a/0", "b/0", "c/0", "d/0", "e/0"}
    else:
        assert victims == set()
    if case.placed == len(rest):
        assert out.unschedulable == []
        return
    (verdict,) = out.unschedulable
    assert len(verdict.task_indexes) == len(rest) - case.placed
    # Nothing to retry for before room frees (which wakes the job): no settling verdict.
    assert verdict.settling is False
    assert ("waits for free room" in verdict.diagnosis.message()) is case.past_minimum


def test_extras_past_the_own_partition_take_free_room_elsewhere_at_once() -> None:
    # The minimum fits in the own partition; the rest fits only beyond it. They used to be left
    # for a settling retry; now they go there in the same attempt.
    nodes = [make_node(f"n{i}").cpu("4").build() for i in range(3)]
    shard = shard_with(nodes)
    shard.set_partition(["n0"])
    job = make_job("el").cpu("4").replicas(3).min_member(1).build()
    out = shard.schedule(UnitBatch(0, [Unit(job, (0, 1, 2), 1)]))
    assert sorted(p.node for p in out.proposals[0].placements) == ["n0", "n1", "n2"]
    assert out.unschedulable == []


@pytest.mark.parametrize("borrowed", [2, 1], ids=["no free room", "room for the minimum"])
def test_extras_past_the_minimum_still_reclaim_from_a_borrowing_queue(borrowed: int) -> None:
    # Capacity reclaim is a queue's guarantee, not the job's gang: Volcano's reclaim action asks
    # no job whether it starves. With room for its minimum the rest reclaims in the same attempt.
    borrow = make_job("borrow").cpu("4").replicas(borrowed).priority(500).queue("q1").build()
    shard = shard_with([make_node("n").cpu("8").build()], [(borrow, i, "n", ()) for i in range(borrowed)])
    job = make_job("el").cpu("4").replicas(2).min_member(1).queue("q2").build()
    out = shard.schedule(UnitBatch(0, [Unit(job, (0, 1), 1, held=0, reclaim_from=frozenset({"q1"}))]))
    placements = out.proposals[0].placements
    assert len(placements) == 2 and out.unschedulable == []
    assert {v for p in placements for v in p.victims} == {f"borrow/{i}" for i in range(borrowed)}


# -- a victim's tasks past its own min_member are cheap: no gang break --------------------------------
@pytest.mark.parametrize(
    ("min_member", "bound", "evicted", "lost"),
    [
        (1, 3, 2, 2),  # no gang: each task alone
        (2, 3, 1, 1),  # the one past the minimum: itself
        (2, 4, 2, 2),  # both past it
        (2, 3, 2, 3),  # below the minimum: the whole gang goes
        (3, 3, 1, 3),  # a gang with no task to spare
    ],
)
def test_the_pricer_charges_a_gang_break_only_below_the_victims_min_member(
    min_member: int, bound: int, evicted: int, lost: int
) -> None:
    victim = make_job("v").cpu("1").replicas(bound).min_member(min_member).priority(7).build()
    nodes = [make_node("n").build()]
    shard = shard_with(nodes, [(victim, i, "n", ()) for i in range(bound)])
    p = make_job("p").cpu("1").priority(100).build()
    pricer = Pricer(shard.state, UnitContext(Unit(p, (0,), 1)), p.groups[0].resources)
    row = shard.state.row_of["n"]
    chosen = [shard.state.residents[row][f"v/{i}"] for i in range(evicted)]
    assert pricer.price(chosen) == (lost, lost * 7)


def test_the_victim_search_prefers_an_elastic_jobs_spare_task_to_breaking_a_gang() -> None:
    # Equal priority everywhere: evicting tight/0 breaks its gang (2 tasks lost), spare/0 of the
    # elastic job costs itself alone (its other task keeps its minimum).
    nodes = [make_node(n).cpu("4").build() for n in ("a", "b", "x", "y")]
    tight = make_job("tight").cpu("4").replicas(2).min_member(2).priority(10).build()
    spare = make_job("spare").cpu("4").replicas(2).min_member(1).priority(10).build()
    running: Running = [(tight, 0, "a", ()), (tight, 1, "b", ()), (spare, 0, "x", ()), (spare, 1, "y", ())]
    shard = shard_with(nodes, running)
    out = shard.schedule(UnitBatch(0, [Unit(make_job("p").cpu("4").priority(100).build(), (0,), 1)]))
    (placement,) = out.proposals[0].placements
    assert placement.node in {"x", "y"} and placement.victims in (("spare/0",), ("spare/1",))


# -- end to end --------------------------------------------------------------------------------------------
def _pipeline(tmp_path: Path, nodes: int) -> Pipeline:
    settings = Settings(
        store_path=str(tmp_path / "gs.db"),
        retry_backoff_s=0.0,
        shards=1,
        unschedulable_retry_s=3600.0,
        queues=[QueueConfig(name="default")],
    )
    return Pipeline(settings, nodes=[make_node(f"n{i}").cpu("8").build() for i in range(nodes)])


def test_a_gang_placed_at_its_minimum_never_preempts_for_the_rest_on_its_retries(tmp_path: Path) -> None:
    p = _pipeline(tmp_path, 2)
    p.submit_many([_low(f"low{i}") for i in range(2)])  # two 4-CPU slots left free
    p.run_until_idle()
    p.submit(make_job("g").cpu("4").replicas(4).min_member(2).priority(100).build())
    p.run_until_idle(wait_backoff=True)
    # A node too small for any of it: a cluster change that wakes g for a retry (held 2 = its
    # min_member), which preempts nothing either.
    attempts = p.dispatcher.explain("g")
    assert "waits for free room" in attempts
    p.add_nodes([make_node("tiny").cpu("1").build()])
    p.run_until_idle(wait_backoff=True)
    assert p.dispatcher.explain("g") != attempts
    assert sorted(p.dispatcher.task_states("g")).count(TaskState.BOUND) == 2
    assert all(p.dispatcher.task_states(f"low{i}") == [TaskState.BOUND] for i in range(2))
    p.complete(["low0/0"])  # room frees: the job wakes and takes it
    p.run_until_idle(wait_backoff=True)
    assert sorted(p.dispatcher.task_states("g")).count(TaskState.BOUND) == 3


def test_a_starving_gang_preempts_end_to_end(tmp_path: Path) -> None:
    p = _pipeline(tmp_path, 2)
    p.submit_many([_low(f"low{i}") for i in range(4)])
    p.run_until_idle()
    p.submit(make_job("g").cpu("4").replicas(3).min_member(2).priority(100).build())
    p.run_until_idle(wait_backoff=True)
    assert sorted(p.dispatcher.task_states("g")).count(TaskState.BOUND) == 2
    lows = [s for i in range(4) for s in p.dispatcher.task_states(f"low{i}")]
    assert lows.count(TaskState.BOUND) == 2  # two evicted for the minimum, none for the third
