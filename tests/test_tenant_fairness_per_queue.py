"""Tenant fairness within a queue, not across all queues (as YARN's hierarchical fair/DRF).

A drf or fair queue ranks its tenants by their usage within that queue: held + in-flight of the
(queue, tenant) pair, over the cluster capacity, divided by the tenant's weight. A tenant's work in
another queue must not cost it its turn in this one (it used to: tenant a, busy in a FIFO 'prod'
queue, got none of the 'research' DRF queue's 50 slots and tenant b all of them).
"""

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gosched.common.config import QueueConfig, QueuePolicy, Settings
from gosched.common.job import Job
from gosched.dispatcher.queues import DrfQueue, FairShareQueue, TenantShareQueue, make_queue
from gosched.dispatcher.usage import Part, UsageTracker
from gosched.runtime.pipeline import Pipeline
from tests.builders import make_job, make_node
from tests.test_dispatcher_support import CPU, GI, Entry, entries

DRF, FAIR, FIFO = QueuePolicy.DRF, QueuePolicy.FAIR, QueuePolicy.FIFO


# -- helpers ------------------------------------------------------------------------------------------
def _entries(*tenants: str) -> list[Entry]:
    return entries(*(make_job(f"{t}{i}").tenant(t).build() for i, t in enumerate(tenants)))


# -- through the in-process pipeline ------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    name: str
    policy: QueuePolicy  # of 'research', the queue both tenants share
    other: QueuePolicy = FIFO  # of 'prod', where tenant a alone already holds 50 of the 100 cpus
    order: str = "interleaved"  # how the research jobs arrive: a b a b ..., all a's first, all b's first
    weights: dict[str, float] = field(default_factory=dict)  # research's tenant weights
    expected: tuple[range, range] = (range(25, 26), range(25, 26))  # research slots of a, of b


CASES = [
    Case("drf, a also busy in a fifo queue", DRF),
    Case("fair, a also busy in a fifo queue", FAIR),
    Case("drf, a's research jobs submitted first", DRF, order="a-first"),
    Case("drf, b's research jobs submitted first", DRF, order="b-first"),
    Case("fair, b's research jobs submitted first", FAIR, order="b-first"),
    Case("drf, a also busy in another drf queue", DRF, other=DRF),
    Case("fair, a also busy in another fair queue", FAIR, other=FAIR),
    # weights still apply within the queue: 50 slots at 1:3 -> 12.5 : 37.5
    Case("drf, b weighted 3", DRF, weights={"b": 3.0}, expected=(range(12, 14), range(37, 39))),
    Case("fair, b weighted 3", FAIR, weights={"b": 3.0}, expected=(range(12, 14), range(37, 39))),
]


def research_jobs(order: str) -> list[Job]:
    def job(t: str, i: int) -> Job:
        return make_job(f"r-{t}{i}").cpu("1").queue("research").tenant(t).build()

    if order == "interleaved":
        return [job(t, i) for i in range(50) for t in "ab"]
    first, second = ("a", "b") if order == "a-first" else ("b", "a")
    return [job(first, i) for i in range(50)] + [job(second, i) for i in range(50)]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_tenant_fair_queue_splits_its_slots_by_usage_within_it(tmp_path: Path, case: Case) -> None:
    nodes = [make_node(f"n{i}").cpu("10").mem("100Gi").build() for i in range(10)]  # 100 cpus
    queues = [
        QueueConfig(name="prod", policy=case.other, guarantee=0.5, max_share=0.5),
        QueueConfig(
            name="research", policy=case.policy, guarantee=0.5, max_share=0.5, tenant_weights=case.weights
        ),
    ]
    s = Settings(store_path=str(tmp_path / "gs.db"), retry_backoff_s=0.0, shards=1, queues=queues)
    p = Pipeline(s, nodes=nodes)
    try:
        p.submit_many([make_job(f"p{i}").cpu("1").queue("prod").tenant("a").build() for i in range(50)])
        p.run_until_idle()
        p.submit_many(research_jobs(case.order))
        p.run_until_idle()

        st_ = p.binder.state
        held = Counter((r.queue, r.tenant) for row in range(st_.n) for r in st_.residents[row].values())
        assert held[("prod", "a")] == 50
        a, b = held[("research", "a")], held[("research", "b")]
        assert a + b == 50  # research is full (max_share 0.5)
        assert a in case.expected[0] and b in case.expected[1], (a, b)

        # The tracker agrees with the binder, per pair, and the totals keep their meaning: a
        # tenant's over every queue (a: prod + research), a queue's over its tenants.
        u = p.dispatcher.usage
        assert u.usage("tenant", "a", queue="research").tolist() == [a * CPU, 0, 0]
        assert u.usage("tenant", "b", queue="research").tolist() == [b * CPU, 0, 0]
        assert u.usage("tenant", "a", queue="prod").tolist() == [50 * CPU, 0, 0]
        assert u.usage("tenant", "a").tolist() == [(50 + a) * CPU, 0, 0]
        assert u.usage("queue", "research").tolist() == [50 * CPU, 0, 0]
        assert u.tenant_share("a") == pytest.approx((50 + a) / 100)
        assert u.tenant_share("a", "research") == pytest.approx(a / 100)
    finally:
        p.close()


