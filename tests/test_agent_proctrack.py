"""A task's processes that leave its process group (setsid: a daemon, `setsid cmd &`) are the
task's all the same: the agent's executor kills them with the task, and when the task's process
ends, where no cgroup holds them (agent/proctrack.py, agent/shim.py). Real processes throughout."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from gosched.agent.adopted import AdoptedProcess, create_time
from gosched.agent.cgroups import detect
from gosched.agent.executor import SHIM, ShellExecutor, TaskSpec
from gosched.agent.proctrack import NONCE_VAR, Snapshot, Tracked, start_ticks
from gosched.agent.shim import read_status, read_swept

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("setsid") is None,
    reason="process tracking reads /proc (Linux), and the tasks here use setsid(1)",
)
SLEEP = shutil.which("sleep") or "/bin/sleep"
GRACE_S = 0.5
TIMEOUT_S = 10.0  # generous: a loaded 2-core machine; every wait polls and returns as soon as it can


def escape(pidfile: Path, *, ignore_term: bool = False, clear_env: bool = False) -> str:
    """Shell that starts a process in a session of its own, which writes its pid to `pidfile`.
    With `clear_env` it keeps nothing of the task's environment (its mark included), and its
    parent exits at once (a daemon's double fork): only the shim's tree still holds it."""
    trap = 'trap "" TERM; ' if ignore_term else ""
    inner = f"'{trap}echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; exec {SLEEP} 60'"
    if clear_env:
        return f"(env -i {shutil.which('setsid')} /bin/sh -c {inner} &);"
    return f"setsid /bin/sh -c {inner} &"


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie lingers until some init reaps it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until(what: str, cond: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def read_pid(path: Path) -> int:
    wait_until(f"{path.name} to be written", path.exists)
    return int(path.read_text())


@pytest.fixture
def since(tmp_path: Path) -> Iterator[float]:
    """What a failed test must not leave running, killed at its end: the processes it started
    (younger than the test) that carry a mark of its tasks or wrote their pid in its folder."""
    start = time.time() - 0.1
    yield start
    pids = set()
    for path in tmp_path.glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pids.add(int(path.read_text()))
    for proc in psutil.process_iter(["create_time", "environ"]):
        with contextlib.suppress(psutil.Error, TypeError):
            env = proc.info["environ"] or {}
            ours = proc.pid in pids or "GOSCHED_TASK_ID" in env or "TEST_UNRELATED" in env
            if ours and proc.info["create_time"] >= start:
                proc.kill()


@pytest.fixture
def executor(tmp_path: Path, since: float) -> Iterator[ShellExecutor]:
    ex = ShellExecutor(tmp_path / "logs")
    yield ex
    for task_id in list(ex.running):
        ex.kill(task_id, grace_s=0)
    ex.wait_all(TIMEOUT_S)


def escaped(executor: ShellExecutor, task_id: str, pidfile: Path) -> int:
    pid = read_pid(pidfile)
    assert running(pid)
    assert os.getpgid(pid) != executor.pid(task_id)  # it left the task's process group
    return pid


def test_a_kill_sends_its_sigterm_to_the_processes_that_left_the_group(
    executor: ShellExecutor, tmp_path: Path
) -> None:
    pidfile = tmp_path / "escaped.pid"
    # The task's own process stays (it ignores SIGTERM) while its escaped child gets the SIGTERM.
    executor.start(TaskSpec("t/0", [f"{escape(pidfile)} trap '' TERM; exec {SLEEP} 60"]))
    child = escaped(executor, "t/0", pidfile)
    executor.kill("t/0", grace_s=60)
    wait_until("the escaped child to die of SIGTERM", lambda: (executor.poll(), not running(child))[1])
    assert "t/0" in executor.running  # within the grace: the task itself still runs
    executor.kill("t/0", grace_s=0)
    (end,) = executor.wait_all(TIMEOUT_S)
    assert (end.reason, end.signal) == ("killed", signal.SIGKILL)


def test_after_the_grace_a_kill_ends_the_processes_that_left_the_group(
    executor: ShellExecutor, tmp_path: Path
) -> None:
    marked, cleared = tmp_path / "marked.pid", tmp_path / "cleared.pid"
    command = (
        f"{escape(marked, ignore_term=True)} {escape(cleared, ignore_term=True, clear_env=True)} "
        f"trap '' TERM; exec {SLEEP} 60"
    )
    executor.start(TaskSpec("t/0", [command]))
    children = [escaped(executor, "t/0", marked), escaped(executor, "t/0", cleared)]
    started = time.monotonic()
    executor.kill("t/0", grace_s=GRACE_S)
    (end,) = executor.wait_all(TIMEOUT_S)
    assert (end.reason, end.signal) == ("killed", signal.SIGKILL)
    assert time.monotonic() - started >= GRACE_S * 0.8
    # The shim was killed with its group: the agent found them, by the mark or in the shim's tree.
    wait_until("the escaped children to be gone", lambda: not any(map(running, children)))


@pytest.mark.parametrize("clear_env", [False, True])
def test_what_a_batch_task_leaves_running_dies_when_it_ends(
    executor: ShellExecutor, tmp_path: Path, clear_env: bool
) -> None:
    pidfile, background = tmp_path / "escaped.pid", tmp_path / "background.pid"
    command = (
        f"{escape(pidfile, clear_env=clear_env)} {SLEEP} 60 & echo $! > {background}; "
        f"while [ ! -e {pidfile} ]; do {SLEEP} 0.01; done; exit 0"  # once its child has written its pid
    )
    executor.start(TaskSpec("t/0", [command]))
    children = [read_pid(pidfile), read_pid(background)]
    (end,) = executor.wait_all(TIMEOUT_S)
    assert (end.reason, end.exit_code) == ("exited", 0)
    wait_until("what the task left to be gone", lambda: not any(map(running, children)))


def test_without_its_shim_the_agent_still_finds_the_marked_processes(
    executor: ShellExecutor, tmp_path: Path
) -> None:
    pidfile = tmp_path / "escaped.pid"
    executor.start(TaskSpec("t/0", [f"{escape(pidfile)} exec {SLEEP} 60"]))
    child = escaped(executor, "t/0", pidfile)
    shim = executor.pid("t/0")
    assert shim is not None
    os.kill(shim, signal.SIGKILL)  # as the OOM killer or an operator might: the shim cleans up nothing
    (end,) = executor.wait_all(TIMEOUT_S)
    assert end.signal == signal.SIGKILL
    wait_until("the escaped child to be gone", lambda: not running(child))


def test_processes_that_are_not_the_task_s_are_left_alone(
    executor: ShellExecutor, tmp_path: Path, since: float
) -> None:
    nonce = "0123456789abcdef"
    pidfile = tmp_path / "escaped.pid"
    spec = TaskSpec(
        "t/0", [f"{escape(pidfile, ignore_term=True)} trap '' TERM; exec {SLEEP} 60"], nonce=nonce
    )
    executor.start(spec)
    child = escaped(executor, "t/0", pidfile)
    # Younger than the task's shim, of the same user, in sessions of their own, with marks that
    # are almost the task's: only an exact match counts.
    lookalikes = [
        {NONCE_VAR: nonce + "0", "GOSCHED_TASK_ID": "t/0"},
        {NONCE_VAR: nonce[:-1]},
        {NONCE_VAR: ""},
        {"X": f"{NONCE_VAR}={nonce}", "GOSCHED_TASK_ID": "t/0"},
        {f"X{NONCE_VAR}": nonce},
    ]
    others = [
        subprocess.Popen(
            [SLEEP, "60"],
            env={**env, "TEST_UNRELATED": "1", "PATH": os.environ.get("PATH", "")},
            start_new_session=True,
        )
        for env in lookalikes
    ]
    try:
        shim = executor.pid("t/0")
        assert shim is not None and all(start_ticks(p.pid) >= start_ticks(shim) for p in others)
        executor.kill("t/0", grace_s=GRACE_S)
        (end,) = executor.wait_all(TIMEOUT_S)
        assert end.reason == "killed"
        wait_until("the escaped child to be gone", lambda: not running(child))
        # A batch task that ends, and the scan at its end.
        executor.start(TaskSpec("b/0", ["exit 0"], nonce=nonce + "1"))
        (end,) = executor.wait_all(TIMEOUT_S)
        assert end.exit_code == 0
        assert [p.poll() for p in others] == [None] * len(others)
    finally:
        for p in others:
            p.kill()
            p.wait()


def test_the_scan_finds_only_the_run_s_own_processes(executor: ShellExecutor, tmp_path: Path) -> None:
    pidfile = tmp_path / "escaped.pid"
    executor.start(TaskSpec("t/0", [f"{escape(pidfile)} exec {SLEEP} 60"], nonce="n1"))
    child = escaped(executor, "t/0", pidfile)
    shim = executor.pid("t/0")
    assert shim is not None
    run = Tracked(shim, start_ticks(shim), "n1")
    found = {p.pid for p in Snapshot().find(run)}
    assert child in found and shim not in found and os.getpid() not in found
    not_the_shim = Tracked(shim, start_ticks(shim) + 1, "n2")  # its pid, another start time: a reused pid
    assert Snapshot().find(not_the_shim) == []
    assert Snapshot().find(Tracked(0, 0, "n2")) == []


def test_a_kill_of_an_adopted_task_reaches_what_left_its_group(
    executor: ShellExecutor, tmp_path: Path
) -> None:
    """An agent restarted meanwhile knows the run's nonce (from its state file) and its shim."""
    pidfile = tmp_path / "escaped.pid"
    spec = TaskSpec("t/0", [f"{escape(pidfile, ignore_term=True)} trap '' TERM; exec {SLEEP} 60"])
    executor.start(spec)
    child = escaped(executor, "t/0", pidfile)
    shim = executor.pid("t/0")
    assert shim is not None
    adopted = AdoptedProcess(shim, create_time(shim), spec.nonce)
    adopted.kill(GRACE_S)
    wait_until("the adopted task to end", adopted.ended)
    wait_until("the escaped child to be gone", lambda: not running(child))
    executor.wait_all(TIMEOUT_S)  # reaps the shim: this process started it


def test_with_a_cgroup_a_kill_ends_all_of_the_task(tmp_path: Path, since: float) -> None:
    support = detect()
    if not support.available:
        pytest.skip(f"cgroup v2 not writable here: {support.reason}")
    ex = ShellExecutor(tmp_path / "logs", cgroups=support)
    pidfile = tmp_path / "escaped.pid"
    ex.start(TaskSpec("cg/0", [f"{escape(pidfile, ignore_term=True, clear_env=True)} exec {SLEEP} 60"]))
    child = escaped(ex, "cg/0", pidfile)
    ex.kill("cg/0", grace_s=GRACE_S)
    (end,) = ex.wait_all(TIMEOUT_S)
    assert end.reason == "killed"
    wait_until("the escaped child to be gone", lambda: not running(child))


def test_the_shim_kills_what_its_task_left_and_says_so(tmp_path: Path, since: float) -> None:
    """Without the agent: the shim is the subreaper of the task's orphans, and kills them once the
    task's process has ended, before it records the exit code (with `swept`: nothing is left)."""
    pidfile, status = tmp_path / "escaped.pid", tmp_path / "status"
    task = f"{escape(pidfile, clear_env=True)} while [ ! -e {pidfile} ]; do {SLEEP} 0.01; done; exit 3"
    ready, ready_w = os.pipe()
    try:
        shim_proc = subprocess.Popen(
            [sys.executable, "-I", "-S", SHIM, str(status), str(ready_w), "/bin/sh", "-c", task],
            pass_fds=(ready_w,),
            start_new_session=True,
        )
    finally:
        os.close(ready_w)
        os.close(ready)
    child = read_pid(pidfile)
    assert shim_proc.wait(TIMEOUT_S) == 3
    assert not running(child)  # killed before the shim recorded the task's end
    assert (read_status(status), read_swept(status)) == (3, True)
