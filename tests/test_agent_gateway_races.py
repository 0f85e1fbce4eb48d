"""Races between the agent gateway and real agents: a kill, a launch or a task's output that crosses
a node loss, a reconnect, a placement elsewhere or a master restart. Real parts throughout: the
master in process (loopback gRPC), AgentRunner agents in threads, real shell tasks."""

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gosched import Client
from gosched.agent.runner import AgentRunner
from gosched.agent.tasks import TaskRecord
from gosched.api.server import ServerHandle
from gosched.common.states import JobState, TaskState
from tests.test_agent_gateway import connected, gateway_of, start_master, wait_for

KILL_GRACE_S = 3.0  # the master's kill grace here: a kill never answered expires after 3 + 5 s
# A task that takes a while to stop after SIGTERM, so that a kill has a grace period to race with.
SLOW_STOP = "trap 'sleep 1.5; exit 0' TERM; while true; do sleep 0.1; done"


class Agent:
    """A real agent in a thread of this process (its node labelled host=<name>), with what it
    says kept in `lines`."""

    def __init__(self, target: str, name: str, work_dir: Path, **options: Any) -> None:
        self.lines: list[str] = []
        self.runner = AgentRunner(
            target,
            name,
            work_dir=work_dir,
            labels={"host": name},
            shutdown_grace_s=1.0,
            echo=self.lines.append,
            nvml=None,
            container_runtime=None,
            **options,
        )
        self.thread = threading.Thread(target=self.runner.run, daemon=True)
        self.thread.start()

    def said(self, text: str, *, last: bool = False) -> int:
        """The index of the first (or last) line that says `text`; -1 if none does."""
        found = [i for i, line in enumerate(list(self.lines)) if text in line]
        return -1 if not found else found[-1 if last else 0]

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))

    def ended(self, task_id: str) -> int:
        """The index of the line that says a run of the task ended (killed, or stopped as stale)."""
        return next(
            (
                i
                for i, line in enumerate(list(self.lines))
                if line.startswith(f"{task_id} ") and ("killed" in line or "stopped" in line)
            ),
            -1,
        )

    def record(self, task_id: str) -> Callable[[Callable[[TaskRecord], bool]], bool]:
        """A check of the agent's record of the task, taken under the agent's lock."""

        def check(test: Callable[[TaskRecord], bool]) -> bool:
            with self.runner._lock:
                tasks = self.runner._tasks
                rec = tasks.records.get(task_id) if tasks is not None else None
                return rec is not None and test(rec)

        return check

    def running(self) -> list[str]:
        return self.runner.running_task_ids()

    def stop(self, kill_tasks: bool = True) -> None:
        self.runner.stop(kill_tasks)
        self.thread.join(15)
        assert not self.thread.is_alive(), "the agent did not stop"


@contextmanager
def agents_of(master: ServerHandle, root: Path, *names: str, **options: Any) -> Iterator[list[Agent]]:
    """Agents named `names` registered with `master`; stopped (their tasks killed) at the end."""
    running = [Agent(master.target, name, root / name, **options) for name in names]
    try:
        with Client(master.target, timeout=10) as client:
            wait_for("the agents", lambda: all(connected(client, name) for name in names))
        yield running
    finally:
        for agent in running:
            if agent.thread.is_alive():
                agent.stop()


def start(store: Path, port: int = 0, node_timeout_s: float = 30.0, **more: Any) -> ServerHandle:
    """A master on `store` (and `port`, to come back where agents look for it) whose kills have a
    short grace period; a long node timeout: no node is lost unless a test says so. `more`:
    other settings."""
    handle = start_master(store, node_timeout_s=node_timeout_s, port=port, **more)
    gateway_of(handle).kill_grace_s = KILL_GRACE_S
    return handle


@contextmanager
def master_at(store: Path, **more: Any) -> Iterator[ServerHandle]:
    handle = start(store, **more)
    try:
        yield handle
    finally:
        handle.stop()


def reconnect(master: ServerHandle, agent: Agent) -> None:
    """The master ends the agent's stream (as a network blip would); the agent registers again."""
    gateway, name = gateway_of(master), agent.runner.name
    before = agent.runner._link.session
    with gateway._lock:
        session = gateway.sessions[name]
    session.outbox.put(None)
    wait_for("registered again", lambda: agent.runner._link.session not in (None, before))


def evict_and_bind_again(master: ServerHandle, task_id: str, node: str) -> None:
    """Within one tick (the task's id never leaves the node's residents): a new run of the task."""
    control = master.service.control
    with master.service.lock:
        control.lost([task_id])
        for _ in range(50):
            control.step()
            if control.residents([node])[node]:
                break
        assert control.residents([node])[node] == [task_id]


def log_of(client: Client, job: str) -> bytes:
    return b"".join(client.logs(job, 0))


