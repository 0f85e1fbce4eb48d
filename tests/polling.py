"""Waiting in tests: for something another process or thread makes true, and for a process a
test started to stop (no tests here)."""

import signal
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T], timeout: float = 15.0) -> T:
    """Poll `probe` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def stop_process(proc: subprocess.Popen[str], grace_s: float) -> None:
    """Stop `proc` the proper way if it still runs (SIGTERM: an agent kills its tasks and goes),
    killing it after `grace_s`; then reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait(10)
