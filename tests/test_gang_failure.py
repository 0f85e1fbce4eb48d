"""A gang whose tasks failed for good (no retry left) so that the others can no longer make its
min_member has failed: its other tasks are stopped (cancelled, freed at the binder), as Kubeflow's
training jobs and JobSet's failure policy stop theirs, not left running alone. An elastic gang
that still can make its minimum runs on, and a job of min_member 1 is no gang. In process, on
real SQLite, across a restart."""

from pathlib import Path

import pytest

from gosched.common.config import QueueConfig, Settings
from gosched.common.job import Job
from gosched.common.node import Node
from gosched.common.states import JobState, TaskState
from gosched.common.store import Store
from gosched.dispatcher.dispatcher import Dispatcher
from gosched.runtime.pipeline import Pipeline
from tests.builders import JobBuilder, make_job, make_node

F, C, B, S = TaskState.FAILED, TaskState.CANCELLED, TaskState.BOUND, TaskState.SUCCEEDED


def _pipeline(tmp_path: Path) -> Pipeline:
    settings = Settings(
        store_path=str(tmp_path / "gs.db"), shards=1, failure_backoff_s=0.0, retry_backoff_s=0.0
    )
    nodes = [make_node(f"n{i}").cpu("2").mem("8Gi").build() for i in range(4)]
    return Pipeline(settings, nodes=nodes)


def _tasks(p: Pipeline, job: Job) -> list[TaskState]:
    return p.dispatcher.task_states(job.id)


@pytest.mark.parametrize(
    ("replicas", "min_member", "ends", "state", "tasks"),
    [
        # (task, how it ended) in turn; then the job's state and its tasks'
        (2, 2, [(1, F)], JobState.FAILED, [C, F]),  # a pair: its mate is stopped
        (3, 3, [(0, F)], JobState.FAILED, [F, C, C]),
        (4, 2, [(3, F)], JobState.RUNNING, [B, B, B, F]),  # elastic: 3 left, 2 needed
        (4, 2, [(3, F), (2, F)], JobState.RUNNING, [B, B, F, F]),
        (4, 2, [(3, F), (2, F), (1, F)], JobState.FAILED, [C, F, F, F]),
        (2, 2, [(0, S), (1, F)], JobState.FAILED, [S, F]),  # nothing left to stop
        (2, 1, [(1, F)], JobState.RUNNING, [B, F]),  # no gang: the other runs on
    ],
)
def test_a_gang_that_can_no_longer_make_its_minimum_fails_and_stops_its_other_tasks(
    replicas: int,
    min_member: int,
    ends: list[tuple[int, TaskState]],
    state: JobState,
    tasks: list[TaskState],
    tmp_path: Path,
) -> None:
    p = _pipeline(tmp_path)
    job = make_job("g").cpu("1").replicas(replicas).min_member(min_member).build()
    p.submit(job)
    p.run_until_idle()
    assert _tasks(p, job) == [B] * replicas
    for index, end in ends:
        p.complete([f"g/{index}"], end, {f"g/{index}": "exit code 1"} if end is F else None)
    assert p.dispatcher.job_state("g") is state
    assert _tasks(p, job) == tasks
    # The binder holds exactly the tasks still bound: the stopped ones are freed on their nodes.
    held = sorted(tid for tid in p.binder.state.task_row if tid.startswith("g/"))
    assert held == [f"g/{i}" for i, s in enumerate(tasks) if s is B]
    if state is JobState.FAILED and C in tasks:
        assert "the gang cannot reach its min_member" in p.dispatcher.explain("g")
    p.close()


def test_a_stopped_gang_is_still_failed_after_a_restart_and_its_room_is_taken_by_others(
    tmp_path: Path,
) -> None:
    p = _pipeline(tmp_path)
    p.submit(make_job("g").cpu("2").replicas(4).min_member(4).build())  # the whole cluster
    p.submit(make_job("next").cpu("2").build())
    p.run_until_idle()
    assert p.dispatcher.job_state("next") is JobState.PENDING
    p.complete(["g/2"], F, {"g/2": "exit code 1"})
    p.run_until_idle()
    assert p.dispatcher.job_state("g") is JobState.FAILED
    assert p.dispatcher.job_state("next") is JobState.RUNNING  # the stopped tasks' room is free
    p.close()
    again = _pipeline(tmp_path)
    assert again.dispatcher.job_state("g") is JobState.FAILED  # not "cancelled": restore agrees
    again.close()


