"""Quicker pickling for slotted dataclasses: the actors' messages are made of them.

By default pickle takes such an object apart through copyreg (a dict of slot values per object) or,
for a frozen class, through the __getstate__/__setstate__ pair `dataclasses` installs, which calls
`fields()` on every object. Here the object is reduced to its class and its field values in order,
read with one C attrgetter, and rebuilt by calling the class: two to three times faster each way,
and smaller (no field names in the stream).

A non-frozen object is rebuilt by calling the class. A frozen one is not: a frozen dataclass's
__init__ sets each field through object.__setattr__ from Python, which made a 13-field Job cost
3 us to unpickle, twice per task (shard and binder). It is rebuilt by writing its slots through
their member descriptors in one C-level map (about half the time); it comes back as frozen, equal
and hashing as before. None of these classes has a __post_init__, so skipping __init__ skips no work.
"""

import dataclasses
import types
from collections import deque
from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter
from typing import Any, TypeVar

T = TypeVar("T")

_SET_SLOT = types.MemberDescriptorType.__set__
# Frozen class -> the member descriptors of its fields, in field order.
_SLOTS: dict[type, tuple[Any, ...]] = {}


def _rebuild_frozen(cls: type[T], values: Sequence[Any]) -> T:
    """A frozen slotted dataclass with `values` as its fields, without running __init__."""
    slots = _SLOTS[cls]
    obj = object.__new__(cls)
    deque(map(_SET_SLOT, slots, repeat(obj, len(slots)), values), 0)
    return obj


def _slot_descriptors(cls: type, names: tuple[str, ...]) -> tuple[Any, ...] | None:
    """The member descriptors of `names` (None if a field is not a plain slot, or there is a
    __post_init__ to run)."""
    if hasattr(cls, "__post_init__"):
        return None
    out = tuple(cls.__dict__.get(name) for name in names)
    return out if all(isinstance(d, types.MemberDescriptorType) for d in out) else None


def fast_pickle(cls: type[T]) -> type[T]:
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if not fields:
        return cls
    if any(not f.init for f in fields):
        raise TypeError(f"{cls.__name__}: fast_pickle needs every field in __init__")
    names = tuple(f.name for f in fields)
    read = attrgetter(*names)
    single = len(names) == 1
    params = getattr(cls, "__dataclass_params__", None)
    slots = _slot_descriptors(cls, names) if params is not None and params.frozen else None
    if slots is not None:
        _SLOTS[cls] = slots

    def __reduce__(self: Any) -> tuple[Any, tuple[Any, ...]]:
        kind = type(self)
        if kind is not cls:  # a subclass may add fields: it pays for reading them, not losing them
            return kind, tuple(getattr(self, f.name) for f in dataclasses.fields(self))
        values = (read(self),) if single else read(self)
        if slots is not None:
            return _rebuild_frozen, (cls, values)
        return cls, values

    setattr(cls, "__reduce__", __reduce__)  # noqa: B010 (assigning a method to a class)
    return cls
