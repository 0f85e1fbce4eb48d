"""Split the cluster's nodes into one partition per shard: balanced, and stable under change.

Nodes fall into classes by GPU kind (GPU count and model), so a shard's partition has a mix of
machines like the cluster's. Two invariants hold after every change:

* per class, the shards' node counts differ by at most 1 (each shard gets a similar mix, and so
  similar GPU totals);
* overall, the shards' node counts differ by at most 1.

Changes move as few nodes as they can: a new node goes where it keeps both invariants (at most one
other node moves to restore the overall balance); a removed node is replaced by at most one node of
its class and one more for the overall balance; a new shard takes about 1/n of every class; the
nodes of a dropped shard are spread over the rest and nothing else moves unless balance needs it.
`version` changes on every change, so shards can tell their partition is stale.
"""

from collections.abc import Iterable
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from gosched.common.node import Node

I64 = npt.NDArray[np.int64]
# A node to partition: a Node, a bare name (no GPUs), or (name, GPU count).
NodeLike: TypeAlias = Node | str | tuple[str, int]
ClassKey: TypeAlias = tuple[int, str]  # (GPU count, GPU model)


def _describe(node: NodeLike) -> tuple[str, ClassKey]:
    if isinstance(node, Node):
        model = node.gpus[0].model if node.gpus else ""
        return node.name, (len(node.gpus), model)
    if isinstance(node, str):
        return node, (0, "")
    name, gpus = node
    if gpus < 0:
        raise ValueError(f"node {name}: GPU count must be >= 0, got {gpus}")
    return name, (int(gpus), "")


def _lex_first(*keys: I64) -> int:
    """Index of the lexicographically smallest (keys[0][i], keys[1][i], ...), lowest index on ties."""
    mask = np.ones(len(keys[0]), np.bool_)
    for key in keys:
        best = key[mask].min()
        mask &= key == best
    return int(np.flatnonzero(mask)[0])


