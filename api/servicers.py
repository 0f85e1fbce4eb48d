"""The JobService and ClusterService handlers, and how the service's errors become gRPC statuses.

SpecError -> INVALID_ARGUMENT (the message starts with the field path), or ALREADY_EXISTS for a job
id that exists; an unknown job or node -> NOT_FOUND; AdmissionRejected -> RESOURCE_EXHAUSTED;
cancelling a finished job -> FAILED_PRECONDITION; any call before the scheduler is ready, or while a
component restarts (ControlUnavailable) -> UNAVAILABLE, marked as the master's own answer (trailing
metadata `gosched-master-answered`), so that a client tells it from a master it cannot reach.
"""

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from gosched.api import convert
from gosched.api.agents import AgentGateway
from gosched.api.errors import ANSWERED_KEY
from gosched.api.logs import STREAMS, LogStore
from gosched.api.service import (
    Exhausted,
    FailedPrecondition,
    JobView,
    NodeView,
    NotFound,
    SchedulerService,
    Unavailable,
)
from gosched.common.errors import AdmissionRejected, SpecError
from gosched.common.node import NodeState
from gosched.common.states import TERMINAL, TaskState
from gosched.proto.v1 import cluster_pb2, cluster_pb2_grpc, jobs_pb2, jobs_pb2_grpc
from gosched.proto.v1 import types_pb2 as pb
from gosched.runtime.control import ControlUnavailable

log = logging.getLogger(__name__)

R = TypeVar("R")
# Once a followed task has been placed, back to PENDING means its run is over (lost, requeued).
TASK_ENDED = frozenset({TaskState.PENDING, TaskState.SCHEDULED})


# == error mapping =================================================================================
def _status_of(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    if isinstance(exc, SpecError):
        if exc.field.rsplit(".", 1)[-1] == "id" and "already exists" in exc.reason:  # "jobs[3].id" too
            return grpc.StatusCode.ALREADY_EXISTS, str(exc)
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, NotFound):
        return grpc.StatusCode.NOT_FOUND, str(exc)
    if isinstance(exc, AdmissionRejected):
        # The reason already says when to retry (admission writes it with the numbers).
        return grpc.StatusCode.RESOURCE_EXHAUSTED, exc.reason
    if isinstance(exc, FailedPrecondition):
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, Exhausted):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, Unavailable | ControlUnavailable):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    return None


def _abort(context: grpc.ServicerContext, exc: Exception, handler: str) -> None:
    """End the call with the status that fits `exc` (INTERNAL, logged, for an unexpected one)."""
    status = _status_of(exc)
    if status is None:
        log.exception("%s failed", handler)
        context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
    else:
        if status[0] == grpc.StatusCode.UNAVAILABLE:
            answered_unavailable(context)
        context.abort(*status)


def answered_unavailable(context: grpc.ServicerContext) -> None:
    """Mark an UNAVAILABLE as the master's own answer (its scheduler cannot serve now), which a
    client tells apart from a master it cannot reach (gosched.api.errors.SchedulerUnavailable)."""
    context.set_trailing_metadata(((ANSWERED_KEY, "1"),))


def _mapped(method: Callable[..., R]) -> Callable[..., R]:
    """Turn the service's exceptions into gRPC statuses (unary and server-streaming handlers)."""

    @functools.wraps(method)
    def unary(self: Any, request: Any, context: grpc.ServicerContext) -> R:
        try:
            return method(self, request, context)
        except Exception as exc:
            _abort(context, exc, method.__name__)
            raise  # unreachable: abort raises

    return unary


