"""The binder's change log as packed segments, for the shards' replies.

Every shard's reply carries the changes since that shard's last view, so with N shards each
binding reaches N replies. Packing it N times made the binder, the one serial writer, pay N times
per task; here each stretch of the log is packed once, when the first reply needs it, and every
reply that needs it after that is handed the same bytes.
"""

from bisect import bisect_left

from gosched.binder.binder import Binder
from gosched.common import wire
from gosched.common.messages import ChangeList, TaskBoundRows

# Segments kept; older readers are answered from the log itself (packed for them alone).
MAX_SEGMENTS = 4096


class PackedChanges:
    def __init__(self) -> None:
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
        return [wire.pack(ChangeList(changes))], current, resync

    def _extend_to(self, binder: Binder, current: int) -> None:
        last = self._ends[-1] if self._ends else None
        if last == current:
            return
        new = binder.log.since(last) if last is not None and last < current else None
        if last is None or new is None:  # first use, or the log moved under us: start at `current`
            self._starts, self._ends, self._data = [current], [current], [wire.pack([])]
            return
        self._starts.append(last)
        self._ends.append(current)
        bound = binder.last_bound
        if bound is not None and bound.start == last and bound.end == current:
            # The last commit's bindings, and nothing else: packed from the rows it gathered.
            self._data.append(wire.pack(TaskBoundRows(bound.nodes, bound.rows)))
        else:
            self._data.append(wire.pack(ChangeList(new)))
        if len(self._data) > MAX_SEGMENTS:
            drop = len(self._data) // 2
            del self._starts[:drop], self._ends[:drop], self._data[:drop]
