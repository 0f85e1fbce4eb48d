"""The job (the scheduling unit, a gang) and its task groups, as the components exchange them."""

import enum
from dataclasses import dataclass, field

from gosched.common.fast_pickle import fast_pickle
from gosched.common.node import Taint, TaintEffect
from gosched.common.resources import ResourceRequest


class GpuTopologyMode(enum.StrEnum):
    """Where a task's whole GPUs must sit on their node.

    PREFERRED (the default): the gpu_topology score prefers GPUs on one NUMA node and NVLinked, and
    the GPU choice takes such a set when one is free, but a spread set will do. The required modes
    are kubelet Topology Manager's `single-numa-node` policy for GPUs: a task that would run slow
    across the CPU sockets waits for a node that can give it GPUs on one NUMA node rather than run.
    SINGLE_NUMA_NVLINK also asks that its GPUs be NVLink-connected: each reaches every other over
    NVLink links among the task's own GPUs (on an NVSwitch node, any set; on pair-linked GPUs, a
    pair). Only a task of two or more whole GPUs is bound by them: one GPU, or a share of one, is on
    one NUMA node by itself (even one whose NUMA node the agent could not read).
    """

    PREFERRED = "preferred"
    SINGLE_NUMA = "single-numa"
    SINGLE_NUMA_NVLINK = "single-numa-nvlink"


