"""The shard's work per unit: SchedulerShard.schedule over N single-task SchedulingBasic units on
a view of 10,000 simulated nodes, in batches of 256, with no binder replies in between (each
unit's placement stays assumed, as between two rounds).

    python shard_harness.py N MODE
MODE 0 stops after the set-up (the view synced, the batches made), 1 schedules every batch.
Under callgrind (shard_callgrind.sh) the instructions per unit are (I(1) - I(0)) / N.
"""

import sys

from gosched.common.messages import NodeUpserted, Unit, UnitBatch
from gosched.runtime.simulation import basic_jobs, sim_nodes
from gosched.scheduler_shard.shard import SchedulerShard

BATCH = 256


def main(n: int, mode: int) -> None:
    shard = SchedulerShard(0, clock=lambda: 1_800_000_000.0)
    shard.sync([NodeUpserted(node) for node in sim_nodes(10_000)], version=1)
    jobs = basic_jobs(n)
    batches = [
        UnitBatch(0, [Unit(job, (0,), 1, 0, frozenset(), 1_800_000_000.0) for job in jobs[i : i + BATCH]])
        for i in range(0, n, BATCH)
    ]
    if mode == 0:
        return
    placed = 0
    for batch in batches:
        placed += sum(len(p.placements) for p in shard.schedule(batch).proposals)
    assert placed == n, f"placed {placed} of {n}"


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
