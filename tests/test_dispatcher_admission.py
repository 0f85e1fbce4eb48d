"""Admission: max pending jobs, per-tenant token bucket, nothing stored on rejection, idempotency."""

from dataclasses import replace

import pytest

from gosched.common.config import AdmissionConfig
from gosched.common.errors import AdmissionRejected, SpecError
from gosched.common.spec import generated_job_id
from gosched.dispatcher.admission import AdmissionController, TokenBucket
from gosched.dispatcher.store import MemoryStore
from tests.builders import make_job
from tests.test_dispatcher_support import Clock, accept, dispatcher, units


def job(job_id: str, tenant: str = "t", submission: str = ""):
    return replace(make_job(job_id).cpu("1").tenant(tenant).build(), submission_id=submission)


def limits(max_pending: int = 1_000_000, rate: float = 100_000.0, burst: int = 1_000_000) -> AdmissionConfig:
    return AdmissionConfig(max_pending_jobs=max_pending, tenant_rate_per_s=rate, tenant_burst=burst)


# -- max pending -------------------------------------------------------------------------------------
def test_max_pending_jobs_rejects_with_the_numbers_and_frees_up_once_placed():
    d, _ = dispatcher(admission=limits(max_pending=3))
    d.submit_many([job("a"), job("b")])
    d.submit(job("c"))
    with pytest.raises(AdmissionRejected) as err:
        d.submit(job("d"))
    assert err.value.reason == "max pending jobs: 3 pending + 1 submitted exceeds the limit of 3"
    assert err.value.retry_after_s is None
    assert "d" not in d

    us = units(d.next_batches())
    with pytest.raises(AdmissionRejected):  # in flight still counts as pending
        d.submit(job("d"))
    d.on_reply(accept(us))
    d.submit(job("d"))  # placed jobs no longer count
    assert d.pending_count() == 1


def test_a_batch_over_the_pending_limit_is_rejected_whole():
    store = MemoryStore()
    d, _ = dispatcher(admission=limits(max_pending=4), store=store)
    d.submit(job("a"))
    with pytest.raises(AdmissionRejected, match=r"1 pending \+ 4 submitted exceeds the limit of 4"):
        d.submit_many([job(f"b{i}") for i in range(4)])
    assert list(store.jobs) == ["a"]
    assert d.pending_count() == 1


# -- token bucket --------------------------------------------------------------------------------------
def test_token_bucket_per_tenant_with_a_fake_clock():
    d, clock = dispatcher(admission=limits(rate=2.0, burst=3))
    d.submit_many([job("a1"), job("a2"), job("a3")])  # the burst
    with pytest.raises(AdmissionRejected) as err:
        d.submit(job("a4"))
    assert err.value.retry_after_s == pytest.approx(0.5)
    expected = "tenant 't' rate limit: needs 1 token(s), has 0.00 (rate 2/s, burst 3); retry after 0.500s"
    assert str(err.value) == expected
    d.submit(job("other", tenant="u"))  # another tenant has its own bucket
    clock.advance(0.25)
    with pytest.raises(AdmissionRejected) as err:
        d.submit(job("a4"))
    assert err.value.retry_after_s == pytest.approx(0.25)
    clock.advance(0.25)
    d.submit(job("a4"))
    clock.advance(100.0)  # refills only up to the burst
    d.submit_many([job("a5"), job("a6"), job("a7")])
    with pytest.raises(AdmissionRejected):
        d.submit(job("a8"))


def test_a_batch_larger_than_the_burst_can_never_pass():
    d, _ = dispatcher(admission=limits(rate=10.0, burst=2))
    with pytest.raises(AdmissionRejected) as err:
        d.submit_many([job("a"), job("b"), job("c")])
    assert "3 jobs in one submission exceed the burst of 2" in err.value.reason
    assert err.value.retry_after_s is None
    d.submit_many([job("a"), job("b")])  # nothing was taken by the rejected batch


@pytest.mark.parametrize(
    ("rate", "burst", "takes", "elapsed", "n", "wait"),
    [
        (1.0, 5, 5, 0.0, 1, 1.0),
        (1.0, 5, 5, 0.5, 1, 0.5),
        (4.0, 5, 3, 0.0, 2, 0.0),
        (4.0, 5, 5, 10.0, 5, 0.0),
        (4.0, 5, 5, 10.0, 6, float("inf")),
        (10.0, 1, 1, 0.05, 1, 0.05),
    ],
)
def test_token_bucket_wait(rate, burst, takes, elapsed, n, wait):
    b = TokenBucket(rate, burst, now=0.0)
    b.take(takes)
    assert b.wait_for(n, now=elapsed) == pytest.approx(wait)


