"""A real master on loopback for the client and CLI tests: simulated nodes (whose tasks, given a
run time, run for a moment and succeed), gRPC on a free port, no HTTP; and the CLI run against it
in this process."""

from pathlib import Path

from typer.testing import CliRunner, Result

from gosched.api.server import ServerHandle, serve
from gosched.cli.main import app
from gosched.common.config import QueueConfig, Settings
from gosched.runtime.simulation import sim_nodes


def sim_master(
    folder: Path,
    *,
    nodes: int = 4,
    shards: int = 1,
    queues: tuple[str, ...] = ("default",),
    task_seconds: float | None = None,
    log_dir: Path | None = None,
    port: int = 0,
) -> ServerHandle:
    """A master with its store in `folder` (on `port`, 0: a free one), ready to answer (stop it
    with .stop())."""
    settings = Settings(
        store_path=str(folder / "gosched.db"),
        shards=shards,
        queues=[QueueConfig(name=name) for name in queues],
        retry_backoff_s=0.01,
        retry_backoff_max_s=0.05,
    )
    return serve(
        settings,
        sim_nodes(nodes),
        grpc_port=port,
        http_port=None,
        host="127.0.0.1",
        wait_ready=True,
        log_dir=log_dir,
        sim_task_seconds=task_seconds,
    )


def cli(server: ServerHandle, *args: str, input: str | None = None) -> Result:
    """`gosched COMMAND --master <server> ARGS...` in this process (--master first: after a
    submit's command word everything belongs to the command)."""
    command, *rest = args
    return CliRunner().invoke(app, [command, "--master", server.target, *rest], input=input)
