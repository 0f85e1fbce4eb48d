"""Message types between the dispatcher, the shards and the binder.

They are plain dataclasses so that the same objects travel in one process (the pipeline) and,
serialised, between Ray actors. All traffic is batched: one message carries many units. Between
actors the batch messages (UnitBatch, ProposalBatch, BindReply, ChangeList) pickle their objects as
columns (fast_pickle.rows_of); the others reduce one by one (fast_pickle).
"""

import io
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from itertools import accumulate, repeat, starmap
from operator import attrgetter, is_, itemgetter
from typing import Any, Final, cast

from gosched.common.cluster_state import Resident
from gosched.common.fast_pickle import fast_pickle, objects_from, rows_of
from gosched.common.job import Job
from gosched.common.node import Node


# -- dispatcher -> shard -----------------------------------------------------------------------
@fast_pickle
@dataclass(frozen=True, slots=True)
class QueueFloor:
    """The usage a guaranteed queue keeps whatever other queues' preemptions do: the amounts at
    which its dominant share reaches its guarantee (None: the cluster has none of that resource, so
    it counts in no share). Evicting its tasks leaves it at or above this in some resource."""

    queue: str
    cpu_milli: int | None
    memory: int | None
    gpu_milli: int | None


Floor = tuple[int | None, int | None, int | None]  # a QueueFloor's amounts: cpu milli, memory, GPU milli


def floor_kept(use: Sequence[int], floor: Floor) -> bool:
    """`use` (cpu milli, memory, GPU milli) is at or above `floor` in some resource: the rule the
    shard's victim pricing and the binder's queue_floors stage both apply."""
    return any(f is not None and x >= f for x, f in zip(use, floor, strict=True))


@fast_pickle
@dataclass(slots=True)
class Unit:
    """One scheduling attempt of a job: place `task_indexes`, at least `min_needed` of them."""

    job: Job
    task_indexes: tuple[int, ...]
    min_needed: int
    attempt: int = 0
    # Queues over their guarantee whose preemptible tasks this unit may evict (capacity reclaim).
    reclaim_from: frozenset[str] = frozenset()
    dispatch_time: float = 0.0
    # The job's tasks holding resources when the unit was dispatched; min_needed counts on them.
    held: int = 0
    # The other guaranteed queues' floors: no eviction of this unit may take them below.
    floors: tuple[QueueFloor, ...] = ()
    # The priority its tasks keep once bound against preemptors of their queue, when above the
    # job's own: its effective priority when dispatched from a priority queue with aging. The
    # preemptor's own priority is compared with it, so aging protects a job that waited without
    # arming it; other queues' preemptors see the job's own priority (aging orders one queue).
    standing: int | None = None
    # (cpu milli, memory, GPU milli) its queue must shed: the unit's queue may evict its own
    # lower-priority tasks to stay within its max_share (QueueConfig.within_queue_preemption), and
    # the unit's victims of its queue, on the nodes it takes, must free at least this much. None:
    # nothing to shed (the usual unit).
    shed: tuple[int, int, int] | None = None


@dataclass(slots=True)
class UnitBatch:
    shard_id: int
    units: list[Unit]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # As columns (see fast_pickle.rows_of): the units' jobs as rows of Job fields, the rest of
        # each unit as a row.
        units = self.units
        unit_rows = rows_of(Unit, units)
        job_rows = None if unit_rows is None else rows_of(Job, [row[0] for row in unit_rows])
        if unit_rows is None or job_rows is None or type(self) is not UnitBatch:
            return type(self), (self.shard_id, units)
        # A unit with nothing to shed leaves its last field out, as the dispatcher's rows do.
        rests = [row[1:-1] if row[-1] is None else row[1:] for row in unit_rows]
        return _unit_batch, (self.shard_id, job_rows, rests)


def _unit_batch(shard_id: int, job_rows: list[tuple[Any, ...]], rests: list[tuple[Any, ...]]) -> UnitBatch:
    jobs = objects_from(Job, job_rows)
    return UnitBatch(shard_id, [Unit(job, *rest) for job, rest in zip(jobs, rests, strict=True)])


