"""One shared TaskGroup object per distinct group among the jobs the dispatcher holds.

Jobs submitted through the API arrive with their own group objects even when thousands ask for
exactly the same thing. Sharing one object per distinct group keeps the pending queue smaller, and
a batch of units pickles each shared group once (pickle's memo) instead of once per unit.
"""

from gosched.common.fast_pickle import replaced
from gosched.common.job import Job, TaskGroup

MAX_GROUPS = 65_536  # distinct groups remembered; past that the table starts afresh


class GroupInterner:
    def __init__(self, max_groups: int = MAX_GROUPS) -> None:
        self.max_groups = max_groups
        self._groups: dict[TaskGroup, TaskGroup] = {}

    def intern(self, job: Job) -> Job:
        """`job`, its groups replaced by the shared equal ones (the same job if all already are)."""
        table = self._groups
        if len(table) + len(job.groups) > self.max_groups:
            table.clear()
        groups = tuple(table.setdefault(g, g) for g in job.groups)
        if all(a is b for a, b in zip(groups, job.groups, strict=True)):
            return job
        return replaced(job, groups=groups)

    def __len__(self) -> int:
        return len(self._groups)
