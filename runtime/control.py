"""The control plane as the API server sees it: one interface over the scheduler, whether its
components run in this process (`LocalControl`, runtime/local_control.py) or as Ray actors
(`RayControl`, runtime/ray_control.py).

Every query returns plain snapshots (gosched.common.snapshots), never a live component object, so the
same API code serves both: over Ray a snapshot is one actor call, whatever its size.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from gosched.common.job import Job, split_task_id, task_id, tolerates
from gosched.common.node import Node, NodeState, TaintEffect
from gosched.common.snapshots import Counters, Gpus, JobSnapshot, NodeSnapshot
from gosched.common.states import HOLDS_RESOURCES, TERMINAL, TaskState


class ControlUnavailable(RuntimeError):
    """A component did not answer (an actor restarting): the call failed but may be retried. Where
    it changed something (a submission), it may or may not have taken effect: the message says."""


class SchedulerFailure(RuntimeError):
    """A failure the scheduler cannot go on from, whose message says all a user needs to know
    (what, where, what to do): shown as it is, without a traceback or the exception's type."""


class ControlLost(ControlUnavailable, SchedulerFailure):
    """The control plane is gone for good (over Ray: the cluster its actors ran in is lost). The
    service stops; a master exits non-zero, so that its supervisor starts it again."""


def describe_error(exc: BaseException, limit: int = 300) -> str:
    """One line for a user: the exception's type and message, then what it was raised from
    ("; caused by ..."), each message on one line, a traceback inside a message (Ray puts some
    there) cut down to the exception it ends with."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(parts) < 6:
        seen.add(id(current))
        text = _message(current, limit)
        if not parts or text.partition(": ")[2] not in parts[-1]:
            parts.append(text)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return "; caused by ".join(parts)


def _message(exc: BaseException, limit: int) -> str:
    text = str(exc)
    head, marker, trace = text.partition("Traceback (most recent call last):")
    if marker:  # keep the words before it and the exception line(s) it ends with
        lines = trace.splitlines()
        frames = [i for i, line in enumerate(lines) if line.startswith(" ")]
        tail = [line for line in lines[(frames[-1] + 1 if frames else 0) :] if line.strip()]
        text = f"{head} {' '.join(tail)}"
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 3].rstrip() + "..."
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


class ControlPlane(Protocol):
    """What the API service needs of the scheduler. Calls may come from several threads, but the
    service serialises them (one lock), so implementations need not be thread-safe."""

    # -- scheduling ----------------------------------------------------------------------------------
    def step(self) -> bool:
        """Advance scheduling a little; True if work was dispatched or bound (else the caller idles)."""
        ...

    def close(self) -> None: ...

    @property
    def unavailable(self) -> str | None:
        """Why the control plane cannot serve now (a component or its cluster does not answer;
        the service is not ready meanwhile), or None. Raising ControlLost instead means for good."""
        ...

    def idle_wait(self) -> float:
        """After a step that made no progress: seconds until the next step is due (a submission or
        another change, which wakes the caller, may come sooner)."""
        ...

    # -- jobs ------------------------------------------------------------------------------------------
    def submit_many(self, jobs: Sequence[Job]) -> list[str]:
        """Admit jobs (SpecError / AdmissionRejected on refusal); returns their ids."""
        ...

    def job_ids(self) -> list[str]:
        """Every job the dispatcher still knows, oldest submission first (after a restart too)."""
        ...

    def jobs(
        self, job_ids: Sequence[str], *, placements: bool, ended: bool = False
    ) -> list[JobSnapshot | None]:
        """Snapshots in the order asked (None: unknown job); with `placements`, where the tasks
        holding resources are, and with `ended` too, where the ended tasks ran (the store)."""
        ...

    def cancel(self, job_id: str) -> None: ...

    def explain(self, job_id: str) -> str: ...

    def drain_latencies(self) -> list[float]:
        """Dispatch -> bind seconds of the tasks bound since the last call."""
        ...

    # -- task lives (reported by node agents) -----------------------------------------------------------
    def started(self, task_ids: Sequence[str]) -> None:
        """bound -> running."""
        ...

    def finished(
        self, task_ids: Sequence[str], final: TaskState, reasons: Mapping[str, str] | None = None
    ) -> None:
        """The tasks ended on their node (SUCCEEDED / FAILED): free their resources. `reasons`:
        why a task failed, as its agent said (shown by explain)."""
        ...

    def lost(self, task_ids: Sequence[str]) -> None:
        """The tasks are gone with their node or agent: free them and queue them again."""
        ...

    def task_attempts(self, task_ids: Sequence[str]) -> dict[str, int]:
        """Each task's restart count (times it went back to pending after holding resources)."""
        ...

    # -- nodes -------------------------------------------------------------------------------------------
    def add_nodes(self, nodes: Sequence[Node]) -> None:
        """Register or update nodes. The residents an updated node can no longer hold (on a GPU it
        lost, over its new capacity, not tolerating a NoExecute taint) are released as lost and
        queued again; its agent is told to kill them (the gateway's tick)."""
        ...

    def set_node_state(self, name: str, state: NodeState) -> None:
        """KeyError for an unknown node."""
        ...

    def node_lost(self, name: str) -> list[str]:
        """The node stopped answering: mark it not ready and requeue its tasks (a gang that loses
        members below its min_member is evicted whole). Returns the task ids released."""
        ...

    def remove_node(self, name: str) -> list[str]:
        """Delete the node (KeyError if unknown); its tasks are requeued as at its loss. Returns
        the task ids released."""
        ...

    def nodes(self, names: Sequence[str] | None = None) -> list[NodeSnapshot]:
        """Live nodes (those named, if given; unknown names are left out)."""
        ...

    def residents(self, names: Sequence[str]) -> dict[str, list[str]]:
        """Task ids holding resources on each named node (an unknown node: none)."""
        ...

    def resident_runs(self, names: Sequence[str]) -> dict[str, dict[str, float]]:
        """As residents, with the time each task was bound there (which tells its runs apart)."""
        ...

    # -- cluster -----------------------------------------------------------------------------------------
    def queue_shares(self) -> dict[str, float]: ...

    def counters(self) -> Counters: ...

    def pending_tasks(self) -> int:
        """Tasks waiting to be placed, over all jobs."""
        ...


