"""The binder's store writer, as a process of its own:
`python -m gosched.binder.writer_child STORE ACK_FD` (binder/writer.py starts it).

It takes the binder's batches from stdin and writes them to the store, in order, so that SQLite's
work runs on another core than the binder's checks (binder/writer.py is the binder's side).

    stdin:  msgpack stream of frames [seq, version, now, bound, states] or [..., states, nodes]
            bound: [[task id, node, [[gpu, milli], ...]], ...]; states: [[task id, state], ...];
            with nodes (StoreWriter.write_plain): bound is the task ids, nodes their nodes, and
            no binding holds GPUs; version None: a barrier (nothing to write, acknowledged in its turn)
    ACK_FD: msgpack stream of acks [seq, error or None, CPU seconds since ready]; the first, seq 0,
            once it holds the lock below

The frames that queued while it wrote go into one transaction (group commit), acknowledged by the
last one's seq. After an error it writes nothing more: the binder's memory is no longer the store's,
and only a new binder, recovered from the store, may write. At end of input (the binder is gone,
whatever the reason) it still writes every frame it was sent, then exits (unless it is killed with
the binder's process, as Ray may do: then what it had not written was never reported either). It
holds an exclusive lock on STORE.writer.lock while it runs, so that a restarted binder recovers
only after it is done.
"""

import fcntl
import os
import select
import sys
import time
from collections import deque
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import msgpack

from gosched.common.store import Store, StoredBatch

# Upper bounds of one group commit: the binder sees its batches acknowledged at least this often.
GROUP_FRAMES = 64
GROUP_ROWS = 50_000
READ_BYTES = 1 << 20


def lock_path(store_path: str) -> str:
    return store_path + ".writer.lock"


class _Frames:
    """Frames from a file descriptor, as they arrive."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.unpacker = msgpack.Unpacker(raw=False, use_list=False)
        self.eof = False
        self.ready: deque[Any] = deque()

    def fill(self, *, block: bool) -> None:
        """Read what there is, up to a group (waiting for something if `block` and nothing is
        ready yet): under a steady stream the acks still come a group at a time."""
        while not self.eof and len(self.ready) < GROUP_FRAMES:
            if not (block and not self.ready) and not select.select([self.fd], [], [], 0)[0]:
                return
            data = os.read(self.fd, READ_BYTES)
            if not data:
                self.eof = True
                return
            self.unpacker.feed(data)
            self.ready.extend(self.unpacker)

    def take(self) -> list[Any]:
        """A group of ready frames, in order, within the group bounds."""
        group: list[Any] = []
        rows = 0
        while self.ready and len(group) < GROUP_FRAMES and rows < GROUP_ROWS:
            frame = self.ready.popleft()
            group.append(frame)
            rows += len(frame[3]) + len(frame[4])
        return group


def run(store_path: str, fd_in: int, fd_out: int) -> int:
    lock = open(lock_path(store_path), "a+")  # noqa: SIM115 - held for the process's life
    fcntl.flock(lock, fcntl.LOCK_EX)
    store = Store(store_path)
    acks_open = _write_all(fd_out, msgpack.packb([0, None, 0.0]))  # ready: the lock is held
    frames = _Frames(fd_in)
    # CPU from here on, the frames' reading and decoding and the acks included: a wait for input
    # costs none, so the process's CPU time is the writer's work (timing the commits alone left
    # out about a tenth of it).
    cpu_start = time.process_time()
    failed = False
    while True:
        frames.fill(block=True)
        group = frames.take()
        if not group:
            break  # end of input, everything written
        error: str | None = None
        if not failed:
            batches = [_stored(frame) for frame in group if frame[1] is not None]  # None: a barrier
            try:
                if batches:
                    store.commit_many(batches)
            except Exception as exc:  # told to the binder, which stops trusting its memory
                error = f"{type(exc).__name__}: {exc}"
                failed = True
        else:
            error = "an earlier write failed"
        ack = [group[-1][0], error, time.process_time() - cpu_start]
        acks_open = acks_open and _write_all(fd_out, msgpack.packb(ack))
    store.close()
    return 0


def _stored(frame: Sequence[Any]) -> StoredBatch:
    """A frame as commit_many takes it; one of write_plain's has its bindings as columns."""
    _, version, now, bound, states, *plain = frame
    if plain:  # the task ids, then their nodes after the states: no GPUs
        bound = list(zip(bound, plain[0], repeat(())))
    return version, bound, states, now


def _write_all(fd: int, data: bytes) -> bool:
    """False once nobody reads the acks (the binder is gone): the writing goes on without them."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        return False
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[2].isdigit():
        print("usage: python -m gosched.binder.writer_child STORE ACK_FD", file=sys.stderr)
        return 2
    return run(argv[1], sys.stdin.fileno(), int(argv[2]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
