"""Benchmark workloads, modelled on kube-scheduler's scheduler_perf suite.

Each workload gives the nodes, the tasks already running before the clock starts, and the
measured tasks. Node and task counts are parameters; a workload that cannot measure as many tasks
as asked (gangs of 3, one task per node, a 90% fill of whole nodes) says so in its `note`.
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
    asked: int = 0  # the tasks asked for (--pods): measured_tasks, unless `note` says why not
    note: str = ""  # why measured_tasks differs from `asked`

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
        tasks,
    )


def node_affinity(nodes: int, tasks: int) -> Workload:
    """Every task requires zone z0 or z1 (half of the nodes) through required node affinity."""
    term = NodeSelectorTerm((Requirement("zone", SelectorOp.IN, ("z0", "z1")),))
    req = ResourceRequest(cpu_milli=500, memory=GiB)
    measured = [_one(f"aff-{i}", req, required_affinity=(term,)) for i in range(tasks)]
    return Workload("node-affinity", sim_nodes(nodes, gpu_every=0), [], measured, tasks)


def pod_anti_affinity(nodes: int, tasks: int) -> Workload:
    """Tasks labelled app=web that repel each other per node: at most one per node."""
    rule = AntiAffinity("node", (("app", "web"),))
    req = ResourceRequest(cpu_milli=100, memory=GiB // 4)
    measured = [
        replace(_one(f"anti-{i}", req, anti_affinity=(rule,)), labels=(("app", "web"),))
        for i in range(min(tasks, nodes))
    ]
    note = f"one task a node: {nodes} nodes hold {nodes}" if tasks > nodes else ""
    return Workload("pod-anti-affinity", sim_nodes(nodes, gpu_every=0), [], measured, tasks, note)


def preemption(nodes: int, tasks: int) -> Workload:
    """A cluster filled by low-priority tasks; higher-priority arrivals must preempt."""
    per_node = 8  # 4-core tasks on 32-core nodes
    low = ResourceRequest(cpu_milli=4000, memory=4 * GiB)
    initial = [replace(_one(f"low-{i}", low), priority=1) for i in range(nodes * per_node)]
    measured = [replace(_one(f"high-{i}", low), priority=100) for i in range(tasks)]
    return Workload("preemption", sim_nodes(nodes, gpu_every=0), initial, measured, tasks)


def gang(nodes: int, tasks: int) -> Workload:
    """Gangs of 3 (tasks // 3 of them), all-or-nothing."""
    req = ResourceRequest(cpu_milli=1000, memory=2 * GiB)
    group = TaskGroup("worker", 3, req, ("sleep", "60"))
    measured = [Job(id=f"gang-{i}", groups=(group,), min_member=3) for i in range(tasks // 3)]
    note = f"whole gangs of 3: {tasks // 3} gangs" if tasks % 3 else ""
    return Workload("gang", sim_nodes(nodes, gpu_every=0), [], measured, tasks, note)


def fill_90(nodes: int, tasks: int) -> Workload:
    """Identical tasks sized so that, all bound, they fill the cluster to 90% of its CPU and memory:
    the shards compete for the last room, where optimistic conflicts show.

    Each node takes the same whole number of them, per_node = tasks // nodes, each 90% of a node
    over per_node: identical tasks can fill 90% of whole nodes only so (2.5 a node, 100 tasks on
    40 nodes, would be tasks of 36% of a node, two a node: 80 bound and 20 fitting nowhere). So
    it measures nodes * per_node tasks, and with fewer tasks than nodes it fills as many nodes
    as tasks (the rest of --pods, or of --nodes, is left out and the note says so)."""
    used = min(nodes, tasks)
    per_node = tasks // used
    cpu = 32_000 * 9 // (10 * per_node)
    memory = 128 * GiB * 9 // (10 * per_node)
    if cpu < 1:
        raise ValueError(f"fill-90: {tasks} tasks cannot fill {nodes} nodes (use fewer tasks)")
    measured = used * per_node
    notes = []
    if measured < tasks:
        notes.append(f"{per_node} a node fill {used} nodes to 90%")
    if used < nodes:
        notes.append(f"{used} of the {nodes} nodes, one task a node")
    return Workload(
        "fill-90",
        sim_nodes(used, gpu_every=0),
        [],
        basic_jobs(measured, cpu_milli=cpu, memory=memory),
        tasks,
        "; ".join(notes),
    )


def gpu_mix(nodes: int, tasks: int) -> Workload:
    """CPU tasks, GPU shares, 1-8 GPU tasks and small GPU gangs on a quarter-GPU cluster: `tasks`
    tasks in all (mixed_jobs' jobs have 1-4 each; the last is cut to the tasks left)."""
    measured: list[Job] = []
    left = tasks
    for job in mixed_jobs(tasks):  # each job has a task at least: `tasks` jobs are enough
        if left <= 0:
            break
        group = job.groups[0]
        if group.replicas > left:
            job = replace(job, groups=(replace(group, replicas=left),), min_member=left)
        measured.append(job)
        left -= job.total_replicas
    return Workload("gpu-mix", sim_nodes(nodes, gpu_every=4), [], measured, tasks)


WORKLOADS: dict[str, Callable[[int, int], Workload]] = {
    "scheduling-basic": scheduling_basic,
    "node-affinity": node_affinity,
    "pod-anti-affinity": pod_anti_affinity,
    "preemption": preemption,
    "gang": gang,
    "fill-90": fill_90,
    "gpu-mix": gpu_mix,
}