def test_a_fair_queue_ignores_usage_elsewhere_and_follows_its_own() -> None:
    usage = UsageTracker()
    usage.set_capacity(100 * CPU, 0, 0)
    q: DrfQueue[Entry] = make_queue(QueueConfig(name="research", policy=DRF), usage)
    assert isinstance(q, DrfQueue) and q.queue == "research"
    for e in _entries("a", "b", "a", "b"):
        q.push(e)
    usage.add_held("prod", "a", 90 * CPU, 0, 0)  # elsewhere: a stays first (older head, tie at 0)
    assert q.peek().job.tenant == "a"
    usage.add_inflight("research", "a", CPU, 0, 0)  # here: b is now the neediest
    assert q.peek().job.tenant == "b"
    usage.add_held("research", "b", 2 * CPU, 0, 0)
    assert q.peek().job.tenant == "a"


@pytest.mark.parametrize("cls", [DrfQueue, FairShareQueue])
def test_an_unnamed_tenant_queue_ranks_by_usage_over_every_queue(cls: type[TenantShareQueue[Entry]]) -> None:
    usage = UsageTracker()
    usage.set_capacity(100 * CPU, 100 * GI, 0)
    q = cls(usage)
    for e in _entries("a", "b"):
        q.push(e)
    usage.add_held("elsewhere", "a", 10 * CPU, 10 * GI, 0)
    assert q.peek().job.tenant == "b"


# -- the tracker's per-(queue, tenant) usage ----------------------------------------------------------
def test_pair_usage_is_kept_apart_from_the_totals() -> None:
    u = UsageTracker()
    u.set_capacity(100 * CPU, 100 * GI, 8000)
    u.add_inflight("prod", "a", 40 * CPU, 0, 0)
    u.add_inflight("research", "a", 10 * CPU, 20 * GI, 2000)
    u.commit("research", "a", 10 * CPU, 20 * GI, 2000)
    u.add_held("research", "b", 5 * CPU, 0, 0)
    assert u.usage("tenant", "a", "inflight", queue="prod").tolist() == [40 * CPU, 0, 0]
    assert u.usage("tenant", "a", "held", queue="prod").tolist() == [0, 0, 0]
    assert u.usage("tenant", "a", "held", queue="research").tolist() == [10 * CPU, 20 * GI, 2000]
    assert u.usage("tenant", "a", "inflight", queue="research").tolist() == [0, 0, 0]
    assert u.usage("tenant", "a").tolist() == [50 * CPU, 20 * GI, 2000]
    assert u.usage("tenant", "b", queue="prod").tolist() == [0, 0, 0]
    assert u.tenant_share("a") == pytest.approx(0.5)
    assert u.tenant_share("a", "research") == pytest.approx(0.25)  # gpu 2000 / 8000
    assert u.tenant_share("a", "nowhere") == 0.0
    assert u.tenant_mean_share("a", "research") == pytest.approx((0.1 + 0.2 + 0.25) / 3)
    assert u.tenant_mean_share("a", "prod") == pytest.approx(0.4 / 3)
    assert u.names("tenant", queue="research") == ["a", "b"]
    assert u.names("tenant", queue="prod") == ["a"]
    assert sorted(u.pairs()) == [("prod", "a"), ("research", "a"), ("research", "b")]
    assert u.shares("tenant", queue="research") == {"a": pytest.approx(0.25), "b": pytest.approx(0.05)}
    names, m = u.matrix("tenant", ["b", "z"], queue="research")
    assert names == ["b", "z"] and m.tolist() == [[5 * CPU, 0, 0], [0, 0, 0]]
    with pytest.raises(ValueError):
        u.usage("queue", "prod", queue="prod")
    with pytest.raises(ValueError):
        u.shares("queue", queue="prod")


