"""The API end to end: real gRPC on loopback, real SQLite, the real Pipeline over simulated nodes."""

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gosched import Client
from gosched.api import convert, errors
from gosched.api.server import ServerHandle, StoreBusy, serve
from gosched.common.config import AdmissionConfig, QueueConfig, Settings
from gosched.common.node import NodeState
from gosched.common.spec import job_from_spec
from gosched.common.states import JobState, TaskState
from gosched.proto.v1 import agent_pb2, agent_pb2_grpc, cluster_pb2, cluster_pb2_grpc, jobs_pb2, jobs_pb2_grpc
from gosched.runtime.simulation import sim_nodes

GPU_NODES = {"sim-00000", "sim-00004"}  # sim_nodes(8): every 4th node has 8 A100s


def _settings(path: Path, **overrides: object) -> Settings:
    return Settings(
        store_path=str(path),
        shards=2,
        queues=[QueueConfig(name="default"), QueueConfig(name="batch")],
        retry_backoff_s=0.01,
        retry_backoff_max_s=0.05,
        **overrides,  # type: ignore[arg-type]
    )


def gang(replicas: int = 4, gpus: int = 2, **extra: object) -> dict[str, object]:
    return {
        "min_member": replicas,
        "groups": [
            {
                "role": "worker",
                "replicas": replicas,
                "command": "python train.py",
                "resources": {"cpu": 4, "memory": "16Gi", "gpus": gpus},
            }
        ],
        **extra,
    }


def too_big(**extra: object) -> dict[str, object]:
    """Sixteen GPUs in one task: no node has more than eight."""
    return {"command": ["sleep", "1"], "gpus": 16, "cpu": 1, **extra}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    path = tmp_path_factory.mktemp("api") / "gosched.db"
    handle = serve(
        _settings(path),
        sim_nodes(8),
        grpc_port=0,
        http_port=0,
        host="127.0.0.1",
        http_host="127.0.0.1",
        wait_ready=True,
    )
    yield handle
    handle.stop()


def _http(server: ServerHandle, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _head(server: ServerHandle, path: str) -> tuple[int, int, bytes]:
    """HEAD `path`: the status, the Content-Length announced, and the body (none)."""
    request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}{path}", method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, int(reply.headers["Content-Length"]), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, int(exc.headers["Content-Length"]), exc.read()


# -- jobs ------------------------------------------------------------------------------------------
def test_gang_job_is_bound(client: Client) -> None:
    job_id = client.submit(gang(), submission_id="gang-1")
    info = client.wait(job_id, states={JobState.RUNNING}, timeout=10)
    assert info.state is JobState.RUNNING
    assert [t.state for t in info.tasks] == [TaskState.BOUND] * 4
    for task in info.tasks:
        assert task.node in GPU_NODES
        assert len(task.gpus) == 2 and all(milli == 1000 for _, milli in task.gpus)
    assert info.job.min_member == 4 and info.job.groups[0].role == "worker"
    node = client.node(info.tasks[0].node)
    assert info.tasks[0].id in node.task_ids
    assert sum(node.gpu_used_milli) >= 2000


def test_submission_id_is_idempotent(client: Client, server: ServerHandle) -> None:
    first = client.submit(too_big(), submission_id="once")
    again = client.submit(too_big(), submission_id="once")  # no id named: the same submission
    assert again == first
    with grpc.insecure_channel(server.target) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        spec = convert.job_to_proto_spec(job_from_spec(too_big()), submit_time=False, job_id=False)
        reply = stub.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec, submission_id="once"), timeout=5)
    assert (reply.job_id, reply.created) == (first, False)
    other = too_big()
    other["priority"] = 7  # another request under the same key: refused, not answered with the first
    with pytest.raises(errors.InvalidArgument, match=f"first used for job {first} with another spec") as err:
        client.submit(other, submission_id="once")
    assert err.value.field == "submission_id"
    client.cancel(first)


