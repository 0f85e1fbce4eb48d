"""The shared error types pickle with their fields: raised in a Ray actor, they reach the caller
as themselves (the Ray path itself is in test_ray_runtime.py)."""

import pickle

import pytest

from gosched.common.errors import AdmissionRejected, AlreadyStored, SpecError


@pytest.mark.parametrize(
    ("error", "fields"),
    [
        (SpecError("id", "job id 'a' already exists"), ("field", "reason")),
        (AlreadyStored("submission_id", "submission s1 is stored"), ("field", "reason")),
        (AdmissionRejected("rate limit", retry_after_s=1.5), ("reason", "retry_after_s")),
    ],
)
def test_an_error_pickles_with_its_fields(error: Exception, fields: tuple[str, ...]) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    assert [getattr(back, f) for f in fields] == [getattr(error, f) for f in fields]
