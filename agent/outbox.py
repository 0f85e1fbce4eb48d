"""Messages waiting to go up to the master. The outbox outlives a broken stream: what the old
stream did not take goes out on the next one, so statuses queued while disconnected are not lost."""

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
            return self._items.popleft() if self._items else None

    def wake(self) -> None:
        """Wake takers so that they look again at whether their stream is still open."""
        with self._cond:
            self._cond.notify_all()

    def keep_only(self, keep: Callable[[agent_pb2.AgentMessage], bool]) -> None:
        with self._cond:
            self._items = deque(m for m in self._items if keep(m))

    def final_status_ids(self) -> set[str]:
        """Tasks whose final status is waiting here."""
        with self._cond:
            return {
                m.task_status.task_id
                for m in self._items
                if m.WhichOneof("body") == "task_status" and m.task_status.state in FINAL_STATES
            }
