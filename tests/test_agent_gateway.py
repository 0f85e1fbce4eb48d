"""The master's side of the agents, driven over real gRPC by a scripted agent: reports about a task
that is not (or no longer) placed on the reporting node are dropped, never applied to another run,
and an operator's cordon survives the node's loss and the agent's return."""

import json
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from typer.testing import CliRunner

from gosched import Client
from gosched.api import convert
from gosched.api.agents import AgentGateway
from gosched.api.server import ServerHandle, serve
from gosched.cli.main import app
from gosched.common.config import Settings
from gosched.common.node import AGENT_LABEL, RUNTIME_LABEL, Node, NodeState, make_node
from gosched.common.states import JobState, TaskState
from gosched.proto.v1 import agent_pb2, agent_pb2_grpc
from gosched.proto.v1 import types_pb2 as pb

TIMEOUT_S = 1.0


class ScriptedAgent:
    """Registers a node and holds the stream; the test decides what it reports."""

    def __init__(self, target: str, name: str, *, gpus: int = 0) -> None:
        self.channel = grpc.insecure_channel(target)
        stub = agent_pb2_grpc.AgentServiceStub(self.channel)
        # as an agent with a working docker labels its node (so tasks with an image may come)
        node = convert.node_to_proto(
            make_node(name, 4000, 8 * 2**30, gpus=gpus, labels={RUNTIME_LABEL: "docker"})
        )
        reply = stub.Register(agent_pb2.RegisterRequest(node=node, agent_version="test"), timeout=10)
        self.name, self.session = reply.node_name, reply.session_id
        self.outgoing: queue.Queue[agent_pb2.AgentMessage | None] = queue.Queue()
        self.launches: queue.Queue[agent_pb2.LaunchTask] = queue.Queue()
        self.kills: queue.Queue[agent_pb2.KillTask] = queue.Queue()
        self.send(heartbeat=agent_pb2.Heartbeat(time=time.time()))
        self.call = stub.Connect(self._messages())
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _messages(self) -> Iterator[agent_pb2.AgentMessage]:
        while (msg := self.outgoing.get()) is not None:
            yield msg

    def _read(self) -> None:
        try:
            for msg in self.call:
                if msg.WhichOneof("body") == "launch":
                    self.launches.put(msg.launch)
                elif msg.WhichOneof("body") == "kill":
                    self.kills.put(msg.kill)
        except grpc.RpcError:
            pass

    def send(self, **body: object) -> None:
        self.outgoing.put(agent_pb2.AgentMessage(node_name=self.name, session_id=self.session, **body))

    def report(self, task_id: str, state: int, exit_code: int = 0, message: str = "") -> None:
        status = agent_pb2.TaskStatus(task_id=task_id, state=state, exit_code=exit_code, message=message)
        self.send(task_status=status)

    def restarted(self, task_id: str, count: int, exit_code: int, message: str, at: float) -> None:
        """As an agent says it restarted a service's process: the run's count so far, and how the
        process before ended (and when)."""
        status = agent_pb2.TaskStatus(
            task_id=task_id,
            state=pb.TASK_STATE_RUNNING,
            exit_code=exit_code,
            message=message,
            restarts=count,
            last_exit_time=at,
        )
        self.send(task_status=status)

    def keep_beating(self, every_s: float = 0.05) -> None:
        """Heartbeat until closed, as a live agent does."""

        def beat() -> None:
            while not self.call.done():
                self.send(heartbeat=agent_pb2.Heartbeat(time=time.time()))
                time.sleep(every_s)

        threading.Thread(target=beat, daemon=True).start()

    def close(self) -> None:
        self.outgoing.put(None)
        self.call.cancel()
        self.channel.close()


