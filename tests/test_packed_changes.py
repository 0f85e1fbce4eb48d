"""The binder's packed change segments answer exactly what its change log answers."""

from pathlib import Path

from gosched.binder.binder import Binder
from gosched.common import wire
from gosched.common.messages import ChangeList, Placement, Proposal, ProposalBatch
from gosched.common.node import NodeState
from gosched.common.store import Store
from gosched.runtime.packed_changes import PackedChanges
from tests.builders import make_job, make_node


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


def test_a_commits_bindings_pack_from_its_rows_as_from_the_log(tmp_path: Path) -> None:
    """A segment that is one fast-path commit is packed from the rows the commit gathered: the
    same bytes as packing its changes from the log."""
    binder = Binder(Store(str(tmp_path / "s.db")))
    binder.add_nodes([make_node(f"n{i}").cpu("8").build() for i in range(3)])
    packed = PackedChanges()
    seen = binder.version
    packed.since(binder, seen)
    job = make_job("j").cpu("1").replicas(3).build()
    batch = ProposalBatch(0, seen, [Proposal(job, [Placement(i, f"n{i}") for i in range(3)], 3)])
    binder.commit(batch, with_changes=False)
    assert binder.last_bound is not None and binder.last_bound.start == seen
    segments, version, resync = packed.since(binder, seen)
    assert version == binder.version and not resync
    assert segments[-1] == wire.pack(ChangeList(binder.changes_since(seen)[0]))
    assert unpacked(segments) == binder.changes_since(seen)[0]
