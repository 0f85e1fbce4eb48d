"""fast_pickle: the reduced forms round-trip to equal objects that keep their class's rules."""

import dataclasses
import pickle

import pytest

from gosched.common.fast_pickle import REBUILD, fast_pickle
from gosched.common.job import Job
from gosched.common.resources import ResourceRequest
from tests.builders import make_job


@fast_pickle
@dataclasses.dataclass(frozen=True, slots=True)
class FrozenPoint:
    x: int
    y: tuple[int, ...]


@fast_pickle
@dataclasses.dataclass(frozen=True, slots=True)
class FrozenWithPostInit:
    value: int
    seen: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.seen.append(self.value)


@fast_pickle
@dataclasses.dataclass(slots=True)
class MutableBox:
    items: list[int]


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenPointWithLabel(FrozenPoint):
    label: str = ""


def roundtrip(obj: object) -> object:
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def test_frozen_slotted_class_comes_back_equal_hashing_and_frozen() -> None:
    point = FrozenPoint(3, (1, 2))
    back = roundtrip(point)
    assert type(back) is FrozenPoint
    assert back == point and hash(back) == hash(point)
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.x = 4  # type: ignore[misc]


def test_rebuilding_runs_post_init() -> None:
    original = FrozenWithPostInit(7, [])
    assert original.seen == [7]
    back = roundtrip(original)
    assert isinstance(back, FrozenWithPostInit)
    assert back.seen == [7, 7]  # __post_init__ ran again, on the rebuilt object


def test_mutable_class_round_trips_through_its_constructor() -> None:
    box = MutableBox([1, 2, 3])
    back = roundtrip(box)
    assert back == box and back is not box


def test_subclass_keeps_the_fields_it_adds() -> None:
    back = roundtrip(FrozenPointWithLabel(1, (2,), "a"))
    assert back == FrozenPointWithLabel(1, (2,), "a")


def test_a_job_with_groups_round_trips_field_for_field() -> None:
    job = make_job("j1").cpu("2").gpus(1).replicas(3).priority(50).build()
    back = roundtrip(job)
    assert isinstance(back, Job)
    assert back == job and hash(back) == hash(job)
    assert dataclasses.astuple(back) == dataclasses.astuple(job)
    assert isinstance(back.groups[0].resources, ResourceRequest)


def test_a_frozen_class_is_rebuilt_by_its_slot_writer_found_by_name() -> None:
    # Found by name, as pickle and Ray's cloudpickle look it up; not for a class that must run
    # __post_init__ again, nor for one whose fields are not all its own slots.
    job = make_job("j").cpu("2").gpus(1).labels(team="a").build()
    assert Job.__reduce__(job)[0] is getattr(Job, REBUILD)
    assert FrozenPoint.__reduce__(FrozenPoint(1, ()))[0] is getattr(FrozenPoint, REBUILD)
    assert FrozenWithPostInit.__reduce__(FrozenWithPostInit(1, []))[0] is FrozenWithPostInit
    back = roundtrip(job)
    assert type(back) is Job and back == job and hash(back) == hash(job)
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.priority = 5  # type: ignore[misc]
