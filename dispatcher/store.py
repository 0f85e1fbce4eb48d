"""What the dispatcher needs from persistent storage, and an in-memory implementation of it.

`gosched.common.store.Store` (SQLite) fits `JobStore`; so does `MemoryStore`, which keeps the same
data in dicts (for embedding and tests). The dispatcher also runs with no store at all.
"""

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from gosched.common.errors import AlreadyStored
from gosched.common.job import Job, split_task_id
from gosched.common.states import TERMINAL, TaskState
from gosched.dispatcher.records import failure_line

# (task index, state, node name or None, GPU assignment)
TaskRow = tuple[int, TaskState, str | None, tuple[Any, ...]]


class JobStore(Protocol):
    def add_jobs(self, jobs: Sequence[Job]) -> object:
        """Persist new jobs, their tasks pending."""

    def find_submission(self, submission_id: str) -> str | None:
        """The id of the job stored under this submission id, if any."""

    def get_job(self, job_id: str) -> Job | None:
        """The stored job of this id, if any."""

    def set_task_states(
        self,
        updates: Sequence[tuple[str, TaskState]],
        *,
        reasons: Mapping[str, str] | None = None,
        retried: Sequence[str] = (),
        retry_at: Mapping[str, float] | None = None,
        failing: Sequence[str] = (),
        settled: Sequence[str] = (),
    ) -> object:
        """Persist task states, keyed by task id ("job/index"), why failed tasks failed
        (`reasons`, in their agents' words), the failed tasks run again (`retried`, counted), and
        by job id when their backoff ends (`retry_at`, unix time). `failing` marks failures about
        to be run again, before the binder takes their tasks off their nodes, and `settled` drops
        the marks of those it did not (see gosched.common.store.Store.set_task_states)."""

    def load_jobs(self, keep_finished: int | None = None) -> Sequence[tuple[Job, Sequence[TaskRow]]]:
        """Every stored job with its tasks, in submission order; of those whose every task has
        ended, only the newest `keep_finished` (None: all)."""

    def load_failures(self) -> Mapping[str, str]:
        """Per job id, its latest task failure: "task 3 failed: <reason>"."""

    def load_task_reasons(self) -> Mapping[str, str]:
        """Per task id, why its latest failure failed (tasks with one only)."""

    def load_retried(self) -> Mapping[str, int]:
        """Per task id, how many of its failures were run again (tasks with none left out)."""

    def load_retry_at(self, after: float) -> Mapping[str, float]:
        """Per job id, when its failed tasks' backoff ends, where that is after `after`."""


class MemoryStore:
    """A JobStore in dicts: same contract as the SQLite store, lost on exit."""

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.states: dict[str, list[TaskState]] = {}
        self.submissions: dict[str, str] = {}
        self.failures: dict[str, str] = {}
        self.reasons: dict[str, str] = {}
        self.retried: dict[str, int] = {}
        self.retry_at: dict[str, float] = {}
        self.calls: dict[str, int] = {"add_jobs": 0, "set_task_states": 0}

    def add_jobs(self, jobs: Sequence[Job]) -> None:
        self.calls["add_jobs"] += 1
        for job in jobs:
            if job.id in self.jobs:
                raise AlreadyStored("id", f"job {job.id} is already stored", job.id)
        for job in jobs:
            self.jobs[job.id] = job
            self.states[job.id] = [TaskState.PENDING] * job.total_replicas
            if job.submission_id:
                self.submissions[job.submission_id] = job.id

    def find_submission(self, submission_id: str) -> str | None:
        return self.submissions.get(submission_id)

    def get_job(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def set_task_states(
        self,
        updates: Sequence[tuple[str, TaskState]],
        *,
        reasons: Mapping[str, str] | None = None,
        retried: Sequence[str] = (),
        retry_at: Mapping[str, float] | None = None,
        failing: Sequence[str] = (),
        settled: Sequence[str] = (),
    ) -> None:
        # `failing` and `settled` are not kept: the binder's writes (the new attempt a mark is
        # settled by) are never in this store, so a restart on it has nothing to settle.
        self.calls["set_task_states"] += 1
        self.retry_at.update(retry_at or {})
        for tid in retried:
            self.retried[tid] = self.retried.get(tid, 0) + 1
        for tid, state in updates:
            job_id, index = split_task_id(tid)
            self.states[job_id][index] = state
        for tid, why in (reasons or {}).items():
            job_id, index = split_task_id(tid)
            self.failures[job_id] = failure_line(index, TaskState.FAILED, why)
            self.reasons[tid] = why

    def load_failures(self) -> dict[str, str]:
        return dict(self.failures)

    def load_task_reasons(self) -> dict[str, str]:
        return dict(self.reasons)

    def load_retried(self) -> dict[str, int]:
        return dict(self.retried)

    def load_retry_at(self, after: float) -> dict[str, float]:
        return {jid: at for jid, at in self.retry_at.items() if at > after}

    def load_jobs(self, keep_finished: int | None = None) -> list[tuple[Job, list[TaskRow]]]:
        jobs = list(self.jobs.values())
        if keep_finished is not None:
            finished = [job.id for job in jobs if all(s in TERMINAL for s in self.states[job.id])]
            skip = set(finished[: max(0, len(finished) - keep_finished)])
            jobs = [job for job in jobs if job.id not in skip]
        return [(job, [(i, s, None, ()) for i, s in enumerate(self.states[job.id])]) for job in jobs]