def wait_for(what: str, check: Callable[[], object], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def start_master(store: Path, node_timeout_s: float = TIMEOUT_S, port: int = 0, **more: Any) -> ServerHandle:
    """A master on loopback, in process, with a short node timeout, on the store at `store` (and
    `port`, 0: a free one); `more`: other settings (TLS, token files)."""
    settings = Settings(
        store_path=str(store), shards=1, heartbeat_interval_s=0.2, node_timeout_s=node_timeout_s, **more
    )
    return serve(
        settings,
        (),
        grpc_port=port,
        http_port=None,
        host="127.0.0.1",
        runtime="local",
        heartbeat_interval_s=0.2,
        node_timeout_s=node_timeout_s,
        wait_ready=True,
    )


@pytest.fixture
def master(tmp_path: Path) -> Iterator[ServerHandle]:
    handle = start_master(tmp_path / "g.db")
    yield handle
    handle.stop()


def test_reports_about_tasks_not_placed_on_the_node_are_dropped(master: ServerHandle) -> None:
    agent = ScriptedAgent(master.target, "a1")
    try:
        with Client(master.target, timeout=10) as client:
            waiting = client.submit({"id": "waiting", "cpu": "64", "command": "true"})  # fits nowhere
            running = client.submit({"id": "runs", "cpu": "1", "command": "true", "image": "alpine:3"})
            launch = agent.launches.get(timeout=10)
            assert launch.task_id == f"{running}/0"
            assert launch.image == "alpine:3"  # the agent runs it in that container image
            agent.report(launch.task_id, pb.TASK_STATE_RUNNING)
            wait_for("running", lambda: client.get(running).state is JobState.RUNNING)
            # An old run's end, and a report about a task that is pending: neither is applied.
            agent.report(f"{waiting}/0", pb.TASK_STATE_FAILED, exit_code=1, message="exit code 1")
            agent.report("ghost/0", pb.TASK_STATE_SUCCEEDED)
            time.sleep(0.5)
            assert client.get(waiting).state is JobState.PENDING
            assert client.get(running).state is JobState.RUNNING
            assert master.service.alive
            agent.report(launch.task_id, pb.TASK_STATE_SUCCEEDED)
            wait_for("success", lambda: client.get(running).state is JobState.SUCCEEDED)
    finally:
        agent.close()


def test_explain_says_why_and_where_a_task_failed(master: ServerHandle) -> None:
    agent = ScriptedAgent(master.target, "f1")
    try:
        with Client(master.target, timeout=10) as client:
            for job_id, code, message, want in (
                ("exit3", 3, "", "task 0 failed: exit code 3 (on f1)"),
                (
                    "nobin",
                    127,
                    "failed to start: no such file",
                    "task 0 failed: failed to start: no such file (on f1)",
                ),
            ):
                client.submit({"id": job_id, "cpu": "1", "command": "true"})
                launch = agent.launches.get(timeout=10)
                agent.report(launch.task_id, pb.TASK_STATE_FAILED, exit_code=code, message=message)
                wait_for("the failure", lambda j=job_id: client.get(j).state is JobState.FAILED)
                assert want in client.explain(job_id)
                assert client.get(job_id).tasks[0].node == "f1"  # where it ran, after it ended
    finally:
        agent.close()


def test_a_cordon_outlives_the_loss_of_the_node(master: ServerHandle) -> None:
    agent = ScriptedAgent(master.target, "c1")
    with Client(master.target, timeout=10) as client:
        client.cordon("c1")
        agent.close()  # no more heartbeats: the node times out
        wait_for("the node lost", lambda: client.node("c1").state is NodeState.NOT_READY)
        back = ScriptedAgent(master.target, "c1")
        try:
            assert client.node("c1").state is NodeState.CORDONED
        finally:
            back.close()


def test_uncordoning_a_lost_node_leaves_it_not_ready_until_its_agent_returns(master: ServerHandle) -> None:
    agent = ScriptedAgent(master.target, "u2")
    with Client(master.target, timeout=10) as client:
        agent.close()
        wait_for("the node lost", lambda: client.node("u2").state is NodeState.NOT_READY)
        client.cordon("u2")
        assert client.cordon("u2", uncordon=True).state is NodeState.NOT_READY  # was: ready, for good
        job = client.submit({"id": "stray", "cpu": "1", "command": "true"})
        time.sleep(3 * TIMEOUT_S)
        assert client.get(job).state is JobState.PENDING  # nothing bound to the agentless node
        back = ScriptedAgent(master.target, "u2")
        try:
            assert client.node("u2").state is NodeState.READY  # the lifted cordon is not restored
            wait_for("the job placed", lambda: client.get(job).state is not JobState.PENDING)
        finally:
            back.close()


def test_an_uncordon_and_the_loss_of_the_node_do_not_interleave(master: ServerHandle) -> None:
    # The uncordon decided "ready" (the agent was there), the tick lost the node meanwhile, and
    # the uncordon then wrote ready: a node with no agent that never timed out again.
    gateway = next(
        hook.__self__
        for hook in master.service.tick_hooks
        if isinstance(getattr(hook, "__self__", None), AgentGateway)
    )
    decide = gateway.uncordoned_state

    def slow(node: Node) -> NodeState:
        state = decide(node)
        time.sleep(4 * TIMEOUT_S)  # the agent is silent by now: a tick here would lose the node
        return state

    gateway.uncordoned_state = slow  # type: ignore[method-assign]
    agent = ScriptedAgent(master.target, "r1")
    with Client(master.target, timeout=30) as client:
        client.cordon("r1")
        threading.Timer(0.3, agent.close).start()
        client.cordon("r1", uncordon=True)
        wait_for(
            "the node lost", lambda: client.node("r1").state is NodeState.NOT_READY, timeout=4 * TIMEOUT_S
        )
        back = ScriptedAgent(master.target, "r1")
        try:
            assert client.node("r1").state is NodeState.READY  # the lifted cordon stays lifted
        finally:
            back.close()


def test_a_node_update_relabels_the_node_and_keeps_its_cordon(master: ServerHandle) -> None:
    # The agent's docker daemon stopped, then started again: tasks with an image wait for it.
    agent = ScriptedAgent(master.target, "u1")

    def update(labels: dict[str, str]) -> None:
        # named otherwise on purpose: an agent speaks for the node of its session only
        agent.send(node_update=convert.node_to_proto(make_node("elsewhere", 4000, 8 * 2**30, labels=labels)))

    try:
        with Client(master.target, timeout=10) as client:
            client.cordon("u1")
            update({})
            wait_for(
                "the runtime label gone", lambda: RUNTIME_LABEL not in client.node("u1").node.label_dict()
            )
            assert client.node("u1").state is NodeState.CORDONED
            assert client.node("u1").node.label_dict()[AGENT_LABEL] == "true"  # still the agent's node
            assert [n.name for n in client.nodes()] == ["u1"]
            client.cordon("u1", uncordon=True)
            job = client.submit({"id": "img", "cpu": "1", "command": "true", "image": "alpine:3"})
            wait_for("why pending", lambda: "container runtime" in client.explain(job))
            assert agent.launches.empty()
            update({RUNTIME_LABEL: "docker"})
            assert agent.launches.get(timeout=10).task_id == f"{job}/0"
    finally:
        agent.close()


def test_a_rerun_replaces_the_last_runs_output(master: ServerHandle) -> None:
    agent = ScriptedAgent(master.target, "r1")
    try:
        with Client(master.target, timeout=10) as client:
            job = client.submit({"id": "rerun", "cpu": "1", "command": "true"})
            first = agent.launches.get(timeout=10)
            chunk = pb.LogChunk(task_id=first.task_id, stream="stdout", offset=0, data=b"first run, longer\n")
            agent.send(log=chunk)
            agent.report(first.task_id, pb.TASK_STATE_RUNNING)
            wait_for("the first output", lambda: b"".join(client.logs(job, 0)) == b"first run, longer\n")
            agent.report(first.task_id, pb.TASK_STATE_FAILED, message="lost: agent restarted")
            second = agent.launches.get(timeout=10)  # requeued, and placed on the one node again
            assert second.task_id == first.task_id
            assert (first.attempt, second.attempt) == (0, 1)  # the task is told it is a restart
            agent.send(log=pb.LogChunk(task_id=second.task_id, stream="stdout", offset=0, data=b"second\n"))
            agent.report(second.task_id, pb.TASK_STATE_RUNNING)
            agent.report(second.task_id, pb.TASK_STATE_SUCCEEDED)
            wait_for("success", lambda: client.get(job).state is JobState.SUCCEEDED)
            assert b"".join(client.logs(job, 0)) == b"second\n"
    finally:
        agent.close()


def test_after_a_master_restart_an_agent_gets_its_backoff_on_top_of_the_timeout(tmp_path: Path) -> None:
    """The agent of a node known from the store retries registering with backoff while the master
    is down (up to AGENT_MAX_BACKOFF_S apart): the restarted master must not declare the node lost,
    and requeue its tasks, before that agent could possibly have come back."""
    from gosched.common.node import AGENT_MAX_BACKOFF_S

    first = start_master(tmp_path / "g.db")
    agent = ScriptedAgent(first.target, "s1")
    with Client(first.target, timeout=10) as client:
        job = client.submit({"id": "stays", "cpu": "1", "command": "sleep 60"})
        agent.report(agent.launches.get(timeout=10).task_id, pb.TASK_STATE_RUNNING)
        wait_for("running", lambda: client.get(job).state is JobState.RUNNING)
    agent.close()
    first.stop()
    second = start_master(tmp_path / "g.db")  # the agent is "still backing off": it does not come back
    try:
        with Client(second.target, timeout=10) as client:
            restarted = time.monotonic()
            time.sleep(TIMEOUT_S + AGENT_MAX_BACKOFF_S / 2)  # the timeout alone has passed
            assert client.node("s1").state is NodeState.READY
            assert client.get(job).state is JobState.RUNNING
            wait_for("the node lost", lambda: client.node("s1").state is NodeState.NOT_READY)
            assert time.monotonic() - restarted >= TIMEOUT_S + AGENT_MAX_BACKOFF_S - 0.5
            wait_for("the task requeued", lambda: client.get(job).state is JobState.PENDING)
    finally:
        second.stop()


def connected(client: Client, name: str) -> bool:
    return any(n.name == name and n.agent_connected for n in client.nodes())


def test_a_second_agent_cannot_take_a_live_agents_node(tmp_path: Path) -> None:
    # A node timeout far longer than the test: the name comes free because the stream ended.
    master = start_master(tmp_path / "g.db", node_timeout_s=60)
    first = ScriptedAgent(master.target, "d1")
    first.keep_beating()
    try:
        with Client(master.target, timeout=10) as client:
            wait_for("the first agent's stream", lambda: connected(client, "d1"))
            with pytest.raises(grpc.RpcError) as refused:
                ScriptedAgent(master.target, "d1")
            assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
            assert "node d1 is held by another agent" in refused.value.details()
            # The first agent still holds the node: its tasks go to it.
            job = client.submit({"id": "stays", "cpu": "1", "command": "true"})
            assert first.launches.get(timeout=10).task_id == f"{job}/0"
            first.close()  # its stream ends (as when its process dies): it may come back at once
            wait_for("the stream's end", lambda: not connected(client, "d1"), timeout=5)
            back = ScriptedAgent(master.target, "d1")
            try:
                wait_for("the agent back", lambda: connected(client, "d1"), timeout=5)
                assert client.node("d1").state is NodeState.READY  # not lost meanwhile
                assert client.get(job).tasks[0].node == "d1"  # so its task was not requeued
            finally:
                back.close()
    finally:
        first.close()
        master.stop()


GOSCHED = Path(sys.executable).parent / "gosched"


def agent_program(target: str, name: str, work_dir: Path, *more: str) -> subprocess.Popen[str]:
    argv = [str(GOSCHED), "agent", "--master", target, "--name", name, "--work-dir", str(work_dir)]
    return subprocess.Popen(
        [*argv, "--grace", "1", *more], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_an_agent_program_on_a_taken_name_exits_and_a_killed_one_comes_back(tmp_path: Path) -> None:
    master = start_master(tmp_path / "g.db", node_timeout_s=60)
    procs: list[subprocess.Popen[str]] = []
    try:
        with Client(master.target, timeout=10) as client:
            procs.append(agent_program(master.target, "dup", tmp_path / "a"))
            wait_for("the first agent", lambda: connected(client, "dup"))
            procs.append(agent_program(master.target, "dup", tmp_path / "b"))  # same name, elsewhere
            out, err = procs[-1].communicate(timeout=30)
            assert procs[-1].returncode == 1, out + err
            assert "refused this agent: node dup is held by another agent" in err
            assert procs[0].poll() is None and connected(client, "dup")
            # kill -9 and straight back (as a supervisor restarts it): its old stream is gone,
            # so the name is its own again, long before the node timeout.
            procs[0].kill()
            procs[0].wait(10)
            procs.append(agent_program(master.target, "dup", tmp_path / "a"))
            wait_for("the restarted agent", lambda: connected(client, "dup"), timeout=10)
            assert procs[-1].poll() is None and client.node("dup").state is NodeState.READY
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.communicate(timeout=15)
        master.stop()


def test_a_node_is_deleted_only_once_its_agent_is_gone_and_its_tasks_may_go(tmp_path: Path) -> None:
    from gosched.api import errors

    master = start_master(tmp_path / "d.db", node_timeout_s=60.0)  # no loss by timeout meanwhile
    agent = ScriptedAgent(master.target, "d1")
    try:
        with Client(master.target, timeout=10) as client:
            client.submit({"id": "held", "cpu": "1", "command": "true"})
            launch = agent.launches.get(timeout=10)
            agent.report(launch.task_id, pb.TASK_STATE_RUNNING)
            with pytest.raises(errors.FailedPrecondition, match="has a connected agent"):
                client.delete_node("d1")
            agent.close()
            wait_for("the stream's end", lambda: not client.node("d1").agent_connected)
            with pytest.raises(errors.FailedPrecondition, match=r"holds 1 task\(s\) \(held/0\)"):
                client.delete_node("d1")
            assert client.node("d1").task_ids == ("held/0",)  # nothing was changed
            assert client.delete_node("d1", force=True) == ["held/0"]
            assert [n.name for n in client.nodes()] == []
            assert client.get("held").tasks[0].state is TaskState.PENDING  # queued again
            with pytest.raises(errors.NotFound):
                client.delete_node("d1")
            back = ScriptedAgent(master.target, "d1")  # the machine returns: a new node
            try:
                assert client.node("d1").state is NodeState.READY
                assert back.launches.get(timeout=10).task_id == "held/0"
            finally:
                back.close()
    finally:
        agent.close()
        master.stop()


def test_a_task_evicted_and_bound_to_the_same_node_again_is_killed_then_relaunched(
    master: ServerHandle,
) -> None:
    """Within one tick the task's id never left the node's residents, so the old run was neither
    killed nor replaced: it ran on beside whatever took its room, and the task stayed bound."""
    agent = ScriptedAgent(master.target, "r1")
    try:
        with Client(master.target, timeout=10) as client:
            client.submit({"id": "again", "cpu": "1", "command": "true"})
            first = agent.launches.get(timeout=10)
            assert first.attempt == 0
            agent.report(first.task_id, pb.TASK_STATE_RUNNING)
            wait_for("running", lambda: client.get("again").state is JobState.RUNNING)
            control = master.service.control
            with master.service.lock:  # no tick in between: released and bound again at once
                control.lost([first.task_id])
                for _ in range(50):
                    control.step()
                    if control.residents(["r1"])["r1"]:
                        break
                assert control.residents(["r1"])["r1"] == [first.task_id]
            kill = agent.kills.get(timeout=10)  # the old run is stopped first
            assert kill.task_id == first.task_id
            assert agent.launches.empty()
            agent.report(first.task_id, pb.TASK_STATE_FAILED, exit_code=143, message="killed")
            second = agent.launches.get(timeout=10)  # then the new run starts
            assert (second.task_id, second.attempt) == (first.task_id, 1)
            agent.report(second.task_id, pb.TASK_STATE_RUNNING)
            wait_for("running again", lambda: client.get("again").tasks[0].state is TaskState.RUNNING)
    finally:
        agent.close()


def test_following_a_cancelled_tasks_output_waits_for_the_last_words_of_its_run(master: ServerHandle) -> None:
    """The follow ended as soon as the cancel was taken, and missed what the task wrote while it
    was being stopped (its grace period)."""
    agent = ScriptedAgent(master.target, "w1")
    agent.keep_beating()  # the wait below is longer than this master's node timeout
    try:
        with Client(master.target, timeout=10) as client:
            client.submit({"id": "talk", "cpu": "1", "command": "true"})
            launch = agent.launches.get(timeout=10)
            agent.report(launch.task_id, pb.TASK_STATE_RUNNING)
            agent.send(log=pb.LogChunk(task_id=launch.task_id, stream="stdout", offset=0, data=b"up\n"))
            wait_for("running", lambda: client.get("talk").state is JobState.RUNNING)
            got: list[bytes] = []
            errs: list[BaseException] = []

            def follow() -> None:
                try:
                    got.extend(client.logs("talk", 0, follow=True))
                except BaseException as exc:  # seen by the assertion below
                    errs.append(exc)

            follower = threading.Thread(target=follow)
            follower.start()
            wait_for("the first words", lambda: b"".join(got) == b"up\n")
            client.cancel("talk")
            agent.kills.get(timeout=10)
            time.sleep(1.2)  # past the follow's own 0.5 s wait: it must still be waiting
            assert follower.is_alive()
            agent.send(log=pb.LogChunk(task_id=launch.task_id, stream="stdout", offset=3, data=b"term\n"))
            agent.report(launch.task_id, pb.TASK_STATE_FAILED, exit_code=143, message="killed: cancelled")
            follower.join(timeout=10)
            assert errs == []
            assert not follower.is_alive() and b"".join(got) == b"up\nterm\n"
    finally:
        agent.close()


# (what the running low-priority task holds, what the high-priority arrival asks for, whether the
# arrival's launch waits for the victim's end). The node: 4 cores, 8 GiB, 2 GPUs.
PREEMPTIONS = [
    ("same GPU", {"gpus": 1, "cpu": "1"}, {"gpus": 2, "cpu": "1"}, True),
    ("memory", {"cpu": "1", "memory": "6Gi"}, {"cpu": "1", "memory": "6Gi"}, True),
    ("CPU only", {"cpu": "3"}, {"cpu": "3"}, False),  # a core shared for the grace period: no harm
]


@pytest.mark.parametrize("case, low, high, waits", PREEMPTIONS, ids=[c[0] for c in PREEMPTIONS])
def test_a_preemptor_starts_once_its_victim_has_ended_when_they_would_share_a_gpu_or_memory(
    master: ServerHandle, case: str, low: dict[str, object], high: dict[str, object], waits: bool
) -> None:
    """The binder hands the victim's room over when it evicts it; the victim runs on through its
    grace period. A launch onto a GPU or memory the victim still holds waits for its end."""
    agent = ScriptedAgent(master.target, "p1", gpus=2)
    agent.keep_beating()
    try:
        with Client(master.target, timeout=10) as client:
            client.submit({"id": "low", "priority": 0, "command": "sleep 100", **low})
            victim = agent.launches.get(timeout=10)
            agent.report(victim.task_id, pb.TASK_STATE_RUNNING)
            wait_for("low running", lambda: client.get("low").state is JobState.RUNNING)
            client.submit({"id": "high", "priority": 100, "command": "true", **high})
            kill = agent.kills.get(timeout=10)
            assert kill.task_id == victim.task_id
            if waits:
                with pytest.raises(queue.Empty):  # the victim has not ended: nothing starts on its room
                    agent.launches.get(timeout=1.5)
                assert client.get("high").tasks[0].state is TaskState.BOUND
                agent.report(victim.task_id, pb.TASK_STATE_FAILED, exit_code=143, message="killed: preempted")
            launch = agent.launches.get(timeout=10)
            assert launch.task_id == "high/0"
            if not waits:  # started beside the victim still stopping
                assert agent.kills.empty() and client.get("low").tasks[0].state is not TaskState.RUNNING
    finally:
        agent.close()


# == restarts of a service's task, as its agent reports them =========================================
def gateway_of(master: ServerHandle) -> AgentGateway:
    return next(
        hook.__self__
        for hook in master.service.tick_hooks
        if isinstance(getattr(hook, "__self__", None), AgentGateway)
    )


def cli(master: ServerHandle, *args: str) -> str:
    command, *rest = args
    result = CliRunner().invoke(app, [command, "--master", master.target, *rest])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_a_services_restarts_reach_the_master_and_start_over_when_it_is_placed_anew(
    master: ServerHandle,
) -> None:
    """The agent restarted a crash-looping service and the master showed it running, healthy."""
    agent = ScriptedAgent(master.target, "s1")
    agent.keep_beating()
    ended_at = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
    try:
        with Client(master.target, timeout=10) as client:
            job = client.submit({"id": "svc", "kind": "service", "cpu": "1", "command": "exit 1"})
            launch = agent.launches.get(timeout=10)
            assert launch.service
            tid = launch.task_id
            agent.report(tid, pb.TASK_STATE_RUNNING)
            wait_for("running", lambda: client.get(job).state is JobState.RUNNING)
            assert client.get(job).tasks[0].restarts == 0
            agent.restarted(tid, 1, 1, "exit code 1", ended_at - 30)
            agent.restarted(tid, 2, 137, "OOM killed", ended_at)
            wait_for("two restarts", lambda: client.get(job).tasks[0].restarts == 2)
            task = client.get(job).tasks[0]
            assert (task.state, task.last_restart_reason, task.last_restart_time) == (
                TaskState.RUNNING,
                "OOM killed",
                ended_at,
            )
            assert client.get(job).state is JobState.RUNNING  # restarts do not end the run
            said = (
                "task 0 restarted 2 times by its agent, "
                "the latest after OOM killed at 2023-11-14 22:13:20 UTC (on s1)"
            )
            assert said in client.explain(job)

            # The CLI: a RESTARTS column in `get` (with how long ago), the reason in describe.
            table = cli(master, "get", job)
            assert re.search(r"^INDEX\s+TASK\s+ROLE\s+STATE\s+RESTARTS\s+NODE\s+GPUS$", table, re.M), table
            assert re.search(r"^0\s+svc/0\s+main\s+running\s+2 \(\d+[smhdy] ago\)\s+s1\s+-$", table, re.M), (
                table
            )
            (data,) = json.loads(cli(master, "get", job, "-o", "json"))["tasks"]
            assert (data["restarts"], data["last_restart_reason"], data["last_restart_time"]) == (
                2,
                "OOM killed",
                ended_at,
            )
            assert said in cli(master, "describe", job)
            assert said in cli(master, "explain", job)

            # Evicted and bound to the node again: a new attempt, counted from 0. A restart report
            # of the old run that comes before the gateway stops it is not the new run's.
            gateway, control = gateway_of(master), master.service.control
            with master.service.lock:  # no tick in between
                control.lost([tid])
                for _ in range(50):
                    control.step()
                    if control.residents(["s1"])["s1"]:
                        break
                assert control.residents(["s1"])["s1"] == [tid]
                assert master.service.get(job).tasks[0].restarts == 0
                agent.restarted(tid, 3, 1, "exit code 1", ended_at + 10)
                wait_for("the old run's report queued", lambda: gateway._reports.restarts)
            assert agent.kills.get(timeout=10).task_id == tid  # the tick took the report meanwhile
            assert client.get(job).tasks[0].restarts == 0
            assert "restarted" not in client.explain(job)
            agent.report(tid, pb.TASK_STATE_FAILED, exit_code=143, message="killed: preempted")
            second = agent.launches.get(timeout=10)
            assert (second.task_id, second.attempt) == (tid, 1)
            agent.report(tid, pb.TASK_STATE_RUNNING)
            agent.restarted(tid, 1, 1, "exit code 1", ended_at + 20)  # the new run's own count
            wait_for("the new run's restart", lambda: client.get(job).tasks[0].restarts == 1)
            assert client.get(job).tasks[0].last_restart_time == ended_at + 20
            # A cancelled service keeps what its last run went through.
            client.cancel(job)
            assert agent.kills.get(timeout=10).task_id == tid
            agent.report(tid, pb.TASK_STATE_FAILED, exit_code=143, message="killed: cancelled")
            wait_for("cancelled", lambda: client.get(job).state is JobState.CANCELLED)
            assert client.get(job).tasks[0].restarts == 1
    finally:
        agent.close()


def test_a_real_agent_reports_a_crash_looping_service(tmp_path: Path) -> None:
    """A real `gosched agent` process restarts a service whose command exits 1 (backoff 1 s, then
    2 s): `get` shows the restarts grow, with the exit code, and a new placement starts over."""
    master = start_master(tmp_path / "g.db", node_timeout_s=10.0)
    proc = agent_program(master.target, "crash", tmp_path / "agent")
    started = time.time()
    try:
        with Client(master.target, timeout=10) as client:
            wait_for("the agent", lambda: connected(client, "crash"))
            job = client.submit({"id": "loop", "kind": "service", "cpu": "1", "command": ["echo up; exit 1"]})

            def restarted(at_least: int) -> Callable[[], object]:
                return lambda: client.get(job).tasks[0].restarts >= at_least

            wait_for("a restart", restarted(1), timeout=20)
            wait_for("another restart", restarted(2), timeout=20)  # it grows
            task = client.get(job).tasks[0]
            assert task.state is TaskState.RUNNING and task.node == "crash"
            assert task.last_restart_reason == "exit code 1"
            assert started <= task.last_restart_time <= time.time()
            assert "the latest after exit code 1 at " in client.explain(job)
            argv = [str(GOSCHED), "get", job, "--master", master.target]
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, out.stderr
            row = re.search(
                r"^0\s+loop/0\s+main\s+running\s+(\d+) \(\d+s ago\)\s+crash\s+-$", out.stdout, re.M
            )
            assert row is not None and int(row.group(1)) >= 2, out.stdout

            # Placed anew (lost, and bound to the one node again): counted from 0.
            tid = task.id
            with master.service.lock:
                master.service.control.lost([tid])
            assert client.get(job).tasks[0].restarts == 0
            got: list[Any] = []

            def first_restart_of_the_new_run() -> bool:
                got[:] = [client.get(job).tasks[0]]
                return got[0].restarts >= 1

            wait_for("the new run's restart", first_restart_of_the_new_run, timeout=20)
            assert got[0].restarts == 1 and got[0].last_restart_reason == "exit code 1"
            client.cancel(job)
    finally:
        proc.terminate()
        proc.communicate(timeout=15)
        master.stop()


def test_a_registration_naming_a_built_in_resource_as_extended_is_refused(master: ServerHandle) -> None:
    """An agent of another make (or an old one) that advertises `nvidia.com/gpu` as an extended
    resource beside its GPUs: the master refuses it, naming the field, rather than hold a resource
    no task can ask for (a job's `extended` refuses the name)."""
    node = convert.node_to_proto(make_node("odd", 4000, 8 * 2**30, extended={"nvidia.com/gpu": 8}))
    with grpc.insecure_channel(master.target) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Register(agent_pb2.RegisterRequest(node=node, agent_version="test"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "extended['nvidia.com/gpu']" in (caught.value.details() or "")
    assert "built-in resource" in (caught.value.details() or "")
    with Client(master.target, timeout=10) as client:
        assert "odd" not in {n.node.name for n in client.nodes()}


def test_a_restarted_services_logs_show_its_current_process_and_previous_the_last(tmp_path: Path) -> None:
    """A real agent restarts a crash-looping service within its run: `logs` shows the current
    process's output alone, `logs --previous` the process's before (as `kubectl logs` and
    `--previous` do for a restarted container), the stream order marking where each starts; and
    once the task is placed anew, the previous run is the last process of the old run."""
    master = start_master(tmp_path / "g.db", node_timeout_s=10.0)
    proc = agent_program(master.target, "svc", tmp_path / "agent")
    try:
        with Client(master.target, timeout=10) as client:
            wait_for("the agent", lambda: connected(client, "svc"))
            command = [
                'n=$(cat "$HOME/n" 2>/dev/null || echo 0); echo $((n+1)) > "$HOME/n"; echo "run $n"; exit 1'
            ]
            env = {"HOME": str(tmp_path)}
            job = client.submit({"id": "cl", "kind": "service", "cpu": "1", "command": command, "env": env})

            def text(previous: bool = False) -> str:
                return b"".join(client.logs(job, previous=previous)).decode()

            def runs(at_least: int) -> Callable[[], object]:
                return lambda: client.get(job).tasks[0].restarts >= at_least and text().strip()

            wait_for("two restarts", runs(2), timeout=30)
            restarts = client.get(job).tasks[0].restarts
            current, previous = text(), text(previous=True)
            # each is one process's line: the counter tells which (a restart may come in between)
            assert re.fullmatch(r"run \d+\n", current), current
            assert re.fullmatch(r"run \d+\n", previous), previous
            assert int(previous.split()[1]) == int(current.split()[1]) - 1
            assert int(current.split()[1]) >= restarts - 1
            tid = client.get(job).tasks[0].id
            with master.service.lock:  # placed anew: the old run's last process is the previous
                master.service.control.lost([tid])
            wait_for("the new run's output", lambda: client.get(job).tasks[0].restarts >= 1 and text())
            before = text(previous=True)
            assert re.fullmatch(r"run \d+\n", before), before
            client.cancel(job)
    finally:
        proc.terminate()
        proc.communicate(timeout=15)
        master.stop()
