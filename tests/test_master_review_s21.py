"""`gosched up` and the master's settings: a stopped local Ray leaves no process of its session
behind, `up` honours the settings' runtime, and a configuration error is one line per error naming
the field, the reason and the source."""

import contextlib
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import psutil
import pytest
from typer.testing import CliRunner

from gosched.cli.main import app

GOSCHED = Path(sys.executable).with_name("gosched")
# Two simulated nodes, quick tasks, free ports (no clash with another master on this machine).
QUICK = ["--sim-nodes", "2", "--sim-task-seconds", "0.5", "--grpc-port", "0", "--http-port", "0"]


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    """A Ray temp folder of the test's own (RAY_TMPDIR), short: Ray's socket paths must stay
    under 108 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="gsr", dir="/tmp"))
    yield folder
    with contextlib.suppress(OSError):
        subprocess.run(["rm", "-rf", str(folder)], check=False, timeout=60)


def _sessions(ray_tmp: Path) -> list[Path]:
    return sorted(ray_tmp.glob("ray/session_2*"))  # Ray keeps its sessions in $RAY_TMPDIR/ray


def _kill_all(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=5)


def _lines(stream: IO[str], into: "queue.Queue[str]") -> None:
    for line in stream:
        into.put(line)


# -- 1: nothing of the local Ray outlives `gosched up` ------------------------------------------------
@pytest.mark.slow
def test_up_stopped_by_ctrl_c_leaves_no_process_of_its_ray_session(tmp_path: Path, ray_tmp: Path) -> None:
    """Ctrl-C (SIGINT) stops `gosched up`: Ray's processes (GCS, raylet, its dashboard and
    runtime-env agents, the actors' workers) and everything else it started end with it. They
    used to survive: Ray's head processes die with the thread that started them (PDEATHSIG), the
    scheduling thread, which ended before ray.shutdown(); the orphaned agents then waited 60 s
    on the dead GCS, deaf to SIGTERM."""
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp)}
    up = subprocess.Popen(
        [str(GOSCHED), "up", "--work-dir", str(tmp_path / "up"), *QUICK],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # its own group: SIGINT goes to it as `kill -INT` sends it
    )
    assert up.stdout is not None
    out: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(up.stdout, out), daemon=True).start()
    seen: list[str] = []
    started: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 150
        while not any("Ctrl-C stops it all" in line for line in seen):
            assert up.poll() is None and time.monotonic() < deadline, "".join(seen)
            with contextlib.suppress(queue.Empty):
                seen.append(out.get(timeout=1))
        assert seen[0].startswith("starting Ray and the master"), seen[0]
        started = psutil.Process(up.pid).children(recursive=True)
        names = {proc.name() for proc in started}
        assert {"raylet", "gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names, names
        (session,) = _sessions(ray_tmp)

        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0, "".join(seen)
        _, alive = psutil.wait_procs(started, timeout=10)  # the agents used to stay 60 s
        left = [f"{proc.pid} {proc.name()}" for proc in alive]
        assert not left, f"left running after gosched up stopped: {left}"

        from gosched.runtime.ray_cluster import session_processes

        assert session_processes(str(session)) == []
        raylet_log = (session / "logs" / "raylet.out").read_text(errors="replace")
        assert "received SIGTERM" in raylet_log  # told to stop, not killed with its starting thread
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(10)
        _kill_all(started)  # whatever a failure left


def test_a_local_ray_started_from_a_thread_that_ends_outlives_it_and_stops_cleanly() -> None:
    """The API starts Ray from its scheduling thread, and stops it from another once that thread has
    ended: Ray's processes live on until then, and stop_own_ray leaves none of the session."""
    import ray

    from gosched.runtime import ray_cluster

    assert not ray.is_initialized()
    failed: list[BaseException] = []

    def start() -> None:
        try:
            ray_cluster._start_ray(None, num_cpus=1, logging_level="error", log_to_driver=False)
        except BaseException as exc:
            failed.append(exc)

    starter = threading.Thread(target=start, name="test-scheduling-thread")
    starter.start()
    starter.join(120)
    assert not starter.is_alive() and not failed, failed
    session = ray._private.worker._global_node.get_session_dir_path()
    names = {}  # the GCS, the raylet, the dashboard, the monitors
    for proc in psutil.Process().children():
        with contextlib.suppress(psutil.Error):  # one already gone (the bug this is about)
            names[proc] = proc.name()
    head = list(names)
    started = list(head)
    for proc in head:
        with contextlib.suppress(psutil.Error):  # one already gone (the bug this is about)
            started.extend(proc.children(recursive=True))
    try:
        time.sleep(1.0)  # the starting thread has ended: PDEATHSIG would have killed them by now
        assert "raylet" in names.values(), names
        _, alive = psutil.wait_procs(head, timeout=0.1)
        dead = sorted(names[proc] for proc in head if proc not in alive)
        assert not dead, f"Ray's processes died with the thread that started them: {dead}"

        @ray.remote
        def answer() -> int:
            return 42

        assert ray.get(answer.remote(), timeout=60) == 42
        ray_cluster.stop_own_ray()
        assert ray_cluster.session_processes(session) == []
        assert "received SIGTERM" in Path(session, "logs", "raylet.out").read_text(errors="replace")
    finally:
        ray.shutdown()
        _kill_all(started)  # whatever a failure left


