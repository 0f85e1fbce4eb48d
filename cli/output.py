"""What the client commands print: plain data for `-o json|yaml` (dicts and lists with a fixed key
order, exact integers) and aligned tables or `Name: value` blocks for people (`-o table|wide`)."""

import enum
import json
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import typer
import yaml

from gosched.api.client import QueueInfo
from gosched.api.convert import JobInfo, NodeInfo, TaskInfo
from gosched.cli import humanize as h
from gosched.common.resources import GPU_MILLI
from gosched.common.spec import format_duration, format_moment, job_to_spec
from gosched.common.states import TaskState


class Format(enum.StrEnum):
    TABLE = "table"
    WIDE = "wide"
    JSON = "json"
    YAML = "yaml"

    @property
    def is_data(self) -> bool:
        return self in (Format.JSON, Format.YAML)


def dump(data: Any, fmt: Format) -> str:
    if fmt is Format.YAML:
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip("\n")
    return json.dumps(data, indent=2)


def emit(fmt: Format, data: Callable[[], Any], text: Callable[[], str]) -> None:
    """Print `data()` for scripts or `text()` for people, whichever `fmt` asks for."""
    typer.echo(dump(data(), fmt) if fmt.is_data else text())


# == plain data ====================================================================================
def task_counts(info: JobInfo) -> dict[str, int]:
    """The server's counts per task state, in life-cycle order."""
    order = {s.value: i for i, s in enumerate(TaskState)}
    return {k: v for k, v in sorted(info.task_counts.items(), key=lambda kv: order.get(kv[0], 99)) if v}


def task_data(t: TaskInfo) -> dict[str, Any]:
    return {
        "index": t.index,
        "id": t.id,
        "role": t.role,
        "state": t.state.value,
        "node": t.node,
        "gpus": [{"index": i, "milli": m} for i, m in t.gpus],
        "restarts": t.restarts,
        "last_restart_reason": t.last_restart_reason,
        "last_restart_time": t.last_restart_time,
        "retries": t.retries,
        "reason": t.reason,  # why its latest failure failed ("" none)
    }


def job_data(info: JobInfo, *, tasks: bool = False, spec: bool = False) -> dict[str, Any]:
    job = info.job
    total = job.total_request()
    out: dict[str, Any] = {
        "id": info.id,
        "state": info.state.value,
        "queue": job.queue,
        "tenant": job.tenant,
        "priority": job.priority,
        "kind": job.kind.value,
        "min_member": job.min_member,
        "replicas": job.total_replicas,
        "task_counts": task_counts(info),
        "request": {"cpu_milli": total.cpu_milli, "memory": total.memory, "gpu_milli": total.gpu_milli},
        "submit_time": info.submit_time,
        "submission_id": job.submission_id,
        # As the spec has them: unix seconds, seconds each task may run, times each failed task
        # runs again (null: no deadline, no time limit).
        "deadline": job.deadline,
        "time_limit": job.time_limit,
        "max_retries": job.max_retries,
    }
    if spec:
        out["spec"] = job_to_spec(job)
    if tasks:
        out["tasks"] = [task_data(t) for t in info.tasks]
    return out


def node_data(n: NodeInfo) -> dict[str, Any]:
    node = n.node
    used = n.gpu_used_milli
    return {
        "name": node.name,
        "state": n.state_text,  # "drained": draining, and no task left
        "cpu_milli": node.cpu_milli,
        "cpu_used_milli": n.cpu_used_milli,
        "memory": node.memory,
        "memory_used": n.memory_used,
        "gpus": [
            {
                "index": g.index,
                "model": g.model,
                "memory_mib": g.memory_mib,
                "used_milli": used[i] if i < len(used) else 0,
            }
            for i, g in enumerate(node.gpus)
        ],
        "extended": dict(node.extended),  # capacity, e.g. {"example.com/fpga": 2}
        "labels": dict(node.labels),
        "taints": [{"key": t.key, "value": t.value, "effect": t.effect.value} for t in node.taints],
        "tasks": list(n.task_ids),
        "agent_connected": n.agent_connected,
        "heartbeat_age_s": n.heartbeat_age_s,
    }


def queue_data(q: QueueInfo) -> dict[str, Any]:
    return {
        "name": q.name,
        "policy": q.policy,
        "guarantee": q.guarantee,
        "max_share": q.max_share,
        "share": q.share,
    }


# == for people ====================================================================================
def command_text(argv: Sequence[str]) -> str:
    """argv as a shell would take it back: quoted where needed, so argument boundaries show, and
    one line (a newline inside an argument would break a table row)."""
    return shlex.join(argv).replace("\n", "\\n")


def counts_text(info: JobInfo) -> str:
    """The tasks per state, e.g. "3 running, 1 pending" ("-" when none are counted)."""
    return ", ".join(f"{n} {state}" for state, n in task_counts(info).items()) or "-"


