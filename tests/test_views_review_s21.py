"""The client views after the review of what scripts and operators read (s21): a job's limits in
`get`/`jobs -o json|yaml`, "drained" nodes, `cancel` of several jobs, and `logs` of a task on a
simulated node. Against a real master on loopback over simulated nodes whose tasks run an hour
(a job's gosched.io/sim-seconds label shortens it)."""

import json
import re
import time
from collections.abc import Iterator

import pytest
import yaml

from gosched import Client
from gosched.api.convert import NodeInfo
from gosched.api.server import ServerHandle
from gosched.cli.exits import ExitCode
from gosched.cli.output import node_data, nodes_view
from gosched.common.node import AGENT_LABEL, RUNTIME_LABEL, NodeState, make_node
from gosched.common.states import JobState
from tests.loopback import cli as run
from tests.loopback import sim_master
from tests.polling import wait_for

# sim_nodes(4): sim-00000 is the GPU node (zone z0), sim-0000i a CPU node in zone zi.


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    handle = sim_master(tmp_path_factory.mktemp("s21"), nodes=4, task_seconds=3600.0)
    yield handle
    handle.stop()


def pending_job(client: Client, **extra: object) -> str:
    """A job no node can take (sixteen GPUs in one task): it stays pending."""
    return client.submit({"command": ["sleep", "1"], "cpu": 1, "gpus": 16, **extra})


# -- 1. a job's deadline, time limit and retries in the data views --------------------------------
def test_get_and_jobs_data_carry_deadline_time_limit_and_max_retries(
    server: ServerHandle, client: Client
) -> None:
    deadline = float(int(time.time()) + 2 * 86400 + 600)
    job = pending_job(
        client, id="dl1", tenant="s21-limits", deadline=deadline, time_limit="1h30m", max_retries=2
    )
    plain = pending_job(client, tenant="s21-limits")
    try:
        as_yaml = yaml.safe_load(run(server, "get", job, "-o", "yaml").stdout)
        assert (as_yaml["deadline"], as_yaml["time_limit"], as_yaml["max_retries"]) == (deadline, 5400.0, 2)
        as_json = json.loads(run(server, "get", job, "-o", "json").stdout)
        assert (as_json["deadline"], as_json["time_limit"], as_json["max_retries"]) == (deadline, 5400.0, 2)

        listed = {
            j["id"]: j for j in json.loads(run(server, "jobs", "--tenant", "s21-limits", "-o", "json").stdout)
        }
        assert (listed[job]["deadline"], listed[job]["time_limit"], listed[job]["max_retries"]) == (
            deadline,
            5400.0,
            2,
        )
        # Unset: null, null and 0 (the keys are always there, for scripts).
        assert (listed[plain]["deadline"], listed[plain]["time_limit"], listed[plain]["max_retries"]) == (
            None,
            None,
            0,
        )
        listed_yaml = yaml.safe_load(run(server, "jobs", "--tenant", "s21-limits", "-o", "yaml").stdout)
        assert [j["max_retries"] for j in listed_yaml] == [2, 0]

        # The table of `get` shows them too, as describe does.
        text = run(server, "get", job).stdout
        assert re.search(r"^Deadline: +\S+ \(in 2d\)$", text, re.M), text
        assert re.search(r"^Time limit: +1h30m per task$", text, re.M), text
        assert re.search(r"^Max retries: +2 per task$", text, re.M), text
        assert "Deadline:" not in run(server, "get", plain).stdout
    finally:
        client.cancel(job)
        client.cancel(plain)


# -- 3. a draining node with no task left is "drained" --------------------------------------------
def info_of(state: NodeState, tasks: tuple[str, ...]) -> NodeInfo:
    return NodeInfo(node=make_node("n1", 4000, 2**30, state=state), task_ids=tasks)


def test_a_draining_node_with_no_task_shows_drained() -> None:
    empty, busy = info_of(NodeState.DRAINING, ()), info_of(NodeState.DRAINING, ("j/0",))
    assert (empty.drained, empty.state_text) == (True, "drained")
    assert (busy.drained, busy.state_text) == (False, "draining")
    for state in (NodeState.READY, NodeState.CORDONED, NodeState.NOT_READY):  # only a draining one
        assert info_of(state, ()).state_text == state.value
    assert node_data(empty)["state"] == "drained" and node_data(busy)["state"] == "draining"
    assert nodes_view([empty]).splitlines()[1].split()[1] == "drained"
    assert nodes_view([busy]).splitlines()[1].split()[1] == "draining"