# -- 2: `up` runs the runtime its settings name ----------------------------------------------------------
def test_up_with_runtime_local_in_its_file_runs_without_ray_and_says_so(
    tmp_path: Path, ray_tmp: Path
) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text("runtime: local\n")
    shown = CliRunner().invoke(app, ["config", "show", "-c", str(config)])
    assert shown.exit_code == 0 and '"runtime": "local"' in shown.stdout, shown.output
    done = subprocess.run(
        [str(GOSCHED), "up", "-c", str(config), "--work-dir", str(tmp_path), *QUICK, "--exit-after-demo"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_TMPDIR": str(ray_tmp)},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("starting the master (4 shards) in this process, without Ray"), first
    assert f"runtime: local, in {config}" in first
    assert "up and working" in done.stdout
    assert _sessions(ray_tmp) == []  # no Ray was started


def test_up_names_gosched_runtime_when_the_env_sets_local(monkeypatch: pytest.MonkeyPatch) -> None:
    from gosched.cli.master_cmds import _starting
    from gosched.common.config import load_settings

    monkeypatch.delenv("GOSCHED_CONFIG", raising=False)
    monkeypatch.setenv("GOSCHED_RUNTIME", "local")
    told = _starting(load_settings(None), None)
    assert "without Ray (runtime: local, from GOSCHED_RUNTIME;" in told
    monkeypatch.delenv("GOSCHED_RUNTIME")
    assert _starting(load_settings(None), None).startswith("starting Ray and the master")


# -- 3: configuration errors, one line each: field, reason, source ---------------------------------------
BAD_FILE = """\
shards: 0
queues:
  - name: default
  - name: batch
    policy: lifo
    polcy: fifo
admission:
  max_pending_jobs: -1
"""


def test_config_errors_are_one_line_each_with_field_reason_and_file(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(BAD_FILE)
    result = CliRunner().invoke(app, ["config", "show", "-c", str(path)])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        f"invalid configuration: shards: must be at least 1; got 0 (in {path})",
        "invalid configuration: queues[1].policy: must be one of fifo, priority, drf, fair, deadline; "
        f"got 'lifo' (in {path})",
        f"invalid configuration: queues[1].polcy: did you mean 'policy'? there is no such key (in {path})",
        f"invalid configuration: admission.max_pending_jobs: must be at least 1; got -1 (in {path})",
        f"(settings from {path}, GOSCHED_* variables and flags)",
    ]
    assert "pydantic" not in result.stderr and "Input should" not in result.stderr


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("runtime: lokal\n", "runtime: must be one of ray, local; got 'lokal'"),
        ("shards: many\n", "shards: must be a whole number; got 'many'"),
        ("queues:\n  - name: Batch\n", "queues[0].name: must be a name of lowercase letters"),
        ("queues: []\n", "queues: needs at least one queue"),
        ("queues:\n  - policy: fifo\n", "queues[0].name: is required"),
        ("queues:\n  - {name: a, guarantee: 0.6, max_share: 0.5}\n", "queues[0]: queue a: guarantee 0.6"),
        ("queues:\n  - {name: a, tenant_weights: {A: 1}}\n", "queues[0].tenant_weights['A']: not a valid"),
        ("heartbeat_interval_s: 1\nnode_timeout_s: 1\n", "node_timeout_s (1.0) must be at least twice"),
        ("profile:\n  filters: [node_ready, nope]\n", "profile.filters[1]: unknown plugin 'nope'"),
        ("shards: [1,\n", "not valid YAML: line 2, column 1: expected the node content"),
    ],
)
def test_each_kind_of_config_error_is_told_on_one_line(tmp_path: Path, text: str, line: str) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["config", "show", "-c", str(path)])
    assert result.exit_code == 2, result.output
    told = [row for row in result.stderr.splitlines() if row.startswith("invalid configuration: ")]
    assert len(told) == 1 and line in told[0], result.stderr
    assert "not valid YAML" in line or told[0].endswith(f"(in {path})"), told[0]
    assert "https://" not in result.stderr and "\n  " not in result.stderr


def test_a_config_error_names_the_env_variable_or_flag_it_came_from(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text("shards: 2\n")
    runner = CliRunner(env={"GOSCHED_ADMISSION__TENANT_BURST": "0"})
    result = runner.invoke(app, ["config", "show", "-c", str(path)])
    assert result.exit_code == 2, result.output
    assert (
        "invalid configuration: admission.tenant_burst: must be at least 1; got '0' "
        "(from GOSCHED_ADMISSION__TENANT_BURST)"
    ) in result.stderr.splitlines()
    # A flag over the file: `gosched master` refuses it before anything starts.
    result = CliRunner().invoke(app, ["master", "-c", str(path), "--shards", "0", "--store", "x/y.db"])
    assert result.exit_code == 2, result.output
    assert "invalid configuration: shards: must be at least 1; got 0 (from --shards)" in result.stderr
    result = CliRunner().invoke(app, ["demo", "--shards", "0", "--nodes", "2", "--jobs", "2"])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "invalid configuration: shards: must be at least 1; got 0 (from --shards)"
    ]
