"""Conversions between the gosched.v1 protobuf messages and the gosched.common model.

Job specs go through the spec dict format of `gosched.common.spec`: a `JobSpec` message becomes
the same dict a YAML file would give, so `job_from_spec` validates it and its `SpecError` names the
field by the same path (``groups[0].resources.memory``). Quantities travel as strings ("16Gi").
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from gosched.common.errors import SpecError
from gosched.common.job import Job, TaskGroup
from gosched.common.node import AGENT_LABEL, RUNTIME_LABEL, Node, NodeState
from gosched.common.spec import gpu_spec, group_from_spec, job_from_spec, job_to_spec, node_from_spec
from gosched.common.states import JobState, TaskState
from gosched.proto.v1 import types_pb2 as pb

__all__ = [
    "JobInfo",
    "NodeInfo",
    "TaskInfo",
    "job_from_proto",
    "job_info_from_proto",
    "job_spec_from_dict",
    "job_spec_to_dict",
    "job_state_from_proto",
    "job_state_to_proto",
    "job_to_proto_spec",
    "node_from_proto",
    "node_info_from_proto",
    "node_state_from_proto",
    "node_state_to_proto",
    "node_to_proto",
    "task_state_from_proto",
    "task_state_to_proto",
]

_QUANTITY_KEYS = ("cpu", "memory", "gpus", "gpu_share", "gpu_memory")
_INT_RESOURCE_KEYS = ("gpu_milli", "gpu_memory_mib")
_OPTIONAL_JOB_KEYS = (
    "priority",
    "min_member",
    "preemptible",
    "deadline",
    "disruption_budget",
    "submit_time",
    "time_limit",
    "max_retries",
)


# == enums =========================================================================================
def job_state_to_proto(state: JobState) -> "pb.JobState":
    return cast("pb.JobState", pb.JobState.Value(f"JOB_STATE_{state.name}"))


def job_state_from_proto(value: int, field: str = "state") -> JobState | None:
    """None for JOB_STATE_UNSPECIFIED; SpecError naming `field` for a number the enum lacks."""
    try:
        name = pb.JobState.Name(value).removeprefix("JOB_STATE_")
    except ValueError:
        raise _unknown_state(field, "job state", value, pb.JobState.items(), "JOB_STATE_") from None
    return None if name == "UNSPECIFIED" else JobState[name]


def task_state_to_proto(state: TaskState) -> "pb.TaskState":
    return cast("pb.TaskState", pb.TaskState.Value(f"TASK_STATE_{state.name}"))


def task_state_from_proto(value: int, field: str = "state") -> TaskState | None:
    try:
        name = pb.TaskState.Name(value).removeprefix("TASK_STATE_")
    except ValueError:
        raise _unknown_state(field, "task state", value, pb.TaskState.items(), "TASK_STATE_") from None
    return None if name == "UNSPECIFIED" else TaskState[name]


def node_state_to_proto(state: NodeState) -> "pb.NodeState":
    return cast("pb.NodeState", pb.NodeState.Value(f"NODE_STATE_{state.name}"))


def node_state_from_proto(value: int, field: str = "state") -> NodeState | None:
    try:
        name = pb.NodeState.Name(value).removeprefix("NODE_STATE_")
    except ValueError:
        raise _unknown_state(field, "node state", value, pb.NodeState.items(), "NODE_STATE_") from None
    return None if name == "UNSPECIFIED" else NodeState[name]


def _unknown_state(
    field: str, what: str, value: int, known: Iterable[tuple[str, int]], prefix: str
) -> SpecError:
    """A number the enum does not define (a newer peer, or a typo) is the sender's mistake: a
    SpecError, so the API answers INVALID_ARGUMENT rather than INTERNAL."""
    listed = ", ".join(f"{number} {name.removeprefix(prefix).lower()}" for name, number in known)
    return SpecError(field, f"unknown {what} {value} (known: {listed})")


# == job spec: proto -> dict -> Job =================================================================
def _requirements(term: pb.NodeSelectorTerm) -> list[dict[str, Any]]:
    out = []
    for r in term.requirements:
        item: dict[str, Any] = {"key": r.key, "operator": r.operator}
        if r.values:
            item["values"] = list(r.values)
        out.append(item)
    return out


def _resources_to_dict(res: pb.Resources) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _QUANTITY_KEYS:
        if getattr(res, key):
            out[key] = getattr(res, key)
    for key in _INT_RESOURCE_KEYS:
        if getattr(res, key):
            out[key] = getattr(res, key)
    if res.extended:
        out["extended"] = dict(res.extended)
    return out


def _group_to_dict(g: pb.TaskGroup) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if g.role:
        out["role"] = g.role
    if g.HasField("replicas"):
        out["replicas"] = g.replicas
    if g.command:
        out["command"] = list(g.command)
    if g.env:
        out["env"] = dict(g.env)
    if g.HasField("resources"):
        out["resources"] = _resources_to_dict(g.resources)
    if g.gpu_models:
        out["gpu_models"] = list(g.gpu_models)
    if g.gpu_topology:
        out["gpu_topology"] = g.gpu_topology
    if g.node_selector:
        out["node_selector"] = dict(g.node_selector)
    if g.HasField("affinity"):
        affinity: dict[str, Any] = {}
        if g.affinity.required:
            affinity["required"] = [_requirements(t) for t in g.affinity.required]
        if g.affinity.preferred:
            preferred = []
            for p in g.affinity.preferred:
                item: dict[str, Any] = {"weight": p.weight}
                if p.HasField("match"):
                    item["match"] = _requirements(p.match)
                preferred.append(item)
            affinity["preferred"] = preferred
        out["affinity"] = affinity
    if g.anti_affinity:
        anti = []
        for a in g.anti_affinity:
            entry: dict[str, Any] = {}
            if a.topology_key:
                entry["topology_key"] = a.topology_key
            if a.match_labels:
                entry["match_labels"] = dict(a.match_labels)
            anti.append(entry)
        out["anti_affinity"] = anti
    if g.tolerations:
        tolerations = []
        for t in g.tolerations:
            tol: dict[str, Any] = {}
            for key in ("key", "operator", "value", "effect"):
                if getattr(t, key):
                    tol[key] = getattr(t, key)
            tolerations.append(tol)
        out["tolerations"] = tolerations
    if g.image:
        out["image"] = g.image
    return out


def job_spec_to_dict(spec: pb.JobSpec, *, groups: bool = True) -> dict[str, Any]:
    """The spec dict (common/spec.py format) of a JobSpec message: only the fields that are set
    (the groups too, unless `groups` is false)."""
    out: dict[str, Any] = {}
    for key in ("id", "tenant", "queue", "kind", "submission_id"):
        if getattr(spec, key):
            out[key] = getattr(spec, key)
    for key in _OPTIONAL_JOB_KEYS:
        if spec.HasField(key):
            out[key] = getattr(spec, key)
    if spec.labels:
        out["labels"] = dict(spec.labels)
    if groups:
        out["groups"] = [_group_to_dict(g) for g in spec.groups]
    return out


def job_from_proto(
    spec: pb.JobSpec,
    *,
    submission_id: str = "",
    known_queues: Sequence[str] | None = None,
    now: float | None = None,
) -> Job:
    """Validate a JobSpec message into a Job; SpecError naming the field if it is invalid."""
    data = job_spec_to_dict(spec, groups=False)
    if submission_id:
        data["submission_id"] = submission_id
    return job_from_spec(data, known_queues=known_queues, now=now, groups=_groups_of(spec))


# Task groups already validated, by their serialized message: a batch framework submits many jobs
# whose groups are the same, and validating a group is most of the cost of a submission.
_GROUP_CACHE: dict[bytes, TaskGroup] = {}
_GROUP_CACHE_MAX = 4096


def _groups_of(spec: pb.JobSpec) -> tuple[TaskGroup, ...]:
    if not spec.groups:
        raise SpecError("groups", "needs at least one group")
    out = []
    for i, g in enumerate(spec.groups):
        key = g.SerializeToString(deterministic=True)
        group = _GROUP_CACHE.get(key)
        if group is None:
            group = group_from_spec(_group_to_dict(g), f"groups[{i}]")
            if len(_GROUP_CACHE) >= _GROUP_CACHE_MAX:
                _GROUP_CACHE.clear()
            _GROUP_CACHE[key] = group
        out.append(group)
    return tuple(out)


# == job spec: dict / Job -> proto ==================================================================
def _term_msg(requirements: Sequence[Mapping[str, Any]]) -> pb.NodeSelectorTerm:
    return pb.NodeSelectorTerm(
        requirements=[
            pb.Requirement(key=r["key"], operator=r["operator"], values=[str(v) for v in r.get("values", [])])
            for r in requirements
        ]
    )


def _group_msg(g: Mapping[str, Any]) -> pb.TaskGroup:
    res = g.get("resources", {})
    fields: dict[str, Any] = {k: str(res[k]) for k in _QUANTITY_KEYS if k in res}
    fields.update({k: int(res[k]) for k in _INT_RESOURCE_KEYS if k in res})
    resources = pb.Resources(extended={k: int(v) for k, v in res.get("extended", {}).items()}, **fields)
    msg = pb.TaskGroup(
        role=g.get("role", ""),
        command=list(g.get("command", [])),
        env=dict(g.get("env", {})),
        resources=resources,
        gpu_models=list(g.get("gpu_models", [])),
        gpu_topology=g.get("gpu_topology", ""),
        node_selector=dict(g.get("node_selector", {})),
        anti_affinity=[
            pb.AntiAffinity(
                topology_key=a.get("topology_key", ""), match_labels=dict(a.get("match_labels", {}))
            )
            for a in g.get("anti_affinity", [])
        ],
        tolerations=[
            pb.Toleration(
                key=t.get("key", ""),
                operator=t.get("operator", ""),
                value=t.get("value", ""),
                effect=t.get("effect") or "",
            )
            for t in g.get("tolerations", [])
        ],
        image=g.get("image", ""),
    )
    if "replicas" in g:
        msg.replicas = g["replicas"]
    if "affinity" in g:
        aff = g["affinity"]
        msg.affinity.CopyFrom(
            pb.Affinity(
                required=[_term_msg(t) for t in aff.get("required", [])],
                preferred=[
                    pb.PreferredTerm(weight=p["weight"], match=_term_msg(p["match"]))
                    for p in aff.get("preferred", [])
                ],
            )
        )
    return msg


def job_spec_from_dict(spec: Mapping[str, Any]) -> pb.JobSpec:
    """A JobSpec message from a canonical spec dict (as `job_to_spec` writes it: groups form)."""
    msg = pb.JobSpec(
        id=spec.get("id", ""),
        tenant=spec.get("tenant", ""),
        queue=spec.get("queue", ""),
        kind=spec.get("kind", ""),
        labels=dict(spec.get("labels", {})),
        submission_id=spec.get("submission_id", ""),
        groups=[_group_msg(g) for g in spec.get("groups", [])],
    )
    for key in _OPTIONAL_JOB_KEYS:
        if spec.get(key) is not None:
            setattr(msg, key, spec[key])
    return msg


def job_to_proto_spec(job: Job, *, submit_time: bool = True, job_id: bool = True) -> pb.JobSpec:
    """The JobSpec message of a Job; `job_from_proto` turns it back into the same Job. Without
    `submit_time` the server stamps it; without `job_id` the server generates the id, as for a spec
    that names none (the same for every retry of a submission id: dispatcher.same_request)."""
    spec = job_to_spec(job)
    if not submit_time:
        spec.pop("submit_time", None)
    if not job_id:
        spec.pop("id", None)
    return job_spec_from_dict(spec)


# == nodes =========================================================================================
def node_to_proto(node: Node) -> pb.Node:
    return pb.Node(
        name=node.name,
        cpu_milli=node.cpu_milli,
        memory=node.memory,
        gpus=[
            pb.Gpu(
                index=g.index,
                uuid=g.uuid,
                model=g.model,
                memory_mib=g.memory_mib,
                numa_node=g.numa_node,
                nvlink_peers=list(g.nvlink_peers),
            )
            for g in node.gpus
        ],
        labels=dict(node.labels),
        taints=[pb.Taint(key=t.key, value=t.value, effect=t.effect.value) for t in node.taints],
        extended=dict(node.extended),
        state=node_state_to_proto(node.state),
    )


def node_from_proto(msg: pb.Node, *, new: bool = True) -> Node:
    """Validate a Node message (e.g. an agent's registration) into a Node; SpecError if invalid.
    `new=False` for a node the master already holds (see node_from_spec)."""
    spec: dict[str, Any] = {"name": msg.name, "cpu": f"{msg.cpu_milli}m", "memory": msg.memory}
    if msg.gpus:
        spec["gpus"] = [gpu_spec(g) for g in msg.gpus]
    if msg.labels:
        spec["labels"] = dict(msg.labels)
    if msg.taints:
        spec["taints"] = [
            {"key": t.key, "value": t.value, **({"effect": t.effect} if t.effect else {})} for t in msg.taints
        ]
    if msg.extended:
        spec["extended"] = dict(msg.extended)
    state = node_state_from_proto(msg.state)
    if state is not None:
        spec["state"] = state.value
    return node_from_spec(spec, new=new)


# == read-side views (what the Client returns) =======================================================
@dataclass(frozen=True, slots=True)
class TaskInfo:
    id: str
    index: int
    role: str
    state: TaskState
    node: str = ""
    gpus: tuple[tuple[int, int], ...] = ()  # (GPU index, milli)
    # How many times its node agent restarted the task's process in this attempt (a service's task
    # whose process exited, with any exit code; 0 again once it is placed anew), how the process
    # behind the latest restart ended ("exit code 1") and when (unix seconds, the agent's clock; 0:
    # no restart).
    restarts: int = 0
    last_restart_reason: str = ""
    last_restart_time: float = 0.0
    retries: int = 0  # how many of its failures were run again (max_retries), over all its attempts
    reason: str = ""  # why its latest failure failed, in its agent's words; "" none


@dataclass(frozen=True, slots=True)
class JobInfo:
    id: str
    state: JobState
    job: Job
    tasks: tuple[TaskInfo, ...] = ()  # empty in list() answers
    task_counts: Mapping[str, int] = field(default_factory=dict)
    submit_time: float = 0.0

    @property
    def final(self) -> bool:
        return self.state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node: Node
    cpu_used_milli: int = 0
    memory_used: int = 0
    gpu_used_milli: tuple[int, ...] = ()
    task_ids: tuple[str, ...] = ()
    heartbeat_age_s: float = -1.0  # -1: no agent (a simulated or static node)
    agent_connected: bool = False
    limits: str = ""  # how the agent limits tasks, e.g. "none: cgroup v2 not writable"

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def state(self) -> NodeState:
        return self.node.state

    @property
    def drained(self) -> bool:
        """Draining and no task holds resources here any more: as Slurm's "drained", the machine
        can be taken down. (A task cancelled a moment ago may still be being stopped by its
        agent: the master frees its resources at once.)"""
        return self.node.state is NodeState.DRAINING and not self.task_ids

    @property
    def state_text(self) -> str:
        """The state as the node views show it: "drained" for a drained node, else the state."""
        return "drained" if self.drained else self.node.state.value

    @property
    def simulated(self) -> bool:
        """A simulated node (runtime.simulation marks them): no process runs there, so its tasks
        have no output. A node an agent registered is never simulated."""
        labels = self.node.label_dict()
        return labels.get(RUNTIME_LABEL) == "simulated" and AGENT_LABEL not in labels


def job_info_from_proto(msg: pb.Job) -> JobInfo:
    state = job_state_from_proto(msg.state)
    return JobInfo(
        id=msg.id,
        state=state if state is not None else JobState.PENDING,
        job=job_from_proto(msg.spec),
        tasks=tuple(
            TaskInfo(
                id=t.id,
                index=t.index,
                role=t.role,
                state=task_state_from_proto(t.state) or TaskState.PENDING,
                node=t.node,
                gpus=tuple((g.index, g.milli) for g in t.gpus),
                restarts=t.restarts,
                last_restart_reason=t.last_restart_reason,
                last_restart_time=t.last_restart_time,
                retries=t.retries,
                reason=t.reason,
            )
            for t in msg.tasks
        ),
        task_counts=dict(msg.task_counts),
        submit_time=msg.submit_time,
    )


def node_info_from_proto(msg: pb.NodeInfo) -> NodeInfo:
    return NodeInfo(
        node=node_from_proto(msg.node, new=False),
        cpu_used_milli=msg.cpu_used_milli,
        memory_used=msg.memory_used,
        gpu_used_milli=tuple(msg.gpu_used_milli),
        task_ids=tuple(msg.task_ids),
        heartbeat_age_s=msg.heartbeat_age_s,
        agent_connected=msg.agent_connected,
        limits=msg.limits,
    )