def test_nodes_show_drained_once_the_last_task_is_gone(server: ServerHandle, client: Client) -> None:
    job = client.submit({"command": ["sleep", "1"], "cpu": 1, "node_selector": {"zone": "z1"}})
    try:
        client.wait(job, states={JobState.RUNNING}, timeout=15)
        assert client.get(job).tasks[0].node == "sim-00001"
        client.drain("sim-00001")
        client.drain("sim-00002")  # nothing runs there

        def states() -> dict[str, str]:
            return {n["name"]: n["state"] for n in json.loads(run(server, "nodes", "-o", "json").stdout)}

        assert (states()["sim-00001"], states()["sim-00002"]) == ("draining", "drained")
        table = run(server, "nodes").stdout
        assert re.search(r"^sim-00001\s+draining\s", table, re.M), table
        assert re.search(r"^sim-00002\s+drained\s", table, re.M), table
        # `--state draining` still finds both: "drained" is how a draining node shows, not a state.
        filtered = json.loads(run(server, "nodes", "--state", "draining", "-o", "json").stdout)
        assert {n["name"] for n in filtered} == {"sim-00001", "sim-00002"}

        client.cancel(job)
        wait_for("sim-00001 drained", lambda: states()["sim-00001"] == "drained")
        assert client.node("sim-00001").state is NodeState.DRAINING  # the server's state is unchanged
    finally:
        for name in ("sim-00001", "sim-00002"):
            client.cordon(name, uncordon=True)
        if not client.get(job).final:
            client.cancel(job)


# -- 4. cancel takes several jobs -------------------------------------------------------------------
def test_cancel_takes_several_jobs(server: ServerHandle, client: Client) -> None:
    a, b = pending_job(client), pending_job(client)
    result = run(server, "cancel", a, b)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"job {a} cancelled: 1 cancelled",
        f"job {b} cancelled: 1 cancelled",
    ]
    assert {client.get(a).state, client.get(b).state} == {JobState.CANCELLED}

    # An unknown one: the others are cancelled still, the unknown one named, exit 3.
    c, d = pending_job(client), pending_job(client)
    result = run(server, "cancel", c, "no-such-job", d)
    assert result.exit_code == ExitCode.NOT_FOUND, result.output
    assert result.stdout.splitlines() == [
        f"job {c} cancelled: 1 cancelled",
        f"job {d} cancelled: 1 cancelled",
    ]
    assert "error: job 'no-such-job' not found" in result.stderr
    assert {client.get(c).state, client.get(d).state} == {JobState.CANCELLED}

    # One finished already (and none unknown): the other is cancelled, exit 1.
    e = pending_job(client)
    result = run(server, "cancel", a, e)
    assert result.exit_code == ExitCode.FAILED, result.output
    assert result.stdout.strip() == f"job {e} cancelled: 1 cancelled"
    assert f"job {a!r} has already finished" in result.stderr

    # Several as data: a list; one: its object, as before. An id given twice is cancelled once.
    f, g = pending_job(client), pending_job(client)
    listed = json.loads(run(server, "cancel", f, g, f, "-o", "json").stdout)
    assert [(j["id"], j["state"]) for j in listed] == [(f, "cancelled"), (g, "cancelled")]
    h = pending_job(client)
    single = json.loads(run(server, "cancel", h, "-o", "json").stdout)
    assert (single["id"], single["state"]) == (h, "cancelled")

    # One job alone behaves as before: exit 3 unknown, 1 finished already.
    alone = run(server, "cancel", "no-such-job")
    assert alone.exit_code == ExitCode.NOT_FOUND and "error: job 'no-such-job' not found" in alone.stderr
    again = run(server, "cancel", h)
    assert again.exit_code == ExitCode.FAILED and "already finished" in again.stderr
    assert run(server, "cancel").exit_code == ExitCode.USAGE  # at least one id


# -- 5. logs of a task on a simulated node ----------------------------------------------------------
def test_logs_of_a_task_on_a_simulated_node_say_no_process_ran(server: ServerHandle, client: Client) -> None:
    quick = client.submit(
        {
            "command": ["echo", "hi"],
            "cpu": 1,
            "node_selector": {"zone": "z3"},
            "labels": {"gosched.io/sim-seconds": "0.1"},
        }
    )
    client.wait(quick, timeout=15)
    result = run(server, "logs", quick)
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # stdout stays the output alone
    assert result.stderr.strip() == (
        f"no output from task 0 of {quick} (it is succeeded): it ran on simulated node sim-00003, "
        "where no process is run"
    )

    running = client.submit({"command": ["echo", "hi"], "cpu": 1, "node_selector": {"zone": "z3"}})
    try:
        client.wait(running, states={JobState.RUNNING}, timeout=15)
        said = run(server, "logs", running).stderr.strip()
        assert re.fullmatch(
            rf"no output from task 0 of {running} \(it is (bound|running)\): it is on simulated node "
            "sim-00003, where no process is run",
            said,
        ), said
    finally:
        client.cancel(running)

    waiting = pending_job(client)  # never placed: no node to tell of
    try:
        said = run(server, "logs", waiting).stderr.strip()
        assert said == f"no output from task 0 of {waiting} (it is pending)"
    finally:
        client.cancel(waiting)


def test_only_a_simulated_node_without_an_agent_counts_as_simulated() -> None:
    def node(labels: dict[str, str]) -> NodeInfo:
        return NodeInfo(node=make_node("n1", 4000, 2**30, labels=labels))

    assert node({RUNTIME_LABEL: "simulated"}).simulated
    assert not node({}).simulated  # e.g. a static node
    assert not node({RUNTIME_LABEL: "docker", AGENT_LABEL: "true"}).simulated
    assert not node({RUNTIME_LABEL: "simulated", AGENT_LABEL: "true"}).simulated
