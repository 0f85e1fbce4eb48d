"""fast_pickle: the reduced forms round-trip to equal objects that keep their class's rules."""

import dataclasses
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from gosched.common.fast_pickle import _rebuild, fast_pickle, replaced
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


class PlainBase:
    """A base class without __slots__: its instances carry a __dict__."""


@fast_pickle
@dataclasses.dataclass(frozen=True, slots=True)
class FrozenOnPlainBase(PlainBase):
    x: int
    name: str


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


def test_a_frozen_class_is_rebuilt_by_writing_its_slots() -> None:
    # Not for a class that must run __post_init__ again.
    job = make_job("j").cpu("2").gpus(1).labels(team="a").build()
    assert Job.__reduce__(job)[0] is _rebuild
    assert FrozenPoint.__reduce__(FrozenPoint(1, ()))[0] is _rebuild
    assert FrozenWithPostInit.__reduce__(FrozenWithPostInit(1, []))[0] is FrozenWithPostInit
    back = roundtrip(job)
    assert type(back) is Job and back == job and hash(back) == hash(job)
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.priority = 5  # type: ignore[misc]


def test_a_frozen_class_whose_layout_has_a_dict_is_rebuilt_through_its_slots_too() -> None:
    # The twin class (slots only) cannot lend its layout to a class with a __dict__: the slots'
    # descriptors write the fields instead.
    point = FrozenOnPlainBase(3, "a")
    assert FrozenOnPlainBase.__reduce__(point)[0] is _rebuild
    back = roundtrip(point)
    assert type(back) is FrozenOnPlainBase and back == point and hash(back) == hash(point)
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.x = 4  # type: ignore[misc]


def test_a_rebuilt_frozen_object_is_its_class_through_and_through() -> None:
    job = make_job("j").cpu("2").replicas(2).build()
    back = roundtrip(job)
    assert type(back) is Job and back.__class__ is Job and isinstance(back, Job)
    assert not hasattr(back, "__dict__")
    assert roundtrip(back) == job  # reduced again as a Job


def test_a_frozen_class_pickled_by_value_loads_in_a_fresh_process(tmp_path: Path) -> None:
    # As Ray pickles a class defined in a driver script's __main__: the class itself travels.
    script = tmp_path / "driver.py"
    script.write_text(
        "import dataclasses, sys\n"
        "from ray import cloudpickle\n"
        "from gosched.common.fast_pickle import fast_pickle\n"
        "@fast_pickle\n"
        "@dataclasses.dataclass(frozen=True, slots=True)\n"
        "class Point:\n"
        "    x: int\n"
        "    y: str\n"
        "sys.stdout.buffer.write(cloudpickle.dumps([Point(1, 'a'), Point(2, 'b')]))\n"
    )
    data = subprocess.run([sys.executable, str(script)], capture_output=True, check=True).stdout
    loader = "import pickle, sys; print([(p.x, p.y) for p in pickle.loads(sys.stdin.buffer.read())])"
    out = subprocess.run([sys.executable, "-c", loader], input=data, capture_output=True, check=True)
    assert out.stdout.decode().strip() == "[(1, 'a'), (2, 'b')]"


@pytest.mark.parametrize(
    ("original", "changes"),
    [
        (make_job("j").cpu("2").gpus(1).labels(team="a").build(), {"submit_time": 12.5}),
        (make_job("j").replicas(3).priority(7).build(), {"priority": 9, "queue": "q2"}),
        (FrozenPoint(1, (2,)), {"y": (3, 4)}),
        (MutableBox([1]), {"items": [2]}),
    ],
)
def test_replaced_is_dataclasses_replace(original: object, changes: dict[str, object]) -> None:
    got = replaced(original, **changes)
    want = dataclasses.replace(original, **changes)  # type: ignore[type-var]
    assert type(got) is type(want) and got == want
    assert dataclasses.astuple(got) == dataclasses.astuple(want)  # type: ignore[arg-type]
    assert got is not original


def test_replaced_runs_post_init_and_refuses_unknown_fields() -> None:
    seen: list[int] = []
    copy = replaced(FrozenWithPostInit(1, seen), value=2)
    assert copy.value == 2 and seen == [1, 2]  # the copy checked itself, as replace does
    with pytest.raises(TypeError, match="no field 'nope'"):
        replaced(FrozenPoint(1, ()), nope=3)
