"""Queues and preemption through the in-process pipeline: guarantees hold against other queues'
preemption, reclaim stops at the guarantee, max_share dispatches what fits, and victims are
priced with the gangs they break."""

import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from gosched.common.config import QueueConfig, Settings
from gosched.common.job import Job
from gosched.common.messages import BindReply, QueueFloor, Unit
from gosched.common.node import Node
from gosched.common.states import TaskState
from gosched.dispatcher.capacity import CapacityPlanner, floor_of
from gosched.runtime.pipeline import Pipeline
from gosched.scheduler_shard.plugins.preemption import quota_of
from tests.builders import make_job, make_node

Q = QueueConfig


def pipeline(tmp_path: Path, nodes: list[Node], **settings: object) -> tuple[Pipeline, Counter[str]]:
    """A one-shard pipeline, and a count of evictions per task id."""
    s = Settings(store_path=str(tmp_path / "gs.db"), retry_backoff_s=0.0, shards=1, **settings)  # type: ignore[arg-type]
    p = Pipeline(s, nodes=nodes)
    evicted: Counter[str] = Counter()
    on_reply = p.dispatcher.on_reply

    def counting(reply: BindReply) -> list[str]:
        evicted.update(f"{e.job_id}/{e.task_index}" for e in reply.evicted)
        return on_reply(reply)

    p.dispatcher.on_reply = counting  # type: ignore[method-assign]
    return p, evicted


def cpus(n: int) -> list[Node]:
    return [make_node(f"n{i}").cpu("1").mem("1Gi").build() for i in range(n)]


def held(p: Pipeline, prefix: str) -> int:
    return sum(1 for t in p.binder.state.task_row if t.startswith(prefix))


def jobs(prefix: str, n: int, queue: str, priority: int = 0) -> list[Job]:
    return [make_job(f"{prefix}{i}").cpu("1").queue(queue).priority(priority).build() for i in range(n)]


# -- 1 and 2: guarantees against cross-queue preemption, reclaim only up to the guarantee ---------
# (name, nodes, queues, waves of jobs bound first, jobs submitted then, tasks held per job-id prefix
# after, evictions in all)
GUARANTEE_CASES: list[tuple[str, int, list[QueueConfig], list[list[Job]], list[Job], dict[str, int], int]] = [
    (
        # b reclaims its half; a's evicted tasks (priority 100, a at its guarantee) may not take
        # it back by priority: b is within its guarantee.
        "priority preemption stops at the other queue's guarantee",
        4,
        [Q(name="a", guarantee=0.5), Q(name="b", guarantee=0.5)],
        [jobs("a", 4, "a", 100)],
        jobs("b", 2, "b", 0),
        {"a": 2, "b": 2},
        2,
    ),
    (
        # b's gang would take b to 60%, past its 30% guarantee: no reclaim (else a falls to 40%,
        # below its own guarantee, reclaims, breaks the gang, and so on).
        "a unit past its guarantee does not reclaim",
        10,
        [Q(name="a", guarantee=0.5), Q(name="b", guarantee=0.3)],
        [jobs("a", 10, "a")],
        [make_job("bg").cpu("1").replicas(6).min_member(6).queue("b").build()],
        {"a": 10, "bg": 0},
        0,
    ),
    (
        # a borrows 1 above its guarantee, c 3: b's reclaim takes one from a and two from c,
        # though a's tasks are the younger (the ones victim sorting would pick first).
        "reclaim takes only what each queue borrows",
        10,
        [Q(name="a", guarantee=0.5), Q(name="b", guarantee=0.3), Q(name="c", guarantee=0.1)],
        [jobs("c", 4, "c"), jobs("a", 6, "a")],
        jobs("b", 3, "b"),
        {"a": 5, "b": 3, "c": 2},
        3,  # not 5: a below its guarantee would reclaim from c in turn
    ),
    (
        # An elastic job (min_member 1) wider than what is left of b's guarantee: the part within
        # the guarantee reclaims (5 tasks), the rest waits as a borrower. Whole, it reclaimed nothing.
        "a wide elastic job reclaims up to its guarantee",
        10,
        [Q(name="a", guarantee=0.5), Q(name="b", guarantee=0.5)],
        [jobs("a", 10, "a")],
        [make_job("wide").cpu("1").replicas(8).min_member(1).queue("b").build()],
        {"a": 5, "wide": 5},
        5,
    ),
]


