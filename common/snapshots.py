"""Read-only snapshots of jobs, nodes and cluster counters, as the API and its control planes pass
them around (plain data: they cross Ray actor boundaries and thread boundaries unchanged)."""

from dataclasses import dataclass, field

from gosched.common.job import Job
from gosched.common.node import Node
from gosched.common.states import JobState, TaskState

Gpus = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class JobSnapshot:
    """One job as the dispatcher knows it, with where its resident tasks are (binder)."""

    job: Job
    state: JobState
    task_states: tuple[TaskState, ...]
    placements: dict[int, tuple[str, Gpus]] = field(default_factory=dict)  # task index -> (node, gpus)
    # Per task index, its failures run again (Job.max_retries) over all its attempts; () for none.
    retries: tuple[int, ...] = ()
    # Per task index, why its latest failure failed, in its agent's words ("" none); () for none.
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    node: Node
    cpu_used_milli: int
    memory_used: int
    gpu_used_milli: tuple[int, ...]  # per GPU of node.gpus, in that order
    task_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Counters:
    """The numbers `GetStatus` and /metrics report."""

    nodes: int = 0
    schedulable_nodes: int = 0
    cpu_milli: int = 0
    cpu_used_milli: int = 0
    memory: int = 0
    memory_used: int = 0
    gpu_milli: int = 0
    gpu_used_milli: int = 0
    # Capacity of the schedulable nodes alone (ready: not cordoned, draining or lost).
    schedulable_cpu_milli: int = 0
    schedulable_memory: int = 0
    schedulable_gpu_milli: int = 0
    active_jobs: int = 0
    pending_jobs: int = 0
    in_flight_units: int = 0
    rounds: int = 0
    bound_tasks: int = 0
    binder_conflicts: int = 0
    binder_version: int = 0
    shards: int = 0
    # The binder's store writer (on Ray): batches the binder applied that are not durable yet, and
    # the CPU seconds it has spent writing (since the binder's last start).
    unwritten_batches: int = 0
    writer_cpu_seconds: float = 0.0
