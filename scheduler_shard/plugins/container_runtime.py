"""container_runtime: a task with an image goes only to a node that can run containers.

As Nomad places a docker task only where its docker driver is healthy: a node qualifies by the
label its agent sets when docker or podman works there (simulated nodes carry it too). Without the
filter such a task would be placed on a node that can only fail it.
"""

from gosched.common.cluster_state import ClusterArrays
from gosched.common.job import Requirement, SelectorOp
from gosched.common.node import RUNTIME_LABEL
from gosched.scheduler_shard.framework.interfaces import FilterPlugin, Mask, Rows
from gosched.scheduler_shard.framework.registry import register
from gosched.scheduler_shard.framework.task_class import TaskClass
from gosched.scheduler_shard.plugins.labels import requirement_mask

HAS_RUNTIME = Requirement(RUNTIME_LABEL, SelectorOp.EXISTS, ())


@register
class ContainerRuntime(FilterPlugin):
    name = "container_runtime"
    reason = "no container runtime"

    def relevant(self, tc: TaskClass, state: ClusterArrays) -> bool:
        return bool(tc.group.image)

    def filter(self, tc: TaskClass, state: ClusterArrays, rows: Rows) -> Mask:
        return requirement_mask(state, HAS_RUNTIME)[rows]
