"""Label look-ups and requirement matching over all node rows (static: node metadata only)."""

from collections.abc import Callable
from typing import TypeVar

import numpy as np

from gosched.common.cluster_state import ClusterArrays
from gosched.common.job import NodeSelectorTerm, Requirement, SelectorOp
from gosched.common.node import Taint
from gosched.scheduler_shard.framework.interfaces import Mask

T = TypeVar("T")


_cache: dict[tuple[int, int, object], object] = {}


def _cached(state: ClusterArrays, key: object, build: Callable[[], T]) -> T:
    """Memoise a static per-node table for this view and metadata generation."""
    full = (id(state), state.meta_generation, key)
    hit = _cache.get(full)
    if hit is None:
        if len(_cache) > 256:
            _cache.clear()
        hit = _cache[full] = build()
    return hit  # type: ignore[return-value]


def label_column(state: ClusterArrays, key: str) -> list[str | None]:
    return _cached(state, ("label", key), lambda: state.label_values(key)[: state.n])


def taint_groups(state: ClusterArrays) -> list[tuple[tuple[Taint, ...], np.ndarray]]:
    """Distinct taint sets and the rows carrying each (taints rarely vary much across nodes)."""

    def build() -> list[tuple[tuple[Taint, ...], np.ndarray]]:
        rows_by_set: dict[tuple[Taint, ...], list[int]] = {}
        for row in range(state.n):
            rows_by_set.setdefault(state.node_taints(row), []).append(row)
        return [(taints, np.array(rows, np.int64)) for taints, rows in rows_by_set.items()]

    return _cached(state, "taints", build)


def requirement_mask(state: ClusterArrays, req: Requirement) -> Mask:
    values = label_column(state, req.key)
    wanted = set(req.values)
    if req.op == SelectorOp.IN:
        out = [v is not None and v in wanted for v in values]
    elif req.op == SelectorOp.NOT_IN:
        out = [v is None or v not in wanted for v in values]
    elif req.op == SelectorOp.EXISTS:
        out = [v is not None for v in values]
    elif req.op == SelectorOp.DOES_NOT_EXIST:
        out = [v is None for v in values]
    else:  # Gt / Lt compare integers; a non-integer label never matches
        bound = int(req.values[0])
        out = []
        for v in values:
            try:
                n = int(v) if v is not None else None
            except ValueError:
                n = None
            out.append(n is not None and (n > bound if req.op == SelectorOp.GT else n < bound))
    return np.fromiter(out, np.bool_, count=len(values))


def term_mask(state: ClusterArrays, term: NodeSelectorTerm) -> Mask:
    mask = np.ones(state.n, np.bool_)
    for req in term.requirements:
        mask &= requirement_mask(state, req)
    return mask


def domain_ids(state: ClusterArrays, topology_key: str) -> np.ndarray:
    """Per row, an integer id of its topology domain; "node" makes each node its own domain.

    Rows without the label get -1 (they form no shared domain). Memoised per metadata generation,
    so read-only.
    """

    def build() -> np.ndarray:
        if topology_key == "node":
            out = np.arange(state.n, dtype=np.int64)
        else:
            ids: dict[str, int] = {}
            out = np.fromiter(
                (-1 if v is None else ids.setdefault(v, len(ids)) for v in label_column(state, topology_key)),
                np.int64,
                count=state.n,
            )
        out.flags.writeable = False
        return out

    return _cached(state, ("domains", topology_key), build)