# A Unit's field values in order (what fast_pickle.rows_of(Unit) reads): job, task_indexes,
# min_needed, attempt, reclaim_from, dispatch_time, held, floors, standing, and shed only where
# there is one (the usual unit's row, and its bytes, are as they were before shedding came).
UnitRow = (
    tuple[Job, tuple[int, ...], int, int, frozenset[str], float, int, tuple[QueueFloor, ...], int | None]
    | tuple[
        Job,
        tuple[int, ...],
        int,
        int,
        frozenset[str],
        float,
        int,
        tuple[QueueFloor, ...],
        int | None,
        tuple[int, int, int],
    ]
)
ROW_DISPATCH_TIME: Final = 5  # the dispatch_time's place in a UnitRow
_JOB_OF_ROW = itemgetter(0)
_REST_OF_ROW = itemgetter(slice(1, None))


class UnitBatchRows:
    """A UnitBatch whose units are given as rows (UnitRow): packed as that batch is, byte for byte,
    so it comes back as the same UnitBatch; the dispatcher makes the rows and sends them without a
    Unit object per unit made only to be read back. `job_rows`: each unit's job as the tuple of
    its field values (fast_pickle.rows_of), where the caller keeps them; None in it, or none
    given: read from the jobs."""

    __slots__ = ("job_rows", "rows", "shard_id")

    def __init__(
        self, shard_id: int, rows: list[UnitRow], job_rows: list[tuple[Any, ...] | None] | None = None
    ) -> None:
        self.shard_id = shard_id
        self.rows = rows
        self.job_rows = job_rows

    def batch(self) -> UnitBatch:
        """The same batch as Unit objects."""
        return UnitBatch(self.shard_id, list(starmap(Unit, self.rows)))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        rows = self.rows
        kept = self.job_rows
        job_rows = (
            rows_of(Job, list(map(_JOB_OF_ROW, rows)))
            if kept is None or None in kept
            else cast(list[tuple[Any, ...]], kept)
        )
        if job_rows is None:  # a Job of a subclass: packed as its objects, as UnitBatch does
            return self.batch().__reduce__()
        return _unit_batch, (self.shard_id, job_rows, list(map(_REST_OF_ROW, rows)))


# -- shard -> binder ---------------------------------------------------------------------------
@fast_pickle
@dataclass(slots=True)
class Placement:
    task_index: int
    node: str
    gpus: tuple[tuple[int, int], ...] = ()  # (GPU index, milli) pairs
    victims: tuple[str, ...] = ()  # task ids to evict first (preemption)


@fast_pickle
@dataclass(slots=True)
class Proposal:
    job: Job
    placements: list[Placement]
    min_needed: int
    attempt: int = 0
    dispatch_time: float = 0.0
    held: int = 0  # as in Unit: the binder asks for more if some of them are gone since
    # The unit's floors (Unit.floors), sent with a plan that evicts: the binder checks them too.
    floors: tuple[QueueFloor, ...] = ()
    standing: int | None = None  # as in Unit: what the bound tasks' residents carry as priority


# Diagnosis reasons that busy nodes may lift once their tasks end, which the dispatcher reads (a
# reservation is worth holding only for them): the shard's resources_fit says "insufficient cpu"
# and the like of a busy node ("node too small for cpu" of one that never fits), and its gang check
# says GANG_APART_REASON of nodes that pass every filter alone.
BUSY_REASON_PREFIX = "insufficient "
GANG_APART_REASON = "gang does not fit together"
# Of a node the attempt did not count on because the shard's view still holds the task itself
# there: the binder released it since (preempted, lost, taken off for a retry; the dispatcher sends
# only tasks that hold nothing), and its room is most likely taken by what evicted it. Busy: the
# next view says what holds the room.
LEFT_NODE_REASON = f"{BUSY_REASON_PREFIX}room counted on where it just ran (this shard's view is behind)"
# Of a node that passes every filter yet did not take a task that stands alone (min_member 1, no
# gang): its GPUs did not make a set for the task (choose_gpus), else the placement failed there.
LONE_GPUS_REASON = f"{BUSY_REASON_PREFIX}GPUs free together for it"
LONE_UNPLACED_REASON = "passes every filter, yet the task was not placed there"


