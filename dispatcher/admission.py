"""Admission control: a global cap on pending jobs, a cap on each tenant's jobs not yet ended
(pending or running), and a token bucket per tenant.

`admit` either takes what a submission needs (all of it) or raises AdmissionRejected naming the
limit, the numbers and, for the bucket, when to retry; nothing is taken on a rejection. A caller
that may still refuse the jobs after admission (the dispatcher, when the store refuses them) calls
`check` first, which raises the same way and takes nothing, and `take` once the jobs are in.
"""

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from gosched.common.config import AdmissionConfig
from gosched.common.errors import AdmissionRejected


class TokenBucket:
    """`rate` tokens per second up to `burst`; starts full."""

    __slots__ = ("burst", "last", "rate", "tokens")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"token bucket needs rate > 0 and burst >= 1, got rate={rate} burst={burst}")
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.last = now

    def refill(self, now: float) -> float:
        if now > self.last:
            self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.rate)
            self.last = now
        return self.tokens

    def wait_for(self, n: int, now: float) -> float:
        """Seconds until `n` tokens are there (0: now); inf when n exceeds the burst."""
        if n > self.burst:
            return float("inf")
        have = self.refill(now)
        return 0.0 if have >= n else (n - have) / self.rate

    def take(self, n: int) -> None:
        self.tokens -= n


class AdmissionController:
    """Max pending jobs (global) and a token bucket per tenant (rate, burst from AdmissionConfig)."""

    def __init__(self, config: AdmissionConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def bucket(self, tenant: str) -> TokenBucket:
        b = self._buckets.get(tenant)
        if b is None:
            b = self._buckets[tenant] = TokenBucket(
                self.config.tenant_rate_per_s, self.config.tenant_burst, self.clock()
            )
        return b

    def admit(
        self, tenants: Iterable[str], pending_now: int, tenant_jobs: Mapping[str, int] | None = None
    ) -> None:
        """Admit one job per item of `tenants` (a tenant may repeat), all or none.

        `pending_now` is the number of jobs already admitted and not yet placed; `tenant_jobs`,
        per tenant, its jobs not yet ended (read by max_jobs_per_tenant; none if not given).
        """
        self.take(self.check(tenants, pending_now, tenant_jobs))

    def check(
        self, tenants: Iterable[str], pending_now: int, tenant_jobs: Mapping[str, int] | None = None
    ) -> Counter[str]:
        """As `admit`, but take nothing: raise AdmissionRejected, or return the tokens per tenant
        for `take`, which must come before any other check or admit (they are there until then)."""
        need = Counter(tenants)
        total = sum(need.values())
        if not total:
            return need
        limit = self.config.max_pending_jobs
        if pending_now + total > limit:
            raise AdmissionRejected(
                f"max pending jobs: {pending_now:,} pending + {total:,} submitted "
                f"exceeds the limit of {limit:,}"
            )
        per_tenant = self.config.max_jobs_per_tenant
        if per_tenant is not None:
            for tenant, n in need.items():
                have = 0 if tenant_jobs is None else tenant_jobs.get(tenant, 0)
                if have + n > per_tenant:
                    raise AdmissionRejected(
                        f"tenant {tenant!r} job limit: {have:,} job(s) not yet ended + {n:,} "
                        f"submitted exceeds max_jobs_per_tenant {per_tenant:,}; retry as its jobs end"
                    )
        now = self.clock()
        for tenant, n in need.items():
            b = self.bucket(tenant)
            wait = b.wait_for(n, now)
            if wait == float("inf"):
                raise AdmissionRejected(
                    f"tenant {tenant!r} rate limit: {n:,} jobs in one submission exceed "
                    f"the burst of {b.burst:,}; submit them in smaller batches"
                )
            if wait > 0:
                raise AdmissionRejected(
                    f"tenant {tenant!r} rate limit: needs {n:,} token(s), has {b.tokens:.2f} "
                    f"(rate {b.rate:g}/s, burst {b.burst:,}); retry after {wait:.3f}s",
                    retry_after_s=wait,
                )
        return need

    def take(self, need: Counter[str]) -> None:
        """Take the tokens `check` found there."""
        for tenant, n in need.items():
            self.bucket(tenant).take(n)
