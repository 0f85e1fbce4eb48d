"""Resource usage per queue and per tenant, and shares of the cluster.

Usage is a vector over three resources (cpu milli, memory bytes, gpu milli). Each queue and each
tenant has two of them: `held` (tasks bound or running) and `inflight` (tasks dispatched to a shard
and not yet answered). Scheduling decisions use held + inflight, so that one round of dispatching
sees the units it has already handed out.

The hot path updates one queue and one tenant per unit, so the running sums are plain Python ints
(a three-element numpy in-place add costs ~8x a Python one); every read-out is a numpy vector, and
the all-entities views (`shares`, `matrix`) are computed with numpy in one go.
"""

from collections.abc import Callable, Iterable
from typing import Literal

import numpy as np
import numpy.typing as npt

RESOURCES = ("cpu_milli", "memory", "gpu_milli")
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

Kind = Literal["queue", "tenant"]
# A listener hears the tenant whose effective usage changed, or None when every share changed
# (the cluster capacity was set).
Listener = Callable[[str | None], None]


class UsageTracker:
    """Held and in-flight usage per queue and per tenant, against the cluster capacity."""

    __slots__ = ("_cap", "_inv", "_listeners", "_n_res", "_queues", "_tenants")

    def __init__(self) -> None:
        self._cap: tuple[int, int, int] = (0, 0, 0)
        self._inv: tuple[float, float, float] = (0.0, 0.0, 0.0)
        self._n_res = 0
        # name -> [held cpu, held mem, held gpu, inflight cpu, inflight mem, inflight gpu]
        self._queues: dict[str, list[int]] = {}
        self._tenants: dict[str, list[int]] = {}
        self._listeners: list[Listener] = []

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

    def subscribe(self, fn: Listener) -> None:
        """Call `fn(tenant)` whenever that tenant's held + in-flight usage changes."""
        self._listeners.append(fn)

    # -- updates (negative amounts subtract) --------------------------------------------------------
    def add_inflight(self, queue: str, tenant: str, cpu: int, mem: int, gpu: int) -> None:
        self._bump(self._queues, queue, 3, cpu, mem, gpu)
        self._bump(self._tenants, tenant, 3, cpu, mem, gpu)
        for fn in self._listeners:
            fn(tenant)

    def add_held(self, queue: str, tenant: str, cpu: int, mem: int, gpu: int) -> None:
        self._bump(self._queues, queue, 0, cpu, mem, gpu)
        self._bump(self._tenants, tenant, 0, cpu, mem, gpu)
        for fn in self._listeners:
            fn(tenant)

    def commit(self, queue: str, tenant: str, cpu: int, mem: int, gpu: int) -> None:
        """Move an amount from in-flight to held (a placement was accepted); shares do not change."""
        for table, name in ((self._queues, queue), (self._tenants, tenant)):
            row = table.get(name)
            if row is None:
                row = table[name] = [0, 0, 0, 0, 0, 0]
            row[0] += cpu
            row[1] += mem
            row[2] += gpu
            row[3] -= cpu
            row[4] -= mem
            row[5] -= gpu

    @staticmethod
    def _bump(table: dict[str, list[int]], name: str, at: int, cpu: int, mem: int, gpu: int) -> None:
        row = table.get(name)
        if row is None:
            row = table[name] = [0, 0, 0, 0, 0, 0]
        row[at] += cpu
        row[at + 1] += mem
        row[at + 2] += gpu

    # -- read-outs ----------------------------------------------------------------------------------
    def usage(self, kind: Kind, name: str, part: Literal["total", "held", "inflight"] = "total") -> I64:
        """The usage vector (cpu milli, memory bytes, gpu milli) of one queue or tenant."""
        row = self._table(kind).get(name)
        if row is None:
            return np.zeros(3, np.int64)
        if part == "held":
            return np.array(row[:3], np.int64)
        if part == "inflight":
            return np.array(row[3:], np.int64)
        return np.array(row[:3], np.int64) + np.array(row[3:], np.int64)

    def names(self, kind: Kind) -> list[str]:
        return list(self._table(kind))

    def matrix(self, kind: Kind, names: Iterable[str] | None = None) -> tuple[list[str], I64]:
        """Total usage of many queues or tenants as one (n, 3) matrix, rows in the order of `names`."""
        table = self._table(kind)
        order = list(table) if names is None else list(names)
        zero = [0, 0, 0, 0, 0, 0]
        raw = np.array([table.get(n, zero) for n in order], np.int64).reshape(len(order), 6)
        return order, raw[:, :3] + raw[:, 3:]

    def shares(self, kind: Kind, names: Iterable[str] | None = None) -> dict[str, float]:
        """Dominant share of every queue or tenant, computed with numpy in one pass."""
        order, m = self.matrix(kind, names)
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

    def tenant_share(self, tenant: str) -> float:
        """Dominant share of the tenant, held + in-flight."""
        row = self._tenants.get(tenant)
        if row is None:
            return 0.0
        i0, i1, i2 = self._inv
        return max((row[0] + row[3]) * i0, (row[1] + row[4]) * i1, (row[2] + row[5]) * i2)

    def tenant_mean_share(self, tenant: str) -> float:
        """Mean of the tenant's cpu, memory and gpu shares (resources with capacity only)."""
        row = self._tenants.get(tenant)
        if row is None or not self._n_res:
            return 0.0
        i0, i1, i2 = self._inv
        return ((row[0] + row[3]) * i0 + (row[1] + row[4]) * i1 + (row[2] + row[5]) * i2) / self._n_res

    def _table(self, kind: Kind) -> dict[str, list[int]]:
        if kind == "queue":
            return self._queues
        if kind == "tenant":
            return self._tenants
        raise ValueError(f"kind must be 'queue' or 'tenant', got {kind!r}")
