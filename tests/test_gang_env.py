"""A gang's rendezvous in its tasks' environment: the job's task count, the task's place in its
group, the hosts of all its tasks in index order, the leader's host and a port for it, and the
conventional WORLD_SIZE / RANK / MASTER_ADDR / MASTER_PORT (under the job's own env), as Slurm's
SLURM_NTASKS / SLURM_PROCID / SLURM_JOB_NODELIST and Kubeflow's PyTorchJob give them.

Real parts: the master in process (loopback gRPC, runtime local), `gosched agent` programs, and
real shell tasks that write their environment to a file.
"""

import socket
import subprocess
import time
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from gosched import Client
from gosched.agent.rendezvous import gang_env
from gosched.api.agents import RENDEZVOUS_PORTS
from gosched.common.states import JobState, TaskState
from gosched.proto.v1 import agent_pb2
from tests.test_agent_gateway import agent_program, connected, start_master, wait_for

GANG_VARS = (
    "GOSCHED_NUM_TASKS",
    "GOSCHED_ROLE_INDEX",
    "GOSCHED_ROLE_REPLICAS",
    "GOSCHED_TASK_HOSTS",
    "GOSCHED_LEADER_HOST",
    "GOSCHED_LEADER_PORT",
    "WORLD_SIZE",
    "RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@contextmanager
def agents(target: str, root: Path, hosts: Mapping[str, str | None]) -> Iterator[None]:
    """`gosched agent` programs of one CPU each, by node name; a host given is advertised in the
    node's gosched.io/hostname label (None: the one the agent discovers)."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for name, host in hosts.items():
            labels = f"gosched.io/hostname={host}" if host is not None else "zone=a"
            procs.append(agent_program(target, name, root / name, "--cpus", "1", "--labels", labels))
        with Client(target, timeout=10) as client:
            wait_for("the agents", lambda: all(connected(client, n) for n in hosts), timeout=30)
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def dump_env(out: Path, then: str = "") -> str:
    """A task that writes its environment to out/env.<index>.<attempt> (whole, by a rename)."""
    f = f"{out}/env.$GOSCHED_TASK_INDEX.$GOSCHED_ATTEMPT"
    return f"env > {f}.tmp && mv {f}.tmp {f}; {then}"


def read_env(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        key, eq, value = line.partition("=")
        if eq:
            env[key] = value
    return env


def port_of(job_id: str) -> int:
    return RENDEZVOUS_PORTS[zlib.crc32(job_id.encode()) % len(RENDEZVOUS_PORTS)]


def test_a_gang_across_two_agents_gets_its_size_ranks_and_hosts(tmp_path: Path) -> None:
    """Two groups of one task each, 0.6 CPU on nodes of one: one task per node. Node a advertises
    host-a.example; b the hostname it discovered. The worker's group sets MASTER_PORT itself."""
    out = tmp_path / "out"
    out.mkdir()
    hosts = {"a": "host-a.example", "b": None}
    address = {"a": "host-a.example", "b": socket.gethostname()}
    master = start_master(tmp_path / "g.db", node_timeout_s=60)
    try:
        with agents(master.target, tmp_path, hosts), Client(master.target, timeout=10) as client:
            task = {"cpu": "0.6", "command": [dump_env(out)]}
            client.submit(
                {
                    "id": "ddp",
                    "min_member": 2,
                    "groups": [
                        {"role": "leader", **task},
                        {"role": "worker", **task, "env": {"MASTER_PORT": "12345", "X": "1"}},
                    ],
                }
            )
            wait_for("the gang done", lambda: client.get("ddp").state is JobState.SUCCEEDED, timeout=30)
            nodes = [t.node for t in client.get("ddp").tasks]
            assert sorted(nodes) == ["a", "b"]  # one on each agent
            listed = ",".join(address[n] for n in nodes)
            envs = [read_env(out / f"env.{i}.0") for i in range(2)]
            for i, env in enumerate(envs):
                assert env["GOSCHED_NUM_TASKS"] == "2"
                assert (env["GOSCHED_TASK_ROLE"], env["GOSCHED_ROLE_INDEX"]) == (["leader", "worker"][i], "0")
                assert env["GOSCHED_ROLE_REPLICAS"] == "1"
                assert env["GOSCHED_TASK_HOSTS"] == listed  # in task index order
                assert env["GOSCHED_LEADER_HOST"] == address[nodes[0]]
                assert env["GOSCHED_LEADER_PORT"] == str(port_of("ddp"))
                assert (env["WORLD_SIZE"], env["RANK"]) == ("2", str(i))
                assert env["MASTER_ADDR"] == address[nodes[0]]
            assert envs[0]["MASTER_PORT"] == str(port_of("ddp"))
            assert envs[1]["MASTER_PORT"] == "12345"  # the job's own env wins

            # One group of two replicas: the role index counts within the group.
            client.submit({"id": "pair", "replicas": 2, "min_member": 2, **task})
            wait_for("the pair done", lambda: client.get("pair").state is JobState.SUCCEEDED, timeout=30)
            roles = [read_env(out / f"env.{i}.0") for i in range(2)]
            assert [(e["GOSCHED_ROLE_INDEX"], e["GOSCHED_ROLE_REPLICAS"]) for e in roles] == [
                ("0", "2"),
                ("1", "2"),
            ]

            # A single task: its count, host and leader, but no torch variables (it needs no
            # rendezvous, and a program that joins a process group whenever RANK is set would).
            (out / "env.0.0").unlink()
            client.submit({"id": "solo", **task})
            wait_for("solo done", lambda: client.get("solo").state is JobState.SUCCEEDED, timeout=30)
            solo = read_env(out / "env.0.0")
            (node,) = [t.node for t in client.get("solo").tasks]
            assert solo["GOSCHED_NUM_TASKS"] == "1"
            assert solo["GOSCHED_TASK_HOSTS"] == solo["GOSCHED_LEADER_HOST"] == address[node]
            assert not {"WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"} & set(solo)
    finally:
        master.stop()


def test_a_task_bound_again_gets_the_current_hosts_of_its_peers(tmp_path: Path) -> None:
    """Task 1 of a gang fails once on its node, which was cordoned meanwhile: its retry runs on
    another node, and that run's environment lists the nodes the gang holds now, not the first."""
    out = tmp_path / "out"
    out.mkdir()
    fail = tmp_path / "fail"
    hosts = {n: f"host-{n}" for n in ("a", "b", "c")}
    script = dump_env(
        out,
        f'if [ "$GOSCHED_ATTEMPT" = 0 ] && [ "$GOSCHED_TASK_INDEX" = 1 ]; then '
        f"while [ ! -e {fail} ]; do sleep 0.05; done; exit 3; fi; sleep 60",
    )
    master = start_master(
        tmp_path / "g.db", node_timeout_s=60, failure_backoff_s=0.2, failure_backoff_max_s=0.2
    )
    try:
        with agents(master.target, tmp_path, hosts), Client(master.target, timeout=10) as client:
            client.submit(
                {
                    "id": "gang",
                    "replicas": 2,
                    "min_member": 2,
                    "cpu": "0.6",
                    "max_retries": 2,
                    "command": [script],
                }
            )

            def running() -> bool:
                return all(t.state is TaskState.RUNNING for t in client.get("gang").tasks)

            wait_for("the gang running", running, timeout=30)
            wait_for("both envs", lambda: len(list(out.glob("env.*.0"))) == 2)
            first = [t.node for t in client.get("gang").tasks]
            before = read_env(out / "env.1.0")
            assert before["GOSCHED_TASK_HOSTS"] == ",".join(hosts[n] for n in first)
            client.cordon(first[1])
            fail.touch()

            def retried() -> list[Path]:
                return sorted(out.glob("env.1.*"))[1:]

            wait_for("task 1 run again", retried, timeout=30)
            wait_for("the gang running again", running, timeout=30)
            now = [t.node for t in client.get("gang").tasks]
            assert now[1] != first[1]  # bound again elsewhere
            (again,) = retried()
            env = read_env(again)
            assert env["GOSCHED_ATTEMPT"] != "0"
            assert env["GOSCHED_TASK_HOSTS"] == ",".join(hosts[n] for n in now)
            assert env["GOSCHED_LEADER_HOST"] == env["MASTER_ADDR"] == hosts[now[0]]
            assert env["MASTER_PORT"] == before["MASTER_PORT"] == str(port_of("gang"))  # the same port
            client.cancel("gang")
            time.sleep(0.2)
    finally:
        master.stop()


def test_a_launch_from_an_older_master_sets_none_of_the_variables() -> None:
    """The fields absent (num_tasks 0): no rendezvous variable, not one made of defaults."""
    old = agent_pb2.LaunchTask(task_id="j/0", job_id="j", index=0, command=["true"])
    assert gang_env(old) == {}
    assert not set(GANG_VARS) & set(gang_env(old))
    # And a job too large to list every host gets its leader's alone.
    big = agent_pb2.LaunchTask(task_id="j/3", job_id="j", index=3, num_tasks=10_000, task_hosts=["h0"])
    env = gang_env(big)
    assert "GOSCHED_TASK_HOSTS" not in env
    assert env["GOSCHED_LEADER_HOST"] == env["MASTER_ADDR"] == "h0"
    assert (env["WORLD_SIZE"], env["RANK"]) == ("10000", "3")