def _gpus_held(gpus: Sequence[tuple[int, int]]) -> str:
    """Whole GPUs by index ("0,1"); a share with its fraction ("3:0.25")."""
    return ",".join(str(i) if m >= GPU_MILLI else f"{i}:{h.gpus(m)}" for i, m in gpus)


def _when(t: float) -> str:
    if not t:
        return "-"
    stamp = format_moment(t)
    if stamp.endswith("(unix seconds)"):  # past datetime's range: no span to tell either
        return stamp
    ahead = t - time.time()
    # A deadline may lie ahead; age() clamps negatives (clock skew) to 0s, so say "in" instead.
    return f"{stamp} (in {h.age(ahead)})" if ahead > 0 else f"{stamp} ({h.age(-ahead)} ago)"


def _pairs(items: Mapping[str, str] | Sequence[tuple[str, str]]) -> str:
    pairs = items.items() if isinstance(items, Mapping) else items
    return ",".join(f"{k}={v}" for k, v in pairs)


def jobs_view(infos: Sequence[JobInfo], *, wide: bool = False) -> str:
    headers = ["ID", "STATE", "QUEUE", "TENANT", "PRIORITY", "TASKS", "REQUEST", "AGE"]
    if wide:
        headers += ["KIND", "SUBMISSION-ID", "COMMAND"]
    now = time.time()
    rows = []
    for info in infos:
        job = info.job
        row = [
            info.id,
            info.state.value,
            job.queue,
            job.tenant,
            str(job.priority),
            counts_text(info),
            h.request(job.total_request()),
            h.age(now - info.submit_time) if info.submit_time else "-",
        ]
        if wide:
            row += [job.kind.value, job.submission_id, command_text(job.groups[0].command)]
        rows.append(row)
    return h.table(headers, rows)


def _restarts(t: TaskInfo, now: float) -> str:
    """How many times its agent restarted the task, with how long ago the latest was, as kubectl
    shows a pod's RESTARTS: "3 (42s ago)"."""
    if not t.restarts or not t.last_restart_time:
        return str(t.restarts)
    return f"{t.restarts} ({h.age(now - t.last_restart_time)} ago)"


def tasks_view(info: JobInfo) -> str:
    """The tasks: RESTARTS counts its agent's restarts of a service's process in this attempt (as
    kubectl's), RETRIES its failures run again by the job's max_retries (as Slurm's Restarts);
    RETRIES shows only for a job that has max_retries."""
    now = time.time()
    retrying = bool(info.job.max_retries)
    rows = []
    for t in info.tasks:
        row = [str(t.index), t.id, t.role, t.state.value, _restarts(t, now)]
        if retrying:
            row.append(f"{t.retries}/{info.job.max_retries}")
        rows.append([*row, t.node, _gpus_held(t.gpus)])
    retries = ["RETRIES"] if retrying else []
    headers = ["INDEX", "TASK", "ROLE", "STATE", "RESTARTS", *retries, "NODE", "GPUS"]
    return h.table(headers, rows)


def _groups_text(info: JobInfo) -> str:
    return "\n".join(
        f"{g.role} x{g.replicas}: {h.request(g.resources)}; {command_text(g.command)}"
        for g in info.job.groups
    )


def _limits(info: JobInfo) -> list[tuple[str, str]]:
    """The job's deadline, time limit and retries, those it has."""
    job = info.job
    pairs = []
    if job.deadline is not None:
        pairs.append(("Deadline", _when(job.deadline)))
    if job.time_limit is not None:
        pairs.append(("Time limit", f"{format_duration(job.time_limit)} per task"))
    if job.max_retries:
        pairs.append(("Max retries", f"{job.max_retries} per task"))
    return pairs


def job_view(info: JobInfo) -> str:
    """`gosched get`: the job in a few lines, then its tasks with their restarts, node and GPUs."""
    job = info.job
    head = h.fields(
        [
            ("Job", info.id),
            ("State", info.state.value),
            ("Queue", job.queue),
            ("Tenant", job.tenant),
            ("Priority", str(job.priority)),
            ("Tasks", f"{job.total_replicas} (min member {job.min_member}): {counts_text(info)}"),
            ("Submitted", _when(info.submit_time)),
            *_limits(info),
        ]
    )
    groups = "\n".join("  " + line for line in _groups_text(info).splitlines())
    return f"{head}\nGroups:\n{groups}\n\n{tasks_view(info)}"


def describe_view(info: JobInfo, explanation: str) -> str:
    """`gosched describe`: every field of the spec, the tasks, and why the job is where it is."""
    job = info.job
    pairs = [
        ("Job", info.id),
        ("State", info.state.value),
        ("Tasks", f"{job.total_replicas} (min member {job.min_member}): {counts_text(info)}"),
        ("Submitted", _when(info.submit_time)),
    ]
    pairs.extend(_limits(info))
    spec = yaml.safe_dump(job_to_spec(job), sort_keys=False, default_flow_style=None).rstrip("\n")
    indented = "\n".join("  " + line for line in spec.splitlines())
    why = "\n".join("  " + line for line in explanation.splitlines())
    return f"{h.fields(pairs)}\n\nSpec:\n{indented}\n\nTasks:\n{tasks_view(info)}\n\nExplanation:\n{why}"


