"""The running system end to end: the master with its components as real Ray actors, real gRPC on
loopback, real node agent processes running real shell tasks, and the `gosched` CLI."""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from gosched import Client
from gosched.api.server import ServerHandle, serve
from gosched.common.config import Settings
from gosched.common.node import NodeState
from gosched.common.states import JobState, TaskState

NODE_TIMEOUT_S = 3.0


def _settings(store: Path, **extra: object) -> Settings:
    return Settings(
        store_path=str(store),
        shards=2,
        retry_backoff_s=0.02,
        retry_backoff_max_s=0.2,
        heartbeat_interval_s=0.3,
        node_timeout_s=NODE_TIMEOUT_S,
        **extra,  # type: ignore[arg-type]
    )


def start_master(store: Path, port: int = 0, runtime: str = "ray") -> ServerHandle:
    return serve(
        _settings(store),
        (),
        grpc_port=port,
        http_port=None,
        host="127.0.0.1",
        runtime=runtime,
        heartbeat_interval_s=0.3,
        node_timeout_s=NODE_TIMEOUT_S,
        wait_ready=True,
    )


@dataclass
class Agents:
    target: str
    root: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, *, cpus: str = "2", labels: str = "pool=e2e") -> None:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - the process owns it
        self.procs[name] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gosched.cli.main",
                "agent",
                "--master",
                self.target,
                "--name",
                name,
                "--cpus",
                cpus,
                "--memory",
                "4Gi",
                "--labels",
                labels,
                "--work-dir",
                str(self.root / name),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def kill9(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()


def wait_for(what: str, check: object, timeout: float = 30.0) -> object:
    deadline = time.monotonic() + timeout
    while True:
        got = check()  # type: ignore[operator]
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def ready_nodes(client: Client, names: set[str]) -> bool:
    ready = {n.name for n in client.nodes() if n.state is NodeState.READY and n.agent_connected}
    return names <= ready


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerHandle, Client, Agents]]:
    root = tmp_path_factory.mktemp("e2e")
    handle = start_master(root / "gosched.db")
    agents = Agents(handle.target, root)
    agents.start("e2e-a")
    agents.start("e2e-b")
    client = Client(handle.target, timeout=20)
    try:
        wait_for("two agents", lambda: ready_nodes(client, {"e2e-a", "e2e-b"}))
        yield handle, client, agents
    finally:
        client.close()
        agents.stop_all()
        handle.stop()


def shell_job(job_id: str, script: str, *, replicas: int = 1, pool: str = "e2e", **extra: object) -> dict:
    return {
        "id": job_id,
        "replicas": replicas,
        "min_member": replicas,
        "cpu": "500m",
        "memory": "64Mi",
        "command": ["sh", "-c", script],
        "node_selector": {"pool": pool},
        **extra,
    }


def test_gang_job_runs_to_success_with_its_output(system: tuple[ServerHandle, Client, Agents]) -> None:
    _, client, _ = system
    job = client.submit(shell_job("hello", 'echo "out of $GOSCHED_TASK_ID"; echo oops >&2', replicas=3))
    info = client.wait(job, timeout=60)
    assert info.state is JobState.SUCCEEDED
    assert [t.state for t in info.tasks] == [TaskState.SUCCEEDED] * 3
    for task in info.tasks:
        out = b"".join(client.logs(job, task=task.index)).decode()
        assert out == f"out of {task.id}\n"
        assert b"".join(client.logs(job, task=task.index, stream="stderr")) == b"oops\n"


def test_exit_code_failure_and_explain_of_a_job_too_big(system: tuple[ServerHandle, Client, Agents]) -> None:
    _, client, _ = system
    failed = client.wait(client.submit(shell_job("fails", "exit 3")), timeout=60)
    assert failed.state is JobState.FAILED
    big = client.submit(shell_job("too-big", "true", cpu="64"))
    time.sleep(1.0)
    assert client.get(big).state is JobState.PENDING
    why = client.explain(big)
    assert "node too small for cpu" in why.lower(), why  # not "insufficient": no node ever fits it
    client.cancel(big)


