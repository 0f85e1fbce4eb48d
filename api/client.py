"""The Python client of a running GoSched (what a batch framework's driver uses).

    from gosched import Client

    with Client("localhost:9090") as client:
        job_id = client.submit({"groups": [{"role": "worker", "replicas": 4, "command": "python train.py",
                                            "resources": {"cpu": 4, "memory": "16Gi", "gpus": 1}}],
                                "min_member": 4}, submission_id="driver-run-17")
        info = client.wait(job_id, states={JobState.RUNNING}, timeout=60)
        for task in info.tasks:
            print(task.id, task.node, task.gpus)

Every failed call raises a `GoschedError` subclass carrying the gRPC code and the server's message
(`InvalidArgument.field` names the bad field of a spec).
"""

import builtins
import math
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc

from gosched.api import convert
from gosched.api.channel import ChannelSecurity, open_channel
from gosched.api.convert import JobInfo, NodeInfo
from gosched.api.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    GoschedError,
    InvalidArgument,
    MessageTooLarge,
    NotFound,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
)
from gosched.common.errors import SpecError
from gosched.common.job import Job
from gosched.common.node import NodeState
from gosched.common.spec import RELATIVE_WITH_SUBMISSION_ID, is_relative_deadline, job_from_spec
from gosched.common.states import JobState
from gosched.proto.v1 import cluster_pb2, cluster_pb2_grpc, jobs_pb2, jobs_pb2_grpc
from gosched.proto.v1 import types_pb2 as pb

# Answers may be larger than gRPC's default 4 MiB (a job of 100,000 tasks described in full); a
# request over the server's limit is refused there, as MessageTooLarge.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]

__all__ = [
    "AlreadyExists",
    "Client",
    "DeadlineExceeded",
    "FailedPrecondition",
    "GoschedError",
    "InvalidArgument",
    "JobInfo",
    "MessageTooLarge",
    "NodeInfo",
    "NotFound",
    "QueueInfo",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
]

FINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
# gRPC turns a timeout into a deadline from now: one beyond about 3e9 s (infinity included)
# overflows into a deadline already passed, and the call fails at once. A billion seconds (31
# years) is as good as none.
MAX_TIMEOUT_S = 1e9
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class QueueInfo:
    name: str
    policy: str
    guarantee: float
    max_share: float
    share: float


