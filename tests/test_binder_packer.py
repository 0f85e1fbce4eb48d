"""The binder actor's reused Pickler (runtime/packed_changes.Packer) packs what wire.pack packs,
byte for byte, message after message: its memo never carries over from one message to the next."""

import pickle

import pytest

from gosched.common import wire
from gosched.common.cluster_state import Resident
from gosched.common.messages import AcceptedUnit, BindReply, ChangeList, TaskBound, TaskBoundRows
from gosched.runtime.packed_changes import Packer


def _bindings(n: int, node: str = "n") -> list[TaskBound]:
    return [
        TaskBound(f"{node}{i % 7}", Resident(f"j{i}/0", f"j{i}", 500, 1 << 30, start_time=1.5))
        for i in range(n)
    ]


def test_the_same_bytes_as_wire_pack_message_after_message() -> None:
    packer = Packer()
    shared = _bindings(600)  # the same objects in two messages: each must pack them whole
    messages: list[object] = [
        ChangeList(shared),
        [],
        ChangeList(shared[:10]),
        BindReply([AcceptedUnit("j1", 0, (0,), 2.0)], [], [], ChangeList(), 7, shard_id=1),
        TaskBoundRows(["a", "b", "a"], [("x", 1), ("y", 2), ("x", 1)]),
        ChangeList(_bindings(3000, "m")),  # a memo grown past the first's
        ChangeList(shared[:1]),
        {"a": (1, 2), "b": [b"x" * 10, "y"]},
    ]
    packed = [packer.pack(message) for message in messages]
    # each message's bytes as wire.pack's, and none changed by packing the ones after it
    assert packed == [wire.pack(message) for message in messages]
    assert pickle.loads(packer.pack(messages[0])) == list(shared)


def test_a_message_that_fails_to_pack_leaves_nothing_behind() -> None:
    packer = Packer()
    good = ChangeList(_bindings(50))
    with pytest.raises((TypeError, pickle.PicklingError, AttributeError)):
        packer.pack([good[0], lambda: None])
    assert packer.pack(good) == wire.pack(good)
