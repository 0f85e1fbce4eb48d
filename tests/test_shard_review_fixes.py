"""Review fixes in the shard's victim search: when the set the usual reprieve finds breaks a rule (a
job's disruption budget, a queue's guarantee floor), the search runs again with the victims the
rules protect let back first, so another set that keeps the rule is found."""

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gosched.common.cluster_state import Resident
from gosched.common.config import Settings
from gosched.common.job import Job
from gosched.common.messages import BindReply, QueueFloor, Unit, UnitBatch
from gosched.runtime.pipeline import Pipeline
from gosched.scheduler_shard import preemption
from gosched.scheduler_shard.preemption import Pricer, victims_on_row
from gosched.scheduler_shard.unit_context import UnitContext
from tests.builders import make_job, make_node
from tests.shard_helpers import run_units, shard_with

# One node of 4 CPUs: A (priority 1, two tasks, disruption budget 1), B (priority 2), C (priority
# 50, not preemptible). P (priority 100) needs 2 CPUs. The usual reprieve keeps B and evicts both
# of A's tasks, which breaks A's budget; evicting one task of A and B keeps it.
A = make_job("A").cpu("1").replicas(2).priority(1).disruption_budget(1).build()
B = make_job("B").cpu("1").priority(2).build()
C = make_job("C").cpu("1").priority(50).preemptible(False).build()
P = make_job("P").cpu("2").priority(100).build()
Running = list[tuple[Job, int, str, tuple[tuple[int, int], ...]]]
RUNNING: Running = [(A, 0, "n", ()), (A, 1, "n", ()), (B, 0, "n", ()), (C, 0, "n", ())]


def _victims(jobs: list[Job], running: Running, floors: tuple[QueueFloor, ...] = ()) -> set[str] | None:
    shard = shard_with([make_node("n").cpu("4").build()], running)
    units = [Unit(j, tuple(range(j.total_replicas)), j.min_member, floors=floors) for j in jobs]
    out = shard.schedule(UnitBatch(0, units))
    if not out.proposals:
        return None
    return {v for p in out.proposals[0].placements for v in p.victims}


def _one_of_a_and_b(victims: set[str] | None) -> bool:
    return (
        victims is not None and len(victims) == 2 and "B/0" in victims and len(victims & {"A/0", "A/1"}) == 1
    )


def test_a_refused_set_is_searched_again_with_the_budget_protected_tasks_let_back_first() -> None:
    assert _one_of_a_and_b(_victims([P], RUNNING))
    # Needing 3 CPUs, A's two tasks and B go whatever the order: still refused, and said why.
    shard = shard_with([make_node("n").cpu("4").build()], RUNNING)
    out = run_units(shard, [make_job("P").cpu("3").priority(100).build()])
    assert out.proposals == []
    assert "job A's disruption budget (1)" in out.unschedulable[0].diagnosis.note


def test_a_refused_set_is_searched_again_with_the_floor_protected_tasks_let_back_first() -> None:
    # A in a guaranteed queue "g" (no budget) that may lose one CPU of its two; P of another queue.
    a = make_job("A").cpu("1").replicas(2).priority(1).queue("g").build()
    p = make_job("P").cpu("2").priority(100).queue("p").build()
    running: Running = [(a, 0, "n", ()), (a, 1, "n", ()), (B, 0, "n", ()), (C, 0, "n", ())]
    assert _one_of_a_and_b(_victims([p], running, floors=(QueueFloor("g", 1000, None, None),)))


def test_the_gpu_trial_search_finds_the_other_set_and_leaves_the_view_as_it_was() -> None:
    a = make_job("A").cpu("1").gpus(1).replicas(2).priority(1).disruption_budget(1).build()
    b = make_job("B").cpu("1").gpus(1).priority(2).build()
    c = make_job("C").cpu("1").gpus(1).priority(50).preemptible(False).build()
    p = make_job("P").cpu("1").gpus(2).priority(100).build()
    running = [(a, 0, "n", ((0, 1000),)), (a, 1, "n", ((1, 1000),)), (b, 0, "n", ((2, 1000),))]
    running.append((c, 0, "n", ((3, 1000),)))
    shard = shard_with([make_node("n").gpus(4).build()], running)
    state = shard.state
    row = state.task_row["A/0"]
    entry = shard.cache.entry(p.groups[0], state)
    pricer = Pricer(state, UnitContext(Unit(p, (0,), 1)), p.groups[0].resources)
    eligible = [r for r in state.residents[row].values() if r.preemptible]
    arrays = ("cpu_used", "mem_used", "gpu_free", "free_whole", "max_share", "gpu_used_total")
    before = {name: getattr(state, name).copy() for name in arrays}
    residents, task_row = dict(state.residents[row]), dict(state.task_row)
    candidate = victims_on_row(entry, state, row, eligible, pricer)
    assert candidate is not None
    assert _one_of_a_and_b({v.task_id for v in candidate.victims})
    for name in arrays:
        assert np.array_equal(getattr(state, name), before[name]), name
    assert state.residents[row] == residents and state.task_row == task_row


@pytest.mark.parametrize(
    ("preemptor", "searches"),
    [(P, 1), (make_job("Q").cpu("1").priority(100).build(), 0)],
    ids=["refused", "kept"],
)
def test_the_second_search_runs_only_when_the_first_set_is_refused(
    monkeypatch: pytest.MonkeyPatch, preemptor: Job, searches: int
) -> None:
    calls = Counter[str]()
    real = preemption._protected_first

    def counted(eligible: list[Resident], pricer: Pricer) -> preemption.ReprieveOrder:
        calls["searches"] += 1
        return real(eligible, pricer)

    monkeypatch.setattr(preemption, "_protected_first", counted)
    shard = shard_with([make_node("n").cpu("4").build()], RUNNING)
    out = run_units(shard, [preemptor])
    assert len(out.proposals) == 1  # Q needs one CPU: B alone goes, the usual set
    assert calls["searches"] == searches


def test_the_binder_binds_the_other_set_and_keeps_the_budget(tmp_path: Path) -> None:
    settings = Settings(store_path=str(tmp_path / "gs.db"), retry_backoff_s=0.0, shards=1)
    p = Pipeline(settings, nodes=[make_node("n").cpu("4").mem("4Gi").build()])
    evicted = Counter[str]()
    on_reply = p.dispatcher.on_reply

    def counting(reply: BindReply) -> list[str]:
        evicted.update(f"{e.job_id}/{e.task_index}" for e in reply.evicted)
        return on_reply(reply)

    p.dispatcher.on_reply = counting  # type: ignore[method-assign]
    for job in (A, B, C):
        p.submit(job)
    p.run_until_idle()
    assert set(p.binder.state.task_row) == {"A/0", "A/1", "B/0", "C/0"}
    p.submit(P)
    for _ in range(10):  # until P's unit is answered (B, requeued, may then preempt A's other task)
        if "P/0" in p.binder.state.task_row or not p.step():
            break
    bound = set(p.binder.state.task_row)
    assert "P/0" in bound and "C/0" in bound
    assert len(bound & {"A/0", "A/1"}) == 1  # P's eviction took one task of A, within its budget
    assert sum(n for task, n in evicted.items() if task.startswith("A/")) == 1
    assert evicted["B/0"] == 1
