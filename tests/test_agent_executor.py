"""The agent's executor on real processes: env and GPUs, logs, exit codes, kills of whole trees,
and the shim that records each task's exit code for an agent that did not start it."""

import signal
import time
from pathlib import Path

import pytest

from gosched.agent.cgroups import detect
from gosched.agent.executor import ShellExecutor, TaskSpec, task_env
from gosched.agent.shim import read_status


@pytest.fixture
def executor(tmp_path: Path) -> ShellExecutor:
    return ShellExecutor(tmp_path / "logs")


def test_gpus_env_and_logs(executor: ShellExecutor, tmp_path: Path) -> None:
    spec = TaskSpec(
        "j/0",
        ['echo "gpus=$CUDA_VISIBLE_DEVICES x=$X pwd=$(pwd)"; echo oops >&2'],
        env={"X": "42"},
        gpus=[0, 3],
        cwd=str(tmp_path),
    )
    assert executor.start(spec) is None
    (end,) = executor.wait_all(10)
    assert end.reason == "exited" and end.exit_code == 0
    out, err = executor.log_paths("j/0")
    assert out.read_text().strip() == f"gpus=0,3 x=42 pwd={tmp_path}"
    assert err.read_text().strip() == "oops"


@pytest.mark.parametrize(("command", "code"), [(["exit 3"], 3), (["true"], 0), (["/bin/false"], 1)])
def test_exit_codes(executor: ShellExecutor, command: list[str], code: int) -> None:
    executor.start(TaskSpec("t/0", command))
    (end,) = executor.wait_all(10)
    assert end.exit_code == code and end.reason == "exited"


def test_one_word_is_a_script_unless_it_is_a_program_file(executor: ShellExecutor, tmp_path: Path) -> None:
    folder = tmp_path / "my tools"
    folder.mkdir()
    program = folder / "run"
    program.write_text("#!/bin/sh\necho ran as a program\n")
    program.chmod(0o755)
    executor.start(TaskSpec("p/0", [str(program)]))  # a shell would split the path at its space
    executor.start(TaskSpec("s/0", ["echo a && echo b"]))  # a script
    ends = {e.task_id: e for e in executor.wait_all(10)}
    assert ends["p/0"].exit_code == 0 and ends["s/0"].exit_code == 0
    assert executor.log_paths("p/0")[0].read_text() == "ran as a program\n"
    assert executor.log_paths("s/0")[0].read_text() == "a\nb\n"


def test_missing_program_fails_to_start(executor: ShellExecutor) -> None:
    end = executor.start(TaskSpec("t/0", ["/nonexistent/program", "arg"]))
    assert end is not None and end.reason == "failed_to_start"
    assert end.message == "[Errno 2] No such file or directory: '/nonexistent/program'"
    assert executor.running == {}


@pytest.mark.parametrize(
    ("command", "code", "sig"),
    [
        (["kill -USR1 $$"], -signal.SIGUSR1, signal.SIGUSR1),  # the shell itself dies of it
        (["/bin/sh", "-c", "kill -USR1 $$"], -signal.SIGUSR1, signal.SIGUSR1),  # argv
        (["exit 130"], 130, None),  # an exit code above 128 is not a signal
    ],
)
def test_a_death_by_signal_is_told_from_an_exit_code(
    executor: ShellExecutor, command: list[str], code: int, sig: int | None
) -> None:
    executor.start(TaskSpec("t/0", command))
    (end,) = executor.wait_all(10)
    assert (end.exit_code, end.signal, end.reason) == (code, sig, "exited")


def test_the_shim_records_the_exit_code_for_an_agent_that_did_not_start_the_task(
    executor: ShellExecutor, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    executor.start(TaskSpec("t/0", [f"while [ ! -e {go} ]; do sleep 0.02; done; exit 3"]))
    status = executor.status_path("t/0")
    time.sleep(0.2)
    assert read_status(status) is None  # nothing until the task ends
    go.touch()
    deadline = time.monotonic() + 5
    while read_status(status) is None:  # what a restarted agent reads: no wait() needed
        assert time.monotonic() < deadline, "no exit code recorded"
        time.sleep(0.02)
    assert read_status(status) == 3
    (end,) = executor.wait_all(10)
    assert end.exit_code == 3 and not status.exists()  # this agent waited: the file is not needed
    assert list(status.parent.glob("*.exit*")) == []


def test_the_task_gets_exactly_its_env(executor: ShellExecutor) -> None:
    # A C locale makes Python set LC_CTYPE in its own env (PEP 538): not in the task's.
    spec = TaskSpec("t/0", ["/usr/bin/env", "-0"], env={"LC_ALL": "", "LC_CTYPE": "C", "X": "a b"})
    executor.start(spec)
    (end,) = executor.wait_all(10)
    assert end.exit_code == 0
    out = executor.log_paths("t/0")[0].read_bytes().decode()
    seen = dict(item.split("=", 1) for item in out.split("\0") if item)
    assert seen == task_env(spec)


def test_a_killed_task_has_its_grace_period_to_exit(executor: ShellExecutor) -> None:
    # The SIGTERM reaches the shim too: it must not die of it, or the group is SIGKILLed at once.
    executor.start(TaskSpec("t/0", ["trap 'sleep 0.3; echo bye; exit 0' TERM; sleep 60 & wait"]))
    time.sleep(0.2)
    executor.kill("t/0", grace_s=5)
    (end,) = executor.wait_all(10)
    assert (end.reason, end.exit_code) == ("killed", 0)
    assert executor.log_paths("t/0")[0].read_text() == "bye\n"


def test_kill_reaches_the_whole_process_tree(executor: ShellExecutor, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # The task starts a grandchild that ignores nothing and sleeps; killing the task must end both.
    executor.start(TaskSpec("t/0", [f"sleep 60 & echo $! > {pidfile}; wait"]))
    deadline = time.time() + 5
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.time() < deadline
        time.sleep(0.02)
    child = int(pidfile.read_text())
    assert executor.kill("t/0", grace_s=5)
    (end,) = executor.wait_all(10)
    assert end.reason == "killed"
    deadline = time.time() + 5
    while running(child):
        assert time.time() < deadline, "the grandchild survived the kill"
        time.sleep(0.05)


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie lingers until some init reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_sigterm_ignored_then_sigkill_after_grace(executor: ShellExecutor) -> None:
    executor.start(TaskSpec("t/0", ["trap '' TERM; sleep 60"]))
    time.sleep(0.2)
    executor.kill("t/0", grace_s=0.3)
    start = time.monotonic()
    (end,) = executor.wait_all(10)
    assert end.reason == "killed" and end.signal == 9
    assert time.monotonic() - start >= 0.25


def test_a_repeated_launch_does_not_run_twice(executor: ShellExecutor) -> None:
    executor.start(TaskSpec("t/0", ["sleep 0.3; echo once"]))
    executor.start(TaskSpec("t/0", ["sleep 0.3; echo once"]))
    executor.wait_all(10)
    assert executor.log_paths("t/0")[0].read_text().count("once") == 1


def test_memory_limit_kills_and_reports(tmp_path: Path) -> None:
    support = detect()
    if not support.available:
        pytest.skip(f"cgroup v2 not writable here: {support.reason}")
    ex = ShellExecutor(tmp_path / "logs", cgroups=support)
    hog = 'python3 -c "b = bytearray(512 * 2**20); import time; time.sleep(5)"'
    ex.start(TaskSpec("hog/0", [hog], memory=64 * 2**20))
    (end,) = ex.wait_all(30)
    assert end.reason == "oom_killed"