@fast_pickle
@dataclass(slots=True)
class Diagnosis:
    """Why a task fits nowhere: for each filter, how many nodes it was the first to rule out."""

    total_nodes: int
    ruled_out: dict[str, int] = field(default_factory=dict)
    note: str = ""

    def message(self) -> str:
        parts = ", ".join(
            f"{count:,} {reason}" for reason, count in sorted(self.ruled_out.items(), key=lambda kv: -kv[1])
        )
        text = f"0/{self.total_nodes:,} nodes fit"
        if parts:
            text += f": {parts}"
        if self.note:
            text += f" ({self.note})"
        return text


@fast_pickle
@dataclass(slots=True)
class Unschedulable:
    job_id: str
    task_indexes: tuple[int, ...]
    diagnosis: Diagnosis
    attempt: int = 0
    # The verdict is provisional: retry after the backoff even if nothing changes. Set when
    # preemption passed over victims only because they are the shard's own placements still
    # awaiting the binder (once answered they may be evicted), or a disruption budget refused on
    # counts the shard's plans at the binder may change.
    settling: bool = False


@dataclass(slots=True)
class ProposalBatch:
    shard_id: int
    seen_version: int
    proposals: list[Proposal]
    unschedulable: list[Unschedulable] = field(default_factory=list)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # As columns (see ProposalColumns): each field of the jobs, of the placements and of the
        # proposals' other fields as one column, a column holding one object throughout as that
        # object alone; every placement of the batch in one column, with a count per proposal.
        proposals = self.proposals
        rows = rows_of(Proposal, proposals)
        if rows is None or type(self) is not ProposalBatch:
            return type(self), (self.shard_id, self.seen_version, proposals, self.unschedulable)
        columns = list(zip(*rows, strict=True)) or [() for _ in _PROPOSAL_FIELDS]
        job_rows = rows_of(Job, list(columns[0]))
        placements = [p for ps in columns[1] for p in ps]
        placement_rows = rows_of(Placement, placements)
        if job_rows is None or placement_rows is None:
            return type(self), (self.shard_id, self.seen_version, proposals, self.unschedulable)
        # The usual proposal has one placement: no counts then.
        counts = None if len(placements) == len(proposals) and all(columns[1]) else list(map(len, columns[1]))
        return _proposal_batch, (
            self.shard_id,
            self.seen_version,
            len(proposals),
            counts,
            _folded(job_rows, len(_JOB_FIELDS)),
            _folded(placement_rows, len(_PLACEMENT_FIELDS)),
            list(map(_fold, columns[2:])),
            self.unschedulable,
        )


_PROPOSAL_FIELDS = fields(Proposal)
_JOB_FIELDS = fields(Job)
_PLACEMENT_FIELDS = fields(Placement)


def _fold(column: tuple[Any, ...]) -> tuple[Any, ...]:
    """`column`, or its first entry alone where every entry is that one object (identity, not
    equality: 0 == False == 0.0, and the pickled stream keeps which objects are shared)."""
    if len(column) > 1 and all(map(is_, column, repeat(column[0]))):
        return column[:1]
    return column


def _folded(rows: list[tuple[Any, ...]], width: int) -> list[tuple[Any, ...]]:
    return list(map(_fold, zip(*rows, strict=True))) if rows else [()] * width


def unfold(column: tuple[Any, ...], n: int) -> tuple[Any, ...]:
    """A column of a ProposalColumns as `n` entries."""
    return column * n if len(column) == 1 else column


def _rows(columns: list[tuple[Any, ...]], n: int) -> list[tuple[Any, ...]]:
    return list(zip(*(unfold(c, n) for c in columns), strict=True))


