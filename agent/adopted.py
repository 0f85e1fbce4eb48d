"""Tasks left running by a previous agent process: not our children, so watched by polling (how
one ended is what its shim recorded: see agent/shim.py and TaskTable._adopted_exit).

A process is the same one only if both its pid and its creation time match: a pid alone may
have been reused by an unrelated process since the state file was written.

A kill or an end reaches the task's processes that left its group as it does for the agent's own
runs (agent/proctrack.py): by the saved nonce of the run, its cgroup, and the tree of its shim.
"""

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from gosched.agent import proctrack
from gosched.agent.cgroups import TaskCgroup
from gosched.agent.proctrack import Tracked
from gosched.agent.shim import read_swept

CREATE_TIME_SLACK_S = 0.05  # psutil derives it from clock ticks; allow rounding, not a reuse


def create_time(pid: int) -> float:
    """The process's creation time (unix seconds), 0.0 if it is gone."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0


def same_process_alive(pid: int, created: float) -> bool:
    if pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - created) > CREATE_TIME_SLACK_S:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


@dataclass(slots=True)
class AdoptedProcess:
    pid: int  # the task's shim, and its process group: every task runs in a session of its own
    created: float
    nonce: str = ""  # the mark in the run's environment (proctrack.NONCE_VAR); "": an older agent's run
    cgroup: str = ""
    exit_file: str = ""  # where its shim records how it ended (agent/shim.py)
    kill_deadline: float | None = None
    tracked: Tracked = field(init=False)
    terminate: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        # Read while the shim is known alive (it was just adopted): its start time in clock ticks.
        since = proctrack.start_ticks(self.pid) if self.alive() else 0
        cgroup = TaskCgroup(Path(self.cgroup)) if self.cgroup else None
        self.tracked = Tracked(self.pid, since, self.nonce, cgroup)

    def alive(self) -> bool:
        return same_process_alive(self.pid, self.created)

    def kill(self, grace_s: float) -> None:
        """SIGTERM the group now and what left it at the next `ended`, SIGKILL all of it after `grace_s`."""
        self.kill_deadline = time.monotonic() + grace_s
        self.terminate = True
        proctrack.signal_group(self.pid, signal.SIGTERM)

    def resume_kill(self, grace_s: float) -> None:
        """Carry on a kill that a previous agent process began (its SIGTERM went out then): SIGKILL
        once the `grace_s` left has run out. No second SIGTERM: a task may take that as "now"."""
        self.kill_deadline = time.monotonic() + max(0.0, grace_s)

    def ended(self) -> bool:
        """Has it exited? Escalates a kill whose grace has run out."""
        if not self.alive():
            if self.exit_file and read_swept(self.exit_file):  # its shim left nothing running
                proctrack.signal_group(self.pid, signal.SIGKILL)
            else:
                proctrack.kill([self.tracked])  # whatever of its group, or outside it, lingers
            return True
        if self.kill_deadline is not None and time.monotonic() >= self.kill_deadline:
            proctrack.kill([self.tracked])
            self.kill_deadline = None
        elif self.terminate:
            proctrack.terminate([self.tracked])
        self.terminate = False
        return False
