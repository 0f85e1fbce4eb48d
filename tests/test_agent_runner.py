"""The node agent against a real AgentService on loopback gRPC, with real task processes.

`FakeMaster` is a small AgentService written here (the master's own is developed alongside): it
records what agents send and pushes the launches and kills a test asks for. The agent runs both in
this process (AgentRunner in a thread) and as the `gosched agent` program.
"""

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import grpc
import psutil
import pytest

from gosched.agent.containers import (
    NO_RUNTIME,
    Container,
    container_name,
    find_runtime,
    probe_runtime,
)
from gosched.agent.runner import AgentRunner, NodeNameTaken, WorkDirBusy
from gosched.cli.agent_cmd import parse_labels, parse_taints
from gosched.common.node import RUNTIME_LABEL, Taint, TaintEffect
from gosched.proto.v1 import agent_pb2, agent_pb2_grpc, types_pb2
from tests.polling import stop_process, wait_for
from tests.test_agent_discovery import FakeNvml

T = TypeVar("T")
RUNNING = types_pb2.TASK_STATE_RUNNING
SUCCEEDED = types_pb2.TASK_STATE_SUCCEEDED
FAILED = types_pb2.TASK_STATE_FAILED
HEARTBEAT_S = 0.2
GOSCHED = Path(sys.executable).parent / "gosched"




def alive(pid: int) -> bool:
    """Running and not a zombie (an orphan's zombie lingers until some init reaps it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def read_pid(path: Path) -> int:
    def pid() -> int:
        text = path.read_text().strip() if path.exists() else ""
        return int(text) if text else 0

    return wait_for(path.name, pid)


class FakeMaster(agent_pb2_grpc.AgentServiceServicer):
    """A real AgentService on 127.0.0.1: records what agents send, sends what the test says."""

    def __init__(self, port: int = 0, expected: tuple[str, ...] = (), refuse: str = "") -> None:
        self.expected = list(expected)
        self.refuse = refuse  # answer every Register with ALREADY_EXISTS and this
        self.registrations: list[agent_pb2.RegisterRequest] = []
        self._messages: list[agent_pb2.AgentMessage] = []
        self._lock = threading.Lock()
        self._out: queue.Queue[agent_pb2.SchedulerMessage] = queue.Queue()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        agent_pb2_grpc.add_AgentServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        assert self.port, f"could not bind 127.0.0.1:{port}"
        self.server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(0).wait()

    # -- the service ----------------------------------------------------------------------------------
    def Register(self, request: Any, context: Any) -> agent_pb2.RegisterResponse:
        with self._lock:
            self.registrations.append(request)
            number = len(self.registrations)
        if self.refuse:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, self.refuse)
        return agent_pb2.RegisterResponse(
            node_name=request.node.name,
            session_id=f"session-{self.port}-{number}",
            heartbeat_interval_s=HEARTBEAT_S,
            expected_task_ids=self.expected,
        )

    def Connect(self, request_iterator: Iterator[Any], context: Any) -> Iterator[agent_pb2.SchedulerMessage]:
        done = threading.Event()

        def read() -> None:
            try:
                for msg in request_iterator:
                    with self._lock:
                        self._messages.append(msg)
            except grpc.RpcError:
                pass
            finally:
                done.set()

        threading.Thread(target=read, daemon=True).start()
        while context.is_active() and not done.is_set():  # the agent half-closes when it stops
            try:
                yield self._out.get(timeout=0.05)
            except queue.Empty:
                continue

    # -- what a test does -----------------------------------------------------------------------------
    def launch(self, task_id: str, command: list[str], **fields: Any) -> None:
        msg = agent_pb2.LaunchTask(task_id=task_id, job_id=task_id.split("/")[0], command=command, **fields)
        self._out.put(agent_pb2.SchedulerMessage(launch=msg))

    def kill(self, task_id: str, reason: str = "cancelled", grace_s: float = 5.0) -> None:
        msg = agent_pb2.KillTask(task_id=task_id, grace_period_s=grace_s, reason=reason)
        self._out.put(agent_pb2.SchedulerMessage(kill=msg))

    # -- what it saw ----------------------------------------------------------------------------------
    def messages(self) -> list[agent_pb2.AgentMessage]:
        with self._lock:
            return list(self._messages)

    def heartbeats(self) -> list[agent_pb2.Heartbeat]:
        return [m.heartbeat for m in self.messages() if m.WhichOneof("body") == "heartbeat"]

    def statuses(self, task_id: str) -> list[agent_pb2.TaskStatus]:
        return [
            m.task_status
            for m in self.messages()
            if m.WhichOneof("body") == "task_status" and m.task_status.task_id == task_id
        ]

    def final(self, task_id: str) -> agent_pb2.TaskStatus | None:
        ended = [s for s in self.statuses(task_id) if s.state in (SUCCEEDED, FAILED)]
        return ended[-1] if ended else None

    def wait_final(self, task_id: str, timeout: float = 5.0) -> agent_pb2.TaskStatus:
        return wait_for(f"the final status of {task_id}", lambda: self.final(task_id), timeout)

    def wait_running(self, task_id: str, count: int = 1, timeout: float = 5.0) -> list[agent_pb2.TaskStatus]:
        def runs() -> list[agent_pb2.TaskStatus]:
            found = [s for s in self.statuses(task_id) if s.state == RUNNING]
            return found if len(found) >= count else []

        return wait_for(f"{count} RUNNING report(s) of {task_id}", runs, timeout)

    def log(self, task_id: str, stream: str = "stdout") -> bytes:
        """The stream's bytes from its chunks, which must continue exactly where the last one ended."""
        data = b""
        for m in self.messages():
            if m.WhichOneof("body") == "log" and m.log.task_id == task_id and m.log.stream == stream:
                assert m.log.offset == len(data), f"chunk at {m.log.offset}, expected {len(data)}"
                assert 0 < len(m.log.data) <= 64 * 1024
                data += m.log.data
        return data

    def logs_before_final(self, task_id: str) -> bool:
        """Every log chunk of the task arrived before its final status."""
        final_at = last_log_at = -1
        for i, m in enumerate(self.messages()):
            body = m.WhichOneof("body")
            if body == "log" and m.log.task_id == task_id:
                last_log_at = i
            elif body == "task_status" and m.task_status.task_id == task_id:
                final_at = i if m.task_status.state != RUNNING else final_at
        return final_at > last_log_at


