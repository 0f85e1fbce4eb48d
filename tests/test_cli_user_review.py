"""What a user-level review of the CLI found, as a Slurm or Kubernetes user would use it: `logs -f`
across a master restart, submit's --toleration/--kind/--preemptible, multi-document job files,
--timeout without --wait, `jobs --queue` of an unknown queue, the exit code of a wait given up,
and delete-node's refusal in CLI words.

Real parts: masters on loopback (simulated nodes), the CLI in this process or as its own process.
"""

import subprocess
import sys
import time
from pathlib import Path

from gosched import Client
from gosched.api.errors import NotFound
from gosched.api.logs import LogStore
from gosched.common.states import JobState, TaskState
from tests.loopback import sim_master


def running(client: Client, job_id: str) -> bool:
    try:
        return client.get(job_id).tasks[0].state is TaskState.RUNNING
    except NotFound:
        return False


def test_logs_follow_goes_on_across_a_master_restart(tmp_path: Path) -> None:
    """The master restarted while `logs -f` followed a task: it died with "not ready", exit 5,
    having printed a part of the output. It follows again from where it was: each byte once."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    store = LogStore(log_dir)
    first = sim_master(tmp_path, task_seconds=6.0, log_dir=log_dir)
    port = first.grpc_port
    lines = [f"line {i:02d}\n".encode() for i in range(30)]
    written = 0

    def write(upto: int) -> None:
        nonlocal written
        chunk = b"".join(lines)[written:upto]
        store.write("f/0", "stdout", written, chunk)
        written = upto

    total = b"".join(lines)
    second = None
    follower = None
    try:
        with Client(first.target, timeout=10) as client:
            client.submit({"id": "f", "command": ["true"], "cpu": 1})
            deadline = time.monotonic() + 20
            while not running(client, "f"):
                assert time.monotonic() < deadline, "the job never ran"
                time.sleep(0.05)
        write(len(b"".join(lines[:6])))
        follower = subprocess.Popen(
            [sys.executable, "-c", "from gosched.cli.main import app; app()",
             "logs", "--master", first.target, "f", "-f"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=tmp_path,  # not the checkout, whose gosched/ folder would shadow the installed package
        )  # fmt: skip
        time.sleep(1.5)  # it has printed the first lines
        first.stop()
        write(len(b"".join(lines[:15])))  # output that came while the master was down
        time.sleep(1.5)  # the follower finds no master for a while
        second = sim_master(tmp_path, task_seconds=6.0, log_dir=log_dir, port=port)
        time.sleep(1.0)
        write(len(total))
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 0, err
        assert out == total, (out, err)
        assert b"the master went away" in err and b"following task 0 of f again" in err
        with Client(second.target, timeout=10) as client:
            assert client.get("f").state is JobState.SUCCEEDED
    finally:
        if follower is not None:
            follower.kill()
            follower.wait(10)
        for master in (first, second):
            if master is not None:
                master.stop()