class ProposalColumns:
    """A ProposalBatch as it travels (ProposalBatch.__reduce__): `n` proposals whose jobs'
    fields, placements' fields (all the batch's placements, `counts` per proposal, or one each
    where None) and other fields (Proposal's fields after job and placements) come as columns in
    field order, a column of one entry standing for that entry in every row. The binder reads the
    usual batch from the columns, making none of its objects (unpack_proposals)."""

    __slots__ = ("counts", "jobs", "n", "placements", "rest", "seen_version", "shard_id", "unschedulable")

    def __init__(
        self,
        shard_id: int,
        seen_version: int,
        n: int,
        counts: list[int] | None,
        jobs: list[tuple[Any, ...]],
        placements: list[tuple[Any, ...]],
        rest: list[tuple[Any, ...]],
        unschedulable: list[Unschedulable],
    ) -> None:
        self.shard_id = shard_id
        self.seen_version = seen_version
        self.n = n
        self.counts = counts
        self.jobs = jobs
        self.placements = placements
        self.rest = rest
        self.unschedulable = unschedulable

    def batch(self) -> ProposalBatch:
        """The ProposalBatch these columns were packed from."""
        n = self.n
        counts = self.counts
        m = n if counts is None else sum(counts)
        jobs = objects_from(Job, _rows(self.jobs, n))
        placements = objects_from(Placement, _rows(self.placements, m))
        if counts is None:  # one placement per proposal
            lists = [[p] for p in placements]
        else:
            ends = list(accumulate(counts))
            lists = [placements[end - count : end] for count, end in zip(counts, ends, strict=True)]
        rest = (unfold(c, n) for c in self.rest)
        proposals = list(map(Proposal, jobs, lists, *rest))
        return ProposalBatch(self.shard_id, self.seen_version, proposals, self.unschedulable)


def _proposal_batch(*columns: Any) -> ProposalBatch:
    return ProposalColumns(*columns).batch()


class _ColumnsUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name == "_proposal_batch" and module == __name__:
            return ProposalColumns  # called with _proposal_batch's arguments: its columns kept
        return super().find_class(module, name)


def unpack_proposals(data: bytes) -> ProposalColumns | ProposalBatch:
    """wire.unpack of a packed ProposalBatch, its columns left as they came (ProposalColumns;
    .batch() makes the objects), or the batch itself where it was packed object by object."""
    got = _ColumnsUnpickler(io.BytesIO(data)).load()
    if not isinstance(got, ProposalColumns | ProposalBatch):
        raise TypeError(f"not a packed ProposalBatch: {type(got).__name__}")
    return got


# -- binder -> shards and dispatcher --------------------------------------------------------------
@fast_pickle
@dataclass(slots=True)
class NodeUpserted:
    node: Node


@fast_pickle
@dataclass(slots=True)
class NodeRemoved:
    name: str


@dataclass(slots=True)
class TaskBound:
    node: str
    resident: Resident

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Packed flat, the change and its resident in one: every binding is packed once into the
        # change log and unpacked by every shard, and one reduce instead of two is 40% quicker.
        if type(self) is not TaskBound or type(self.resident) is not Resident:
            return type(self), (self.node, self.resident)
        return _task_bound, (self.node, *_read_resident(self.resident))


_read_resident = attrgetter(*(f.name for f in fields(Resident)))


def _task_bound(node: str, *resident: Any) -> TaskBound:
    """A TaskBound packed flat (see TaskBound.__reduce__)."""
    return TaskBound(node, Resident(*resident))


@fast_pickle
@dataclass(slots=True)
class TaskReleased:
    task_id: str
    reason: str  # preempted | succeeded | failed | cancelled | lost


@fast_pickle
@dataclass(slots=True)
class TaskUp:
    """A task down through a disruption runs again (its agent reported its process started): its
    job's disruption budget counts it no more (common/disruptions.py). Holds nothing new."""

    task_id: str


Change = NodeUpserted | NodeRemoved | TaskBound | TaskReleased | TaskUp