def test_bad_spec_is_invalid_argument_naming_the_field(client: Client, server: ServerHandle) -> None:
    bad = gang()
    bad["groups"][0]["resources"]["memory"] = "lots"  # type: ignore[index]
    with pytest.raises(errors.InvalidArgument) as local:  # checked by the client before sending
        client.submit(bad)
    assert local.value.field == "groups[0].resources.memory"
    with grpc.insecure_channel(server.target) as channel:  # and by the server
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        spec = jobs_pb2.SubmitJobRequest().spec
        group = spec.groups.add(role="main", command=["true"])
        group.resources.memory = "lots"
        with pytest.raises(grpc.RpcError) as remote:
            stub.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec), timeout=5)
        assert remote.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert remote.value.details().startswith("groups[0].resources.memory:")
        spec.queue = "nope"
        group.resources.memory = "1Gi"
        with pytest.raises(grpc.RpcError) as queue:
            stub.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec), timeout=5)
        assert queue.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert queue.value.details().startswith("queue: unknown queue 'nope'")


def test_unknown_job_is_not_found(client: Client) -> None:
    for call in (client.get, client.explain, client.cancel):
        with pytest.raises(errors.NotFound) as err:
            call("no-such-job")
        assert err.value.code is grpc.StatusCode.NOT_FOUND and "no-such-job" in err.value.message
    with pytest.raises(errors.NotFound):
        list(client.watch("no-such-job", timeout=5))


def test_an_unknown_state_filter_is_invalid_argument(server: ServerHandle) -> None:
    # A number the enum does not define (a newer client, a typo): the caller's fault, not INTERNAL.
    with grpc.insecure_channel(server.target) as channel:
        jobs = jobs_pb2_grpc.JobServiceStub(channel)
        nodes = cluster_pb2_grpc.ClusterServiceStub(channel)
        for call, value in (
            (lambda: jobs.ListJobs(jobs_pb2.ListJobsRequest(state=99), timeout=5), 99),
            (lambda: nodes.ListNodes(cluster_pb2.ListNodesRequest(state=42), timeout=5), 42),
        ):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
            assert err.value.details().startswith("state: ") and str(value) in err.value.details()


def test_list_filters_and_pages(client: Client) -> None:
    ids = {
        tenant: [client.submit(too_big(queue="batch", tenant=tenant)) for _ in range(3)]
        for tenant in ("t1", "t2")
    }
    mine = client.list(queue="batch", tenant="t1")
    assert [j.id for j in mine] == ids["t1"]
    assert all(j.job.queue == "batch" and j.tasks == () for j in mine)
    assert {j.id for j in client.list(queue="batch")} == set(ids["t1"] + ids["t2"])
    assert {j.id for j in client.list(queue="batch", state=JobState.PENDING)} == set(ids["t1"] + ids["t2"])
    page, token = client.list_page(queue="batch", page_size=2)
    assert [j.id for j in page] == ids["t1"][:2] and token
    rest: list[str] = []
    while token:
        more, token = client.list_page(queue="batch", page_size=2, page_token=token)
        rest.extend(j.id for j in more)
    assert rest == ids["t1"][2:] + ids["t2"]
    assert len(client.list(queue="batch", page_size=1, limit=4)) == 4
    with pytest.raises(errors.InvalidArgument):
        client.list_page(page_token="garbage")
    for job_id in ids["t1"] + ids["t2"]:
        client.cancel(job_id)
    assert client.list(queue="batch", state=JobState.PENDING) == []
    assert len(client.list(queue="batch", state=JobState.CANCELLED)) == 6


def test_cancel(client: Client) -> None:
    job_id = client.submit(too_big())
    info = client.cancel(job_id)
    assert info.state is JobState.CANCELLED
    assert {t.state for t in info.tasks} == {TaskState.CANCELLED}
    with pytest.raises(errors.FailedPrecondition):
        client.cancel(job_id)
    bound = client.submit(gang(replicas=1, gpus=1))
    client.wait(bound, states={JobState.RUNNING}, timeout=10)
    ran_on = client.get(bound).tasks[0].node
    assert client.cancel(bound).state is JobState.CANCELLED
    assert client.get(bound).tasks[0].node == ran_on  # where it ran stays on the record
    node = client.node(ran_on)
    assert f"{bound}/0" not in node.task_ids and sum(node.gpu_used_milli) == 0  # its GPU was given back