@pytest.fixture
def master() -> Iterator[FakeMaster]:
    m = FakeMaster()
    yield m
    m.stop()


@contextmanager
def running_agent(master: str, work_dir: Path, **options: Any) -> Iterator[AgentRunner]:
    lines: list[str] = []
    runner = AgentRunner(
        master, "node-a", work_dir=work_dir, shutdown_grace_s=2.0, echo=lines.append, **options
    )
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        yield runner
    finally:
        runner.stop()
        thread.join(15)
        assert not thread.is_alive(), "the agent did not stop"


# == in-process agent ==================================================================================
def test_registers_the_machine_then_heartbeats(master: FakeMaster, tmp_path: Path) -> None:
    with running_agent(master.address, tmp_path, labels={"zone": "a"}) as runner:
        (reg,) = wait_for("a registration", lambda: master.registrations)
        wait_for("3 heartbeats", lambda: len(master.heartbeats()) >= 3)
        assert runner.node_name == "node-a" and runner.connected
    node = reg.node
    assert node.name == "node-a"
    assert node.cpu_milli == (psutil.cpu_count(logical=True) or 1) * 1000
    assert node.memory == psutil.virtual_memory().total
    assert node.labels["zone"] == "a" and node.labels["gosched.io/hostname"]
    assert reg.agent_version and reg.limits  # "cgroup v2 (cpu, memory)" or "none: why"
    messages = master.messages()
    assert messages[0].WhichOneof("body") == "heartbeat"  # first, at once
    assert all(m.node_name == "node-a" and m.session_id == f"session-{master.port}-1" for m in messages)
    beats = master.heartbeats()
    times = [b.time for b in beats]
    assert times == sorted(times) and times[-1] - times[0] >= HEARTBEAT_S
    assert beats[-1].usage.memory_used > 0 and beats[-1].usage.cpu_used_milli >= 0
    assert list(beats[-1].running_task_ids) == []


def test_gpus_found_by_nvml_are_registered_and_their_usage_heartbeats(
    master: FakeMaster, tmp_path: Path
) -> None:
    # NVML needs a driver; the stand-in answers as two H100s would (and refuses what VMs refuse).
    with running_agent(master.address, tmp_path, nvml=FakeNvml()):
        (reg,) = wait_for("a registration", lambda: master.registrations)
        beat = wait_for("a heartbeat", lambda: master.heartbeats())[0]
    assert [(g.index, g.uuid, g.model, g.memory_mib) for g in reg.node.gpus] == [
        (0, "GPU-0", "NVIDIA H100 80GB HBM3", 80 * 1024),
        (1, "GPU-1", "NVIDIA H100 80GB HBM3", 80 * 1024),
    ]
    assert reg.node.labels["gosched.io/gpu-count"] == "2"
    usage = [(g.index, g.utilization, g.memory_used_mib) for g in beat.usage.gpus]
    assert usage == [(0, 0.07, 1024), (1, 0.07, 1024)]


def test_cpu_and_memory_overrides_are_advertised(master: FakeMaster, tmp_path: Path) -> None:
    taint = Taint("dedicated", "ml", TaintEffect.NO_EXECUTE)
    with running_agent(master.address, tmp_path, cpu_milli=1500, memory=2 * 2**30, taints=(taint,)):
        (reg,) = wait_for("a registration", lambda: master.registrations)
    assert (reg.node.cpu_milli, reg.node.memory) == (1500, 2 * 2**30)
    assert [(t.key, t.value, t.effect) for t in reg.node.taints] == [("dedicated", "ml", "NoExecute")]


def test_a_task_sees_its_gpus_and_env_and_its_output_and_exit_code_arrive(
    master: FakeMaster, tmp_path: Path
) -> None:
    gpus = [types_pb2.GpuAssignment(index=1, milli=1000), types_pb2.GpuAssignment(index=3, milli=500)]
    script = 'echo "gpus=$CUDA_VISIBLE_DEVICES x=$X id=$GOSCHED_TASK_ID job=$GOSCHED_JOB_ID"; echo oops >&2'
    with running_agent(master.address, tmp_path):
        wait_for("the stream", lambda: master.heartbeats())
        master.launch("job1/0", [script], env={"X": "42"}, gpus=gpus)
        master.launch("job1/1", ["exit 3"])
        master.launch("job1/2", ["/bin/echo", "a  b", "c"])  # argv: no shell splits "a  b"
        ok = master.wait_final("job1/0")
        bad = master.wait_final("job1/1")
        argv = master.wait_final("job1/2")
    assert [s.state for s in master.statuses("job1/0")] == [RUNNING, SUCCEEDED]
    assert (ok.exit_code, ok.message) == (0, "")
    assert master.log("job1/0") == b"gpus=1,3 x=42 id=job1/0 job=job1\n"
    assert master.log("job1/0", "stderr") == b"oops\n"
    assert master.logs_before_final("job1/0")
    assert (bad.state, bad.exit_code, bad.message) == (FAILED, 3, "exit code 3")
    assert argv.state == SUCCEEDED and master.log("job1/2") == b"a  b c\n"


