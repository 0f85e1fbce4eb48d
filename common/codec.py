"""Compact binary (msgpack) encoding of the model and message types, for the SQLite store (the
actors' messages travel pickled: common/wire.py).

Wire format:

* a registered dataclass is an array ``[tag, field values in declaration order]``; each field value is
  encoded by the field's declared type, so ``tuple[str, ...]``, ``dict[str, int]``, enums (their
  value) and other plain data go to msgpack as they are, and come back as the declared type (arrays
  are read as tuples; fields declared ``list`` / ``frozenset`` are converted back);
* where the declared type says nothing (``object``, ``Any``, a mixed union) and at the top level,
  values are self-describing: a list is ``[0, items...]``, a tuple ``[1, items...]``, a frozenset
  ``[2, items...]``, a set ``[3, items...]``, an enum ``[4, enum tag, value]``, a dict a map, a
  dataclass its ``[tag, ...]`` array (tags are >= 16, so the first element tells them apart).

Stored bytes depend on the tags and on field order: never renumber or reuse a tag, and add new
fields at the end with a default (older data then decodes with the default filled in).

Per-type encoders and decoders are built once, when a type is registered, from its declared field
types; encoding and decoding then do no reflection.
"""

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any, TypeVar

import msgpack

from gosched.common.cluster_state import Resident
from gosched.common.job import (
    AntiAffinity,
    GpuTopologyMode,
    Job,
    JobKind,
    NodeSelectorTerm,
    PreferredTerm,
    Requirement,
    SelectorOp,
    TaskGroup,
    TaskPlacement,
    Toleration,
)
from gosched.common.messages import (
    AcceptedUnit,
    BindReply,
    Diagnosis,
    Eviction,
    NodeRemoved,
    NodeUpserted,
    Placement,
    Proposal,
    ProposalBatch,
    QueueFloor,
    RejectedUnit,
    TaskBound,
    TaskReleased,
    TaskUp,
    Unit,
    UnitBatch,
    Unschedulable,
)
from gosched.common.node import Gpu, Node, NodeState, NodeUsage, Taint, TaintEffect
from gosched.common.resources import ResourceRequest
from gosched.common.states import JobState, TaskState

__all__ = [
    "CodecError",
    "decode",
    "decode_job",
    "decode_node",
    "encode",
    "encode_job",
    "encode_many",
    "encode_node",
    "register_dataclass",
    "register_enum",
]

T = TypeVar("T")
Encoder = Callable[[Any], Any]
Decoder = Callable[[Any], Any]


class CodecError(ValueError):
    """Bytes that do not decode (corrupt, truncated, or from an unknown type), or an unencodable value."""


# Markers of self-describing arrays; dataclass tags start above them.
_LIST, _TUPLE, _FROZENSET, _SET, _ENUM = 0, 1, 2, 3, 4
_FIRST_DATACLASS_TAG = 16

_encoders: dict[type, Encoder] = {}  # dataclass type -> obj -> [tag, ...]
_decoders: dict[int, Decoder] = {}  # tag -> [tag, ...] -> obj
_enum_tags: dict[type, int] = {}
_enum_decoders: dict[int, Decoder] = {}  # enum tag -> value -> member

_PLAIN = frozenset({str, int, float, bool, bytes, type(None)})


# == self-describing values (top level, untyped fields) ==========================================
def _encode_any(value: Any) -> Any:
    t = type(value)
    if t in _PLAIN:
        return value
    encoder = _encoders.get(t)
    if encoder is not None:
        return encoder(value)
    if t is list:
        return [_LIST, *map(_encode_any, value)]
    if t is tuple:
        return [_TUPLE, *map(_encode_any, value)]
    if t is dict:
        return {_hashable(_encode_any(k)): _encode_any(v) for k, v in value.items()}
    if t is frozenset:
        return [_FROZENSET, *map(_encode_any, value)]
    if t is set:
        return [_SET, *map(_encode_any, value)]
    if t in _enum_tags:
        return [_ENUM, _enum_tags[t], value.value]
    raise CodecError(f"cannot encode {t.__name__}: register it with register_dataclass / register_enum")


def _hashable(encoded: Any) -> Any:
    """An encoded dict key as a tuple where it is an array (msgpack packs both alike)."""
    return tuple(map(_hashable, encoded)) if isinstance(encoded, list) else encoded


