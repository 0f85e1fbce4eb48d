"""The binder's handle on its store writer process (binder/writer_child.py): the binder checks and
applies batch k+1 while SQLite writes batch k on another core, as Nomad's plan applier evaluates
the next plan while the last one commits.

    writer = StoreWriter(store_path, on_failure=...)   # waits until a previous writer is done
    writer.write(version, bound, states, now)          # queued; durable later, in order
    writer.write_plain(version, task_ids, nodes, now)   # the same for bindings holding no GPUs
    writer.after_durable(callback)                      # runs once all written so far is durable
    writer.drain()                                      # returns once all written so far is durable
    writer.close()

What the binder tells the world outside its shards (the dispatcher's reports, the agents' launches,
the API's answers) must wait for durability: callbacks and drain() give it that. A binder that
crashes before its writes are durable has told nobody, so its recovery from the store is the truth.

One thread writes (the binder's); a thread of this handle reads the acks and runs the callbacks,
in order. A failed write, or a writer gone before close(), calls `on_failure` once: the binder's
memory is then ahead of the store, or soon would be.
"""

import contextlib
import fcntl
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import msgpack

from gosched.binder.writer_child import lock_path
from gosched.common.states import TaskState
from gosched.common.store import Gpus

log = logging.getLogger(__name__)

PIPE_BYTES = 1 << 20  # room for several batches in the pipe, so the binder rarely waits on it
START_TIMEOUT_S = 120.0  # for a previous writer to finish, and for a new one to say it is ready


class WriterFailed(RuntimeError):
    """The store writer failed: what the binder holds in memory is not all in the store."""


