"""The client commands end to end: the typer app (and once the installed `gosched` script) against a
real master on loopback, over simulated nodes whose tasks stay bound (no task simulator here)."""

import io
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner, Result

from gosched import Client
from gosched.api.server import ServerHandle
from gosched.cli import client_cmds
from gosched.cli.exits import CliError, ExitCode
from gosched.cli.main import app
from gosched.cli.submit_spec import read_spec_file
from gosched.common.node import NodeState
from gosched.common.resources import ResourceRequest
from gosched.common.states import JobState
from tests.loopback import cli as run
from tests.loopback import sim_master

GiB = 2**30
GPU_NODES = {"sim-00000", "sim-00004"}  # sim_nodes(8): every 4th node has 8 A100s
GOSCHED = Path(sys.executable).parent / "gosched"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    handle = sim_master(tmp_path_factory.mktemp("cli"), nodes=8, shards=2, queues=("default", "prod"))
    yield handle
    handle.stop()


def submitted(result: Result) -> str:
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    assert re.fullmatch(r"[A-Za-z0-9._-]+", job_id), result.stdout
    return job_id


def too_big(server: ServerHandle, *extra: str) -> str:
    """A job no node can take: sixteen GPUs in one task."""
    return submitted(run(server, "submit", "--gpus", "16", "--cpus", "1", *extra, "--", "sleep", "1"))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- submit ----------------------------------------------------------------------------------------
def test_submit_from_flags(server: ServerHandle, client: Client) -> None:
    result = run(
        server,
        "submit",
        *("--gpus", "2", "--cpus", "4", "--mem", "16Gi", "--replicas", "4", "--min-member", "4"),
        *("--queue", "prod", "--priority", "100", "--name", "train", "--tenant", "t"),
        *("--gpu-model", "A100", "--selector", "node-type=gpu", "--env", "K=V", "--env", "LR=0.1,0.2"),
        *("--submission-id", "X", "--", "python", "train.py", "--lr", "0.1"),
    )
    assert submitted(result) == "train"
    job = client.get("train").job
    assert (job.queue, job.priority, job.tenant, job.min_member, job.submission_id) == (
        "prod",
        100,
        "t",
        4,
        "X",
    )
    (group,) = job.groups
    assert group.replicas == 4
    assert group.resources == ResourceRequest(cpu_milli=4000, memory=16 * GiB, gpus=2)
    assert group.command == ("python", "train.py", "--lr", "0.1")  # its flags stay its own
    assert group.gpu_models == ("A100",) and dict(group.node_selector) == {"node-type": "gpu"}
    assert dict(group.env) == {"K": "V", "LR": "0.1,0.2"}
    info = client.wait("train", states={JobState.RUNNING}, timeout=10)
    assert {t.node for t in info.tasks} <= GPU_NODES


