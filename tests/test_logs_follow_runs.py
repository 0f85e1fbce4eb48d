"""A follower (`logs -f`) across a new run of its task: the reset moves the run it read to the
previous and the new run's output starts its file afresh, so the follower goes on from the new
run's start, not at the offset it had reached in the old one (which skipped the new run's first
bytes, or all of a shorter run's). Through real gRPC on loopback (a scripted agent), and on the
master's real log folder."""

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gosched import Client
from gosched.api.logs import LogStore
from gosched.api.server import ServerHandle
from gosched.common.states import JobState, TaskState
from gosched.proto.v1 import types_pb2
from gosched.proto.v1 import types_pb2 as pb
from tests.test_agent_gateway import ScriptedAgent, start_master, wait_for


@pytest.fixture
def master(tmp_path: Path) -> Iterator[ServerHandle]:
    handle = start_master(tmp_path / "g.db", failure_backoff_s=2.0)
    yield handle
    handle.stop()


def _chunk(agent: ScriptedAgent, task_id: str, offset: int, data: bytes) -> None:
    agent.send(log=types_pb2.LogChunk(task_id=task_id, stream="stdout", offset=offset, data=data))


def test_a_follower_of_a_task_waiting_to_run_again_reads_the_next_run_from_its_start(
    master: ServerHandle,
) -> None:
    agent = ScriptedAgent(master.target, "n1")
    agent.keep_beating()
    first = b"the first run's output, longer than the second's\n"
    try:
        with Client(master.target, timeout=10) as client:
            job = client.submit({"id": "re", "cpu": "1", "command": "true", "max_retries": 1})
            tid = agent.launches.get(timeout=10).task_id
            agent.report(tid, pb.TASK_STATE_RUNNING)
            _chunk(agent, tid, 0, first)
            agent.report(tid, pb.TASK_STATE_FAILED, exit_code=1)
            wait_for("the retry's wait", lambda: client.get(job).tasks[0].state is TaskState.PENDING)
            got: list[bytes] = []
            follower = threading.Thread(target=lambda: got.extend(client.logs(job, follow=True)), daemon=True)
            follower.start()
            wait_for("the first run read", lambda: b"".join(got) == first)
            tid = agent.launches.get(timeout=10).task_id  # the retry: a new run
            agent.report(tid, pb.TASK_STATE_RUNNING)
            _chunk(agent, tid, 0, b"second\n")
            agent.report(tid, pb.TASK_STATE_SUCCEEDED)
            wait_for("the end", lambda: client.get(job).state is JobState.SUCCEEDED)
            follower.join(10)
            assert not follower.is_alive()
            assert b"".join(got) == first + b"second\n"
    finally:
        agent.close()


def test_a_reader_behind_a_reset_finishes_the_run_it_reads_then_a_follower_goes_on(tmp_path: Path) -> None:
    """A reader that had not read its run to the end when the run was moved (a slow client): the
    rest of that run first, not the new run's bytes past the old offset; a plain read ends there,
    a follower goes on into the new run from its start."""
    logs = LogStore(tmp_path)
    logs.write("j/0", "stdout", 0, b"p0\n")
    logs.mark_restart("j/0", 1, {"stdout": 3})
    logs.write("j/0", "stdout", 3, b"run 1 process 1\n")
    follower = logs.reader("j/0", "stdout", 0, follow=True)
    plain = logs.reader("j/0", "stdout", 0)
    assert follower.read(6) == (0, b"run 1 ")  # the current process's, from its mark
    assert plain.read(6) == (0, b"run 1 ")
    logs.reset("j/0")
    logs.write("j/0", "stdout", 0, b"run 2, much longer than the first run\n")
    assert follower.read() == (6, b"process 1\n")
    assert plain.read() == (6, b"process 1\n")
    assert plain.read() == (16, b"")  # its run is over: a plain read ends
    assert follower.at_end() is False  # a new run is there to go on into
    assert follower.read() == (0, b"run 2, much longer than the first run\n")
    assert follower.read() == (38, b"")
    assert follower.at_end() is True
    logs.write("j/0", "stdout", 38, b"more\n")
    assert follower.read() == (38, b"more\n")
    follower.close()
    plain.close()


def test_a_follower_sees_a_run_that_wrote_nothing_yet_and_one_moved_before_it_wrote(tmp_path: Path) -> None:
    logs = LogStore(tmp_path)
    follower = logs.reader("j/0", "stdout", 0, follow=True)
    assert follower.read() == (0, b"")  # no output yet
    logs.write("j/0", "stdout", 0, b"first\n")
    assert follower.read() == (0, b"first\n")
    logs.reset("j/0")
    assert follower.read() == (0, b"")  # the new run wrote nothing yet
    logs.reset("j/0")  # nor did it before the next: the previous stays the first run's
    logs.write("j/0", "stdout", 0, b"third\n")
    assert follower.read() == (0, b"third\n")
    follower.close()
