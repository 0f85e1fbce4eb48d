"""Exit code 4: a master whose admission control refuses the job (one pending job at most)."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gosched.api.server import ServerHandle, serve
from gosched.cli.exits import ExitCode, error_message, exit_code
from gosched.cli.main import app
from gosched.common.config import AdmissionConfig, QueueConfig, Settings
from gosched.runtime.simulation import sim_nodes


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    settings = Settings(
        store_path=str(Path(tmp_path_factory.mktemp("cli-admission")) / "gosched.db"),
        shards=1,
        queues=[QueueConfig(name="default")],
        admission=AdmissionConfig(max_pending_jobs=1),
    )
    handle = serve(settings, sim_nodes(4), grpc_port=0, http_port=None, host="127.0.0.1", wait_ready=True)
    yield handle
    handle.stop()


def test_refused_by_admission_exits_4(server: ServerHandle) -> None:
    def submit(name: str) -> tuple[int, str]:
        args = ["submit", "--master", server.target, "--name", name, "--gpus", "16", "--cpus", "1", "--", "x"]
        result = CliRunner().invoke(app, args)
        return result.exit_code, result.stderr

    assert submit("held") == (0, "")
    code, message = submit("refused")
    assert code == ExitCode.EXHAUSTED
    assert message.startswith("error: refused by admission: ")


def test_a_request_over_the_grpc_size_limit_is_a_usage_error_not_an_admission_refusal(
    server: ServerHandle,
) -> None:
    # 60,000 jobs of about 150 bytes in one call: over gRPC's 4 MiB request limit at the server.
    from gosched.api.client import Client, MessageTooLarge, ResourceExhausted

    specs = [{"id": f"big-{i}", "cpu": "1", "command": ["echo", "x" * 100]} for i in range(60_000)]
    with Client(server.target) as client, pytest.raises(MessageTooLarge) as err:
        client.submit_many(specs)
    assert not isinstance(err.value, ResourceExhausted)  # a client backing off on those would loop
    assert exit_code(err.value) == ExitCode.USAGE
    assert "too large for one gRPC message" in error_message(err.value, server.target)
