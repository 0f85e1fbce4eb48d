"""node_ready: only live nodes in state ready (not cordoned, draining or not ready)."""

from gosched.common.cluster_state import ClusterArrays
from gosched.scheduler_shard.framework.interfaces import FilterPlugin, Mask, Rows
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.framework.task_class import TaskClass


@register
class NodeReady(FilterPlugin):
    name = "node_ready"
    reason = "node not ready or unschedulable"

    def filter(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Mask:
        return state.schedulable[rows] & state.alive[rows]