def test_watch_yields_state_changes(client: Client) -> None:
    job_id = client.submit(too_big())
    stream = client.watch(job_id, timeout=10)
    first = next(stream)
    assert first.state is JobState.PENDING
    client.cancel(job_id)
    rest = list(stream)  # ends after the final state
    assert rest and rest[-1].state is JobState.CANCELLED
    with pytest.raises(errors.FailedPrecondition):
        client.wait(job_id, states={JobState.RUNNING}, timeout=5)
    with pytest.raises(errors.FailedPrecondition, match="waited for running"):  # states by name too
        client.wait(job_id, states={"running"}, timeout=5)
    with pytest.raises(ValueError, match="states: 'bogus' is not a job state"):
        client.wait(job_id, states={"bogus"}, timeout=5)
    assert job_id in [j.id for j in client.list(state="cancelled")]
    assert client.wait(job_id, timeout=5).state is JobState.CANCELLED


def test_concurrent_submissions(client: Client) -> None:
    def submit_some(k: int) -> list[str]:
        spec = {"command": "true", "cpu": "100m", "memory": "64Mi", "tenant": "load"}
        return [client.submit(spec, submission_id=f"load-{k}-{i}") for i in range(25)]

    with ThreadPoolExecutor(8) as pool:
        ids = [job_id for batch in pool.map(submit_some, range(8)) for job_id in batch]
    assert len(set(ids)) == 200
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        running = client.list(tenant="load", state=JobState.RUNNING, page_size=1000)
        if len(running) == 200:
            break
        time.sleep(0.02)
    assert {j.id for j in running} == set(ids)


def test_wait_times_out(client: Client) -> None:
    job_id = client.submit(too_big())
    with pytest.raises(errors.DeadlineExceeded):
        client.wait(job_id, timeout=0.3)
    client.cancel(job_id)


def test_explain_says_why_pending(client: Client) -> None:
    job_id = client.submit(too_big())
    deadline = time.monotonic() + 10
    text = client.explain(job_id)
    while "unschedulable" not in text and time.monotonic() < deadline:
        time.sleep(0.02)
        text = client.explain(job_id)
    assert "pending" in text and "unschedulable" in text and "nodes fit" in text, text
    client.cancel(job_id)


# -- cluster ---------------------------------------------------------------------------------------
def test_nodes_get_and_cordon(client: Client) -> None:
    nodes = client.nodes()
    assert [n.name for n in nodes] == [f"sim-{i:05d}" for i in range(8)]
    gpu = client.node("sim-00000")
    assert len(gpu.node.gpus) == 8 and gpu.node.gpus[0].model == "A100"
    assert client.cordon("sim-00001").state is NodeState.CORDONED
    assert [n.name for n in client.nodes(NodeState.CORDONED)] == ["sim-00001"]
    status = client.status()
    assert status["schedulable_nodes"] == 7
    # the cordoned node's capacity is in the total, not in what is schedulable
    assert status["cpu_milli"] - status["schedulable_cpu_milli"] == client.node("sim-00001").node.cpu_milli
    assert client.cordon("sim-00001", uncordon=True).state is NodeState.READY
    assert client.drain("sim-00002").state is NodeState.DRAINING
    assert client.cordon("sim-00002", uncordon=True).state is NodeState.READY
    with pytest.raises(errors.NotFound):
        client.node("nope")
    with pytest.raises(errors.NotFound):
        client.cordon("nope")


def test_queues_and_status(client: Client) -> None:
    queues = client.queues()
    assert [q.name for q in queues] == ["default", "batch"]
    assert all(q.policy == "fifo" and 0.0 <= q.share <= 1.0 for q in queues)
    status = client.status()
    assert status["ready"] and status["nodes"] == 8 and status["shards"] == 2
    assert status["gpu_milli"] == 16_000


