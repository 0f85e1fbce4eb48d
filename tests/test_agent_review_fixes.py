"""Regression tests for the node agent and the agent gateway: a kill lost with a dying stream, log
bytes queued but unsent when the agent restarts, a kill in progress across an agent restart, the
GPU order a task sees, NVML GPUs that cannot be opened, NVSwitch systems, tiny CPU quotas.

Real parts throughout: the master in process (loopback gRPC), AgentRunner agents, real shell
tasks; NVML through the discovery tests' stand-in; cgroups in a temp dir standing in for the root.
"""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gosched import Client
from gosched.agent import tasks as agent_tasks
from gosched.agent.cgroups import CgroupSupport, TaskCgroup, detect
from gosched.agent.discovery import discover, discover_gpus
from gosched.agent.executor import ShellExecutor, TaskSpec
from gosched.agent.outbox import Outbox
from gosched.agent.state import StateFile
from gosched.agent.tasks import TaskTable
from gosched.api.convert import node_from_proto, node_to_proto
from gosched.common.states import JobState, TaskState
from gosched.proto.v1 import agent_pb2, types_pb2
from tests.test_agent_discovery import FakeNvml
from tests.test_agent_gateway import connected, gateway_of, wait_for
from tests.test_agent_gateway_races import (
    KILL_GRACE_S,
    SLOW_STOP,
    Agent,
    agents_of,
    log_of,
    master_at,
    reconnect,
)


# == 1. a kill lost with the old stream ===============================================================
def test_a_kill_the_old_stream_lost_is_sent_again_to_the_agents_new_session(tmp_path: Path) -> None:
    """A cancel's kill went out on a stream that was dying (it never reached the agent), and the
    agent registered again. The kill carried over to the new session but was never sent on it: it
    expired after its grace period and the cancelled task ran on for good."""
    with master_at(tmp_path / "g.db") as master, agents_of(master, tmp_path, "n1") as (agent,):
        gateway = gateway_of(master)
        with Client(master.target, timeout=10) as client:
            client.submit({"id": "t", "cpu": "0.1", "command": [SLOW_STOP]})
            wait_for("running", lambda: client.get("t").tasks[0].state is TaskState.RUNNING)
            link = agent.runner._link
            handle = link._on_message
            dropped: list[str] = []
            link._on_message = lambda m: dropped.append(m.WhichOneof("body"))  # the stream is dead
            try:
                client.cancel("t")
                wait_for("the kill sent", lambda: "kill" in dropped)
            finally:
                link._on_message = handle
            reconnect(master, agent)
            assert gateway.stopping("t/0")  # the run takes 1.5 s to stop once killed
            # Killed with the kill's own reason, long before the kill would have expired.
            wait_for("the run killed", lambda: agent.running() == [], timeout=KILL_GRACE_S + 2)
            assert agent.said("t/0 killed: cancelled") >= 0, agent.lines
            wait_for("the kill answered", lambda: not gateway.stopping("t/0"))
            assert client.get("t").state is JobState.CANCELLED


# == 2. log chunks not delivered when the agent restarts ==============================================
MASTER_PROGRAM = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from tests.test_agent_gateway import start_master\n"
    "handle = start_master(Path(sys.argv[1]), node_timeout_s=120)\n"
    "print(handle.target, flush=True)\n"
    "time.sleep(3600)\n"
)