# == a launch waiting for a stale run, killed meanwhile ===============================================
def test_a_launch_waiting_for_a_stale_run_never_starts_once_its_task_is_cancelled(tmp_path: Path) -> None:
    """The master lost the node (missed heartbeats) and requeued its task; the agent, back, stops
    the run the master no longer expects and keeps the new launch of the task until that run has
    ended. The job was cancelled meanwhile: the launch started all the same once the old run had
    ended, and the task ran on for good, with nothing on the master to stop it."""
    with master_at(tmp_path / "g.db") as master, agents_of(master, tmp_path, "n1") as (agent,):
        gateway = gateway_of(master)
        with Client(master.target, timeout=10) as client:
            client.submit({"id": "t", "cpu": "0.1", "command": [SLOW_STOP]})
            wait_for("running", lambda: client.get("t").tasks[0].state is TaskState.RUNNING)
            with gateway._lock:  # silent for long (a network partition): the master loses the node
                gateway.sessions["n1"].last_seen -= 100
            waiting = agent.record("t/0")
            wait_for("the launch kept waiting", lambda: waiting(lambda r: r.relaunch is not None))
            client.cancel("t")
            wait_for("the kill of the waiting launch", lambda: gateway.stopping("t/0"))
            wait_for("the stale run's end", lambda: agent.said("t/0 stopped") >= 0)
            # That end is the kill's: the gateway is done with the kill now, not once it expires.
            wait_for("the kill over", lambda: not gateway.stopping("t/0"), timeout=2.0)
            time.sleep(0.5)
            assert agent.running() == []
            assert agent.count("t/0 started") == 1, agent.lines  # the first run only
            assert client.get("t").state is JobState.CANCELLED


# == a reconnect while a run is being killed ========================================================
def test_a_reconnect_during_a_kill_takes_the_old_runs_end_for_the_kill_not_for_the_new_run(
    tmp_path: Path,
) -> None:
    """A task evicted and bound to the same node again: its old run is killed, and the new run waits
    for its end. The agent's stream broke in the kill's grace period and it registered again: the
    new session forgot the kill, so the old run's "killed" end was taken as the new run's, and the
    job failed although its new run never started."""
    with master_at(tmp_path / "g.db") as master, agents_of(master, tmp_path, "n1") as (agent,):
        gateway = gateway_of(master)
        with Client(master.target, timeout=10) as client:
            client.submit({"id": "t", "cpu": "0.1", "command": [SLOW_STOP]})
            wait_for("running", lambda: client.get("t").tasks[0].state is TaskState.RUNNING)
            evict_and_bind_again(master, "t/0", "n1")
            killed = agent.record("t/0")
            wait_for("the old run being killed", lambda: killed(lambda r: r.killed is not None))
            reconnect(master, agent)
            assert gateway.stopping("t/0")  # still: the old run has not ended
            # Its end comes (long before the kill would expire), then the new run starts.
            wait_for("the new run", lambda: agent.count("t/0 started") == 2, timeout=KILL_GRACE_S + 2)
            assert -1 < agent.ended("t/0") < agent.said("t/0 started", last=True)
            wait_for("running again", lambda: client.get("t").tasks[0].state is TaskState.RUNNING)
            time.sleep(0.5)
            assert client.get("t").state is JobState.RUNNING
            assert "failed" not in client.explain("t")
            assert agent.running() == ["t/0"]


@pytest.mark.parametrize("reconnect_when", ["while the victim is being killed", "before the kill"])
def test_the_room_of_a_victim_stays_taken_across_a_reconnect_until_its_end(
    tmp_path: Path, reconnect_when: str
) -> None:
    """A preemptor waits for its victim's end where both would not fit in the machine's memory,
    whenever the agent registered again: in the victim's grace period (the new session forgot
    the run being killed), or while it still ran (the new session carried what the runs being
    killed held, not what the running ones did). Either way the preemptor started beside the
    victim, on memory it still held."""
    with (
        master_at(tmp_path / "g.db") as master,
        agents_of(master, tmp_path, "n1", memory=2**30) as (agent,),
        Client(master.target, timeout=10) as client,
    ):
        task = {"cpu": "0.1", "memory": "768Mi"}
        client.submit({"id": "low", "priority": 0, "command": [SLOW_STOP], **task})
        wait_for("low running", lambda: client.get("low").tasks[0].state is TaskState.RUNNING)
        if reconnect_when == "before the kill":
            reconnect(master, agent)  # low runs on, carried over to the new session
            wait_for("the new stream", lambda: connected(client, "n1"))
        client.submit({"id": "high", "priority": 100, "command": ["sleep 30"], **task})
        victim = agent.record("low/0")
        wait_for("the victim being killed", lambda: victim(lambda r: r.killed is not None))
        if reconnect_when == "while the victim is being killed":
            reconnect(master, agent)
        wait_for("the preemptor started", lambda: agent.said("high/0 started") >= 0, timeout=KILL_GRACE_S + 2)
        assert -1 < agent.ended("low/0") < agent.said("high/0 started"), agent.lines
        assert agent.running() == ["high/0"]