def _streamed(method: Callable[..., Iterator[R]]) -> Callable[..., Iterator[R]]:
    @functools.wraps(method)
    def stream(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[R]:
        try:
            yield from method(self, request, context)
        except Exception as exc:
            _abort(context, exc, method.__name__)

    return stream


# == messages ======================================================================================
def job_message(view: JobView) -> pb.Job:
    return pb.Job(
        id=view.job.id,
        spec=convert.job_to_proto_spec(view.job),
        state=convert.job_state_to_proto(view.state),
        tasks=[
            pb.Task(
                id=t.id,
                index=t.index,
                role=t.role,
                state=convert.task_state_to_proto(t.state),
                node=t.node,
                gpus=[pb.GpuAssignment(index=i, milli=m) for i, m in t.gpus],
                restarts=t.restarts,
                last_restart_reason=t.last_restart_reason,
                last_restart_time=t.last_restart_time,
                retries=t.retries,
                reason=t.reason,
            )
            for t in view.tasks
        ],
        task_counts=view.task_counts,
        submit_time=view.job.submit_time,
    )


def node_message(view: NodeView, agent: tuple[float, bool, str] = (-1.0, False, "")) -> pb.NodeInfo:
    age, connected, limits = agent
    return pb.NodeInfo(
        node=convert.node_to_proto(view.node),
        cpu_used_milli=view.cpu_used_milli,
        memory_used=view.memory_used,
        gpu_used_milli=list(view.gpu_used_milli),
        task_ids=list(view.task_ids),
        heartbeat_age_s=age,
        agent_connected=connected,
        limits=limits,
    )


# == servicers =====================================================================================
class JobServicer(jobs_pb2_grpc.JobServiceServicer):
    def __init__(
        self,
        service: SchedulerService,
        logs: LogStore,
        max_streams: int = 128,
        stopping: Callable[[str], bool] = lambda task_id: False,
    ) -> None:
        self.service = service
        self.logs = logs
        # Whether a task's run is still being killed: a follow goes on until its last output is in.
        self.stopping = stopping
        self.max_streams = max_streams
        self._streams = threading.BoundedSemaphore(max_streams)

    @contextlib.contextmanager
    def _stream_slot(self) -> Iterator[None]:
        """A long stream (a watch, a followed log) holds a server thread while it lasts: past
        max_streams of them, the next is refused, so that other calls still find threads."""
        if not self._streams.acquire(blocking=False):
            raise Exhausted(
                f"{self.max_streams} watch and follow streams are open on this master: close some, "
                "or retry later (grpc_workers sets the limit: a quarter of them)"
            )
        try:
            yield
        finally:
            self._streams.release()

    @_mapped
    def SubmitJob(self, request: jobs_pb2.SubmitJobRequest, context: Any) -> jobs_pb2.SubmitJobResponse:
        s = self.service
        if not s.ready:
            raise Unavailable(s.not_ready_reason or "the scheduler is not ready")
        job = convert.job_from_proto(
            request.spec, submission_id=request.submission_id, known_queues=s.known_queues(), now=time.time()
        )
        job_id, created = s.submit(job)
        return jobs_pb2.SubmitJobResponse(job_id=job_id, created=created, job=job_message(s.get(job_id)))

    @_mapped
    def SubmitJobs(self, request: jobs_pb2.SubmitJobsRequest, context: Any) -> jobs_pb2.SubmitJobsResponse:
        s = self.service
        if not s.ready:
            raise Unavailable(s.not_ready_reason or "the scheduler is not ready")
        queues, now = s.known_queues(), time.time()
        jobs = []
        for i, item in enumerate(request.jobs):
            try:
                jobs.append(
                    convert.job_from_proto(
                        item.spec, submission_id=item.submission_id, known_queues=queues, now=now
                    )
                )
            except SpecError as exc:
                raise SpecError(f"jobs[{i}].{exc.field}", exc.reason) from None
        ids, created = s.submit_many(jobs)
        return jobs_pb2.SubmitJobsResponse(job_ids=ids, created=created)

    @_mapped
    def GetJob(self, request: jobs_pb2.GetJobRequest, context: Any) -> pb.Job:
        return job_message(self.service.get(request.job_id))

    @_mapped
    def ListJobs(self, request: jobs_pb2.ListJobsRequest, context: Any) -> jobs_pb2.ListJobsResponse:
        if request.page_size < 0:
            raise SpecError("page_size", f"must be >= 0, got {request.page_size}")
        page = self.service.list_jobs(
            state=convert.job_state_from_proto(request.state),
            queue=request.queue,
            tenant=request.tenant,
            page_size=request.page_size,
            page_token=request.page_token,
        )
        return jobs_pb2.ListJobsResponse(
            jobs=[job_message(v) for v in page.jobs], next_page_token=page.next_token
        )

    @_mapped
    def CancelJob(self, request: jobs_pb2.CancelJobRequest, context: Any) -> pb.Job:
        return job_message(self.service.cancel(request.job_id))

    @_streamed
    def WatchJob(self, request: jobs_pb2.WatchJobRequest, context: Any) -> Iterator[jobs_pb2.JobEvent]:
        with self._stream_slot():
            for view in self.service.watch(request.job_id, context.is_active):
                yield jobs_pb2.JobEvent(job=job_message(view), time=time.time())

    @_mapped
    def ExplainJob(self, request: jobs_pb2.ExplainJobRequest, context: Any) -> jobs_pb2.ExplainJobResponse:
        state, text = self.service.explain(request.job_id)
        return jobs_pb2.ExplainJobResponse(
            job_id=request.job_id, state=convert.job_state_to_proto(state), explanation=text
        )

    @_streamed
    def StreamLogs(self, request: jobs_pb2.LogsRequest, context: Any) -> Iterator[pb.LogChunk]:
        stream = request.stream or "stdout"
        if stream not in STREAMS:
            raise SpecError("stream", f"must be one of {', '.join(STREAMS)}, got {stream!r}")
        if request.offset < 0:
            raise SpecError("offset", f"must be >= 0, got {request.offset}")
        view = self.service.get(request.job_id)
        if not 0 <= request.task_index < len(view.tasks):
            raise SpecError("task_index", f"job {request.job_id!r} has tasks 0..{len(view.tasks) - 1}")
        if request.previous:  # a run that has ended: read as it is, never followed
            if request.follow:
                raise SpecError("follow", "the previous run has ended: there is nothing to follow")
            yield from self._previous_chunks(view.tasks[request.task_index].id, stream, request.offset)
            return
        chunks = self._log_chunks(request, view.tasks[request.task_index].id, stream, context)
        if not request.follow:
            yield from chunks
            return
        with self._stream_slot():
            yield from chunks

    def _previous_chunks(self, tid: str, stream: str, offset: int) -> Iterator[pb.LogChunk]:
        while data := self.logs.read(tid, stream, offset, previous=True):
            yield pb.LogChunk(task_id=tid, stream=stream, offset=offset, data=data)
            offset += len(data)

    def _log_chunks(
        self, request: jobs_pb2.LogsRequest, tid: str, stream: str, context: Any
    ) -> Iterator[pb.LogChunk]:
        # From the current process's output on (a service's restarts within the run: the earlier
        # processes' are the previous run's); a follower goes on into the next ones' as they come,
        # and into the task's next run from its start once a new one moves the run read aside (its
        # chunks' offsets count from there). A reader behind a reset reads its run to the end.
        placed = False  # a pending task has not run yet: following waits for it to be placed
        with self.logs.reader(tid, stream, request.offset, follow=request.follow) as reader:
            while context.is_active():
                seen, runs = self.logs.generation, reader.runs
                at, data = reader.read()
                if reader.runs != runs:
                    placed = False  # a new run: followed until it ends in turn
                if data:
                    yield pb.LogChunk(task_id=tid, stream=stream, offset=at, data=data)
                    continue
                if not request.follow:
                    return
                # The agent ships a task's last output before its end, so once the task has ended,
                # its run is no longer being stopped (a cancel's grace period), and nothing is left
                # to read, the stream is complete.
                task = self.service.get(request.job_id).tasks[request.task_index]
                placed = placed or task.state not in (TaskState.PENDING, TaskState.SCHEDULED)
                if task.state in TERMINAL or (placed and task.state in TASK_ENDED):
                    if not reader.at_end():
                        continue
                    if not self.stopping(tid):
                        return
                self.logs.wait(seen, timeout=0.5)


class ClusterServicer(cluster_pb2_grpc.ClusterServiceServicer):
    def __init__(self, service: SchedulerService, gateway: AgentGateway) -> None:
        self.service = service
        self.gateway = gateway

    def _node(self, view: NodeView) -> pb.NodeInfo:
        return node_message(view, self.gateway.agent_info(view.node.name))

    @_mapped
    def ListNodes(self, request: cluster_pb2.ListNodesRequest, context: Any) -> cluster_pb2.ListNodesResponse:
        views = self.service.nodes(convert.node_state_from_proto(request.state))
        return cluster_pb2.ListNodesResponse(nodes=[self._node(v) for v in views])

    @_mapped
    def GetNode(self, request: cluster_pb2.GetNodeRequest, context: Any) -> pb.NodeInfo:
        return self._node(self.service.node(request.name))

    @_mapped
    def CordonNode(self, request: cluster_pb2.CordonNodeRequest, context: Any) -> pb.NodeInfo:
        if not request.uncordon:
            return self._node(self.service.set_node_state(request.name, NodeState.CORDONED))
        # Decided and applied under the lock Register holds: the tick (liveness) cannot lose the
        # node in between, which would leave it ready with no agent, and its cordon remembered.
        with self.service.lock:
            state = self.gateway.uncordoned_state(self.service.node(request.name).node)
            view = self.service.set_node_state(request.name, state)
        return self._node(view)

    @_mapped
    def DrainNode(self, request: cluster_pb2.DrainNodeRequest, context: Any) -> pb.NodeInfo:
        return self._node(self.service.set_node_state(request.name, NodeState.DRAINING))

    @_mapped
    def DeleteNode(
        self, request: cluster_pb2.DeleteNodeRequest, context: Any
    ) -> cluster_pb2.DeleteNodeResponse:
        # Under the lock Register holds: an agent cannot register the node in between.
        with self.service.lock:
            if self.gateway.connected(request.name):
                raise FailedPrecondition(
                    f"node {request.name} has a connected agent: stop the agent first (a node that "
                    "is in use is cordoned or drained, not deleted)"
                )
            requeued = self.service.delete_node(request.name, force=request.force)
            self.gateway.forget(request.name)
        return cluster_pb2.DeleteNodeResponse(name=request.name, requeued_task_ids=requeued)

    @_mapped
    def ListQueues(
        self, request: cluster_pb2.ListQueuesRequest, context: Any
    ) -> cluster_pb2.ListQueuesResponse:
        return cluster_pb2.ListQueuesResponse(
            queues=[
                cluster_pb2.Queue(
                    name=q.name, policy=q.policy, guarantee=q.guarantee, max_share=q.max_share, share=q.share
                )
                for q in self.service.queues()
            ]
        )

    @_mapped
    def GetStatus(self, request: cluster_pb2.GetStatusRequest, context: Any) -> cluster_pb2.ClusterStatus:
        s = self.service.status()
        return cluster_pb2.ClusterStatus(
            ready=s.ready,
            nodes=s.nodes,
            schedulable_nodes=s.schedulable_nodes,
            cpu_milli=s.cpu_milli,
            cpu_used_milli=s.cpu_used_milli,
            memory=s.memory,
            memory_used=s.memory_used,
            gpu_milli=s.gpu_milli,
            gpu_used_milli=s.gpu_used_milli,
            active_jobs=s.active_jobs,
            pending_jobs=s.pending_jobs,
            in_flight_units=s.in_flight_units,
            rounds=s.rounds,
            bound_tasks=s.bound_tasks,
            binder_conflicts=s.binder_conflicts,
            binder_version=s.binder_version,
            shards=s.shards,
            schedulable_cpu_milli=s.schedulable_cpu_milli,
            schedulable_memory=s.schedulable_memory,
            schedulable_gpu_milli=s.schedulable_gpu_milli,
        )