def test_large_output_goes_in_64k_chunks_at_continuing_offsets(master: FakeMaster, tmp_path: Path) -> None:
    size = 300_000
    with running_agent(master.address, tmp_path):
        wait_for("the stream", lambda: master.heartbeats())
        master.launch("big/0", [f"head -c {size} /dev/zero | tr '\\0' x; sleep 0.3; echo; echo end"])
        assert master.wait_final("big/0").state == SUCCEEDED
    out = master.log("big/0")  # checks each chunk's offset and size
    assert out == b"x" * size + b"\nend\n"
    assert master.logs_before_final("big/0")


def test_kill_ends_the_whole_process_tree(master: FakeMaster, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    with running_agent(master.address, tmp_path / "agent"):
        wait_for("the stream", lambda: master.heartbeats())
        master.launch("k/0", [f"sleep 60 & echo $! > {pidfile}; wait"])
        master.wait_running("k/0")
        child = read_pid(pidfile)
        wait_for("the task in a heartbeat", lambda: "k/0" in master.heartbeats()[-1].running_task_ids)
        master.kill("nothing/0")  # not running here: nothing happens
        master.kill("k/0", "cancelled", grace_s=5)
        end = master.wait_final("k/0")
        wait_for("the child sleep to be gone", lambda: not alive(child))
    assert (end.state, end.message) == (FAILED, "killed: cancelled")
    assert end.exit_code == 128 + signal.SIGTERM
    assert master.statuses("nothing/0") == []


def test_a_resent_launch_does_not_run_the_task_twice(master: FakeMaster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with running_agent(master.address, tmp_path / "agent"):
        wait_for("the stream", lambda: master.heartbeats())
        for _ in range(3):
            master.launch("once/0", [f"echo run >> {runs}; sleep 0.5"])
        assert master.wait_final("once/0").state == SUCCEEDED
    assert runs.read_text() == "run\n"
    assert [s.state for s in master.statuses("once/0")] == [RUNNING, SUCCEEDED]


def test_a_new_launch_of_a_task_ships_only_its_own_output(master: FakeMaster, tmp_path: Path) -> None:
    """The master clears a task's output when it launches it again (a retry on the same node);
    the agent used to append to the old run's file and ship it all again from offset 0."""
    with running_agent(master.address, tmp_path / "agent"):
        wait_for("the stream", lambda: master.heartbeats())
        master.launch("r/0", ["echo first run"])
        master.wait_final("r/0")
        seen = len(master.messages())
        master.launch("r/0", ["echo second"], attempt=1)
        wait_for("the second run's end", lambda: len(master.statuses("r/0")) >= 4)
        master.wait_final("r/0")
    chunks = [
        (m.log.offset, m.log.data)
        for m in master.messages()[seen:]
        if m.WhichOneof("body") == "log" and m.log.task_id == "r/0" and m.log.stream == "stdout"
    ]
    assert chunks == [(0, b"second\n")]


def test_a_failing_service_is_restarted_with_backoff(master: FakeMaster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with running_agent(master.address, tmp_path / "agent"):
        wait_for("the stream", lambda: master.heartbeats())
        master.launch("svc/0", [f"echo run >> {runs}; exit 1"], service=True)
        first, again = master.wait_running("svc/0", count=2, timeout=10)[:2]
        assert master.final("svc/0") is None  # still the master's running task
        assert first.restarts == 0
        # The restart, with how the process before it ended (and when), for `gosched get`
        assert (again.restarts, again.exit_code, again.message) == (1, 1, "exit code 1")
        assert first.time <= again.last_exit_time <= again.time
        assert 0.9 <= again.time - first.time < 5.0  # the first backoff is 1 s
        third = master.wait_running("svc/0", count=3, timeout=10)[2]  # then 2 s
        assert (third.restarts, third.message) == (2, "exit code 1")
        assert again.time < third.last_exit_time <= third.time
        assert "svc/0" in master.heartbeats()[-1].running_task_ids
        master.kill("svc/0", "cancelled")
        end = master.wait_final("svc/0")
    assert (end.state, end.message) == (FAILED, "killed: cancelled")
    assert runs.read_text().count("run") >= 2


def test_a_batch_task_that_fails_is_not_restarted(master: FakeMaster, tmp_path: Path) -> None:
    with running_agent(master.address, tmp_path):
        wait_for("the stream", lambda: master.heartbeats())
        master.launch("b/0", ["exit 1"])
        master.wait_final("b/0")
        time.sleep(1.3)  # longer than a service's first backoff: no restart may come
    assert [s.state for s in master.statuses("b/0")] == [RUNNING, FAILED]


def test_an_image_without_a_container_runtime_fails(master: FakeMaster, tmp_path: Path) -> None:
    with running_agent(master.address, tmp_path, container_runtime=None):
        wait_for("the stream", lambda: master.heartbeats())
        master.launch("img/0", ["echo hi"], image="alpine:3")
        end = master.wait_final("img/0")
    assert end.state == FAILED and end.message == f"{NO_RUNTIME} (none configured)"
    assert [s.state for s in master.statuses("img/0")] == [FAILED]


def test_a_launch_that_cannot_be_built_is_reported_failed(master: FakeMaster, tmp_path: Path) -> None:
    # Popen raises ValueError (not OSError) for a NUL byte in argv or env: such a launch must end
    # as a FAILED status saying why, not as a traceback that leaves the task bound forever.
    docker = fake_runtime(tmp_path / "bin", "docker", "exit 0")
    with running_agent(master.address, tmp_path / "agent", container_runtime=str(docker)):
        wait_for("the stream", lambda: master.heartbeats())
        master.launch("nul/argv", ["/bin/echo", "a\x00b"])
        master.launch("nul/env", ["true"], env={"X": "a\x00b"})
        master.launch("nul/shell", ["echo a\x00b"])
        master.launch("nul/image", ["echo a\x00b"], image="alpine:3")
        ends = {t: master.wait_final(f"nul/{t}") for t in ("argv", "env", "shell", "image")}
        master.launch("ok/0", ["true"])  # the agent carries on
        assert master.wait_final("ok/0").state == SUCCEEDED
        beat = wait_for("a later heartbeat", lambda: master.heartbeats()[-1])
        assert list(beat.running_task_ids) == []
    for task, end in ends.items():
        assert (end.state, end.exit_code) == (FAILED, -1), task
        assert end.message == "failed to start: embedded null byte", task
        assert [s.state for s in master.statuses(f"nul/{task}")] == [FAILED], task


DAEMON_DOWN = (
    "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
)


def fake_runtime(bin_dir: Path, name: str, info: str) -> Path:
    """An executable named `name` whose `info` runs the shell snippet `info` (its exit is the
    probe's answer); anything else prints its arguments, as FAKE_DOCKER does."""
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f'#!/bin/sh\nif [ "$1" = info ]; then {info}; fi\nprintf "%s\\n" "$@"\n')
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ("exit 0", None),
        (f"echo 'Client: ok' >&2; echo '{DAEMON_DOWN}' >&2; exit 1", f"docker: {DAEMON_DOWN}"),
        ("exit 3", "docker: `info` exited with 3"),
        ("sleep 5", "`docker info` did not answer in 0.5s"),
    ],
    ids=["works", "daemon-down", "silent-failure", "hangs"],
)
def test_probing_a_container_runtime(tmp_path: Path, info: str, expected: str | None) -> None:
    assert probe_runtime(str(fake_runtime(tmp_path, "docker", info)), timeout_s=0.5) == expected


