"""A job's time limit (Slurm's --time, Kubernetes' activeDeadlineSeconds): how the spec reads it,
that it travels through every encoding, and that a task past it is stopped and fails, on a real
agent (shell tasks, loopback gRPC), across an agent restart, for a crash-looping service, and on
simulated nodes."""

import time
from pathlib import Path

import msgpack
import pytest

from gosched import Client
from gosched.agent.executor import ShellExecutor
from gosched.agent.state import StateFile
from gosched.agent.tasks import TaskTable
from gosched.api.convert import job_from_proto, job_to_proto_spec
from gosched.common import codec
from gosched.common.errors import SpecError
from gosched.common.spec import format_duration, job_from_spec, job_to_spec
from gosched.common.states import JobState
from gosched.proto.v1 import agent_pb2, types_pb2
from tests.loopback import cli, sim_master
from tests.test_agent_gateway import wait_for
from tests.test_agent_gateway_races import agents_of, master_at


def _job(time_limit: object) -> dict[str, object]:
    return {"id": "t", "command": "true", "cpu": 1, "time_limit": time_limit}


# == the spec ======================================================================================
@pytest.mark.parametrize(
    ("given", "seconds", "written"),
    [
        (90, 90.0, "1m30s"),
        (0.5, 0.5, "0.5s"),
        ("90s", 90.0, "1m30s"),
        ("45m", 2700.0, "45m"),
        ("2h", 7200.0, "2h"),
        ("1d", 86400.0, "1d"),
        ("1h30m", 5400.0, "1h30m"),
        ("1.5h", 5400.0, "1h30m"),
        ("1d12h", 129600.0, "1d12h"),
        ("10:00", 600.0, "10m"),  # Slurm's MM:SS
        ("01:30:00", 5400.0, "1h30m"),  # HH:MM:SS
        ("2-12", 216000.0, "2d12h"),  # D-HH
        ("2-12:30", 217800.0, "2d12h30m"),  # D-HH:MM
        ("1-00:00:01", 86401.0, "1d1s"),  # D-HH:MM:SS
        (" 2h ", 7200.0, "2h"),
        (None, None, None),
    ],
)
def test_a_time_limit_is_read_from_seconds_units_or_slurms_clock_forms(
    given: object, seconds: float | None, written: str | None
) -> None:
    job = job_from_spec(_job(given))
    assert job.time_limit == seconds
    if seconds is not None:
        assert format_duration(seconds) == written
    assert job_from_spec(job_to_spec(job)) == job


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ("90", "'90' is a bare number, which Slurm reads as minutes"),  # and a spec's number as seconds
        ("", "is not a duration"),
        ("soon", "is not a duration"),
        ("h", "is not a duration"),
        ("1:60", "minutes and seconds go up to 59"),
        ("1:75:00", "minutes and seconds go up to 59"),
        (0, "must be more than 0 seconds, got 0"),
        (-5, "must be more than 0 seconds"),
        ("0s", "must be more than 0 seconds"),
        (366 * 86400, "is over 365 days, the longest time limit"),
        ("400d", "is over 365 days"),
        (True, "expected a number of seconds or a duration (1h30m), got a boolean"),
        ([60], "expected a number of seconds or a duration"),
        (float("inf"), "must be a finite number"),
    ],
)
def test_a_bad_time_limit_is_refused_naming_the_field(given: object, reason: str) -> None:
    with pytest.raises(SpecError) as refused:
        job_from_spec(_job(given))
    assert refused.value.field == "time_limit"
    assert reason in str(refused.value)


def test_the_time_limit_travels_through_protobuf_and_the_store_codec() -> None:
    job = job_from_spec(_job("1h30m"), now=time.time())
    assert job_from_proto(job_to_proto_spec(job)) == job
    assert codec.decode_job(codec.encode_job(job)) == job
    assert codec.decode_job(codec.encode_many([job])[0]) == job
    # A job stored before the field (and max_retries after it) existed lacks their items: it
    # decodes with no limit and no retries.
    older = codec.decode_job(msgpack.packb(msgpack.unpackb(codec.encode_job(job))[:-2]))
    assert (older.time_limit, older.max_retries) == (None, 0)
    assert job_from_proto(job_to_proto_spec(job_from_spec(_job(None)))).time_limit is None


def test_submit_takes_the_limit_from_a_flag_and_describe_shows_it(tmp_path: Path) -> None:
    server = sim_master(tmp_path)
    try:
        done = cli(server, "submit", "--name", "slurmish", "--cpus", "1", "--time", "1:30:00", "--", "true")
        assert done.exit_code == 0, done.output
        described = cli(server, "describe", "slurmish")
        assert "Time limit" in described.output and "1h30m per task" in described.output
        assert "time_limit: 5400.0" in described.output
        refused = cli(server, "submit", "--cpus", "1", "--time-limit", "90", "--", "true")
        assert refused.exit_code != 0
        assert "--time-limit" in refused.output and "is a bare number" in refused.output
    finally:
        server.stop()


