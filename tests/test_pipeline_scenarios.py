"""Acceptance scenarios through the whole in-process pipeline: dispatcher -> shards -> binder."""

import time
from pathlib import Path

import numpy as np
import pytest

from gosched.common.config import ProfileConfig, QueueConfig, QueuePolicy, Settings
from gosched.common.job import Job
from gosched.common.node import Node
from gosched.common.states import JobState, TaskState
from gosched.runtime.pipeline import Pipeline
from tests.builders import make_job, make_node


def pipeline(tmp_path: Path, nodes: list[Node], **settings: object) -> Pipeline:
    s = Settings(store_path=str(tmp_path / "gs.db"), retry_backoff_s=0.0, **settings)  # type: ignore[arg-type]
    return Pipeline(s, nodes=nodes)


def bound_node(p: Pipeline, task_id: str) -> str | None:
    row = p.binder.state.task_row.get(task_id)
    if row is None:
        return None
    node = p.binder.state.nodes[row]
    return None if node is None else node.name


def test_gang_preemption_on_one_node(tmp_path: Path) -> None:
    p = pipeline(tmp_path, [make_node("n").cpu("10").build()], shards=1)
    p.submit(make_job("p1").cpu("5").priority(90).build())
    p.submit(make_job("p2").cpu("5").priority(80).build())
    p.run_until_idle()
    assert bound_node(p, "p1/0") == "n" and bound_node(p, "p2/0") == "n"
    p.submit(make_job("g").cpu("5").replicas(2).min_member(2).priority(100).build())
    p.step()
    assert bound_node(p, "g/0") == "n" and bound_node(p, "g/1") == "n"
    assert bound_node(p, "p1/0") is None and bound_node(p, "p2/0") is None
    assert p.dispatcher.task_states("p1") == [TaskState.PENDING]
    assert p.dispatcher.task_states("p2") == [TaskState.PENDING]


def test_a_higher_priority_job_in_the_same_batch_preempts_once_the_lower_is_bound(tmp_path: Path) -> None:
    # "high" is planned while "low" (same batch) only awaits the binder, so it cannot evict it
    # yet. Binding "low" is no change that wakes a dormant job: without its verdict marked
    # settling, "high" would wait for the periodic retry (a minute) behind a lower priority.
    p = pipeline(tmp_path, [make_node("n").cpu("9").build()], shards=1)
    p.submit(make_job("first").cpu("1").priority(50).build())  # the shard's view is then current
    p.run_until_idle()
    p.submit_many(
        [make_job("low").cpu("8").priority(1).build(), make_job("high").cpu("8").priority(100).build()]
    )
    p.run_until_idle(wait_backoff=True)
    assert bound_node(p, "high/0") == "n" and bound_node(p, "first/0") == "n"
    assert p.dispatcher.task_states("low") == [TaskState.PENDING]


def test_the_rest_of_a_job_beyond_its_minimum_preempts_without_waiting_for_the_periodic_retry(
    tmp_path: Path,
) -> None:
    # "hi" places its minimum (1) on the one free GPU without preemption, which is then never
    # tried for its other two tasks: that verdict must not park them until the periodic retry.
    nodes = [make_node(f"n{i}").cpu("16").mem("64Gi").gpus(2).build() for i in range(2)]
    p = pipeline(tmp_path, nodes, shards=1)
    p.submit(make_job("low").cpu("1").gpus(1).replicas(3).min_member(1).build())
    p.run_until_idle()
    p.submit(make_job("hi").cpu("1").gpus(1).replicas(3).min_member(1).priority(100).build())
    p.run_until_idle(wait_backoff=True)
    assert p.dispatcher.task_states("hi") == [TaskState.BOUND] * 3
    assert sorted(p.dispatcher.task_states("low")).count(TaskState.BOUND) == 1  # two evicted


