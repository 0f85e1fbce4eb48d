"""A master that answers while its scheduler cannot serve (a component or its Ray cluster does not
answer): not ready, and clients told so, not "cannot reach the master"; its failures logged once,
not at the loop's pace."""

import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gosched import Client
from gosched.api import errors
from gosched.api.server import ServerHandle, serve
from gosched.api.service import SchedulerService
from gosched.cli.exits import ExitCode
from gosched.cli.main import app
from gosched.common.config import QueueConfig, Settings
from gosched.runtime.control import ControlPlane
from gosched.runtime.local_control import LocalControl
from gosched.runtime.simulation import sim_nodes
from tests.ray_heads import free_port

WHY = "the Ray cluster at 10.0.0.1:6379: its GCS does not answer (connection refused)"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerHandle]:
    settings = Settings(store_path=str(tmp_path / "gosched.db"), shards=1)
    handle = serve(settings, sim_nodes(2), grpc_port=0, http_port=0, host="127.0.0.1", wait_ready=True)
    yield handle
    handle.stop()


@pytest.fixture
def outage(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every LocalControl says it cannot serve, as RayControl does while its actors do not answer."""
    monkeypatch.setattr(LocalControl, "unavailable", property(lambda self: WHY), raising=False)


def readyz(server: ServerHandle) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/readyz", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def grpc_health_becomes(server: ServerHandle, status: str, within_s: float = 5.0) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(server.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            if health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status) == status:
                return True
            time.sleep(0.1)
    return False


def test_the_cli_tells_a_master_whose_scheduler_is_unavailable_from_one_that_does_not_answer(
    server: ServerHandle, outage: None
) -> None:
    # `gosched status` said "cannot reach the master at ... (is it running?)" while it answered.
    result = CliRunner().invoke(app, ["status", "--master", server.target])
    assert result.exit_code == ExitCode.UNAVAILABLE, result.output
    assert result.stderr.strip() == (
        f"error: the master at {server.target} answers but its scheduler is unavailable: {WHY}"
    )
    result = CliRunner().invoke(app, ["jobs", "--master", server.target])
    assert result.exit_code == ExitCode.UNAVAILABLE
    assert "answers but its scheduler is unavailable" in result.stderr
    nobody = f"127.0.0.1:{free_port()}"
    result = CliRunner().invoke(app, ["status", "--master", nobody])
    assert result.exit_code == ExitCode.UNAVAILABLE
    assert result.stderr.startswith(f"error: cannot reach the master at {nobody} (is it running?")


def test_a_master_whose_scheduler_is_unavailable_is_not_ready_and_says_why(
    server: ServerHandle, outage: None
) -> None:
    assert readyz(server) == (503, f"not ready: the scheduler is unavailable: {WHY}\n")
    assert not server.service.ready
    with Client(server.target, timeout=5) as client, pytest.raises(errors.SchedulerUnavailable, match="GCS"):
        client.submit({"cpu": "1", "command": "true"})


def test_the_master_is_ready_again_once_its_scheduler_answers(
    server: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    down = [True]
    monkeypatch.setattr(
        LocalControl, "unavailable", property(lambda self: WHY if down[0] else None), raising=False
    )
    assert readyz(server)[0] == 503
    assert grpc_health_becomes(server, "NOT_SERVING")  # a load balancer's gRPC check agrees
    down[0] = False
    assert readyz(server) == (200, "ready\n")
    assert grpc_health_becomes(server, "SERVING")
    with Client(server.target, timeout=5) as client:
        assert client.status()["ready"]


def test_a_failure_that_repeats_is_logged_with_its_traceback_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every pass logged the whole traceback again: 11 a second, for ever.
    monkeypatch.delenv("GOSCHED_DEBUG", raising=False)
    monkeypatch.setattr("gosched.api.service.FAILURE_PAUSE_S", 0.05)
    calls = []

    def hook(control: ControlPlane) -> bool:
        calls.append(1)
        raise ValueError("a bad report")

    settings = Settings(store_path=str(tmp_path / "gosched.db"), shards=1)
    service = SchedulerService(
        lambda: LocalControl(settings, sim_nodes(1)), queues=[QueueConfig(name="default")]
    )
    service.tick_hooks.append(hook)
    with caplog.at_level(logging.WARNING):
        service.start()
        service.wait_ready(30)
        deadline = time.monotonic() + 10
        while len(calls) < 10:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        service.stop()
    logged = [r for r in caplog.records if "a bad report" in r.getMessage() or r.exc_info]
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert logged[0].exc_info is not None and "tick hook" in logged[0].getMessage()
    assert service.alive or service.error is None  # it went on scheduling
