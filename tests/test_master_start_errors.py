"""`gosched master` start-up, run as the real program on loopback ports: a refused start is one
`error:` line (no gRPC C-core log lines), exits 1 whether a port or the store is taken, notes no
new store and leaves nothing on disk; a started one notes a new store; a scheduler that stops
says why on one line, not as a repr."""

import fcntl
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gosched.api import server
from gosched.cli import master_cmds
from gosched.cli.exits import ExitCode
from gosched.cli.main import app
from tests.ray_heads import free_port

START_S = 90  # a loaded 2-core machine can take long to import and start; only a bound, not a pace
READY = re.compile(r"^gosched master ready: gRPC :(\d+), HTTP :(\d+),")


def gosched(*args: str, env: dict[str, str] | None = None, code: str | None = None) -> list[str]:
    """The command line of `gosched ARGS` (or of a Python `code` that runs the CLI itself)."""
    head = [sys.executable, "-c", code] if code else [sys.executable, "-m", "gosched.cli.main"]
    return [*head, *args]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """A master that must give up at start, so it returns on its own."""
    return subprocess.run(gosched(*args), capture_output=True, text=True, timeout=START_S, check=False)


def master_args(store: Path, grpc_port: int = 0, http_port: int = 0) -> list[str]:
    return [
        "master",
        "--in-process",
        "--store",
        str(store),
        "--grpc-port",
        str(grpc_port),
        "--http-port",
        str(http_port),
    ]


class Master:
    """A running `gosched master`, its stdout read line by line (its stderr kept for the end)."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def ready(self) -> tuple[int, int]:
        """Wait for the ready line: (gRPC port, HTTP port)."""
        deadline = time.monotonic() + START_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"the master ended before it was ready: {self.finish()}")
            if found := READY.match(line):
                return int(found[1]), int(found[2])
        raise AssertionError("the master did not get ready in time")

    def finish(self, sig: signal.Signals | None = None) -> tuple[int, str]:
        """Send `sig` (none: it is ending on its own), wait: (exit status, stderr)."""
        if sig is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=START_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
            raise AssertionError(f"the master did not end: {err}") from None
        return self.proc.returncode, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def masters() -> Iterator[list[Master]]:
    started: list[Master] = []
    yield started
    for master in started:
        master.kill()


@pytest.fixture
def loopback_listener() -> Iterator[int]:
    """A port something else listens on (127.0.0.1): the master's [::] and 0.0.0.0 binds clash."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# -- finding: a port taken is one line of ours, none of gRPC's ------------------------------------
@pytest.mark.parametrize("which", ["grpc", "http"])
def test_a_port_taken_is_one_error_line_naming_the_port_and_its_flag(
    which: str, loopback_listener: int, tmp_path: Path
) -> None:
    port = loopback_listener
    ports = {"grpc_port": port} if which == "grpc" else {"http_port": port}
    done = run(*master_args(tmp_path / "gosched.db", **ports))
    where = f"cannot listen on [::]:{port}" if which == "grpc" else f"cannot serve HTTP on 0.0.0.0:{port}"
    flag = f"--{which}-port"
    # gRPC's own failure wrote "E0000 ... add_port.cc ... Failed to add port" lines above ours.
    why = f"the port is taken (another master?); choose another with {flag}"
    assert done.stderr.splitlines() == [f"error: cannot start the master: {where}: {why}"], done.stderr
    assert done.returncode == ExitCode.FAILED


# -- finding: no note of a new store, and nothing left, when the start fails ------------------------
def test_a_start_refused_for_a_port_notes_no_store_and_makes_nothing(
    loopback_listener: int, tmp_path: Path
) -> None:
    store = tmp_path / "new" / "folder" / "gosched.db"
    done = run(*master_args(store, grpc_port=loopback_listener))
    assert done.returncode != 0
    assert "note:" not in done.stderr, done.stderr  # it said "starting a new, empty one", then failed
    assert files_under(tmp_path) == []  # were: new/folder/, gosched.db.lock and gosched.db.logs/