def test_a_job_judged_beside_a_refused_gang_is_retried_without_a_cluster_change(tmp_path: Path) -> None:
    # Shard 1 plans gang "g" over both nodes, so "b" fits nowhere in its view. Shard 0 binds "c"
    # on n2 first, and the binder refuses the gang whole: n1 was free all along, yet nothing the
    # binder did made room, so no change wakes "b". Its verdict must not be trusted.
    n1, n2 = make_node("n1").cpu("2").mem("2Gi").build(), make_node("n2").cpu("3").mem("2Gi").build()
    # A node none of them tolerates: the cluster's room stays past what is in flight, so the
    # dispatcher's wait for claimed room does not hold "g" and "b" back from shard 1.
    spare = make_node("spare").cpu("8").mem("8Gi").taint("reserved").build()
    p = pipeline(tmp_path, [n1, n2, spare], shards=2, unschedulable_retry_s=3600.0)
    d, binder = p.dispatcher, p.binder
    p.submit_many([make_job(f"warm-{i}").mem("1Gi").build() for i in range(2)])
    p.run_until_idle()  # each shard has had a batch since the cluster last changed
    p.submit(make_job("c").cpu("3").build())
    (to_0,) = d.next_batches(shard_loads=[0, 1 << 40])
    p.submit_many([make_job("g").cpu("2").replicas(2).min_member(2).build(), make_job("b").cpu("2").build()])
    (to_1,) = d.next_batches(shard_loads=[1 << 40, 0])
    assert (to_0.shard_id, to_1.shard_id) == (0, 1)
    planned_0, planned_1 = p.shards[0].schedule(to_0), p.shards[1].schedule(to_1)
    assert [u.job_id for u in planned_1.unschedulable] == ["b"]
    for planned in (planned_0, planned_1):
        reply = binder.commit(planned)
        p.shards[planned.shard_id].apply_reply(reply)
        d.on_reply(reply)
        d.on_unschedulable(planned.unschedulable)
    assert [r.job_id for r in reply.rejected] == ["g"]
    p.run_until_idle(wait_backoff=True)
    assert bound_node(p, "c/0") == "n2" and bound_node(p, "b/0") == "n1"
    assert d.job_state("g") == JobState.PENDING


def test_spark_gang_waits_whole_then_binds_all(tmp_path: Path) -> None:
    # Room for the driver (2 CPU) and 3 executors (4 CPU each).
    p = pipeline(tmp_path, [make_node("a").cpu("8").build(), make_node("b").cpu("6").build()], shards=2)
    spark = (
        make_job("spark").role("driver").cpu("2").group("executor").cpu("4").replicas(4).min_member(5).build()
    )
    p.submit(spark)
    p.run_until_idle()
    assert p.dispatcher.job_state("spark") == JobState.PENDING
    assert all(s == TaskState.PENDING for s in p.dispatcher.task_states("spark"))
    assert int(p.binder.state.cpu_used.sum()) == 0  # nothing is held
    assert "gang" in p.dispatcher.explain("spark")
    p.add_nodes([make_node("c").cpu("4").build()])
    p.run_until_idle(wait_backoff=True)
    assert p.dispatcher.task_states("spark") == [TaskState.BOUND] * 5


def test_capacity_queues_borrow_then_reclaim_in_one_round(tmp_path: Path) -> None:
    nodes = [make_node(f"n{i}").cpu("10").mem("100Gi").build() for i in range(10)]  # 100 CPUs
    queues = [
        QueueConfig(name="a", guarantee=0.6, max_share=0.8),
        QueueConfig(name="b", guarantee=0.3, max_share=0.5),
        QueueConfig(name="c", guarantee=0.1, max_share=1.0),
    ]
    p = pipeline(tmp_path, nodes, shards=1, queues=queues)

    def cpus(queue: str) -> int:
        st = p.binder.state
        return (
            sum(r.cpu_milli for row in range(st.n) for r in st.residents[row].values() if r.queue == queue)
            // 1000
        )

    p.submit_many([make_job(f"a{i}").cpu("1").queue("a").build() for i in range(100)])
    p.run_until_idle()
    assert cpus("a") == 80  # borrowed up to its maximum, no further
    p.submit_many([make_job(f"b{i}").cpu("1").queue("b").build() for i in range(30)])
    p.submit_many([make_job(f"c{i}").cpu("1").queue("c").build() for i in range(10)])
    p.step()  # one scheduling round
    assert (cpus("a"), cpus("b"), cpus("c")) == (60, 30, 10)