class SelectorOp(enum.StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


@fast_pickle
@dataclass(frozen=True, slots=True)
class Requirement:
    """One node-label requirement, as in Kubernetes' NodeSelectorRequirement."""

    key: str
    op: SelectorOp
    values: tuple[str, ...] = ()


@fast_pickle
@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """All requirements must hold (AND). Required affinity is an OR over terms."""

    requirements: tuple[Requirement, ...]


@fast_pickle
@dataclass(frozen=True, slots=True)
class PreferredTerm:
    weight: int  # 1..100
    term: NodeSelectorTerm


@fast_pickle
@dataclass(frozen=True, slots=True)
class Toleration:
    """Tolerates taints with `key` (empty key + Exists: every taint) and, if set, `effect`."""

    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: TaintEffect | None = None


def tolerates(tolerations: tuple[Toleration, ...], taint: Taint) -> bool:
    """Whether one of `tolerations` tolerates `taint` (Kubernetes' rules: an empty key with Exists
    tolerates every taint; no effect tolerates every effect)."""
    for tol in tolerations:
        if tol.effect is not None and tol.effect != taint.effect:
            continue
        if tol.operator == "Exists" and (tol.key == "" or tol.key == taint.key):
            return True
        if tol.key == taint.key and tol.value == taint.value:
            return True
    return False


@fast_pickle
@dataclass(frozen=True, slots=True)
class AntiAffinity:
    """Keep tasks apart: no two matching tasks in the same topology domain.

    `topology_key` is a node label ("kubernetes.io/hostname"-like "node" means the node itself).
    With `match_labels` empty, it applies among the job's own tasks of this group; otherwise it
    repels every task (of any job) whose job labels include all of `match_labels`, both ways as in
    Kubernetes: such a task is placed neither where this one is nor this one where it is.
    """

    topology_key: str = "node"
    match_labels: tuple[tuple[str, str], ...] = ()


@fast_pickle
@dataclass(frozen=True, slots=True)
class TaskGroup:
    role: str
    replicas: int
    resources: ResourceRequest
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    gpu_models: tuple[str, ...] = ()  # acceptable GPU models; empty: any
    node_selector: tuple[tuple[str, str], ...] = ()
    required_affinity: tuple[NodeSelectorTerm, ...] = ()  # OR of terms; empty: no constraint
    preferred_affinity: tuple[PreferredTerm, ...] = ()
    anti_affinity: tuple[AntiAffinity, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    image: str = ""  # run the command in a container of this image (docker/podman); "": a shell
    # Last: the store's codec decodes older records by filling trailing fields with their defaults.
    gpu_topology: GpuTopologyMode = GpuTopologyMode.PREFERRED

    @property
    def gpu_topology_rule(self) -> GpuTopologyMode:
        """The mode in force: a required one binds only a task of two or more whole GPUs."""
        return self.gpu_topology if self.resources.gpus >= 2 else GpuTopologyMode.PREFERRED

    def constraint_key(self) -> tuple[object, ...]:
        """What decides where a task of this group may go and how nodes score; equal keys share work."""
        return (
            self.resources,
            self.gpu_models,
            self.node_selector,
            self.required_affinity,
            self.preferred_affinity,
            self.tolerations,
            bool(self.image),  # a container runtime needed or not (which image does not matter)
            # The unit filters read the class's group for these: without them, a group with
            # anti-affinity and one without would share a class and one of them get the other's.
            self.anti_affinity,
            self.role if self.anti_affinity else "",  # the rule spreads the tasks of this role
            self.gpu_topology_rule,
        )


class JobKind(enum.StrEnum):
    BATCH = "batch"
    SERVICE = "service"


# The queue of a job that names none (Settings.queues should hold one of this name), and what a
# job in it is told where no such queue is configured.
DEFAULT_QUEUE = "default"
NO_DEFAULT_QUEUE = f"a job that names no queue goes to {DEFAULT_QUEUE!r}, not configured here: name one"


@fast_pickle
@dataclass(frozen=True, slots=True)
class Job:
    """A scheduling unit: its tasks are placed all-or-nothing up to `min_member`."""

    id: str
    groups: tuple[TaskGroup, ...]
    tenant: str = "default"
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    min_member: int = 1
    preemptible: bool = True
    deadline: float | None = None  # unix seconds
    kind: JobKind = JobKind.BATCH
    labels: tuple[tuple[str, str], ...] = ()
    # Most of this job's tasks that one preemption may evict; None: no limit.
    disruption_budget: int | None = None
    submit_time: float = 0.0
    submission_id: str = ""
    # Seconds each task may run, counted from its start on its node (restarts of a service's task
    # included), as Slurm's --time and Kubernetes' activeDeadlineSeconds; past it the node's agent
    # stops the task and it fails. None: no limit. Last, so data written before it decodes.
    time_limit: float | None = None
    # Times each task is run again after it fails (its process exits non-zero, is OOM killed, runs
    # past time_limit), as Ray's max_retries and Kubernetes' backoffLimitPerIndex; a gang's members
    # stopped with it are placed again too. 0: a failure is final.
    max_retries: int = 0

    @property
    def total_replicas(self) -> int:
        return sum(g.replicas for g in self.groups)

    def task_ids(self) -> list[str]:
        return [task_id(self.id, i) for i in range(self.total_replicas)]

    def group_of(self, index: int) -> TaskGroup:
        """The group holding the job's `index`-th task (tasks are numbered across groups in order)."""
        for group in self.groups:
            if index < group.replicas:
                return group
            index -= group.replicas
        raise IndexError(f"job {self.id} has no task {index}")

    def group_index_of(self, index: int) -> int:
        for gi, group in enumerate(self.groups):
            if index < group.replicas:
                return gi
            index -= group.replicas
        raise IndexError(f"job {self.id} has no task {index}")

    def total_request(self) -> ResourceRequest:
        cpu = mem = gpu_milli = 0
        for g in self.groups:
            cpu += g.resources.cpu_milli * g.replicas
            mem += g.resources.memory * g.replicas
            gpu_milli += g.resources.gpu_total_milli * g.replicas
        return ResourceRequest(cpu_milli=cpu, memory=mem, gpu_milli=gpu_milli)


def task_id(job_id: str, index: int) -> str:
    return f"{job_id}/{index}"


def split_task_id(tid: str) -> tuple[str, int]:
    job_id, _, index = tid.rpartition("/")
    return job_id, int(index)


@dataclass(slots=True)
class TaskPlacement:
    """Where a task runs: node name and the (GPU index, milli) pairs it holds there."""

    node: str
    gpus: tuple[tuple[int, int], ...] = field(default=())