def test_submit_from_yaml_file_and_stdin(server: ServerHandle, client: Client, tmp_path: Path) -> None:
    spec = {
        "tenant": "vision",
        "min_member": 2,
        "labels": {"team": "vision"},
        "groups": [
            {
                "role": "worker",
                "replicas": 2,
                "command": "python worker.py",
                "resources": {"cpu": "500m", "memory": "1Gi", "gpus": 1},
            }
        ],
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    job_id = submitted(run(server, "submit", "-f", str(path), "--priority", "5"))  # a flag overrides
    job = client.get(job_id).job
    assert (job.tenant, job.min_member, job.priority, dict(job.labels)) == (
        "vision",
        2,
        5,
        {"team": "vision"},
    )
    assert job.groups[0].role == "worker" and job.groups[0].command == ("python", "worker.py")
    assert job.groups[0].resources == ResourceRequest(cpu_milli=500, memory=GiB, gpus=1)
    client.wait(job_id, states={JobState.RUNNING}, timeout=10)

    piped = {"id": "from-stdin", "command": ["true"], "cpu": 1, "queue": "prod"}
    assert submitted(run(server, "submit", "-f", "-", input=json.dumps(piped))) == "from-stdin"
    assert client.get("from-stdin").job.queue == "prod"


@pytest.mark.parametrize(
    ("args", "file_text", "says"),
    [
        (("--cpus", "abc", "--", "true"), None, "error: cpu (--cpus): cpu 'abc' is not a quantity"),
        (
            ("--replicas", "2", "--min-member", "3", "--cpus", "1", "--", "true"),
            None,
            "min_member (--min-member)",
        ),
        (
            ("--queue", "nope", "--cpus", "1", "--", "true"),
            None,
            "error: queue (--queue): unknown queue 'nope'",
        ),
        (("--env", "NOEQUALS", "--cpus", "1", "--", "true"), None, "error: --env: expected KEY=VALUE"),
        (
            (
                "--cpus",
                "1",
            ),
            None,
            "nothing to submit",
        ),
        (
            (
                "--gpus",
                "1",
            ),
            "command: [true]\ncpu: 1\n",
            "--gpus: not with -f",
        ),
        (
            (),
            "groups:\n- command: [true]\n  resources: {cpu: lots}\n",
            "error: groups[0].resources.cpu: cpu 'lots' is not a quantity",
        ),
        ((), "groups: [unclosed\n", "is not valid YAML or JSON"),
        ((), "- a list\n", "a job spec must be a mapping"),
        ((), "id: d7\nid: d8\ncommand: [echo]\ncpu: 1\n", "bad.yaml: duplicate key 'id' (line 2)"),
        ((), '{"id": "d7", "command": ["true"], "cpu": 1, "id": "d8"}', "bad.yaml: duplicate key 'id'"),
        # only the server knows the time: the client's own check lets it through
        (
            (),
            "command: [echo]\ncpu: 1\nsubmit_time: 1.0e+300\n",
            "error: submit_time: 1e+300 is in the future",
        ),
        (("--cpus", "1", "--", "echo", "a\x00b"), None, "command[1] (the command after --): contains a NUL"),
        # what Python makes of a non-UTF-8 argv byte ($'\xff')
        (("--cpus", "1", "--", "echo", "\udcff"), None, "command[1] (the command after --): not valid UTF-8"),
        (
            ("--gpus", "0.9999", "--", "true"),
            None,
            "gpus (--gpus): '0.9999' is not a whole number of milli-GPU",
        ),
        (("--cpus", "0.0001", "--", "true"), None, "cpu (--cpus): '0.0001' is less than 0.001 core"),
    ],
)
def test_bad_spec_exits_2_naming_the_field(
    server: ServerHandle, tmp_path: Path, args: tuple[str, ...], file_text: str | None, says: str
) -> None:
    if file_text is not None:
        path = tmp_path / "bad.yaml"
        path.write_text(file_text)
        args = ("-f", str(path), *args)
    result = run(server, "submit", *args)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert says in result.stderr
    assert result.stdout == ""


def test_missing_file_exits_2(server: ServerHandle, tmp_path: Path) -> None:
    result = run(server, "submit", "-f", str(tmp_path / "absent.yaml"))
    assert result.exit_code == 2 and "cannot read" in result.stderr and "absent.yaml" in result.stderr


def test_non_utf8_file_exits_2(server: ServerHandle, tmp_path: Path) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe")
    result = run(server, "submit", "-f", str(path))
    assert result.exit_code == ExitCode.USAGE, result.output
    assert f"error: {path} is not UTF-8 text (at offset 0)" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)  # no traceback


