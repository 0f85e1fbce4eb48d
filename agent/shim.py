"""The parent of each task process: it starts the task, waits for it and records how it ended in a
file, so that an agent that did not start the task (the agent restarted meanwhile) still learns its
exit code. The agent cannot wait() for a process that is not its child; this shim outlives the
agent that started it, as Nomad's executor and containerd's shim do.

    python -I -S shim.py STATUS READY_FD ARGV...

The executor runs it as the leader of the task's process group (outside the task's cgroup), with
the task's env, cwd and log files. It runs as a file, without the gosched package (only the
standard library, and `-I -S`: the task's PYTHON* variables do not reach it), and:

- starts ARGV and tells the agent through READY_FD why it could not (an OSError's message, as
  subprocess would raise it), or closes READY_FD with nothing written once it runs;
- survives the SIGTERM of a kill (the whole group gets it: the task has its grace period);
- is a child subreaper (Linux): a process the task orphans (a daemon that forked and setsid()
  away from the group) reparents to the shim rather than to init, so it stays in the shim's tree,
  where the agent finds it on a kill (agent/proctrack.py), and the shim reaps it;
- once the task's process has ended, SIGKILLs what it left running (its orphans, now the shim's
  children, and what descends from them), as Slurm does at a job's end;
- writes the task's exit code to STATUS.tmp, then renames it to STATUS (so a reader sees all of it
  or nothing): a negative code is the signal that killed the task, as subprocess reports it; a
  second line `swept` says that nothing the task started runs any more;
- exits as the task did (the same code, or killed by the same signal), so that the agent that
  waits for the shim sees what it would have seen of the task itself.
"""

import contextlib
import os
import resource
import signal
import sys
import time

# Signals a kill of the process group (or an operator) sends: the task decides what they do, the
# shim stays to record the outcome. A handler, not SIG_IGN: an ignored signal would be inherited.
SURVIVED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Python ignores the first two at start-up: the task gets the default action of these, as
# subprocess gives it (a handler is reset by exec anyway).
RESTORED = (signal.SIGPIPE, signal.SIGXFSZ, *SURVIVED)
PR_SET_CHILD_SUBREAPER = 36  # prctl(2)
SWEPT = "swept"  # the status file's second line, when the shim left nothing of the task running
LEFTOVERS_S = 5.0  # how long the shim goes on killing what the task left (a process may hang in D state)


def read_status(path: str | os.PathLike[str]) -> int | None:
    """The exit code a shim recorded (negative: killed by that signal), None if there is none."""
    try:
        with open(path) as f:
            return int(f.read().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def read_swept(path: str | os.PathLike[str]) -> bool:
    """Did the shim that recorded this status kill all the task left, as its subreaper? Then
    nothing of the task remains anywhere (see kill_leftovers)."""
    try:
        with open(path) as f:
            return f.read().split("\n")[1:2] == [SWEPT]
    except OSError:
        return False


def original_environ() -> dict[bytes, bytes]:
    """The env the shim was started with: Python itself may have set LC_CTYPE since (PEP 538's
    locale coercion, which -I cannot turn off), and the task must get its env unchanged."""
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:  # not Linux: the coerced LC_CTYPE, if any, stays
        return dict(os.environb)
    env: dict[bytes, bytes] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key] = value
    return env


def record(path: str, code: int, swept: bool = False) -> None:
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(f"{code}\n{SWEPT}\n" if swept else f"{code}\n")
        os.replace(tmp, path)
    except OSError:  # the agent then reports the exit code as unknown, as without a shim
        pass


def exit_like(code: int) -> None:
    """Exit as the task did: with its code, or killed by its signal."""
    if code >= 0:
        os._exit(code)
    sig = -code
    with contextlib.suppress(OSError, ValueError):  # SIGKILL's action cannot be set (nor needs to)
        signal.signal(sig, signal.SIG_DFL)
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the task's core dump, not the shim's
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal whose default action does not kill: not one a task dies of


def become_subreaper() -> bool:
    """Orphans of the task reparent to this process (Linux 3.4), not to init; False where not."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes  # here: only Linux needs it

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (ImportError, OSError, AttributeError):
        return False


def wait_for(pid: int) -> int:
    """Wait for the task's process, reaping the orphans that end meanwhile; its wait status."""
    while True:
        done, wait_status = os.waitpid(-1, 0)  # retried after a signal handler ran (PEP 475)
        if done == pid:
            return wait_status


def children() -> list[int]:
    """This process's children (the task's orphans, once it has ended)."""
    me = os.getpid()
    pids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{me}/task"):
            with open(f"/proc/{me}/task/{tid}/children") as f:
                pids.extend(int(word) for word in f.read().split())
        return pids
    except FileNotFoundError:  # no /proc, or a kernel without CONFIG_PROC_CHILDREN
        pass
    except (OSError, ValueError):
        return []
    pids.clear()
    with contextlib.suppress(OSError):
        for name in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{name}/stat") as f:
                if int(f.read().rpartition(")")[2].split()[1]) == me:  # its parent (ppid)
                    pids.append(int(name))
    return pids


def kill_leftovers(timeout_s: float = LEFTOVERS_S) -> bool:
    """SIGKILL what the task left running: the shim's children, until it has none (True; False if
    some outlived `timeout_s`). A child's children become the shim's when it dies, so each round
    reaches one level further down. A child's pid cannot name another process until the shim
    reaps it: no pid reuse to fear."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return True  # no child left, and so nothing descended from one
        if time.monotonic() >= deadline:
            return False  # they go to init; the agent looks for what carries the task's mark
        for pid in children():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)


def main(args: list[str]) -> None:
    status, ready, argv = args[0], int(args[1]), args[2:]
    os.set_inheritable(ready, False)  # the task must not hold it open: the agent waits for EOF
    for sig in SURVIVED:
        signal.signal(sig, lambda _sig, _frame: None)
    subreaper = become_subreaper()
    try:
        pid = os.posix_spawnp(argv[0], argv, original_environ(), setsigdef=RESTORED)
    except (OSError, ValueError) as exc:
        os.write(ready, (str(exc) or type(exc).__name__).encode())
        os._exit(127)
    os.close(ready)
    code = os.waitstatus_to_exitcode(wait_for(pid))
    # Without a subreaper, the task's orphans went to init: the agent must look for them.
    swept = kill_leftovers() and subreaper
    record(status, code, swept)
    exit_like(code)


if __name__ == "__main__":
    main(sys.argv[1:])