def _gpu_column(n: NodeInfo) -> str:
    gpus = n.node.gpus
    if not gpus:
        return "-"
    models = "+".join(sorted({g.model for g in gpus if g.model}))
    used = h.gpus(sum(n.gpu_used_milli))
    return f"{used}/{len(gpus)} {models}".rstrip()


def _gpu_list(n: NodeInfo) -> str:
    """Each GPU with its model and the share of it in use: "0:A100=0.5,1:A100=0"."""
    used = n.gpu_used_milli
    return ",".join(
        f"{g.index}:{g.model or '?'}={h.gpus(used[i] if i < len(used) else 0)}"
        for i, g in enumerate(n.node.gpus)
    )


def _agent(n: NodeInfo) -> str:
    if n.heartbeat_age_s < 0:
        return "-"  # a simulated or static node: no agent
    state = "connected" if n.agent_connected else "lost"
    return f"{state} ({n.heartbeat_age_s:.1f}s)"


def nodes_view(nodes: Sequence[NodeInfo], *, wide: bool = False) -> str:
    headers = ["NAME", "STATE", "CPU", "MEMORY", "GPU", "TASKS"]
    if wide:
        headers += ["EXTENDED", "LABELS", "TAINTS", "GPUS", "AGENT"]
    rows = []
    for n in nodes:
        node = n.node
        row = [
            node.name,
            n.state_text,
            f"{h.cores(n.cpu_used_milli)}/{h.cores(node.cpu_milli)}",
            f"{h.memory(n.memory_used)}/{h.memory(node.memory)}",
            _gpu_column(n),
            str(len(n.task_ids)),
        ]
        if wide:
            taints = ",".join(f"{t.key}={t.value}:{t.effect.value}" for t in node.taints)
            extended = _pairs([(k, str(v)) for k, v in node.extended])
            row += [extended, _pairs(node.labels), taints, _gpu_list(n), _agent(n)]
        rows.append(row)
    return h.table(headers, rows)


def _percent(x: float) -> str:
    return f"{x * 100:.1f}%"


def queues_view(queues: Sequence[QueueInfo]) -> str:
    rows = [
        [q.name, q.policy, _percent(q.guarantee), _percent(q.max_share), _percent(q.share)] for q in queues
    ]
    return h.table(["NAME", "POLICY", "GUARANTEE", "MAX-SHARE", "SHARE"], rows)


def status_view(s: Mapping[str, Any]) -> str:
    if not s.get("ready"):
        return h.fields([("Ready", "no (the scheduler is starting or has stopped)")])
    return h.fields(
        [
            ("Ready", "yes"),
            ("Nodes", f"{s['nodes']} ({s['schedulable_nodes']} schedulable)"),
            (
                "CPU",
                f"{h.cores(s['cpu_used_milli'])}/{h.cores(s['cpu_milli'])} cores"
                + _on_ready(s, "cpu", h.cores),
            ),
            (
                "Memory",
                f"{h.memory(s['memory_used'])}/{h.memory(s['memory'])}" + _on_ready(s, "memory", h.memory),
            ),
            ("GPU", f"{h.gpus(s['gpu_used_milli'])}/{h.gpus(s['gpu_milli'])}" + _on_ready(s, "gpu", h.gpus)),
            # active counts every job not yet ended, the pending ones too: say so, or "3 active,
            # 3 pending" reads as six jobs. "Pending" here is the dispatcher's: a job with a task
            # waiting for a place, which may be running (`jobs --state` reads the job's state).
            (
                "Jobs",
                f"{s['active_jobs']} not ended: {s['pending_jobs']} with tasks waiting for a place, "
                f"{max(0, s['active_jobs'] - s['pending_jobs'])} all placed or being placed",
            ),
            ("Shards", str(s["shards"])),
            ("Rounds", str(s["rounds"])),
            # bound_tasks is gosched_bound_tasks: bindings since the master started, not tasks bound now
            ("Bindings since start", str(s["bound_tasks"])),
            ("Conflicts", str(s["binder_conflicts"])),
        ]
    )


def _on_ready(s: Mapping[str, Any], resource: str, show: Callable[[int], str]) -> str:
    """How much of a total is on schedulable nodes, where some nodes are not."""
    key = {"cpu": "cpu_milli", "memory": "memory", "gpu": "gpu_milli"}[resource]
    ready = s.get(f"schedulable_{key}", s[key])
    return "" if ready == s[key] else f" ({show(ready)} on schedulable nodes)"


def node_line(n: NodeInfo) -> str:
    return f"node {n.name} {n.state.value}"
