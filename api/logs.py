"""Task output as the master keeps it: node agents ship each task's stdout/stderr in chunks, the
master writes them at their offsets under one folder, and `StreamLogs` serves them from there.

Writing at the chunk's offset (not appending) makes a chunk that is sent twice (an agent that
reconnects and resends) harmless. Readers that follow a task wait on one condition that every
write notifies. A task run again (a retry, a reschedule) starts its output afresh; the run before
is kept beside it, as `kubectl logs --previous` shows the container's last run, and only that one.

A service whose agent restarted its process within one run keeps appending to the same file (the
agent's offsets go on): each restart marks where the new process's output starts
(`mark_restart`), kept in a small file beside the logs. The current run is then read from the
latest mark, and the previous from the mark before it, as `kubectl logs` separates a crash-looping
container's runs. Offsets given to `read` count from the start of the run read.

A reader that goes on (a follower, `RunReader`) holds the file it reads open: a reset that moves
it aside is seen as another file in its place, so the reader ends that run where it ends (not at
its offset in the new run's file) and a follower starts the new run from its beginning.
"""

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

STREAMS = ("stdout", "stderr")
PREVIOUS_SUFFIX = ".previous"  # the run before the current one (see LogStore.reset)
RESTARTS_SUFFIX = ".restarts"  # where a restarted process's output starts (see mark_restart)
READ_CHUNK = 64 * 1024

log = logging.getLogger(__name__)


class LogStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._written = threading.Condition()
        self.generation = 0  # bumped on every write

    def _changed(self) -> None:
        """Wake the readers that follow (wait): something was written, or a run moved."""
        with self._written:
            self.generation += 1
            self._written.notify_all()

    def _marks_path(self, task_id: str, previous: bool = False) -> Path:
        return self.root / f"{quote(task_id, safe='')}{RESTARTS_SUFFIX}{PREVIOUS_SUFFIX if previous else ''}"

    def _marks(self, task_id: str, previous: bool = False) -> dict[str, Any]:
        """The current run's restarts: {"n": the latest restart's count, stream: [where the
        previous process's output starts, where the current's does]}; {} for none. `previous`:
        {stream: [where the previous run's last process's output starts, 0]} (see reset)."""
        try:
            marks = json.loads(self._marks_path(task_id, previous).read_text())
        except (OSError, ValueError):  # none (no restart), or a torn write: read the run whole
            return {}
        return marks if isinstance(marks, dict) else {}

    def _write_marks(self, task_id: str, marks: dict[str, Any], previous: bool = False) -> None:
        path = self._marks_path(task_id, previous)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(marks))
        tmp.replace(path)

    def mark_restart(
        self,
        task_id: str,
        restarts: int,
        starts: dict[str, int],
        previous_starts: dict[str, int] | None = None,
    ) -> None:
        """The task's process was restarted within its run (a service's, by its agent), for the
        `restarts`-th time: its new output starts at these offsets of the files (per stream;
        equal to the last mark where the process before wrote nothing there), and the process
        before it started at `previous_starts` (the agent says so with every status of the run
        after the restart, so a mark is recovered from a later status when the restart's own was
        lost: the last mark kept may then be an older restart's). A restart counted no later than
        the latest mark (a status sent again, or a later status of the same restart) changes
        nothing."""
        marks = self._marks(task_id)
        if restarts <= int(marks.get("n", 0)):
            return
        before = previous_starts or {}
        out: dict[str, Any] = {"n": restarts}
        for stream in STREAMS:
            last = int(marks.get(stream, [0, 0])[1])  # the latest mark kept: that restart or an older
            current = max(last, int(starts.get(stream, last)))
            # the offsets only grow: the process before started no earlier than an older mark
            out[stream] = [min(current, max(last, int(before.get(stream, 0)))), current]
        self._write_marks(task_id, out)
        self._changed()

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
        self._changed()

    def reset(self, task_id: str) -> None:
        """A new run of the task starts, whose chunks count from offset 0 again (as `kubectl logs`
        shows the current container's run): its output so far becomes the previous run's, both
        streams, in place of the one before (a run that wrote nothing leaves the previous as it
        was; one that wrote one stream leaves the other empty, not the run before's)."""
        current = [self.path(task_id, stream) for stream in STREAMS]
        marks = self._marks(task_id)
        if any(path.exists() for path in current):
            # Of a run its agent restarted, the previous is its last process's output: where it
            # starts is kept beside the file (no copy of a long log), written before the current
            # marks go, which go before the files move (a crash in between shows more, not less).
            starts = {stream: [marks[stream][1], 0] for stream in STREAMS if stream in marks}
            if starts:
                self._write_marks(task_id, starts, previous=True)
            else:
                self._marks_path(task_id, previous=True).unlink(missing_ok=True)
            self._marks_path(task_id).unlink(missing_ok=True)
            for stream, path in zip(STREAMS, current, strict=True):
                previous = self.path(task_id, stream, previous=True)
                if path.exists():
                    path.replace(previous)
                else:
                    previous.unlink(missing_ok=True)
        else:
            self._marks_path(task_id).unlink(missing_ok=True)
        self._changed()

    def files_of(self, task_id: str) -> list[Path]:
        """Every file the task's logs may be kept in: each stream's current and previous run, the
        restart marks of both (and a marks file a crash left half written)."""
        marks = [self._marks_path(task_id, previous) for previous in (False, True)]
        return [
            *(self.path(task_id, stream, previous) for stream in STREAMS for previous in (False, True)),
            *marks,
            *(m.with_name(m.name + ".tmp") for m in marks),
        ]

    def remove_job(self, job_id: str, tasks: int) -> int:
        """Delete the log files of the job's tasks 0..`tasks`-1 (the job was purged from the
        store: its ids are never taken again, so no other job's are among them). Returns how many
        went; a file that cannot be removed is logged and left (the others still go)."""
        removed = 0
        failed: OSError | None = None
        for index in range(tasks):
            for path in self.files_of(f"{job_id}/{index}"):
                try:
                    path.unlink()
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    failed = exc
                    continue
                removed += 1
        if failed is not None:
            log.warning("some log files of purged job %s were not removed: %s", job_id, failed)
        return removed

    def size(self, task_id: str, stream: str, previous: bool = False) -> int:
        """How many bytes of the stream's file are held (0: none yet), restarts' output and all:
        the offsets an agent ships at."""
        try:
            return self.path(task_id, stream, previous).stat().st_size
        except FileNotFoundError:
            return 0

    def run_start(self, task_id: str, stream: str) -> int:
        """Where the current process's output starts in the stream's file (0 but after a restart)."""
        marks = self._marks(task_id).get(stream)
        return int(marks[1]) if marks else 0

    def read(
        self,
        task_id: str,
        stream: str,
        offset: int,
        limit: int = READ_CHUNK,
        previous: bool = False,
    ) -> bytes:
        """Up to `limit` bytes of the current run's output (or the previous run's), from `offset`
        in it. A task restarted within its run: its current process's output, and as the
        previous, the process's before; otherwise the current file and the one reset kept (a
        follower's reads go through a RunReader)."""
        start, end = 0, None
        marks = self._marks(task_id).get(stream)
        if marks:
            start, end = (marks[0], marks[1]) if previous else (marks[1], None)
            previous = False  # both are parts of the current file
        elif previous:  # the previous run's last process, if its agent restarted it
            start = self._marks(task_id, previous=True).get(stream, [0, 0])[0]
        path = self.path(task_id, stream, previous)
        if not path.exists():
            return b""
        at = start + offset
        if end is not None:
            limit = min(limit, end - at)
            if limit <= 0:
                return b""
        with open(path, "rb") as f:
            if at >= os.fstat(f.fileno()).st_size:
                return b""  # nothing past the end yet; seeking far past it fails (EINVAL)
            f.seek(at)
            return f.read(limit)

    def reader(self, task_id: str, stream: str, offset: int = 0, *, follow: bool = False) -> "RunReader":
        """A reader of the stream's current run from `offset` (StreamLogs'): see RunReader."""
        return RunReader(self, task_id, stream, offset, follow=follow)

    def wait(self, seen_generation: int, timeout: float) -> int:
        """Block until something is written after `seen_generation` (or the timeout); returns the
        generation now."""
        with self._written:
            self._written.wait_for(lambda: self.generation != seen_generation, timeout)
            return self.generation


