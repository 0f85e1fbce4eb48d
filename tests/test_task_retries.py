"""A job's max_retries: a failed task runs again until its retries are used up, a gang's members
going with it (never partly bound); the counts outlive a restart; through the in-process control
plane, the Ray actors, and a real agent running shell tasks."""

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gosched import Client
from gosched.common.config import Settings
from gosched.common.errors import SpecError
from gosched.common.spec import job_from_spec, job_to_spec
from gosched.common.states import JobState, TaskState
from gosched.common.store import Store
from gosched.runtime.control import ControlPlane
from gosched.runtime.local_control import LocalControl
from gosched.runtime.simulation import sim_nodes
from tests.builders import make_job
from tests.test_agent_gateway import wait_for
from tests.test_agent_gateway_races import agents_of, master_at


# == the spec ======================================================================================
@pytest.mark.parametrize(("given", "want"), [(0, 0), (3, 3), (1000, 1000)])
def test_max_retries_is_read_and_written_back(given: int, want: int) -> None:
    job = job_from_spec({"command": "true", "cpu": 1, "max_retries": given})
    assert job.max_retries == want
    assert job_from_spec(job_to_spec(job)) == job
    assert ("max_retries" in job_to_spec(job)) == bool(want)


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        (-1, "must be >= 0"),
        (1001, "must be <= 1000"),
        ("3", "expected an integer"),
        (True, "expected an integer"),
    ],
)
def test_a_bad_max_retries_is_refused_naming_the_field(given: object, reason: str) -> None:
    with pytest.raises(SpecError) as refused:
        job_from_spec({"command": "true", "cpu": 1, "max_retries": given})
    assert refused.value.field == "max_retries" and reason in str(refused.value)


# == the control planes ============================================================================
# Retried at once unless a test asks for a backoff (the default waits 10 s, as Kubernetes does).
AT_ONCE = {"failure_backoff_s": 0.0}


def _local(tmp_path: Path, **settings: float) -> ControlPlane:
    opts = AT_ONCE | settings
    return LocalControl(Settings(store_path=str(tmp_path / "gs.db"), shards=1, **opts), sim_nodes(2))


def _ray(tmp_path: Path, **settings: float) -> ControlPlane:
    ray = pytest.importorskip("ray")
    from gosched.runtime import ray_cluster
    from gosched.runtime.ray_control import RayControl

    if not ray.is_initialized():
        ray_cluster._start_ray(None, num_cpus=2, logging_level="error", log_to_driver=False)
    opts = AT_ONCE | settings
    return RayControl(Settings(store_path=str(tmp_path / "gs.db"), shards=1, **opts), sim_nodes(2))


@pytest.fixture(scope="module", autouse=True)
def _ray_down() -> Iterator[None]:
    yield
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized():
        ray.shutdown()


def _states(control: ControlPlane, job_id: str) -> tuple[JobState, list[TaskState]]:
    (snap,) = control.jobs([job_id], placements=False)
    assert snap is not None
    return snap.state, list(snap.task_states)


def _bound(control: ControlPlane, job_id: str) -> None:
    deadline = time.monotonic() + 30
    while set(_states(control, job_id)[1]) != {TaskState.BOUND}:
        control.step()
        assert time.monotonic() < deadline, _states(control, job_id)


@pytest.mark.parametrize("make", [_local, _ray], ids=["in-process", "ray"])
def test_a_failed_gang_member_runs_again_with_its_gang_until_its_retries_are_used(
    tmp_path: Path, make: Callable[[Path], ControlPlane]
) -> None:
    control = make(tmp_path)
    try:
        control.submit_many([make_job("g").cpu("1").replicas(2).min_member(2).max_retries(1).build()])
        _bound(control, "g")
        control.finished(["g/0"], TaskState.FAILED, {"g/0": "exit code 3 (on sim-0)"})
        state, tasks = _states(control, "g")
        # Its gang mate left its node with it: no part of the gang stays bound.
        assert state is JobState.PENDING and tasks == [TaskState.PENDING, TaskState.PENDING]
        explained = control.explain("g")
        assert "task 0 failed: exit code 3 (on sim-0); run again (retry 1 of 1)" in explained
        assert "task 1 stopped: a task of its gang failed and runs again" in explained
        _bound(control, "g")
        assert control.task_attempts(["g/0", "g/1"]) == {"g/0": 1, "g/1": 1}
        control.finished(["g/1"], TaskState.FAILED, {"g/1": "exit code 1"})  # its own first retry
        _bound(control, "g")
        control.finished(["g/0"], TaskState.FAILED, {"g/0": "exit code 3 (on sim-1)"})  # no retry left
        # A failure with none left is the job's end: the gang cannot be whole again, so its mate is
        # stopped (freed at the binder, which stops it on its node), not left running alone.
        assert _states(control, "g") == (JobState.FAILED, [TaskState.FAILED, TaskState.CANCELLED])
        explained = control.explain("g")
        assert "task 0 failed: exit code 3 (on sim-1); no retry left (of 1)" in explained
        assert "stopped: task 0 failed with no retry left" in explained
        control.finished(["g/1"], TaskState.SUCCEEDED)  # its run's late end changes nothing
        assert _states(control, "g") == (JobState.FAILED, [TaskState.FAILED, TaskState.CANCELLED])
        # A job without retries fails at its first failure, as before.
        control.submit_many([make_job("once").cpu("1").build()])
        _bound(control, "once")
        control.finished(["once/0"], TaskState.FAILED, {"once/0": "exit code 2"})
        assert _states(control, "once") == (JobState.FAILED, [TaskState.FAILED])
    finally:
        control.close()


