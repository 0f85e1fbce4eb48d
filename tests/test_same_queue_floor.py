"""A same-queue swap that takes its guaranteed queue below its floor, when no other queue borrows.

A queue's guarantee is its share against the other queues, not a say in which of its own jobs run:
inside the queue, priority decides (Volcano's preempt within a queue, YARN's intra-queue
preemption). The own queue's floor refuses a swap only to keep closed the loop of
test_queue_preemption (a queue that swapped itself below its guarantee reclaims from a borrower,
whose higher-priority task preempts it back, for ever), and that loop needs a queue to reclaim
from: with none borrowing, the swap goes by priority (Pricer in scheduler_shard/preemption.py).
The swaps refused while another queue borrows are test_preemption_own_queue's last case and
test_queue_preemption's cycle.
"""

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from gosched.common.config import QueueConfig, Settings
from gosched.common.job import Job
from gosched.common.messages import BindReply
from gosched.common.node import Node
from gosched.runtime.pipeline import Pipeline
from tests.builders import make_job, make_node

Q = QueueConfig

# Two guaranteed halves, both held exactly (no queue above its guarantee: none borrows); `default`
# holds nothing.
HALVES = [Q(name="default"), Q(name="prod", guarantee=0.5), Q(name="dev", guarantee=0.5)]


def gpu_nodes(n: int = 4) -> list[Node]:
    return [make_node(f"g{i}").cpu("8").mem("64Gi").gpus(8).build() for i in range(n)]


def whole_nodes(job_id: str, queue: str, replicas: int, min_member: int, priority: int = 0) -> Job:
    """Tasks of a whole GPU node each (8 CPUs, 8 GPUs)."""
    b = make_job(job_id).queue(queue).priority(priority).cpu("8").mem("1Gi").gpus(8)
    return b.replicas(replicas).min_member(min_member).build()


def preemptor(job_id: str, queue: str, cpu: str, gpus: int, replicas: int = 1) -> Job:
    """Priority 100; a gang of all its tasks."""
    b = make_job(job_id).queue(queue).priority(100).cpu(cpu).mem("1Gi")
    b = b.replicas(replicas).min_member(replicas)
    return (b.gpus(gpus) if gpus else b).build()


@dataclass(frozen=True)
class Case:
    name: str
    queues: list[QueueConfig]
    first: list[Job]  # bound before the preemptor comes
    then: Job  # the preemptor, priority 100
    held: dict[str, int]  # tasks held per job once settled


CASES = [
    Case(
        # hg (4 GPUs) evicts a task of prod's lower-priority gang lg, which breaks it: the swap
        # itself (8 GPUs out, 4 in) takes prod from its floor (16 GPUs) to 12. dev is exactly at its
        # guarantee, so lg requeued has nothing to reclaim. Was refused: "its own queue prod's
        # guarantee (the swap would leave prod below it) on 2 nodes"; dev's floor keeps its nodes.
        "a same-queue gang victim, the other queue at its guarantee",
        HALVES,
        [whole_nodes("lg", "prod", 2, 2), whole_nodes("ld", "dev", 2, 1)],
        preemptor("hg", "prod", cpu="1", gpus=4),
        held={"lg": 0, "ld": 2, "hg": 1},
    ),
    Case(
        # A CPU task for a GPU one (the trade of test_queue_preemption's cycle), no gang: prod goes
        # from 16 GPUs and 16 CPUs to 8 and 12. Nothing borrows, so priority decides.
        "a same-queue CPU-for-GPU swap, the other queue at its guarantee",
        HALVES,
        [whole_nodes("lp", "prod", 2, 1), whole_nodes("ld", "dev", 2, 1)],
        preemptor("hc", "prod", cpu="4", gpus=0),
        held={"lp": 1, "ld": 2, "hc": 1},
    ),
    Case(
        # A gang preemptor of prod (two tasks of 4 GPUs): its first task breaks lg, its second
        # goes where the first made room; prod ends with 8 GPUs, half its floor.
        "a same-queue gang preemptor, the other queue at its guarantee",
        HALVES,
        [whole_nodes("lg", "prod", 2, 2), whole_nodes("ld", "dev", 2, 2)],
        preemptor("hg", "prod", cpu="2", gpus=4, replicas=2),
        held={"lg": 0, "ld": 2, "hg": 2},
    ),
    Case(
        # dev holds 7 of each node's 8 GPUs (below its guarantee: it borrows nothing, and its floor
        # keeps its tasks); the one GPU left on its nodes is too little for hg.
        "a same-queue gang victim, the other queue below its guarantee",
        HALVES,
        [
            whole_nodes("lg", "prod", 2, 2),
            make_job("ld").queue("dev").cpu("7").mem("1Gi").gpus(7).replicas(2).build(),
        ],
        preemptor("hg", "prod", cpu="1", gpus=4),
        held={"lg": 0, "ld": 2, "hg": 1},
    ),
]