def test_read_spec_file_refuses_undecodable_stdin() -> None:
    # a non-UTF-8 stdin reaches Python as lone surrogates (surrogateescape)
    stdin = io.TextIOWrapper(io.BytesIO(b"id: \xff\n"), encoding="utf-8", errors="surrogateescape")
    with pytest.raises(CliError, match=r"stdin is not UTF-8 text \(at offset 4\)"):
        read_spec_file("-", stdin)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("id: a\ngroups:\n- {role: w, role: v}\n", "duplicate key 'role' (line 3)"),
        ("a: 1\nb: 2\na: 3\n", "duplicate key 'a' (line 3)"),
        ('{"groups": [{"env": {"X": "1", "X": "2"}}]}', "duplicate key 'X'"),
    ],
)
def test_read_spec_file_refuses_duplicate_keys(text: str, says: str) -> None:
    with pytest.raises(CliError, match=re.escape(f"stdin: {says}")):
        read_spec_file("-", io.StringIO(text))


def test_read_spec_file_keeps_yaml_merges_and_json_numbers() -> None:
    # "<<" merge keys exist to be overridden: not duplicates
    merged = read_spec_file("-", io.StringIO("base: &b {cpu: 1, memory: 1Gi}\ngroup:\n  <<: *b\n  cpu: 2\n"))
    assert merged["group"] == {"cpu": 2, "memory": "1Gi"}
    # JSON is read as JSON: PyYAML would read 1.9e9 as the string "1.9e9"
    assert read_spec_file("-", io.StringIO('{"deadline": 1.9e9}')) == {"deadline": 1.9e9}


def test_duplicate_id_exits_2(server: ServerHandle) -> None:
    too_big(server, "--name", "dup")
    result = run(server, "submit", "--name", "dup", "--cpus", "1", "--", "true")
    assert result.exit_code == 2 and "already exists" in result.stderr
    assert run(server, "cancel", "dup").exit_code == 0


# -- jobs --------------------------------------------------------------------------------------------
def test_unknown_job_exits_3(server: ServerHandle) -> None:
    for command in ("get", "describe", "cancel", "explain", "logs"):
        result = run(server, command, "no-such-job")
        assert result.exit_code == ExitCode.NOT_FOUND, (command, result.output)
        assert "error: job 'no-such-job' not found" in result.stderr
    for command in ("cordon", "drain"):
        result = run(server, command, "no-such-node")
        assert result.exit_code == ExitCode.NOT_FOUND and "no-such-node" in result.stderr


