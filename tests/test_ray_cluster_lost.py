"""A master whose Ray cluster goes away: not ready at once, one log line saying so, and, once the
cluster is lost for good, a stop with the reason (a master process exits non-zero, for its
supervisor to restart it) instead of a zombie that retries for ever or that Ray's own client kills
without a word. Each test has a Ray of its own, which it ends."""

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

ray = pytest.importorskip("ray")

from gosched.api.server import ServerHandle, serve  # noqa: E402
from gosched.common.config import Settings  # noqa: E402
from gosched.runtime import ray_control  # noqa: E402
from gosched.runtime.control import ControlLost  # noqa: E402
from gosched.runtime.ray_control import RayControl  # noqa: E402
from gosched.runtime.simulation import sim_nodes  # noqa: E402
from tests.builders import make_job  # noqa: E402
from tests.ray_heads import Head, free_port  # noqa: E402


@pytest.fixture(autouse=True)
def no_ray_before_or_after() -> object:
    ray.shutdown()  # the master starts (and owns) its own
    yield
    ray.shutdown()


def http(handle: ServerHandle | int, path: str) -> tuple[int, str]:
    port = handle if isinstance(handle, int) else handle.http_port
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def wait_until(what: str, check: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - started


def master(tmp_path: Path) -> ServerHandle:
    return serve(
        Settings(store_path=str(tmp_path / "gosched.db"), shards=2),
        sim_nodes(4),
        grpc_port=0,
        http_port=0,
        host="127.0.0.1",
        runtime="ray",
        wait_ready=True,
    )


def test_a_master_whose_gcs_is_killed_is_not_ready_at_once_then_stops_naming_the_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The actors still answer (their processes live on), so nothing failed: /readyz said 200 until
    # Ray's client killed the process, 60 s on, with no word of GoSched's.
    monkeypatch.setattr(ray_control, "CLUSTER_LOST_AFTER_S", 4.0)
    handle = master(tmp_path)
    try:
        service = handle.service
        control = service.control
        assert isinstance(control, RayControl)
        address = control.address
        assert http(handle, "/readyz") == (200, "ready\n")
        node = ray._private.worker._global_node
        (gcs,) = node.all_processes[ray._private.ray_constants.PROCESS_TYPE_GCS_SERVER]
        ours = psutil.Process().children(recursive=True)  # Ray's, to end if left behind
        with caplog.at_level(logging.WARNING):
            gcs.process.send_signal(signal.SIGKILL)
            took = wait_until("/readyz to say 503", lambda: http(handle, "/readyz")[0] == 503, 10)
            assert took < 5
            _, body = http(handle, "/readyz")
            assert body.startswith(f"not ready: the scheduler is unavailable: the Ray cluster at {address}: ")
            wait_until("the scheduler to stop", lambda: not service.alive, 30)
        assert isinstance(service.error, ControlLost)
        assert str(service.error).startswith(
            f"lost the Ray cluster at {address}: its GCS has not answered for 4 s"
        )
        assert http(handle, "/healthz")[0] == 503 and http(handle, "/readyz")[0] == 503
        assert not ray.is_initialized()  # it left Ray: Ray's client will not end this process
        said = [r.getMessage() for r in caplog.records if r.name.startswith("gosched")]
        assert sum("the scheduler is unavailable" in m for m in said) == 1, said
        assert sum(m.startswith("lost the Ray cluster") for m in said) == 1, said
        assert not [r for r in caplog.records if r.exc_info]  # no tracebacks
    finally:
        handle.stop()
        for proc in ours:  # Ray's agents outlive a raylet whose GCS was killed
            with contextlib.suppress(psutil.Error):
                proc.kill()


def test_actors_that_never_answer_again_stop_the_master(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray_control, "ACTORS_LOST_AFTER_S", 3.0)
    handle = master(tmp_path)
    try:
        service = handle.service
        control = service.control
        assert isinstance(control, RayControl)
        ray.kill(control.rs.dispatcher, no_restart=True)
        wait_until("a call to fail", lambda: service.not_ready_reason is not None or _fails(service), 30)
        wait_until("the scheduler to stop", lambda: not service.alive, 30)
        assert isinstance(service.error, ControlLost)
        assert "the scheduler's actors have not answered for 3 s" in str(service.error)
        with pytest.raises(Exception, match="the scheduler stopped: lost the Ray cluster"):
            service.submit(make_job("late").cpu("1").build())
    finally:
        handle.stop()


def _fails(service: object) -> bool:
    try:
        service.nodes()  # type: ignore[attr-defined]
    except Exception:
        return True
    return False


# -- the real thing: a master process joined to a head of the test's own -----------------------------
def start_master(tmp_path: Path, head: Head) -> tuple[subprocess.Popen[str], int]:
    http_port = free_port()
    args = ["master", "--address", head.address, "--store", str(tmp_path / "g.db"), "--shards", "2"]
    args += ["--grpc-port", str(free_port()), "--http-port", str(http_port)]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # as the head
    proc = subprocess.Popen(
        [sys.executable, "-m", "gosched.cli.main", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        wait_until(
            "the master to be ready",
            lambda: http(http_port, "/readyz")[0] == 200 or proc.poll() is not None,
            90,
        )
    except AssertionError:
        proc.kill()
        raise
    assert proc.poll() is None, proc.communicate()[0]
    return proc, http_port


@pytest.mark.slow
@pytest.mark.parametrize("head_back", [False, True], ids=["head-gone", "head-restarted"])
def test_a_master_process_exits_non_zero_once_its_ray_head_is_lost(tmp_path: Path, head_back: bool) -> None:
    head = Head(tmp_path / "head.log")
    head.start()
    proc = None
    try:
        proc, http_port = start_master(tmp_path, head)
        head.kill()
        took = wait_until("/readyz to say 503", lambda: http(http_port, "/readyz")[0] == 503, 15)
        assert took < 6
        if head_back:  # another cluster at the same address: the actors are gone with the old one
            head.start()
        out, _ = proc.communicate(timeout=60)  # lost after 30 s of silence, or at once once back
        assert proc.returncode not in (0, None)
        last = out.strip().splitlines()[-2:]  # "error: ...", then "stopping"
        expected = (
            "another Ray cluster answers at its address" if head_back else "its GCS has not answered for 30 s"
        )
        assert last[0].startswith("error: the scheduler stopped: lost the Ray cluster at "), out
        assert expected in last[0], out
        assert "Traceback" not in out
        assert out.count("the scheduler is unavailable") <= 1, out  # once, if at all (not per retry)
        assert "Failed to connect to GCS within 60 seconds" not in out  # not Ray's kill: ours
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        head.close()
