"""The binder's store writer, per task bound: a store holding N single-task SchedulingBasic jobs
(stored by Store.add_jobs in calls of 300, as the dispatcher stores them at submission), then the
writer's work for batches of 512 bindings (the dispatcher's order of tasks, random nodes of 10,000,
no GPUs), grouped as writer_child groups them (GROUP_FRAMES frames per transaction; GROUP=k in the
environment makes it k, as when the writer keeps up and few frames queue).

    python writer_harness.py N MODE
MODE (each a whole run, for writer_callgrind.sh to subtract):
    setup   the store, its jobs, the frames (packed, and decoded into groups); nothing measured
    child0  setup, then writer_child.run over no frames (its store opened and closed)
    child   setup, then writer_child.run over the frames (from a file, as from its pipe)
    commit  setup, then Store.commit_many over the decoded groups: the store's part alone
    pack    setup, then StoreWriter.write per batch (the binder's side: packing a frame)
    time R  R repeats of child, commit and pack on fresh stores, timed by time.process_time, each
            store checked after (every task bound as its frame said, the last frame's version)
Instructions per task: child - child0, commit - setup, pack - setup (divided by N).

A reader connection stays open throughout, as the dispatcher's does in the running system, so that
no close checkpoints the WAL (a steady writer's checkpoints are the auto-checkpoints it meets).
"""

import gc
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from typing import Any

import msgpack

from gosched.binder import writer_child
from gosched.binder.writer import StoreWriter
from gosched.common.store import Store, StoredBatch
from gosched.runtime.simulation import basic_jobs

BATCH = 512
NODES = 10_000


def frames(n: int) -> list[tuple[int, int, float, list[tuple[str, str, tuple[()]]], list[Any]]]:
    rng = random.Random(0)
    out = []
    tids = [f"job-{i}/0" for i in range(n)]
    for k, start in enumerate(range(0, n, BATCH)):
        bound = [(t, f"node-{rng.randrange(NODES)}", ()) for t in tids[start : start + BATCH]]
        out.append((k + 1, 1000 + 2 * (k + 1), 1.7e9 + k * 0.005, bound, []))
    return out


def setup(n: int, tmp: str) -> tuple[Store, str, list[Any], list[list[StoredBatch]]]:
    path = os.path.join(tmp, "w.db")
    reader = Store(path)
    jobs = basic_jobs(n)
    for start in range(0, n, 300):
        reader.add_jobs(jobs[start : start + 300], now=1.7e9)
    fr = frames(n)
    data = b"".join(msgpack.packb([seq, v, now, b, s]) for seq, v, now, b, s in fr)
    with open(os.path.join(tmp, "frames"), "wb") as f:
        f.write(data)
    # The groups as the child takes them (the child's own unpacking: use_list=False).
    got = list(msgpack.Unpacker(_Once(data), raw=False, use_list=False))
    group = writer_child.GROUP_FRAMES
    groups = [[(v, b, s, now) for _, v, now, b, s in got[i : i + group]] for i in range(0, len(got), group)]
    return reader, path, fr, groups


class _Once:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, size: int = -1) -> bytes:
        data, self.data = self.data, b""
        return data


def run_child(path: str, frames_file: str) -> None:
    fd_in = os.open(frames_file, os.O_RDONLY)
    fd_out = os.open(os.devnull, os.O_WRONLY)
    try:
        writer_child.run(path, fd_in, fd_out)
    finally:
        os.close(fd_in)
        os.close(fd_out)


def run_commit(path: str, groups: list[list[StoredBatch]]) -> None:
    store = Store(path)
    for g in groups:
        store.commit_many(g)
    store.close()


def packer() -> StoreWriter:
    """A StoreWriter whose frames go to /dev/null: the binder's side of write() only."""
    w = StoreWriter.__new__(StoreWriter)
    w._cond = threading.Condition()
    w._sent = w._acked = w._done = 0
    w._callbacks = deque()
    w._closing = False
    w.failure = None
    w._fd = os.open(os.devnull, os.O_WRONLY)
    return w


def run_pack(w: StoreWriter, fr: list[Any]) -> None:
    for _, version, now, bound, states in fr:
        w.write(version, bound, states, now)


def main() -> None:
    n, mode = int(sys.argv[1]), sys.argv[2]
    if os.environ.get("GROUP"):
        writer_child.GROUP_FRAMES = int(os.environ["GROUP"])
    if mode == "time":
        repeats = int(sys.argv[3])
        got: dict[str, list[float]] = {"child": [], "commit": [], "pack": []}
        for _ in range(repeats):
            for what in got:
                with tempfile.TemporaryDirectory() as tmp:
                    reader, path, fr, groups = setup(n, tmp)
                    w = packer() if what == "pack" else None
                    gc.collect()
                    t0 = time.process_time()
                    if what == "child":
                        run_child(path, os.path.join(tmp, "frames"))
                    elif what == "commit":
                        run_commit(path, groups)
                    else:
                        assert w is not None
                        run_pack(w, fr)
                    got[what].append((time.process_time() - t0) / n * 1e6)
                    check(reader, n, what)
                    reader.close()
        for what, xs in got.items():
            print(
                f"{what}: median {statistics.median(xs):.2f} min {min(xs):.2f} us per task "
                f"({' '.join(f'{x:.2f}' for x in xs)})"
            )
        return
    tmp = tempfile.mkdtemp()
    reader, path, fr, groups = setup(n, tmp)
    w = packer()
    gc.collect()
    if mode == "child0":
        open(os.path.join(tmp, "empty"), "wb").close()
        run_child(path, os.path.join(tmp, "empty"))
    elif mode == "child":
        run_child(path, os.path.join(tmp, "frames"))
    elif mode == "commit":
        run_commit(path, groups)
    elif mode == "pack":
        run_pack(w, fr)
    else:
        assert mode == "setup", mode
    os._exit(0)  # no collector pass, no close at exit: neither is the writer's work


def check(reader: Store, n: int, what: str) -> None:
    """Every task bound, on the frame's node, at the frame's time; the version the last frame's."""
    if what == "pack":
        return
    want = {t: (node, now) for _, _, now, bound, _ in frames(n) for t, node, _ in bound}
    rows = reader._conn.execute("SELECT task_id, state, node, gpus, bound_at, updated FROM tasks").fetchall()
    assert len(rows) == n, len(rows)
    for tid, state, node, gpus, bound_at, updated in rows:
        assert state == "bound" and gpus == "" and (node, bound_at) == want[tid] and updated == bound_at, tid
    assert reader.load_version() == 1000 + 2 * len(range(0, n, BATCH))


if __name__ == "__main__":
    main()