def test_tasks_failing_in_one_report_all_end_failed_and_only_the_rest_are_stopped(tmp_path: Path) -> None:
    """Two of a 3-gang's tasks fail in the same report: both end failed (in the store too: the
    binder wrote them so), and only the third is stopped. The invariants test found the first
    cut cancelling the second failed task as a mate of the first."""
    p = _pipeline(tmp_path)
    job = make_job("g").cpu("1").replicas(3).min_member(3).build()
    p.submit(job)
    p.run_until_idle()
    p.complete(["g/0", "g/1"], F, {"g/0": "exit code 1", "g/1": "exit code 2"})
    assert _tasks(p, job) == [F, F, C]
    assert [p.store.task_state(f"g/{i}") for i in range(3)] == [F, F, C]
    p.close()


def _gang_with_task_1_retried(tmp_path: Path, gang: JobBuilder) -> tuple[Pipeline, Job]:
    """The gang (max_retries 1) running, after g/1 failed once and ran again: its retry is used."""
    p = _pipeline(tmp_path)
    job = gang.max_retries(1).build()
    p.submit(job)
    p.run_until_idle()
    p.complete(["g/1"], F, {"g/1": "exit code 1"})
    p.run_until_idle()
    return p, job


def test_a_final_failure_reported_with_a_mates_retriable_one_fails_the_gang(tmp_path: Path) -> None:
    """g/1 has used its retry; g/0 and g/1 then fail in one report. g/1's failure is final, so the
    gang has failed: g/0 is not run again, and g/1 is not taken off as g/0's gang mate (which
    lost its failure and ran it a third time, past max_retries)."""
    p, job = _gang_with_task_1_retried(tmp_path, make_job("g").cpu("1").replicas(2).min_member(2))
    assert _tasks(p, job) == [B, B]
    p.complete(["g/0", "g/1"], F, {"g/0": "exit code 2", "g/1": "exit code 3"})
    p.run_until_idle()
    assert p.dispatcher.job_state("g") is JobState.FAILED
    assert _tasks(p, job) == [F, F]
    assert not [tid for tid in p.binder.state.task_row if tid.startswith("g/")]
    assert "task 1 failed: exit code 3; no retry left (of 1)" in p.dispatcher.explain("g")
    p.close()


def test_an_elastic_gang_broken_by_a_retry_keeps_the_final_failure_of_its_mate(tmp_path: Path) -> None:
    """4 tasks, min_member 3, room for 3 (g/3 waits). g/0 has used its retry; g/0 (final) and g/1
    (a retry left) then fail in one report. g/0's end comes first, so taking g/1 off breaks the
    gang without g/0: it stays failed. In the other order the break took g/0 off as a mate, its
    failure was lost, and it ran a third time."""
    p = _pipeline(tmp_path)
    p.submit(make_job("blocker").cpu("2").build())  # one node's room
    job = make_job("g").cpu("2").replicas(4).min_member(3).max_retries(1).build()
    p.submit(job)
    p.run_until_idle()
    p.complete(["g/0"], F, {"g/0": "exit code 1"})  # its one retry: the gang breaks, is placed again
    p.run_until_idle()
    assert _tasks(p, job) == [B, B, B, TaskState.PENDING]
    p.complete(["g/0", "g/1"], F, {"g/0": "exit code 4", "g/1": "exit code 5"})
    assert _tasks(p, job)[0] is F
    assert p.dispatcher.retries_of(job)[:2] == (1, 1)
    p.run_until_idle()
    assert _tasks(p, job)[0] is F  # never run again
    p.close()


