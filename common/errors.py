"""Error types shared by components.

Each pickles with its own fields (`__reduce__`): raised inside a Ray actor, it travels back to the
caller as itself. Pickle's default rebuilds an exception from `args` (the one message), which
these constructors do not take, and Ray then hands the caller an unreadable dump instead.
"""

from typing import Any


class SpecError(ValueError):
    """A job or node spec from outside is invalid; `field` names the offending field."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), (self.field, self.reason)


class AlreadyStored(ValueError):
    """A job id (or submission id) given to a store is there already; `field` says which."""

    def __init__(self, field: str, reason: str, job_id: str = "") -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason
        self.job_id = job_id  # the job that clashed, where known (a batch's error names its place)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), (self.field, self.reason, self.job_id)


class QuantityError(ValueError):
    """A resource quantity string could not be parsed."""


class IllegalTransition(RuntimeError):
    """A task was asked to move between two states that have no legal edge."""


class AdmissionRejected(RuntimeError):
    """Admission control refused a submission; the job was not stored."""

    def __init__(self, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), (self.reason, self.retry_after_s)
