"""A binder reply as the dispatcher reads it: each accepted unit as its row of AcceptedUnit's fields.

The reply travels with its accepted units as rows (common/messages.py: BindReply.__reduce__,
BindReplyRows); unpacked the usual way, each row becomes an AcceptedUnit that the dispatcher only
reads three fields of. read_verdicts unpacks the same bytes with the rows left as they came: the
stream's call to rebuild the BindReply is answered by Verdicts instead, and everything else in it
(rejections, evictions) is rebuilt as usual. The bytes and the binder's side are unchanged.
"""

import io
import pickle
from operator import attrgetter
from typing import Any

from gosched.common.messages import BindReply, BindReplyRows, Eviction, RejectedUnit

# An AcceptedUnit's fields in order (tests/test_dispatcher_verdicts.py checks them against it).
AcceptedRow = tuple[str, int, tuple[int, ...], float, tuple[tuple[str, ...], ...]]
ACCEPTED_FIELDS = ("job_id", "attempt", "task_indexes", "bind_time", "victims")
_ROW_OF = attrgetter(*ACCEPTED_FIELDS)


class Verdicts:
    """What the dispatcher takes from a BindReply: the accepted units as rows, the rejections, the
    evictions and the shard whose batch it answers (-1: none)."""

    __slots__ = ("accepted", "evicted", "rejected", "shard_id")

    def __init__(
        self,
        accepted: list[AcceptedRow],
        rejected: list[RejectedUnit],
        evicted: list[Eviction],
        shard_id: int,
    ) -> None:
        self.accepted = accepted
        self.rejected = rejected
        self.evicted = evicted
        self.shard_id = shard_id

    @classmethod
    def of(cls, reply: BindReply) -> "Verdicts":
        return cls(list(map(_ROW_OF, reply.accepted)), reply.rejected, reply.evicted, reply.shard_id)


def _verdicts(
    accepted: list[AcceptedRow],
    rejected: list[RejectedUnit],
    evicted: list[Eviction],
    _changes: object,
    _version: int,
    _resync: bool = False,
    shard_id: int = -1,
) -> Verdicts:
    """In place of the function that rebuilds a BindReply from these arguments (rows first)."""
    return Verdicts(accepted, rejected, evicted, shard_id)


# The function a reply's stream calls to rebuild it, as the binder's replies name it.
_REBUILD = BindReplyRows([], [], [], 0, 0).__reduce__()[0]
_REBUILD_NAME = (_REBUILD.__module__, _REBUILD.__qualname__)


class _Reader(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == _REBUILD_NAME:
            return _verdicts
        return super().find_class(module, name)


def read_verdicts(data: bytes) -> Verdicts:
    """The packed BindReply (common.wire) as Verdicts; one packed without rows (an AcceptedUnit of
    a subclass) is read whole and its units' rows read off them."""
    reply = _Reader(io.BytesIO(data)).load()
    if isinstance(reply, Verdicts):
        return reply
    assert isinstance(reply, BindReply)
    return Verdicts.of(reply)