@pytest.mark.parametrize(
    "name, n_nodes, queues, first, then, want, n_evicted",
    GUARANTEE_CASES,
    ids=[c[0] for c in GUARANTEE_CASES],
)
def test_guarantees_hold_and_nothing_is_evicted_twice(
    tmp_path: Path,
    name: str,
    n_nodes: int,
    queues: list[QueueConfig],
    first: list[list[Job]],
    then: list[Job],
    want: dict[str, int],
    n_evicted: int,
) -> None:
    p, evicted = pipeline(tmp_path, cpus(n_nodes), queues=queues)
    for wave in first:
        p.submit_many(wave)
        p.run_until_idle()
        time.sleep(0.01)  # later waves start later
    p.submit_many(then)
    for _ in range(12):  # the old loop never went idle: bound the rounds, then check it settled
        if not p.step():
            break
    assert not p.step()
    assert {k: held(p, k) for k in want} == want
    assert all(n == 1 for n in evicted.values()), evicted
    assert sum(evicted.values()) == n_evicted


def gpu_use(p: Pipeline, queue: str) -> int:
    a = p.binder.state
    return sum(
        sum(m for _, m in r.gpus) for rs in a.residents[: a.n] for r in rs.values() if r.queue == queue
    )


def test_two_shards_planning_on_stale_views_do_not_take_a_queue_below_its_floor(tmp_path: Path) -> None:
    # Queue a borrows one GPU over its floor of two (half of 4). b's higher-priority job wants
    # three GPUs: each shard, blind to the other's evictions, would take a's tasks down to what its
    # own view says is the floor; together they took a to one GPU before the binder checked floors.
    s = Settings(
        store_path=str(tmp_path / "gs.db"),
        retry_backoff_s=0.0,
        shards=2,
        queues=[Q(name="a", guarantee=0.5), Q(name="b")],
    )
    nodes = [make_node(f"n{i}").cpu("16").mem("64Gi").gpus(2).build() for i in range(2)]
    p = Pipeline(s, nodes=nodes)
    p.submit(make_job("sa").cpu("1").gpu_share(500).replicas(6).min_member(1).queue("a").build())
    p.run_until_idle()
    assert gpu_use(p, "a") == 3000
    p.submit(make_job("wb").cpu("1").gpus(1).replicas(3).min_member(1).priority(100).queue("b").build())
    for _ in range(40):  # after every round, not only once settled: a dip is reclaimed later
        progressed = p.step()
        assert gpu_use(p, "a") >= 2000
        if not progressed:
            break
    assert gpu_use(p, "b") == 2000  # all that a's floor leaves


def test_a_queue_does_not_swap_itself_below_its_guarantee_and_reclaim_for_ever(tmp_path: Path) -> None:
    # b14 (CPU only, priority 55) could evict b5's 0.75-GPU task of its own queue, leaving queue b
    # below its guarantee in every resource; b5 (priority 10) then reclaimed from c, whose
    # priority-105 task preempted b14 back: one eviction a round, for ever.
    nodes = [
        make_node("n0").cpu("8").mem("16Gi").build(),
        make_node("n1").cpu("4").mem("32Gi").gpus(1).build(),
        make_node("n2").cpu("16").mem("32Gi").gpus(4).build(),
    ]
    p, evicted = pipeline(
        tmp_path, nodes, queues=[Q(name="a", guarantee=0.5), Q(name="b", guarantee=0.3), Q(name="c")]
    )
    job = make_job
    p.submit_many(
        [
            job("a2").queue("a").priority(50).cpu("3").mem("4Gi").gpus(1).replicas(2).min_member(2).build(),
            job("b5")
            .queue("b")
            .priority(10)
            .cpu("3")
            .mem("1Gi")
            .gpu_share(750)
            .replicas(3)
            .min_member(1)
            .build(),
            job("a10").queue("a").priority(5).cpu("2").mem("4Gi").replicas(6).min_member(6).build(),
            job("b14").queue("b").priority(55).cpu("2").mem("4Gi").build(),
            job("c15").queue("c").priority(105).cpu("3").mem("1Gi").gpu_share(750).build(),
        ]
    )
    for _ in range(30):
        if not p.step():
            break
    assert not p.step()
    assert all(n == 1 for n in evicted.values()), evicted