class ChangeList(list[Change]):
    """Changes that pack their bindings as columns (see fast_pickle.rows_of); they come back as a
    plain list. Every binding reaches every shard, so this is the binder's most packed message."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        bound = [c for c in self if type(c) is TaskBound]
        rows = rows_of(Resident, [c.resident for c in bound])
        if rows is None:
            return list, (list(self),)
        nodes = [c.node for c in bound]
        # The other changes in place, the bindings as None where each one goes; only when mixed.
        others = None if len(bound) == len(self) else [None if type(c) is TaskBound else c for c in self]
        return _change_list, (nodes, rows, others)


def _change_list(
    nodes: list[str], rows: list[tuple[Any, ...]], others: list[Change | None] | None
) -> list[Change]:
    bound = list(map(TaskBound, nodes, objects_from(Resident, rows)))
    if others is None:
        return bound  # type: ignore[return-value]
    taken = iter(bound)
    return [next(taken) if c is None else c for c in others]


class TaskBoundRows:
    """TaskBound changes given as each one's node and its resident's field values in order (what
    fast_pickle.rows_of(Resident) reads): packed as a ChangeList of those changes is, so they come
    back as the same TaskBound objects, without reading every resident (the binder has the rows
    from making the records)."""

    __slots__ = ("nodes", "rows")

    def __init__(self, nodes: list[str], rows: list[tuple[Any, ...]]) -> None:
        self.nodes = nodes
        self.rows = rows

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _change_list, (self.nodes, self.rows, None)


@fast_pickle
@dataclass(slots=True)
class AcceptedUnit:
    """The binder bound these tasks of one proposal, in the proposal's order. The placements are
    not sent back (the shard that proposed them holds them); the dispatcher needs the task indexes
    and, to tell whether an eviction made room, the victims each bound task named."""

    job_id: str
    attempt: int  # the proposal's: a shard that holds a later attempt of the job tells them apart
    task_indexes: tuple[int, ...]
    bind_time: float
    victims: tuple[tuple[str, ...], ...] = ()  # one entry per task index, if any placement named victims

    @classmethod
    def of(
        cls, job_id: str, attempt: int, placements: Sequence[Placement], bind_time: float
    ) -> "AcceptedUnit":
        """The answer for `placements` of attempt `attempt`, all bound."""
        indexes = tuple([p.task_index for p in placements])
        victims = tuple([p.victims for p in placements]) if any(p.victims for p in placements) else ()
        return cls(job_id, attempt, indexes, bind_time, victims)


@fast_pickle
@dataclass(slots=True)
class RejectedUnit:
    job_id: str
    task_indexes: tuple[int, ...]
    reason: str
    stage: str  # the binder check stage that refused it


@fast_pickle
@dataclass(slots=True)
class Eviction:
    task_id: str
    job_id: str
    task_index: int
    preemptor: str  # job id of the unit that evicted it ("" for a gang break)


@dataclass(slots=True)
class BindReply:
    accepted: list[AcceptedUnit]
    rejected: list[RejectedUnit]
    evicted: list[Eviction]
    changes: list[Change]
    version: int
    resync: bool = False  # changes is a full snapshot: drop the cached view first
    shard_id: int = -1  # the shard whose batch this answers (-1: not from a shard's batch)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # The verdicts as rows (see fast_pickle.rows_of), the changes as a ChangeList.
        accepted, rejected, evicted, changes, *rest = _read_reply(self)
        rows = rows_of(AcceptedUnit, accepted)
        if rows is None or type(self) is not BindReply:
            return type(self), (accepted, rejected, evicted, changes, *rest)
        if type(changes) is not ChangeList:
            changes = ChangeList(changes)
        return _bind_reply, (rows, rejected, evicted, changes, *rest)


_read_reply = attrgetter(*(f.name for f in fields(BindReply)))


class BindReplyRows:
    """A BindReply without changes whose accepted units are given as their field values in order
    (what fast_pickle.rows_of(AcceptedUnit) reads): packed as that reply is, so it comes back as
    the same BindReply, without reading every unit (the binder has the rows from making them)."""

    __slots__ = ("accepted", "evicted", "rejected", "shard_id", "version")

    def __init__(
        self,
        accepted: list[tuple[Any, ...]],
        rejected: list[RejectedUnit],
        evicted: list[Eviction],
        version: int,
        shard_id: int,
    ) -> None:
        self.accepted = accepted
        self.rejected = rejected
        self.evicted = evicted
        self.version = version
        self.shard_id = shard_id

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        rest = (self.rejected, self.evicted, ChangeList(), self.version, False, self.shard_id)
        return _bind_reply, (self.accepted, *rest)


def _bind_reply(accepted: list[tuple[Any, ...]], *rest: Any) -> BindReply:
    return BindReply(objects_from(AcceptedUnit, accepted), *rest)
