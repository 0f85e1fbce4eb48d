"""Benchmark workloads, modelled on kube-scheduler's scheduler_perf suite.

Each workload gives the nodes, the tasks already running before the clock starts, and the
measured tasks. Node and task counts are parameters.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gosched.common.job import AntiAffinity, Job, NodeSelectorTerm, Requirement, SelectorOp, TaskGroup
from gosched.common.node import Node
from gosched.common.resources import ResourceRequest
from gosched.runtime.simulation import GiB, basic_jobs, mixed_jobs, sim_nodes


@dataclass(slots=True)
class Workload:
    name: str
    nodes: list[Node]
    initial: list[Job]  # placed before the clock starts
    measured: list[Job]

    @property
    def measured_tasks(self) -> int:
        return sum(j.total_replicas for j in self.measured)


def _one(job_id: str, req: ResourceRequest, **group: Any) -> Job:
    return Job(id=job_id, groups=(TaskGroup("main", 1, req, ("sleep", "60"), **group),))


def scheduling_basic(nodes: int, tasks: int) -> Workload:
    """Identical single-task jobs; 1,000 (or a fifth of the tasks, if fewer) already running."""
    initial = min(1000, tasks // 5)
    return Workload(
        "scheduling-basic",
        sim_nodes(nodes, gpu_every=0),
        basic_jobs(initial, prefix="init"),
        basic_jobs(tasks, prefix="job"),
    )


def node_affinity(nodes: int, tasks: int) -> Workload:
    """Every task requires zone z0 or z1 (half of the nodes) through required node affinity."""
    term = NodeSelectorTerm((Requirement("zone", SelectorOp.IN, ("z0", "z1")),))
    req = ResourceRequest(cpu_milli=500, memory=GiB)
    measured = [_one(f"aff-{i}", req, required_affinity=(term,)) for i in range(tasks)]
    return Workload("node-affinity", sim_nodes(nodes, gpu_every=0), [], measured)


def pod_anti_affinity(nodes: int, tasks: int) -> Workload:
    """Tasks labelled app=web that repel each other per node: at most one per node."""
    rule = AntiAffinity("node", (("app", "web"),))
    req = ResourceRequest(cpu_milli=100, memory=GiB // 4)
    measured = [
        replace(_one(f"anti-{i}", req, anti_affinity=(rule,)), labels=(("app", "web"),))
        for i in range(min(tasks, nodes))
    ]
    return Workload("pod-anti-affinity", sim_nodes(nodes, gpu_every=0), [], measured)


def preemption(nodes: int, tasks: int) -> Workload:
    """A cluster filled by low-priority tasks; higher-priority arrivals must preempt."""
    per_node = 8  # 4-core tasks on 32-core nodes
    low = ResourceRequest(cpu_milli=4000, memory=4 * GiB)
    initial = [replace(_one(f"low-{i}", low), priority=1) for i in range(nodes * per_node)]
    measured = [replace(_one(f"high-{i}", low), priority=100) for i in range(tasks)]
    return Workload("preemption", sim_nodes(nodes, gpu_every=0), initial, measured)


def gang(nodes: int, tasks: int) -> Workload:
    """Gangs of 3 (tasks // 3 of them), all-or-nothing."""
    req = ResourceRequest(cpu_milli=1000, memory=2 * GiB)
    group = TaskGroup("worker", 3, req, ("sleep", "60"))
    measured = [Job(id=f"gang-{i}", groups=(group,), min_member=3) for i in range(tasks // 3)]
    return Workload("gang", sim_nodes(nodes, gpu_every=0), [], measured)


def fill_90(nodes: int, tasks: int) -> Workload:
    """Identical tasks sized so that, all bound, they fill the cluster to 90% of its CPU and memory:
    the shards compete for the last room, where optimistic conflicts show."""
    cpu = 32_000 * 9 * nodes // (10 * tasks)
    memory = 128 * GiB * 9 * nodes // (10 * tasks)
    if cpu < 1:
        raise ValueError(f"fill-90: {tasks} tasks cannot fill {nodes} nodes (use fewer tasks)")
    return Workload(
        "fill-90", sim_nodes(nodes, gpu_every=0), [], basic_jobs(tasks, cpu_milli=cpu, memory=memory)
    )


def gpu_mix(nodes: int, tasks: int) -> Workload:
    """CPU tasks, GPU shares, 1-8 GPU tasks and small GPU gangs on a quarter-GPU cluster."""
    return Workload("gpu-mix", sim_nodes(nodes, gpu_every=4), [], list(mixed_jobs(tasks)))


WORKLOADS: dict[str, Callable[[int, int], Workload]] = {
    "scheduling-basic": scheduling_basic,
    "node-affinity": node_affinity,
    "pod-anti-affinity": pod_anti_affinity,
    "preemption": preemption,
    "gang": gang,
    "fill-90": fill_90,
    "gpu-mix": gpu_mix,
}
