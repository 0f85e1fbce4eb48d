"""Tasks left running by a previous agent process: not our children, so watched by polling (how
one ended is what its shim recorded: see agent/shim.py and TaskTable._adopted_exit).

A process is the same one only if both its pid and its creation time match: a pid alone may
have been reused by an unrelated process since the state file was written.
"""

import contextlib
import os
import signal
import time
from dataclasses import dataclass

import psutil

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
    kill_deadline: float | None = None

    def alive(self) -> bool:
        return same_process_alive(self.pid, self.created)

    def kill(self, grace_s: float) -> None:
        """SIGTERM the group now, SIGKILL it after `grace_s` (see `ended`)."""
        self.kill_deadline = time.monotonic() + grace_s
        self._signal(signal.SIGTERM)

    def ended(self) -> bool:
        """Has it exited? Escalates a kill whose grace has run out."""
        if not self.alive():
            self._signal(signal.SIGKILL)  # whatever of its group lingers
            return True
        if self.kill_deadline is not None and time.monotonic() >= self.kill_deadline:
            self._signal(signal.SIGKILL)
            self.kill_deadline = None
        return False

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)