def pipeline(tmp_path: Path, queues: list[QueueConfig]) -> tuple[Pipeline, Counter[str]]:
    """A one-shard pipeline on four GPU nodes, and a count of evictions per task."""
    s = Settings(store_path=str(tmp_path / "gs.db"), retry_backoff_s=0.0, shards=1, queues=queues)
    p = Pipeline(s, nodes=gpu_nodes())
    evicted: Counter[str] = Counter()
    on_reply = p.dispatcher.on_reply

    def counting(reply: BindReply) -> list[str]:
        evicted.update(f"{e.job_id}/{e.task_index}" for e in reply.evicted)
        return on_reply(reply)

    p.dispatcher.on_reply = counting  # type: ignore[method-assign]
    return p, evicted


def held(p: Pipeline, job_id: str) -> int:
    return sum(1 for t in p.binder.state.task_row if t.startswith(f"{job_id}/"))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_same_queue_swap_below_the_floor_goes_by_priority_when_nothing_borrows(
    tmp_path: Path, case: Case
) -> None:
    p, evicted = pipeline(tmp_path, case.queues)
    p.submit_many(case.first)
    p.run_until_idle()
    assert all(held(p, j.id) == j.groups[0].replicas for j in case.first)
    p.submit(case.then)
    for _ in range(30):
        if not p.step():
            break
    assert not p.step(), "scheduling does not settle"
    explained = p.dispatcher.explain(case.then.id)
    assert {j: held(p, j) for j in case.held} == case.held, explained
    assert all(n == 1 for n in evicted.values()), evicted  # no task evicted twice: no loop


def test_a_same_queue_swap_below_the_floor_is_still_refused_while_a_guaranteed_queue_borrows(
    tmp_path: Path,
) -> None:
    # dev (guarantee 0.25) holds half the cluster, past its guarantee: prod swapped below its floor
    # would reclaim from it, and dev's tasks (priority 1000) would preempt hc back. The guard of
    # test_queue_preemption's cycle, with a borrower that has a guarantee of its own (the one
    # without is test_preemption_own_queue's last case).
    queues = [Q(name="default"), Q(name="prod", guarantee=0.5), Q(name="dev", guarantee=0.25)]
    p, evicted = pipeline(tmp_path, queues)
    p.submit_many([whole_nodes("lp", "prod", 2, 1), whole_nodes("bd", "dev", 2, 1, priority=1000)])
    p.run_until_idle()
    p.submit(preemptor("hc", "prod", cpu="4", gpus=0))
    for _ in range(30):
        if not p.step():
            break
    assert not p.step(), "scheduling does not settle"
    explained = p.dispatcher.explain("hc")
    assert {j: held(p, j) for j in ("lp", "bd", "hc")} == {"lp": 2, "bd": 2, "hc": 0}, explained
    assert not evicted
    said = "its own queue prod's guarantee (the swap would leave prod below it) on 2 nodes"
    assert f"no preemption: evicting lower-priority tasks would break {said}" in explained