class Client:
    """A connection to the scheduler's gRPC API. `timeout`: seconds per unary call (None: none).

    A secured master (see README, "Securing the API"): `tls_ca`, the PEM file of the CA that signed
    its certificate (TLS; a client certificate alone also turns TLS on, checking the master against
    the system's roots); `tls_cert` and `tls_key`, this client's certificate and key (mutual TLS);
    `token`, or `token_file` (its first line), the API token sent as `authorization: Bearer`.
    An unusable file or option raises SecretFileError (a ValueError) naming the parameter.
    """

    def __init__(
        self,
        target: str = "localhost:9090",
        *,
        timeout: float | None = 30.0,
        channel: grpc.Channel | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        token: str | None = None,
        token_file: str | None = None,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self._own_channel = channel is None
        if channel is None:
            security = ChannelSecurity.from_files(
                tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, token=token, token_file=token_file
            )
            channel = open_channel(target, security, CHANNEL_OPTIONS)
        elif any(v is not None for v in (tls_ca, tls_cert, tls_key, token, token_file)):
            raise ValueError("channel: a channel of one's own carries its own TLS and tokens")
        self.channel = channel
        self._jobs = jobs_pb2_grpc.JobServiceStub(self.channel)
        self._cluster = cluster_pb2_grpc.ClusterServiceStub(self.channel)

    # -- plumbing ----------------------------------------------------------------------------------
    def close(self) -> None:
        if self._own_channel:
            self.channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        try:
            return method(request, timeout=_grpc_timeout(self.timeout if timeout is None else timeout))
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the server answers and its scheduler is ready (Unavailable after `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                if self.status(timeout=max(0.05, min(left, 1.0)))["ready"]:
                    return
            except (Unavailable, DeadlineExceeded):
                pass
            if time.monotonic() >= deadline:
                raise Unavailable(f"{self.target} not ready after {timeout}s")
            time.sleep(0.05)

    # -- jobs --------------------------------------------------------------------------------------
    def submit(self, spec: Mapping[str, Any] | Job, *, submission_id: str = "") -> str:
        """Submit a job (a spec dict as in gosched.common.spec, or a Job); returns its id.

        With `submission_id`, submitting again returns the id of the job first accepted under it.
        A spec dict is validated here first, so a bad one fails without a round trip.
        """
        msg = _spec_message(spec, submission_id=submission_id)
        reply = self._call(
            self._jobs.SubmitJob, jobs_pb2.SubmitJobRequest(spec=msg, submission_id=submission_id)
        )
        return str(reply.job_id)

    def submit_many(
        self, specs: Sequence[Mapping[str, Any] | Job], *, submission_ids: Sequence[str] = ()
    ) -> builtins.list[str]:
        """Submit jobs in one call, all or none (a bad one names itself: "jobs[3].cpu: ...").
        Returns their ids in order; `submission_ids`, if given, pairs one with each spec."""
        if submission_ids and len(submission_ids) != len(specs):
            raise ValueError(f"{len(submission_ids)} submission ids for {len(specs)} specs")
        request = jobs_pb2.SubmitJobsRequest()
        for i, spec in enumerate(specs):
            msg = _spec_message(spec, f"jobs[{i}].", submission_ids[i] if submission_ids else "")
            request.jobs.add(spec=msg, submission_id=submission_ids[i] if submission_ids else "")
        reply = self._call(self._jobs.SubmitJobs, request)
        return [str(j) for j in reply.job_ids]

    def get(self, job_id: str) -> JobInfo:
        return convert.job_info_from_proto(
            self._call(self._jobs.GetJob, jobs_pb2.GetJobRequest(job_id=job_id))
        )

    def list_page(
        self,
        *,
        state: JobState | str | None = None,
        queue: str = "",
        tenant: str = "",
        page_size: int = 100,
        page_token: str = "",
    ) -> tuple[builtins.list[JobInfo], str]:
        """One page of jobs (submission order) and the token of the next ("" at the end)."""
        request = jobs_pb2.ListJobsRequest(
            state=(
                convert.job_state_to_proto(_as_state(state, "state"))
                if state is not None
                else pb.JOB_STATE_UNSPECIFIED
            ),
            queue=queue,
            tenant=tenant,
            page_size=page_size,
            page_token=page_token,
        )
        reply = self._call(self._jobs.ListJobs, request)
        return [convert.job_info_from_proto(j) for j in reply.jobs], str(reply.next_page_token)

    def list(
        self,
        *,
        state: JobState | str | None = None,
        queue: str = "",
        tenant: str = "",
        page_size: int = 100,
        limit: int | None = None,
    ) -> builtins.list[JobInfo]:
        """Every matching job (following pages), at most `limit`. Tasks are not filled in."""
        out: builtins.list[JobInfo] = []
        token = ""
        while True:
            jobs, token = self.list_page(
                state=state, queue=queue, tenant=tenant, page_size=page_size, page_token=token
            )
            out.extend(jobs)
            if not token or (limit is not None and len(out) >= limit):
                return out if limit is None else out[:limit]

    def cancel(self, job_id: str) -> JobInfo:
        """Cancel the job's unfinished tasks (FailedPrecondition if it has already finished)."""
        reply = self._call(self._jobs.CancelJob, jobs_pb2.CancelJobRequest(job_id=job_id))
        return convert.job_info_from_proto(reply)

    def explain(self, job_id: str) -> str:
        reply = self._call(self._jobs.ExplainJob, jobs_pb2.ExplainJobRequest(job_id=job_id))
        return str(reply.explanation)

    def watch(self, job_id: str, *, timeout: float | None = None) -> Iterator[JobInfo]:
        """The job now, then every change; ends after a final state (DeadlineExceeded after `timeout`
        seconds; None or infinity: no deadline)."""
        stream = self._jobs.WatchJob(jobs_pb2.WatchJobRequest(job_id=job_id), timeout=_grpc_timeout(timeout))
        try:
            for event in stream:
                yield convert.job_info_from_proto(event.job)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        finally:
            stream.cancel()

    def wait(
        self, job_id: str, *, states: Collection[JobState | str] | None = None, timeout: float | None = None
    ) -> JobInfo:
        """Block until the job reaches one of `states` (default: a final state); returns it then.

        Raises DeadlineExceeded after `timeout` seconds, and FailedPrecondition if the job ends in
        a final state that is not among `states`.
        """
        wanted = frozenset(_as_state(s, "states") for s in states) if states else FINAL_STATES
        last: JobInfo | None = None
        for info in self.watch(job_id, timeout=timeout):
            last = info
            if info.state in wanted:
                return info
            if info.state in FINAL_STATES:
                raise FailedPrecondition(
                    f"job {job_id} ended {info.state.value}, waited for {_names(wanted)}"
                )
        raise GoschedError(f"watch of {job_id} ended early (last state {last.state.value if last else '?'})")

    def logs(
        self,
        job_id: str,
        task: int = 0,
        *,
        stream: str = "stdout",
        follow: bool = False,
        offset: int = 0,
        timeout: float | None = None,
        previous: bool = False,
    ) -> Iterator[bytes]:
        """A task's output (`stream` "stdout" or "stderr") in chunks, from `offset` as far as the
        master has it; with `follow`, then what comes until the task ends. `previous`: the output
        of the task's run before its current one (kubectl logs --previous), which is not followed.

        `timeout` bounds the whole stream (default: the unary timeout, none when following;
        infinity: none).
        """
        for _, data in self.log_chunks(
            job_id, task, stream=stream, follow=follow, offset=offset, timeout=timeout, previous=previous
        ):
            yield data

    def log_chunks(
        self,
        job_id: str,
        task: int = 0,
        *,
        stream: str = "stdout",
        follow: bool = False,
        offset: int = 0,
        timeout: float | None = None,
        previous: bool = False,
    ) -> Iterator[tuple[int, bytes]]:
        """As `logs`, each chunk with its offset in the run it belongs to: `offset + len(data)` of the
        last chunk is where to go on from (`offset=`) after a stream lost midway. A follower that goes
        on into the task's next run gets that run's chunks from offset 0 again."""
        request = jobs_pb2.LogsRequest(
            job_id=job_id, task_index=task, follow=follow, stream=stream, offset=offset, previous=previous
        )
        if timeout is None and not follow:  # a plain read ends on its own; a follow may run for hours
            timeout = self.timeout
        call = self._jobs.StreamLogs(request, timeout=_grpc_timeout(timeout))
        try:
            for chunk in call:
                yield int(chunk.offset), bytes(chunk.data)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        finally:
            call.cancel()

    # -- cluster -----------------------------------------------------------------------------------
    def nodes(self, state: NodeState | None = None) -> builtins.list[NodeInfo]:
        request = cluster_pb2.ListNodesRequest(
            state=convert.node_state_to_proto(state) if state is not None else pb.NODE_STATE_UNSPECIFIED
        )
        reply = self._call(self._cluster.ListNodes, request)
        return [convert.node_info_from_proto(n) for n in reply.nodes]

    def node(self, name: str) -> NodeInfo:
        reply = self._call(self._cluster.GetNode, cluster_pb2.GetNodeRequest(name=name))
        return convert.node_info_from_proto(reply)

    def cordon(self, name: str, *, uncordon: bool = False) -> NodeInfo:
        request = cluster_pb2.CordonNodeRequest(name=name, uncordon=uncordon)
        return convert.node_info_from_proto(self._call(self._cluster.CordonNode, request))

    def drain(self, name: str) -> NodeInfo:
        reply = self._call(self._cluster.DrainNode, cluster_pb2.DrainNodeRequest(name=name))
        return convert.node_info_from_proto(reply)

    def delete_node(self, name: str, *, force: bool = False) -> builtins.list[str]:
        """Remove a node whose machine is gone; returns the task ids requeued from it (force)."""
        reply = self._call(self._cluster.DeleteNode, cluster_pb2.DeleteNodeRequest(name=name, force=force))
        return list(reply.requeued_task_ids)

    def queues(self) -> builtins.list[QueueInfo]:
        reply = self._call(self._cluster.ListQueues, cluster_pb2.ListQueuesRequest())
        return [QueueInfo(q.name, q.policy, q.guarantee, q.max_share, q.share) for q in reply.queues]

    def status(self, *, timeout: float | None = None) -> dict[str, Any]:
        """The scheduler's status: ready, node and resource totals, job counts, round counters."""
        reply = self._call(self._cluster.GetStatus, cluster_pb2.GetStatusRequest(), timeout)
        return {f.name: getattr(reply, f.name) for f in reply.DESCRIPTOR.fields}


def _grpc_timeout(timeout: float | None) -> float | None:
    """`timeout` as gRPC can take it: None or infinity is no deadline, a longer one than
    MAX_TIMEOUT_S is capped to it; NaN is a ValueError."""
    if timeout is None or timeout == math.inf:
        return None
    if math.isnan(timeout):
        raise ValueError("timeout: must be a number of seconds, got nan")
    return min(timeout, MAX_TIMEOUT_S)


def _spec_message(spec: Mapping[str, Any] | Job, where: str = "", submission_id: str = "") -> pb.JobSpec:
    """The JobSpec message of a spec dict (validated here, so a bad one fails without a round trip;
    `where` prefixes the field in the error) or of a Job. `submission_id`: the one it is sent
    under, if any (a deadline written from now could not be repeated under it)."""
    if isinstance(spec, Job):
        return convert.job_to_proto_spec(spec)
    if submission_id and is_relative_deadline(spec.get("deadline")):
        field = f"{where}deadline"
        raise InvalidArgument(f"{field}: {spec['deadline']!r} {RELATIVE_WITH_SUBMISSION_ID}", field=field)
    try:
        job = job_from_spec(spec)
    except SpecError as exc:
        raise InvalidArgument(f"{where}{exc}", field=f"{where}{exc.field}") from None
    # An id the spec does not name is left to the server: one made here would read as chosen.
    return convert.job_to_proto_spec(job, submit_time="submit_time" in spec, job_id="id" in spec)


def _as_state(value: JobState | str, what: str) -> JobState:
    """A JobState from itself or its name ("running"): a wrong name is a ValueError naming it."""
    try:
        return JobState(value)
    except ValueError:
        known = ", ".join(s.value for s in JobState)
        raise ValueError(f"{what}: {value!r} is not a job state (one of {known})") from None


def _names(states: Collection[JobState]) -> str:
    return ", ".join(sorted(s.value for s in states))