@pytest.mark.parametrize("replicas, min_member", [(1, 1), (2, 2), (2, 1)])
def test_a_queue_at_its_floor_still_swaps_its_own_tasks_by_priority(
    tmp_path: Path, replicas: int, min_member: int
) -> None:
    # Queue a holds exactly its floor (4 cpus) with low-priority tasks; a's higher-priority job
    # swaps them and keeps a at its floor. Its second task once saw its first one's victim taken
    # but not its first one placed, judged a below its floor, and was never placed.
    nodes = [make_node(f"n{i}").cpu("2").mem("4Gi").build() for i in range(4)]
    p, evicted = pipeline(tmp_path, nodes, queues=[Q(name="a", guarantee=0.5), Q(name="b")])
    p.submit_many(
        [make_job(f"alow{i}").queue("a").cpu("2").mem("1Gi").build() for i in range(2)]
        + [
            make_job(f"b{i}").queue("b").priority(1000).cpu("2").mem("1Gi").preemptible(False).build()
            for i in range(2)
        ]
    )
    p.run_until_idle()
    high = (
        make_job("ahigh")
        .queue("a")
        .priority(100)
        .cpu("2")
        .mem("1Gi")
        .replicas(replicas)
        .min_member(min_member)
    )
    p.submit(high.build())
    for _ in range(20):
        if not p.step():
            break
    assert held(p, "ahigh") == replicas
    assert sum(evicted.values()) == replicas and held(p, "alow") == 2 - replicas


def test_reclaim_rule_and_floors_in_the_units() -> None:
    plan = CapacityPlanner([Q(name="a", guarantee=0.5), Q(name="b", guarantee=0.3), Q(name="c")])
    assert plan.may_reclaim(1, 0.0, 0.3)  # within the guarantee with the unit
    assert not plan.may_reclaim(1, 0.0, 0.6)  # would borrow: free room and priority only
    assert not plan.may_reclaim(1, 0.3, 0.3)  # not below it
    floors = plan.floors((4000, 0, 8000))
    a_floor, b_floor = QueueFloor("a", 2000, None, 4000), QueueFloor("b", 1200, None, 2400)
    assert floors == [(a_floor, b_floor)] * 3  # each unit: every guaranteed queue's floor, its own too
    assert floor_of("q", 0.3, (10_000, 0, 0)) == QueueFloor("q", 3000, None, None)
    assert plan.floors((0, 0, 0)) == [(), (), ()]  # no capacity known yet: no floors


def test_quota_reads_reclaim_and_floors() -> None:
    job = make_job("j").build()
    unit = Unit(job, (0,), 1, reclaim_from=frozenset({"a"}), floors=(QueueFloor("b", 1200, None, 2400),))
    q = quota_of(unit)
    assert q.reclaim == frozenset({"a"})
    assert q.floors == {"b": (1200, None, 2400)}


