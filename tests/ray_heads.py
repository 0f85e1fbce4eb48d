"""A Ray head of the test's own (`ray start --head --block` on free ports, in a temp dir), to join
at an address and to kill or restart: only its own processes, never `ray stop` (other Ray instances
on the machine are not the test's)."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

RAY = Path(sys.executable).parent / "ray"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class Head:
    """One head on fixed ports; start() again after kill() brings a new cluster up at the address."""

    def __init__(self, log: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.log = log
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", **(env or {})}
        self.temp = tempfile.mkdtemp(prefix="gs-ray-", dir="/tmp")  # short: Ray's socket paths
        self.others = [str(free_port()) for _ in range(3)]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 90.0) -> None:
        client, agent, dashboard = self.others
        cmd = [
            str(RAY), "start", "--head", "--block", "--port", str(self.port), "--temp-dir", self.temp,
            "--num-cpus", "2", "--include-dashboard", "false", "--disable-usage-stats",
            "--ray-client-server-port", client, "--dashboard-agent-listen-port", agent,
            "--dashboard-port", dashboard,
        ]  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while b"Ray runtime started" not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the test's Ray head did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL to the head's own process group: its GCS, raylet and workers at once."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.proc = None
        self.log.write_bytes(self.log.read_bytes().replace(b"Ray runtime started", b"(was started)"))

    def close(self) -> None:
        """Kill it, and remove its temp dir."""
        self.kill()
        shutil.rmtree(self.temp, ignore_errors=True)


@contextlib.contextmanager
def own_head(tmp_path: Path, env: dict[str, str] | None = None) -> Iterator[Head]:
    head = Head(tmp_path / "head.log", env)
    head.start()
    try:
        yield head
    finally:
        head.close()