def test_listeners_hear_their_own_queue_only() -> None:
    u = UsageTracker()
    u.add_held("q1", "x", CPU, 0, 0)  # q1 known before anyone listens
    heard: dict[str, list[str | None]] = {"q1": [], "q2": [], "all": [], "all-late": []}
    u.subscribe(heard["q1"].append, "q1")
    u.subscribe(heard["all"].append)
    u.subscribe(heard["q2"].append, "q2")
    u.add_inflight("q1", "a", CPU, 0, 0)
    u.add_inflight("q2", "b", CPU, 0, 0)
    u.subscribe(heard["all-late"].append)  # hears queues known already and those to come
    u.commit("q1", "a", CPU, 0, 0)  # moves usage: nobody hears
    u.add_held("q1", "a", -CPU, 0, 0)
    u.add_held("q3", "c", CPU, 0, 0)
    u.set_capacity(1, 1, 1)  # everybody, once
    assert heard == {
        "q1": ["a", "a", None],
        "q2": ["b", None],
        "all": ["a", "b", "a", "c", None],
        "all-late": ["a", "c", None],
    }
    assert u.has_listeners


# hypothesis: any sequence of updates keeps pairs, queue totals and tenant totals in step
QUEUES = ("q0", "q1", "q2")
TENANTS = ("t0", "t1", "t2", "t3")
amount = st.integers(-(10**12), 10**12)
op = st.tuples(
    st.sampled_from(["inflight", "held", "commit", "release", "listen", "listen-all"]),
    st.sampled_from(QUEUES),
    st.sampled_from(TENANTS),
    amount,
    amount,
    st.integers(-8000, 8000),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=60))
def test_pair_queue_and_tenant_usage_stay_in_step_whatever_the_updates(
    ops: list[tuple[str, str, str, int, int, int]],
) -> None:
    cap = (64 * CPU, 256 * GI, 8000)
    u = UsageTracker()
    u.set_capacity(*cap)
    model: dict[tuple[str, str], list[int]] = {}  # pair -> held (3) + in flight (3)
    listeners: list[tuple[str | None, list[str | None], list[str]]] = []  # (queue, heard, expected)
    for kind, q, t, cpu, mem, gpu in ops:
        v = (cpu, mem, gpu)
        row = model.setdefault((q, t), [0] * 6)
        if kind == "inflight":
            u.add_inflight(q, t, *v)
            row[3:] = [a + b for a, b in zip(row[3:], v, strict=True)]
        elif kind == "held":
            u.add_held(q, t, *v)
            row[:3] = [a + b for a, b in zip(row[:3], v, strict=True)]
        elif kind == "commit":
            u.commit(q, t, *v)
            row[:3] = [a + b for a, b in zip(row[:3], v, strict=True)]
            row[3:] = [a - b for a, b in zip(row[3:], v, strict=True)]
        elif kind == "release":  # as the dispatcher releases a finished task: held goes down
            u.add_held(q, t, -cpu, -mem, -gpu)
            row[:3] = [a - b for a, b in zip(row[:3], v, strict=True)]
        else:
            heard: list[str | None] = []
            where = None if kind == "listen-all" else q
            u.subscribe(heard.append, where)
            listeners.append((where, heard, []))
            continue
        if kind != "commit":
            for where, _, expected in listeners:
                if where is None or where == q:
                    expected.append(t)

    def total(rows: list[list[int]], part: str) -> list[int]:
        lo = {"held": 0, "inflight": 3}[part]
        return [sum(r[lo + i] for r in rows) for i in range(3)]

    parts: tuple[Part, ...] = ("held", "inflight")
    for part in parts:
        for (q, t), row in model.items():
            assert u.usage("tenant", t, part, queue=q).tolist() == total([row], part)
        for q in QUEUES:
            rows = [r for (q2, _), r in model.items() if q2 == q]
            assert u.usage("queue", q, part).tolist() == total(rows, part)
        for t in TENANTS:
            rows = [r for (_, t2), r in model.items() if t2 == t]
            assert u.usage("tenant", t, part).tolist() == total(rows, part)
    # the sums over pairs, read back through the tracker, equal its own totals
    for q in QUEUES:
        _, m = u.matrix("tenant", queue=q)
        assert m.sum(axis=0).tolist() == u.usage("queue", q).tolist()
    for t in TENANTS:
        by_queue = [u.usage("tenant", t, queue=q) for q in QUEUES]
        assert [sum(v.tolist()[i] for v in by_queue) for i in range(3)] == u.usage("tenant", t).tolist()
    # shares within a queue are the pair's, not the tenant's
    for (q, t), row in model.items():
        tot = [row[i] + row[i + 3] for i in range(3)]
        assert u.tenant_share(t, q) == pytest.approx(max(x / c for x, c in zip(tot, cap, strict=True)))
        assert u.tenant_mean_share(t, q) == pytest.approx(
            sum(x / c for x, c in zip(tot, cap, strict=True)) / 3
        )
    for _, heard, expected in listeners:
        assert heard == expected
