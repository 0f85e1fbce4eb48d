"""Tasks with an image run in a container through docker or podman: the first of them on PATH whose
`info` probe succeeds.

The task's process is the runtime's `run` client, attached (no -d): its exit code is the
container's, its output is the container's, and a SIGTERM to it is passed on to the container.
A SIGKILL is not, so a container is also removed by name once its client is gone.
"""

import contextlib
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

RUNTIMES = ("docker", "podman")
NO_RUNTIME = "no container runtime (docker or podman) on this node"
PROBE_TIMEOUT_S = 10.0
RUNTIME_PROBE_S = 60.0  # how often a running agent probes its runtime again (a daemon may come or go)


def probe_runtime(path: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the runtime at `path` cannot run containers now, or None if it can. `info` needs what
    `run` needs: docker's daemon (a docker client alone is common: the daemon not running, or its
    socket not ours), podman's storage."""
    name = Path(path).name
    # stderr goes to a file, not a pipe: a helper the runtime leaves running (podman's pause
    # process) would hold a pipe open and make a working runtime look hung.
    with tempfile.TemporaryFile("w+") as err:
        try:
            code = subprocess.run(
                [path, "info"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                timeout=timeout_s,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            return f"`{name} info` did not answer in {timeout_s:g}s"
        except OSError as exc:
            return f"{name}: {exc}"
        if code == 0:
            return None
        err.seek(0)
        lines = [line.strip() for line in err.read().splitlines() if line.strip()]
    return f"{name}: {lines[-1] if lines else f'`info` exited with {code}'}"


def find_runtime() -> tuple[str | None, str]:
    """(the path of the first container runtime on PATH that works, or None; and if None, why:
    each one found and what its probe said, or that none is installed)."""
    problems: list[str] = []
    for name in RUNTIMES:
        path = shutil.which(name)
        if not path:
            continue
        why = probe_runtime(path)
        if why is None:
            return path, ""
        problems.append(why)
    return None, "; ".join(problems) or "neither is installed"


def runtime_kind(path: str) -> str:
    """docker or podman, by the program's name (a wrapper named otherwise counts as docker)."""
    return "podman" if "podman" in Path(path).name else "docker"


def container_name(task_id: str) -> str:
    """A container name for the task ([a-zA-Z0-9][a-zA-Z0-9_.-]*, as docker wants)."""
    safe = "".join(c if c.isalnum() or c in "_.-" else "-" for c in task_id)
    return f"gosched-{safe}"


@dataclass(frozen=True, slots=True)
class Container:
    runtime: str  # path of the docker or podman program
    name: str

    @property
    def is_podman(self) -> bool:
        return runtime_kind(self.runtime) == "podman"

    def run_argv(
        self,
        image: str,
        command: Sequence[str],
        env: Mapping[str, str],
        gpus: Sequence[int],
        cpu_milli: int = 0,
        memory: int = 0,
    ) -> list[str]:
        argv = [self.runtime, "run", "--rm", "--name", self.name]
        if self.is_podman:
            argv.append("--replace")  # a container of the same name left by a crash is replaced
        visible = ",".join(str(g) for g in gpus)
        if gpus and self.is_podman:
            # The NVIDIA hook exposes these; inside, they are numbered from 0 again.
            argv += ["-e", f"NVIDIA_VISIBLE_DEVICES={visible}"]
        elif gpus:
            argv += ["--gpus", f'"device={visible}"']  # quoted: docker reads this value as CSV
        for key, value in env.items():
            argv += ["-e", f"{key}={value}"]
        if gpus:
            # Inside, the GPUs are numbered from 0 in PCI bus order, as the host's NVML indexes are;
            # CUDA numbers them fastest first unless told. Last, so that it wins over the task's env
            # (as in a shell task: agent/executor.py's task_env).
            argv += ["-e", "CUDA_DEVICE_ORDER=PCI_BUS_ID"]
        if cpu_milli > 0:
            argv += ["--cpus", f"{cpu_milli / 1000:g}"]
        if memory > 0:
            argv += ["--memory", str(memory)]
        argv.append(image)
        if len(command) == 1:
            argv += ["sh", "-c", command[0]]
        else:
            argv += list(command)  # empty: the image's own entrypoint
        return argv

    def shell_command(self, run_argv: Sequence[str]) -> str:
        """One shell line: remove a leftover container of this name (docker cannot replace), then
        exec the run client, so that the task's process is the client itself."""
        rm = shlex.join([self.runtime, "rm", "-f", self.name])
        return f"{rm} >/dev/null 2>&1; exec {shlex.join(run_argv)}"

    def remove_soon(self) -> None:
        """Remove the container in the background (the client may have been SIGKILLed)."""

        def remove() -> None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(
                    [self.runtime, "rm", "-f", self.name],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=60,
                    check=False,
                )

        threading.Thread(target=remove, name=f"rm-{self.name}", daemon=True).start()