def test_health_and_reflection(server: ServerHandle) -> None:
    with grpc.insecure_channel(server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "gosched.v1.JobService", "gosched.v1.ClusterService", "gosched.v1.AgentService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        answer = next(iter(stub.ServerReflectionInfo(iter([request]), timeout=5)))
        names = {s.name for s in answer.list_services_response.service}
        assert {"gosched.v1.JobService", "gosched.v1.AgentService", "grpc.health.v1.Health"} <= names
        agent = agent_pb2_grpc.AgentServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:  # an agent with a nameless machine is refused
            agent.Register(agent_pb2.RegisterRequest(), timeout=5)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "name" in (err.value.details() or "")


def test_http_endpoints(server: ServerHandle, client: Client) -> None:
    client.wait(client.submit(gang(replicas=1, gpus=1)), states={JobState.RUNNING}, timeout=10)
    assert _http(server, "/healthz")[0] == 200
    assert _http(server, "/readyz") == (200, "ready\n")
    assert _http(server, "/nope")[0] == 404
    code, text = _http(server, "/metrics")
    assert code == 200
    for name in (
        "gosched_ready 1.0",
        "gosched_pending_tasks ",
        "gosched_bound_tasks_total ",
        "gosched_binder_conflicts_total ",
        "gosched_binder_unwritten_batches 0.0",  # in process: the binder writes its store itself
        "gosched_binder_writer_cpu_seconds_total 0.0",
        "gosched_scheduling_rounds_total ",
        'gosched_bind_latency_seconds_bucket{le="+Inf"} ',
        'gosched_queue_share{queue="default"} ',
        'gosched_cpu_cores{kind="capacity"} ',
        'gosched_gpus{kind="schedulable"} 16.0',
    ):
        assert name in text, name
    bound = next(line for line in text.splitlines() if line.startswith("gosched_bound_tasks_total "))
    assert float(bound.split()[1]) >= 1
    gpus = next(line for line in text.splitlines() if line.startswith('gosched_gpus{kind="used"} '))
    assert float(gpus.split()[1]) >= 1  # the running task's GPU


def test_http_head_answers_like_get_without_a_body(server: ServerHandle) -> None:
    # Load balancers and uptime checkers probe with HEAD.
    for path in ("/healthz", "/readyz", "/metrics"):
        code, length, body = _head(server, path)
        assert (code, body) == (200, b""), path
        assert length > 0, path
    assert _head(server, "/readyz") == (200, len(b"ready\n"), b"")
    assert _head(server, "/nope") == (404, len(b"not found\n"), b"")


# -- life cycle: its own server --------------------------------------------------------------------
def test_unavailable_admission_and_restart(tmp_path: Path) -> None:
    path = tmp_path / "gosched.db"
    settings = _settings(path, admission=AdmissionConfig(max_pending_jobs=1))
    handle = serve(settings, sim_nodes(4), grpc_port=0, http_port=0, host="127.0.0.1", http_host="127.0.0.1")
    try:
        with Client(handle.target, timeout=5) as client:
            client.wait_ready(timeout=10)
            first = client.submit(too_big(id="held"))
            with pytest.raises(errors.ResourceExhausted):
                client.submit(too_big(id="refused"))
            with pytest.raises(errors.AlreadyExists):
                client.submit(too_big(id="held"))
            with pytest.raises(errors.AlreadyExists) as err:  # in a batch: which one, by position
                client.submit_many([too_big(id="new"), too_big(id="held")])
            assert err.value.message.startswith("jobs[1].id: ")
            handle.service.stop()  # the scheduler is gone, the gRPC server still answers
            with pytest.raises(errors.Unavailable):
                client.get(first)
            assert not client.status()["ready"]
            assert _http(handle, "/readyz")[0] == 503
            assert "gosched_ready 0.0" in _http(handle, "/metrics")[1]
            health = health_pb2_grpc.HealthStub(client.channel)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
                if status == health_pb2.HealthCheckResponse.NOT_SERVING:
                    break
                time.sleep(0.01)
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        handle.stop()
    again = serve(_settings(path), (), grpc_port=0, http_port=None, host="127.0.0.1", wait_ready=True)
    try:
        with Client(again.target, timeout=5) as client:
            assert [j.id for j in client.list()] == ["held"]
            # Simulated nodes not given again leave with the start that made them: nothing would
            # run tasks bound to them (test_node_changes has the nodes given again).
            assert client.nodes() == []
    finally:
        again.stop()


def test_a_rate_limit_refusal_says_when_to_retry_once(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path / "gosched.db", admission=AdmissionConfig(tenant_rate_per_s=0.01, tenant_burst=1)
    )
    handle = serve(settings, (), grpc_port=0, http_port=None, host="127.0.0.1", wait_ready=True)
    try:
        with Client(handle.target, timeout=5) as client:
            client.submit(too_big())
            with pytest.raises(errors.ResourceExhausted) as err:
                client.submit(too_big())
    finally:
        handle.stop()
    message = err.value.message
    assert message.startswith("tenant 'default' rate limit: ") and message.count("retry after") == 1, message
    assert re.search(r"; retry after \d+\.\d{3}s$", message), message


# -- one master per port and per store -----------------------------------------------------------------
GOSCHED = Path(sys.executable).parent / "gosched"


def _master_program(store: Path, grpc_port: int) -> subprocess.CompletedProcess[str]:
    """`gosched master` in process mode, which must give up at start (so it returns quickly)."""
    argv = [str(GOSCHED), "master", "--in-process", "--store", str(store)]
    argv += ["--grpc-port", str(grpc_port), "--http-port", "0"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_a_second_master_cannot_bind_the_same_grpc_port(tmp_path: Path) -> None:
    first = serve(_settings(tmp_path / "a.db"), (), grpc_port=0, http_port=None, host="127.0.0.1")
    try:
        port = first.grpc_port
        # gRPC's Linux default is SO_REUSEPORT: the second would share the port, splitting the clients.
        with pytest.raises(OSError, match=rf"cannot listen on 127\.0\.0\.1:{port}: the port is taken"):
            serve(_settings(tmp_path / "b.db"), (), grpc_port=port, http_port=None, host="127.0.0.1")
        for host in ("[::]", "0.0.0.0"):  # the master's default host, over the first's loopback
            with pytest.raises(OSError, match=f":{port}: the port is taken"):
                serve(_settings(tmp_path / "b.db"), (), grpc_port=port, http_port=None, host=host)
        # The failed tries left nothing behind: their store is free, and the first still answers.
        serve(_settings(tmp_path / "b.db"), (), grpc_port=0, http_port=None, host="127.0.0.1").stop()
        with Client(first.target, timeout=5) as client:
            client.wait_ready(timeout=10)
            assert client.status()["ready"]
        done = _master_program(tmp_path / "c.db", port)
    finally:
        first.stop()
    assert done.returncode == 1, done.stdout + done.stderr  # the machine refused: not a usage error
    assert f"error: cannot start the master: cannot listen on [::]:{port}" in done.stderr


def test_a_second_master_cannot_open_the_same_store(tmp_path: Path) -> None:
    store = tmp_path / "gosched.db"
    first = serve(_settings(store), (), grpc_port=0, http_port=None, host="127.0.0.1", wait_ready=True)
    try:
        held = f"another master (pid {os.getpid()}) holds the store {store}"
        with pytest.raises(StoreBusy, match=re.escape(held)):
            serve(_settings(store), (), grpc_port=0, http_port=None, host="127.0.0.1", wait_ready=True)
        done = _master_program(store, 0)  # another process
        with Client(first.target, timeout=5) as client:
            assert client.status()["ready"]  # the refused masters took nothing from the first
    finally:
        first.stop()
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"holds the store {store}" in done.stderr and "another master" in done.stderr
    # Released on stop: the next master on the store starts.
    again = serve(_settings(store), (), grpc_port=0, http_port=None, host="127.0.0.1", wait_ready=True)
    again.stop()


def test_watchers_past_a_quarter_of_the_threads_are_refused_and_calls_still_answer(tmp_path: Path) -> None:
    settings = _settings(tmp_path / "w.db", grpc_workers=16)  # 4 long streams at most
    handle = serve(settings, sim_nodes(2), grpc_port=0, http_port=None, host="127.0.0.1")
    try:
        with Client(handle.target, timeout=10) as client:
            client.wait_ready(timeout=10)
            job_id = client.submit(too_big())  # never placed: a watch on it stays open
            watches = [client.watch(job_id, timeout=30) for _ in range(4)]
            for w in watches:
                assert next(w).state is JobState.PENDING
            with pytest.raises(errors.ResourceExhausted, match="4 watch and follow streams are open"):
                next(client.watch(job_id, timeout=10))
            assert client.status()["ready"]  # the other calls still find a thread
            watches[0].close()  # a stream that ends gives its place back
            deadline = time.monotonic() + 10
            while True:
                try:
                    assert next(client.watch(job_id, timeout=10)).state is JobState.PENDING
                    break
                except errors.ResourceExhausted:
                    assert time.monotonic() < deadline, "the closed watch never gave its place back"
                    time.sleep(0.1)
            for w in watches[1:]:
                w.close()
    finally:
        handle.stop()
