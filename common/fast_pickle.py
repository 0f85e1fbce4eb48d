"""Quicker pickling for frozen, slotted dataclasses.

For such a class, `dataclasses` installs a __getstate__/__setstate__ that call `fields()` on every
object, which made unpickling a batch of jobs between the actors cost more than planning it. The
pair installed here reads the field names once, when the class is decorated.
"""

import dataclasses
from operator import attrgetter
from typing import Any, TypeVar

T = TypeVar("T")


def fast_pickle(cls: type[T]) -> type[T]:
    names = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    if not names:
        return cls
    read = attrgetter(*names)
    single = len(names) == 1
    setattr_ = object.__setattr__

    def _names(self: Any) -> tuple[str, ...]:
        # a subclass may add fields: it pays for reading them, rather than losing them
        return names if type(self) is cls else tuple(f.name for f in dataclasses.fields(self))

    def __getstate__(self: Any) -> tuple[Any, ...]:
        if type(self) is not cls:
            return tuple(getattr(self, n) for n in _names(self))
        return (read(self),) if single else read(self)

    def __setstate__(self: Any, state: tuple[Any, ...]) -> None:
        for name, value in zip(_names(self), state, strict=True):
            setattr_(self, name, value)

    setattr(cls, "__getstate__", __getstate__)  # noqa: B010 (assigning methods to a class)
    setattr(cls, "__setstate__", __setstate__)  # noqa: B010
    return cls
