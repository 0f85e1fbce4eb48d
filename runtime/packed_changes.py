"""The binder's change log as packed segments, for the shards' replies.

Every shard's reply carries the changes since that shard's last view, so with N shards each
binding reaches N replies. Packing it N times made the binder, the one serial writer, pay N times
per task; here each stretch of the log is packed once, when the first reply needs it, and every
reply that needs it after that is handed the same bytes.
"""

import io
import pickle
from bisect import bisect_left

from gosched.binder.binder import Binder
from gosched.common import wire
from gosched.common.messages import ChangeList, TaskBoundRows

# Segments kept; older readers are answered from the log itself (packed for them alone).
MAX_SEGMENTS = 4096


class Packer:
    """wire.pack with one Pickler kept for the process's thread that packs (the binder actor's):
    the same bytes, but the memo table keeps the size a batch grew it to, where each
    pickle.dumps grows a new one from 8 entries, rehashing and clearing it at every doubling
    (a batch of 500 bindings memoises about 1,550 objects in each of its verdicts and its change
    segment). Clearing it after a message clears the whole table: keep one per kind of message."""

    def __init__(self) -> None:
        self._out = io.BytesIO()
        self._pickler = pickle.Pickler(self._out, protocol=wire.PROTOCOL)

    def pack(self, obj: object) -> bytes:
        out = self._out
        out.seek(0)
        out.truncate()
        try:
            self._pickler.dump(obj)
        finally:
            self._pickler.clear_memo()  # nothing of this message may be referred to by the next
        return out.getvalue()


class PackedChanges:
    def __init__(self, packer: Packer | None = None) -> None:
        self._pack = (packer or Packer()).pack
        self._starts: list[int] = []  # segment i holds the changes after _starts[i] ...
        self._ends: list[int] = []  # ... up to and including _ends[i]
        self._data: list[bytes] = []

    def since(self, binder: Binder, version: int) -> tuple[list[bytes], int, bool]:
        """(packed segments of changes after `version`, current version, resync). Unpacked and
        concatenated, the segments are binder.changes_since(version)'s changes."""
        current = binder.version
        self._extend_to(binder, current)
        if version == current:
            return [], current, False
        i = bisect_left(self._starts, version)
        if i < len(self._starts) and self._starts[i] == version:
            return self._data[i:], current, False
        changes, current, resync = binder.changes_since(version)
        return [self._pack(ChangeList(changes))], current, resync

    def _extend_to(self, binder: Binder, current: int) -> None:
        last = self._ends[-1] if self._ends else None
        if last == current:
            return
        new = binder.log.since(last) if last is not None and last < current else None
        if last is None or new is None:  # first use, or the log moved under us: start at `current`
            self._starts, self._ends, self._data = [current], [current], [self._pack([])]
            return
        self._starts.append(last)
        self._ends.append(current)
        bound = binder.last_bound
        if bound is not None and bound.start == last and bound.end == current:
            # The last commit's bindings, and nothing else: packed from the rows it gathered.
            self._data.append(self._pack(TaskBoundRows(bound.nodes, bound.rows)))
        else:
            self._data.append(self._pack(ChangeList(new)))
        if len(self._data) > MAX_SEGMENTS:
            drop = len(self._data) // 2
            del self._starts[:drop], self._ends[:drop], self._data[:drop]
