"""Messages a user-level review found misleading (the shard's diagnosis, the dispatcher's explain,
the service's status), each asserted at its source, in process."""

from gosched.common.job import task_id
from gosched.common.messages import GANG_APART_REASON, LEFT_NODE_REASON, Unit, UnitBatch
from gosched.common.node import Node
from gosched.common.states import TaskState
from tests.builders import make_job, make_node
from tests.shard_helpers import run_units, shard_with
from tests.test_dispatcher_capacity import cluster as capacity_cluster
from tests.test_dispatcher_support import CPU, GI, accept, dispatcher, units


def _gpu_node(name: str) -> Node:
    return make_node(name).cpu(8).mem("16Gi").gpus(1).build()


def _cpu_node(name: str) -> Node:
    return make_node(name).cpu(8).mem("16Gi").build()


def test_a_lone_task_whose_view_still_holds_it_names_that_node_not_a_gang() -> None:
    # After a preemption the shard's view may still hold the task on the node it was evicted
    # from: the attempt does not count on that room, and the diagnosis says so.
    job = make_job("a").cpu(1).gpus(1).build()
    nodes = [_cpu_node(f"n{i}") for i in range(4)] + [_gpu_node("g")]
    shard = shard_with(nodes, [(job, 0, "g", ((0, 1000),))])
    (verdict,) = run_units(shard, [job]).unschedulable
    message = verdict.diagnosis.message()
    assert verdict.diagnosis.ruled_out == {"too few GPUs": 4, LEFT_NODE_REASON: 1}
    assert "gang" not in message
    assert message == (
        "0/5 nodes fit: 4 too few GPUs, "
        "1 insufficient room counted on where it just ran (this shard's view is behind)"
    )


def test_tasks_that_stand_alone_are_diagnosed_where_they_were_tried_last() -> None:
    # min_member 1: a task that fails its shard's partition goes on to the other nodes, and the
    # job's other task takes the last one: every node is full, none "does not fit together".
    job = make_job("a").cpu(1).gpus(1).replicas(3).build()
    shard = shard_with([_gpu_node("g1"), _gpu_node("g2")])
    shard.set_partition(["g1"])
    batch = shard.schedule(UnitBatch(0, [Unit(job, (0, 1, 2), 1)]))
    (verdict,) = batch.unschedulable
    assert verdict.task_indexes == (2,)
    assert verdict.diagnosis.message() == "0/2 nodes fit: 2 insufficient GPU"


def test_a_gang_keeps_its_wording() -> None:
    job = make_job("a").cpu(1).gpus(1).replicas(3).min_member(3).build()
    shard = shard_with([_gpu_node("g1"), _gpu_node("g2")])
    shard.set_partition(["g1"])
    (verdict,) = shard.schedule(UnitBatch(0, [Unit(job, (0, 1, 2), 3)])).unschedulable
    assert verdict.diagnosis.ruled_out.get(GANG_APART_REASON) == 1


def test_a_job_set_aside_by_its_queues_capacity_is_not_said_to_be_queued() -> None:
    d, _ = capacity_cluster()
    d.submit_many([make_job("b0").queue("b").cpu("60").mem("1Gi").build()])  # above b's 50% cap
    before = d.explain("b0").splitlines()
    assert before[1] == "not sent to a shard: it cannot run in its queue (below), so its turn sets it aside"
    assert before[2].startswith("cannot run in queue b: its smallest unit")
    assert not units(d.next_batches())
    after = d.explain("b0").splitlines()
    assert after[1].startswith("set aside: it cannot run in its queue (below); looked at again in ")
    assert not any(line.startswith(("queued,", "backing off after")) for line in before + after)


def _retried_twice_then(final: TaskState) -> str:
    """explain of a finished one-task job whose task failed, ran again, failed, ran again and ended
    `final` (max_retries 2)."""
    d, clock = dispatcher(shards=1)
    d.set_cluster_capacity(100 * CPU, 100 * GI, 0)
    d.submit(make_job("j").cpu("1").max_retries(2).build())
    tid = task_id("j", 0)
    for _ in range(2):
        d.notify_cluster_changed()
        d.on_reply(accept(units(d.next_batches())))
        assert d.begin_retries([tid]) == [tid]
        d.on_retried([tid], [tid], {tid: "exit code 1"})
        assert "run again (retry" in d.explain("j")  # to come, while the job waits for it
        clock.advance(3600)
    d.notify_cluster_changed()
    d.on_reply(accept(units(d.next_batches())))
    d.on_released([tid], final, {tid: "exit code 1"} if final is TaskState.FAILED else None)
    return d.explain("j")


def test_a_finished_jobs_history_tells_its_retries_as_past() -> None:
    failed = _retried_twice_then(TaskState.FAILED)
    assert "(finished)" in failed.splitlines()[0]
    assert "task 0 failed: exit code 1; was run again (retry 1 of 2)\n" in failed
    assert "latest: task 0 failed: exit code 1; no retry left (of 2)" in failed
    assert "run again (retry" not in failed.replace("was run again (retry", "")
    succeeded = _retried_twice_then(TaskState.SUCCEEDED)
    assert "task 0 failed: exit code 1; was run again (retry 1 of 2)\n" in succeeded
    assert "latest: task 0 failed: exit code 1; was run again (retry 2 of 2)" in succeeded
    assert " after " not in succeeded


def test_the_bound_tasks_metric_says_it_counts_since_the_start() -> None:
    from typing import Any, cast

    from prometheus_client import generate_latest

    from gosched.api.metrics import SchedulerMetrics
    from gosched.api.service import StatusView

    class _Service:
        ready = True

        def status(self) -> StatusView:
            return StatusView(ready=True, bound_tasks=0)  # a master just restarted, its jobs running

        def pending_tasks(self) -> int:
            return 0

        def queues(self) -> list[Any]:
            return []

    text = generate_latest(SchedulerMetrics(cast(Any, _Service())).registry).decode()
    (help_line,) = [line for line in text.splitlines() if line.startswith("# HELP gosched_bound_tasks_total")]
    assert "since the master started" in help_line
    assert "gosched_bound_tasks_total 0.0" in text  # a counter from 0 at each start, as Prometheus reads one