def with_placements(
    snapshots: list[JobSnapshot | None],
    where: Callable[[list[str]], dict[str, tuple[str, Gpus]]],
    *,
    ended: bool = False,
) -> list[JobSnapshot | None]:
    """Fill in where each job's resident tasks are, and with `ended` where its ended tasks ran;
    `where` asks the binder for many tasks at once."""
    shown = HOLDS_RESOURCES | TERMINAL if ended else HOLDS_RESOURCES
    tids = [
        task_id(s.job.id, i)
        for s in snapshots
        if s is not None
        for i, st in enumerate(s.task_states)
        if st in shown
    ]
    if not tids:
        return snapshots
    found = where(tids)
    out: list[JobSnapshot | None] = []
    for s in snapshots:
        if s is None:
            out.append(None)
            continue
        mine = {i: found[t] for i in range(len(s.task_states)) if (t := task_id(s.job.id, i)) in found}
        out.append(replace(s, placements=mine))
    return out


def untolerated(
    nodes: Sequence[Node],
    residents: dict[str, list[str]],
    jobs: Callable[[list[str]], Sequence[JobSnapshot | None]],
) -> list[str]:
    """The tasks in `residents` (node name -> task ids) that do not tolerate a NoExecute taint of
    their node in `nodes`: such a taint evicts what runs there, not only keeps new tasks off."""
    out: list[str] = []
    for node in nodes:
        no_execute = [t for t in node.taints if t.effect == TaintEffect.NO_EXECUTE]
        tids = residents.get(node.name, [])
        if not no_execute or not tids:
            continue
        job_ids = sorted({split_task_id(tid)[0] for tid in tids})
        known = {snap.job.id: snap.job for snap in jobs(job_ids) if snap is not None}
        for tid in tids:
            job_id, index = split_task_id(tid)
            job = known.get(job_id)
            if job is None:
                continue  # not the dispatcher's (finished meanwhile): its release is under way
            tolerations = job.group_of(index).tolerations
            if not all(tolerates(tolerations, taint) for taint in no_execute):
                out.append(tid)
    return out