def test_jobs_table_json_and_filters(
    server: ServerHandle, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = [too_big(server, "--tenant", "lister", "--priority", str(p)) for p in range(5)]
    monkeypatch.setattr(client_cmds, "PAGE_SIZE", 2)  # so the five take three pages

    listed = run(server, "jobs", "--tenant", "lister", "-o", "json")
    assert listed.exit_code == 0, listed.output
    data = json.loads(listed.stdout)
    assert [j["id"] for j in data] == mine  # every page, in submission order
    first = data[0]
    assert list(first) == [
        "id", "state", "queue", "tenant", "priority", "kind", "min_member", "replicas",
        "task_counts", "request", "submit_time", "submission_id", "deadline", "time_limit", "max_retries",
    ]  # fmt: skip
    assert (first["state"], first["tenant"], first["task_counts"]) == ("pending", "lister", {"pending": 1})
    assert first["request"] == {"cpu_milli": 1000, "memory": 0, "gpu_milli": 16000}

    table = run(server, "jobs", "--tenant", "lister")
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["ID", "STATE", "QUEUE", "TENANT", "PRIORITY", "TASKS", "REQUEST", "AGE"]
    assert [line.split()[0] for line in lines[1:]] == mine
    assert re.search(
        rf"^{mine[3]}\s+pending\s+default\s+lister\s+3\s+1 pending\s+cpu 1, gpu 16\s+\d+s$",
        table.stdout,
        re.M,
    )

    assert (
        len(json.loads(run(server, "jobs", "--tenant", "lister", "--limit", "3", "-o", "json").stdout)) == 3
    )
    assert (
        json.loads(run(server, "jobs", "--tenant", "lister", "--state", "running", "-o", "json").stdout) == []
    )
    wide = run(server, "jobs", "--tenant", "lister", "-o", "wide").stdout
    assert "SUBMISSION-ID" in wide.splitlines()[0] and "sleep 1" in wide
    as_yaml = yaml.safe_load(run(server, "jobs", "--tenant", "lister", "-o", "yaml").stdout)
    assert [j["id"] for j in as_yaml] == mine
    assert run(server, "jobs", "--state", "bogus").exit_code == 2
    for job_id in mine:
        client.cancel(job_id)


def test_get_shows_tasks_with_node_and_gpus(server: ServerHandle, client: Client) -> None:
    info = client.wait("train", states={JobState.RUNNING}, timeout=10)
    table = run(server, "get", "train")
    assert table.exit_code == 0, table.output
    text = table.stdout
    assert re.search(r"^State:\s+running$", text, re.M) and re.search(r"^Queue:\s+prod$", text, re.M)
    assert "Tasks:      4 (min member 4): 4 bound" in text
    assert "main x4: cpu 4, mem 16Gi, gpu 2; python train.py --lr 0.1" in text
    for task in info.tasks:
        gpus = ",".join(str(i) for i, _ in task.gpus)
        row = rf"^{task.index}\s+{task.id}\s+main\s+bound\s+0\s+{task.node}\s+{gpus}$"  # 0 restarts
        assert re.search(row, text, re.M), text

    data = json.loads(run(server, "get", "train", "-o", "json").stdout)
    assert (data["id"], data["state"], data["replicas"], data["task_counts"]) == (
        "train",
        "running",
        4,
        {"bound": 4},
    )
    assert [(t["node"], [(g["index"], g["milli"]) for g in t["gpus"]]) for t in data["tasks"]] == [
        (t.node, list(t.gpus)) for t in info.tasks
    ]
    assert all(len(t["gpus"]) == 2 for t in data["tasks"])


def test_describe_shows_spec_tasks_and_explanation(server: ServerHandle) -> None:
    text = run(server, "describe", "train").stdout
    for part in ("Job:", "Spec:", "  queue: prod", "  submission_id: X", "node_selector: {node-type: gpu}"):
        assert part in text, part
    assert "Tasks:\nINDEX" in text and "Explanation:\n  job train" in text
    data = yaml.safe_load(run(server, "describe", "train", "-o", "yaml").stdout)
    assert data["spec"]["groups"][0]["resources"] == {"cpu": "4", "memory": 16 * GiB, "gpus": 2}
    assert len(data["tasks"]) == 4 and data["explanation"].startswith("job train")


def test_describe_says_a_future_deadline_is_ahead(server: ServerHandle, client: Client) -> None:
    # Two days and a bit ahead: "in 2d", not an age clamped to "0s ago".
    job_id = client.submit({"command": ["sleep", "1"], "gpus": 16, "deadline": time.time() + 2 * 86400 + 600})
    try:
        text = run(server, "describe", job_id).stdout
        assert re.search(r"^Deadline: +\S+ \(in 2d\)$", text, re.MULTILINE), text
        assert re.search(r"^Submitted: +\S+ \(\d+s ago\)$", text, re.MULTILINE), text
    finally:
        client.cancel(job_id)


def test_explain_says_why_a_job_is_pending(server: ServerHandle, client: Client) -> None:
    job_id = too_big(server)
    deadline = time.monotonic() + 10
    while True:
        result = run(server, "explain", job_id)
        assert result.exit_code == 0, result.output
        if "unschedulable" in result.stdout or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert "pending" in result.stdout and "0/8 nodes fit: 8 too few GPUs" in result.stdout, result.stdout
    assert json.loads(run(server, "explain", job_id, "-o", "json").stdout)["id"] == job_id
    client.cancel(job_id)


def test_cancel(server: ServerHandle, client: Client) -> None:
    job_id = too_big(server)
    result = run(server, "cancel", job_id)
    assert result.exit_code == 0 and result.stdout.strip() == f"job {job_id} cancelled: 1 cancelled"
    assert client.get(job_id).state is JobState.CANCELLED
    again = run(server, "cancel", job_id)  # already finished: nothing to do, and scripts can tell
    assert again.exit_code == ExitCode.FAILED and "already finished" in again.stderr
    other = too_big(server)
    assert json.loads(run(server, "cancel", other, "-o", "json").stdout)["state"] == "cancelled"


# -- cluster ---------------------------------------------------------------------------------------
def test_nodes_table_wide_and_json(server: ServerHandle, client: Client) -> None:
    client.wait("train", states={JobState.RUNNING}, timeout=10)
    nodes = {n.name: n for n in client.nodes()}
    table = run(server, "nodes")
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "CPU", "MEMORY", "GPU", "TASKS"]
    assert [line.split()[0] for line in lines[1:]] == [f"sim-{i:05d}" for i in range(8)]
    assert re.search(r"^sim-00001\s+ready\s+[\d.]+/32\s+\S+/128Gi\s+-\s+\d+$", table.stdout, re.M)
    gpu = nodes["sim-00000"]
    used = sum(gpu.gpu_used_milli) / 1000
    row = next(line for line in lines if line.startswith("sim-00000"))
    assert f"{used:g}/8 A100" in row and "/96 " in row and "/768Gi" in row and used >= 2

    wide = run(server, "nodes", "-o", "wide").stdout
    assert wide.splitlines()[0].split()[-4:] == ["LABELS", "TAINTS", "GPUS", "AGENT"]
    assert "node-type=gpu,zone=z0" in wide and "0:A100=" in wide

    data = json.loads(run(server, "nodes", "-o", "json").stdout)
    by_name = {n["name"]: n for n in data}
    assert set(by_name) == set(nodes)
    first = by_name["sim-00000"]
    assert (first["cpu_milli"], first["memory"], len(first["gpus"])) == (96_000, 768 * GiB, 8)
    assert [g["used_milli"] for g in first["gpus"]] == list(gpu.gpu_used_milli)
    labels = {"gosched.io/container-runtime": "simulated", "node-type": "gpu", "zone": "z0"}
    assert first["labels"] == labels and set(first["tasks"]) == set(gpu.task_ids)


