"""The gRPC API from another language: a Node.js client built from proto/v1/*.proto alone.

tests/js_client/client.js loads the .proto files at run time with @grpc/proto-loader and talks to a
real server (real gRPC on loopback, simulated nodes) through @grpc/grpc-js: it submits a job, reads
it back, lists jobs, and submits bad specs. Needs `node` and the packages of
tests/js_client/package.json (installed by deploy/dev-env.sh when npm is there); skipped otherwise.
"""

import json
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gosched import Client
from gosched.api.server import ServerHandle, serve
from gosched.common.config import QueueConfig, Settings
from gosched.common.states import JobState
from gosched.runtime.simulation import sim_nodes

JS_DIR = Path(__file__).resolve().parent / "js_client"
CLIENT = JS_DIR / "client.js"
PACKAGES = ("@grpc/grpc-js", "@grpc/proto-loader")
RUN_TIMEOUT_S = 30


def _node() -> str:
    """The node executable, or skip (no node, or the JS gRPC packages are not installed)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node not installed")
    probe = subprocess.run(
        [node, "-e", ";".join(f"require.resolve({p!r})" for p in PACKAGES)],
        cwd=JS_DIR,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip("JS gRPC packages not installed: run deploy/dev-env.sh (npm ci in tests/js_client)")
    return node


def _run_client(node: str, target: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [node, str(CLIENT), target],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


@pytest.fixture(scope="module")
def node() -> str:
    return _node()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, node: str) -> Iterator[ServerHandle]:
    path = tmp_path_factory.mktemp("api-js") / "gosched.db"
    settings = Settings(
        store_path=str(path),
        shards=2,
        queues=[QueueConfig(name="default")],
        retry_backoff_s=0.01,
        retry_backoff_max_s=0.05,
    )
    handle = serve(settings, sim_nodes(4), grpc_port=0, http_port=None, host="127.0.0.1", wait_ready=True)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def js_result(node: str, server: ServerHandle) -> dict[str, Any]:
    proc = _run_client(node, server.target)
    assert proc.returncode == 0, f"JS client failed (exit {proc.returncode}):\n{proc.stderr}"
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_js_client_submits_a_job_python_sees(js_result: dict[str, Any], server: ServerHandle) -> None:
    submit = js_result["submit"]
    assert (submit["job_id"], submit["created"]) == ("from-js", True)
    assert submit["state"] in {f"JOB_STATE_{s.name}" for s in JobState}
    assert js_result["resubmit"] == {"job_id": "from-js", "created": False}  # same submission_id

    with Client(server.target, timeout=10) as client:
        info = client.get("from-js")
    job = info.job
    assert job.id == "from-js"
    assert job.queue == "default"
    assert job.min_member == 2
    assert job.submission_id == "js-client-1"
    assert dict(job.labels) == {"origin": "node"}
    (group,) = job.groups
    assert group.role == "worker"
    assert group.replicas == 2
    assert group.command == ("echo", "hi")
    assert dict(group.env) == {"GREETING": "hi"}
    assert group.resources.cpu_milli == 1000
    assert group.resources.memory == 1 << 30
    assert group.resources.gpus == 0
    assert len(info.tasks) == 2
    assert info.state is JobState.RUNNING  # the client waited for RUNNING before it exited


def test_js_client_reads_the_job_back(js_result: dict[str, Any]) -> None:
    got = js_result["get"]
    assert got["job_id"] == "from-js"
    assert got["state"] == "JOB_STATE_RUNNING", got["states_seen"]
    assert set(got["states_seen"]) <= {f"JOB_STATE_{s.name}" for s in JobState}
    assert got["task_count"] == 2
    assert [t["id"] for t in got["tasks"]] == ["from-js/0", "from-js/1"]
    assert {t["role"] for t in got["tasks"]} == {"worker"}
    assert all(t["state"].startswith("TASK_STATE_") and t["node"] for t in got["tasks"])
    assert sum(got["task_counts"].values()) == 2
    spec = got["spec"]
    assert spec["id"] == "from-js"
    assert spec["min_member"] == 2
    assert spec["labels"] == {"origin": "node"}
    assert spec["group"]["role"] == "worker"
    assert spec["group"]["replicas"] == 2
    assert spec["group"]["command"] == ["echo", "hi"]
    assert spec["group"]["env"] == {"GREETING": "hi"}
    assert spec["group"]["resources"]["cpu"] in ("1", "1000m")
    assert spec["group"]["resources"]["memory"] in ("1Gi", str(1 << 30))


def test_js_client_lists_the_job(js_result: dict[str, Any]) -> None:
    listed = js_result["list"]
    assert "from-js" in listed["job_ids"]
    assert listed["states"]["from-js"].startswith("JOB_STATE_")
    assert "from-js-bad-replicas" not in listed["job_ids"]  # listed before the bad submissions
    assert listed["next_page_token"] == ""


@pytest.mark.parametrize(
    ("case", "field", "job_id"),
    [
        ("replicas_zero", "groups[0].replicas", "from-js-bad-replicas"),
        ("negative_cpu", "groups[0].resources.cpu", "from-js-bad-cpu"),
    ],
)
def test_js_client_bad_spec_is_invalid_argument(
    js_result: dict[str, Any], server: ServerHandle, case: str, field: str, job_id: str
) -> None:
    rejected = js_result["rejected"][case]
    assert rejected["code_name"] == "INVALID_ARGUMENT", rejected
    assert rejected["code"] == 3
    assert rejected["details"].startswith(f"{field}: "), rejected
    with Client(server.target, timeout=10) as client:
        assert job_id not in {j.id for j in client.list()}


def test_js_client_reports_the_status_of_a_failed_call(node: str) -> None:
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = _run_client(node, f"127.0.0.1:{port}")
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert "code 14 (UNAVAILABLE)" in proc.stderr
