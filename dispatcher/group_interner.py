"""One shared TaskGroup object per distinct group among the jobs the dispatcher holds.

Jobs submitted through the API arrive with their own group objects even when thousands ask for
exactly the same thing. Sharing one object per distinct group keeps the pending queue smaller, and
a batch of units pickles each shared group once (pickle's memo) instead of once per unit.

Jobs that arrive in one pickled batch (a client's submit_many through Ray) share their groups
tuple already, so `groups` remembers the latest tuples it was given by identity: a batch of alike
jobs hashes its groups once, not once per job, and their replica total is summed once too.
"""

from gosched.common.fast_pickle import replaced
from gosched.common.job import Job, TaskGroup

MAX_GROUPS = 65_536  # distinct groups remembered; past that the table starts afresh
MAX_SEEN = 256  # groups tuples remembered by identity; past that the memo starts afresh

Groups = tuple[TaskGroup, ...]


class GroupInterner:
    def __init__(self, max_groups: int = MAX_GROUPS) -> None:
        self.max_groups = max_groups
        self._groups: dict[TaskGroup, TaskGroup] = {}
        # id(tuple given) -> (that tuple, its interned tuple, its replica total). The tuple given is
        # kept in the entry, so that its id cannot be reused while the entry lives.
        self._seen: dict[int, tuple[Groups, Groups, int]] = {}

    def intern(self, job: Job) -> Job:
        """`job`, its groups replaced by the shared equal ones (the same job if all already are)."""
        groups, _ = self.groups(job.groups)
        return job if groups is job.groups else replaced(job, groups=groups)

    def groups(self, groups: Groups) -> tuple[Groups, int]:
        """(`groups` with each replaced by the shared equal one, the sum of their replicas); the
        tuple given when all of its groups already are the shared ones."""
        hit = self._seen.get(id(groups))
        if hit is not None and hit[0] is groups:
            return hit[1], hit[2]
        table = self._groups
        if len(table) + len(groups) > self.max_groups:
            table.clear()
            self._seen.clear()  # its interned tuples would keep the old objects in use
        shared = tuple(table.setdefault(g, g) for g in groups)
        if all(a is b for a, b in zip(shared, groups, strict=True)):
            shared = groups
        total = sum(g.replicas for g in shared)
        if type(groups) is tuple:  # what is remembered by identity must not change (a list could)
            seen = self._seen
            if len(seen) >= MAX_SEEN:
                seen.clear()
            seen[id(groups)] = (groups, shared, total)
        return shared, total

    def __len__(self) -> int:
        return len(self._groups)
