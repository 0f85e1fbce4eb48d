"""Whether a binder reply's evictions made room that a parked job could use.

A preemption swaps tasks: the victims leave a node and the preemptor takes their place. The room
freed is the victims' requests less the preemptor's, on that node; the shard chose the fewest and
least important victims that let the preemptor fit, so usually nothing is left over, and waking
every parked job for such a swap makes them all search for room and victims again for nothing
(on a GPU cluster with mixed priorities that was most of the shards' work). Room is made when a
placement's victims ask for more than it does in some resource (CPU, memory, whole GPUs, GPU
milli, an extended resource), or by an eviction that no accepted placement of the reply claimed
(a gang broken below its min_member, or one the dispatcher cannot attribute). A dormant job is
still retried periodically, so a case this misses delays it; it cannot strand it.
"""

from collections.abc import Mapping, Sequence

from gosched.common.job import split_task_id
from gosched.common.messages import Eviction
from gosched.common.resources import ResourceRequest
from gosched.dispatcher.records import JobRecord
from gosched.dispatcher.verdicts import AcceptedRow


def _request(jobs: Mapping[str, JobRecord], tid: str) -> ResourceRequest | None:
    job_id, index = split_task_id(tid)
    rec = jobs.get(job_id)
    return None if rec is None else rec.job.group_of(index).resources


def _exceeds(freed: list[ResourceRequest], taker: ResourceRequest) -> bool:
    """Whether the freed requests together exceed the taker's in any resource."""
    if sum(r.cpu_milli for r in freed) > taker.cpu_milli:
        return True
    if sum(r.memory for r in freed) > taker.memory:
        return True
    if sum(r.gpus for r in freed) > taker.gpus:
        return True
    if sum(r.gpu_total_milli for r in freed) > taker.gpu_total_milli:
        return True
    took = taker.extended_dict()
    ext: dict[str, int] = {}
    for r in freed:
        for name, amount in r.extended:
            ext[name] = ext.get(name, 0) + amount
    return any(amount > took.get(name, 0) for name, amount in ext.items())


def evictions_made_room(
    accepted: Sequence[AcceptedRow], evictions: Sequence[Eviction], jobs: Mapping[str, JobRecord]
) -> bool:
    """True if a reply's evictions may have left room beyond what their preemptors (its accepted
    units, as rows) took."""
    evicted = {ev.task_id for ev in evictions}
    if not evicted:
        return False
    claimed: set[str] = set()
    for job_id, _, indexes, _, victims_of in accepted:
        rec = jobs.get(job_id)
        for index, victims in zip(indexes, victims_of, strict=False):  # victims: () if none
            if not victims:
                continue
            if rec is None:
                return True  # the preemptor's job is gone: its room is free again
            gone = [v for v in victims if v in evicted]
            freed = [_request(jobs, v) for v in gone]
            known = [r for r in freed if r is not None]
            if len(known) < len(freed) or _exceeds(known, rec.job.group_of(index).resources):
                return True
            claimed.update(gone)
    return len(claimed) < len(evicted)
