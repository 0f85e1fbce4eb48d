"""What the twenty-second session's user-level review found, as a user meets it: through a real
master on loopback (local runtime) and the CLI. An empty job id is bad input, not a missing job;
a config without a `default` queue says what that does to a job that names none; a config key
given twice is refused; `status` says what its "pending" counts."""

import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from gosched import Client
from gosched.api.errors import InvalidArgument
from gosched.api.server import ServerHandle, serve
from gosched.cli.main import app
from gosched.common.config import QueueConfig, Settings, load_settings
from gosched.common.node import make_node


def _master(tmp_path: Path, **settings: object) -> ServerHandle:
    return serve(
        Settings(store_path=str(tmp_path / "gs.db"), shards=1, **settings),  # type: ignore[arg-type]
        [make_node("n0", 2000, 4 * 2**30)],
        grpc_port=0,
        http_port=None,
        host="127.0.0.1",
        runtime="local",
        wait_ready=True,
    )


@pytest.fixture
def master(tmp_path: Path) -> Iterator[ServerHandle]:
    handle = _master(tmp_path)
    yield handle
    handle.stop()


def _cli(handle: ServerHandle, *args: str) -> Result:
    return CliRunner().invoke(app, [*args, "--master", handle.target])


@pytest.mark.parametrize("command", ["get", "explain", "cancel"])
def test_an_empty_job_id_is_bad_input_naming_the_field(master: ServerHandle, command: str) -> None:
    result = _cli(master, command, "")
    assert result.exit_code == 2, result.output  # bad input, not "not found" (3)
    assert "id: required" in result.output
    with Client(master.target, timeout=10) as client, pytest.raises(InvalidArgument) as caught:
        client.get("")
    assert caught.value.field == "id"


def test_without_a_default_queue_a_job_naming_none_is_told_why_and_the_master_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gosched.api.server"):
        handle = _master(tmp_path, queues=[QueueConfig(name="a")])
    try:
        assert any("no queue is named 'default' (queues: a)" in r.getMessage() for r in caplog.records)
        with Client(handle.target, timeout=10) as client:
            with pytest.raises(InvalidArgument) as caught:
                client.submit({"id": "x", "cpu": 1, "command": "true"})
            assert caught.value.field == "queue"
            assert "a job that names no queue goes to 'default', not configured here" in str(caught.value)
            assert client.submit({"id": "y", "queue": "a", "cpu": 1, "command": "true"}) == "y"
    finally:
        handle.stop()


def test_a_config_key_given_twice_is_refused_with_its_line(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("shards: 2\nbatch_size: 64\nshards: 3\n")
    with pytest.raises(ValueError, match=r"duplicate key 'shards' \(line 3\)"):
        load_settings(config)
    result = CliRunner().invoke(app, ["config", "show", "-c", str(config)])
    assert result.exit_code == 2 and "duplicate key 'shards' (line 3)" in result.output


def test_status_counts_a_running_job_with_a_waiting_task_among_those_waiting_for_a_place(
    master: ServerHandle,
) -> None:
    """One node of 2 cores: an elastic job of three 1-core tasks (min_member 1) runs two and has one
    waiting. `status` counts it among the jobs with tasks waiting for a place, and says so, while
    `jobs --state running` lists it: both are true, of different things."""
    with Client(master.target, timeout=10) as client:
        client.submit({"id": "el", "cpu": 1, "replicas": 3, "min_member": 1, "command": "sleep 60"})
        deadline = time.monotonic() + 30
        while sum(t.node != "" for t in client.get("el").tasks) < 2:
            assert time.monotonic() < deadline, client.get("el")
            time.sleep(0.05)
    status = _cli(master, "status")
    assert status.exit_code == 0, status.output
    assert re.search(
        r"^Jobs:\s+1 not ended: 1 with tasks waiting for a place, 0 all placed", status.stdout, re.M
    )


@pytest.mark.parametrize(
    ("yaml_text", "field"),
    [
        ("finished_job_ttl_s: true\n", "finished_job_ttl_s"),  # read as 1: every old job purged
        ("shards: true\n", "shards"),
        ("heartbeat_interval_s: false\n", "heartbeat_interval_s"),
        ("queues:\n  - {name: default, guarantee: true}\n", "queues[0].guarantee"),
        ("admission:\n  max_pending_jobs: true\n", "admission.max_pending_jobs"),
    ],
)
def test_a_boolean_for_a_number_is_refused_naming_the_field(
    tmp_path: Path, yaml_text: str, field: str
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml_text)
    result = CliRunner().invoke(app, ["config", "show", "-c", str(config)])
    assert result.exit_code == 2, result.output
    assert f"{field}: must be a number, not a boolean" in result.output


def test_null_from_the_environment_turns_an_optional_setting_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """GOSCHED_FINISHED_JOB_TTL_S=null keeps every job, as `finished_job_ttl_s: null` in the file."""
    monkeypatch.setenv("GOSCHED_FINISHED_JOB_TTL_S", "null")
    assert load_settings().finished_job_ttl_s is None
    monkeypatch.setenv("GOSCHED_FINISHED_JOB_TTL_S", "3600")
    assert load_settings().finished_job_ttl_s == 3600.0
    monkeypatch.setenv("GOSCHED_SHARDS", "none")  # not optional: still an error
    with pytest.raises(ValueError, match="shards"):
        load_settings()
