"""Built-in plugins; importing this package registers them by name."""

from gosched.scheduler_shard.plugins import (  # noqa: F401
    allocation_scores,
    anti_affinity,
    container_runtime,
    gpu_filters,
    gpu_fragmentation,
    gpu_node_avoidance,
    gpu_topology,
    grouping,
    locating,
    node_affinity,
    node_ready,
    placement_policies,
    preemption,
    resources_fit,
    taints,
)
