"""Resource usage per queue, per tenant and per (queue, tenant) pair, and shares of the cluster.

Usage is a vector over three resources (cpu milli, memory bytes, gpu milli). Each queue, each tenant
and each (queue, tenant) pair has two of them: `held` (tasks bound or running) and `inflight` (tasks
dispatched to a shard and not yet answered). Scheduling decisions use held + inflight, so that one
round of dispatching sees the units it has already handed out.

Queue totals serve the queues' guarantees and caps, tenant totals are a tenant's usage over the whole
cluster (metrics), and the pairs serve the tenant-fair queues (drf, fair): as in YARN's hierarchical
fair scheduling, they compare tenants by their usage within their own queue, so that a tenant's work
in another queue does not cost it its turn in this one. Listeners subscribe to one queue (or all).

The hot path updates one pair per unit, so the running sums are plain Python ints (a three-element
numpy in-place add costs ~8x a Python one), and one dict lookup on (queue, tenant) finds the pair's
row with its queue's row, its tenant's row (the very lists of the per-queue and per-tenant tables)
and its queue's listeners. Every read-out is a numpy vector, and the all-entities views (`shares`,
`matrix`) are computed with numpy in one go.
"""

import math
from collections.abc import Callable, Iterable
from typing import Literal

import numpy as np
import numpy.typing as npt

RESOURCES = ("cpu_milli", "memory", "gpu_milli")
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

Kind = Literal["queue", "tenant"]
Part = Literal["total", "held", "inflight"]
# A listener hears the tenant whose effective usage changed (in the queue it subscribed to), or None
# when every share changed (the cluster capacity was set).
Listener = Callable[[str | None], None]
# A (queue, tenant) pair: its row, its queue's row, its tenant's row, the listeners of its queue.
_Pair = tuple[list[int], list[int], list[int], list[Listener]]