def test_an_agent_restarted_while_the_master_reads_nothing_leaves_no_hole_in_the_log(tmp_path: Path) -> None:
    """The master stalled (a hung process, a stalled network) while a task wrote 8 MB; the agent
    was restarted meanwhile (stop(kill_tasks=False)). The state file kept log offsets past the
    chunks still queued in the outbox (dropped with it) and past those the stalled stream had
    taken: the next agent shipped on from there, and the master's log got a hole of NUL bytes."""
    root = Path(__file__).resolve().parent.parent
    master = subprocess.Popen(
        [sys.executable, "-c", MASTER_PROGRAM, str(tmp_path / "g.db")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
    )
    agents: list[Agent] = []
    try:
        assert master.stdout is not None
        target = master.stdout.readline().strip()
        agents.append(Agent(target, "n1", tmp_path / "n1"))
        go = tmp_path / "go"
        script = (
            f"echo first; while [ ! -e {go} ]; do sleep 0.05; done; head -c 8000000 /dev/zero | tr '\\0' a; "
        )
        with Client(target, timeout=10) as client:
            wait_for("connected", lambda: agents[0].runner.connected)
            client.submit({"id": "t", "cpu": "0.1", "command": [script + "echo END; sleep 1000"]})
            wait_for("the first line", lambda: log_of(client, "t") == b"first\n")
        local = tmp_path / "n1" / "logs" / "t_0.out"
        os.kill(master.pid, signal.SIGSTOP)
        try:
            go.touch()
            wait_for("the output", lambda: local.stat().st_size == 8_000_010)
            time.sleep(1.0)  # the agent ships what it can: into the stalled stream, then its outbox
            agents[0].stop(kill_tasks=False)
        finally:
            os.kill(master.pid, signal.SIGCONT)
        with Client(target, timeout=10) as client:
            # The master, going again, reads what was sent before it sees the old stream gone.
            wait_for("the old stream gone", lambda: not connected(client, "n1"), 30)
            agents.append(Agent(target, "n1", tmp_path / "n1"))  # adopts the task
            wait_for("the whole output on the master", lambda: log_of(client, "t") == local.read_bytes(), 30)
    finally:
        for agent in agents:
            if agent.thread.is_alive():
                agent.stop()
        master.kill()
        master.wait(10)
        if master.stdout is not None:
            master.stdout.close()


@contextmanager
def stream_cut(master: Any, agent: Agent) -> Iterator[list[str]]:
    """What the agent's current stream carries from now on is lost in transport (as when the
    connection dies), until the stream is replaced at the end; the bodies lost are listed."""
    gateway = gateway_of(master)
    with gateway._lock:
        doomed = gateway.sessions[agent.runner.name]
    receive = gateway._receive
    lost: list[str] = []

    def lossy(session: Any, msg: Any) -> None:
        if session is doomed:
            lost.append(msg.WhichOneof("body"))
        else:
            receive(session, msg)

    gateway._receive = lossy  # type: ignore[method-assign]
    try:
        yield lost
        reconnect(master, agent)
    finally:
        gateway._receive = receive  # type: ignore[method-assign]


def numbered_lines(count: int) -> bytes:
    return b"".join(b"line %d\n" % i for i in range(count))


def test_output_a_broken_stream_lost_is_shipped_again_from_where_the_masters_copy_stops(
    tmp_path: Path,
) -> None:
    """Log chunks a stream took and lost with its connection were never sent again (nothing
    acknowledges them): the master's copy of a running task's output kept a hole, and a task that
    ended meanwhile lost its last lines with its final status."""
    go = tmp_path / "go"
    halt = f"[ $i = 99 ] && while [ ! -e {go} ]; do sleep 0.05; done"
    running = f"for i in $(seq 0 199); do echo line $i; {halt}; done; sleep 1000"
    ending = (
        "for i in $(seq 0 49); do echo line $i; done; sleep 0.5; for i in $(seq 50 99); do echo line $i; done"
    )
    with (
        master_at(tmp_path / "g.db") as master,
        agents_of(master, tmp_path, "n1") as (agent,),
        Client(master.target, timeout=10) as client,
    ):
        client.submit({"id": "run", "cpu": "0.1", "command": [running]})
        wait_for("the first half", lambda: log_of(client, "run") == numbered_lines(100))
        with stream_cut(master, agent) as lost:
            go.touch()
            client.submit({"id": "end", "cpu": "0.1", "command": [ending]})
            wait_for("the run's second half lost", lambda: "log" in lost)
            # Its RUNNING, then its final status (the agent forgets the task once it hands it over).
            ended = agent.record("end/0")
            wait_for("the end lost", lambda: lost.count("task_status") == 2 and not ended(lambda r: True))
            assert client.get("end").tasks[0].state is not TaskState.SUCCEEDED
        wait_for("the run's whole output", lambda: log_of(client, "run") == numbered_lines(200))
        wait_for("the end", lambda: client.get("end").state is JobState.SUCCEEDED)
        assert log_of(client, "end") == numbered_lines(100)


def test_the_outbox_knows_the_first_log_bytes_the_master_may_not_have() -> None:
    """Queued chunks, and those taken by a stream not known to have been read to its end."""
    box = Outbox()

    def chunk(offset: int) -> agent_pb2.AgentMessage:
        log = types_pb2.LogChunk(task_id="t/0", stream="stdout", offset=offset, data=b"0123456789")
        return agent_pb2.AgentMessage(log=log)

    box.untrack()  # a stream starts
    for offset in (0, 10, 20):
        box.put(chunk(offset))
    box.put(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))
    assert box.log_offsets() == box.log_offsets(taken=True) == {("t/0", "stdout"): 0}
    box.take(0)
    assert box.log_offsets() == {("t/0", "stdout"): 10}
    assert box.log_offsets(taken=True) == {("t/0", "stdout"): 0}  # it may sit in the transport
    box.untrack()  # the master read the stream to its end
    assert box.log_offsets(taken=True) == {("t/0", "stdout"): 10}
    box.take(0)
    box.untrack()  # a later stream does not answer for what an earlier one took
    assert box.log_offsets(taken=True) == {("t/0", "stdout"): 20}


