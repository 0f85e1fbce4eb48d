"""partition_first: try the shard's own node partition, then the whole cluster.

Different shards then mostly pick different nodes, which keeps the binder's conflict rate low.
"""

import numpy as np
import numpy.typing as npt

from gosched.common.cluster_state import ClusterArrays
from gosched.common.messages import Unit
from gosched.scheduler_shard.framework.interfaces import LocatingPlugin, Mask
from gosched.scheduler_shard.framework.registry import register


@register
class PartitionFirst(LocatingPlugin):
    name = "partition_first"

    def locate(
        self, unit: Unit, own_rows: npt.NDArray[np.int64] | None, state: ClusterArrays
    ) -> list[Mask | None]:
        if own_rows is None or len(own_rows) >= state.n:
            return [None]
        own = np.zeros(state.n, np.bool_)
        own[own_rows[own_rows < state.n]] = True
        return [own, None]
