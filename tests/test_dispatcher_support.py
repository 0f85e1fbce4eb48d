"""Helpers shared by the dispatcher tests (this module holds no tests itself)."""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gosched.common.config import AdmissionConfig, QueueConfig, Settings
from gosched.common.job import Job
from gosched.common.messages import (
    AcceptedUnit,
    BindReply,
    Diagnosis,
    Eviction,
    Placement,
    RejectedUnit,
    Unit,
    UnitBatch,
    Unschedulable,
)
from gosched.dispatcher import Dispatcher
from gosched.dispatcher.store import JobStore

CPU = 1000  # milli per core
GI = 1024**3


@dataclass
class Entry:
    """What a policy queue holds, as the dispatcher's JobRecord offers it: the job and its order."""

    job: Job
    seq: int

    @property
    def job_id(self) -> str:
        return self.job.id


def entries(*jobs: Job) -> list[Entry]:
    return [Entry(j, seq) for seq, j in enumerate(jobs)]


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def settings(
    *queues: QueueConfig,
    shards: int = 2,
    batch_size: int = 512,
    backoff: float = 0.05,
    backoff_max: float = 5.0,
    periodic: float | None = None,
    admission: AdmissionConfig | None = None,
    end_missed_deadlines: bool = True,
) -> Settings:
    return Settings(
        end_missed_deadlines=end_missed_deadlines,
        shards=shards,
        batch_size=batch_size,
        queues=list(queues) or [QueueConfig(name="default")],
        retry_backoff_s=backoff,
        retry_backoff_max_s=backoff_max,
        **({} if periodic is None else {"unschedulable_retry_s": periodic}),
        admission=admission or AdmissionConfig(),
    )


def dispatcher(
    *queues: QueueConfig, clock: Clock | None = None, store: JobStore | None = None, **kw: object
) -> tuple[Dispatcher, Clock]:
    clock = clock or Clock()
    return Dispatcher(settings(*queues, **kw), store=store, clock=clock), clock  # type: ignore[arg-type]


def units(batches: Sequence[UnitBatch]) -> list[Unit]:
    return [u for b in batches for u in b.units]


def job_ids(batches: Sequence[UnitBatch]) -> list[str]:
    """Dispatched job ids, batch by batch (in dispatch order when there is one shard)."""
    return [u.job.id for u in units(batches)]


def accept(us: Iterable[Unit], node: str = "n1") -> BindReply:
    """The binder accepts every task of every unit."""
    acc = [
        AcceptedUnit.of(u.job.id, u.attempt, [Placement(i, node) for i in u.task_indexes], 0.0) for u in us
    ]
    return BindReply(acc, [], [], [], 1)


def accept_tasks(job_id: str, indexes: Iterable[int], node: str = "n1") -> BindReply:
    return BindReply([AcceptedUnit.of(job_id, 0, [Placement(i, node) for i in indexes], 0.0)], [], [], [], 1)


def reject(
    us: Iterable[Unit], reason: str = "node full", stage: str = "resources", *, shard: int = -1
) -> BindReply:
    """The binder refuses every unit (of the batch of `shard`, if given)."""
    rejected = [RejectedUnit(u.job.id, u.task_indexes, reason, stage) for u in us]
    return BindReply([], rejected, [], [], 1, shard_id=shard)


def evict(*victims: tuple[str, int], preemptor: str = "p") -> BindReply:
    return BindReply([], [], [Eviction(f"{j}/{i}", j, i, preemptor) for j, i in victims], [], 1)


def unschedulable(
    u: Unit, indexes: Iterable[int] | None = None, note: str = "", *, settling: bool = False
) -> Unschedulable:
    diag = Diagnosis(total_nodes=10, ruled_out={"resources_fit": 7, "gpu_model": 3}, note=note)
    chosen = tuple(u.task_indexes if indexes is None else indexes)
    return Unschedulable(u.job.id, chosen, diag, u.attempt, settling)


def drain(d: Dispatcher, rounds: int = 1000) -> list[Unit]:
    """Dispatch and accept everything dispatchable; returns the units in dispatch order."""
    out: list[Unit] = []
    for _ in range(rounds):
        us = units(d.next_batches())
        if not us:
            break
        out.extend(us)
        d.on_reply(accept(us))
    return out
