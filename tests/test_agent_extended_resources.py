"""`gosched agent --extended NAME=COUNT,...`: the countable resources a machine has that the agent
cannot find itself (FPGAs, RDMA adapters). The flag is checked before the agent starts anything, with
the job spec's own name rule; the agent registers them with its node, again after a reconnect; jobs
that ask for them run there as far as the counts go, and the next one waits, saying for what."""

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from typer.testing import CliRunner

from gosched import Client
from gosched.agent import runner as agent_runner
from gosched.agent.runner import AgentRunner
from gosched.api.server import ServerHandle
from gosched.cli.exits import ExitCode
from gosched.cli.main import app
from gosched.common.spec import job_from_spec
from gosched.common.states import JobState, TaskState
from tests.polling import stop_process, wait_for
from tests.test_agent_gateway import GOSCHED, start_master

T = TypeVar("T")
FPGA = "example.com/fpga"




# == the flag =========================================================================================
class _Started(Exception):
    """Raised where the agent would start: reaching it means the flags passed."""


@pytest.fixture
def runner_kwargs(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What `gosched agent` hands AgentRunner, which is never built for real here."""
    seen: dict[str, Any] = {}

    def record(*args: Any, **kwargs: Any) -> None:
        seen.update(kwargs)
        raise _Started("AgentRunner")

    monkeypatch.setattr(agent_runner, "AgentRunner", record)
    return seen


# (--extended, a piece of the reason the error must give)
BAD: list[tuple[str, str]] = [
    ("example.com/fpga", "is not NAME=COUNT"),
    ("=2", "is not NAME=COUNT"),
    ("example.com/fpga=", "is not NAME=COUNT"),
    ("Example.com/fpga=1", "resource name 'Example.com/fpga': prefix 'Example.com' is not a DNS subdomain"),
    ("bad name=1", "resource name 'bad name': the name must be 1-63 characters"),
    ("example.com/-fpga=1", "resource name 'example.com/-fpga': the name must be"),
    (f"example.com/{'x' * 64}=1", "the name must be 1-63 characters"),
    ("example.com/fpga=0", "the count must be a whole number from 1 to"),
    ("example.com/fpga=-1", "the count must be a whole number from 1 to"),
    ("example.com/fpga=1.5", "the count must be a whole number from 1 to"),
    ("example.com/fpga=2Gi", "the count must be a whole number from 1 to"),
    ("example.com/fpga=two", "the count must be a whole number from 1 to"),
    ("example.com/fpga=1=2", "the count must be a whole number from 1 to"),
    ("example.com/fpga=1000000000000001", "the count must be a whole number from 1 to 1000000000000000"),
    ("example.com/fpga=2,rdma/hca=1,example.com/fpga=3", "example.com/fpga given twice, as 2 and as 3"),
    ("cpu=4", "cpu is a built-in resource"),
    ("CPU=4", "CPU is a built-in resource"),
    ("memory=1", "memory is a built-in resource"),
    ("gpu=1", "gpu is a built-in resource"),
    ("gpus=1", "gpus is a built-in resource"),
    ("nvidia.com/gpu=8", "nvidia.com/gpu is a built-in resource"),
]


@pytest.mark.parametrize(("value", "reason"), BAD, ids=[v[:40] for v, _ in BAD])
def test_a_bad_extended_flag_is_a_usage_error_naming_it(
    value: str, reason: str, runner_kwargs: dict[str, Any], tmp_path: Path
) -> None:
    work = tmp_path / "agent"
    args = ["agent", "--master", "127.0.0.1:1", "--work-dir", str(work), "--extended", value]
    result = CliRunner().invoke(app, args)
    assert not isinstance(result.exception, _Started), result.output
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stderr.startswith("error: --extended: "), result.stderr
    assert reason in result.stderr, result.stderr
    assert "Traceback" not in result.output and not work.exists()


GOOD: list[tuple[str, dict[str, int]]] = [
    ("", {}),
    ("example.com/fpga=2", {FPGA: 2}),
    (" example.com/fpga = 2 , rdma/hca=1 ,", {FPGA: 2, "rdma/hca": 1}),
    ("example.com/fpga=2,example.com/fpga=2", {FPGA: 2}),  # the same again: no conflict
    ("vendor.io/Accel_v2=1e3", {"vendor.io/Accel_v2": 1000}),  # a count as the spec reads one
    ("plain=1", {"plain": 1}),  # no prefix, as in a job spec
]


@pytest.mark.parametrize(("value", "expected"), GOOD, ids=[v or "none" for v, _ in GOOD])
def test_good_extended_flags_reach_the_runner(
    value: str, expected: dict[str, int], runner_kwargs: dict[str, Any]
) -> None:
    result = CliRunner().invoke(app, ["agent", "--master", "127.0.0.1:1", "--extended", value])
    assert isinstance(result.exception, _Started), result.output
    assert runner_kwargs["extended"] == expected
    # every name the flag takes is one a job may ask for: the spec's rule, not a second one
    if expected:
        spec = {"command": "true", "cpu": 1, "extended": expected}
        assert dict(job_from_spec(spec).groups[0].resources.extended) == expected


def test_the_help_tells_of_the_flag() -> None:
    result = CliRunner().invoke(app, ["agent", "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert "--extended" in result.stdout and "example.com/fpga=2" in result.stdout


def test_the_registered_node_has_them_and_a_relabel_keeps_them(tmp_path: Path) -> None:
    runner = AgentRunner(
        "127.0.0.1:1", "n1", work_dir=tmp_path, extended={FPGA: 2, "rdma/hca": 1},
        container_runtime=None, nvml=None,
    )  # fmt: skip
    assert runner.node.extended == (("example.com/fpga", 2), ("rdma/hca", 1))
    assert dict(runner._register_request().node.extended) == {FPGA: 2, "rdma/hca": 1}
    runner._runtime_probed("/usr/bin/docker", "")  # docker came up: the node is labelled anew
    update = runner._outbox.take(1.0)
    assert update is not None and update.HasField("node_update")
    assert dict(update.node_update.extended) == {FPGA: 2, "rdma/hca": 1}
    assert dict(runner._register_request().node.extended) == {FPGA: 2, "rdma/hca": 1}


# == a real agent, a real master ======================================================================
@contextmanager
def agent_process(target: str, name: str, work_dir: Path, *more: str) -> Iterator[subprocess.Popen[str]]:
    argv = [str(GOSCHED), "agent", "--master", target, "--name", name, "--work-dir", str(work_dir)]
    proc = subprocess.Popen(
        [*argv, "--grace", "1", "--runtime-probe", "0", *more],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield proc
    finally:
        stop_process(proc, 15)


def fpga_job(job_id: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "id": job_id,
        "replicas": replicas,
        "min_member": 1,
        "cpu": "10m",
        "memory": "16Mi",
        "extended": {FPGA: 1},
        "command": "sleep 60",
    }


def running_on(client: Client, job_id: str, node: str, count: int) -> bool:
    tasks = client.get(job_id).tasks
    return len(tasks) == count and all(t.state is TaskState.RUNNING and t.node == node for t in tasks)


def reason_naming(client: Client, job_id: str, resource: str) -> str:
    why = client.explain(job_id)
    return why if resource in why else ""


def test_an_agents_extended_resources_are_scheduled_and_survive_a_reconnect(tmp_path: Path) -> None:
    master: ServerHandle | None = start_master(tmp_path / "one.db", node_timeout_s=30.0)
    assert master is not None
    port = int(master.target.rpartition(":")[2])
    try:
        with agent_process(master.target, "fpga-1", tmp_path / "agent", "--extended", f"{FPGA}=2") as proc:
            with Client(master.target, timeout=10) as client:
                node = wait_for("the agent's node", lambda: [n for n in client.nodes() if n.agent_connected])
                assert [n.name for n in node] == ["fpga-1"]
                assert node[0].node.extended == ((FPGA, 2),)

                # Two tasks that want one FPGA each run there; a third waits for an FPGA.
                client.submit(fpga_job("pair", replicas=2))
                wait_for("both FPGA tasks running", lambda: running_on(client, "pair", "fpga-1", 2))
                client.submit(fpga_job("third"))
                why = wait_for("why the third waits", lambda: reason_naming(client, "third", FPGA))
                assert f"insufficient {FPGA}" in why, why
                assert client.get("third").state is JobState.PENDING
                assert [t.state for t in client.get("third").tasks] == [TaskState.PENDING]

                # `gosched nodes` shows them: -o json and -o wide.
                nodes = CliRunner().invoke(app, ["nodes", "--master", master.target, "-o", "json"])
                assert nodes.exit_code == 0, nodes.output
                assert [n["extended"] for n in json.loads(nodes.stdout)] == [{FPGA: 2}]
                wide = CliRunner().invoke(app, ["nodes", "--master", master.target, "-o", "wide"])
                assert "EXTENDED" in wide.stdout.splitlines()[0] and f"{FPGA}=2" in wide.stdout

                # Freed FPGAs go to the one waiting: it waited for them, nothing else.
                client.cancel("pair")
                wait_for("the third running", lambda: running_on(client, "third", "fpga-1", 1))

            # A master that never saw this node (a new store, the same address): the agent
            # registers again, and its FPGAs come with it.
            master.stop()
            master = None
            master = start_master(tmp_path / "two.db", node_timeout_s=30.0, port=port)
            with Client(master.target, timeout=10) as client:
                again = wait_for("the agent back", lambda: [n for n in client.nodes() if n.agent_connected])
                assert again[0].node.extended == ((FPGA, 2),)
                client.submit(fpga_job("after", replicas=2))
                wait_for("FPGA tasks on the new master", lambda: running_on(client, "after", "fpga-1", 2))
            assert proc.poll() is None
        output = proc.stdout.read() if proc.stdout else ""
        assert "registered as fpga-1 with " in output and "registered again as fpga-1 with " in output
        assert output.count(f"GPUs, {FPGA}=2 (") == 2, output  # at both registrations
    finally:
        if master is not None:
            master.stop()