def test_a_start_that_fails_after_taking_the_store_removes_what_it_made(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    # Joining a Ray cluster where none answers fails once the store is locked and its folders made.
    store = tmp_path / "new" / "gosched.db"
    address = f"127.0.0.1:{free_port()}"
    done = run("master", "--address", address, "--store", str(store), "--grpc-port", "0", "--http-port", "0")
    assert done.returncode == ExitCode.FAILED, done.stderr
    assert f"error: no Ray cluster answers at {address}" in done.stderr
    assert "note:" not in done.stderr, done.stderr
    assert files_under(tmp_path) == []


def test_an_existing_folder_and_store_stay_after_a_failed_start(
    loopback_listener: int, tmp_path: Path
) -> None:
    store = tmp_path / "gosched.db"
    store.write_bytes(b"")  # only what it made goes: never the store it was given
    (tmp_path / "keep").mkdir()
    done = run(*master_args(store, grpc_port=loopback_listener))
    assert done.returncode == ExitCode.FAILED, done.stderr
    assert files_under(tmp_path) == ["gosched.db", "keep"]


def test_a_new_store_is_noted_once_the_master_has_started(masters: list[Master], tmp_path: Path) -> None:
    store = tmp_path / "new" / "gosched.db"
    for first in (True, False):  # a restart on the store it made: no note
        master = Master(gosched(*master_args(store)))
        masters.append(master)
        master.ready()
        code, err = master.finish(signal.SIGTERM)
        assert code == 0, err
        noted = f"note: no store at {store}: started a new, empty one"
        assert (noted in err.splitlines()) is first, err
        assert store.exists()


# -- finding: one exit status for a start the machine refuses ------------------------------------
def test_a_port_and_a_store_held_by_another_master_exit_alike(masters: list[Master], tmp_path: Path) -> None:
    store = tmp_path / "gosched.db"
    first = Master(gosched(*master_args(store)))
    masters.append(first)
    grpc_port, http_port = first.ready()

    busy = run(*master_args(store))
    assert busy.stderr.startswith(f"error: another master (pid {first.proc.pid}) holds the store {store}")
    grpc_taken = run(*master_args(tmp_path / "other.db", grpc_port=grpc_port))
    assert f"cannot listen on [::]:{grpc_port}: the port is taken" in grpc_taken.stderr
    http_taken = run(*master_args(tmp_path / "third.db", http_port=http_port))
    assert f"cannot serve HTTP on 0.0.0.0:{http_port}: the port is taken" in http_taken.stderr
    # Were 1 for the store and 2 for a port: both are the machine's state, not a bad command line.
    codes = {"store": busy.returncode, "grpc": grpc_taken.returncode, "http": http_taken.returncode}
    assert codes == dict.fromkeys(codes, ExitCode.FAILED), codes

    code, err = first.finish(signal.SIGTERM)  # the refused ones took nothing from it, made nothing
    assert code == 0, err
    assert not [name for name in files_under(tmp_path) if name.startswith(("other", "third"))]


def test_the_rule_is_in_the_help_and_a_bad_flag_still_exits_2(tmp_path: Path) -> None:
    shown = " ".join(CliRunner().invoke(app, ["master", "--help"]).output.split())
    assert "Exits 2 on an invalid flag or configuration" in shown
    assert "1 if the start is refused (a port in use, another master on the store" in shown
    bad = run(*master_args(tmp_path / "gosched.db"), "--sim-nodes", "-1")
    assert bad.returncode == ExitCode.USAGE, bad.stderr


# -- finding: the scheduler stopping is told on one line, not as a repr -----------------------------
# The CLI, with the in-process scheduler made to fail (as a corrupt store would) once the test says so.
FAILING_SCHEDULER = """
import os, sqlite3, sys
from gosched.runtime.local_control import LocalControl

real = LocalControl.idle_wait

def idle_wait(self):
    if os.path.exists(os.environ["FAIL_WHEN"]):
        raise sqlite3.DatabaseError("database disk image is malformed")
    return real(self)

LocalControl.idle_wait = idle_wait
from gosched.cli.main import app
app(prog_name="gosched")
"""


def test_a_scheduler_that_stops_is_told_on_one_clean_line(masters: list[Master], tmp_path: Path) -> None:
    trigger = tmp_path / "fail-now"
    argv = gosched(*master_args(tmp_path / "gosched.db"), code=FAILING_SCHEDULER)
    master = Master(argv, env={"FAIL_WHEN": str(trigger)})
    masters.append(master)
    master.ready()
    trigger.touch()
    code, err = master.finish()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    # Was: error: the scheduler stopped: DatabaseError('database disk image is malformed')
    assert errors == ["error: the scheduler stopped: DatabaseError: database disk image is malformed"], err
    assert code == ExitCode.FAILED


# -- the pieces, in this process ------------------------------------------------------------------
def test_missing_store_is_asked_before_and_noted_after(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    existing = tmp_path / "gosched.db"
    existing.write_bytes(b"")
    assert master_cmds.missing_store(str(existing)) is None
    assert master_cmds.missing_store(":memory:") is None
    missing = tmp_path / "some" / "path.db"
    assert master_cmds.missing_store(str(missing)) == missing
    assert not (tmp_path / "some").exists()  # asking makes nothing
    master_cmds.note_new_store(None)
    assert capsys.readouterr().err == ""
    master_cmds.note_new_store(missing)
    assert capsys.readouterr().err == f"note: no store at {missing}: started a new, empty one\n"


@pytest.mark.parametrize("command", ["master", "up"])
def test_no_note_when_the_start_fails(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: object, **kwargs: object) -> None:
        raise typer.Exit(master_cmds._fail("refused"))

    monkeypatch.setattr(master_cmds, "_start", refused)
    store = tmp_path / "typo" / "gosched.db"
    args = [command, "--store", str(store)]
    args += ["--in-process"] if command == "master" else ["--work-dir", str(tmp_path / "up")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == ExitCode.FAILED, result.output
    assert "note:" not in result.stderr and "error: refused" in result.stderr, result.output


def test_a_lock_taken_on_a_removed_lock_file_is_taken_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failed start removes the lock file it made while holding it; one that opened the file just
    # before then gets the flock of a file no longer at the path, which guards nothing.
    db = tmp_path / "gosched.db"
    path = tmp_path / "gosched.db.lock"
    real = fcntl.flock
    removed: list[bool] = []

    def flock(fd: Any, op: int) -> None:
        if not removed:
            removed.append(True)
            path.unlink()  # what the failed start does between this one's open and its flock
        real(fd, op)

    monkeypatch.setattr(server.fcntl, "flock", flock)
    held = server.lock_store(db)
    try:
        assert removed
        assert os.path.samestat(os.fstat(held.fileno()), path.stat())
        monkeypatch.setattr(server.fcntl, "flock", real)
        with pytest.raises(server.StoreBusy, match=f"pid {os.getpid()}"):
            server.lock_store(db)
    finally:
        held.close()


def test_a_lock_path_that_never_holds_a_file_fails_instead_of_spinning(tmp_path: Path) -> None:
    db = tmp_path / "gosched.db"
    (tmp_path / "gosched.db.lock").symlink_to(tmp_path / "gone" / "x.lock")  # dangling, for good
    with pytest.raises(OSError, match=r"cannot lock .*gosched\.db\.lock"):
        server.lock_store(db)


def test_a_failed_start_removes_the_store_before_the_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Once the lock file is gone another master may lock the path anew and open the store: by
    # then this start's new store files must be gone already, or it would remove that one's.
    db = tmp_path / "new" / "gosched.db"
    log_root = tmp_path / "new" / "gosched.db.logs"
    lock = tmp_path / "new" / "gosched.db.lock"
    made = server._new_paths(lock, log_root)
    order: list[Path] = []
    monkeypatch.setattr(server, "_remove_new", lambda paths: order.extend(paths))
    server._undo_start(db, log_root, made, store_new=True)
    ends = ("", "-wal", "-shm", ".writer.lock")  # the binder's writer's lock: the store's too
    store_files = [db.with_name("gosched.db" + end) for end in ends]
    assert order == [*store_files, log_root, lock, tmp_path / "new"]
    order.clear()
    server._undo_start(db, log_root, made, store_new=False)  # an existing store is never removed
    assert order == [log_root, lock, tmp_path / "new"]


# The CLI with a control plane that takes a while to start, and says when it begins.
SLOW_START = """
import os, time
from gosched.runtime.local_control import LocalControl

real = LocalControl.__init__

def slow_init(self, *args, **kwargs):
    open(os.environ["STARTING"], "w").close()
    time.sleep(2.0)
    real(self, *args, **kwargs)

LocalControl.__init__ = slow_init
from gosched.cli.main import app
app(prog_name="gosched")
"""


def test_sigterm_during_the_start_removes_what_it_made(masters: list[Master], tmp_path: Path) -> None:
    # It used to kill the master outright: the lock file and the new store stayed behind.
    starting = tmp_path / "starting"
    folder = tmp_path / "new"
    argv = gosched(*master_args(folder / "gosched.db"), code=SLOW_START)
    master = Master(argv, env={"STARTING": str(starting)})
    masters.append(master)
    deadline = time.monotonic() + START_S
    while not starting.exists():
        assert time.monotonic() < deadline and master.proc.poll() is None, master.finish()
        time.sleep(0.05)
    code, err = master.finish(signal.SIGTERM)
    assert code == ExitCode.INTERRUPTED, err
    assert "stopped before the master was ready" in err
    assert not folder.exists(), files_under(folder)