def test_drf_equal_dominant_shares(tmp_path: Path) -> None:
    # 100 CPUs and 10 GPUs. A: 10 CPU per task (10% CPU); B: 1 CPU + 1 GPU (10% GPU).
    nodes = [make_node("n").cpu("100").mem("500Gi").gpus(10).build()]
    p = pipeline(tmp_path, nodes, shards=1, queues=[QueueConfig(name="default", policy=QueuePolicy.DRF)])
    jobs: list[Job] = []
    for i in range(20):
        jobs.append(make_job(f"A{i}").tenant("A").cpu("10").build())
        jobs.append(make_job(f"B{i}").tenant("B").cpu("1").gpus(1).build())
    p.submit_many(jobs)
    p.run_until_idle()
    st = p.binder.state
    used = {"A": np.zeros(2), "B": np.zeros(2)}
    for row in range(st.n):
        for r in st.residents[row].values():
            used[r.tenant] += [r.cpu_milli / 100_000, sum(m for _, m in r.gpus) / 10_000]
    share_a, share_b = used["A"].max(), used["B"].max()
    assert share_a >= 0.8 - 1e-9 and share_b >= 0.8 - 1e-9  # contention: both are served
    assert abs(share_a - share_b) <= 0.1 + 1e-9  # equal within one task's dominant share


def test_two_shards_race_for_the_last_gpu(tmp_path: Path) -> None:
    # Each node has one GPU. Without partition-first both shards see the same cluster and, on a
    # tie, the same first node: both propose its last free GPU in the same round.
    nodes = [make_node("a").gpus(1).build(), make_node("b").gpus(1).build()]
    p = pipeline(tmp_path, nodes, shards=2, profile=ProfileConfig(locating=[]))
    p.submit_many([make_job("x").cpu("1").gpus(1).build(), make_job("y").cpu("1").gpus(1).build()])
    p.step()
    assert p.stats.rejected_units == 1  # exactly one of the two proposals was refused
    winners = [t for t in ("x/0", "y/0") if bound_node(p, t) is not None]
    assert len(winners) == 1
    p.run_until_idle()
    loser = "y/0" if winners == ["x/0"] else "x/0"
    assert {bound_node(p, winners[0]), bound_node(p, loser)} == {"a", "b"}


def test_two_gpus_on_the_nvlinked_numa_pair(tmp_path: Path) -> None:
    # Free GPUs: {0,1} on NUMA 0 joined by NVLink, {4,5} on NUMA 1 without.
    node = (
        make_node("n")
        .gpu(0, numa=0, nvlink=(1,))
        .gpu(1, numa=0, nvlink=(0,))
        .gpu(4, numa=1)
        .gpu(5, numa=1)
        .build()
    )
    p = pipeline(tmp_path, [node], shards=1)
    p.submit(make_job("two").cpu("1").gpus(2).build())
    p.run_until_idle()
    assert sorted(g for g, _ in p.binder.state.residents[0]["two/0"].gpus) == [0, 1]


def test_restart_keeps_every_job_and_schedules_the_pending(tmp_path: Path) -> None:
    nodes = [make_node("n").cpu("4").build()]
    p = pipeline(tmp_path, nodes, shards=1)
    p.submit_many([make_job(f"j{i}").cpu("1").build() for i in range(6)])
    p.run_until_idle()
    before_used = p.binder.state.cpu_used.copy()
    p.close()
    q = pipeline(tmp_path, [], shards=2)
    assert np.array_equal(q.binder.state.cpu_used[: q.binder.state.n], before_used[: q.binder.state.n])
    states = [q.dispatcher.task_states(f"j{i}")[0] for i in range(6)]
    assert states.count(TaskState.BOUND) == 4 and states.count(TaskState.PENDING) == 2
    q.complete(["j0/0", "j1/0"])
    q.run_until_idle(wait_backoff=True)
    assert all(q.dispatcher.task_states(f"j{i}")[0] != TaskState.PENDING for i in range(6))