class UsageTracker:
    """Held and in-flight usage per queue, per tenant and per (queue, tenant), against the cluster
    capacity."""

    __slots__ = (
        "_cap",
        "_everywhere",
        "_inv",
        "_listeners",
        "_n_res",
        "_pairs",
        "_queues",
        "_tenants",
        "_watch",
    )

    def __init__(self) -> None:
        self._cap: tuple[int, int, int] = (0, 0, 0)
        self._inv: tuple[float, float, float] = (0.0, 0.0, 0.0)
        self._n_res = 0
        # name -> [held cpu, held mem, held gpu, inflight cpu, inflight mem, inflight gpu]
        self._queues: dict[str, list[int]] = {}
        self._tenants: dict[str, list[int]] = {}
        self._pairs: dict[tuple[str, str], _Pair] = {}
        self._listeners: list[Listener] = []  # every listener once (told of capacity changes)
        self._everywhere: list[Listener] = []  # those that hear every queue
        self._watch: dict[str, list[Listener]] = {}  # queue -> its listeners (_everywhere ones too)

    # -- capacity ---------------------------------------------------------------------------------
    def set_capacity(self, cpu_milli: int, memory: int, gpu_milli: int) -> None:
        """The cluster total. A resource with capacity 0 is left out of every share."""
        cap = (int(cpu_milli), int(memory), int(gpu_milli))
        if min(cap) < 0:
            raise ValueError(f"cluster capacity must not be negative, got {cap}")
        self._cap = cap
        self._inv = (
            1.0 / cap[0] if cap[0] else 0.0,
            1.0 / cap[1] if cap[1] else 0.0,
            1.0 / cap[2] if cap[2] else 0.0,
        )
        self._n_res = sum(1 for c in cap if c)
        for fn in self._listeners:
            fn(None)

    @property
    def capacity(self) -> I64:
        return np.array(self._cap, np.int64)

    @property
    def capacity_tuple(self) -> tuple[int, int, int]:
        return self._cap

    @property
    def has_capacity(self) -> bool:
        return self._n_res > 0

    @property
    def has_listeners(self) -> bool:
        return bool(self._listeners)

    def subscribe(self, fn: Listener, queue: str | None = None) -> None:
        """Call `fn(tenant)` whenever that tenant's held + in-flight usage in `queue` (in any queue,
        when None) changes, and `fn(None)` when the cluster capacity is set."""
        self._listeners.append(fn)
        if queue is None:
            self._everywhere.append(fn)
            for heard in self._watch.values():
                heard.append(fn)
        else:
            self._heard_in(queue).append(fn)

    def _heard_in(self, queue: str) -> list[Listener]:
        heard = self._watch.get(queue)
        if heard is None:
            heard = self._watch[queue] = list(self._everywhere)
        return heard

    # -- updates (negative amounts subtract) --------------------------------------------------------
    def add_inflight(self, queue: str, tenant: str, cpu: int, mem: int, gpu: int) -> None:
        p, q, t, heard = self._pairs.get((queue, tenant)) or self._pair(queue, tenant)
        p[3] += cpu
        p[4] += mem
        p[5] += gpu
        q[3] += cpu
        q[4] += mem
        q[5] += gpu
        t[3] += cpu
        t[4] += mem
        t[5] += gpu
        for fn in heard:
            fn(tenant)

    def add_held(self, queue: str, tenant: str, cpu: int, mem: int, gpu: int) -> None:
        p, q, t, heard = self._pairs.get((queue, tenant)) or self._pair(queue, tenant)
        p[0] += cpu
        p[1] += mem
        p[2] += gpu
        q[0] += cpu
        q[1] += mem
        q[2] += gpu
        t[0] += cpu
        t[1] += mem
        t[2] += gpu
        for fn in heard:
            fn(tenant)

    def commit(self, queue: str, tenant: str, cpu: int, mem: int, gpu: int) -> None:
        """Move an amount from in-flight to held (a placement was accepted); shares do not change."""
        p, q, t, _ = self._pairs.get((queue, tenant)) or self._pair(queue, tenant)
        # unrolled, as in add_*: a loop over (p, q, t) costs a tuple and an iterator per call
        p[0] += cpu
        p[1] += mem
        p[2] += gpu
        p[3] -= cpu
        p[4] -= mem
        p[5] -= gpu
        q[0] += cpu
        q[1] += mem
        q[2] += gpu
        q[3] -= cpu
        q[4] -= mem
        q[5] -= gpu
        t[0] += cpu
        t[1] += mem
        t[2] += gpu
        t[3] -= cpu
        t[4] -= mem
        t[5] -= gpu

    def _pair(self, queue: str, tenant: str) -> _Pair:
        """The pair's entry, made on its first update (with its queue's and tenant's rows)."""
        q = self._queues.get(queue)
        if q is None:
            q = self._queues[queue] = [0, 0, 0, 0, 0, 0]
        t = self._tenants.get(tenant)
        if t is None:
            t = self._tenants[tenant] = [0, 0, 0, 0, 0, 0]
        pair = self._pairs[(queue, tenant)] = ([0, 0, 0, 0, 0, 0], q, t, self._heard_in(queue))
        return pair

    # -- read-outs ----------------------------------------------------------------------------------
    def usage(self, kind: Kind, name: str, part: Part = "total", *, queue: str | None = None) -> I64:
        """The usage vector (cpu milli, memory bytes, gpu milli) of one queue or tenant; with `queue`,
        the tenant's usage within that queue."""
        if queue is None:
            row = self._table(kind).get(name)
        else:
            _check(kind, queue)
            pair = self._pairs.get((queue, name))
            row = None if pair is None else pair[0]
        if row is None:
            return np.zeros(3, np.int64)
        if part == "held":
            return np.array(row[:3], np.int64)
        if part == "inflight":
            return np.array(row[3:], np.int64)
        return np.array(row[:3], np.int64) + np.array(row[3:], np.int64)

    def names(self, kind: Kind, *, queue: str | None = None) -> list[str]:
        """The queues or tenants with usage rows; with `queue`, the tenants that have used it."""
        return list(self._table(kind, queue))

    def pairs(self) -> list[tuple[str, str]]:
        """Every (queue, tenant) pair with a usage row."""
        return list(self._pairs)

    def matrix(
        self, kind: Kind, names: Iterable[str] | None = None, *, queue: str | None = None
    ) -> tuple[list[str], I64]:
        """Total usage of many queues or tenants (with `queue`: tenants within it) as one (n, 3)
        matrix, rows in the order of `names`."""
        table = self._table(kind, queue)
        order = list(table) if names is None else list(names)
        zero = [0, 0, 0, 0, 0, 0]
        raw = np.array([table.get(n, zero) for n in order], np.int64).reshape(len(order), 6)
        return order, raw[:, :3] + raw[:, 3:]

    def shares(
        self, kind: Kind, names: Iterable[str] | None = None, *, queue: str | None = None
    ) -> dict[str, float]:
        """Dominant share of every queue or tenant (with `queue`: tenants within it), computed with
        numpy in one pass."""
        order, m = self.matrix(kind, names, queue=queue)
        if not order:
            return {}
        dom = (m * np.array(self._inv, np.float64)).max(axis=1)
        return dict(zip(order, dom.tolist(), strict=True))

    def dominant_share(self, vec: npt.ArrayLike) -> float:
        """max over resources of vec / capacity, leaving out resources with no capacity."""
        v = np.asarray(vec, np.float64)
        return float((v * np.array(self._inv, np.float64)).max(initial=0.0))

    def unclaimed(self) -> list[int]:
        """The cluster capacity less what every queue holds and has in flight: cpu, memory, gpu."""
        return self.room()[1]

    def room(self) -> tuple[list[int], list[int]]:
        """(capacity less what is held, that less what is in flight too): cpu, memory, gpu."""
        unheld = list(self._cap)
        free = list(self._cap)
        for row in self._queues.values():
            for i in range(3):
                unheld[i] -= row[i]
                free[i] -= row[i] + row[i + 3]
        return unheld, free

    def queue_share(self, queue: str) -> float:
        """Dominant share of the queue, held + in-flight."""
        row = self._queues.get(queue)
        if row is None:
            return 0.0
        i0, i1, i2 = self._inv
        return max((row[0] + row[3]) * i0, (row[1] + row[4]) * i1, (row[2] + row[5]) * i2)

    def queue_share_after(self, queue: str, cpu: int, mem: int, gpu: int) -> float:
        """Dominant share the queue would have with `cpu, mem, gpu` more."""
        row = self._queues.get(queue) or [0, 0, 0, 0, 0, 0]
        i0, i1, i2 = self._inv
        return max((row[0] + row[3] + cpu) * i0, (row[1] + row[4] + mem) * i1, (row[2] + row[5] + gpu) * i2)

    def queue_excess_after(
        self, queue: str, cpu: int, mem: int, gpu: int, limit: float
    ) -> tuple[int, int, int]:
        """Per resource, how far the queue (held + in flight) with `cpu, mem, gpu` more would be
        past `limit` of the cluster (0 where within it, or where the cluster has none): what it
        must give up for its dominant share to stay within `limit`."""
        row = self._queues.get(queue) or [0, 0, 0, 0, 0, 0]
        more = (cpu, mem, gpu)
        out = []
        for r in range(3):
            c = self._cap[r]
            # The most the queue may use of the resource: as fits() allows (share within limit + EPS).
            allowed = math.floor(c * (limit + 1e-9)) if c else 0
            use = row[r] + row[r + 3] + more[r]
            out.append(max(0, use - allowed) if c else 0)
        return out[0], out[1], out[2]

    def queue_held_share_after(self, queue: str, cpu: int, mem: int, gpu: int) -> float:
        """Dominant share of what the queue holds (bound or running), with `cpu, mem, gpu` more;
        its in-flight units are left out."""
        row = self._queues.get(queue) or [0, 0, 0, 0, 0, 0]
        i0, i1, i2 = self._inv
        return max((row[0] + cpu) * i0, (row[1] + mem) * i1, (row[2] + gpu) * i2)

    def tenant_share(self, tenant: str, queue: str | None = None) -> float:
        """Dominant share of the tenant, held + in-flight: within `queue`, or over every queue."""
        if queue is None:
            row = self._tenants.get(tenant)
        else:
            pair = self._pairs.get((queue, tenant))
            row = None if pair is None else pair[0]
        if row is None:
            return 0.0
        i0, i1, i2 = self._inv
        return max((row[0] + row[3]) * i0, (row[1] + row[4]) * i1, (row[2] + row[5]) * i2)

    def tenant_mean_share(self, tenant: str, queue: str | None = None) -> float:
        """Mean of the tenant's cpu, memory and gpu shares (resources with capacity only), held +
        in-flight: within `queue`, or over every queue."""
        if queue is None:
            row = self._tenants.get(tenant)
        else:
            pair = self._pairs.get((queue, tenant))
            row = None if pair is None else pair[0]
        if row is None or not self._n_res:
            return 0.0
        i0, i1, i2 = self._inv
        return ((row[0] + row[3]) * i0 + (row[1] + row[4]) * i1 + (row[2] + row[5]) * i2) / self._n_res

    def _table(self, kind: Kind, queue: str | None = None) -> dict[str, list[int]]:
        _check(kind, queue)
        if queue is not None:
            return {t: pair[0] for (q, t), pair in self._pairs.items() if q == queue}
        return self._queues if kind == "queue" else self._tenants


def _check(kind: str, queue: str | None) -> None:
    if kind != "queue" and kind != "tenant":
        raise ValueError(f"kind must be 'queue' or 'tenant', got {kind!r}")
    if queue is not None and kind != "tenant":
        raise ValueError(f"usage within queue {queue!r} is kept per tenant: kind must be 'tenant'")