def _decode_any(value: Any) -> Any:
    t = type(value)
    if t is tuple:  # every array, as the unpacker reads them
        head = value[0]
        if head >= _FIRST_DATACLASS_TAG:
            return _decoders[head](value)
        if head == _LIST:
            return [_decode_any(v) for v in value[1:]]
        if head == _TUPLE:
            return tuple(_decode_any(v) for v in value[1:])
        if head == _FROZENSET:
            return frozenset(_decode_any(v) for v in value[1:])
        if head == _SET:
            return {_decode_any(v) for v in value[1:]}
        if head == _ENUM:
            return _enum_decoders[value[1]](value[2])
        raise CodecError(f"unknown array marker {head!r}")
    if t is dict:
        return {_decode_any(k): _decode_any(v) for k, v in value.items()}
    return value


# == typed fields ==================================================================================
def _encode_dataclass(value: Any) -> Any:
    encoder = _encoders.get(type(value))
    if encoder is None:
        raise CodecError(f"cannot encode {type(value).__name__}: not a registered dataclass")
    return encoder(value)


def _decode_dataclass(value: Any) -> Any:
    return _decoders[value[0]](value)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _optional(encoder: Encoder | None, decoder: Decoder | None) -> tuple[Encoder | None, Decoder | None]:
    enc = None if encoder is None else (lambda v: None if v is None else encoder(v))
    dec = None if decoder is None else (lambda v: None if v is None else decoder(v))
    return enc, dec


def _field_codec(tp: Any) -> tuple[Encoder | None, Decoder | None]:
    """(encoder, decoder) for values of declared type `tp`; None where msgpack's own handling is exact."""
    if tp in _PLAIN:
        return None, None
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        members = {m.value: m for m in tp}
        # A StrEnum / IntEnum member is a str / int: msgpack packs it as its value already.
        encoder = None if issubclass(tp, str | int) else attrgetter("value")
        return encoder, members.__getitem__
    if _is_dataclass_type(tp):
        return _encode_dataclass, _decode_dataclass
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) < len(args):  # X | None
            inner = options[0] if len(options) == 1 else typing.Union[tuple(options)]  # noqa: UP007
            return _optional(*_field_codec(inner))
        if all(a in _PLAIN for a in options):
            return None, None
        if all(_is_dataclass_type(a) for a in options):  # e.g. Change: the tag says which
            return _encode_dataclass, _decode_dataclass
        return _encode_any, _decode_any
    if origin is tuple:
        return _tuple_codec(args)
    if origin is list:
        item_enc, item_dec = _item_codec(args)
        return _mapped(list, item_enc), _mapped(list, item_dec) or list
    if origin in (frozenset, set):
        item_enc, item_dec = _item_codec(args)
        return _mapped(list, item_enc) or list, _mapped(origin, item_dec) or origin  # msgpack has no sets
    if origin is dict and args:
        key_enc, key_dec = _field_codec(args[0])
        val_enc, val_dec = _field_codec(args[1])
        if key_enc is key_dec is val_enc is val_dec is None:
            return None, None
        return _dict_codec(key_enc or _identity, val_enc or _identity), _dict_codec(
            key_dec or _identity, val_dec or _identity
        )
    return _encode_any, _decode_any


def _identity(value: Any) -> Any:
    return value


def _item_codec(args: tuple[Any, ...]) -> tuple[Encoder | None, Decoder | None]:
    """The codec of a container's items (untyped containers: self-describing items)."""
    return _field_codec(args[0]) if args else (_encode_any, _decode_any)


def _mapped(
    container: Callable[[Any], Any], item: Callable[[Any], Any] | None
) -> Callable[[Any], Any] | None:
    """`item` applied to each element, collected into `container`; None where items need nothing."""
    if item is None:
        return None
    return lambda v: container(map(item, v))