def test_cordon_drain_and_undo(server: ServerHandle, client: Client) -> None:
    result = run(server, "cordon", "sim-00003")
    assert result.exit_code == 0 and result.stdout.strip() == "node sim-00003 cordoned"
    assert client.node("sim-00003").state is NodeState.CORDONED
    listed = json.loads(run(server, "nodes", "--state", "cordoned", "-o", "json").stdout)
    assert [n["name"] for n in listed] == ["sim-00003"]
    assert json.loads(run(server, "cordon", "sim-00003", "--undo", "-o", "json").stdout)["state"] == "ready"
    assert run(server, "drain", "sim-00003").stdout.strip() == "node sim-00003 draining"
    run(server, "cordon", "sim-00003", "--undo")
    assert client.node("sim-00003").state is NodeState.READY
    run(server, "drain", "sim-00003")
    assert json.loads(run(server, "drain", "sim-00003", "--undo", "-o", "json").stdout)["state"] == "ready"
    assert client.node("sim-00003").state is NodeState.READY  # drain --undo, as Slurm's resume


def test_queues_and_status(server: ServerHandle, client: Client) -> None:
    queues = run(server, "queues")
    assert queues.exit_code == 0, queues.output
    assert queues.stdout.splitlines()[0].split() == ["NAME", "POLICY", "GUARANTEE", "MAX-SHARE", "SHARE"]
    assert re.search(r"^default\s+fifo\s+0\.0%\s+100\.0%\s+[\d.]+%$", queues.stdout, re.M)
    data = json.loads(run(server, "queues", "-o", "json").stdout)
    assert [q["name"] for q in data] == ["default", "prod"] and list(data[0]) == [
        "name", "policy", "guarantee", "max_share", "share",
    ]  # fmt: skip

    status = run(server, "status")
    assert status.exit_code == 0, status.output
    truth = client.status()
    assert re.search(r"^Ready:\s+yes$", status.stdout, re.M)
    assert re.search(r"^Nodes:\s+8 \(\d schedulable\)$", status.stdout, re.M)
    assert re.search(r"^CPU:\s+[\d.]+/384 cores$", status.stdout, re.M)
    assert re.search(r"^GPU:\s+[\d.]+/16$", status.stdout, re.M)
    assert re.search(r"^Shards:\s+2$", status.stdout, re.M)
    # the binder's counter since the master started (gosched_bound_tasks), not the tasks bound now
    assert re.search(r"^Bindings since start:\s+\d+$", status.stdout, re.M), status.stdout
    assert "Bound tasks" not in status.stdout
    # pending jobs are among those not ended, not beside them
    shown = (
        r"^Jobs:\s+(\d+) not ended: (\d+) with tasks waiting for a place, (\d+) all placed or being placed$"
    )
    jobs = re.search(shown, status.stdout, re.M)
    assert jobs is not None, status.stdout
    assert int(jobs[1]) == int(jobs[2]) + int(jobs[3])
    as_json = json.loads(run(server, "status", "-o", "json").stdout)
    assert as_json["ready"] is True and as_json["nodes"] == 8 and as_json["gpu_milli"] == truth["gpu_milli"]


