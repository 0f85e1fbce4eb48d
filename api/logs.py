"""Task output as the master keeps it: node agents ship each task's stdout/stderr in chunks, the
master writes them at their offsets under one folder, and `StreamLogs` serves them from there.

Writing at the chunk's offset (not appending) makes a chunk that is sent twice (an agent that
reconnects and resends) harmless. Readers that follow a task wait on one condition that every
write notifies. A task run again (a retry, a reschedule) starts its output afresh; the run before
is kept beside it, as `kubectl logs --previous` shows the container's last run, and only that one.
"""

import os
import threading
from pathlib import Path
from urllib.parse import quote

STREAMS = ("stdout", "stderr")
PREVIOUS_SUFFIX = ".previous"  # the run before the current one (see LogStore.reset)
READ_CHUNK = 64 * 1024


class LogStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._written = threading.Condition()
        self.generation = 0  # bumped on every write

    def path(self, task_id: str, stream: str, previous: bool = False) -> Path:
        if stream not in STREAMS:
            raise ValueError(f"stream must be one of {', '.join(STREAMS)}, got {stream!r}")
        return self.root / f"{quote(task_id, safe='')}.{stream}{PREVIOUS_SUFFIX if previous else ''}"

    def write(self, task_id: str, stream: str, offset: int, data: bytes) -> None:
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        path = self.path(task_id, stream)
        with open(path, "r+b" if path.exists() else "wb") as f:
            f.seek(offset)
            f.write(data)
        with self._written:
            self.generation += 1
            self._written.notify_all()

    def reset(self, task_id: str) -> None:
        """A new run of the task starts, whose chunks count from offset 0 again (as `kubectl logs`
        shows the current container's run): its output so far becomes the previous run's, both
        streams, in place of the one before (a run that wrote nothing leaves the previous as it
        was; one that wrote one stream leaves the other empty, not the run before's)."""
        current = [self.path(task_id, stream) for stream in STREAMS]
        if any(path.exists() for path in current):
            for stream, path in zip(STREAMS, current, strict=True):
                previous = self.path(task_id, stream, previous=True)
                if path.exists():
                    path.replace(previous)
                else:
                    previous.unlink(missing_ok=True)
        with self._written:
            self.generation += 1
            self._written.notify_all()

    def size(self, task_id: str, stream: str, previous: bool = False) -> int:
        """How many bytes of the stream are held (0: none yet)."""
        try:
            return self.path(task_id, stream, previous).stat().st_size
        except FileNotFoundError:
            return 0

    def read(
        self, task_id: str, stream: str, offset: int, limit: int = READ_CHUNK, previous: bool = False
    ) -> bytes:
        path = self.path(task_id, stream, previous)
        if not path.exists():
            return b""
        with open(path, "rb") as f:
            if offset >= os.fstat(f.fileno()).st_size:
                return b""  # nothing past the end yet; seeking far past it fails (EINVAL)
            f.seek(offset)
            return f.read(limit)

    def wait(self, seen_generation: int, timeout: float) -> int:
        """Block until something is written after `seen_generation` (or the timeout); returns the
        generation now."""
        with self._written:
            self._written.wait_for(lambda: self.generation != seen_generation, timeout)
            return self.generation
