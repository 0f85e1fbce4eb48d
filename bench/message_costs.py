"""`gosched bench --messages`: what the actors' messages cost to pack and unpack, per task.

With every component in its own Ray actor, each task crosses four messages (dispatcher -> shard
UnitBatch, shard -> binder ProposalBatch, binder -> shards changes, binder -> shard and dispatcher
verdicts), each packed once and unpacked by its reader. On a machine with many cores these costs
fall on the single dispatcher and binder, so they bound throughput however many shards run.
"""

import time
from dataclasses import dataclass

from gosched.common import wire
from gosched.common.cluster_state import Resident
from gosched.common.messages import (
    AcceptedUnit,
    BindReply,
    ChangeList,
    Placement,
    Proposal,
    ProposalBatch,
    TaskBound,
    Unit,
    UnitBatch,
)
from gosched.runtime.simulation import basic_jobs


@dataclass(frozen=True, slots=True)
class MessageCost:
    name: str
    bytes_per_task: float
    pack_us: float  # per task
    unpack_us: float  # per task

    def as_dict(self) -> dict[str, object]:
        return {
            "message": self.name,
            "bytes_per_task": self.bytes_per_task,
            "pack_us": self.pack_us,
            "unpack_us": self.unpack_us,
        }


def sample_messages(tasks: int) -> dict[str, object]:
    """One batch of each hot message for `tasks` single-task SchedulingBasic jobs."""
    jobs = basic_jobs(tasks)
    now = time.time()
    placements = [Placement(0, f"node-{i}") for i in range(tasks)]
    return {
        "units (dispatcher -> shard)": UnitBatch(0, [Unit(j, (0,), 1, 0, frozenset(), now) for j in jobs]),
        "proposals (shard -> binder)": ProposalBatch(
            0, 7, [Proposal(j, [p], 1, 0, now) for j, p in zip(jobs, placements, strict=True)]
        ),
        "changes (binder -> shards)": ChangeList(
            TaskBound(p.node, Resident.for_task(j, 0, (), now)) for j, p in zip(jobs, placements, strict=True)
        ),
        "verdicts (binder -> shard, dispatcher)": BindReply(
            [AcceptedUnit.of(j.id, 0, [p], now) for j, p in zip(jobs, placements, strict=True)], [], [], [], 9
        ),
    }


def measure(tasks: int = 512, repeat: int = 50) -> list[MessageCost]:
    """Per-task cost of each message, the best of `repeat` rounds (the least disturbed)."""
    out = []
    for name, message in sample_messages(tasks).items():
        pack = unpack = float("inf")
        data = b""
        for _ in range(repeat):
            t0 = time.perf_counter()
            data = wire.pack(message)
            t1 = time.perf_counter()
            back = wire.unpack(data)
            t2 = time.perf_counter()
            pack, unpack = min(pack, t1 - t0), min(unpack, t2 - t1)
        if back != message:
            raise AssertionError(f"{name}: the message did not survive the round trip")
        out.append(MessageCost(name, len(data) / tasks, pack / tasks * 1e6, unpack / tasks * 1e6))
    return out


def table(costs: list[MessageCost]) -> str:
    lines = [f"{'message':<40}{'bytes/task':>11}{'pack us':>9}{'unpack us':>11}"]
    for c in costs:
        lines.append(f"{c.name:<40}{c.bytes_per_task:>11.0f}{c.pack_us:>9.2f}{c.unpack_us:>11.2f}")
    lines.append(
        f"{'total':<40}{'':>11}{sum(c.pack_us for c in costs):>9.2f}{sum(c.unpack_us for c in costs):>11.2f}"
    )
    return "\n".join(lines)
