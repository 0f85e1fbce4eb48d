"""Messages waiting to go up to the master. The outbox outlives a broken stream: what the old
stream did not take goes out on the next one, so statuses queued while disconnected are not lost.

The master acknowledges nothing: a log chunk taken by a stream may sit in its transport when the
stream is cut. The outbox remembers where the chunks taken by the current stream start until that
stream is known to have been read to its end (a drained close), so that an agent stopping with a
stream it could not drain saves log offsets the next agent resumes from without a hole. A task's
offsets are dropped once the stream takes its final status (its run's last chunks went before it,
and the agent has forgotten the task): they would only grow with every task that ever logged.
"""

import threading
from collections import deque
from collections.abc import Callable

from gosched.proto.v1 import agent_pb2, types_pb2

FINAL_STATES = frozenset({types_pb2.TASK_STATE_SUCCEEDED, types_pb2.TASK_STATE_FAILED})


def task_of(msg: agent_pb2.AgentMessage) -> str | None:
    """The task a status or log message is about; None for a heartbeat."""
    body = msg.WhichOneof("body")
    if body == "task_status":
        return msg.task_status.task_id
    if body == "log":
        return msg.log.task_id
    return None


class Outbox:
    def __init__(self) -> None:
        self._items: deque[agent_pb2.AgentMessage] = deque()
        self._cond = threading.Condition()
        # (task, stream) -> the lowest offset of the log chunks the current stream took
        self._taken: dict[tuple[str, str], int] = {}

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def put(self, msg: agent_pb2.AgentMessage) -> None:
        with self._cond:
            self._items.append(msg)
            self._cond.notify_all()

    def put_front(self, msg: agent_pb2.AgentMessage) -> None:
        """Give back a message a closing stream took but did not send."""
        with self._cond:
            self._items.appendleft(msg)
            self._cond.notify_all()

    def take(self, timeout: float) -> agent_pb2.AgentMessage | None:
        with self._cond:
            if not self._items:
                self._cond.wait(timeout)
            if not self._items:
                return None
            msg = self._items.popleft()
            body = msg.WhichOneof("body")
            if body == "log":
                _lowest(self._taken, msg.log)
            elif body == "task_status" and msg.task_status.state in FINAL_STATES:
                # Queued after its run's last chunks: the agent forgot the task when it queued it
                # (TaskTable.finish), and no state file saves its offsets any more.
                self._forget(msg.task_status.task_id)
            return msg

    def untrack(self) -> None:
        """Stop tracking what was taken so far: a new stream starts taking messages (what an
        earlier one took went out, or was lost with it), or the master read the current stream to
        its end (what it took has arrived)."""
        with self._cond:
            self._taken.clear()

    def _forget(self, task_id: str) -> None:
        for key in [k for k in self._taken if k[0] == task_id]:
            del self._taken[key]

    def wake(self) -> None:
        """Wake takers so that they look again at whether their stream is still open."""
        with self._cond:
            self._cond.notify_all()

    def keep_only(self, keep: Callable[[agent_pb2.AgentMessage], bool]) -> None:
        with self._cond:
            self._items = deque(m for m in self._items if keep(m))

    def log_offsets(self, *, taken: bool = False) -> dict[tuple[str, str], int]:
        """The lowest offset of the log chunks waiting here, per (task, stream), and with `taken`
        of those the current stream took without being drained since: what a state file saved now
        must resume from, as those chunks are lost if the agent stops."""
        with self._cond:
            out = dict(self._taken) if taken else {}
            for m in self._items:
                if m.WhichOneof("body") == "log":
                    _lowest(out, m.log)
        return out

    def final_status_ids(self) -> set[str]:
        """Tasks whose final status is waiting here."""
        with self._cond:
            return {
                m.task_status.task_id
                for m in self._items
                if m.WhichOneof("body") == "task_status" and m.task_status.state in FINAL_STATES
            }


def _lowest(offsets: dict[tuple[str, str], int], chunk: types_pb2.LogChunk) -> None:
    key = (chunk.task_id, chunk.stream)
    offsets[key] = min(offsets.get(key, chunk.offset), chunk.offset)
