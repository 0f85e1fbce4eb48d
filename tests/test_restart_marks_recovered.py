"""A restart status lost in transport (the master acknowledges nothing: a status a broken stream
took is gone) loses no log mark: every later status of the run carries the latest restart's count
and where its process's output and the one before's start, so `logs` and `logs --previous` still
show one process each. The master's side through real gRPC on loopback (a scripted agent), the
agent's through a real agent running a real crash-looping service."""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gosched import Client
from gosched.api.logs import LogStore
from gosched.api.server import ServerHandle
from gosched.common.states import JobState
from gosched.proto.v1 import agent_pb2, types_pb2
from gosched.proto.v1 import types_pb2 as pb
from tests.test_agent_gateway import ScriptedAgent, start_master, wait_for
from tests.test_agent_runner import FakeMaster, agent_process, kill_groups, running_agent

RUNNING = types_pb2.TASK_STATE_RUNNING


@pytest.fixture
def master(tmp_path: Path) -> Iterator[ServerHandle]:
    handle = start_master(tmp_path / "g.db")
    yield handle
    handle.stop()


class _Service:
    """A service's run on a scripted agent: each process's output is shipped in the stream's order,
    at the file's end, as a real agent ships it."""

    def __init__(self, agent: ScriptedAgent, task_id: str) -> None:
        self.agent, self.task_id = agent, task_id
        self.size = {"stdout": 0, "stderr": 0}
        self.starts: list[dict[str, int]] = [dict(self.size)]  # where each process's output starts

    def write(self, stream: str, data: bytes) -> None:
        chunk = types_pb2.LogChunk(task_id=self.task_id, stream=stream, offset=self.size[stream], data=data)
        self.agent.send(log=chunk)
        self.size[stream] += len(data)

    def restart(self, *, lost: bool = False) -> None:
        self.starts.append(dict(self.size))
        status = self.status(RUNNING)
        status.message = "exit code 1"
        if not lost:
            self.agent.send(task_status=status)

    def status(self, state: int) -> agent_pb2.TaskStatus:
        """A status of the run, carrying its latest restart (as the agent's carry_restart)."""
        n = len(self.starts) - 1
        now, before = self.starts[-1], self.starts[max(n - 1, 0)]
        return agent_pb2.TaskStatus(
            task_id=self.task_id,
            state=state,
            restarts=n,
            stdout_start=now["stdout"],
            stderr_start=now["stderr"],
            previous_stdout_start=before["stdout"] if n else 0,
            previous_stderr_start=before["stderr"] if n else 0,
        )


def _started(client: Client, agent: ScriptedAgent) -> _Service:
    job = client.submit({"id": "svc", "kind": "service", "cpu": "1", "command": "exit 1"})
    launch = agent.launches.get(timeout=10)
    agent.report(launch.task_id, pb.TASK_STATE_RUNNING)
    wait_for("running", lambda: client.get(job).state is JobState.RUNNING)
    return _Service(agent, launch.task_id)


def _text(client: Client, stream: str = "stdout", previous: bool = False) -> str:
    return b"".join(client.logs("svc", stream=stream, previous=previous)).decode()


def test_the_next_restarts_status_recovers_a_lost_restarts_mark(master: ServerHandle) -> None:
    agent = ScriptedAgent(master.target, "s1")
    agent.keep_beating()
    try:
        with Client(master.target, timeout=10) as client:
            svc = _started(client, agent)
            svc.write("stdout", b"p0\n")
            svc.write("stderr", b"p0 err\n")
            svc.restart()
            svc.write("stdout", b"p1\n")
            svc.write("stderr", b"p1 err\n")
            svc.restart(lost=True)  # restart 2's status never reaches the master
            svc.write("stdout", b"p2\n")
            svc.restart()  # restart 3: p2 wrote no stderr
            svc.write("stdout", b"p3\n")
            svc.write("stderr", b"p3 err\n")
            wait_for("restart 3", lambda: client.get("svc").tasks[0].restarts == 3)
            wait_for("p3's output", lambda: _text(client, "stderr") == "p3 err\n")
            assert _text(client) == "p3\n"
            assert _text(client, previous=True) == "p2\n"  # not p1's and p2's run together
            assert _text(client, "stderr", previous=True) == ""  # p2's: none, not p1's
    finally:
        agent.close()


def test_the_runs_end_recovers_its_last_restarts_lost_mark(master: ServerHandle) -> None:
    agent = ScriptedAgent(master.target, "s1")
    agent.keep_beating()
    try:
        with Client(master.target, timeout=10) as client:
            svc = _started(client, agent)
            svc.write("stdout", b"p0\n")
            svc.restart()
            svc.write("stdout", b"p1\n")
            svc.restart(lost=True)
            svc.write("stdout", b"p2\n")
            end = svc.status(types_pb2.TASK_STATE_FAILED)
            end.message = "killed: time limit of 1m reached"
            agent.send(task_status=end)
            wait_for("the end", lambda: client.get("svc").state is JobState.FAILED)
            assert _text(client) == "p2\n"
            assert _text(client, previous=True) == "p1\n"
    finally:
        agent.close()


