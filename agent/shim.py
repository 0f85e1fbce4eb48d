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
- writes the task's exit code to STATUS.tmp, then renames it to STATUS (so a reader sees all of it
  or nothing): a negative code is the signal that killed the task, as subprocess reports it;
- exits as the task did (the same code, or killed by the same signal), so that the agent that
  waits for the shim sees what it would have seen of the task itself.
"""

import contextlib
import os
import resource
import signal
import sys

# Signals a kill of the process group (or an operator) sends: the task decides what they do, the
# shim stays to record the outcome. A handler, not SIG_IGN: an ignored signal would be inherited.
SURVIVED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Python ignores the first two at start-up: the task gets the default action of these, as
# subprocess gives it (a handler is reset by exec anyway).
RESTORED = (signal.SIGPIPE, signal.SIGXFSZ, *SURVIVED)


def read_status(path: str | os.PathLike[str]) -> int | None:
    """The exit code a shim recorded (negative: killed by that signal), None if there is none."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


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


def record(path: str, code: int) -> None:
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(f"{code}\n")
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


def main(args: list[str]) -> None:
    status, ready, argv = args[0], int(args[1]), args[2:]
    os.set_inheritable(ready, False)  # the task must not hold it open: the agent waits for EOF
    for sig in SURVIVED:
        signal.signal(sig, lambda _sig, _frame: None)
    try:
        pid = os.posix_spawnp(argv[0], argv, original_environ(), setsigdef=RESTORED)
    except (OSError, ValueError) as exc:
        os.write(ready, (str(exc) or type(exc).__name__).encode())
        os._exit(127)
    os.close(ready)
    _, wait_status = os.waitpid(pid, 0)  # retried after a signal handler ran (PEP 475)
    code = os.waitstatus_to_exitcode(wait_status)
    record(status, code)
    exit_like(code)


if __name__ == "__main__":
    main(sys.argv[1:])