class StoreWriter:
    """A child process that writes the binder's batches to the store; see the module docstring."""

    def __init__(
        self,
        store_path: str,
        *,
        on_failure: Callable[[str], None] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.store_path = store_path
        self.on_failure = on_failure
        wait_for_previous_writer(store_path, start_timeout_s)
        ack_read, ack_write = os.pipe()  # the acks' own pipe: nothing printed can get into it
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "gosched.binder.writer_child", store_path, str(ack_write)],
                stdin=subprocess.PIPE,
                pass_fds=(ack_write,),
                start_new_session=True,  # a Ctrl-C at the terminal is the binder's to handle, not its
            )
        except BaseException:
            os.close(ack_read)
            raise
        finally:
            os.close(ack_write)
        assert self._proc.stdin is not None
        self._fd = self._proc.stdin.fileno()
        self._ack_fd = ack_read
        # Above this system's pipe-max-size, the default pipe only makes the binder wait more often.
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self._unpacker = msgpack.Unpacker(raw=False, use_list=False)
        try:
            self._await_ready(start_timeout_s)
        except BaseException:
            self._proc.kill()
            self._proc.wait()
            self._proc.stdin.close()
            os.close(ack_read)
            raise
        self._cond = threading.Condition()
        self._sent = 0  # the last seq sent
        self._acked = 0  # the last seq durable
        self._done = 0  # the last seq whose callbacks have run
        self._callbacks: deque[tuple[int, Callable[[], object]]] = deque()
        self._closing = False
        self.failure: str | None = None
        self._told = False  # on_failure has run (drain() returns only then)
        self.busy_s = 0.0  # the writer's CPU seconds, as of its last ack
        self.acks = 0  # acks received: one per transaction the writer made
        self._reader = threading.Thread(target=self._read_acks, name="store-writer-acks", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def ack_thread_cpu_s(self) -> float:
        """CPU seconds of this process's thread that reads the acks and runs the callbacks (0 once
        it has ended): it shares the interpreter's lock with the thread that sends the frames."""
        ident = self._reader.ident
        if ident is None or not self._reader.is_alive():
            return 0.0
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(ident))
        except OSError:  # ended between the check and the read
            return 0.0

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    @property
    def pending(self) -> int:
        """Frames sent and not yet durable."""
        with self._cond:
            return self._sent - self._acked

    # -- the binder's thread ------------------------------------------------------------------------
    def write(
        self,
        version: int,
        bound: Sequence[tuple[str, str, Gpus]],
        states: Sequence[tuple[str, TaskState]],
        now: float,
    ) -> None:
        """Queue one batch (bindings, other task states, the version after it) for the store."""
        self._send(version, bound, [(tid, s.value) for tid, s in states], now, None)

    def write_plain(self, version: int, task_ids: Sequence[str], nodes: Sequence[str], now: float) -> None:
        """write() of bindings none of which holds GPUs, and no other state change, as two columns:
        packed in a third of the time of rows (the binder's usual batch has them as columns)."""
        self._send(version, task_ids, (), now, None, nodes)

    def after_durable(self, callback: Callable[[], object]) -> None:
        """Run `callback` (on the ack thread) once everything written so far is durable, after the
        callbacks given before it."""
        with self._cond:
            self._check()
            if self._acked < self._sent:
                self._callbacks.append((self._sent, callback))
                return
        self._send(None, (), (), 0.0, callback)  # nothing in flight: a barrier carries it

    def drain(self, timeout_s: float | None = None) -> None:
        """Wait until everything written so far is durable and its callbacks have run."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while (self._done < self._sent and self.failure is None) or (self.failure and not self._told):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"the store writer has {self._sent - self._acked} batch(es) unwritten")
                self._cond.wait(left)
            self._check()

    def close(self, timeout_s: float = 60.0) -> None:
        """Let the writer finish what it was sent, and stop it; the handle takes nothing more."""
        with self._cond:
            self._closing = True
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout_s)

    def _send(
        self,
        version: int | None,
        bound: Sequence[tuple[str, str, Gpus]] | Sequence[str],
        states: Sequence[tuple[str, str]],
        now: float,
        callback: Callable[[], object] | None,
        nodes: Sequence[str] | None = None,
    ) -> None:
        # Packed before the seq is taken: a batch that cannot be packed leaves no gap in the seqs.
        # (Only the binder's thread sends, so the next seq cannot change meanwhile.) A frame of
        # write_plain's carries the task ids as `bound` and their nodes after the states.
        frame = [self._sent + 1, version, now, bound, states]
        if nodes is not None:
            frame.append(nodes)
        data = msgpack.packb(frame)
        with self._cond:
            self._check()
            self._sent += 1
            if callback is not None:
                self._callbacks.append((self._sent, callback))
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            self._fail(f"the store writer took no more input ({exc})")
            raise WriterFailed(self.failure) from exc

    def _check(self) -> None:
        if self.failure is not None:
            raise WriterFailed(self.failure)
        if self._closing:
            raise WriterFailed("the store writer is closed")

    # -- the ack thread ------------------------------------------------------------------------------
    def _await_ready(self, timeout_s: float) -> None:
        """Wait for the writer's first ack: from then on it holds the writer lock, so a binder
        restarted after this one dies waits for it (wait_for_previous_writer)."""
        deadline = time.monotonic() + timeout_s
        poller = select.poll()  # not select(): a busy process may hold descriptors past 1024
        poller.register(self._ack_fd, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                raise WriterFailed(
                    f"the store writer for {self.store_path} was not ready in {timeout_s:.0f} s"
                )
            data = os.read(self._ack_fd, 64)
            if not data:
                code = self._proc.wait()
                raise WriterFailed(
                    f"the store writer for {self.store_path} exited at its start (code {code})"
                )
            self._unpacker.feed(data)
            for ack in self._unpacker:
                if ack[0] != 0:
                    raise WriterFailed(f"the store writer's first word was {ack!r}, not ready")
                return

    def _read_acks(self) -> None:
        try:
            self._take_acks()
        except BaseException as exc:  # whatever ends this thread, drain() must not wait forever
            self._fail(f"the store writer's acks could not be read: {type(exc).__name__}: {exc}")
        finally:
            os.close(self._ack_fd)
        code = self._proc.wait()
        with self._cond:
            lost, closing = self._sent - self._acked, self._closing
        if lost or not closing:
            self._fail(f"the store writer exited (code {code}) with {lost} batch(es) unwritten")

    def _take_acks(self) -> None:
        unpacker = self._unpacker
        while True:
            data = os.read(self._ack_fd, 65536)
            if not data:
                return
            if self.failure is not None:
                continue  # read to the end, so that the writer never blocks on a full pipe
            unpacker.feed(data)
            for seq, error, busy in unpacker:
                if error is not None:
                    self._fail(f"the store writer failed: {error}")
                    break
                with self._cond:
                    self._acked = seq
                    self.busy_s = busy
                    self.acks += 1
                    ready = []
                    while self._callbacks and self._callbacks[0][0] <= seq:
                        ready.append(self._callbacks.popleft()[1])
                for callback in ready:
                    try:
                        callback()
                    except Exception:  # one bad callback must not stop the acks
                        log.exception("a callback after a durable write failed")
                with self._cond:
                    self._done = seq
                    self._cond.notify_all()

    def _fail(self, why: str) -> None:
        with self._cond:
            if self.failure is not None:
                return
            self.failure = why
            self._callbacks.clear()  # their outcomes never became durable: nobody may hear of them
        log.critical("%s", why)
        try:
            if self.on_failure is not None:
                self.on_failure(why)
        finally:
            with self._cond:  # a drain() returns only once on_failure has run
                self._told = True
                self._cond.notify_all()


def wait_for_previous_writer(store_path: str, timeout_s: float) -> None:
    """Return once no writer process holds the store's writer lock (a crashed binder's writer
    finishes what it was sent first): recovering before that would miss its last batches."""
    deadline = time.monotonic() + timeout_s
    if not os.path.isdir(os.path.dirname(os.path.abspath(store_path))):
        return  # no folder, no store: nobody can be writing it
    with open(lock_path(store_path), "a+") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"a previous store writer still holds {lock_path(store_path)}"
                    ) from None
                time.sleep(0.02)
                continue
            fcntl.flock(lock, fcntl.LOCK_UN)
            return
