"""Joining a Ray cluster at an address: a bounded wait, and one clear line when it fails (the
address nothing answers at; a cluster that refuses the master's credentials), never a wait without
end or a page of traceback."""

import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from gosched.api.service import SchedulerService, start_failure  # noqa: E402
from gosched.cli.master_cmds import stop_reason  # noqa: E402
from gosched.common.config import QueueConfig  # noqa: E402
from gosched.runtime import ray_cluster  # noqa: E402
from gosched.runtime.control import describe_error  # noqa: E402
from tests.ray_heads import free_port, own_head  # noqa: E402


def gosched(
    *args: str, cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gosched.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def master_args(tmp_path: Path, address: str) -> list[str]:
    ports = ["--grpc-port", str(free_port()), "--http-port", str(free_port())]
    return ["master", "--address", address, "--store", str(tmp_path / "g.db"), *ports]


def test_a_master_given_an_address_where_nothing_listens_fails_at_once_naming_it(tmp_path: Path) -> None:
    # It waited for ever (ray.init has no deadline), printing only Ray's own warnings.
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = gosched(*master_args(tmp_path, address), cwd=tmp_path, timeout=60)
    took = time.monotonic() - started
    assert done.returncode != 0
    assert f"error: no Ray cluster answers at {address} (connection refused" in done.stderr
    assert "Traceback" not in done.stderr
    assert took < 20, f"{took:.1f}s"


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A port that accepts connections and never says a word (not a Ray GCS)."""
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    server.close()


def test_an_address_where_something_else_listens_fails_within_the_handshake_bound(
    tmp_path: Path, silent_listener: str
) -> None:
    # Ray's client waits 40 s per try there, 20 tries. In a process of its own: Ray's C++ client
    # left waiting in its thread would outlive the test otherwise.
    script = textwrap.dedent(
        f"""
        from gosched.runtime import ray_cluster
        ray_cluster.HANDSHAKE_TIMEOUT_S = 2.0
        try:
            ray_cluster._start_ray({silent_listener!r})
        except ray_cluster.RayUnreachable as exc:
            print("refused:", exc)
        """
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 30
    assert f"refused: no Ray cluster answers at {silent_listener} (something listens at" in done.stdout
    assert "no Ray GCS answered there within 2 s" in done.stdout


def test_auto_and_local_start_are_left_to_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    connects: list[object] = []
    monkeypatch.setattr(ray_cluster.socket, "create_connection", lambda *a, **k: connects.append(a))
    inits: list[object] = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: inits.append(k))
    ray_cluster._start_ray("auto")
    ray_cluster._start_ray(None)
    assert connects == [] and len(inits) == 2
    assert inits[0]["address"] == "auto"


# What ray.init raised for an explicit address to a cluster with token authentication (Ray 2.60):
# a ConnectionError from a RuntimeError whose message holds the traceback of Ray's own failure.
RAY_AUTH_TRACE = """Failed to connect to GCS. Last connection error: Traceback (most recent call last):
  File "/site-packages/ray/_private/node.py", line 996, in _init_gcs_client
    client = GcsClient(
             ^^^^^^^^^^
  File "python/ray/includes/common.pxi", line 119, in ray._raylet.check_status
ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication token is missing or \
incorrect. Note: RAY_AUTH_MODE is currently 'disabled' (not 'token'). Ensure that the token for the \
cluster is available in a local file (e.g., ~/.ray/auth_token or via RAY_AUTH_TOKEN_PATH).
"""


def ray_auth_failure() -> ConnectionError:
    try:
        try:
            raise RuntimeError(RAY_AUTH_TRACE)
        except RuntimeError as inner:
            raise ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:6390") from inner
    except ConnectionError as outer:
        return outer


def test_a_failed_join_names_its_cause_on_one_line_with_a_hint_for_authentication(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The master printed 60 lines of traceback and `ConnectionError('Failed to connect to Ray
    # cluster at ...')`, which hid the cause.
    monkeypatch.setattr(ray_cluster, "_check_reachable", lambda address: None)

    def init(**kwargs: object) -> None:
        raise ray_auth_failure()

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(ray_cluster.RayJoinFailed) as err:
        ray_cluster._start_ray("192.0.2.2:6390")
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("cannot join the Ray cluster at 192.0.2.2:6390: it refused this master (")
    assert "InvalidAuthToken: Authentication token is missing or incorrect)" in text
    assert "RAY_AUTH_MODE=token" in text and "--address auto" in text
    assert stop_reason(err.value) == f"the scheduler stopped: {text}"  # its own words, no type


def test_describe_error_follows_the_causes_and_cuts_traceback_text() -> None:
    text = describe_error(ray_auth_failure())
    assert text.startswith("ConnectionError: Failed to connect to Ray cluster at 192.0.2.2:6390; caused by ")
    assert (
        "RuntimeError: Failed to connect to GCS. Last connection error: ray.exceptions.AuthenticationError"
        in text
    )
    assert "File " not in text and "\n" not in text


def test_a_scheduler_that_failed_to_start_says_why_on_one_line_and_logs_no_traceback(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GOSCHED_DEBUG", raising=False)

    def make() -> object:
        try:
            raise OSError(30, "Read-only file system")
        except OSError as exc:
            raise RuntimeError("cannot open the store") from exc

    service = SchedulerService(make, queues=[QueueConfig(name="default")])  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG):
        service.start()
        with pytest.raises(RuntimeError) as err:
            service.wait_ready(30)
    assert str(err.value) == (
        "the scheduler failed to start: RuntimeError: cannot open the store; "
        "caused by OSError: [Errno 30] Read-only file system"
    )
    assert not [r for r in caplog.records if r.exc_info]  # no traceback without GOSCHED_DEBUG
    assert start_failure(ray_cluster.RayUnreachable("no Ray cluster answers at a:1 (x)")) == (
        "no Ray cluster answers at a:1 (x)"
    )


def test_with_gosched_debug_the_start_failure_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOSCHED_DEBUG", "1")

    def make() -> object:
        raise ValueError("boom")

    service = SchedulerService(make, queues=[QueueConfig(name="default")])  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG):
        service.start()
        with pytest.raises(RuntimeError, match="ValueError: boom"):
            service.wait_ready(30)
    assert [r for r in caplog.records if r.exc_info]


@pytest.mark.slow
def test_a_master_refused_by_a_cluster_with_token_authentication_says_what_to_do(tmp_path: Path) -> None:
    token = "0123456789abcdef0123456789abcdef"
    with own_head(tmp_path, env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}) as head:
        address = head.address
        # Ray loads the token for an explicit address only with RAY_AUTH_MODE=token.
        env = {
            "RAY_AUTH_MODE": "disabled",
            "RAY_AUTH_TOKEN": "",
            "RAY_AUTH_TOKEN_PATH": str(tmp_path / "none"),
        }
        started = time.monotonic()
        done = gosched(*master_args(tmp_path, address), cwd=tmp_path, timeout=90, env=env)
        assert time.monotonic() - started < 30
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot join the Ray cluster at {address}: it refused this master (")
    assert "InvalidAuthToken" in last and "RAY_AUTH_MODE=token" in last
    assert "Traceback" not in done.stderr
