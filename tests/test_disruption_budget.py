"""A job's disruption_budget counts its tasks down at once, as a Kubernetes PodDisruptionBudget
counts the unavailable pods: evicted or lost and not running since (bound again is not enough),
whichever preemption took them.
Through the in-process pipeline (the shard's pricing and the binder's disruption_budgets stage),
across a master restart (rebuilt from the store), and in a shard's resync."""

from pathlib import Path

import pytest

from gosched.common.config import Settings
from gosched.common.messages import ProposalBatch
from gosched.common.states import JobState, TaskState
from gosched.runtime.pipeline import Pipeline
from gosched.scheduler_shard.shard import SchedulerShard
from tests.builders import make_job, make_node
from tests.test_binder import H1, N4, N4B, SVC, at, commit, open_binder, prop
from tests.test_dispatcher_support import Clock

NODES = [make_node(f"n{i}").cpu("1").mem("4Gi").label(slot=f"n{i}").build() for i in range(4)]


def _pipeline(tmp_path: Path, clock: Clock) -> Pipeline:
    settings = Settings(store_path=str(tmp_path / "gs.db"), shards=1, retry_backoff_s=0.0)
    return Pipeline(settings, nodes=NODES, clock=clock)


def _service(p: Pipeline, budget: int) -> None:
    p.submit(make_job("svc").cpu("1").replicas(4).disruption_budget(budget).build())
    p.run_until_idle()
    assert len(p.binder.state.task_row) == 4


def _preemptors(p: Pipeline, n: int) -> None:
    for i in range(n):
        p.submit(make_job(f"h{i}").cpu("1").priority(100).build())
        p.run_until_idle()


def _started(tmp_path: Path, budget: int, preemptors: int) -> tuple[Pipeline, Clock]:
    """svc (4 tasks, `budget`) running on the four nodes, then `preemptors` arrivals that outrank it."""
    clock = Clock(1_000_000.0)
    p = _pipeline(tmp_path, clock)
    _service(p, budget)
    _preemptors(p, preemptors)
    return p, clock


def _node_of(p: Pipeline, task_id: str) -> str:
    node = p.binder.state.nodes[p.binder.state.task_row[task_id]]
    assert node is not None
    return node.name


def _running(p: Pipeline, prefix: str) -> int:
    return sum(1 for tid in p.binder.state.task_row if tid.startswith(prefix))


@pytest.mark.parametrize(("budget", "preemptors", "evicted"), [(0, 2, 0), (1, 3, 1), (2, 3, 2), (4, 3, 3)])
def test_preemptions_one_after_another_take_no_more_than_the_budget(
    budget: int, preemptors: int, evicted: int, tmp_path: Path
) -> None:
    """Each preemptor takes one task; the budget stops them when that many are down, not per
    preemption (each of which takes one, within any budget of 1 or more)."""
    p, _ = _started(tmp_path, budget, preemptors)
    assert _running(p, "svc/") == 4 - evicted
    assert _running(p, "h") == evicted
    assert p.binder.state.down_tasks.count("svc") == evicted
    p.close()


def test_the_budget_tells_why_a_preemptor_waits_and_holds_across_a_restart(tmp_path: Path) -> None:
    p, clock = _started(tmp_path, 1, 2)
    assert p.dispatcher.job_state("h1") is JobState.PENDING
    assert "job svc's disruption budget (1, 1 down already)" in p.dispatcher.explain("h1")
    p.close()
    again = _pipeline(tmp_path, clock)  # the count is rebuilt from the store
    assert again.binder.state.down_tasks.count("svc") == 1
    assert all(shard.state.down_tasks.count("svc") == 1 for shard in again.shards)
    again.run_until_idle()  # h1, queued again by the restart, is refused again
    assert _running(again, "svc/") == 3 and again.dispatcher.job_state("h1") is JobState.PENDING
    again.close()