def _dict_codec(key: Callable[[Any], Any], value: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda d: {key(k): value(v) for k, v in d.items()}


def _tuple_codec(args: tuple[Any, ...]) -> tuple[Encoder | None, Decoder | None]:
    if not args or (len(args) == 2 and args[1] is Ellipsis):  # tuple[X, ...]
        item_enc, item_dec = _item_codec(args)
        return _mapped(list, item_enc), _mapped(tuple, item_dec)
    codecs = [_field_codec(a) for a in args]  # tuple[X, Y]: one codec per position
    if all(e is None and d is None for e, d in codecs):
        return None, None
    encs = [e or _identity for e, _ in codecs]
    decs = [d or _identity for _, d in codecs]
    return (
        lambda v: [e(x) for e, x in zip(encs, v, strict=True)],
        lambda v: tuple(d(x) for d, x in zip(decs, v, strict=True)),
    )


# == registration ==================================================================================
def register_dataclass(cls: type[T], tag: int, *, memo: bool = False) -> type[T]:
    """Give dataclass `cls` the wire tag `tag` (>= 16, never reused) and build its codec; with
    `memo`, the encodings of the latest objects are kept (for a frozen class whose objects are
    shared, see _memoized)."""
    if not _is_dataclass_type(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    if tag < _FIRST_DATACLASS_TAG or tag in _decoders or cls in _encoders:
        raise ValueError(
            f"tag {tag} for {cls.__name__}: tags are >= {_FIRST_DATACLASS_TAG} and unique per type"
        )
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if any(not f.init for f in fields):
        raise TypeError(f"{cls.__name__}: fields with init=False cannot be decoded")
    hints = typing.get_type_hints(cls)
    codecs = [_field_codec(hints[f.name]) for f in fields]
    getter = attrgetter(*(f.name for f in fields)) if len(fields) > 1 else None
    name = fields[0].name if fields else ""
    to_encode = [(i + 1, e) for i, (e, _) in enumerate(codecs) if e is not None]  # +1: after the tag
    to_decode = [(i, d) for i, (_, d) in enumerate(codecs) if d is not None]

    def encode_one(obj: Any) -> list[Any]:
        if getter is not None:
            out = [tag, *getter(obj)]
        else:
            out = [tag, getattr(obj, name)] if name else [tag]
        for i, enc in to_encode:
            out[i] = enc(out[i])
        return out

    def decode_one(data: Any) -> Any:
        values = list(data[1:])
        for i, dec in to_decode:
            if i < len(values):  # older data may lack trailing fields: their defaults apply
                values[i] = dec(values[i])
        return cls(*values)

    _encoders[cls] = _memoized(encode_one) if memo else encode_one
    _decoders[tag] = decode_one
    # Job's shape (see _Alike): a plain first field, an encoded second one, plain ones after.
    plain = [e is None for e, _ in codecs]
    if len(fields) > 3 and plain[0] and not plain[1] and all(plain[2:]) and len(fields) - 2 < 16:
        head = msgpack.Packer().pack_array_header(len(fields) + 1) + msgpack.packb(tag)
        first, second, *rest = (f.name for f in fields)
        encode_second = codecs[1][0]
        assert encode_second is not None
        _alike[cls] = _Alike(head, attrgetter(first), attrgetter(second), encode_second, attrgetter(*rest))
    return cls


class _Alike(typing.NamedTuple):
    """How encode_many packs a batch of objects of a class shaped as Job: its first field (the id)
    and every field after the second go to msgpack as they are, the second (the groups) has an
    encoder. msgpack packs an array as its header and then its items, so an object's bytes are
    `head` (the header and the tag), its first field packed, its second field's encoding packed,
    and the rest packed as a tuple less that tuple's one-byte header (fewer than 16 items)."""

    head: bytes
    first: Callable[[Any], Any]
    second: Callable[[Any], Any]
    encode_second: Encoder
    rest: Callable[[Any], tuple[Any, ...]]


_alike: dict[type, _Alike] = {}
_AFTER_HEADER = itemgetter(slice(1, None))
_MEMO_MAX = 4096  # objects whose encoding one memo keeps; past that it starts afresh


def _memoized(encode_one: Encoder) -> Encoder:
    """`encode_one`, remembering the encoding of the latest objects by identity. For a class
    whose objects are shared (the dispatcher interns task groups), each job stored encodes its
    groups once per group, not once per job. The object is kept beside its encoding so that its
    id cannot be reused while the entry lives; the objects are frozen, so the encoding holds."""
    memo: dict[int, tuple[Any, Any]] = {}

    def encode_memo(obj: Any) -> Any:
        hit = memo.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        out = encode_one(obj)
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        memo[id(obj)] = (obj, out)
        return out

    return encode_memo


def register_enum(cls: type[enum.Enum], tag: int) -> None:
    """Give an enum a wire tag, so that it can travel in untyped places (top level, `object` fields)."""
    if cls in _enum_tags or tag in _enum_decoders:
        raise ValueError(f"enum tag {tag} for {cls.__name__}: tags are unique per type")
    members = {m.value: m for m in cls}
    _enum_tags[cls] = tag
    _enum_decoders[tag] = members.__getitem__


# Wire tags: stored data depends on them. Append only; never renumber or reuse one.
for _tag, _cls in {
    16: ResourceRequest,
    17: Requirement,
    18: NodeSelectorTerm,
    19: PreferredTerm,
    20: Toleration,
    21: AntiAffinity,
    22: TaskGroup,
    23: Job,
    24: TaskPlacement,
    25: Taint,
    26: Gpu,
    27: Node,
    28: NodeUsage,
    29: Resident,
    30: Unit,
    31: UnitBatch,
    32: Placement,
    33: Proposal,
    34: Diagnosis,
    35: Unschedulable,
    36: ProposalBatch,
    37: NodeUpserted,
    38: NodeRemoved,
    39: TaskBound,
    40: TaskReleased,
    # 41: AcceptedUnit with its placements, until 2026-11-24 (never stored; retired all the same)
    42: RejectedUnit,
    43: Eviction,
    44: BindReply,
    45: AcceptedUnit,
    46: QueueFloor,
    47: TaskUp,
}.items():
    register_dataclass(_cls, _tag, memo=_cls is TaskGroup)

for _tag, _enum_cls in {
    1: SelectorOp,
    2: JobKind,
    3: TaintEffect,
    4: NodeState,
    5: TaskState,
    6: JobState,
    7: GpuTopologyMode,
}.items():
    register_enum(_enum_cls, _tag)


# == public API ====================================================================================
def encode(obj: object) -> bytes:
    """`obj` (a registered dataclass, enum, or plain data holding them) as msgpack bytes."""
    try:
        return msgpack.packb(_encode_any(obj), use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, CodecError):
            raise
        raise CodecError(f"cannot encode {type(obj).__name__}: {exc}") from exc


def encode_many(objs: Sequence[object]) -> list[bytes]:
    """[encode(obj) for obj in objs], with one packer for them all: making a packer is about
    half of what packing a job costs (the store encodes every job submitted)."""
    pack = msgpack.Packer(use_bin_type=True).pack
    try:
        how = _alike.get(type(objs[0])) if objs else None
        if how is not None and list(map(type, objs)).count(type(objs[0])) == len(objs):
            return _encode_alike(objs, how, pack)
        return [pack(_encode_any(obj)) for obj in objs]
    except (TypeError, ValueError, OverflowError):
        # Rare: encode each again, so that the error is encode's own, naming what failed.
        return [encode(obj) for obj in objs]


def _encode_alike(objs: Sequence[Any], how: _Alike, pack: Callable[[Any], bytes]) -> list[bytes]:
    """encode_many's bytes for objects of one class shaped as Job (see _Alike), made by C maps: a
    submission's jobs share one groups tuple (the dispatcher interns them), whose encoding is
    packed once per distinct object in the call, and the rest is packed in C for each job."""
    seconds = list(map(how.second, objs))
    keys = list(map(id, seconds))  # the objects live while this runs
    packed = {key: pack(how.encode_second(v)) for key, v in dict(zip(keys, seconds, strict=True)).items()}
    return list(
        map(
            b"".join,
            zip(
                repeat(how.head),
                map(pack, map(how.first, objs)),
                map(packed.__getitem__, keys),
                map(_AFTER_HEADER, map(pack, map(how.rest, objs))),
            ),
        )
    )


def decode(data: bytes) -> object:
    """The object that `encode` turned into `data`; CodecError if the bytes do not decode."""
    try:
        return _decode_any(msgpack.unpackb(data, use_list=False, raw=False, strict_map_key=False))
    except CodecError:
        raise
    except (
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        msgpack.UnpackException,
    ) as exc:  # corrupt, unknown tag
        raise CodecError(f"cannot decode {len(data)} bytes: {type(exc).__name__}: {exc}") from exc


def _decode_as(data: bytes, cls: type[T]) -> T:
    obj = decode(data)
    if not isinstance(obj, cls):
        raise CodecError(f"expected an encoded {cls.__name__}, got {type(obj).__name__}")
    return obj


def encode_job(job: Job) -> bytes:
    return encode(job)


def decode_job(data: bytes) -> Job:
    return _decode_as(data, Job)


def encode_node(node: Node) -> bytes:
    return encode(node)


def decode_node(data: bytes) -> Node:
    return _decode_as(data, Node)
