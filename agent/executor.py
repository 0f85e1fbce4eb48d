"""Runs bound tasks as local processes: a shell command with its GPUs, env, cwd and limits.

Each task runs under a shim (agent/shim.py), in a session (process group) of its own that the
shim leads, so that a kill reaches the whole tree; stdout and stderr go to files the API can
stream. The shim records the task's exit code in a file (`status_path`), so that an agent
restarted meanwhile, which cannot wait() for the task, still learns it; and it exits as the task
did, so that the agent that started it sees the task's own exit code or signal. A kill sends
SIGTERM to the group, then SIGKILL after the grace period. Where cgroup v2 is writable, each task
gets its own cgroup with its CPU and memory limits (the shim stays outside it), and an
out-of-memory kill is reported as such.

A process that leaves the group (setsid) is the task's all the same: a kill signals it too, and it
is killed when the task's process ends, as Slurm kills what a job leaves behind. The cgroup holds
all of the task's processes where there is one; elsewhere they are found by their ancestry and by
the run's mark in their environment (agent/proctrack.py), once per poll for all of its kills and
ends, never per heartbeat.
"""

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gosched.agent import proctrack, shim
from gosched.agent.cgroups import CgroupSupport, TaskCgroup
from gosched.agent.proctrack import NONCE_VAR, Tracked, new_nonce

SHIM = str(Path(shim.__file__))  # run as a file, by path: it needs nothing of the gosched package
SHIM_READY_S = 10.0  # how long a launch waits for the shim to say whether the task started


@dataclass(slots=True)
class TaskSpec:
    task_id: str
    command: list[str]  # argv; a single word is a shell script (/bin/sh -c) unless it names a program file
    env: dict[str, str] = field(default_factory=dict)
    gpus: list[int] = field(default_factory=list)  # GPU indexes assigned on this node
    cwd: str | None = None
    cpu_milli: int = 0
    memory: int = 0
    nonce: str = field(default_factory=new_nonce)  # marks this run's processes (NONCE_VAR); "": none


@dataclass(slots=True)
class TaskExit:
    task_id: str
    exit_code: int | None
    reason: str  # exited | killed | oom_killed | failed_to_start
    signal: int | None = None
    message: str = ""


@dataclass(slots=True)
class _Running:
    spec: TaskSpec
    proc: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    cgroup: TaskCgroup | None
    tracked: Tracked  # what finds its processes outside its group
    kill_requested: bool = False
    kill_deadline: float | None = None
    terminate: bool = False  # its processes outside the group are due the kill's SIGTERM