def test_a_docker_without_its_daemon_is_passed_over_for_a_working_podman(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_runtime(tmp_path / "bin", "docker", f"echo '{DAEMON_DOWN}' >&2; exit 1")
    fake_runtime(tmp_path / "bin", "podman", "echo 'storage not writable' >&2; exit 125")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert find_runtime() == (None, f"docker: {DAEMON_DOWN}; podman: storage not writable")
    podman = fake_runtime(tmp_path / "bin", "podman", "exit 0")
    assert find_runtime() == (str(podman), "")


@pytest.mark.parametrize("found", ["on-path", "configured"])
@pytest.mark.parametrize("works", [True, False], ids=["daemon-up", "daemon-down"])
def test_the_agent_uses_and_advertises_only_a_runtime_that_works(
    master: FakeMaster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, works: bool, found: str
) -> None:
    info = "exit 0" if works else f"echo '{DAEMON_DOWN}' >&2; exit 1"
    docker = fake_runtime(tmp_path / "bin", "docker", info)
    options: dict[str, Any] = {}
    if found == "on-path":
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    else:
        options["container_runtime"] = str(docker)
    with running_agent(master.address, tmp_path / "agent", **options) as runner:
        (reg,) = wait_for("a registration", lambda: master.registrations)
        master.launch("img/0", ["echo hi"], image="alpine:3")
        end = master.wait_final("img/0")
    assert (reg.node.labels.get(RUNTIME_LABEL) == "docker") is works
    assert (runner.container_runtime is not None) is works
    if works:  # the fake runtime printed its `run` arguments as the task's output
        assert end.state == SUCCEEDED and "alpine:3" in master.log("img/0").decode()
    else:  # failed at once, saying why: not a docker error in the task's log
        assert end.state == FAILED and end.message == f"{NO_RUNTIME} (docker: {DAEMON_DOWN})"


def test_a_runtime_that_starts_or_stops_working_later_is_noticed(
    master: FakeMaster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The docker daemon is down when the agent starts, comes up, then goes down again.
    up = tmp_path / "daemon-up"
    fake_runtime(tmp_path / "bin", "docker", f"[ -e {up} ] || {{ echo '{DAEMON_DOWN}' >&2; exit 1; }}")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")

    def labels_sent() -> list[dict[str, str]]:
        bodies = [m for m in master.messages() if m.WhichOneof("body") == "node_update"]
        return [dict(m.node_update.labels) for m in bodies]

    with running_agent(master.address, tmp_path / "agent", runtime_probe_s=0.1):
        (reg,) = wait_for("a registration", lambda: master.registrations)
        assert RUNTIME_LABEL not in reg.node.labels
        master.launch("img/0", ["true"], image="alpine:3")
        assert master.wait_final("img/0").message == f"{NO_RUNTIME} (docker: {DAEMON_DOWN})"
        up.touch()
        wait_for("the node relabelled", lambda: [u.get(RUNTIME_LABEL) for u in labels_sent()] == ["docker"])
        master.launch("img/1", ["true"], image="alpine:3")
        assert master.wait_final("img/1").state == SUCCEEDED
        up.unlink()
        wait_for("the label taken back", lambda: len(labels_sent()) == 2)
        assert RUNTIME_LABEL not in labels_sent()[1]
        assert labels_sent()[1] == dict(reg.node.labels)  # nothing else changed
        master.launch("img/2", ["true"], image="alpine:3")
        assert master.wait_final("img/2").message == f"{NO_RUNTIME} (docker: {DAEMON_DOWN})"
    assert len(master.registrations) == 1  # told on the stream, not by registering again


def test_a_node_update_queued_while_registering_again_is_kept(tmp_path: Path) -> None:
    # The link builds its Register from the node as it was; the probe changes the labels before the
    # registration is answered. Its update must still go: the master has the old labels.
    runner = AgentRunner("127.0.0.1:1", "node-a", work_dir=tmp_path, container_runtime=None, nvml=None)
    runner._start_tasks()
    sent = runner._register_request()
    runner._runtime_probed("/usr/bin/docker", "")
    answer = agent_pb2.RegisterResponse(node_name="node-a", session_id="s", heartbeat_interval_s=1)
    runner._on_registered(answer)
    queued = [m for m in runner._outbox._items if m.HasField("node_update")]
    assert RUNTIME_LABEL not in sent.node.labels
    assert [dict(m.node_update.labels).get(RUNTIME_LABEL) for m in queued] == ["docker"]


FAKE_DOCKER = """#!/bin/sh
# Stands in for docker: records its calls, prints the arguments of `run`, fails for a missing image.
echo "$1" >> "$(dirname "$0")/calls"
[ "$1" = rm ] && exit 0
case "$*" in *missing:1*) echo "Unable to find image" >&2; exit 125;; esac
printf '%s\\n' "$@"
"""


def test_an_image_runs_through_the_container_runtime(master: FakeMaster, tmp_path: Path) -> None:
    docker = tmp_path / "bin" / "docker"
    docker.parent.mkdir()
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    gpus = [types_pb2.GpuAssignment(index=2, milli=250)]
    with running_agent(master.address, tmp_path / "agent", container_runtime=str(docker)):
        wait_for("the stream", lambda: master.heartbeats())
        master.launch("img/0", ["echo hi"], image="alpine:3", env={"A": "b"}, gpus=gpus, cpu_milli=500)
        master.launch("img/1", ["true"], image="missing:1")
        ran = master.wait_final("img/0")
        missing = master.wait_final("img/1")
        calls = docker.parent / "calls"
        wait_for("the containers' removal", lambda: calls.read_text().split().count("rm") == 4)
    args = master.log("img/0").decode().splitlines()
    assert ran.state == SUCCEEDED
    assert args[:6] == ["run", "--rm", "--name", "gosched-img-0", "--gpus", '"device=2"']
    assert "A=b" in args and "GOSCHED_TASK_ID=img/0" in args
    assert args[-6:] == ["--cpus", "0.5", "alpine:3", "sh", "-c", "echo hi"]
    assert (missing.state, missing.exit_code) == (FAILED, 125)
    assert missing.message == "exit code 125 (the container runtime could not run it)"
    assert master.log("img/1", "stderr") == b"Unable to find image\n"


def test_reconnect_reconciles_with_the_tasks_the_master_expects(master: FakeMaster, tmp_path: Path) -> None:
    stale_pid, done = tmp_path / "stale.pid", tmp_path / "c.done"
    second: FakeMaster | None = None
    with running_agent(master.address, tmp_path / "agent") as runner:
        wait_for("the stream", lambda: master.heartbeats())
        master.launch("r/stale", [f"echo $$ > {stale_pid}; exec sleep 60"])
        master.launch("r/keep", ["sleep 60"])
        master.launch("r/ends", [f"sleep 0.5; echo done; touch {done}"])
        for task in ("r/stale", "r/keep", "r/ends"):
            master.wait_running(task)
        pid = read_pid(stale_pid)
        master.stop()  # the master goes away; the tasks keep running
        wait_for("the agent to notice", lambda: not runner.connected)
        wait_for("r/ends to end while disconnected", done.exists)
        # A master on the same port expects r/keep, r/ends and a task this node never had.
        second = FakeMaster(master.port, expected=("r/ends", "r/keep", "r/lost"))
        try:
            ended = second.wait_final("r/ends", timeout=10)
            lost = second.wait_final("r/lost")
            wait_for("the stale task to be killed", lambda: not alive(pid))
            beat = wait_for("a heartbeat", lambda: second.heartbeats())[-1]
            assert list(beat.running_task_ids) == ["r/keep"]
        finally:
            second.stop()
    assert (ended.state, ended.exit_code) == (SUCCEEDED, 0)
    assert second.log("r/ends") == b"done\n" and second.logs_before_final("r/ends")
    assert (lost.state, lost.message) == (FAILED, "lost: not running on this node")
    assert second.statuses("r/stale") == []  # killed without a report: the master does not know it
    assert master.final("r/ends") is None


def test_two_agents_cannot_share_a_work_dir(master: FakeMaster, tmp_path: Path) -> None:
    with running_agent(master.address, tmp_path):
        wait_for("the stream", lambda: master.heartbeats())
        with pytest.raises(WorkDirBusy):
            AgentRunner(master.address, "node-b", work_dir=tmp_path).run()


TAKEN = "node node-a is held by another agent"


def test_an_agent_refused_its_name_stops_with_an_error(tmp_path: Path) -> None:
    refusing = FakeMaster(refuse=TAKEN)
    lines: list[str] = []
    runner = AgentRunner(refusing.address, "node-a", work_dir=tmp_path, echo=lines.append, nvml=None)
    try:
        with pytest.raises(NodeNameTaken, match=f"refused this agent: {TAKEN}"):
            runner.run()  # returns by itself: never registered, so it gives up at once
    finally:
        refusing.stop()
    assert len(refusing.registrations) == 1


def test_an_agent_whose_name_was_taken_meanwhile_gives_up_and_kills_its_tasks(
    master: FakeMaster, tmp_path: Path
) -> None:
    lines: list[str] = []
    runner = AgentRunner(
        master.address, "node-a", work_dir=tmp_path / "agent", shutdown_grace_s=1.0, echo=lines.append,
        nvml=None, name_taken_give_up_s=1.0,
    )  # fmt: skip
    failure: list[BaseException] = []

    def run() -> None:
        try:
            runner.run()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    refusing: FakeMaster | None = None
    try:
        wait_for("the stream", lambda: master.heartbeats())
        master.launch("t/0", [f"echo $$ > {tmp_path / 't.pid'}; exec sleep 60"])
        master.wait_running("t/0")
        pid = read_pid(tmp_path / "t.pid")
        master.stop()  # the stream breaks; meanwhile another agent took the name
        refusing = FakeMaster(master.port, refuse=TAKEN)
        started = time.monotonic()
        thread.join(15)
        assert not thread.is_alive()
        # It had a session: its own might still hold the name at the master, so it tried a while.
        assert time.monotonic() - started >= 1.0 and len(refusing.registrations) >= 2
    finally:
        runner.stop()
        thread.join(15)
        if refusing is not None:
            refusing.stop()
    assert [type(e) for e in failure] == [NodeNameTaken]
    assert not alive(pid)  # that agent runs the node's tasks now: ours would run twice
    assert any(line.startswith("stopping: the master at") for line in lines)


# == the `gosched agent` program ========================================================================
@contextmanager
def agent_process(master: str, work_dir: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    argv = [str(GOSCHED), "agent", "--master", master, "--name", "node-cli", "--work-dir", str(work_dir)]
    proc = subprocess.Popen(
        [*argv, "--grace", "2", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        yield proc
    finally:
        stop_process(proc, 10)  # still running: the test failed; stop the agent and its tasks


def kill_groups(pids: list[int], since: float) -> None:
    """Kill the process groups of these pids, what a failed test must not leave running; only
    processes started after `since`, so that a pid reused meanwhile is left alone."""
    for pid in pids:
        with suppress(psutil.NoSuchProcess, ProcessLookupError, PermissionError):
            if psutil.Process(pid).create_time() >= since:
                os.killpg(os.getpgid(pid), signal.SIGKILL)


def test_the_agent_program_registers_and_stops_its_tasks_on_sigterm(
    master: FakeMaster, tmp_path: Path
) -> None:
    pidfile = tmp_path / "child.pid"
    options = ("--cpus", "1", "--memory", "1Gi", "--labels", "zone=b,rack=r1")
    options += ("--taints", "gpu=yes:NoSchedule")
    with agent_process(master.address, tmp_path / "agent", *options) as proc:
        (reg,) = wait_for("a registration", lambda: master.registrations, timeout=10)
        wait_for("the stream", lambda: master.heartbeats())
        master.launch("cli/0", [f"sleep 60 & echo $! > {pidfile}; wait"])
        master.wait_running("cli/0")
        child = read_pid(pidfile)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        output = proc.stdout.read() if proc.stdout else ""
    node = reg.node
    assert (node.name, node.cpu_milli, node.memory) == ("node-cli", 1000, 2**30)
    assert node.labels["zone"] == "b" and node.labels["rack"] == "r1"
    assert [(t.key, t.value, t.effect) for t in node.taints] == [("gpu", "yes", "NoSchedule")]
    end = master.final("cli/0")
    assert end is not None and (end.state, end.message) == (FAILED, "lost: agent shutdown")  # requeued
    assert not alive(child)
    assert "registered as node-cli with 1 CPUs, 1.0 GiB memory" in output


def test_an_agent_told_to_keep_its_tasks_leaves_them_running_on_sigterm_for_the_next(tmp_path: Path) -> None:
    """--keep-tasks-on-stop: a SIGTERM (systemctl restart, an upgrade) stops the agent alone, as a
    kubelet's or slurmd's restart leaves the workloads: no task is reported lost, and the next
    agent on the work dir adopts the task still running and reports its end."""
    work, pidfile, stop_file = tmp_path / "agent", tmp_path / "k.pid", tmp_path / "stop"
    since = time.time() - 1
    first = FakeMaster()
    pid = 0
    try:
        with agent_process(first.address, work, "--keep-tasks-on-stop") as proc:
            wait_for("the stream", lambda: first.heartbeats(), timeout=10)
            first.launch("keep/0", [f"echo $$ > {pidfile}; while [ ! -e {stop_file} ]; do sleep 0.05; done"])
            first.wait_running("keep/0")
            pid = read_pid(pidfile)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 0
            output = proc.stdout.read() if proc.stdout else ""
        assert "leaving the tasks running for the next agent to adopt" in output
        assert first.final("keep/0") is None  # not reported lost: the master keeps it placed
        assert alive(pid)
        first.stop()
        second = FakeMaster(expected=("keep/0",))
        try:
            with agent_process(second.address, work, "--keep-tasks-on-stop") as proc:
                beat = wait_for("a heartbeat", lambda: second.heartbeats(), timeout=10)[-1]
                assert list(beat.running_task_ids) == ["keep/0"]
                stop_file.touch()
                done = second.wait_final("keep/0")
                proc.send_signal(signal.SIGINT)  # by hand, at a terminal: tasks go with it (none left)
                assert proc.wait(10) == 0
        finally:
            second.stop()
    finally:
        first.stop()
        kill_groups([pid] if pid else [], since)
    assert (done.state, done.exit_code) == (SUCCEEDED, 0)


def test_a_restarted_agent_adopts_the_tasks_still_running(tmp_path: Path) -> None:
    work = tmp_path / "agent"
    stop_file, pids = tmp_path / "stop", {t: tmp_path / f"{t}.pid" for t in ("a", "b", "c")}
    pid: dict[str, int] = {}
    since = time.time() - 1
    first = FakeMaster()
    try:
        with agent_process(first.address, work) as proc:
            wait_for("the stream", lambda: first.heartbeats(), timeout=10)
            first.launch("ad/a", [f"echo $$ > {pids['a']}; while [ ! -e {stop_file} ]; do sleep 0.05; done"])
            first.launch("ad/b", [f"echo $$ > {pids['b']}; exec sleep 60"])
            first.launch("ad/c", [f"sleep 60 & echo $! > {pids['c']}; wait"])
            for task in ("ad/a", "ad/b", "ad/c"):
                first.wait_running(task)
            pid.update({t: read_pid(p) for t, p in pids.items()})
            state = (work / "state.json").read_text()
            assert all(f'"ad/{t}"' in state for t in pid)  # written before RUNNING is reported
            proc.kill()  # the agent dies; its tasks do not
            proc.wait(10)
        first.stop()
        assert alive(pid["a"]) and alive(pid["c"])
        shim_b = os.getpgid(pid["b"])  # the task's shim leads its process group
        # ad/b ends while no agent watches it, and its shim with it: nothing records how it ended.
        os.killpg(shim_b, signal.SIGKILL)
        wait_for("ad/b to die", lambda: not alive(pid["b"]) and not alive(shim_b))

        second = FakeMaster(expected=("ad/a", "ad/b", "ad/c"))
        try:
            with agent_process(second.address, work) as proc:
                lost = second.wait_final("ad/b", timeout=10)
                beat = wait_for("a heartbeat", lambda: second.heartbeats())[-1]
                assert list(beat.running_task_ids) == ["ad/a", "ad/c"]
                assert alive(pid["a"])
                stop_file.touch()  # ad/a ends on its own: its shim recorded how
                done = second.wait_final("ad/a")
                second.kill("ad/c", "preempted")  # a kill reaches an adopted task's whole tree
                killed = second.wait_final("ad/c")
                wait_for("ad/c's child to be gone", lambda: not alive(pid["c"]))
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(10) == 0
        finally:
            second.stop()
    finally:
        first.stop()
        kill_groups(list(pid.values()), since)
    assert (lost.state, lost.message) == (FAILED, "lost: agent restarted")
    assert (done.state, done.exit_code, done.message) == (SUCCEEDED, 0, "")
    assert (killed.state, killed.message) == (FAILED, "killed: preempted")


def test_a_restarted_agent_goes_on_counting_an_adopted_services_restarts(tmp_path: Path) -> None:
    """The restarts of a service's run are the master's to show (`gosched get`): an agent
    restarted meanwhile counts on from the state file, not from 0."""
    work, go, runs, pidfile = tmp_path / "agent", tmp_path / "go", tmp_path / "runs", tmp_path / "pid"
    # The first process fails at once; the next ones wait for `go`, then fail as well.
    wait = f"while [ ! -e {go} ]; do sleep 0.05; done"
    command = f'echo $$ > {pidfile}; echo run >> {runs}; [ "$(wc -l < {runs})" -lt 2 ] || {wait}; exit 1'
    since = time.time() - 1
    pids: list[int] = []
    first = FakeMaster()
    try:
        with agent_process(first.address, work) as proc:
            wait_for("the stream", lambda: first.heartbeats(), timeout=10)
            first.launch("svc/0", [command], service=True)
            restart = first.wait_running("svc/0", count=2, timeout=10)[1]
            assert restart.restarts == 1
            pids.append(
                wait_for(
                    "the second process", lambda: runs.read_text().count("run") == 2 and read_pid(pidfile)
                )
            )
            proc.kill()  # the agent dies; the service's process does not
            proc.wait(10)
        first.stop()
        second = FakeMaster(expected=("svc/0",))
        try:
            with agent_process(second.address, work) as proc:
                wait_for("the stream", lambda: second.heartbeats(), timeout=10)
                go.touch()  # the adopted process fails: the agent restarts it, its second restart
                again = second.wait_running("svc/0", timeout=10)[0]
                pids.append(read_pid(pidfile))
                second.kill("svc/0", "cancelled")
                second.wait_final("svc/0")
        finally:
            second.stop()
    finally:
        first.stop()
        kill_groups(pids, since)
    assert (again.restarts, again.exit_code, again.message) == (2, 1, "exit code 1")


def test_a_restarted_agent_reports_how_adopted_tasks_exited(tmp_path: Path) -> None:
    """The agent cannot wait() for a task a previous agent process started: the task's shim
    records its exit code, whether the task ends after the new agent adopted it or before."""
    work, stop, gone = tmp_path / "agent", tmp_path / "stop", tmp_path / "gone"

    def until(path: Path) -> str:
        return f"echo $$ > {tmp_path}/$GOSCHED_TASK_INDEX.pid; while [ ! -e {path} ]; do sleep 0.05; done"

    tasks = {
        "ex/ok": f"{until(stop)}; exit 0",
        "ex/three": f"{until(stop)}; exit 3",
        "ex/signal": f"{until(stop)}; kill -USR1 $$",  # the task's own process dies of a signal
        "ex/early": f"{until(gone)}; exit 5",  # ends while no agent runs
    }
    since = time.time() - 1
    pid: dict[str, int] = {}
    first = FakeMaster()
    try:
        with agent_process(first.address, work) as proc:
            wait_for("the stream", lambda: first.heartbeats(), timeout=10)
            for index, (task, command) in enumerate(tasks.items()):
                first.launch(task, [command], index=index)
            for index, task in enumerate(tasks):
                first.wait_running(task)
                pid[task] = read_pid(tmp_path / f"{index}.pid")
            proc.kill()  # the agent dies; its tasks and their shims do not
            proc.wait(10)
        first.stop()
        shim_early = os.getpgid(pid["ex/early"])
        gone.touch()
        wait_for("ex/early and its shim to end", lambda: not alive(shim_early), timeout=10)

        second = FakeMaster(expected=tuple(tasks))
        try:
            with agent_process(second.address, work) as proc:
                early = second.wait_final("ex/early", timeout=10)
                beat = wait_for("a heartbeat", lambda: second.heartbeats())[-1]
                assert list(beat.running_task_ids) == ["ex/ok", "ex/signal", "ex/three"]
                stop.touch()
                ends = {task: second.wait_final(task) for task in ("ex/ok", "ex/three", "ex/signal")}
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(10) == 0
                output = proc.stdout.read() if proc.stdout else ""
        finally:
            second.stop()
    finally:
        first.stop()
        kill_groups(list(pid.values()), since)
    assert "adopted 3 running task(s) of the previous agent; 1 ended" in output
    assert (ends["ex/ok"].state, ends["ex/ok"].exit_code, ends["ex/ok"].message) == (SUCCEEDED, 0, "")
    three = ends["ex/three"]
    assert (three.state, three.exit_code, three.message) == (FAILED, 3, "exit code 3")
    killed = ends["ex/signal"]
    assert (killed.state, killed.exit_code) == (FAILED, 128 + signal.SIGUSR1)
    assert killed.message == "killed by signal SIGUSR1"
    assert (early.state, early.exit_code, early.message) == (FAILED, 5, "exit code 5")
    assert list((work / "logs").glob("*.exit*")) == []  # each one removed once reported


# == pieces ===========================================================================================
def test_container_command_lines() -> None:
    docker = Container("/usr/bin/docker", container_name("job 1/0"))
    assert docker.name == "gosched-job-1-0"
    argv = docker.run_argv("img:1", ["python train.py"], {"X": "1"}, [0, 2], cpu_milli=1500, memory=2**30)
    assert argv == [
        "/usr/bin/docker", "run", "--rm", "--name", "gosched-job-1-0", "--gpus", '"device=0,2"',
        "-e", "X=1", "-e", "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "--cpus", "1.5", "--memory", str(2**30), "img:1", "sh", "-c", "python train.py",
    ]  # fmt: skip
    podman = Container("/usr/bin/podman", "gosched-j-0")
    argv = podman.run_argv("img:1", ["python", "-c", "pass"], {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, [1])
    assert argv == [
        "/usr/bin/podman", "run", "--rm", "--name", "gosched-j-0", "--replace",
        "-e", "NVIDIA_VISIBLE_DEVICES=1",
        "-e", "CUDA_DEVICE_ORDER=FASTEST_FIRST", "-e", "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "img:1", "python", "-c", "pass",
    ]  # fmt: skip
    # With GPUs the agent's order comes last, and so wins (docker and podman take the last -e);
    # without GPUs nothing GPU-related is set.
    argv = docker.run_argv("img:1", [], {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, [])
    assert argv == [
        "/usr/bin/docker", "run", "--rm", "--name", "gosched-job-1-0",
        "-e", "CUDA_DEVICE_ORDER=FASTEST_FIRST", "img:1",
    ]  # fmt: skip
    line = docker.shell_command(["/usr/bin/docker", "run", "x"])
    assert line == "/usr/bin/docker rm -f gosched-job-1-0 >/dev/null 2>&1; exec /usr/bin/docker run x"


def test_label_and_taint_options() -> None:
    assert parse_labels("a=1, b=two,") == {"a": "1", "b": "two"}
    assert parse_taints("gpu=yes:NoSchedule,spot:NoExecute,x") == (
        Taint("gpu", "yes", TaintEffect.NO_SCHEDULE),
        Taint("spot", "", TaintEffect.NO_EXECUTE),
        Taint("x", "", TaintEffect.NO_SCHEDULE),
    )
    for bad in ("novalue", "=x"):
        with pytest.raises(ValueError):
            parse_labels(bad)
    with pytest.raises(ValueError, match="effect"):
        parse_taints("a=b:Sometimes")