def test_the_task_down_counts_until_it_runs_again_not_once_it_is_bound(tmp_path: Path) -> None:
    """As a PodDisruptionBudget counts a recreated pod unavailable until it is ready: svc's evicted
    task, bound again, is still down until its agent reports it started (an image pull may take
    minutes). Then the preemptor its budget held back goes ahead at once, not at a periodic
    retry."""
    p, clock = _started(tmp_path, 1, 1)
    (back,) = p.binder.state.down_tasks.of_job("svc")
    p.complete(["h0/0"])  # its node is free: the evicted task is bound again
    p.run_until_idle()
    assert _running(p, "svc/") == 4 and p.binder.state.down_tasks.count("svc") == 1
    # Not on its node: evicting the task down again would take no more of the budget.
    p.submit(make_job("later").cpu("1").priority(100).require("slot", "NotIn", _node_of(p, back)).build())
    p.run_until_idle()
    assert p.dispatcher.job_state("later") is JobState.PENDING
    assert "job svc's disruption budget (1, 1 down already)" in p.dispatcher.explain("later")
    p.close()
    p = _pipeline(tmp_path, clock)  # bound again and not started: down across a restart too
    assert list(p.binder.state.down_tasks.items()) == [("svc", back)]
    assert all(list(shard.state.down_tasks.items()) == [("svc", back)] for shard in p.shards)
    assert all(back in shard.state.task_row for shard in p.shards)  # the snapshot's note keeps it placed
    p.run_until_idle()
    assert p.dispatcher.job_state("later") is JobState.PENDING
    p.started([back])
    assert not p.binder.state.down_tasks and not p.shards[0].state.down_tasks
    p.run_until_idle()  # no clock advance: woken by the start, not by the periodic retry
    assert p.dispatcher.job_state("later") is JobState.RUNNING
    assert _running(p, "svc/") == 3 and p.binder.state.down_tasks.count("svc") == 1
    p.close()


def test_a_task_down_that_ends_before_it_runs_again_counts_no_more(tmp_path: Path) -> None:
    """svc's evicted task, bound again, fails before it starts (its image would not pull): it is
    not down any more, in the binder and the shards, and a restart finds it so."""
    p, clock = _started(tmp_path, 1, 1)
    (back,) = p.binder.state.down_tasks.of_job("svc")
    p.complete(["h0/0"])
    p.run_until_idle()
    p.complete([back], TaskState.FAILED, {back: "image pull failed"})
    assert not p.binder.state.down_tasks and not p.shards[0].state.down_tasks
    p.close()
    p = _pipeline(tmp_path, clock)
    assert not p.binder.state.down_tasks
    p.close()


def test_a_victim_down_already_takes_no_more_of_the_budget(tmp_path: Path) -> None:
    """Evicting svc's task that was bound again and has not started leaves svc's count as it was:
    with a budget of 1 and that task down, it may be evicted again, and no other task of svc."""
    p, _ = _started(tmp_path, 1, 1)
    (back,) = p.binder.state.down_tasks.of_job("svc")
    p.complete(["h0/0"])
    p.run_until_idle()
    p.submit(make_job("pinned").cpu("1").priority(100).selector(slot=_node_of(p, back)).build())
    p.run_until_idle()
    assert p.dispatcher.job_state("pinned") is JobState.RUNNING
    assert back not in p.binder.state.task_row and p.binder.state.down_tasks.count("svc") == 1
    assert _running(p, "svc/") == 3
    p.close()


def test_a_cancelled_jobs_tasks_down_count_no_more_in_the_binder_nor_the_shards(tmp_path: Path) -> None:
    p, _ = _started(tmp_path, 2, 2)
    assert p.binder.state.down_tasks.count("svc") == 2
    p.cancel("svc")
    p.sync_shards()
    assert not p.binder.state.down_tasks
    assert not p.shards[0].state.down_tasks
    p.close()


def test_a_shard_resynced_from_a_snapshot_counts_the_tasks_down(tmp_path: Path) -> None:
    p, clock = _started(tmp_path, 2, 2)
    fresh = SchedulerShard(0, p.settings.profile, clock=clock)
    fresh.sync(p.binder.snapshot(), p.binder.version, resync=True)
    assert list(fresh.state.down_tasks.items()) == list(p.binder.state.down_tasks.items())
    assert fresh.state.down_tasks.count("svc") == 2
    p.close()


