"""The CLI's pieces that need no master: human numbers, tables, flags to spec, errors to exit codes."""

import io
import time

import grpc
import pytest

from gosched.api import errors
from gosched.api.convert import JobInfo, TaskInfo
from gosched.cli import humanize as h
from gosched.cli.exits import CliError, ExitCode, error_message, exit_code
from gosched.cli.output import command_text, task_data, tasks_view
from gosched.cli.submit_spec import JobFlags, build_spec, flag_for
from gosched.common.errors import SpecError
from gosched.common.resources import ResourceRequest
from gosched.common.states import JobState, TaskState
from tests.builders import make_job

GiB = 2**30


def test_human_numbers() -> None:
    assert [h.cores(m) for m in (3500, 8000, 250, 0, 100_000_000)] == ["3.5", "8", "0.25", "0", "100000"]
    assert [h.gpus(m) for m in (500, 1250, 8000, 0)] == ["0.5", "1.25", "8", "0"]
    assert [h.memory(n) for n in (16 * GiB, GiB + GiB // 2, 512 * 2**20, 768 * GiB, 3 * 2**40, 0, 100)] == [
        "16Gi", "1.5Gi", "512Mi", "768Gi", "3Ti", "0", "100",
    ]  # fmt: skip
    assert [h.age(s) for s in (0, 59, 61, 7200, 3 * 86400, -5)] == ["0s", "59s", "1m", "2h", "3d", "0s"]
    assert [h.age(s) for s in (364 * 86400, 4 * 365 * 86400 + 86400)] == ["364d", "4y"]
    request = ResourceRequest(cpu_milli=4000, memory=16 * GiB, gpu_milli=250, gpu_memory_mib=40960)
    assert h.request(request) == "cpu 4, mem 16Gi, gpu 0.25, gpu-mem 40Gi"
    assert h.request(ResourceRequest()) == "-"


def test_table_aligns_columns() -> None:
    text = h.table(["NAME", "STATE"], [["sim-00000", "ready"], ["n", ""]])
    assert text.splitlines() == ["NAME       STATE", "sim-00000  ready", "n          -"]
    assert h.fields([("Job", "a"), ("Priority", "5")]).splitlines() == ["Job:       a", "Priority:  5"]


def test_flags_build_the_flat_spec() -> None:
    flags = JobFlags(
        command=("python", "train.py"),
        cpus="4",
        mem="16Gi",
        gpus="0.5",
        replicas=2,
        gpu_models=("A100,H100",),
        selectors=("zone=a,tier=gold",),
        env=("A=1,2",),
        name="train",
        priority=3,
    )
    assert build_spec(None, flags, io.StringIO()) == {
        "command": ["python", "train.py"],
        "cpu": "4",
        "memory": "16Gi",
        "gpus": "0.5",
        "replicas": 2,
        "gpu_models": ["A100", "H100"],
        "node_selector": {"zone": "a", "tier": "gold"},
        "env": {"A": "1,2"},
        "id": "train",
        "priority": 3,
    }
    from_stdin = build_spec("-", JobFlags(queue="prod"), io.StringIO('{"command": "true", "queue": "x"}'))
    assert from_stdin == {"command": "true", "queue": "prod"}
    with pytest.raises(CliError, match="--selector: expected KEY=VALUE"):
        build_spec(None, JobFlags(command=("x",), selectors=("zone",)), io.StringIO())
    # A key given twice with two values would lose a constraint without a word (the last won).
    with pytest.raises(CliError, match="--selector: 'zone' is given twice"):
        build_spec(None, JobFlags(command=("x",), selectors=("zone=a", "zone=b")), io.StringIO())
    with pytest.raises(CliError, match="--env: 'K' is given twice"):
        build_spec(None, JobFlags(command=("x",), env=("K=1", "K=2")), io.StringIO())
    twice = build_spec(None, JobFlags(command=("x",), selectors=("zone=a,zone=a",)), io.StringIO())
    assert twice["node_selector"] == {"zone": "a"}  # the same pair twice says nothing new
    assert [flag_for(f) for f in ("cpu", "env['X']", "min_member", "groups[0].cpu", "")] == [
        "--cpus", "--env", "--min-member", None, None,
    ]  # fmt: skip


def test_every_error_has_its_exit_code() -> None:
    cases = {
        errors.InvalidArgument("cpu: bad"): ExitCode.USAGE,
        errors.AlreadyExists("id: exists"): ExitCode.USAGE,
        errors.NotFound("job 'x' not found"): ExitCode.NOT_FOUND,
        errors.ResourceExhausted("too many pending jobs"): ExitCode.EXHAUSTED,
        errors.MessageTooLarge("Received message larger than max"): ExitCode.USAGE,
        errors.Unavailable("failed to connect"): ExitCode.UNAVAILABLE,
        errors.DeadlineExceeded("deadline"): ExitCode.UNAVAILABLE,
        errors.FailedPrecondition("already finished"): ExitCode.FAILED,
        errors.GoschedError("boom", grpc.StatusCode.INTERNAL): ExitCode.FAILED,
        SpecError("cpu", "bad"): ExitCode.USAGE,
        CliError("no file"): ExitCode.USAGE,
    }
    assert {type(e).__name__: exit_code(e) for e in cases} == {type(e).__name__: c for e, c in cases.items()}
    assert error_message(errors.ResourceExhausted("too many"), "m:1") == "refused by admission: too many"
    late = error_message(errors.DeadlineExceeded("Deadline Exceeded"), "m:1", submitting=True)
    assert late.startswith("the master at m:1 did not answer in time") and "--submission-id" in late
    cancel = error_message(errors.DeadlineExceeded("Deadline Exceeded"), "m:1")  # not a submission
    assert "may still take effect" in cancel and "--submission-id" not in cancel
    assert "cannot reach the master at m:1" in error_message(errors.Unavailable("refused"), "m:1")
    assert "not ready" in error_message(errors.Unavailable("the scheduler is not ready"), "m:1")


def test_commands_are_shown_with_their_argument_boundaries() -> None:
    assert command_text(["sh", "-c", 'echo "a b"; echo c']) == """sh -c 'echo "a b"; echo c'"""
    assert command_text(["python", "train.py", "--lr", "0.1"]) == "python train.py --lr 0.1"
    assert "\n" not in command_text(["printf", "a\nb"])  # one table row


def test_the_tasks_table_shows_restarts_as_kubectl_does() -> None:
    restarted = TaskInfo("svc/0", 0, "main", TaskState.RUNNING, "n1", (), 3, "exit code 1", time.time() - 125)
    fresh = TaskInfo("svc/1", 1, "main", TaskState.RUNNING, "n1", ((0, 1000),))
    info = JobInfo("svc", JobState.RUNNING, make_job("svc").build(), (restarted, fresh))
    lines = tasks_view(info).splitlines()
    assert lines[0].split() == ["INDEX", "TASK", "ROLE", "STATE", "RESTARTS", "NODE", "GPUS"]
    assert lines[1].split() == ["0", "svc/0", "main", "running", "3", "(2m", "ago)", "n1", "-"]
    assert lines[2].split() == ["1", "svc/1", "main", "running", "0", "n1", "0"]
    data = task_data(restarted)
    assert (data["restarts"], data["last_restart_reason"]) == (3, "exit code 1")
    assert task_data(fresh)["restarts"] == 0


def test_the_tasks_table_shows_retries_used_of_the_jobs_max_retries() -> None:
    """RETRIES (Slurm's Restarts) beside RESTARTS, for a job with max_retries only."""
    failed = TaskInfo("b/0", 0, "main", TaskState.FAILED, retries=2)
    again = TaskInfo("b/1", 1, "main", TaskState.RUNNING, "n1", retries=1)
    info = JobInfo("b", JobState.RUNNING, make_job("b").replicas(2).max_retries(2).build(), (failed, again))
    lines = tasks_view(info).splitlines()
    assert lines[0].split() == ["INDEX", "TASK", "ROLE", "STATE", "RESTARTS", "RETRIES", "NODE", "GPUS"]
    assert lines[1].split() == ["0", "b/0", "main", "failed", "0", "2/2", "-", "-"]
    assert lines[2].split() == ["1", "b/1", "main", "running", "0", "1/2", "n1", "-"]
    assert task_data(failed)["retries"] == 2