def task_env(spec: TaskSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a task sees: the agent's, the task's own, and exactly its GPUs."""
    env = dict(os.environ if base is None else base)
    env.update(spec.env)
    visible = ",".join(str(g) for g in spec.gpus)
    env["CUDA_VISIBLE_DEVICES"] = visible
    # The indexes are NVML's, which counts GPUs by PCI bus id; CUDA counts fastest first unless told.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["NVIDIA_VISIBLE_DEVICES"] = visible or "none"
    env["GOSCHED_TASK_ID"] = spec.task_id
    if spec.nonce:
        env[NONCE_VAR] = spec.nonce
    else:
        env.pop(NONCE_VAR, None)  # not an outer run's: it would never be this run's
    return env


class ShellExecutor:
    def __init__(self, log_dir: str | Path, cgroups: CgroupSupport | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.cgroups = cgroups if cgroups is not None and cgroups.available else None
        self.running: dict[str, _Running] = {}

    @property
    def limits_enforced(self) -> bool:
        return self.cgroups is not None

    def log_paths(self, task_id: str) -> tuple[Path, Path]:
        stem = task_id.replace("/", "_")
        return self.log_dir / f"{stem}.out", self.log_dir / f"{stem}.err"

    def status_path(self, task_id: str) -> Path:
        """Where the task's shim records its exit code (agent/shim.py)."""
        return self.log_dir / f"{task_id.replace('/', '_')}.exit"

    def start(self, spec: TaskSpec) -> TaskExit | None:
        """Start the task; a TaskExit right away if it cannot start."""
        if spec.task_id in self.running:
            return None  # already running: a repeated launch is not run twice
        if not spec.command:
            return TaskExit(spec.task_id, None, "failed_to_start", message="empty command")
        argv = list(spec.command)
        if len(argv) == 1 and not _is_program_file(argv[0]):
            argv = ["/bin/sh", "-c", argv[0]]  # `gosched submit -- 'make && ./run'`: a script
        out_path, err_path = self.log_paths(spec.task_id)
        status = self.status_path(spec.task_id)
        cgroup = None
        try:
            status.unlink(missing_ok=True)  # a previous run's: never read as this run's
            if self.cgroups is not None:
                cgroup = TaskCgroup.create(self.cgroups, spec.task_id, spec.cpu_milli, spec.memory)
                # The shell joins the cgroup before it execs the task, so no child escapes the limits.
                argv = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup.procs), *argv]
            proc, why = _start_shim(argv, spec, out_path, err_path, status)
        # Not only OSError: Popen raises ValueError for a NUL byte in argv or env, and whatever a
        # launch hits, the task must be reported failed rather than stay bound here forever.
        except Exception as exc:
            why, proc = str(exc) or type(exc).__name__, None
        if why is not None:
            if cgroup is not None:
                cgroup.remove()
            return TaskExit(spec.task_id, None, "failed_to_start", message=why)
        assert proc is not None
        # The shim is our child and not yet waited for: its pid names it, its start time is its own.
        tracked = Tracked(proc.pid, proctrack.start_ticks(proc.pid), spec.nonce, cgroup)
        self.running[spec.task_id] = _Running(spec, proc, out_path, err_path, cgroup, tracked)
        return None

    def pid(self, task_id: str) -> int | None:
        """The process id of a running task's shim: the task's process group id too (the shim
        leads the group, the task and its children are in it)."""
        run = self.running.get(task_id)
        return None if run is None else run.proc.pid

    def nonce(self, task_id: str) -> str:
        """The mark in a running task's environment (NONCE_VAR): what finds the processes that
        left its group, for an agent that adopts it."""
        run = self.running.get(task_id)
        return "" if run is None else run.spec.nonce

    def cgroup_path(self, task_id: str) -> Path | None:
        run = self.running.get(task_id)
        return None if run is None or run.cgroup is None else run.cgroup.path

    def kill(self, task_id: str, grace_s: float = 10.0) -> bool:
        """SIGTERM the task's process group now, and its processes that left the group at the
        next poll (one look for all the kills of a poll); SIGKILL all of it after `grace_s`."""
        run = self.running.get(task_id)
        if run is None:
            return False
        run.kill_requested = True
        run.kill_deadline = time.monotonic() + grace_s
        run.terminate = True
        proctrack.signal_group(run.proc.pid, signal.SIGTERM)
        return True

    def poll(self) -> list[TaskExit]:
        """Tasks that ended since the last poll; escalates kills whose grace has run out."""
        terminate: list[Tracked] = []
        kill: list[Tracked] = []
        ended: list[tuple[_Running, int]] = []
        now = time.monotonic()
        for task_id, run in list(self.running.items()):
            code = run.proc.poll()
            if code is None:
                if run.kill_deadline is not None and now >= run.kill_deadline:
                    kill.append(run.tracked)
                    run.kill_deadline = None
                elif run.terminate:
                    terminate.append(run.tracked)
                run.terminate = False
                continue
            # The leader is gone: nothing of the task may linger. Its shim killed all the task
            # left, unless it could not (it was killed, say): then the agent looks for it.
            if shim.read_swept(self.status_path(task_id)):
                proctrack.signal_group(run.proc.pid, signal.SIGKILL)
            else:
                kill.append(run.tracked)
            del self.running[task_id]
            ended.append((run, code))
        proctrack.terminate(terminate)
        proctrack.kill(kill)
        return [self._exit(run, code) for run, code in ended]

    def _exit(self, run: _Running, code: int) -> TaskExit:
        task_id = run.spec.task_id
        oom = run.cgroup is not None and run.cgroup.oom_killed()
        if run.cgroup is not None:
            run.cgroup.remove()
        # The shim exited as the task did: this agent knows the code, the file is not needed.
        self.status_path(task_id).unlink(missing_ok=True)
        sig = -code if code < 0 else None
        if oom:
            return TaskExit(task_id, code, "oom_killed", sig, "the task exceeded its memory limit")
        if run.kill_requested:
            return TaskExit(task_id, code, "killed", sig)
        return TaskExit(task_id, code, "exited", sig)

    def wait_all(self, timeout_s: float) -> list[TaskExit]:
        deadline = time.monotonic() + timeout_s
        ended: list[TaskExit] = []
        while self.running and time.monotonic() < deadline:
            ended.extend(self.poll())
            time.sleep(0.02)
        return ended


def _start_shim(
    argv: list[str], spec: TaskSpec, out_path: Path, err_path: Path, status: Path
) -> tuple[subprocess.Popen[bytes] | None, str | None]:
    """Start argv under a shim: (the shim's process, None), or (None, why argv could not start)."""
    ready, ready_w = os.pipe()
    try:
        try:
            with out_path.open("ab") as out, err_path.open("ab") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", SHIM, str(status), str(ready_w), *argv],
                    stdout=out,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                    cwd=spec.cwd or None,
                    env=task_env(spec),
                    start_new_session=True,
                    pass_fds=(ready_w,),
                )
        finally:
            os.close(ready_w)  # the shim has its own: EOF comes when it closes that one
        why = _read_until_eof(ready, SHIM_READY_S)
    finally:
        os.close(ready)
    if why:  # the shim exits at once; nothing else of its group runs
        proc.wait()
        return None, why
    return proc, None


def _read_until_eof(fd: int, timeout_s: float) -> str:
    """What the shim wrote before it closed the pipe: nothing once the task runs. After
    `timeout_s` (a shim that hangs), the task counts as started: poll() sees how it ends."""
    data = b""
    deadline = time.monotonic() + timeout_s
    poller = select.poll()  # not select(): an agent may hold more than 1024 descriptors
    poller.register(fd, select.POLLIN)
    while (left := deadline - time.monotonic()) > 0 and poller.poll(left * 1000):
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def _is_program_file(word: str) -> bool:
    """A path to an executable file: run as it is (a shell would split "/opt/my tools/run")."""
    return "/" in word and os.path.isfile(word) and os.access(word, os.X_OK)