@pytest.mark.parametrize("shards", [1, 2, 4])
@pytest.mark.parametrize(
    ("policy", "weights", "gpu_nodes", "want"),
    [
        (QueuePolicy.DRF, {}, 1, {"alice": 4, "bob": 4}),
        (QueuePolicy.DRF, {}, 4, {"alice": 16, "bob": 16}),
        (QueuePolicy.FAIR, {"alice": 3.0, "bob": 1.0}, 1, {"alice": 6, "bob": 2}),
    ],
)
def test_a_fairness_queue_splits_scarce_room_by_its_order_whatever_the_shards(
    tmp_path: Path, shards: int, policy: QueuePolicy, weights: dict[str, float], gpu_nodes: int, want: dict
) -> None:
    """Twice as many one-GPU jobs as GPUs, alternating tenants in the queue's order. Units past
    the free room used to go out anyway, alternating shards: one shard got one tenant's jobs, the
    other the other's, both planned the same GPUs, and the first to commit took them all."""
    nodes = [make_node(f"g{i}").cpu("64").mem("256Gi").gpus(8).build() for i in range(gpu_nodes)]
    queue = QueueConfig(name="q", policy=policy, tenant_weights=weights)
    p = pipeline(tmp_path, nodes, shards=shards, queues=[QueueConfig(name="default"), queue])
    per_tenant = 16 * gpu_nodes
    p.submit_many(
        [
            make_job(f"{t}{i}").cpu("1").gpus(1).queue("q").tenant(t).build()
            for t in ("alice", "bob")
            for i in range(per_tenant)
        ]
    )
    p.run_until_idle()
    running: dict[str, int] = {}
    for t in ("alice", "bob"):
        running[t] = sum(p.dispatcher.job_state(f"{t}{i}") is JobState.RUNNING for i in range(per_tenant))
    assert running == want


# (policy, jobs in submission order as (name, GPUs, priority, deadline)); in the queue's order
# they are x (1 GPU), a (3 GPUs), b (1 GPU), on one 4-GPU node: x and a run, b waits.
ORDERED_QUEUES = [
    (QueuePolicy.FIFO, [("x", 1, 0, None), ("a", 3, 0, None), ("b", 1, 0, None)]),
    (QueuePolicy.PRIORITY, [("b", 1, 1, None), ("x", 1, 30, None), ("a", 3, 20, None)]),
    (QueuePolicy.DEADLINE, [("b", 1, 0, 5e9), ("a", 3, 0, 4e9), ("x", 1, 0, 3e9)]),
]


@pytest.mark.parametrize("shards", [1, 2, 4])
@pytest.mark.parametrize(("policy", "jobs"), ORDERED_QUEUES, ids=[c[0].value for c in ORDERED_QUEUES])
def test_an_ordered_queue_gives_scarce_room_in_its_order_whatever_the_shards(
    tmp_path: Path, shards: int, policy: QueuePolicy, jobs: list[tuple[str, int, int, float | None]]
) -> None:
    """With two shards x and b went to shard 0 and a to shard 1; shard 0 committed first, so b
    took the GPU that a, ahead of it, needed, and a waited for a job behind it to end."""
    p = pipeline(
        tmp_path,
        [make_node("g").cpu("16").mem("64Gi").gpus(4).build()],
        shards=shards,
        queues=[QueueConfig(name="default", policy=policy)],
        profile=ProfileConfig(locating=[]),
    )
    built = []
    for name, gpus, priority, deadline in jobs:
        job = make_job(name).cpu("1").gpus(gpus).priority(priority)
        built.append((job.deadline(deadline) if deadline is not None else job).build())
    p.submit_many(built)
    p.run_until_idle()
    running = {name for name, *_ in jobs if p.dispatcher.job_state(name) is JobState.RUNNING}
    assert running == {"x", "a"}
    assert p.dispatcher.job_state("b") is JobState.PENDING


def test_a_unit_that_must_preempt_is_not_held_back_by_units_in_flight(tmp_path: Path) -> None:
    """The wait for claimed room is for units that could fit in it: one that needs more than the
    cluster has unheld goes at once, beside the units in flight, to preempt."""
    p = pipeline(tmp_path, [make_node("g").cpu("16").mem("64Gi").gpus(4).build()], shards=2)
    p.submit(make_job("low").cpu("1").gpus(3).build())
    p.run_until_idle()
    p.submit_many(
        [make_job("small").cpu("1").gpus(1).build(), make_job("hi").cpu("1").gpus(4).priority(100).build()]
    )
    batches = p.dispatcher.next_batches([0, 0])
    assert sorted(u.job.id for b in batches for u in b.units) == ["hi", "small"]


