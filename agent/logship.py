"""Reading a task's new output from its log files, in chunks the stream can carry.

Each stream remembers the offset shipped so far; a chunk's offset is where its bytes start in that
file, so the master can write chunks at their place and a chunk sent twice does no harm.
"""

from dataclasses import dataclass
from pathlib import Path

from gosched.proto.v1 import types_pb2

CHUNK_BYTES = 64 * 1024  # the most one LogChunk carries


@dataclass(slots=True)
class LogStream:
    name: str  # stdout | stderr
    path: Path
    offset: int = 0

    def read(self, limit: int) -> bytes:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                return f.read(limit)
        except (OSError, ValueError):  # missing, or unopenable (a NUL in the task id): nothing to ship
            return b""

    def at_end(self) -> bool:
        try:
            return self.offset >= self.path.stat().st_size
        except (OSError, ValueError):  # so that the task's final status still goes out
            return True


@dataclass(slots=True)
class TaskLogs:
    task_id: str
    stdout: LogStream
    stderr: LogStream

    @classmethod
    def of(cls, task_id: str, stdout: Path, stderr: Path, offsets: tuple[int, int] = (0, 0)) -> "TaskLogs":
        return cls(task_id, LogStream("stdout", stdout, offsets[0]), LogStream("stderr", stderr, offsets[1]))

    @property
    def streams(self) -> tuple[LogStream, LogStream]:
        return self.stdout, self.stderr

    def chunks(self, max_chunks: int) -> list[types_pb2.LogChunk]:
        """Up to `max_chunks` new chunks per stream; the offsets move past what is returned."""
        out = []
        for stream in self.streams:
            for _ in range(max_chunks):
                data = stream.read(CHUNK_BYTES)
                if not data:
                    break
                chunk = types_pb2.LogChunk(
                    task_id=self.task_id, stream=stream.name, offset=stream.offset, data=data
                )
                out.append(chunk)
                stream.offset += len(data)
        return out

    def at_end(self) -> bool:
        return all(s.at_end() for s in self.streams)
