"""Priority preemption inside a queue with a guarantee, through the in-process pipeline.

A queue's guarantee protects it from other queues' preemptors; its own higher-priority jobs may
still take its lower-priority ones, a gang included: the rest of a gang the eviction breaks is the
gang's own all-or-nothing rule, not a trade the queue makes (Pricer in scheduler_shard/preemption.py).
What the own queue's floor still refuses is a swap whose victims themselves, traded for the
preemptor, leave the queue below its guarantee while another queue borrows (test_queue_preemption's
swap-and-reclaim cycle; with none borrowing, tests/test_same_queue_floor.py).
"""

from dataclasses import dataclass
from pathlib import Path

import pytest

from gosched.common.config import QueueConfig, Settings
from gosched.common.job import Job
from gosched.common.node import Node
from gosched.runtime.pipeline import Pipeline
from tests.builders import make_job, make_node

Q = QueueConfig


def cluster() -> list[Node]:
    """The review's 17 nodes: 4 of 8 GPUs (16 CPUs each), 13 CPU-only."""
    gpu = [make_node(f"g{i}").cpu("16").mem("64Gi").gpus(8).build() for i in range(4)]
    return gpu + [make_node(f"c{i}").cpu("8").mem("64Gi").build() for i in range(13)]


def gang(job_id: str, queue: str, min_member: int = 4) -> Job:
    """Four tasks of 8 GPUs + 8 CPUs: all four GPU nodes."""
    b = make_job(job_id).queue(queue).cpu("8").mem("1Gi").gpus(8).replicas(4).min_member(min_member)
    return b.build()


def preemptor(job_id: str, queue: str, cpu: str = "1", gpus: int = 8) -> Job:
    b = make_job(job_id).queue(queue).priority(100).cpu(cpu).mem("1Gi")
    return (b.gpus(gpus) if gpus else b).build()


@dataclass(frozen=True)
class Case:
    name: str
    nodes: list[Node]
    queues: list[QueueConfig]
    first: list[Job]  # bound before the preemptor comes
    then: Job  # the preemptor, priority 100
    bound: bool  # the preemptor binds (all its tasks)
    held: dict[str, int]  # tasks held per job after
    said: str | None = None  # what explain says about preemption when it does not bind


PROD = [Q(name="default"), Q(name="prod", guarantee=0.5)]

CASES = [
    Case(
        # The review: hg evicts one of lg's tasks, which breaks lg's gang; prod keeps hg's GPUs,
        # and the rest of lg is the gang's own rule. Was refused: "queue prod's guarantee on 4 nodes".
        "a same-queue gang victim is preempted",
        cluster(),
        PROD,
        [gang("lg", "prod")],
        preemptor("hg", "prod"),
        bound=True,
        held={"lg": 0, "hg": 1},
    ),
    Case(
        # A gang preemptor of prod: its second task is judged with the first one's victims (the
        # unit's earlier swaps), not with the rest of lg they broke.
        "a same-queue gang preemptor breaks a gang of its queue",
        cluster(),
        PROD,
        [gang("lg", "prod")],
        make_job("hg")
        .queue("prod")
        .priority(100)
        .cpu("1")
        .mem("1Gi")
        .gpus(8)
        .replicas(2)
        .min_member(2)
        .build(),
        bound=True,
        held={"lg": 0, "hg": 2},
    ),
    Case(
        # The same with lg's tasks standing alone: one evicted, prod keeps its floor.
        "a same-queue non-gang victim is preempted",
        cluster(),
        PROD,
        [gang("lg", "prod", min_member=1)],
        preemptor("hg", "prod"),
        bound=True,
        held={"lg": 3, "hg": 1},
    ),
    Case(
        # Another queue's preemptor: breaking lg's gang would take prod from all 32 GPUs to none,
        # below its guarantee of 16. Refused, and explain blames prod's guarantee.
        "another queue's preemptor may not break prod's guarantee",
        cluster(),
        PROD,
        [gang("lg", "prod")],
        preemptor("hd", "default"),
        bound=False,
        held={"lg": 4, "hd": 0},
        said="queue prod's guarantee on 4 nodes",
    ),
    Case(
        # lg's tasks alone: evicting one leaves prod 24 GPUs, above its floor: allowed.
        "another queue's preemptor takes what prod holds above its guarantee",
        cluster(),
        PROD,
        [gang("lg", "prod", min_member=1)],
        preemptor("hd", "default"),
        bound=True,
        held={"lg": 3, "hd": 1},
    ),
    Case(
        # A CPU-only preemptor of prod in the place of one GPU task: prod keeps 24 GPUs, over its
        # floor of 16: a swap that is fine.
        "a same-queue swap that keeps the floor",
        [make_node(f"g{i}").cpu("8").mem("64Gi").gpus(8).build() for i in range(4)],
        PROD,
        [gang("lg", "prod", min_member=1)],
        preemptor("hc", "prod", cpu="8", gpus=0),
        bound=True,
        held={"lg": 3, "hc": 1},
    ),
    Case(
        # The swap itself (half a node's CPUs for a whole GPU node, no gang) would take prod from
        # exactly its floor (16 GPUs, 16 CPUs) to below it in every resource while queue default
        # borrows the other half: still refused (the cycle of test_queue_preemption), and explain
        # says it is prod's own guarantee. default's tasks outrank the preemptor.
        "a same-queue swap that itself leaves the queue below its guarantee",
        [make_node(f"g{i}").cpu("8").mem("64Gi").gpus(8).build() for i in range(4)],
        PROD,
        [
            make_job("lp").queue("prod").cpu("8").mem("1Gi").gpus(8).replicas(2).build(),
            make_job("bd").queue("default").priority(1000).cpu("8").mem("1Gi").gpus(8).replicas(2).build(),
        ],
        preemptor("hc", "prod", cpu="4", gpus=0),
        bound=False,
        held={"lp": 2, "bd": 2, "hc": 0},
        said="its own queue prod's guarantee (the swap would leave prod below it) on 2 nodes",
    ),
]


def pipeline(tmp_path: Path, nodes: list[Node], queues: list[QueueConfig]) -> Pipeline:
    s = Settings(store_path=str(tmp_path / "gs.db"), retry_backoff_s=0.0, shards=1, queues=queues)
    return Pipeline(s, nodes=nodes)


def held(p: Pipeline, job_id: str) -> int:
    return sum(1 for t in p.binder.state.task_row if t.startswith(f"{job_id}/"))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_preemption_and_the_preemptors_own_queues_guarantee(tmp_path: Path, case: Case) -> None:
    p = pipeline(tmp_path, case.nodes, case.queues)
    p.submit_many(case.first)
    p.run_until_idle()
    assert all(held(p, j.id) == j.groups[0].replicas for j in case.first)
    p.submit(case.then)
    for _ in range(20):
        if not p.step():
            break
    assert not p.step(), "scheduling does not settle"
    explained = p.dispatcher.explain(case.then.id)
    assert {j: held(p, j) for j in case.held} == case.held, explained
    assert (held(p, case.then.id) == case.then.groups[0].replicas) == case.bound, explained
    if case.said is None:
        assert "no preemption" not in explained and "guarantee" not in explained
    else:
        assert f"no preemption: evicting lower-priority tasks would break {case.said}" in explained