def test_admission_controller_checks_all_tenants_before_taking():
    clock = Clock(0.0)
    ac = AdmissionController(limits(rate=1.0, burst=2), clock)
    with pytest.raises(AdmissionRejected, match="tenant 'y'"):
        ac.admit(["x", "y", "y", "y"], pending_now=0)
    assert ac.bucket("x").tokens == 2.0  # x was not charged for the rejected batch
    ac.admit(["x", "y"], pending_now=0)
    assert (ac.bucket("x").tokens, ac.bucket("y").tokens) == (1.0, 1.0)


# -- rejected jobs are not stored --------------------------------------------------------------------------
def test_rejected_job_is_not_stored():
    store = MemoryStore()
    d, _ = dispatcher(admission=limits(rate=1.0, burst=1), store=store)
    d.submit(job("a", submission="s-a"))
    with pytest.raises(AdmissionRejected):
        d.submit(job("b", submission="s-b"))
    assert list(store.jobs) == ["a"]
    assert store.find_submission("s-b") is None
    assert "b" not in d
    assert store.calls["add_jobs"] == 1


def test_rejected_job_is_not_stored_in_sqlite(tmp_path):
    store_mod = pytest.importorskip("gosched.common.store")
    store = store_mod.Store(str(tmp_path / "gosched.db"))
    d, _ = dispatcher(admission=limits(max_pending=1), store=store)
    d.submit(job("a", submission="s-a"))
    with pytest.raises(AdmissionRejected):
        d.submit(job("b", submission="s-b"))
    assert store.find_submission("s-a") == "a"
    assert store.find_submission("s-b") is None
    assert [j.id for j, _ in store.load_jobs()] == ["a"]


def test_invalid_job_in_a_batch_stores_nothing():
    store = MemoryStore()
    d, _ = dispatcher(store=store)
    bad = make_job("bad").queue("nope").build()
    with pytest.raises(SpecError):
        d.submit_many([job("a"), bad])
    assert store.jobs == {} and "a" not in d


# -- idempotency -------------------------------------------------------------------------------------------
def test_same_submission_id_returns_the_existing_job():
    store = MemoryStore()
    d, _ = dispatcher(store=store, admission=limits(rate=1.0, burst=1))
    assert d.submit(job("a", submission="s1")) == "a"
    # a retry (naming no id: the one generated for s1) is answered from memory without a token or a new row
    assert d.submit(job(generated_job_id("s1"), submission="s1")) == "a"
    assert list(store.jobs) == ["a"]
    assert d.pending_count() == 1


def test_duplicates_inside_one_batch():
    store = MemoryStore()
    d, _ = dispatcher(store=store)
    again = job(generated_job_id("s1"), submission="s1")  # names no id
    ids = d.submit_many([job("a", submission="s1"), job("b", submission="s2"), again])
    assert ids == ["a", "b", "a"]
    assert sorted(store.jobs) == ["a", "b"]


def test_submission_known_only_to_the_store():
    store = MemoryStore()
    d1, _ = dispatcher(store=store)
    d1.submit(job("a", submission="s1"))
    d2, _ = dispatcher(store=store)  # a new dispatcher that has not restored
    assert d2.submit(job(generated_job_id("s1"), submission="s1")) == "a"
    assert store.calls["add_jobs"] == 1


def test_submission_idempotency_with_sqlite(tmp_path):
    store_mod = pytest.importorskip("gosched.common.store")
    store = store_mod.Store(str(tmp_path / "gosched.db"))
    d1, _ = dispatcher(store=store)
    assert d1.submit(job("a", submission="s1")) == "a"
    d2, _ = dispatcher(store=store_mod.Store(str(tmp_path / "gosched.db")))
    assert d2.submit(job(generated_job_id("s1"), submission="s1")) == "a"
    assert [j.id for j, _ in store.load_jobs()] == ["a"]


def test_reused_job_id_without_matching_submission_is_a_spec_error():
    d, _ = dispatcher()
    d.submit(job("a"))
    with pytest.raises(SpecError) as err:
        d.submit(job("a"))
    assert err.value.field == "id"
    with pytest.raises(SpecError, match="job id 'x' is given to two jobs of this request") as err:
        d.submit_many([job("x"), job("y"), job("x")])
    assert err.value.field == "jobs[2].id"  # which job of the batch, not a job that exists
    with pytest.raises(SpecError) as err:
        d.submit_many([job("z"), job("a")])
    assert err.value.field == "jobs[1].id"
    assert "x" not in d and "z" not in d  # all or none
