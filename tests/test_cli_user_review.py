"""What a user-level review of the CLI found, as a Slurm or Kubernetes user would use it: `logs -f`
across a master restart, submit's --toleration/--kind/--preemptible, multi-document job files,
--timeout without --wait, `jobs --queue` of an unknown queue, the exit code of a wait given up,
and delete-node's refusal in CLI words.

Real parts: masters on loopback (simulated nodes), the CLI in this process or as its own process.
"""

import dataclasses
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gosched import Client
from gosched.api.errors import NotFound
from gosched.api.logs import LogStore
from gosched.api.server import ServerHandle, serve
from gosched.cli.exits import ExitCode
from gosched.common.config import QueueConfig, Settings
from gosched.common.job import JobKind, Toleration
from gosched.common.node import Taint, TaintEffect
from gosched.common.states import JobState, TaskState
from gosched.runtime.simulation import sim_nodes
from tests.loopback import cli, sim_master


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


@pytest.fixture(scope="module")
def tainted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """A master whose only node is tainted dedicated=gpu:NoSchedule: untolerating jobs wait."""
    folder = tmp_path_factory.mktemp("tainted")
    nodes = [
        dataclasses.replace(n, taints=(Taint("dedicated", "gpu", TaintEffect.NO_SCHEDULE),))
        for n in sim_nodes(1)
    ]
    settings = Settings(store_path=str(folder / "gosched.db"), queues=[QueueConfig(name="default")])
    handle = serve(settings, nodes, grpc_port=0, http_port=None, host="127.0.0.1", wait_ready=True)
    yield handle
    handle.stop()


def placed(client: Client, job_id: str, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get(job_id).tasks[0].node:
            return True
        time.sleep(0.05)
    return False


def test_submit_toleration_kind_and_preemptible_from_flags(tainted: ServerHandle) -> None:
    with Client(tainted.target, timeout=10) as client:
        shut_out = cli(tainted, "submit", "--name", "plain", "--cpus", "1", "--", "sleep", "1")
        assert shut_out.exit_code == 0, shut_out.output
        assert not placed(client, "plain", timeout=1.0)  # the taint keeps it off the only node
        result = cli(
            tainted, "submit", "--name", "tol", "--cpus", "1", "--toleration", "dedicated=gpu:NoSchedule",
            "--toleration", "spot", "--toleration", "maint:NoExecute", "--toleration", "team=a",
            "--kind", "service", "--no-preemptible", "--", "sleep", "1",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        job = client.get("tol").job
        assert job.groups[0].tolerations == (
            Toleration("dedicated", "Equal", "gpu", TaintEffect.NO_SCHEDULE),
            Toleration("spot", "Exists"),
            Toleration("maint", "Exists", "", TaintEffect.NO_EXECUTE),
            Toleration("team", "Equal", "a"),
        )
        assert job.kind is JobKind.SERVICE and job.preemptible is False
        assert placed(client, "tol")
        default = cli(tainted, "submit", "--name", "dflt", "--cpus", "1", "--preemptible", "--", "true")
        assert default.exit_code == 0, default.output
        got = client.get("dflt").job
        assert got.kind is JobKind.BATCH and got.preemptible is True
        client.cancel("plain")
        client.cancel("tol")


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--toleration", "k=v:NoSchedul"], "--toleration 'k=v:NoSchedul': the effect must be one of "
         "NoSchedule, PreferNoSchedule, NoExecute, got 'NoSchedul'"),
        (["--toleration", "=gpu:NoSchedule"], "--toleration '=gpu:NoSchedule': no key"),
        (["--toleration", "dedicated:"], "--toleration 'dedicated:': no effect after ':'"),
        (["--toleration", "dedicated=:NoSchedule"], "--toleration 'dedicated=:NoSchedule': no value"),
        (["--toleration", "bad key"], "tolerations[0].key (--toleration): "),
        (["--toleration", "k=v", "--toleration", "k=bad value"], "tolerations[1].value (--toleration): "),
        (["--kind", "daemon"], "kind (--kind): must be one of batch, service"),
    ],
)  # fmt: skip
def test_bad_toleration_or_kind_exits_2_naming_the_flag(
    tainted: ServerHandle, flags: list[str], says: str
) -> None:
    result = cli(tainted, "submit", "--cpus", "1", *flags, "--", "true")
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stderr.startswith(f"error: {says}"), result.stderr


