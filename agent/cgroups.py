"""Per-task cgroup v2 limits (CPU and memory) where the unified hierarchy is writable."""

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
MIN_QUOTA_US = 1_000  # the kernel refuses a smaller cpu.max quota (EINVAL); kubelet raises it so too


@dataclass(slots=True)
class CgroupSupport:
    available: bool
    reason: str  # why not, when not
    parent: Path | None = None


def detect(root: Path = ROOT, name: str = "gosched") -> CgroupSupport:
    """Is cgroup v2 with the cpu and memory controllers writable here? Makes `<root>/<name>`."""
    controllers = root / "cgroup.controllers"
    if not controllers.exists():
        return CgroupSupport(False, f"{root} is not a cgroup v2 hierarchy")
    have = set(controllers.read_text().split())
    if not {"cpu", "memory"} <= have:
        return CgroupSupport(
            False, f"cgroup v2 lacks the cpu/memory controllers (has: {' '.join(sorted(have))})"
        )
    parent = root / name
    try:
        parent.mkdir(exist_ok=True)
        # Children of `parent` get the controllers only if `parent` delegates them.
        (parent / "cgroup.subtree_control").write_text("+cpu +memory")
    except OSError as exc:
        return CgroupSupport(False, f"cgroup v2 is not writable: {exc}")
    return CgroupSupport(True, "", parent)


def cpu_max(cpu_milli: int) -> str:
    """cpu.max for `cpu_milli`: the quota per period, never under what the kernel accepts."""
    return f"{max(MIN_QUOTA_US, cpu_milli * PERIOD_US // 1000)} {PERIOD_US}"


@dataclass(slots=True)
class TaskCgroup:
    path: Path

    @classmethod
    def create(cls, support: CgroupSupport, task_id: str, cpu_milli: int, memory: int) -> "TaskCgroup":
        assert support.parent is not None
        path = support.parent / task_id.replace("/", "_")
        path.mkdir(exist_ok=True)
        try:
            if cpu_milli > 0:
                (path / "cpu.max").write_text(cpu_max(cpu_milli))
            if memory > 0:
                (path / "memory.max").write_text(str(memory))
                swap = path / "memory.swap.max"
                if swap.exists():
                    swap.write_text("0")  # over the limit means killed, not swapped
        except OSError:
            cls(path).remove()  # the task does not start: its cgroup would be left behind
            raise
        return cls(path)

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def pids(self) -> list[int]:
        """The processes in the cgroup now: all of the task's, wherever they moved in its tree."""
        try:
            return [int(line) for line in self.procs.read_text().split()]
        except (OSError, ValueError):
            return []

    def kill(self) -> None:
        """SIGKILL every process in the cgroup: at once through cgroup.kill (Linux 5.14), which
        races no fork; else pid by pid, until none is left (or a few rounds have passed)."""
        kill = self.path / "cgroup.kill"
        if kill.exists():
            with contextlib.suppress(OSError):
                kill.write_text("1")
                return
        for _ in range(20):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def oom_killed(self) -> bool:
        events = self.path / "memory.events"
        if not events.exists():
            return False
        for line in events.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and int(value) > 0:
                return True
        return False

    def remove(self) -> None:
        with contextlib.suppress(OSError):  # still has processes, or already gone
            os.rmdir(self.path)