class RunReader:
    """One stream of a task read on from `offset` in its current run (from its current process's
    output on, a service restarted within its run), through the file itself: a reader goes on
    into the next processes' output as the file grows, and however its reads interleave with a
    new run's reset (which moves the file aside), it reads the run it started in to its end, not
    the new run's file at the old run's offset. `follow`: then on into the new run, from its
    start (the offsets it returns count from there); else it ends with its run.

    The agent gateway writes and resets a task's log under one lock, so a file moved aside is
    whole once the move is seen. Holds the file open (close() it); not thread-safe."""

    def __init__(
        self, logs: LogStore, task_id: str, stream: str, offset: int, *, follow: bool = False
    ) -> None:
        self.logs, self.task_id, self.stream, self.follow = logs, task_id, stream, follow
        self.path = logs.path(task_id, stream)
        self.offset = offset  # in the run read
        self.runs = 0  # new runs moved on to (follow)
        self._file: BinaryIO | None = None
        self._base = 0  # where the run read starts in its file
        self._marked = True  # the next file opened is the run's the reader started in: from its mark
        self._over = False  # the run read moved aside and read to its end (not follow)

    def __enter__(self) -> "RunReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _open(self) -> bool:
        try:
            self._file = open(self.path, "rb")  # noqa: SIM115 (held across reads, closed by close)
        except FileNotFoundError:
            return False  # no output of the run yet
        if self._marked:
            self._base = self.logs.run_start(self.task_id, self.stream)
            self._marked = False
        return True

    def _pread(self, limit: int) -> bytes:
        assert self._file is not None
        return os.pread(self._file.fileno(), limit, self._base + self.offset)

    def _moved(self) -> bool:
        """Whether a reset moved the file read aside (a new run's file, or none yet, in its place)."""
        assert self._file is not None
        held = os.fstat(self._file.fileno())
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return True
        return (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)

    def read(self, limit: int = READ_CHUNK) -> tuple[int, bytes]:
        """(the offset in the run, up to `limit` bytes from there): b"" when nothing more has been
        written yet, or when the run read is over (not following)."""
        while not self._over:
            if self._file is None and not self._open():
                break
            at = self.offset
            data = self._pread(limit)
            if not data and self._moved():
                data = self._pread(limit)  # what was written before the move: the run's last bytes
                if not data:  # the run read is whole
                    self.close()
                    if not self.follow:
                        self._over = True
                        break
                    self._base, self.offset, self.runs = 0, 0, self.runs + 1
                    continue
            self.offset += len(data)
            return at, data
        return self.offset, b""

    def at_end(self) -> bool:
        """Nothing is left to read now: no byte of the run read, nor (following) a new run that
        took its place."""
        if self._over:
            return True
        if self._file is None and not self._open():
            return True
        return not self._pread(1) and not (self.follow and self._moved())