def test_room_freed_goes_to_each_tenants_oldest_waiting_jobs(tmp_path: Path) -> None:
    """The first units after a release used to be planned on the shards' views from before it and
    found unschedulable; they backed off, and the tenants' newer jobs took the room."""
    queues = [QueueConfig(name="default"), QueueConfig(name="q", policy=QueuePolicy.DRF)]
    settings = Settings(store_path=str(tmp_path / "gs.db"), shards=2, retry_backoff_s=0.01, queues=queues)
    p = Pipeline(settings, nodes=[make_node("g").cpu("64").mem("256Gi").gpus(8).build()])
    p.submit(make_job("blk").cpu("1").gpus(8).build())
    p.run_until_idle()
    ids = [f"{t}{i}" for t in ("alice", "bob") for i in range(8)]
    p.submit_many([make_job(j).cpu("1").gpus(1).queue("q").tenant(j[:-1]).build() for j in ids])
    p.run_until_idle()  # nothing fits: all wait
    p.complete(["blk/0"])
    for _ in range(20):  # each backoff a few times 10 ms at most
        time.sleep(0.02)
        p.run_until_idle()
    running = [j for j in ids if p.dispatcher.job_state(j) is JobState.RUNNING]
    assert running == ["alice0", "alice1", "alice2", "alice3", "bob0", "bob1", "bob2", "bob3"]


def test_a_fairness_queue_below_its_guarantee_reclaims_without_waiting(tmp_path: Path) -> None:
    """The free-room wait of DRF and fair-share queues does not hold back units that reclaim: the
    first round takes room back (it took none while it held them), and the guarantee is whole
    once the queue is idle."""
    nodes = [make_node(f"n{i}").cpu("10").mem("100Gi").build() for i in range(10)]  # 100 CPUs
    queues = [
        QueueConfig(name="a", guarantee=0.5, max_share=1.0),
        QueueConfig(name="b", policy=QueuePolicy.DRF, guarantee=0.5, max_share=1.0),
    ]
    p = pipeline(tmp_path, nodes, shards=2, queues=queues)
    p.submit_many([make_job(f"a{i}").cpu("1").queue("a").build() for i in range(100)])
    p.run_until_idle()
    p.submit_many([make_job(f"b{i}").cpu("1").queue("b").tenant(f"t{i % 2}").build() for i in range(50)])

    def running(q: str, n: int) -> int:
        return sum(p.dispatcher.job_state(f"{q}{i}") is JobState.RUNNING for i in range(n))

    p.step()  # one scheduling round
    assert running("b", 50) >= 25
    p.run_until_idle()
    assert (running("a", 100), running("b", 50)) == (50, 50)


# (case, queues, the low-priority jobs on the 4-core node as (tasks, cores each, min_member, queue,
# disruption budget), what explain says about preemption for a 4-core job of priority 100, or
# None: it preempts and binds).
PROTECTED = [
    ("budget 0", [], [(1, "4", 1, "default", 0)], "job low0's disruption budget (0) on 1 node"),
    ("two tasks, budget 1", [], [(2, "2", 1, "default", 1)], "job low0's disruption budget (1) on 1 node"),
    ("gang of 2, budget 1", [], [(2, "2", 2, "default", 1)], "job low0's disruption budget (1) on 1 node"),
    ("one of two jobs, budget 1", [], [(1, "2", 1, "default", 1), (1, "2", 1, "default", None)], None),
    (
        "guarantee",
        [QueueConfig(name="gq", guarantee=0.5)],
        [(1, "4", 1, "gq", None)],
        "queue gq's guarantee on 1 node",
    ),
    ("unprotected", [], [(1, "4", 1, "default", None)], None),
]


@pytest.mark.parametrize("case, queues, lows, said", PROTECTED, ids=[c[0] for c in PROTECTED])
def test_explain_names_the_rule_that_kept_lower_priority_tasks_from_being_preempted(
    tmp_path: Path,
    case: str,
    queues: list[QueueConfig],
    lows: list[tuple[int, str, int, str, int | None]],
    said: str | None,
) -> None:
    p = pipeline(
        tmp_path, [make_node("n").cpu("4").build()], shards=1, queues=[QueueConfig(name="default"), *queues]
    )
    for i, (replicas, cpu, min_member, queue, budget) in enumerate(lows):
        b = make_job(f"low{i}").cpu(cpu).replicas(replicas).min_member(min_member).queue(queue)
        p.submit((b if budget is None else b.disruption_budget(budget)).build())
    p.run_until_idle()
    p.submit(make_job("high").cpu("4").priority(100).build())
    p.run_until_idle()
    explained = p.dispatcher.explain("high")
    if said is None:
        assert bound_node(p, "high/0") == "n", explained
        assert "no preemption" not in explained
    else:
        assert bound_node(p, "high/0") is None
        assert f"no preemption: evicting lower-priority tasks would break {said}" in explained
