"""The progress display of `gosched submit --wait`: the job's state and its tasks per state,
rewritten in place on a terminal, one line per change otherwise (logs, CI, pipes)."""

import time
from typing import TextIO

from gosched.api.convert import JobInfo
from gosched.cli.output import counts_text

_CLEAR_LINE = "\r\x1b[K"


class Progress:
    def __init__(self, stream: TextIO, *, tty: bool | None = None) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.started = time.monotonic()
        self._last = ""

    def show(self, info: JobInfo) -> None:
        line = f"{info.id} {info.state.value}: {counts_text(info)}"
        if line == self._last:  # the watch also reports changes this display does not show
            return
        self._last = line
        stamped = f"[{time.monotonic() - self.started:6.1f}s] {line}"
        self.stream.write(f"{_CLEAR_LINE}{stamped}" if self.tty else f"{stamped}\n")
        self.stream.flush()

    def close(self) -> None:
        """End the in-place line so what follows starts on its own."""
        if self.tty and self._last:
            self.stream.write("\n")
            self.stream.flush()
