"""Regression tests for what a black-box review found using the system as a Slurm or Kubernetes
user would: `submit --wait` across a master restart, a master address with an impossible port.

Real parts: masters on loopback over one store (simulated nodes), the CLI as its own process.
"""

import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gosched import Client
from gosched.api.channel import target_error
from gosched.api.errors import NotFound
from gosched.cli.main import app
from gosched.common.states import JobState, TaskState
from tests.loopback import sim_master


def running(client: Client, job_id: str) -> bool:
    try:
        return client.get(job_id).tasks[0].state is TaskState.RUNNING
    except NotFound:
        return False


def test_submit_wait_watches_again_across_a_master_restart(tmp_path: Path) -> None:
    """The master restarted while `submit --wait` followed a job: the watch stream just ended,
    and the command said the job failed (exit 1) while the job went on and succeeded."""
    first = sim_master(tmp_path, task_seconds=3.0)
    port = first.grpc_port
    command = ["submit", "--master", first.target, "--name", "w", "--wait", "--cpus", "1", "--", "true"]
    waiting = subprocess.Popen(
        [sys.executable, "-c", "from gosched.cli.main import app; app()", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,  # not the checkout, whose gosched/ folder would shadow the installed package
    )
    second = None
    try:
        with Client(first.target, timeout=10) as client:
            deadline = time.monotonic() + 20
            while not running(client, "w"):
                assert time.monotonic() < deadline, "the job never ran"
                time.sleep(0.05)
        first.stop()
        time.sleep(1.5)  # the watcher finds no master for a while
        second = sim_master(tmp_path, task_seconds=3.0, port=port)
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, err
        assert out.strip() == "w" and "watching w again" in err and "job w succeeded" in err
        with Client(second.target, timeout=10) as client:
            assert client.get("w").state is JobState.SUCCEEDED
    finally:
        waiting.kill()
        waiting.wait(10)
        for master in (first, second):
            if master is not None:
                master.stop()


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("localhost:9090", None),
        ("[::1]:9090", None),
        ("dns:///master.example:9090", None),
        ("unix:/run/gosched.sock", None),
        ("localhost:117641", "from 1 to 65535, got '117641'"),  # gRPC would reach port 52105
        ("localhost:0", "from 1 to 65535, got '0'"),
        ("localhost:http", "from 1 to 65535, got 'http'"),
        ("", "empty address"),
    ],
)
def test_a_master_address_with_an_impossible_port_is_refused(target: str, why: str | None) -> None:
    got = target_error(target)
    assert got is None if why is None else why in (got or "")
    if why is not None:
        result = CliRunner().invoke(app, ["nodes", "--master", target])
        assert result.exit_code == 2 and "error: --master: " in result.stderr