# -- 3: max_share dispatches what fits; a job that can never fit does not block its queue ---------
CAP_CASES: list[tuple[str, list[Job], dict[str, int], dict[str, str]]] = [
    (
        "independent replicas run up to the cap, the rest and the job behind wait",
        [
            make_job("arr").cpu("1").replicas(10).queue("q").build(),
            make_job("next").cpu("1").queue("q").build(),
        ],
        {"arr": 5, "next": 0},
        {"arr": "would take it to 60.0%, above its max_share 50%", "next": "held back by capacity"},
    ),
    (
        "a job bigger than the cap is skipped with a reason",
        [make_job("big").cpu("6").queue("q").build(), make_job("small").cpu("1").queue("q").build()],
        {"big": 0, "small": 1},
        {"big": "cannot run in queue q: its smallest unit (1 task(s)"},
    ),
    (
        "a gang whose min_member alone passes the cap is skipped",
        [
            make_job("g").cpu("1").replicas(8).min_member(6).queue("q").build(),
            make_job("s").cpu("1").replicas(2).queue("q").build(),
        ],
        {"g": 0, "s": 2},
        {"g": "needs 60.0% of the cluster, above the queue's max_share 50%"},
    ),
    (
        "a gang that fits dispatches min_member and more, up to the cap",
        [make_job("g").cpu("1").replicas(8).min_member(3).queue("q").build()],
        {"g": 5},
        {"g": "held back by capacity"},
    ),
]


@pytest.mark.parametrize("name, submitted, want, why", CAP_CASES, ids=[c[0] for c in CAP_CASES])
def test_max_share_dispatches_what_fits(
    tmp_path: Path, name: str, submitted: list[Job], want: dict[str, int], why: dict[str, str]
) -> None:
    nodes = [make_node("a").cpu("10").mem("100Gi").build()]
    p, _ = pipeline(tmp_path, nodes, queues=[Q(name="q", max_share=0.5), Q(name="other")])
    p.submit_many(submitted)
    p.run_until_idle(wait_backoff=True)
    assert {k: held(p, k + "/") for k in want} == want
    for job_id, text in why.items():
        assert text in p.dispatcher.explain(job_id)


def test_a_job_queued_behind_a_held_back_head_says_so(tmp_path: Path) -> None:
    nodes = [make_node("a").cpu("10").mem("100Gi").build()]
    p, _ = pipeline(tmp_path, nodes, queues=[Q(name="q", max_share=0.5)])
    p.submit(make_job("first").cpu("4").queue("q").build())
    p.run_until_idle()
    p.submit_many(
        [make_job("head").cpu("2").queue("q").build(), make_job("tiny").cpu("1").queue("q").build()]
    )
    p.run_until_idle(wait_backoff=True)
    assert held(p, "tiny/") == 0  # FIFO: head-of-line, head could fit once first ends
    assert "queued behind job head" in p.dispatcher.explain("tiny")
    p.complete(["first/0"])
    p.run_until_idle(wait_backoff=True)
    assert held(p, "head/") == 1 and held(p, "tiny/") == 1


# -- 4: victims are priced with the gangs they break -----------------------------------------------
def _singleton_and_gang(p: Pipeline) -> None:
    p.submit(make_job("S").cpu("1").priority(10).build())
    p.run_until_idle()
    time.sleep(0.01)  # G starts later: "evict young work" alone would pick a G task
    p.submit(make_job("G").cpu("1").replicas(4).min_member(4).priority(10).build())
    p.run_until_idle()


def _budgeted_gang(p: Pipeline) -> None:
    p.submit(make_job("G").cpu("1").replicas(4).min_member(4).priority(10).disruption_budget(1).build())
    p.run_until_idle()


def _budgeted_replicas(p: Pipeline) -> None:
    # Not a gang: the budget of 2 lets one unit take two of its tasks (unchanged meaning).
    p.submit(make_job("G").cpu("1").replicas(4).priority(10).disruption_budget(2).build())
    p.run_until_idle()


# (name, nodes, setup, preemptor's tasks, tasks of G left, S left)
GANG_CASES: list[tuple[str, int, Callable[[Pipeline], None], int, int, int]] = [
    ("evicting the singleton costs less than breaking the gang", 5, _singleton_and_gang, 1, 4, 0),
    ("a gang break counts against the disruption budget", 4, _budgeted_gang, 1, 4, 0),
    ("the budget still bounds independent replicas per unit", 4, _budgeted_replicas, 2, 2, 0),
]