def test_a_gang_whose_failure_the_binder_stored_before_a_crash_is_stopped_at_restart(tmp_path: Path) -> None:
    """The binder stored g/0 failed, and the master died before the dispatcher heard: the restarted
    one finds the gang failed, stops the rest and frees them at the binder."""
    p = _pipeline(tmp_path)
    job = make_job("g").cpu("1").replicas(3).min_member(3).build()
    p.submit(job)
    p.run_until_idle()
    assert p.binder.release(["g/0"], F.value) == ["g/0"]  # then the master dies
    p.close()
    again = _pipeline(tmp_path)
    assert again.dispatcher.job_state("g") is JobState.FAILED
    assert _tasks(again, job) == [F, C, C]
    assert not [tid for tid in again.binder.state.task_row if tid.startswith("g/")]
    assert "the gang cannot reach its min_member of 3" in again.dispatcher.explain("g")
    again.close()


def test_a_gang_of_a_queue_no_longer_configured_fails_and_stops_too(tmp_path: Path) -> None:
    """Restarted without its queue, a running gang is kept apart (never scheduled); a task failing
    for good still fails it, and its other tasks are freed at the binder."""
    nodes = [make_node(f"n{i}").cpu("2").mem("8Gi").build() for i in range(4)]
    db = str(tmp_path / "gs.db")
    queues = [QueueConfig(name="default"), QueueConfig(name="old")]
    p = Pipeline(Settings(store_path=db, shards=1, queues=queues), nodes=nodes)
    job = make_job("g").cpu("1").replicas(3).min_member(3).queue("old").build()
    p.submit(job)
    p.run_until_idle()
    p.close()
    again = Pipeline(Settings(store_path=db, shards=1), nodes=nodes)
    assert again.dispatcher.skipped_on_restore == ["g"]
    again.complete(["g/1"], F, {"g/1": "exit code 1"})
    assert again.dispatcher.job_state("g") is JobState.FAILED
    assert again.dispatcher.task_states("g") == [C, F, C]
    assert not [tid for tid in again.binder.state.task_row if tid.startswith("g/")]
    again.close()


def test_a_task_lost_while_its_failure_was_on_its_way_is_no_final_failure(tmp_path: Path) -> None:
    """g/3's node went, and g/3's failure arrives late in a report with g/1's final failure and
    g/0's retriable one: g/3 holds nothing, so it fails nothing. The gang (4, min 3) can still make
    its minimum, so g/0 runs again; before, g/3 counted as failed and the gang was stopped."""
    p, job = _gang_with_task_1_retried(tmp_path, make_job("g").cpu("2").replicas(4).min_member(3))
    row = p.binder.state.task_row["g/3"]
    node = p.binder.state.nodes[row]
    assert node is not None
    p.remove_node(node.name)
    assert _tasks(p, job) == [B, B, B, TaskState.PENDING]
    p.complete(["g/3", "g/1", "g/0"], F, {"g/3": "killed", "g/1": "exit code 2", "g/0": "exit code 3"})
    assert p.dispatcher.job_state("g") is not JobState.FAILED
    assert _tasks(p, job)[1] is F and _tasks(p, job)[3] is not F
    assert p.dispatcher.retries_of(job)[0] == 1  # g/0 runs again
    p.close()


def _unqueued(tmp_path: Path, job: Job) -> tuple[Pipeline, list[Node]]:
    """`job` running in queue old, then the master restarted without that queue."""
    nodes = [make_node(f"n{i}").cpu("2").mem("8Gi").build() for i in range(4)]
    db = str(tmp_path / "gs.db")
    queues = [QueueConfig(name="default"), QueueConfig(name="old")]
    p = Pipeline(Settings(store_path=db, shards=1, queues=queues), nodes=nodes)
    p.submit(job)
    p.run_until_idle()
    return p, nodes


def test_an_unqueued_gangs_failures_in_one_report_all_end_failed_with_their_reasons(tmp_path: Path) -> None:
    job = make_job("g").cpu("1").replicas(3).min_member(3).queue("old").build()
    p, nodes = _unqueued(tmp_path, job)
    p.close()
    again = Pipeline(Settings(store_path=str(tmp_path / "gs.db"), shards=1), nodes=nodes)
    again.complete(["g/0", "g/1"], F, {"g/0": "exit code 1", "g/1": "exit code 2"})
    assert again.dispatcher.task_states("g") == [F, F, C]
    assert [again.store.task_state(f"g/{i}") for i in range(3)] == [F, F, C]
    (snap,) = again.dispatcher.snapshots(["g"])
    assert snap is not None and snap.reasons == ("exit code 1", "exit code 2", "")
    again.close()


