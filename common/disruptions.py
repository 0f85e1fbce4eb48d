"""The tasks of each job with a disruption_budget that are down through a disruption: evicted, or
lost with their node (a failed task run again leaves its node as a lost one), until they run
again: bound is not enough, their agent must report the process started. A job's budget counts
them, as a Kubernetes PodDisruptionBudget counts the pods unavailable until they are ready: a
preemption that would take more of its tasks down than the budget allows is refused, however
many preemptions came before, and however long the tasks taken take to start again (an image
pull, a slow node).

The binder keeps the truth (binder/state.py, rebuilt from the store at a restart: a preempted
row, or a pending or bound one past its first attempt); each shard keeps its view's from the
binder's changes (common/changes.py): the binder follows each release that takes a counted task
down (a DOWN_REASON) with a TaskReleased(task, DOWN) note, as a resync's snapshot names the tasks
down (bound again or not: the note releases nothing); a TaskUp brings a task up once it runs,
and any other release of it (it ended, its job was cancelled) ends it. The notes, not the
shard's view, tell: a plan of the shard's own in flight may hold the task in the view, or not,
whatever the binder did."""

from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet

# TaskReleased reasons that take a task down (the others end it, or were never a disruption).
DOWN_REASONS = frozenset({"preempted", "lost"})
# The reason of the binder's note that a task is down (after its release, or in a snapshot): it
# holds nothing, its job's budget counts it.
DOWN = "down"
_NONE: frozenset[str] = frozenset()


class DownTasks:
    """Per job, its tasks down through a disruption (only jobs with a budget are entered)."""

    __slots__ = ("_by_job", "_job_of")

    def __init__(self) -> None:
        self._by_job: dict[str, set[str]] = {}
        self._job_of: dict[str, str] = {}

    def __bool__(self) -> bool:
        return bool(self._job_of)

    def __len__(self) -> int:
        return len(self._job_of)

    def add(self, job_id: str, task_id: str) -> None:
        self._by_job.setdefault(job_id, set()).add(task_id)
        self._job_of[task_id] = job_id

    def discard_many(self, task_ids: Iterable[str]) -> None:
        """These tasks are up again (bound): they count no more."""
        job_of, by_job = self._job_of, self._by_job
        for tid in task_ids:
            job_id = job_of.pop(tid, None)
            if job_id is not None:
                tasks = by_job[job_id]
                tasks.discard(tid)
                if not tasks:
                    del by_job[job_id]

    def count(self, job_id: str) -> int:
        tasks = self._by_job.get(job_id)
        return len(tasks) if tasks else 0

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._job_of

    def tasks_of(self, job_id: str) -> AbstractSet[str]:
        """The job's tasks down, unordered (not to be changed)."""
        return self._by_job.get(job_id, _NONE)

    def of_job(self, job_id: str) -> list[str]:
        return sorted(self._by_job.get(job_id, ()))

    def items(self) -> Iterator[tuple[str, str]]:
        """(job id, task id) of every task down, in a stable order."""
        for job_id in sorted(self._by_job):
            for tid in sorted(self._by_job[job_id]):
                yield job_id, tid
