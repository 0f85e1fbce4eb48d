"""Finding a task's processes that left its process group, where no cgroup holds them (as Slurm's
proctrack/linuxproc does): a kill of the group misses a descendant that called setsid() (a daemon,
`setsid cmd &`, Python's `start_new_session=True`), and it would keep holding what the scheduler
believes free.

A run's processes are found two ways, both read from /proc (Linux; elsewhere nothing is found):

- its tree: the descendants of its shim, which is a child subreaper (agent/shim.py), so that an
  orphan reparents to the shim rather than to init and stays in the tree, even one that cleared
  its environment;
- its mark: `GOSCHED_TASK_NONCE=<nonce>` in the environment, a value drawn afresh for each run,
  which every descendant inherits: what finds them once the shim is gone. Only processes no older
  than the shim are read (and an environment is readable only for the agent's own uid, or by root).

Nothing else is ever signalled: a process counts only if it descends from the run's shim (the same
process: pid and start time) or carries exactly the run's nonce, and never the agent itself. Each
signal goes through a pidfd opened after checking that the pid still names the process found, so a
pid reused meanwhile is left alone.

Scanning /proc costs a read per process: it is done when a run is killed or ends, never per
heartbeat, and one scan serves every run handled in the same poll.
"""

import contextlib
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from gosched.agent.cgroups import TaskCgroup

NONCE_VAR = "GOSCHED_TASK_NONCE"
KILL_ROUNDS = 20  # scans per SIGKILL sweep at most: each finds only what forked before the last


def new_nonce() -> str:
    return os.urandom(16).hex()


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    start: int  # clock ticks after boot: with the pid, what identifies the process
    zombie: bool


@dataclass(slots=True)
class Tracked:
    """What identifies one run's processes beyond its process group."""

    leader: int  # the run's shim: it leads the group, and it is a child subreaper
    since: int  # the shim's start (clock ticks after boot): no process of the run is older; 0: unknown
    nonce: str  # NONCE_VAR's value in the run's environment; "": the run is not marked
    cgroup: TaskCgroup | None = None  # where it has one, the cgroup holds all of the run's processes


def stat(pid: int) -> Proc | None:
    try:
        text = _read(f"/proc/{pid}/stat")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold anything: split after the last ")".
    fields = text.rpartition(b")")[2].split()
    try:
        return Proc(pid, int(fields[1]), int(fields[2]), int(fields[19]), fields[0] in (b"Z", b"X"))
    except (IndexError, ValueError):
        return None


def _read(path: str) -> bytes:
    """All of a /proc file: os.read, several times cheaper than open().read() where scans are long."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def start_ticks(pid: int) -> int:
    """The process's start time in clock ticks after boot; 0 if it is gone (or not Linux)."""
    proc = stat(pid)
    return 0 if proc is None else proc.start


class Snapshot:
    """The processes running now (those of /proc), to find runs' processes in."""

    def __init__(self) -> None:
        self.procs: dict[int, Proc] = {}
        self.children: dict[int, list[int]] = {}
        try:
            names = os.listdir("/proc")
        except OSError:
            names = []
        for name in names:
            if name.isdigit() and (proc := stat(int(name))) is not None:
                self.procs[proc.pid] = proc
                self.children.setdefault(proc.ppid, []).append(proc.pid)

    def find(self, run: Tracked) -> list[Proc]:
        """The run's live processes, but not its shim."""
        roots = []
        leader = self.procs.get(run.leader)
        if leader is not None and run.since and leader.start == run.since:
            roots.append(run.leader)
        if run.nonce:
            mark = f"{NONCE_VAR}={run.nonce}".encode()
            for proc in self.procs.values():
                young = proc.start >= run.since and not proc.zombie and proc.pid != run.leader
                if young and _marked(proc.pid, mark):  # the environment only of the young ones
                    roots.append(proc.pid)
        found: dict[int, Proc] = {}
        stack = list(roots)
        while stack:  # each root and what descends from it
            pid = stack.pop()
            for child in self.children.get(pid, ()):
                if child not in found:
                    found[child] = self.procs[child]
                    stack.append(child)
            if pid != run.leader and pid not in found:
                found[pid] = self.procs[pid]
        me = os.getpid()
        return [p for p in found.values() if not p.zombie and p.pid not in (me, run.leader)]


def _marked(pid: int, mark: bytes) -> bool:
    try:
        environ = _read(f"/proc/{pid}/environ")
    except OSError:  # gone, or another user's
        return False
    return mark in environ.split(b"\0")


def send(proc: Proc, sig: int) -> bool:
    """Signal the process if its pid still names it (not a process that reused the pid)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return False
    except (OSError, AttributeError):  # a kernel without pidfds (before 5.3): check, then signal by pid
        fd = -1
    try:
        now = stat(proc.pid)
        if now is None or now.start != proc.start or now.zombie:
            return False
        if fd >= 0:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(proc.pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if fd >= 0:
            os.close(fd)


def terminate(runs: Sequence[Tracked]) -> None:
    """SIGTERM each run's processes outside its process group (which got its own SIGTERM from the
    kill): the task decides what they do, as it does for those of its group."""
    if not runs:
        return
    snapshot: Snapshot | None = None
    for run in runs:
        if run.cgroup is not None:
            for pid in run.cgroup.pids():
                with contextlib.suppress(OSError):
                    if os.getpgid(pid) != run.leader:
                        os.kill(pid, signal.SIGTERM)
            continue
        snapshot = snapshot or Snapshot()
        for proc in snapshot.find(run):
            if proc.pgid != run.leader:
                send(proc, signal.SIGTERM)


def kill(runs: Sequence[Tracked]) -> None:
    """SIGKILL all of each run, its process group last: the group (shim included) is stopped first,
    so that it forks nothing meanwhile and the shim stays the subreaper of what it orphans; then
    its other processes are killed, scan after scan until one finds nothing new (a process forks
    nothing once it has a SIGKILL pending); then the group."""
    if not runs:
        return
    for run in runs:
        if run.since and start_ticks(run.leader) == run.since:  # the shim has not ended
            signal_group(run.leader, signal.SIGSTOP)
        if run.cgroup is not None:
            run.cgroup.kill()
    tracked = [run for run in runs if run.cgroup is None]
    killed: dict[tuple[int, int], Proc] = {}
    for _ in range(KILL_ROUNDS if tracked else 0):
        snapshot = Snapshot()
        new = [p for run in tracked for p in snapshot.find(run) if (p.pid, p.start) not in killed]
        if not new:
            break
        for proc in new:
            send(proc, signal.SIGKILL)
            killed[proc.pid, proc.start] = proc
    for run in runs:
        signal_group(run.leader, signal.SIGKILL)


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