def test_a_stopped_runs_end_recovers_the_mark_too(master: ServerHandle) -> None:
    """Cancelled: the master no longer waits for the run's end, but the end's mark still counts
    (the task is not sent anywhere anew)."""
    agent = ScriptedAgent(master.target, "s1")
    agent.keep_beating()
    try:
        with Client(master.target, timeout=10) as client:
            svc = _started(client, agent)
            svc.write("stdout", b"p0\n")
            svc.restart(lost=True)
            svc.write("stdout", b"p1\n")
            client.cancel("svc")
            agent.kills.get(timeout=10)
            agent.send(task_status=svc.status(types_pb2.TASK_STATE_FAILED))
            wait_for("p1 marked", lambda: _text(client) == "p1\n")
            assert _text(client, previous=True) == "p0\n"
    finally:
        agent.close()


def test_a_status_sent_again_or_an_older_restarts_changes_no_mark(tmp_path: Path) -> None:
    logs = LogStore(tmp_path)
    logs.write("s/0", "stdout", 0, b"p0\np1\np2\n")
    logs.mark_restart("s/0", 2, {"stdout": 6}, {"stdout": 3})
    logs.mark_restart("s/0", 2, {"stdout": 9}, {"stdout": 6})  # the same count: nothing
    logs.mark_restart("s/0", 1, {"stdout": 3}, {"stdout": 0})  # an older one, late: nothing
    assert logs.read("s/0", "stdout", 0) == b"p2\n"
    assert logs.read("s/0", "stdout", 0, previous=True) == b"p1\n"


def test_the_agent_carries_its_latest_restart_on_every_later_status_of_the_run(
    tmp_path: Path,
) -> None:
    """A real agent's crash-looping service: each restart's status says where the process before
    started as well, and the run's end carries the latest restart again."""
    fake = FakeMaster()
    out = tmp_path / "n"
    try:
        with running_agent(fake.address, tmp_path / "agent"):
            wait_for("the stream", lambda: fake.heartbeats())
            command = [f'n=$(cat {out} 2>/dev/null || echo 0); echo $((n+1)) > {out}; echo "p$n"; exit 1']
            fake.launch("svc/0", command, service=True)
            statuses = fake.wait_running("svc/0", count=3, timeout=15)
            first, second = statuses[1], statuses[2]
            assert (first.restarts, first.stdout_start, first.previous_stdout_start) == (1, 3, 0)
            assert (second.restarts, second.stdout_start, second.previous_stdout_start) == (2, 6, 3)
            fake.kill("svc/0", "cancelled")
            end = fake.wait_final("svc/0")
        latest = [s for s in fake.statuses("svc/0") if s.state == RUNNING][-1]
        assert (end.restarts, end.stdout_start, end.previous_stdout_start) == (
            latest.restarts,
            latest.stdout_start,
            latest.previous_stdout_start,
        )
        assert end.restarts >= 2 and end.stderr_start == 0
    finally:
        fake.stop()


def test_an_agent_restarted_meanwhile_carries_the_adopted_services_latest_restart(tmp_path: Path) -> None:
    """The state file keeps where the latest restart's process's output starts: the next agent's
    restart of the adopted service says it as where the process before started."""
    work, go, runs, pidfile = tmp_path / "agent", tmp_path / "go", tmp_path / "runs", tmp_path / "pid"
    wait = f"while [ ! -e {go} ]; do sleep 0.05; done"
    command = (
        f'echo $$ > {pidfile}; echo run >> {runs}; echo "p$(wc -l < {runs} | tr -d " ")"; '
        f'[ "$(wc -l < {runs})" -lt 2 ] || {wait}; exit 1'
    )
    since = time.time() - 1
    pids: list[int] = []
    first = FakeMaster()
    try:
        with agent_process(first.address, work) as proc:
            wait_for("the stream", lambda: first.heartbeats(), timeout=10)
            first.launch("svc/0", [command], service=True)
            restart = first.wait_running("svc/0", count=2, timeout=10)[1]
            assert (restart.restarts, restart.stdout_start, restart.previous_stdout_start) == (1, 3, 0)
            wait_for("the second process", lambda: runs.read_text().count("run") == 2 and pidfile.read_text())
            pids.append(int(pidfile.read_text()))
            proc.kill()  # the agent dies; the service's process does not
            proc.wait(10)
        first.stop()
        second = FakeMaster(expected=("svc/0",))
        try:
            with agent_process(second.address, work) as proc:
                wait_for("the stream", lambda: second.heartbeats(), timeout=10)
                go.touch()  # the adopted process fails: the agent restarts it, its second restart
                again = second.wait_running("svc/0", timeout=10)[0]
                pids.append(int(pidfile.read_text()))
                second.kill("svc/0", "cancelled")
                second.wait_final("svc/0")
        finally:
            second.stop()
    finally:
        first.stop()
        kill_groups(pids, since)
    assert (again.restarts, again.stdout_start, again.previous_stdout_start) == (2, 6, 3)