@pytest.mark.parametrize("make", [_local, _ray], ids=["in-process", "ray"])
def test_a_failed_task_waits_out_a_backoff_doubling_per_retry_before_it_runs_again(
    tmp_path: Path, make: Callable[..., ControlPlane]
) -> None:
    control = make(tmp_path, failure_backoff_s=0.4, failure_backoff_max_s=0.8)
    try:
        control.submit_many([make_job("b").cpu("1").replicas(2).min_member(2).max_retries(3).build()])
        _bound(control, "b")
        waits = []
        for retry, backoff in [(1, 0.4), (2, 0.8), (3, 0.8)]:  # doubling, then at the cap
            failed = time.monotonic()
            control.finished(["b/0"], TaskState.FAILED, {"b/0": "exit code 1"})
            explained = control.explain("b")
            assert f"run again (retry {retry} of 3) after {backoff:g}s" in explained
            assert "backing off after a task failed; queued again in" in explained
            # Not before its backoff: a round now places nothing, though both nodes are free.
            control.step()
            assert _states(control, "b")[1] == [TaskState.PENDING, TaskState.PENDING]
            _bound(control, "b")
            waits.append(time.monotonic() - failed)
            assert waits[-1] >= backoff, waits
        control.finished(["b/0"], TaskState.FAILED, {"b/0": "exit code 1"})  # no retry left
        assert _states(control, "b")[1][0] is TaskState.FAILED
    finally:
        control.close()


def test_the_retries_used_outlive_a_restart(tmp_path: Path) -> None:
    control = _local(tmp_path)
    try:
        control.submit_many([make_job("r").cpu("1").max_retries(2).build()])
        _bound(control, "r")
        control.finished(["r/0"], TaskState.FAILED, {"r/0": "exit code 1"})
        _bound(control, "r")
        control.finished(["r/0"], TaskState.FAILED, {"r/0": "exit code 1"})
        _bound(control, "r")
    finally:
        control.close()
    with Store(tmp_path / "gs.db") as store:
        assert store.load_retried() == {"r/0": 2}
    again = _local(tmp_path)  # a restarted master: the task used both of its retries already
    try:
        (snap,) = again.jobs(["r"], placements=False)
        assert snap is not None and snap.retries == (2,)
        assert snap.reasons == ("exit code 1",)  # read back from the store
        _bound(again, "r")
        again.finished(["r/0"], TaskState.FAILED, {"r/0": "exit code 1"})
        assert _states(again, "r") == (JobState.FAILED, [TaskState.FAILED])
        (snap,) = again.jobs(["r"], placements=False)
        assert snap is not None and snap.retries == (2,)  # kept once the job has ended
        assert snap.reasons == ("exit code 1",)
    finally:
        again.close()


def test_a_cancelled_job_is_not_run_again(tmp_path: Path) -> None:
    control = _local(tmp_path)
    try:
        control.submit_many([make_job("c").cpu("1").max_retries(3).build()])
        _bound(control, "c")
        control.cancel("c")
        control.finished(["c/0"], TaskState.FAILED, {"c/0": "killed: cancelled"})
        assert _states(control, "c")[0] is JobState.CANCELLED
    finally:
        control.close()