def test_toleration_is_refused_next_to_a_job_file(tainted: ServerHandle, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text('command: ["true"]\ncpu: 1\n')
    result = cli(tainted, "submit", "-f", str(job), "--toleration", "spot")
    assert result.exit_code == ExitCode.USAGE and "--toleration: not with -f" in result.stderr, result.output
    # --kind and --preemptible are the job's own: they override the file's, as --queue does
    over = cli(tainted, "submit", "-f", str(job), "--name", "svc", "--kind", "service", "--no-preemptible")
    assert over.exit_code == 0, over.output
    with Client(tainted.target, timeout=10) as client:
        got = client.get("svc").job
        assert got.kind is JobKind.SERVICE and not got.preemptible
        client.cancel("svc")


def test_submit_a_multi_document_file_submits_each_job_at_once(tainted: ServerHandle, tmp_path: Path) -> None:
    """kubectl apply -f takes a YAML stream of several documents; submit said "expected a single
    document in the stream", PyYAML's words."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "id: multi-a\ncommand: [sleep, '1']\ncpu: 1\n---\n"
        "id: multi-b\ncommand: [sleep, '1']\ncpu: 1\n---\n"  # an empty document at the end: left out
    )
    result = cli(tainted, "submit", "-f", str(jobs), "--priority", "5")
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == ["multi-a", "multi-b"]
    with Client(tainted.target, timeout=10) as client:
        assert [client.get(j).job.priority for j in ("multi-a", "multi-b")] == [5, 5]
        for job_id in ("multi-a", "multi-b"):
            client.cancel(job_id)


def test_a_bad_document_submits_none_of_them(tainted: ServerHandle, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "id: none-a\ncommand: [sleep, '1']\ncpu: 1\n---\nid: none-b\ncommand: [sleep, '1']\ncpu: lots\n"
    )
    result = cli(tainted, "submit", "-f", str(jobs))
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stderr.startswith(f"error: {jobs}, document 2: cpu: "), result.stderr
    listed = cli(tainted, "submit", "-f", "-", input='command: ["true"]\ncpu: 1\n---\n- a list\n')
    assert listed.exit_code == ExitCode.USAGE
    assert "stdin, document 2: a job spec must be a mapping of fields, got list" in listed.stderr, (
        listed.stderr
    )
    named = cli(tainted, "submit", "-f", "-", "--name", "x", input="cpu: 1\n---\ncpu: 2\n")
    assert named.exit_code == ExitCode.USAGE and "error: --name: names one job" in named.stderr, named.stderr
    with Client(tainted.target, timeout=10) as client:
        for job_id in ("none-a", "none-b"):
            with pytest.raises(NotFound):
                client.get(job_id)


def test_timeout_without_wait_is_refused(tainted: ServerHandle) -> None:
    result = cli(tainted, "submit", "--timeout", "5", "--cpus", "1", "--", "true")
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stderr.startswith("error: --timeout: only with --wait"), result.stderr
    assert result.stdout == ""  # nothing was submitted


def test_jobs_of_an_unknown_queue_exit_3_naming_it(tainted: ServerHandle) -> None:
    result = cli(tainted, "jobs", "--queue", "nosuch")
    assert result.exit_code == ExitCode.NOT_FOUND, result.output
    assert result.stderr.startswith("error: --queue: unknown queue 'nosuch' (known: default"), result.stderr
    assert cli(tainted, "jobs", "--queue", "default").exit_code == 0


def test_delete_node_refusal_says_only_the_cli_way(tainted: ServerHandle) -> None:
    with Client(tainted.target, timeout=10) as client:
        client.submit(
            {"id": "holder", "command": ["sleep", "1"], "cpu": 1, "tolerations": [{"operator": "Exists"}]}
        )
        assert placed(client, "holder")
        result = cli(tainted, "delete-node", "sim-00000")
        assert result.exit_code == ExitCode.FAILED, result.output
        assert "gosched delete-node sim-00000 --force" in result.stderr, result.stderr
        assert "DeleteNode" not in result.stderr and "request" not in result.stderr, result.stderr
        client.cancel("holder")
