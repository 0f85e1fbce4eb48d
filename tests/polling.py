"""Waiting in tests for something another process or thread makes true (no tests here)."""

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
