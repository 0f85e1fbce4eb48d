"""Deadlines as Slurm's --deadline has them: a job that could no longer end by its deadline is not
started; it is cancelled instead.

The latest start that ends by the deadline is the deadline less the job's time_limit (the deadline
itself for a job without one). A job found past it while it holds resources or has a unit in
flight has started, or may be starting: it is left alone, and looked at again when it waits once
more (lost, preempted, failed and retried, or refused) or stops holding any, which
`waits_again` tells.
"""

import heapq

from gosched.common.job import Job
from gosched.common.spec import format_duration, format_moment


def start_by(job: Job) -> float:
    """The latest start that ends `job` (which has a deadline) by its deadline, in unix time."""
    assert job.deadline is not None
    return job.deadline - (job.time_limit or 0.0)


def _span(seconds: float) -> str:
    """A time to come, to the second, or to the tenth below one."""
    return format_duration(round(seconds) if seconds >= 1 else max(0.1, round(seconds, 1)))


def _limit(job: Job) -> str:
    return f"its time_limit of {format_duration(job.time_limit)}" if job.time_limit else "no time_limit"


def too_late(job: Job, now: float) -> str | None:
    """Why `job` could not end by its deadline if it started `now`, or None if it could."""
    if job.deadline is None or start_by(job) > now:
        return None
    if job.deadline <= now:
        return f"job {job.id}: its deadline {format_moment(job.deadline)} has passed"
    left = _span(job.deadline - now)
    return (
        f"job {job.id}: {_limit(job)}, from now, would run past its deadline {format_moment(job.deadline)} "
        f"({left} away): it could not end by it"
    )


def missed_note(job: Job) -> str:
    """What explain tells of a job cancelled for its deadline."""
    assert job.deadline is not None
    at, deadline, limit = format_moment(start_by(job)), format_moment(job.deadline), _limit(job)
    return f"cancelled: not started by {at}, the latest start that ends by its deadline {deadline} ({limit})"


def start_by_note(job: Job, now: float) -> str:
    """What explain tells of a job with a deadline that has not started."""
    assert job.deadline is not None
    at = start_by(job)
    if at <= now:
        deadline = format_moment(job.deadline)
        return f"past the latest start that ends by its deadline {deadline}: cancelled at the next round"
    return (
        f"cancelled unless it starts within {_span(at - now)} "
        f"(by {format_moment(at)}: its deadline {format_moment(job.deadline)}, {_limit(job)})"
    )


class DeadlineWatch:
    """The jobs with a deadline, by their latest start; `due` says which to look at now."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []  # (latest start, job seq, job id)
        # Past their latest start when they held resources or were in flight: looked at again
        # when they wait again (the dispatcher's _enqueue and _park test this set).
        self.late: set[str] = set()
        self._returned: list[str] = []

    def watch(self, job: Job, seq: int) -> None:
        heapq.heappush(self._heap, (start_by(job), seq, job.id))

    def keep_late(self, job_id: str) -> None:
        self.late.add(job_id)

    def waits_again(self, job_id: str) -> None:
        """`job_id` waits again (queued or parked) or holds nothing any more: if it is late,
        `due` gives it at its next call. A test of the empty set, for every job, otherwise."""
        late = self.late
        if late and job_id in late:
            late.discard(job_id)
            self._returned.append(job_id)

    def due(self, now: float) -> list[str]:
        """The jobs past their latest start since the last call, and the late ones returned."""
        heap = self._heap
        out = self._returned
        self._returned = []
        while heap and heap[0][0] <= now:
            out.append(heapq.heappop(heap)[2])
        return out

    def __len__(self) -> int:
        return len(self._heap) + len(self.late) + len(self._returned)