def test_master_from_the_environment(server: ServerHandle) -> None:
    result = CliRunner(env={"GOSCHED_MASTER": server.target}).invoke(app, ["status", "-o", "json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["nodes"] == 8


# -- commands that build their settings from flags ----------------------------------------------
@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["demo", "--shards", "0", "--nodes", "2", "--jobs", "2"], "shards"),
        (["bench", "--in-process", "--shards", "300", "--nodes", "2", "--pods", "2"], "shards"),
        (["bench", "--in-process", "--batch-size", "0", "--nodes", "2", "--pods", "2"], "batch_size"),
    ],
)
def test_a_bad_settings_flag_exits_2_naming_the_field(args: list[str], field: str, tmp_path: Path) -> None:
    # As `gosched master --shards 0` does: a message naming the field, not a traceback.
    result = CliRunner().invoke(app, [*args, *(["--out", str(tmp_path)] if args[0] == "bench" else [])])
    assert result.exit_code == 2, (result.output, result.exception)
    assert f"invalid configuration: {field}: " in result.stderr, result.stderr


# -- the master is not there ---------------------------------------------------------------------
def test_unreachable_master_exits_5_naming_it() -> None:
    address = f"127.0.0.1:{closed_port()}"
    for args in (["jobs"], ["get", "x"], ["submit", "--cpus", "1", "--", "true"], ["logs", "x"]):
        started = time.monotonic()
        result = CliRunner().invoke(app, [args[0], "--master", address, *args[1:]])
        assert result.exit_code == ExitCode.UNAVAILABLE, (args, result.output)
        assert f"cannot reach the master at {address}" in result.stderr
        assert time.monotonic() - started < 10


# -- the installed script ----------------------------------------------------------------------------
def test_real_subprocess(server: ServerHandle, client: Client) -> None:
    def gosched(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(GOSCHED), *args], capture_output=True, text=True, timeout=60, check=False)

    made = gosched("submit", "--master", server.target, "--cpus", "1", "--mem", "1Gi", "--", "echo", "hi")
    assert made.returncode == 0, made.stderr
    job_id = made.stdout.strip()
    assert client.get(job_id).job.groups[0].command == ("echo", "hi")
    shown = gosched("get", job_id, "--master", server.target, "-o", "json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["id"] == job_id
    missing = gosched("get", "no-such-job", "--master", server.target)
    assert missing.returncode == 3 and "not found" in missing.stderr
    address = f"127.0.0.1:{closed_port()}"
    down = gosched("status", "--master", address)
    assert down.returncode == 5 and f"cannot reach the master at {address}" in down.stderr
