"""Within-queue preemption past max_share (QueueConfig.within_queue_preemption), through the
in-process pipeline: a higher-priority job that its queue's max_share holds back evicts the
queue's own lower-priority preemptible tasks, on the nodes it takes, until the queue is within its
max_share, as Kueue's withinClusterQueue: LowerPriority; never another queue's tasks for it, and
never with the setting at its default ("never": it waits, as before)."""

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gosched.common import wire
from gosched.common.config import QueueConfig, QueuePolicy, Settings
from gosched.common.job import Job
from gosched.common.node import Node
from gosched.dispatcher.records import JobRecord
from gosched.dispatcher.shedding import Shed
from gosched.runtime.pipeline import Pipeline
from tests.builders import make_job, make_node
from tests.test_queue_preemption import held, pipeline

LOWER = "lower_priority"
EXAMPLES = int(os.environ.get("GOSCHED_PROPERTY_EXAMPLES", "25"))


def low(prefix: str, n: int, queue: str = "a", priority: int = 0, preemptible: bool = True) -> list[Job]:
    return [
        make_job(f"{prefix}{i}")
        .cpu("1")
        .mem("256Mi")
        .queue(queue)
        .priority(priority)
        .preemptible(preemptible)
        .build()
        for i in range(n)
    ]


def high(job_id: str, replicas: int = 1, gpus: int = 0) -> Job:
    b = (
        make_job(job_id)
        .cpu("1")
        .mem("256Mi")
        .queue("a")
        .priority(100)
        .replicas(replicas)
        .min_member(replicas)
    )
    return (b.gpus(gpus) if gpus else b).build()


@dataclass(frozen=True)
class Case:
    name: str
    within: str  # queue a's within_queue_preemption
    first: list[Job]  # bound before the preemptor comes
    then: Job
    held: dict[str, int]  # tasks held per job-id prefix after
    said: str = ""  # what explain says of the preemptor when it waits
    nodes: str = "ten"  # a key of NODES
    also: list[Job] = field(default_factory=list)  # bound next, in queue b
    more: list[Job] = field(default_factory=list)  # submitted with `then`
    policy: QueuePolicy = QueuePolicy.FIFO  # queue a's


NODES: dict[str, Callable[[], list[Node]]] = {
    "ten": lambda: [make_node(f"n{i}").cpu("1").mem("1Gi").build() for i in range(10)],
    "one": lambda: [make_node("big").cpu("10").mem("10Gi").build()],
    "gpus": lambda: [make_node(f"g{i}").cpu("4").mem("8Gi").gpus(4).build() for i in range(2)],
    # Five CPUs the low tasks may take (pool x), five only the preemptor may (pool y).
    "pools": lambda: [
        make_node("x").cpu("5").mem("5Gi").label(pool="x").build(),
        make_node("y").cpu("5").mem("5Gi").label(pool="y").build(),
    ],
}