# == on a node =====================================================================================
def test_a_task_past_its_time_limit_is_stopped_and_fails_through_the_whole_system(tmp_path: Path) -> None:
    """The master sends the limit with the launch; the agent stops the task and reports why."""
    with (
        master_at(tmp_path / "g.db") as master,
        agents_of(master, tmp_path, "n1"),
        Client(master.target, timeout=10) as client,
    ):
        began = time.monotonic()
        client.submit({"id": "long", "cpu": "0.1", "command": "sleep 60", "time_limit": 0.5})
        client.submit({"id": "short", "cpu": "0.1", "command": "sleep 0.1", "time_limit": 30})
        wait_for("the long one stopped", lambda: client.get("long").state is JobState.FAILED)
        assert time.monotonic() - began < 20  # stopped at its limit, not at the command's end
        assert "killed: time limit of 0.5s reached" in client.explain("long")
        wait_for("the short one done", lambda: client.get("short").state is JobState.SUCCEEDED)


def _table(tmp_path: Path, lines: list[str]) -> TaskTable:
    return TaskTable(ShellExecutor(tmp_path / "logs"), lambda _: None, None, lines.append)


def _launch(task_id: str, command: str, limit: float, *, service: bool = False) -> agent_pb2.LaunchTask:
    return agent_pb2.LaunchTask(
        task_id=task_id, job_id=task_id.split("/")[0], command=[command], service=service, time_limit_s=limit
    )


def _final(table: TaskTable, task_id: str, timeout: float = 10.0) -> agent_pb2.TaskStatus:
    def ended() -> bool:
        table.poll()
        return table.records[task_id].final is not None

    wait_for(f"{task_id}'s end", ended, timeout=timeout)
    final = table.records[task_id].final
    assert final is not None
    return final


def test_a_crash_looping_service_stops_restarting_at_its_time_limit(tmp_path: Path) -> None:
    lines: list[str] = []
    table = _table(tmp_path, lines)
    table.launch(_launch("svc/0", "exit 3", 2.5, service=True))
    final = _final(table, "svc/0")
    assert final.state == types_pb2.TASK_STATE_FAILED
    assert final.message == "killed: time limit of 2.5s reached"
    assert table.records["svc/0"].restarts >= 1  # it was restarted within its limit, then stopped


def test_a_task_within_its_limit_ends_as_it_would_without_one(tmp_path: Path) -> None:
    table = _table(tmp_path, [])
    table.launch(_launch("ok/0", "exit 0", 30.0))
    assert _final(table, "ok/0").state == types_pb2.TASK_STATE_SUCCEEDED


def test_the_time_limit_runs_on_across_an_agent_restart(tmp_path: Path) -> None:
    """The limit counts from the launch: an agent restarted meanwhile stops the task when the
    first agent would have, not a whole limit after it adopted the task."""
    first = _table(tmp_path, [])
    first.launch(_launch("t/0", "echo ready; sleep 60", 3.0))
    out = first.executor.log_paths("t/0")[0]
    wait_for("started", lambda: out.exists() and out.read_bytes() == b"ready\n")
    ends_by = first.records["t/0"].ends_by
    state = StateFile(tmp_path / "state.json")
    state.save(first.snapshot())  # the agent stops here; its task runs on
    second = _table(tmp_path, [])
    try:
        assert second.adopt(state.load()) == 1
        assert second.records["t/0"].ends_by == ends_by
        final = _final(second, "t/0", timeout=10.0)
        assert final.message == "killed: time limit of 3s reached"
        assert time.time() - ends_by < 5.0
    finally:
        first.executor.wait_all(5)  # the run was its child: reap it


def test_a_simulated_task_longer_than_its_limit_fails_at_the_limit(tmp_path: Path) -> None:
    server = sim_master(tmp_path, task_seconds=30.0)
    try:
        with Client(server.target, timeout=10) as client:
            client.submit({"id": "capped", "cpu": "1", "command": "true", "time_limit": 0.3})
            client.submit({"id": "free", "cpu": "1", "command": "true", "time_limit": 60})
            wait_for("the capped one failed", lambda: client.get("capped").state is JobState.FAILED)
            assert "time limit of 0.3s reached" in client.explain("capped")
            assert client.get("free").state is JobState.RUNNING
    finally:
        server.stop()