def test_the_outbox_forgets_the_taken_offsets_of_a_task_the_agent_forgot() -> None:
    """The offsets of the chunks a stream took were kept for the stream's whole life: they grew
    with every task that ever logged on it. A task's go once the agent has forgotten it: when the
    stream takes its final status (queued after its run's last chunks)."""
    box = Outbox()

    def chunk(task_id: str, stream: str, offset: int) -> agent_pb2.AgentMessage:
        log = types_pb2.LogChunk(task_id=task_id, stream=stream, offset=offset, data=b"0123456789")
        return agent_pb2.AgentMessage(log=log)

    def status(task_id: str, state: types_pb2.TaskState) -> agent_pb2.AgentMessage:
        return agent_pb2.AgentMessage(task_status=agent_pb2.TaskStatus(task_id=task_id, state=state))

    box.untrack()
    for msg in (chunk("a/0", "stdout", 0), chunk("a/0", "stderr", 5), chunk("b/0", "stdout", 7)):
        box.put(msg)
    while box.take(0) is not None:
        pass
    assert box.log_offsets(taken=True) == {("a/0", "stdout"): 0, ("a/0", "stderr"): 5, ("b/0", "stdout"): 7}
    box.put(status("a/0", types_pb2.TASK_STATE_SUCCEEDED))
    box.put(status("c/0", types_pb2.TASK_STATE_FAILED))  # never logged: nothing to forget
    while box.take(0) is not None:
        pass
    assert box.log_offsets(taken=True) == {("b/0", "stdout"): 7}
    # A RUNNING status leaves the task's offsets; its final status (after its last chunks) drops them.
    for msg in (
        chunk("b/0", "stdout", 17),
        status("b/0", types_pb2.TASK_STATE_RUNNING),
        chunk("c/0", "stdout", 3),
    ):
        box.put(msg)
    while box.take(0) is not None:
        pass
    assert box.log_offsets(taken=True) == {("b/0", "stdout"): 7, ("c/0", "stdout"): 3}
    box.put(status("b/0", types_pb2.TASK_STATE_SUCCEEDED))
    box.take(0)
    assert box.log_offsets(taken=True) == {("c/0", "stdout"): 3}
    box.put(chunk("b/0", "stdout", 0))  # a new run of the task, launched after: tracked again
    box.take(0)
    assert box.log_offsets(taken=True) == {("b/0", "stdout"): 0, ("c/0", "stdout"): 3}
    box.put(status("c/0", types_pb2.TASK_STATE_FAILED))
    box.take(0)
    assert box.log_offsets(taken=True) == {("b/0", "stdout"): 0}


