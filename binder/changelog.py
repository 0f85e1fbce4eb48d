"""The binder's versioned change log: one version number per change, bounded in length.

Entry i of the log has version `base + i + 1`; `version` is the newest entry's. A reader that last
saw version v gets every entry after v, or None when v is older than the log keeps (it must resync
from a snapshot) or newer than the log has reached (it saw a past that no longer exists).
"""

from collections.abc import Sequence

from gosched.common.messages import Change

DEFAULT_MAX_ENTRIES = 1_000_000


class ChangeLog:
    def __init__(self, base: int = 0, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.base = base  # version of the entry before the first one kept
        self.max_entries = max_entries
        self._entries: list[Change] = []

    @property
    def version(self) -> int:
        return self.base + len(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def extend(self, changes: Sequence[Change]) -> int:
        """Append changes (versions version+1 ...); returns the new version."""
        self._entries.extend(changes)
        # Trim in chunks (down to max_entries once a tenth more has piled up): appends stay O(1).
        if len(self._entries) > self.max_entries + self.max_entries // 10:
            over = len(self._entries) - self.max_entries
            del self._entries[:over]
            self.base += over
        return self.version

    def since(self, version: int) -> list[Change] | None:
        """Changes after `version`; None if the log cannot answer (too old, or ahead of the log)."""
        if version < self.base or version > self.version:
            return None
        return self._entries[version - self.base :]

    def oldest_version(self) -> int:
        """The oldest version a reader may have seen and still be answered from the log."""
        return self.base
