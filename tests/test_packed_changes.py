"""The binder's packed change segments answer exactly what its change log answers."""

from pathlib import Path

from gosched.binder.binder import Binder
from gosched.common import wire
from gosched.common.node import NodeState
from gosched.common.store import Store
from gosched.runtime.packed_changes import PackedChanges
from tests.builders import make_node


def unpacked(segments: list[bytes]) -> list[object]:
    return [change for segment in segments for change in wire.unpack(segment)]  # type: ignore[attr-defined]


def test_segments_equal_the_log_from_any_version(tmp_path: Path) -> None:
    binder = Binder(Store(str(tmp_path / "s.db")))
    packed = PackedChanges()
    seen = [binder.version]
    for i in range(6):
        binder.add_nodes([make_node(f"n{i}").build(), make_node(f"m{i}").build()])
        if i % 2:
            binder.set_node_state(f"n{i}", NodeState.CORDONED)
        # a reader at the version it last got, as a shard is
        segments, version, resync = packed.since(binder, seen[-1])
        assert not resync and version == binder.version
        assert unpacked(segments) == binder.changes_since(seen[-1])[0]
        seen.append(version)
    # every version ever handed out, and one never handed out (answered from the log)
    for v in [*seen, seen[2] + 1]:
        segments, version, resync = packed.since(binder, v)
        assert unpacked(segments) == binder.changes_since(v)[0]
        assert version == binder.version and not resync
    # the segments are packed once: two readers at the same version get the same bytes
    a, _, _ = packed.since(binder, seen[1])
    b, _, _ = packed.since(binder, seen[1])
    assert all(x is y for x, y in zip(a, b, strict=True))
