"""A user-level review of the node agent: --cpus/--memory above the machine's are refused (as
--help promised), an agent stopped on purpose takes its node out at once (as a kubelet or slurmd
going away does), and a service's process is restarted whatever its exit code (restartPolicy:
Always). Real parts throughout: the `gosched agent` program or AgentRunner agents, the master in
process on loopback gRPC, real shell tasks."""

import logging
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from gosched import Client
from gosched.agent.runner import AgentRunner, MoreThanTheMachine
from gosched.api.convert import node_to_proto
from gosched.common.node import NodeState
from gosched.common.states import JobState, TaskState
from gosched.proto.v1 import types_pb2 as pb
from tests.polling import stop_process
from tests.test_agent_gateway import (
    GOSCHED,
    ScriptedAgent,
    agent_program,
    connected,
    gateway_of,
    start_master,
    wait_for,
)
from tests.test_agent_gateway_races import Agent, agents_of, master_at

MACHINE_CPUS = psutil.cpu_count(logical=True) or 1
MACHINE_MEMORY = int(psutil.virtual_memory().total)


# == 1. --cpus / --memory: at most the machine's ======================================================
def agent_cli(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`gosched agent` with `flags`, toward a master that is not there: a refused flag ends it first."""
    argv = [str(GOSCHED), "agent", "--master", "127.0.0.1:1", "--name", "x1", "--work-dir", str(tmp_path)]
    return subprocess.run([*argv, *flags], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(
    ("flags", "named", "has"),
    [
        (("--cpus", str(MACHINE_CPUS + 98)), f"--cpus: {MACHINE_CPUS + 98} is", f"({MACHINE_CPUS:g} CPUs)"),
        (
            ("--cpus", f"{MACHINE_CPUS * 1000 + 1}m"),
            f"--cpus: {MACHINE_CPUS * 1000 + 1}m is",
            f"({MACHINE_CPUS:g} CPUs)",
        ),
        (("--memory", "100Ti"), "--memory: 100Ti is", f"({MACHINE_MEMORY / 2**30:.1f} GiB)"),
    ],
)
def test_advertising_more_than_the_machine_has_is_refused(
    tmp_path: Path, flags: tuple[str, ...], named: str, has: str
) -> None:
    """It registered "with 100 CPUs" on a 2-core machine, a warning aside, although --help says
    "less than the machine's": the scheduler then packed tasks onto room that is not there."""
    done = agent_cli(tmp_path, *flags)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert named in line and "more than this machine has" in line and has in line, line
    assert "registered" not in done.stdout


def test_the_runner_takes_the_machines_whole_cpus_and_memory_but_no_more(tmp_path: Path) -> None:
    common = {"work_dir": tmp_path, "nvml": None, "container_runtime": None}
    whole = AgentRunner("127.0.0.1:1", "x1", cpu_milli=MACHINE_CPUS * 1000, memory=MACHINE_MEMORY, **common)
    assert (whole.node.cpu_milli, whole.node.memory) == (MACHINE_CPUS * 1000, MACHINE_MEMORY)
    with pytest.raises(MoreThanTheMachine) as cpus:
        AgentRunner("127.0.0.1:1", "x1", cpu_milli=MACHINE_CPUS * 1000 + 1, **common)
    assert (cpus.value.resource, cpus.value.has) == ("cpu_milli", MACHINE_CPUS * 1000)
    with pytest.raises(MoreThanTheMachine) as memory:
        AgentRunner("127.0.0.1:1", "x1", memory=MACHINE_MEMORY + 1, **common)
    assert (memory.value.resource, memory.value.asked) == ("memory", MACHINE_MEMORY + 1)


# == 2. an agent stopped on purpose takes its node out at once ========================================
NODE_TIMEOUT_S = 30.0  # far longer than any wait below: no node is lost by a timeout here


def test_an_agent_stopped_on_purpose_makes_its_node_not_ready_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGTERM (no --keep-tasks-on-stop): the agent killed its task ("lost: agent shutdown"), but
    its node read ready and the task bound on it for node_timeout_s: the task, requeued, was bound
    straight back to the node whose agent had gone. Now the node goes not ready as the agent stops,
    the task is requeued as lost (before the node is given up: nothing is left on it then) and
    waits, bound nowhere, until an agent registers the node again."""
    caplog.set_level(logging.INFO, logger="gosched.api.agents")
    master = start_master(tmp_path / "g.db", node_timeout_s=NODE_TIMEOUT_S)
    procs = [agent_program(master.target, "n1", tmp_path / "agent")]
    try:
        with Client(master.target, timeout=10) as client:
            wait_for("the agent", lambda: connected(client, "n1"))
            client.submit({"id": "long7", "cpu": "0.1", "command": ["sleep 600"]})
            wait_for("running", lambda: client.get("long7").tasks[0].state is TaskState.RUNNING)
            procs[0].send_signal(signal.SIGTERM)
            _, err = procs[0].communicate(timeout=20)
            stopped = time.monotonic()
            assert procs[0].returncode == 0, err
            wait_for("the node not ready", lambda: client.node("n1").state is NodeState.NOT_READY, timeout=3)
            assert not connected(client, "n1")
            assert time.monotonic() - stopped < NODE_TIMEOUT_S / 3  # not the timeout's doing
            time.sleep(1.0)  # a scheduling pass or many: the task must not be bound to n1 again
            (task,) = client.get("long7").tasks
            assert task.node == "" and task.state is TaskState.PENDING, task
            assert client.node("n1").state is NodeState.NOT_READY
            # The lost report came first: the node had nothing left to requeue when it went.
            assert "agent n1 stopped: node not ready, 0 task(s) requeued" in caplog.text
            procs.append(agent_program(master.target, "n1", tmp_path / "agent"))
            wait_for("ready again", lambda: client.node("n1").state is NodeState.READY)
            wait_for("running again", lambda: client.get("long7").tasks[0].state is TaskState.RUNNING)
            assert client.get("long7").tasks[0].node == "n1"
    finally:
        for proc in procs:
            stop_process(proc, 15)
        master.stop()


def test_the_reports_a_stopping_agent_sent_before_its_stream_ended_are_applied_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stopping agent's last words (its task lost, its node not ready), then the end of its
    stream, all read while no tick ran: the lost report is applied before the node is given up, so
    the task is requeued as lost (its own report), not as a resident of a node lost."""
    caplog.set_level(logging.INFO, logger="gosched.api.agents")
    master = start_master(tmp_path / "g.db", node_timeout_s=NODE_TIMEOUT_S)
    agent = ScriptedAgent(master.target, "s1")
    try:
        with Client(master.target, timeout=10) as client:
            client.submit({"id": "t", "cpu": "1", "command": "sleep 600"})
            launch = agent.launches.get(timeout=10)
            agent.report(launch.task_id, pb.TASK_STATE_RUNNING)
            wait_for("running", lambda: client.get("t").tasks[0].state is TaskState.RUNNING)
            gateway = gateway_of(master)
            leaving = node_to_proto(replace(client.node("s1").node, state=NodeState.NOT_READY))
            with master.service.lock:  # no tick meanwhile: one batch holds all of it
                agent.report(launch.task_id, pb.TASK_STATE_FAILED, message="lost: agent shutdown")
                agent.send(node_update=leaving)  # as a stopping agent says it goes
                agent.outgoing.put(None)  # half-closed: the stream ends cleanly
                wait_for("the stream's end read", lambda: gateway._reports.left)
            wait_for("the node not ready", lambda: client.node("s1").state is NodeState.NOT_READY, timeout=3)
            wait_for("the stream gone", lambda: not connected(client, "s1"))
            assert "agent s1 stopped: node not ready, 0 task(s) requeued" in caplog.text
            (task,) = client.get("t").tasks
            assert task.node == "" and task.state is TaskState.PENDING, task
    finally:
        agent.close()
        master.stop()


def test_an_agent_that_keeps_its_tasks_on_stop_leaves_its_node_as_it_is(tmp_path: Path) -> None:
    """--keep-tasks-on-stop: a restart of the agent alone. The node stays ready and the task bound
    (and running) there; the next agent on the work dir adopts it."""
    master = start_master(tmp_path / "g.db", node_timeout_s=NODE_TIMEOUT_S)
    procs = [agent_program(master.target, "n1", tmp_path / "agent", "--keep-tasks-on-stop")]
    try:
        with Client(master.target, timeout=10) as client:
            wait_for("the agent", lambda: connected(client, "n1"))
            client.submit({"id": "kept", "cpu": "0.1", "command": ["sleep 600"]})
            wait_for("running", lambda: client.get("kept").tasks[0].state is TaskState.RUNNING)
            procs[0].send_signal(signal.SIGTERM)
            _, err = procs[0].communicate(timeout=20)
            assert procs[0].returncode == 0, err
            wait_for("the stream gone", lambda: not connected(client, "n1"))
            time.sleep(1.0)
            assert client.node("n1").state is NodeState.READY
            (task,) = client.get("kept").tasks
            assert (task.state, task.node) == (TaskState.RUNNING, "n1")
            procs.append(agent_program(master.target, "n1", tmp_path / "agent"))
            wait_for("the next agent", lambda: connected(client, "n1"))
            time.sleep(0.5)
            (task,) = client.get("kept").tasks
            assert (task.state, task.node, task.retries) == (TaskState.RUNNING, "n1", 0)
    finally:
        for proc in procs:
            stop_process(proc, 15)  # SIGTERM: the last agent kills the adopted task
        master.stop()


# == 3. a service's process is restarted whatever its exit code =======================================
def test_a_service_whose_process_exits_0_is_restarted_and_a_cancel_stops_it(tmp_path: Path) -> None:
    """A service whose process exited 0 ended `succeeded`, never restarted: a service runs until
    it is stopped (restartPolicy: Always), as the agent restarts one that fails."""
    runs = tmp_path / "runs"
    with (
        master_at(tmp_path / "g.db") as master,
        agents_of(master, tmp_path, "n1") as (agent,),
        Client(master.target, timeout=10) as client,
    ):
        client.submit({"id": "web", "kind": "service", "cpu": "0.1", "command": [f"echo run >> {runs}"]})
        wait_for("a restart", lambda: client.get("web").tasks[0].restarts >= 1)
        (task,) = client.get("web").tasks
        assert task.state is TaskState.RUNNING and task.last_restart_reason == "exit code 0", task
        assert agent.said("web/0 (service) exit code 0; restarting in 1s") >= 0, agent.lines
        assert agent.said("web/0 succeeded") == -1
        client.cancel("web")
        wait_for("cancelled", lambda: client.get("web").state is JobState.CANCELLED)
        seen = runs.read_text().count("run")
        time.sleep(2.5)  # past the next backoff (2 s): a cancelled service is not restarted
        assert runs.read_text().count("run") == seen


def test_a_batch_task_that_exits_0_is_not_restarted(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with (
        master_at(tmp_path / "g.db") as master,
        agents_of(master, tmp_path, "n1"),
        Client(master.target, timeout=10) as client,
    ):
        client.submit({"id": "b", "cpu": "0.1", "command": [f"echo run >> {runs}"]})
        wait_for("the end", lambda: client.get("b").state is JobState.SUCCEEDED)
        time.sleep(1.3)  # past a service's first backoff
        assert runs.read_text() == "run\n"


def test_a_services_restart_backoff_goes_on_in_the_agent_that_adopts_it(tmp_path: Path) -> None:
    """The backoff started over with the new agent: "restarting in 4s", then "1s" from the agent
    that adopted the service. The state file keeps it now."""
    runs, stop = tmp_path / "runs", tmp_path / "stop"
    # Two processes that fail at once (backoffs of 1 s, then 2 s), a third that fails when told.
    script = f"n=$(cat {runs} 2>/dev/null | wc -l); echo run >> {runs}; "
    script += f"if [ $n -ge 2 ]; then while [ ! -e {stop} ]; do sleep 0.05; done; fi; exit 1"
    with master_at(tmp_path / "g.db") as master:
        first = Agent(master.target, "n1", tmp_path / "n1")
        with Client(master.target, timeout=10) as client:
            wait_for("the agent", lambda: connected(client, "n1"))
            client.submit({"id": "svc", "kind": "service", "cpu": "0.1", "command": [script]})
            wait_for("the third process", lambda: client.get("svc").tasks[0].restarts == 2)
            assert first.said("svc/0 (service) exit code 1; restarting in 2s") >= 0, first.lines
            first.stop(kill_tasks=False)  # restarted: the next agent adopts the running service
            second = Agent(master.target, "n1", tmp_path / "n1")
            try:
                wait_for("adopted", lambda: second.said("adopted 1 running task(s)") >= 0)
                stop.touch()
                wait_for("the restart", lambda: second.said("svc/0 (service) exit code 1; restarting") >= 0)
                assert second.said("svc/0 (service) exit code 1; restarting in 4s") >= 0, second.lines
            finally:
                second.stop()