# Ten nodes of one CPU; queue a may hold half of the cluster (5 CPUs), b the rest.
CASES = [
    Case(
        "a higher-priority job evicts one of its queue's lower-priority tasks",
        LOWER,
        low("lo", 5),
        high("hp"),
        {"hp": 1, "lo": 4},
    ),
    Case(
        "by default it waits for the queue's usage to fall",
        "never",
        low("lo", 5),
        high("hp"),
        {"hp": 0, "lo": 5},
        said="held back by capacity",
    ),
    Case(
        "a gang sheds as much as it needs, all of it",
        LOWER,
        low("lo", 5),
        high("hp", replicas=3),
        {"hp": 3, "lo": 2},
    ),
    Case(
        "tasks that are not preemptible are not shed",
        LOWER,
        low("lo", 5, preemptible=False),
        high("hp"),
        {"hp": 0, "lo": 5},
        said="lower priority hold too little",
    ),
    Case(
        "tasks of the same priority are not shed",
        LOWER,
        low("lo", 5, priority=100),
        high("hp"),
        {"hp": 0, "lo": 5},
        said="lower priority hold too little",
    ),
    Case(
        # b's lower-priority tasks fill the other half: evicting one would make room on the
        # cluster, but leave queue a past its max_share; a's own task goes instead.
        "another queue's lower-priority tasks are not taken for it",
        LOWER,
        low("lo", 5),
        high("hp"),
        {"hp": 1, "lo": 4, "blo": 5},
        also=low("blo", 5, queue="b"),
    ),
    Case(
        # Dispatched in one round, the second would count the first's victims as still held and
        # shed them again: it waits for the first's answer, then sheds its own one. By priority:
        # in FIFO order the evicted job, back at its place ahead of hp2, would hold it back.
        "two preemptors shed one task each",
        LOWER,
        low("lo", 5),
        high("hp"),
        {"hp": 2, "lo": 3},
        more=[high("hp2")],
        policy=QueuePolicy.PRIORITY,
    ),
    Case(
        # By GPUs: a holds 4 of the 8 GPUs (its max_share) with low-priority tasks.
        "GPU work sheds GPUs",
        LOWER,
        [make_job(f"lo{i}").cpu("1").mem("256Mi").gpus(1).queue("a").build() for i in range(4)],
        high("hp", gpus=2),
        {"hp": 1, "lo": 2},
        nodes="gpus",
    ),
    Case(
        # Room beside them on the one node: the task fits without evicting, but must shed.
        "it evicts to shed where it would fit anyway",
        LOWER,
        low("lo", 5),
        high("hp"),
        {"hp": 1, "lo": 4},
        nodes="one",
    ),
    Case(
        # The node is full with both queues' tasks: it displaces one of its own queue's, which
        # is what it must shed, not one of b's (of lower priority still) and then one of its own.
        "the task it displaces is its own queue's",
        LOWER,
        low("lo", 5, priority=50),
        high("hp"),
        {"hp": 1, "lo": 4, "blo": 5},
        nodes="one",
        also=low("blo", 5, queue="b"),
    ),
    Case(
        # The only node it may take holds none of its queue's tasks: placed there, queue a would be
        # past its max_share, so it is not placed at all.
        "it is not placed where it cannot shed",
        LOWER,
        [make_job(f"lo{i}").cpu("1").mem("256Mi").queue("a").selector(pool="x").build() for i in range(5)],
        make_job("hp").cpu("1").mem("256Mi").queue("a").priority(100).selector(pool="y").build(),
        {"hp": 0, "lo": 5},
        said="frees only cpu 0 of 1",
        nodes="pools",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_within_queue_preemption(tmp_path: Path, case: Case) -> None:
    nodes = NODES[case.nodes]()
    queues = [
        QueueConfig(name="a", policy=case.policy, max_share=0.5, within_queue_preemption=case.within),
        QueueConfig(name="b"),
    ]
    p, evicted = pipeline(tmp_path, nodes, queues=queues)
    for wave in (case.first, case.also):  # b's tasks start later: the youngest, the first victims
        p.submit_many(wave)
        p.run_until_idle()
    p.submit_many([case.then, *case.more])
    p.run_until_idle(wait_backoff=True)
    assert {k: held(p, k) for k in case.held} == case.held, p.dispatcher.explain(case.then.id)
    if case.nodes != "gpus":  # the queue is within its max_share (5 one-CPU tasks) in the binder's truth
        assert held(p, "lo") + held(p, "hp") <= 5
    assert not [t for t in evicted if t.startswith("blo")]  # queue b's tasks are never shed for a
    if case.said:
        assert case.said in p.dispatcher.explain(case.then.id)


def test_a_shedding_unit_travels_with_its_shed(tmp_path: Path) -> None:
    """Through the batches the shards are sent (wire-packed rows), the shed comes as dispatched;
    the queue's next preemptor waits for it, and explain says so."""
    queues = [QueueConfig(name="a", max_share=0.5, within_queue_preemption=LOWER), QueueConfig(name="b")]
    p, _ = pipeline(tmp_path, NODES["ten"](), queues=queues)
    p.submit_many(low("lo", 5))
    p.run_until_idle()
    p.submit_many([high("hp"), high("hp2")])
    (batch,) = p.dispatcher.next_batch_rows()
    (unit,) = wire.unpack(wire.pack(batch)).units  # hp2 waits for hp's answer
    assert (unit.job.id, unit.shed) == ("hp", (1000, 0, 0))
    assert "job hp of the queue is evicting its lower-priority tasks: waiting" in p.dispatcher.explain("hp2")


@st.composite
def waves(draw: st.DrawFn) -> list[list[Job]]:
    out: list[list[Job]] = []
    for w in range(draw(st.integers(2, 5))):
        wave = []
        for i in range(draw(st.integers(1, 8))):
            replicas = draw(st.integers(1, 2))
            b = (
                make_job(f"w{w}j{i}")
                .cpu(str(draw(st.integers(1, 3))))
                .mem("1Gi")
                .queue(draw(st.sampled_from(["a", "a", "a", "b"])))
                .priority(draw(st.sampled_from([0, 50, 100])))
                .replicas(replicas)
                .min_member(replicas)
                .preemptible(draw(st.integers(0, 3)) > 0)
            )
            wave.append((b.gpus(1) if draw(st.booleans()) else b).build())
        out.append(wave)
    return out


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(waves=waves(), shards=st.integers(1, 2), data=st.data())
def test_a_shedding_queue_is_never_bound_past_its_max_share(
    waves: list[list[Job]], shards: int, data: st.DataObject
) -> None:
    nodes = [make_node(f"n{i}").cpu("4").mem("16Gi").gpus(2).build() for i in range(4)]
    capacity = (16_000, 64 * 2**30, 8_000)
    queues = [
        QueueConfig(name="a", policy=QueuePolicy.PRIORITY, max_share=0.5, within_queue_preemption=LOWER),
        QueueConfig(name="b"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        s = Settings(store_path=str(Path(tmp) / "gs.db"), retry_backoff_s=0.0, shards=shards, queues=queues)
        p = Pipeline(s, nodes=nodes)
        shed_for = p.dispatcher._shed_for

        def shedding(rec: JobRecord, qi: int, idx: tuple[int, ...]) -> Shed | None:
            shed = shed_for(rec, qi, idx)
            if shed is not None:
                event("a unit sheds")  # --hypothesis-show-statistics: how often the rule is tried
            return shed

        p.dispatcher._shed_for = shedding  # type: ignore[method-assign]
        submitted: list[str] = []
        for wave in waves:
            submitted += p.submit_many(wave)
            p.run_until_idle()
            residents = [r for row in p.binder.state.residents for r in row.values()]
            used = [0, 0, 0]
            for r in residents:
                if r.queue == "a":
                    used = [used[0] + r.cpu_milli, used[1] + r.memory, used[2] + sum(m for _, m in r.gpus)]
            assert max(u / c for u, c in zip(used, capacity, strict=True)) <= 0.5 + 1e-9, used
            bound = sorted(r.task_id for r in residents)
            if bound:
                p.complete(data.draw(st.lists(st.sampled_from(bound), unique=True, max_size=3)))
        assert all(p.dispatcher.job_state(j) is not None for j in submitted)  # none is lost
        p.close()


def test_after_a_restart_the_restored_jobs_are_shed(tmp_path: Path) -> None:
    """The jobs a restarted master reads back count as the queue's, for what it may shed."""
    queues = [QueueConfig(name="a", max_share=0.5, within_queue_preemption=LOWER), QueueConfig(name="b")]
    p, _ = pipeline(tmp_path, NODES["ten"](), queues=queues)
    p.submit_many(low("lo", 5))
    p.run_until_idle()
    p.close()
    q, evicted = pipeline(tmp_path, [], queues=queues)  # the nodes come back from the store
    q.submit(high("hp"))
    q.run_until_idle(wait_backoff=True)
    assert (held(q, "hp"), held(q, "lo"), sum(evicted.values())) == (1, 4, 1), q.dispatcher.explain("hp")