class Partitioner:
    """Node names -> shard ids, balanced by count and by GPU class."""

    def __init__(self, shards: int = 1, nodes: Iterable[NodeLike] = ()) -> None:
        if shards < 1:
            raise ValueError(f"shards must be >= 1, got {shards}")
        self._n = shards
        self._shard_of: dict[str, int] = {}
        self._class_of: dict[str, int] = {}
        self._class_ids: dict[ClassKey, int] = {}
        self._class_gpus: list[int] = []
        # [class][shard] -> names, insertion-ordered (the newest is the first to move)
        self._members: list[list[dict[str, None]]] = []
        self._cc: I64 = np.zeros((0, shards), np.int64)  # nodes per (class, shard)
        self._total: I64 = np.zeros(shards, np.int64)
        self._gpus: I64 = np.zeros(shards, np.int64)
        self.version = 0
        self.moves = 0  # nodes moved between shards by rebalancing, over the partitioner's life
        self.add_nodes(nodes)

    # -- read-outs ----------------------------------------------------------------------------------
    @property
    def shards(self) -> int:
        return self._n

    def __len__(self) -> int:
        return len(self._shard_of)

    def __contains__(self, name: object) -> bool:
        return name in self._shard_of

    def partition_of(self, shard_id: int) -> list[str]:
        """The node names of one shard's partition, sorted."""
        if not 0 <= shard_id < self._n:
            raise IndexError(f"shard {shard_id} out of range 0..{self._n - 1}")
        names: list[str] = []
        for per_shard in self._members:
            names.extend(per_shard[shard_id])
        return sorted(names)

    def shard_of(self, name: str) -> int:
        return self._shard_of[name]

    def assignment(self) -> dict[str, int]:
        return dict(self._shard_of)

    def sizes(self) -> list[int]:
        return [int(x) for x in self._total]

    def gpu_totals(self) -> list[int]:
        return [int(x) for x in self._gpus]

    # -- changes ------------------------------------------------------------------------------------
    def add_nodes(self, nodes: Iterable[NodeLike]) -> None:
        """Add nodes (a known node whose GPU class changed is re-placed; otherwise it stays)."""
        changed = False
        for node in nodes:
            name, key = _describe(node)
            c = self._class_id(key)
            old = self._class_of.get(name)
            if old == c:
                continue
            if old is not None:
                self._drop(name)
                self._repair_class(old)
            self._put(name, c, self._target(c))
            self._repair_total()
            changed = True
        if changed:
            self.version += 1

    def remove_nodes(self, names: Iterable[str]) -> None:
        """Remove nodes (unknown names are ignored); at most two others move per removed node."""
        changed = False
        for name in names:
            if name not in self._shard_of:
                continue
            c = self._class_of[name]
            self._drop(name)
            self._repair_class(c)
            self._repair_total()
            changed = True
        if changed:
            self.version += 1

    def set_shards(self, n: int) -> None:
        """Change the number of shards, moving about |change|/n of the nodes."""
        if n < 1:
            raise ValueError(f"shards must be >= 1, got {n}")
        if n == self._n:
            return
        if n > self._n:
            extra = n - self._n
            self._cc = np.concatenate([self._cc, np.zeros((self._cc.shape[0], extra), np.int64)], axis=1)
            self._total = np.concatenate([self._total, np.zeros(extra, np.int64)])
            self._gpus = np.concatenate([self._gpus, np.zeros(extra, np.int64)])
            for per_shard in self._members:
                per_shard.extend({} for _ in range(extra))
            self._n = n
        else:
            orphans = [
                (name, c) for c, per_shard in enumerate(self._members) for s in per_shard[n:] for name in s
            ]
            self._cc = self._cc[:, :n].copy()
            self._total = self._total[:n].copy()
            self._gpus = self._gpus[:n].copy()
            for per_shard in self._members:
                del per_shard[n:]
            self._n = n
            for name, c in orphans:
                del self._shard_of[name]
                self._put(name, c, self._target(c))
                self.moves += 1
        for c in range(len(self._members)):
            self._repair_class(c)
        self._repair_total()
        self.version += 1

    # -- internals ----------------------------------------------------------------------------------
    def _class_id(self, key: ClassKey) -> int:
        c = self._class_ids.get(key)
        if c is None:
            c = self._class_ids[key] = len(self._class_gpus)
            self._class_gpus.append(key[0])
            self._members.append([{} for _ in range(self._n)])
            self._cc = np.concatenate([self._cc, np.zeros((1, self._n), np.int64)])
        return c

    def _target(self, c: int) -> int:
        """Where a new node of class c goes: fewest of its class, then fewest nodes, then fewest GPUs."""
        return _lex_first(self._cc[c], self._total, self._gpus)

    def _put(self, name: str, c: int, s: int) -> None:
        self._shard_of[name] = s
        self._class_of[name] = c
        self._members[c][s][name] = None
        self._cc[c, s] += 1
        self._total[s] += 1
        self._gpus[s] += self._class_gpus[c]

    def _drop(self, name: str) -> None:
        s = self._shard_of.pop(name)
        c = self._class_of.pop(name)
        del self._members[c][s][name]
        self._cc[c, s] -= 1
        self._total[s] -= 1
        self._gpus[s] -= self._class_gpus[c]

    def _move(self, c: int, src: int, dst: int) -> None:
        name = next(reversed(self._members[c][src]))
        self._drop(name)
        self._put(name, c, dst)
        self.moves += 1

    def _repair_class(self, c: int) -> None:
        cc = self._cc[c]
        while int(cc.max()) - int(cc.min()) > 1:
            src = _lex_first(-cc, -self._total, -self._gpus)
            dst = _lex_first(cc, self._total, self._gpus)
            self._move(c, src, dst)

    def _repair_total(self) -> None:
        total = self._total
        while int(total.max()) - int(total.min()) > 1:
            src = _lex_first(-total, -self._gpus)
            dst = _lex_first(total, self._gpus)
            # Move a node of a class the source has more of than the destination: with per-class
            # counts within 1, that swaps the two counts and keeps the class balance. Of those, the
            # class that leaves the two shards' GPU totals closest.
            gap = int(self._gpus[src] - self._gpus[dst])
            best, best_err = -1, 0
            for c in np.flatnonzero(self._cc[:, src] > self._cc[:, dst]).tolist():
                err = abs(gap - 2 * self._class_gpus[c])
                if best < 0 or err < best_err:
                    best, best_err = c, err
            self._move(best, src, dst)