# == on a real agent ===============================================================================
def test_a_flaky_task_on_an_agent_succeeds_on_its_retry(tmp_path: Path) -> None:
    """It fails the first time (no marker yet) and succeeds the second; GOSCHED_ATTEMPT tells it
    which run it is. One that always fails ends failed after its retries, each run again."""
    marker = tmp_path / "marker"
    flaky = f'echo "attempt $GOSCHED_ATTEMPT"; [ -e {marker} ] || {{ touch {marker}; exit 3; }}'
    with (
        master_at(tmp_path / "g.db", failure_backoff_s=0.2, failure_backoff_max_s=0.4) as master,
        agents_of(master, tmp_path, "n1") as (agent,),
        Client(master.target, timeout=10) as client,
    ):
        client.submit({"id": "flaky", "cpu": "0.1", "command": [flaky], "max_retries": 2})
        client.submit({"id": "broken", "cpu": "0.1", "command": ["exit 4"], "max_retries": 2})
        wait_for("flaky done", lambda: client.get("flaky").state is JobState.SUCCEEDED, timeout=30)
        assert b"".join(client.logs("flaky", 0)) == b"attempt 1\n"  # the run that succeeded, alone
        assert b"".join(client.logs("flaky", 0, previous=True)) == b"attempt 0\n"  # and the failed one
        explained = client.explain("flaky")
        # Finished: its retry is told as what happened, no longer as to come after its backoff.
        assert "task 0 failed: exit code 3 (on n1); was run again (retry 1 of 2)" in explained
        assert "after 0.2s" not in explained
        wait_for("broken failed", lambda: client.get("broken").state is JobState.FAILED, timeout=30)
        assert agent.lines.count("broken/0 failed: exit code 4") == 3, agent.lines
        explained = client.explain("broken")
        assert "was run again (retry 1 of 2)" in explained  # the first failure, and the last:
        assert "latest: task 0 failed: exit code 4 (on n1); no retry left (of 2)" in explained
        # The retries used, per task, in the API's view (Slurm's Restarts; kubectl's RESTARTS
        # counts a service's restarts by its agent, and stays 0 here).
        assert [(t.retries, t.restarts) for t in client.get("broken").tasks] == [(2, 0)]
        assert [t.retries for t in client.get("flaky").tasks] == [1]
        # And why each task's latest failure failed, as sacct's ExitCode and Reason tell.
        assert [t.reason for t in client.get("broken").tasks] == ["exit code 4 (on n1)"]
        assert [t.reason for t in client.get("flaky").tasks] == ["exit code 3 (on n1)"]


def test_a_gang_member_failing_for_good_stops_its_mate_on_the_agent(tmp_path: Path) -> None:
    """Task 1 fails with no retry left; task 0 (a long sleep) is stopped on its node at once,
    not left to run alone, and the job ends failed."""
    pair = 'if [ "$GOSCHED_TASK_INDEX" = 1 ]; then exit 7; fi; sleep 60'
    with (
        master_at(tmp_path / "g.db") as master,
        agents_of(master, tmp_path, "n1") as (agent,),
        Client(master.target, timeout=10) as client,
    ):
        started = time.monotonic()
        client.submit({"id": "pair", "cpu": "0.1", "replicas": 2, "min_member": 2, "command": [pair]})
        wait_for("pair failed", lambda: client.get("pair").state is JobState.FAILED, timeout=30)
        wait_for(
            "its mate stopped",
            lambda: any("pair/0" in line and "started" not in line for line in agent.lines),
        )
        print(agent.lines)
        assert time.monotonic() - started < 30  # not the sleep's 60 s
        states = [t.state for t in client.get("pair").tasks]
        assert states == [TaskState.CANCELLED, TaskState.FAILED], states
        assert "stopped: task 1 failed with no retry left" in client.explain("pair")


def test_a_failed_tasks_backoff_outlives_a_restart(tmp_path: Path) -> None:
    control = _local(tmp_path, failure_backoff_s=60, failure_backoff_max_s=60)
    try:
        control.submit_many([make_job("w").cpu("1").max_retries(1).build()])
        _bound(control, "w")
        control.finished(["w/0"], TaskState.FAILED, {"w/0": "exit code 1"})
        failed = time.time()
    finally:
        control.close()
    with Store(tmp_path / "gs.db") as store:
        (ends,) = store.load_retry_at(failed).values()
        assert failed + 59 < ends <= failed + 60
    again = _local(tmp_path, failure_backoff_s=60, failure_backoff_max_s=60)
    try:
        explained = again.explain("w")
        waits = re.findall(r"backing off after a task failed; queued again in ([0-9.]+)s", explained)
        assert waits and 30 < float(waits[0]) < 60, explained  # what is left of it, however slow
        for _ in range(3):  # both nodes are free, but the backoff holds
            again.step()
        assert _states(again, "w") == (JobState.PENDING, [TaskState.PENDING])
    finally:
        again.close()