def test_a_preemptor_refused_while_the_task_down_is_bound_again_goes_ahead_once_it_runs(
    tmp_path: Path,
) -> None:
    """Pipelined rounds, as the Ray shard runs them (a batch planned while the last is at the
    binder): h1 is refused by svc's budget while svc's task down is bound again, and stays refused
    once that binding is answered (the task has not started). Its start wakes h1 at once, not after
    the periodic retry of an unschedulable job (60 s)."""
    clock = Clock(1_000_000.0)
    nodes = [make_node(f"n{i}").cpu("1").mem("4Gi").build() for i in range(2)]
    nodes.append(make_node("n2").cpu("1").mem("4Gi").taint("svc-only").build())
    settings = Settings(store_path=str(tmp_path / "gs.db"), shards=1, retry_backoff_s=0.0, batch_size=1)
    p = Pipeline(settings, nodes=nodes, clock=clock)
    p.submit(make_job("svc").cpu("1").replicas(2).tolerate("svc-only").disruption_budget(1).build())
    p.submit(make_job("mid").cpu("1").priority(200).tolerate("svc-only").build())
    p.run_until_idle()
    for name in ("h0", "h1"):
        p.submit(make_job(name).cpu("1").priority(100).build())
        p.run_until_idle()
    assert p.dispatcher.job_state("h1") is JobState.PENDING  # svc has one task down already
    (back,) = p.binder.state.down_tasks.of_job("svc")
    shard = p.shards[0]
    held: list[ProposalBatch] = []

    def pipelined_round() -> None:
        batches = p.dispatcher.next_batches([len(shard.inflight)])
        planned = shard.schedule(batches[0]) if batches else None
        for batch in held:
            reply = p.binder.commit(batch)
            shard.apply_reply(reply)
            p.dispatcher.on_reply(reply)
            if batch.unschedulable:
                p.dispatcher.on_unschedulable(batch.unschedulable)
        held[:] = [planned] if planned is not None else []

    def rounds(seconds: float) -> None:
        start = clock.now
        while p.dispatcher.job_state("h1") is not JobState.RUNNING and clock.now - start < seconds:
            clock.advance(0.5)
            pipelined_round()

    released = p.binder.release(["mid/0"], "succeeded")  # its node frees: svc's task is bound again
    p.dispatcher.on_released(released, TaskState.SUCCEEDED)
    p.sync_shards()
    rounds(10.0)
    assert back in p.binder.state.task_row and p.dispatcher.job_state("h1") is JobState.PENDING
    p.started([back])
    start = clock.now
    rounds(90.0)
    assert p.dispatcher.job_state("h1") is JobState.RUNNING
    assert clock.now - start < 10.0
    p.close()


def test_a_task_down_whose_job_ended_while_its_binding_was_on_its_way_counts_no_more(tmp_path: Path) -> None:
    """svc is cancelled while its bindings are still on their way to the dispatcher (holding none),
    then one task is evicted: the release of the orphans ends it, in the binder and the shards."""
    b = open_binder(tmp_path / "gs.db")
    b.add_nodes([N4, N4B])
    commit(b, prop(SVC, at(0, "n1"), at(1, "n2")))
    b.cancel_job("svc", [])
    shard = SchedulerShard(0, Settings().profile)
    shard.sync(*b.changes_since(0))  # a snapshot
    commit(b, prop(H1, at(0, "n1", victims=("svc/0",))))
    assert list(b.state.down_tasks.items()) == [("svc", "svc/0")]
    shard.sync(*b.changes_since(shard.version))
    assert list(shard.state.down_tasks.items()) == [("svc", "svc/0")]
    assert b.release(["svc/0", "svc/1"], "cancelled") == ["svc/1"]
    assert not b.state.down_tasks
    shard.sync(*b.changes_since(shard.version))
    assert not shard.state.down_tasks


@pytest.mark.parametrize(("budget", "evicted"), [(1, 1), (2, 2)])
def test_preemptors_in_one_batch_count_the_evictions_of_the_plans_before_them(
    budget: int, evicted: int, tmp_path: Path
) -> None:
    """Three preemptors in one batch, each wanting one of svc's tasks: the shard counts the
    evictions its earlier plans of the batch (still at the binder) make, so it proposes no more
    than the budget allows, and the binder refuses none. The others wait, named by the budget."""
    clock = Clock(1_000_000.0)
    p = _pipeline(tmp_path, clock)
    _service(p, budget)
    for i in range(3):
        p.submit(make_job(f"h{i}").cpu("1").priority(100).build())
    p.run_until_idle()
    assert p.stats.rejected_units == 0
    assert _running(p, "svc/") == 4 - evicted and _running(p, "h") == evicted
    waiting = [f"h{i}" for i in range(3) if p.dispatcher.job_state(f"h{i}") is JobState.PENDING]
    assert len(waiting) == 3 - evicted
    why = p.dispatcher.explain(waiting[0])
    assert f"job svc's disruption budget ({budget}, {evicted} down already)" in why
    p.close()


def test_a_refusal_counted_with_a_plan_in_flight_is_settling_and_says_so(tmp_path: Path) -> None:
    """The budget's refusal of h1 counts h0's eviction, which the binder may still refuse: the
    verdict is settling (h1 is tried once h0's plan is answered), and explain says why."""
    p = _pipeline(tmp_path, Clock(1_000_000.0))
    _service(p, 1)
    for name in ("h0", "h1"):
        p.submit(make_job(name).cpu("1").priority(100).build())
    batches = p.dispatcher.next_batches([0])
    out = p.shards[0].schedule(batches[0])
    assert [pr.job.id for pr in out.proposals] == ["h0"]
    (verdict,) = out.unschedulable
    assert verdict.job_id == "h1" and verdict.settling
    message = verdict.diagnosis.message()
    assert "job svc's disruption budget (1, 1 being evicted)" in message
    assert "count may change when this shard's plans at the binder are answered" in message
    assert "still being bound" not in message  # no victim was passed over for being in flight
    p.close()