# == 3. a kill in progress across an agent restart ====================================================
def _launch(task_id: str, script: str, *, service: bool = False) -> agent_pb2.LaunchTask:
    job = task_id.split("/")[0]
    return agent_pb2.LaunchTask(task_id=task_id, job_id=job, command=[script], service=service)


def test_a_kill_in_progress_goes_on_in_a_restarted_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent was restarted (stop(kill_tasks=False)) while tasks were being killed. The state
    file kept neither the kill nor its deadline: the next agent restarted a killed service that
    exited from its SIGTERM as if it had crashed, never SIGKILLed a task that ignores SIGTERM, and
    adopted a run the master no longer expects as one it runs."""
    monkeypatch.setattr(agent_tasks, "STALE_GRACE_S", 2.0)
    reports: list[agent_pb2.TaskStatus] = []
    lines: list[str] = []

    def table() -> TaskTable:
        return TaskTable(ShellExecutor(tmp_path / "logs"), reports.append, None, lines.append)

    ready = "echo ready; while true; do sleep 0.1; done"
    first = table()
    first.launch(_launch("svc/0", f"trap 'sleep 0.5; exit 1' TERM; {ready}", service=True))
    first.launch(_launch("stub/0", f"trap '' TERM; {ready}"))
    first.launch(_launch("old/0", f"trap '' TERM; {ready}"))
    for tid in ("svc/0", "stub/0", "old/0"):  # the traps are set
        out = first.executor.log_paths(tid)[0]
        wait_for(f"{tid} ready", lambda out=out: out.exists() and out.read_bytes() == b"ready\n")
    first.kill("svc/0", 2.0, "cancelled")
    first.kill("stub/0", 2.0, "cancelled")
    first.reconcile({"svc/0", "stub/0"})  # old/0 is not expected: stopped as stale
    state = StateFile(tmp_path / "state.json")
    state.save(first.snapshot())  # the agent stops here; its tasks run on
    second = table()
    try:
        assert second.adopt(state.load()) == 3
        assert second.records["old/0"].stale and second.running_ids() == ["stub/0", "svc/0"]
        del reports[:]

        def over() -> bool:
            second.poll()
            return "old/0" not in second.records and all(
                second.records[t].final is not None for t in ("svc/0", "stub/0")
            )

        wait_for("the kills over", over, timeout=2.0 + 3.0)  # SIGKILL once the grace left is over
        for tid in ("svc/0", "stub/0"):
            final = second.records[tid].final
            assert final is not None and final.message == "killed: cancelled", final
        assert second.records["svc/0"].restarts == 0 and not any("restarting" in line for line in lines)
        assert reports == []  # no RUNNING of a restart, nothing of the stale run
    finally:
        for tid in list(second.records):
            second.kill(tid, 0.0, "the test's end")
        wait_for("nothing left", lambda: (second.poll(), not second.has_processes())[1])
        first.executor.wait_all(5)  # the runs were its children: reap them


def test_a_state_file_of_an_older_agent_still_loads(tmp_path: Path) -> None:
    """The kill fields are new: a state file written without them loads as before."""
    path = tmp_path / "state.json"
    task = {
        "task_id": "t/0",
        "launch": "",
        "pid": 0,
        "create_time": 0.0,
        "stdout": "t_0.out",
        "stderr": "t_0.err",
        "stdout_offset": 5,
    }
    path.write_text(json.dumps({"version": 1, "tasks": [task]}))
    (saved,) = StateFile(path).load().tasks
    assert (saved.task_id, saved.stdout_offset) == ("t/0", 5)
    assert saved.killed is None and saved.kill_deadline == 0.0 and not saved.stale


def test_a_final_status_the_master_never_got_is_sent_again_by_a_restarted_agent(tmp_path: Path) -> None:
    """A task ended and its final status went to the stream, which lost it; then the agent
    restarted. The status lived in the old agent's memory only, so the new one answered the
    master's expectation with "lost: not running on this node" and the finished task ran again."""
    runs = tmp_path / "runs"
    with master_at(tmp_path / "g.db") as master:
        gateway = gateway_of(master)
        first = Agent(master.target, "n1", tmp_path / "n1")
        with Client(master.target, timeout=10) as client:
            wait_for("the agent", lambda: connected(client, "n1"))
            receive = gateway._on_status
            lost: list[str] = []

            def lose_ends(session: Any, status: Any) -> None:
                if status.state == types_pb2.TASK_STATE_SUCCEEDED:
                    lost.append(status.task_id)  # taken by the stream, never applied
                else:
                    receive(session, status)

            gateway._on_status = lose_ends  # type: ignore[method-assign]
            try:
                client.submit({"id": "t", "cpu": "0.1", "command": [f"echo run >> {runs}; exit 0"]})
                wait_for("the end sent", lambda: lost == ["t/0"])
                # Restarted (as --keep-tasks-on-stop): an agent that stops and kills its tasks
                # gives its node up once its stream ends cleanly, read to its end (none is lost).
                first.stop(kill_tasks=False)
            finally:
                gateway._on_status = receive  # type: ignore[method-assign]
            assert client.get("t").tasks[0].state is TaskState.RUNNING  # the master still expects it
            second = Agent(master.target, "n1", tmp_path / "n1")
            try:
                wait_for("the job's end", lambda: client.get("t").state is JobState.SUCCEEDED)
                time.sleep(0.5)  # a second run, had there been one, would have been launched by now
                assert runs.read_text() == "run\n"
            finally:
                second.stop()