def test_an_unqueued_gang_whose_failure_the_binder_stored_first_is_stopped_at_restart(tmp_path: Path) -> None:
    job = make_job("g").cpu("1").replicas(3).min_member(3).queue("old").build()
    p, nodes = _unqueued(tmp_path, job)
    assert p.binder.release(["g/0"], F.value) == ["g/0"]  # then the master dies
    p.close()
    again = Pipeline(Settings(store_path=str(tmp_path / "gs.db"), shards=1), nodes=nodes)
    assert again.dispatcher.job_state("g") is JobState.FAILED
    assert again.dispatcher.task_states("g") == [F, C, C]
    assert not [tid for tid in again.binder.state.task_row if tid.startswith("g/")]
    again.close()


def test_a_failure_the_binder_stored_before_a_crash_keeps_its_reason(tmp_path: Path) -> None:
    """The binder stores a failure's reason with its end, in one transaction: a master that dies
    before the dispatcher hears of it restarts with the reason in explain and in the task's view."""
    p = _pipeline(tmp_path)
    job = make_job("f").cpu("1").build()
    p.submit(job)
    p.run_until_idle()
    assert p.binder.release(["f/0"], F.value, {"f/0": "exit code 3 (on n0)"}) == ["f/0"]  # then it dies
    p.close()
    again = _pipeline(tmp_path)
    assert again.dispatcher.job_state("f") is JobState.FAILED
    (view,) = again.dispatcher.snapshots(["f"])
    assert view is not None and view.reasons == ("exit code 3 (on n0)",)
    assert "exit code 3 (on n0)" in again.dispatcher.explain("f")
    again.close()


def test_a_gang_a_restore_stopped_waits_for_the_binder_whatever_is_released_meanwhile(tmp_path: Path) -> None:
    """Restarted alone (a Ray actor), the dispatcher's restore stops a gang whose failure the binder
    stored; it waits for take_aborted (the actor's next poll, or reload, sends it to the binder).
    A node lost before that releases other tasks: its answer (which a lost release drops) must not
    take the gang, or the binder that lived on would hold its other tasks for good."""
    p = _pipeline(tmp_path)
    p.submit(make_job("g").cpu("1").replicas(3).min_member(3).build())
    p.submit(make_job("other").cpu("1").build())
    p.run_until_idle()
    assert p.binder.release(["g/0"], F.value) == ["g/0"]  # then the dispatcher dies
    restarted = Dispatcher(p.settings, store=Store(p.settings.store_path))
    restarted.restore()
    assert restarted.on_released(["other/0"], TaskState.PENDING) == {}
    assert restarted.take_aborted() == {"g": ["g/1", "g/2"]}
    p.close()


def test_gangs_stopped_by_a_restore_and_by_a_failure_whose_write_fails_all_wait_for_the_binder(
    tmp_path: Path,
) -> None:
    """A restarted dispatcher's restore stopped gang a; then b's failure reaches it and the store
    refuses the write (here: closed). on_released raises, and neither gang is dropped: take_aborted
    has both for the binder."""
    p = _pipeline(tmp_path)
    for name in ("a", "b"):
        p.submit(make_job(name).cpu("1").replicas(3).min_member(3).build())
    p.run_until_idle()
    assert p.binder.release(["a/0"], F.value) == ["a/0"]  # then the dispatcher dies
    store = Store(p.settings.store_path)
    restarted = Dispatcher(p.settings, store=store)
    restarted.restore()
    store.close()
    with pytest.raises(Exception):  # noqa: B017 - whatever SQLite says of a closed connection
        restarted.on_released(["b/0"], F)
    assert restarted.take_aborted() == {"a": ["a/1", "a/2"], "b": ["b/1", "b/2"]}
    p.close()