# == the last words of a run stopped on another node ================================================
def test_the_last_words_of_a_run_stopped_elsewhere_stay_out_of_the_new_runs_log(tmp_path: Path) -> None:
    """A task preempted on n1 and placed on n2 at once: what its old run wrote in its grace period
    on n1 came after the new run's launch had started the task's log afresh, and landed in the new
    run's log. The last words of the run a cancel stops still arrive."""
    talker = (
        "echo start; trap 'for i in 1 2 3; do echo last-words-$i; sleep 0.2; done; exit 0' TERM; "
        "while true; do sleep 0.1; done"
    )
    with (
        master_at(tmp_path / "g.db") as master,
        agents_of(master, tmp_path, "n1", "n2", cpu_milli=2000) as (a1, a2),
        Client(master.target, timeout=10) as client,
    ):
        gateway = gateway_of(master)
        client.cordon("n2")
        client.submit({"id": "low", "cpu": "1.5", "priority": 0, "command": [talker]})
        wait_for("low's output on n1", lambda: log_of(client, "low") == b"start\n")
        client.cordon("n2", uncordon=True)
        high = {"id": "high", "cpu": "1.5", "priority": 100, "node_selector": {"host": "n1"}}
        client.submit({**high, "command": ["sleep 30"]})
        wait_for("low on n2", lambda: client.get("low").tasks[0].node == "n2")
        wait_for("the old run's end", lambda: a1.ended("low/0") >= 0 and not gateway.stopping("low/0"))
        wait_for("the new run's output", lambda: log_of(client, "low") == b"start\n")
        time.sleep(0.5)  # whatever else came from n1 by now
        assert log_of(client, "low") == b"start\n"
        assert (tmp_path / "n2" / "logs" / "low_0.out").read_bytes() == b"start\n"
        client.cancel("low")  # the run on n2 says its last words: they are its own
        words = b"start\n" + b"".join(b"last-words-%d\n" % i for i in (1, 2, 3))
        wait_for("the last words of the cancelled run", lambda: log_of(client, "low") == words)
        wait_for("the cancelled run's end", lambda: a2.ended("low/0") >= 0)
        assert log_of(client, "low") == words


# == tasks bound while the agent was away ==========================================================
def test_tasks_bound_while_the_agents_stream_was_down_are_launched_not_lost(tmp_path: Path) -> None:
    """The agent's stream was down (its process restarted, within the node timeout) when a gang
    was bound to its node. Back, it was told to expect the gang's tasks, which it never had: it
    answered "lost" and the master evicted the gang and placed it again (a wasted attempt)."""
    command = ["echo attempt=$GOSCHED_ATTEMPT; sleep 30"]
    with master_at(tmp_path / "g.db") as master, Client(master.target, timeout=10) as client:
        with agents_of(master, tmp_path, "n1") as (agent,):
            agent.stop(kill_tasks=False)
            wait_for("the stream down", lambda: not connected(client, "n1"))
            client.submit({"id": "g", "cpu": "0.1", "replicas": 2, "min_member": 2, "command": command})
            wait_for("bound while away", lambda: all(t.node == "n1" for t in client.get("g").tasks))
        with agents_of(master, tmp_path, "n1") as (back,):
            wait_for("the gang running", lambda: client.get("g").state is JobState.RUNNING)
            time.sleep(0.5)
            assert client.get("g").state is JobState.RUNNING
            assert "lost" not in client.explain("g")
            for index in (0, 1):
                assert b"".join(client.logs("g", index)) == b"attempt=0\n"
            assert back.running() == ["g/0", "g/1"]


def test_after_a_master_restart_the_agents_tasks_are_expected_and_tasks_bound_meanwhile_launched(
    tmp_path: Path,
) -> None:
    """After a master restart the agent's running tasks are the master's to expect (else the agent
    would kill them), while a task bound to the node before the agent came back is launched."""
    store, root = tmp_path / "g.db", tmp_path / "agents"
    first = start(store)
    port = first.grpc_port
    try:
        with agents_of(first, root, "n1") as (agent,), Client(first.target, timeout=10) as client:
            client.submit({"id": "a", "cpu": "0.1", "command": ["echo a=$GOSCHED_ATTEMPT; sleep 30"]})
            wait_for("a's output", lambda: log_of(client, "a") == b"a=0\n")
            agent.stop(kill_tasks=False)  # its task runs on: the next agent process adopts it
    finally:
        first.stop()
    second = start(store, port)
    try:
        with Client(second.target, timeout=10) as client:
            wait_for("the node adopted", lambda: "n1" in gateway_of(second).sessions)
            client.submit({"id": "b", "cpu": "0.1", "command": ["echo b=$GOSCHED_ATTEMPT; sleep 30"]})
            wait_for("b bound while the agent is away", lambda: client.get("b").tasks[0].node == "n1")
            with agents_of(second, root, "n1") as (back,):
                wait_for("b running", lambda: client.get("b").state is JobState.RUNNING)
                wait_for("b's output", lambda: log_of(client, "b") == b"b=0\n")
                time.sleep(0.5)
                assert back.said("adopted 1 running task(s)") >= 0
                assert back.running() == ["a/0", "b/0"]
                assert client.get("a").state is JobState.RUNNING
                assert log_of(client, "a") == b"a=0\n"  # the same run, never killed nor run again
                assert "lost" not in client.explain("a") + client.explain("b")
    finally:
        second.stop()
