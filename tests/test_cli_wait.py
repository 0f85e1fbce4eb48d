"""`gosched submit --wait` and `gosched logs` against a real master whose simulated nodes run each
task for a moment and succeed (the master's task simulator), with task output in its log folder."""

import io
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from gosched import Client
from gosched.api.convert import JobInfo
from gosched.api.logs import LogStore
from gosched.api.server import ServerHandle
from gosched.cli.exits import ExitCode
from gosched.cli.main import app
from gosched.cli.progress import Progress
from gosched.common.states import JobState
from tests.loopback import sim_master

TASK_SECONDS = 0.5


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, log_dir: Path) -> Iterator[ServerHandle]:
    handle = sim_master(tmp_path_factory.mktemp("cli-wait"), task_seconds=TASK_SECONDS, log_dir=log_dir)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def logs(log_dir: Path) -> LogStore:
    """Where an agent's shipped output lands: the master reads the same folder."""
    return LogStore(log_dir)


def run(server: ServerHandle, *args: str) -> Result:
    command, *rest = args
    return CliRunner().invoke(app, [command, "--master", server.target, *rest])


def test_wait_exits_0_when_the_job_succeeds(server: ServerHandle, client: Client) -> None:
    result = run(server, "submit", "--wait", "--cpus", "1", "--replicas", "2", "--name", "ok", "--", "true")
    assert result.exit_code == 0, result.output
    assert result.stdout == "ok\n"  # only the id on stdout, for $(gosched submit ...)
    progress = result.stderr.splitlines()
    # Not a terminal: one line per change, then the verdict.
    assert re.fullmatch(r"\[\s*[\d.]+s\] ok succeeded: 2 succeeded", progress[-2]), progress
    assert any("ok running: 2 running" in line for line in progress), progress
    assert len(progress) == len(set(progress))
    assert progress[-1] == "job ok succeeded"
    assert client.get("ok").state is JobState.SUCCEEDED


def test_wait_exits_1_when_the_job_is_cancelled(server: ServerHandle, client: Client) -> None:
    def cancel_when_submitted() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if client.list(tenant="doomed"):
                client.cancel("doomed")
                return
            time.sleep(0.05)

    canceller = threading.Thread(target=cancel_when_submitted)
    canceller.start()
    result = run(
        server, "submit", "--wait", "--gpus", "16", "--cpus", "1", "--name", "doomed", "--tenant", "doomed",
        "--", "true",
    )  # fmt: skip
    canceller.join()
    assert result.exit_code == ExitCode.FAILED, result.output
    assert result.stdout == "doomed\n" and result.stderr.splitlines()[-1] == "job doomed cancelled"


def test_wait_timeout_exits_6_and_the_job_goes_on(server: ServerHandle, client: Client) -> None:
    """Giving up is not the job failing: its own code (6), not 1."""
    result = run(server, "submit", "--wait", "--timeout", "0.3", "--gpus", "16", "--cpus", "1", "--", "true")
    assert result.exit_code == ExitCode.GAVE_UP == 6, result.output
    job_id = result.stdout.strip()
    assert f"gave up waiting after 0.3s: job {job_id} is still pending" in result.stderr
    assert client.cancel(job_id).state is JobState.CANCELLED


def test_logs_print_the_tasks_output_byte_for_byte(
    server: ServerHandle, client: Client, logs: LogStore
) -> None:
    job_id = client.submit({"id": "talker", "command": ["true"], "cpu": 1, "replicas": 2})
    client.wait(job_id, timeout=10)
    out = b"line one\nline two\n\xff\xfe not utf-8\n"
    logs.write("talker/1", "stdout", 0, out)
    logs.write("talker/1", "stderr", 0, b"a warning\n")
    shown = run(server, "logs", job_id, "--task", "1")
    assert shown.exit_code == 0, shown.output
    assert shown.stdout_bytes == out
    assert run(server, "logs", job_id, "--task", "1", "--stderr").stdout_bytes == b"a warning\n"
    quiet = run(server, "logs", job_id)
    assert quiet.stdout_bytes == b""  # task 0 printed nothing, and stderr says so
    assert f"no output from task 0 of {job_id} (it is succeeded)" in quiet.stderr
    beyond = run(server, "logs", job_id, "--task", "7")
    assert beyond.exit_code == ExitCode.USAGE and beyond.stderr.startswith("error: --task: ")


def test_logs_follow_until_the_task_ends(server: ServerHandle, client: Client, logs: LogStore) -> None:
    job_id = client.submit({"id": "follower", "command": ["true"], "cpu": 1})
    client.wait(job_id, states={JobState.RUNNING}, timeout=10)
    logs.write("follower/0", "stdout", 0, b"first\n")

    def more_later() -> None:
        time.sleep(0.1)
        logs.write("follower/0", "stdout", 6, b"second\n")

    writer = threading.Thread(target=more_later)
    writer.start()
    started = time.monotonic()
    result = run(server, "logs", job_id, "--follow")
    writer.join()
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == b"first\nsecond\n"
    assert client.get(job_id).state is JobState.SUCCEEDED  # it ended, so the follow did
    assert time.monotonic() - started < 10


def test_progress_rewrites_one_line_on_a_terminal(client: Client) -> None:
    job_id = client.submit({"command": ["true"], "cpu": 1, "replicas": 2})
    infos: list[JobInfo] = list(client.watch(job_id, timeout=10))
    screen = io.StringIO()
    progress = Progress(screen, tty=True)
    for info in infos + infos[-1:]:  # a repeat shows nothing new
        progress.show(info)
    progress.close()
    text = screen.getvalue()
    assert text.count("\r\x1b[K") == len({(i.state, tuple(sorted(i.task_counts.items()))) for i in infos})
    assert text.endswith(f"{job_id} succeeded: 2 succeeded\n") and text.count("\n") == 1