def test_cancel_kills_the_running_process_tree(system: tuple[ServerHandle, Client, Agents]) -> None:
    _, client, _ = system
    marker = "7333.25"  # a sleep no other process on this machine runs
    job = client.submit(shell_job("long", f"sleep {marker} & sleep {marker}; wait"))
    client.wait(job, states={JobState.RUNNING}, timeout=30)
    wait_for("the task's processes", lambda: len(_sleepers(marker)) == 2, timeout=15)
    client.cancel(job)
    assert client.get(job).state is JobState.CANCELLED
    wait_for("the process tree to be gone", lambda: not _sleepers(marker), timeout=20)


def _sleepers(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if cmd[:2] == ["sleep", marker]:
            found.append(p)
    return found


def test_cli_submit_wait_and_listing(system: tuple[ServerHandle, Client, Agents]) -> None:
    handle, client, _ = system
    gosched = [sys.executable, "-m", "gosched.cli.main"]
    env = {**os.environ, "GOSCHED_MASTER": handle.target}
    ok = subprocess.run(
        [
            *gosched,
            "submit",
            "--cpus",
            "0.5",
            "--mem",
            "64Mi",
            "--replicas",
            "2",
            "--min-member",
            "2",
            "--selector",
            "pool=e2e",
            "--name",
            "from-cli",
            "--wait",
            "--",
            "sh",
            "-c",
            "echo cli",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert client.get("from-cli").state is JobState.SUCCEEDED
    bad = subprocess.run(
        [
            *gosched,
            "submit",
            "--cpus",
            "0.5",
            "--mem",
            "64Mi",
            "--selector",
            "pool=e2e",
            "--name",
            "cli-fails",
            "--wait",
            "--",
            "sh",
            "-c",
            "exit 4",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert bad.returncode == 1, bad.stdout + bad.stderr
    listed = subprocess.run(
        [*gosched, "nodes", "-o", "json"], env=env, capture_output=True, text=True, timeout=30
    )
    assert listed.returncode == 0, listed.stderr
    names = {n["name"] for n in json.loads(listed.stdout)}
    assert {"e2e-a", "e2e-b"} <= names


def test_agent_killed_tasks_requeued_and_never_run_twice(
    system: tuple[ServerHandle, Client, Agents], tmp_path: Path
) -> None:
    """kill -9 an agent while its task runs: the node times out, the task runs again on the other
    node and finishes; the agent comes back and kills its stale copy before that copy could end."""
    _, client, agents = system
    agents.start("kill-a", labels="pool=kill")
    agents.start("kill-b", labels="pool=kill")
    wait_for("the pool=kill agents", lambda: ready_nodes(client, {"kill-a", "kill-b"}))
    runs = tmp_path / "runs"
    script = f'echo "start $GOSCHED_TASK_ID $GOSCHED_ATTEMPT" >> {runs}; sleep 8; echo end >> {runs}'
    job = client.submit(shell_job("survivor", script, pool="kill", cpu="2"))
    first = client.wait(job, states={JobState.RUNNING}, timeout=30)
    victim = first.tasks[0].node
    other = ({"kill-a", "kill-b"} - {victim}).pop()
    wait_for("the first run to start", lambda: runs.exists() and runs.read_text().count("start") == 1)
    agents.kill9(victim)
    # The node misses its heartbeats, is marked not ready, and the task goes to the other node.
    wait_for("the task on the other node", lambda: _node_of(client, job) == other, timeout=30)
    assert client.node(victim).state is NodeState.NOT_READY
    agents.start(victim, labels="pool=kill")  # back: it must kill the stale copy, not finish it
    done = client.wait(job, timeout=60)
    assert done.state is JobState.SUCCEEDED
    wait_for("the victim back", lambda: ready_nodes(client, {victim}))
    time.sleep(1.0)
    lines = runs.read_text().splitlines()
    assert lines.count("end") == 1, lines  # the stale copy never finished
    # Two runs, the second told it is the task's first restart (GOSCHED_ATTEMPT).
    assert sorted(line for line in lines if line.startswith("start")) == [
        f"start {job}/0 0",
        f"start {job}/0 1",
    ]


def _node_of(client: Client, job: str) -> str:
    info = client.get(job)
    task = info.tasks[0]
    return task.node if task.state in (TaskState.BOUND, TaskState.RUNNING) else ""


def test_master_restart_keeps_running_and_pending_jobs(tmp_path: Path) -> None:
    """Stop the whole master while one job runs on an agent and another waits for room; start it
    again on the same store and port: both are there in their states, the running one was never
    restarted, and the pending one is scheduled once room appears."""
    store = tmp_path / "gosched.db"
    handle = start_master(store)
    port = handle.grpc_port
    agents = Agents(handle.target, tmp_path)
    agents.start("r-a", cpus="1", labels="pool=restart")
    try:
        with Client(handle.target, timeout=20) as client:
            wait_for("the agent", lambda: ready_nodes(client, {"r-a"}))
            running = client.submit(shell_job("keeps-running", "sleep 6; echo done", pool="restart", cpu="1"))
            client.wait(running, states={JobState.RUNNING}, timeout=30)
            pending = client.submit(shell_job("waits", "echo later", pool="restart", cpu="1"))
            time.sleep(0.5)
            assert client.get(pending).state is JobState.PENDING
        handle.stop()
        handle = start_master(store, port=port)
        with Client(handle.target, timeout=20) as client:
            assert client.get(running).state is JobState.RUNNING
            assert client.get(pending).state is JobState.PENDING
            wait_for("the agent to reconnect", lambda: ready_nodes(client, {"r-a"}))
            assert client.wait(running, timeout=30).state is JobState.SUCCEEDED
            assert b"".join(client.logs(running, task=0)) == b"done\n"
            assert client.wait(pending, timeout=30).state is JobState.SUCCEEDED  # room freed
    finally:
        agents.stop_all()
        handle.stop()


def test_master_loses_a_shard_actor_while_10000_jobs_flow(tmp_path: Path) -> None:
    """The master's own loop (RayControl.step), not the batch driver: a shard actor killed mid-flow
    is restarted, its units go back to the queue, and every job is bound exactly once."""
    import ray

    from gosched.runtime.ray_control import RayControl
    from gosched.runtime.simulation import sim_nodes

    handle = serve(
        _settings(tmp_path / "gosched.db", batch_size=256),
        sim_nodes(200),
        grpc_port=0,
        http_port=None,
        host="127.0.0.1",
        runtime="ray",
        wait_ready=True,
    )
    try:
        with Client(handle.target, timeout=60) as client:
            # 10,000 half-core tasks on 9,600 cores: they all fit.
            spec = {"cpu": "500m", "memory": "1Gi", "command": "true"}
            specs = [{"id": f"j{i}", **spec} for i in range(10_000)]
            client.submit_many(specs[:5_000])
            control = handle.service.control
            assert isinstance(control, RayControl)
            wait_for("work flowing", lambda: client.status()["bound_tasks"] > 500)
            ray.kill(control.rs.shards[0], no_restart=False)
            client.submit_many(specs[5_000:])
            wait_for("every job bound", lambda: client.status()["bound_tasks"] >= 10_000, timeout=120)
            time.sleep(0.5)
            with handle.service.lock:
                resident = control.rs.resident_ids()
            assert len(resident) == len(set(resident)) == 10_000
            assert control.rs.counters["shard_restarts"] >= 1
            assert all(j.state is JobState.RUNNING for j in client.list())
    finally:
        handle.stop()


def test_gosched_up_shows_the_system_working(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gosched.cli.main",
            "up",
            "--exit-after-demo",
            "--sim-nodes",
            "4",
            "--shards",
            "2",
            "--grpc-port",
            "0",
            "--http-port",
            "0",
            "--work-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "cluster: 5 nodes" in out
    assert "hello from gosched on" in out
    assert "too few GPUs" in out
    assert "up and working in" in out