# == 4. the GPUs a task sees are the ones it was given ================================================
def test_a_task_sees_its_gpus_in_nvmls_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA_VISIBLE_DEVICES holds NVML's indexes, which follow the PCI bus ids; CUDA's own order is
    fastest first unless CUDA_DEVICE_ORDER says otherwise, so on a machine of mixed GPUs a task
    used GPUs it was not given. Neither the agent's environment nor the task's own may change it."""
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    executor = ShellExecutor(tmp_path / "logs")
    spec = TaskSpec(
        "g/0",
        ['echo "$CUDA_DEVICE_ORDER $CUDA_VISIBLE_DEVICES"'],
        env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"},
        gpus=[3, 1],
    )
    assert executor.start(spec) is None
    (end,) = executor.wait_all(10)
    assert end.exit_code == 0
    assert executor.log_paths("g/0")[0].read_text() == "PCI_BUS_ID 3,1\n"


# == 5. a GPU NVML cannot open ========================================================================
class LostGpuNvml(FakeNvml):
    """Three GPUs; the second cannot be opened (fallen off the bus)."""

    def nvmlDeviceGetCount(self) -> int:
        return 3

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return i


def test_a_gpu_nvml_cannot_open_is_left_out_and_the_others_keep_their_indexes() -> None:
    """One GPU whose handle NVML refused made discovery fail as a whole: a CPU-only node."""
    info = discover(LostGpuNvml(), "ok")
    assert [(g.index, g.uuid) for g in info.gpus] == [(0, "GPU-0"), (2, "GPU-2")]
    assert info.nvml_status == "ok; left out GPU 1: GPU is lost"
    node = info.to_node(name="n1")
    assert dict(node.labels)["gosched.io/gpu-count"] == "2"
    # As the runner registers it: validated as the master will.
    assert [g.index for g in node_from_proto(node_to_proto(node)).gpus] == [0, 2]
    skipped: list[str] = []
    gpus, _, _ = discover_gpus(LostGpuNvml(), skipped)
    assert [g.index for g in gpus] == [0, 2] and skipped == ["GPU 1: GPU is lost"]


# == 6. NVSwitch systems ==============================================================================
SWITCH_BUS = "00000000:80:00.0"


class SwitchNvml(FakeNvml):
    """Four GPUs: 0-2 have their links up to an NVSwitch, 3 has none up. `types`: whether NVML
    answers the remote device type (older drivers and libraries do not)."""

    def __init__(self, types: bool = True) -> None:
        super().__init__(nvlink=True)
        self.types = types

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= 2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if h == 3 else 1

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: int, link: int) -> int:
        if not self.types:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        return SimpleNamespace(busId=SWITCH_BUS)  # the switch's, not a GPU's


def test_gpus_linked_through_nvswitches_are_each_others_peers() -> None:
    """NVML names the switch as a link's remote end: every GPU of an NVSwitch system had no peers."""
    gpus, _, _ = discover_gpus(SwitchNvml())
    assert [g.nvlink_peers for g in gpus] == [[1, 2], [0, 2], [0, 1], []]
    node = discover(SwitchNvml(), "ok").to_node(name="n1")
    assert [g.nvlink_peers for g in node_from_proto(node_to_proto(node)).gpus] == [(1, 2), (0, 2), (0, 1), ()]
    # NVML that cannot tell the remote end's type: links resolved by PCI bus id, as before.
    gpus, _, _ = discover_gpus(SwitchNvml(types=False))
    assert [g.nvlink_peers for g in gpus] == [[], [], [], []]
    assert [g.nvlink_peers for g in discover_gpus(FakeNvml(nvlink=True))[0]] == [[1], [0]]