@pytest.mark.parametrize(
    "name, n_nodes, setup, n_tasks, g_left, s_left", GANG_CASES, ids=[c[0] for c in GANG_CASES]
)
def test_victims_are_priced_with_their_gang(
    tmp_path: Path,
    name: str,
    n_nodes: int,
    setup: Callable[[Pipeline], None],
    n_tasks: int,
    g_left: int,
    s_left: int,
) -> None:
    p, _ = pipeline(tmp_path, cpus(n_nodes))
    setup(p)
    p.submit(make_job("P").cpu("1").replicas(n_tasks).min_member(n_tasks).priority(100).build())
    p.step()
    assert held(p, "G/") == g_left and held(p, "S/") == s_left


# -- property: no preemption loop ------------------------------------------------------------------
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_queues_and_priorities_settle_without_evicting_a_task_repeatedly(
    tmp_path: Path, seed: int
) -> None:
    rnd = random.Random(seed)
    queues = [
        Q(name="a", guarantee=0.4),
        Q(name="b", guarantee=0.3),
        Q(name="c", guarantee=0.2, max_share=0.6),
    ]
    p, evicted = pipeline(tmp_path, cpus(8), queues=queues)
    for wave in range(3):
        batch = []
        for i in range(rnd.randint(2, 5)):
            size = rnd.choice([1, 1, 2, 3])
            batch.append(
                make_job(f"w{wave}j{i}")
                .cpu("1")
                .replicas(size)
                .min_member(rnd.choice([1, size]))
                .queue(rnd.choice("abc"))
                .priority(rnd.choice([0, 50, 100]))
                .build()
            )
        p.submit_many(batch)
        for _ in range(20):
            if not p.step():
                break
    rounds = 0
    while p.step():
        rounds += 1
        assert rounds < 40, "scheduling does not settle"
    assert max(evicted.values(), default=0) <= 2, evicted
    states = [s for j in p.dispatcher.job_ids() for s in p.dispatcher.task_states(j)]
    assert TaskState.SCHEDULED not in states


@pytest.mark.parametrize("seed", range(3))
def test_the_view_census_kept_from_the_dirty_log_equals_a_full_count(seed: int) -> None:
    import random

    from gosched.common.cluster_state import ClusterArrays, Resident
    from gosched.scheduler_shard.preemption import view_census

    rng = random.Random(seed)
    state = ClusterArrays()
    for i in range(6):
        state.upsert_node(make_node(f"n{i}").cpu("64").mem("256Gi").gpus(2).build())
    job_list = [
        make_job(f"j{k}").cpu("1").queue(rng.choice(["a", "b"])).replicas(8).build() for k in range(5)
    ]
    for step in range(200):
        if state.task_row and rng.random() < 0.4:
            state.release(rng.choice(sorted(state.task_row)))
        elif rng.random() < 0.05:
            state.remove_node(rng.choice(sorted(state.row_of)))  # its residents go with it
            state.upsert_node(make_node(f"x{step}").cpu("64").mem("256Gi").build())
        else:
            job = rng.choice(job_list)
            free = [i for i in range(8) if f"{job.id}/{i}" not in state.task_row]
            if free:
                gpus = ((0, 250),) if rng.random() < 0.3 else ()
                state.place(
                    rng.choice(sorted(state.row_of.values())), Resident.for_task(job, free[0], gpus, 0.0)
                )
        if step % 7 == 0:  # several changes between looks, as between units
            view = view_census(state)
            jobs: dict[str, list[int]] = {}
            queues: dict[str, list[int]] = {}
            for row in range(state.n):
                for r in state.residents[row].values():
                    for table, key in ((jobs, r.job_id), (queues, r.queue)):
                        use = table.setdefault(key, [0, 0, 0, 0])
                        use[0] += 1
                        use[1] += r.cpu_milli
                        use[2] += r.memory
                        use[3] += sum(m for _, m in r.gpus)
            assert view.jobs == jobs and view.queues == queues, step
