"""Fluent builders for tests, in the style of Gödel's testing wrappers.

make_job("j1").cpu("2").gpus(1).priority(100).replicas(4).min_member(4).build()
make_node("n1").cpu("32").mem("128Gi").gpus(8, model="A100", nvlink_pairs=True).build()
"""

from dataclasses import replace
from typing import Self

from gosched.common.job import (
    AntiAffinity,
    Job,
    NodeSelectorTerm,
    PreferredTerm,
    Requirement,
    SelectorOp,
    TaskGroup,
    Toleration,
)
from gosched.common.node import Gpu, Node, NodeState, Taint, TaintEffect
from gosched.common.quantity import parse_bytes, parse_milli
from gosched.common.resources import ResourceRequest


class JobBuilder:
    def __init__(self, job_id: str) -> None:
        self._id = job_id
        self._groups: list[TaskGroup] = []
        self._group = TaskGroup(role="main", replicas=1, resources=ResourceRequest(), command=("true",))
        self._job: dict[str, object] = {}

    # -- current group's task template --
    def _res(self, **kw: object) -> Self:
        self._group = replace(self._group, resources=replace(self._group.resources, **kw))  # type: ignore[arg-type]
        return self

    def cpu(self, q: str | int | float) -> Self:
        return self._res(cpu_milli=parse_milli(q))

    def mem(self, q: str | int) -> Self:
        return self._res(memory=parse_bytes(q))

    def gpus(self, n: int) -> Self:
        return self._res(gpus=n)

    def gpu_share(self, milli: int) -> Self:
        return self._res(gpu_milli=milli)

    def gpu_memory(self, mib: int) -> Self:
        return self._res(gpu_memory_mib=mib)

    def extended(self, name: str, amount: int) -> Self:
        merged = dict(self._group.resources.extended) | {name: amount}
        return self._res(extended=tuple(sorted(merged.items())))

    def gpu_model(self, *models: str) -> Self:
        self._group = replace(self._group, gpu_models=tuple(models))
        return self

    def replicas(self, n: int) -> Self:
        self._group = replace(self._group, replicas=n)
        return self

    def role(self, name: str) -> Self:
        self._group = replace(self._group, role=name)
        return self

    def command(self, *argv: str) -> Self:
        self._group = replace(self._group, command=tuple(argv))
        return self

    def image(self, image: str) -> Self:
        self._group = replace(self._group, image=image)
        return self

    def selector(self, **labels: str) -> Self:
        self._group = replace(self._group, node_selector=tuple(sorted(labels.items())))
        return self

    def require(self, key: str, op: str, *values: str) -> Self:
        term = NodeSelectorTerm((Requirement(key, SelectorOp(op), tuple(values)),))
        self._group = replace(self._group, required_affinity=(*self._group.required_affinity, term))
        return self

    def prefer(self, weight: int, key: str, op: str, *values: str) -> Self:
        term = PreferredTerm(weight, NodeSelectorTerm((Requirement(key, SelectorOp(op), tuple(values)),)))
        self._group = replace(self._group, preferred_affinity=(*self._group.preferred_affinity, term))
        return self

    def tolerate(
        self, key: str = "", value: str = "", effect: str | None = None, exists: bool = False
    ) -> Self:
        tol = Toleration(key, "Exists" if exists else "Equal", value, TaintEffect(effect) if effect else None)
        self._group = replace(self._group, tolerations=(*self._group.tolerations, tol))
        return self

    def anti_affinity(self, topology_key: str = "node", **match_labels: str) -> Self:
        aa = AntiAffinity(topology_key, tuple(sorted(match_labels.items())))
        self._group = replace(self._group, anti_affinity=(*self._group.anti_affinity, aa))
        return self

    def group(self, role: str) -> Self:
        """Close the current task group and start a new one named `role`."""
        self._groups.append(self._group)
        self._group = TaskGroup(role=role, replicas=1, resources=ResourceRequest(), command=("true",))
        return self

    # -- job fields --
    def priority(self, p: int) -> Self:
        self._job["priority"] = p
        return self

    def min_member(self, n: int) -> Self:
        self._job["min_member"] = n
        return self

    def queue(self, name: str) -> Self:
        self._job["queue"] = name
        return self

    def tenant(self, name: str) -> Self:
        self._job["tenant"] = name
        return self

    def deadline(self, t: float) -> Self:
        self._job["deadline"] = t
        return self

    def preemptible(self, flag: bool = True) -> Self:
        self._job["preemptible"] = flag
        return self

    def labels(self, **labels: str) -> Self:
        self._job["labels"] = tuple(sorted(labels.items()))
        return self

    def disruption_budget(self, n: int) -> Self:
        self._job["disruption_budget"] = n
        return self

    def submitted(self, t: float) -> Self:
        self._job["submit_time"] = t
        return self

    def time_limit(self, seconds: float) -> Self:
        self._job["time_limit"] = seconds
        return self

    def max_retries(self, n: int) -> Self:
        self._job["max_retries"] = n
        return self

    def build(self) -> Job:
        groups = (*self._groups, self._group)
        return Job(id=self._id, groups=groups, **self._job)  # type: ignore[arg-type]


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self._name = name
        self._cpu = 0
        self._mem = 0
        self._gpus: list[Gpu] = []
        self._labels: dict[str, str] = {}
        self._taints: list[Taint] = []
        self._extended: dict[str, int] = {}
        self._state = NodeState.READY

    def cpu(self, q: str | int | float) -> Self:
        self._cpu = parse_milli(q)
        return self

    def mem(self, q: str | int) -> Self:
        self._mem = parse_bytes(q)
        return self

    def gpus(
        self,
        n: int,
        model: str = "A100",
        memory_mib: int = 81920,
        numa_nodes: int = 1,
        nvlink_pairs: bool = False,
    ) -> Self:
        per_numa = max(1, -(-n // numa_nodes))
        self._gpus = [
            Gpu(
                i,
                f"GPU-{self._name}-{i}",
                model,
                memory_mib,
                i // per_numa,
                ((i ^ 1,) if nvlink_pairs and (i ^ 1) < n else ()),
            )
            for i in range(n)
        ]
        return self

    def gpu(
        self,
        index: int,
        model: str = "A100",
        memory_mib: int = 81920,
        numa: int = 0,
        nvlink: tuple[int, ...] = (),
    ) -> Self:
        self._gpus.append(Gpu(index, f"GPU-{self._name}-{index}", model, memory_mib, numa, nvlink))
        return self

    def label(self, **labels: str) -> Self:
        self._labels.update(labels)
        return self

    def taint(self, key: str, value: str = "", effect: str = "NoSchedule") -> Self:
        self._taints.append(Taint(key, value, TaintEffect(effect)))
        return self

    def extended(self, name: str, amount: int) -> Self:
        self._extended[name] = amount
        return self

    def state(self, state: NodeState) -> Self:
        self._state = state
        return self

    def build(self) -> Node:
        return Node(
            name=self._name,
            cpu_milli=self._cpu,
            memory=self._mem,
            gpus=tuple(self._gpus),
            labels=tuple(sorted(self._labels.items())),
            taints=tuple(self._taints),
            extended=tuple(sorted(self._extended.items())),
            state=self._state,
        )


def make_job(job_id: str) -> JobBuilder:
    return JobBuilder(job_id)


def make_node(name: str) -> NodeBuilder:
    return NodeBuilder(name).cpu("32").mem("128Gi")


def zone_node(name: str, zone: str | None, cpu: str) -> Node:
    """A node of `cpu` cpus in `zone` (None: a node without the zone label)."""
    b = make_node(name).cpu(cpu)
    return (b.label(zone=zone) if zone else b).build()