# == 7. tiny CPU quotas; a cgroup whose limits cannot be set ==========================================
def _cgroup_root(root: Path, monkeypatch: pytest.MonkeyPatch, *, refuse_cpu: bool = False) -> CgroupSupport:
    """A temp dir standing in for the cgroup v2 root, whose cpu.max refuses what the kernel does
    (a quota under 1000 us: EINVAL), or every value with `refuse_cpu`."""
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory")
    real = Path.write_text

    def write_text(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        if self.name == "cpu.max" and root in self.parents:
            quota = data.split()[0]
            if refuse_cpu or (quota != "max" and int(quota) < 1000):
                raise OSError(errno.EINVAL, "Invalid argument", str(self))
        return real(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    support = detect(root)
    assert support.available and support.parent is not None, support.reason
    return support


def test_a_tiny_cpu_request_gets_the_smallest_quota_the_kernel_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """5m CPU made a quota of 500 us, which the kernel refuses: the task never started."""
    support = _cgroup_root(tmp_path / "cgroup", monkeypatch)
    for task, milli, expected in (
        ("a/0", 5, "1000 100000"),
        ("b/0", 10, "1000 100000"),
        ("c/0", 250, "25000 100000"),
    ):
        cgroup = TaskCgroup.create(support, task, milli, 2**20)
        assert (cgroup.path / "cpu.max").read_text() == expected
        assert (cgroup.path / "memory.max").read_text() == str(2**20)


def test_a_task_whose_limits_cannot_be_set_leaves_no_cgroup_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    support = _cgroup_root(tmp_path / "cgroup", monkeypatch, refuse_cpu=True)
    executor = ShellExecutor(tmp_path / "logs", support)
    end = executor.start(TaskSpec("t/0", ["true"], cpu_milli=500))
    assert end is not None and end.reason == "failed_to_start" and "Invalid argument" in end.message
    assert sorted(p.name for p in support.parent.iterdir()) == ["cgroup.subtree_control"]  # no t_0
