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
    read = attrgetter(*names)
    single = len(names) == 1
    setattr_ = object.__setattr__

    def __getstate__(self: Any) -> tuple[Any, ...]:
        return (read(self),) if single else read(self)

    def __setstate__(self: Any, state: tuple[Any, ...]) -> None:
        for name, value in zip(names, state, strict=True):
            setattr_(self, name, value)

    setattr(cls, "__getstate__", __getstate__)  # noqa: B010 (assigning methods to a class)
    setattr(cls, "__setstate__", __setstate__)  # noqa: B010
    return cls
