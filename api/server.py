"""The API server: gRPC (JobService, ClusterService, health, reflection) and HTTP (/healthz,
/readyz, /metrics) around one SchedulerService.

    handle = serve(settings, nodes, grpc_port=9090, http_port=8080)
    ...
    handle.stop()

Error mapping: SpecError -> INVALID_ARGUMENT (the message starts with the field path); an unknown
job or node -> NOT_FOUND; AdmissionRejected -> RESOURCE_EXHAUSTED; cancelling a finished job ->
FAILED_PRECONDITION; any call before the scheduler is ready -> UNAVAILABLE. The AgentService
(gosched.api.agents) is served on the same port: node agents register there and hold their stream.
"""

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gosched.api import convert
from gosched.api.agents import AgentGateway
from gosched.api.logs import STREAMS, LogStore
from gosched.api.service import (
    FailedPrecondition,
    JobView,
    NodeView,
    NotFound,
    SchedulerService,
    Unavailable,
)
from gosched.common.config import Settings
from gosched.common.errors import AdmissionRejected, SpecError
from gosched.common.node import Node, NodeState
from gosched.common.states import TaskState
from gosched.proto.v1 import agent_pb2, agent_pb2_grpc, cluster_pb2, cluster_pb2_grpc, jobs_pb2, jobs_pb2_grpc
from gosched.proto.v1 import types_pb2 as pb
from gosched.runtime.control import ControlPlane
from gosched.runtime.local_control import LocalControl
from gosched.runtime.sim_tasks import SimulatedTasks

log = logging.getLogger(__name__)

DEFAULT_GRPC_PORT = 9090
DEFAULT_HTTP_PORT = 8080
SERVICE_NAMES = (
    jobs_pb2.DESCRIPTOR.services_by_name["JobService"].full_name,
    cluster_pb2.DESCRIPTOR.services_by_name["ClusterService"].full_name,
    agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
)

R = TypeVar("R")
# Agents ping every 10 s to find a dead connection (agent/link.py); accept pings down to 5 s apart.
SERVER_OPTIONS = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]
TASK_ENDED = frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED, TaskState.PENDING})


# == error mapping =================================================================================
def _status_of(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    if isinstance(exc, SpecError):
        if exc.field == "id" and "already exists" in exc.reason:
            return grpc.StatusCode.ALREADY_EXISTS, str(exc)
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, NotFound):
        return grpc.StatusCode.NOT_FOUND, str(exc)
    if isinstance(exc, AdmissionRejected):
        retry = f" (retry after {exc.retry_after_s:.3f}s)" if exc.retry_after_s else ""
        return grpc.StatusCode.RESOURCE_EXHAUSTED, f"{exc.reason}{retry}"
    if isinstance(exc, FailedPrecondition):
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, Unavailable):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    return None


def _mapped(method: Callable[..., R]) -> Callable[..., R]:
    """Turn the service's exceptions into gRPC statuses (unary and server-streaming handlers)."""

    @functools.wraps(method)
    def unary(self: Any, request: Any, context: grpc.ServicerContext) -> R:
        try:
            return method(self, request, context)
        except Exception as exc:
            status = _status_of(exc)
            if status is None:
                log.exception("%s failed", method.__name__)
                context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
            else:
                context.abort(*status)
            raise  # unreachable: abort raises

    return unary


def _streamed(method: Callable[..., Iterator[R]]) -> Callable[..., Iterator[R]]:
    @functools.wraps(method)
    def stream(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[R]:
        try:
            yield from method(self, request, context)
        except Exception as exc:
            status = _status_of(exc)
            if status is None:
                log.exception("%s failed", method.__name__)
                context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
            else:
                context.abort(*status)

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
    def __init__(self, service: SchedulerService, logs: LogStore) -> None:
        self.service = service
        self.logs = logs

    @_mapped
    def SubmitJob(self, request: jobs_pb2.SubmitJobRequest, context: Any) -> jobs_pb2.SubmitJobResponse:
        s = self.service
        if not s.ready:
            raise Unavailable("the scheduler is not ready")
        job = convert.job_from_proto(
            request.spec, submission_id=request.submission_id, known_queues=s.known_queues(), now=time.time()
        )
        job_id, created = s.submit(job)
        return jobs_pb2.SubmitJobResponse(job_id=job_id, created=created, job=job_message(s.get(job_id)))

    @_mapped
    def SubmitJobs(self, request: jobs_pb2.SubmitJobsRequest, context: Any) -> jobs_pb2.SubmitJobsResponse:
        s = self.service
        if not s.ready:
            raise Unavailable("the scheduler is not ready")
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
        tid = view.tasks[request.task_index].id
        offset = request.offset
        while context.is_active():
            seen = self.logs.generation
            data = self.logs.read(tid, stream, offset)
            if data:
                yield pb.LogChunk(task_id=tid, stream=stream, offset=offset, data=data)
                offset += len(data)
                continue
            if not request.follow:
                return
            # The agent ships a task's last output before its end, so once the task has ended
            # and nothing is left to read, the stream is complete.
            task = self.service.get(request.job_id).tasks[request.task_index]
            if task.state in TASK_ENDED:
                if not self.logs.read(tid, stream, offset, 1):
                    return
                continue
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
        state = NodeState.READY if request.uncordon else NodeState.CORDONED
        return self._node(self.service.set_node_state(request.name, state))

    @_mapped
    def DrainNode(self, request: cluster_pb2.DrainNodeRequest, context: Any) -> pb.NodeInfo:
        return self._node(self.service.set_node_state(request.name, NodeState.DRAINING))

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
        )


# == metrics =======================================================================================
class SchedulerMetrics:
    """Prometheus metrics of one service, in their own registry (several servers per process work).

    Counters and gauges are read from the control plane at scrape time; the latency histogram is
    fed after each round with the latencies of the tasks bound since the round before.
    """

    def __init__(self, service: SchedulerService) -> None:
        self.service = service
        self.registry = CollectorRegistry(auto_describe=False)
        self.latency = Histogram(
            "gosched_bind_latency_seconds",
            "Seconds from dispatch to bind, per task",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )
        self.registry.register(self)

    def observe_round(self, control: ControlPlane) -> None:
        for seconds in control.drain_latencies():
            self.latency.observe(seconds)

    def collect(self) -> Iterator[Metric]:
        s = self.service
        ready = GaugeMetricFamily("gosched_ready", "1 when the scheduler is ready to serve")
        ready.add_metric([], 1.0 if s.ready else 0.0)
        yield ready
        if not s.ready:
            return
        try:
            status = s.status()
            pending_tasks = s.pending_tasks()
            queues = s.queues()
        except Unavailable:
            return
        pending = GaugeMetricFamily("gosched_pending_tasks", "Tasks waiting to be placed")
        pending.add_metric([], pending_tasks)
        yield pending
        pending_jobs = GaugeMetricFamily("gosched_pending_jobs", "Jobs waiting for dispatch")
        pending_jobs.add_metric([], status.pending_jobs)
        yield pending_jobs
        active = GaugeMetricFamily("gosched_active_jobs", "Jobs with a task not yet ended")
        active.add_metric([], status.active_jobs)
        yield active
        bound = CounterMetricFamily("gosched_bound_tasks", "Tasks bound to a node by the binder")
        bound.add_metric([], status.bound_tasks)
        yield bound
        conflicts = CounterMetricFamily(
            "gosched_binder_conflicts", "Units the binder refused whole (optimistic-concurrency conflicts)"
        )
        conflicts.add_metric([], status.binder_conflicts)
        yield conflicts
        rounds = CounterMetricFamily("gosched_scheduling_rounds", "Scheduling rounds that dispatched work")
        rounds.add_metric([], status.rounds)
        yield rounds
        nodes = GaugeMetricFamily("gosched_nodes", "Live nodes, by schedulability", labels=["schedulable"])
        nodes.add_metric(["true"], status.schedulable_nodes)
        nodes.add_metric(["false"], status.nodes - status.schedulable_nodes)
        yield nodes
        share = GaugeMetricFamily(
            "gosched_queue_share",
            "Dominant share of the cluster held + in flight per queue",
            labels=["queue"],
        )
        for q in queues:
            share.add_metric([q.name], q.share)
        yield share


# == HTTP ==========================================================================================
def _http_handler(service: SchedulerService, metrics: SchedulerMetrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                ok = service.alive
                self._reply(200 if ok else 503, b"ok\n" if ok else b"scheduler thread failed\n")
            elif path == "/readyz":
                ok = service.ready
                self._reply(200 if ok else 503, b"ready\n" if ok else b"not ready\n")
            elif path == "/metrics":
                self._reply(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            else:
                self._reply(404, b"not found\n")

        def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    return Handler


# == serve =========================================================================================
@dataclass
class ServerHandle:
    """A running API server. `grpc_port` / `http_port` are the bound ports (useful with port 0)."""

    service: SchedulerService
    metrics: SchedulerMetrics
    grpc_server: grpc.Server
    health: health.HealthServicer
    http_server: ThreadingHTTPServer | None
    grpc_port: int
    http_port: int
    _http_thread: threading.Thread | None = None
    _health_thread: threading.Thread | None = None

    @property
    def target(self) -> str:
        """Where a Client connects: "127.0.0.1:<grpc_port>"."""
        return f"127.0.0.1:{self.grpc_port}"

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self.service.wait_ready(timeout)

    def stop(self, grace: float = 1.0) -> None:
        self.health.enter_graceful_shutdown()
        self.service.stop()  # ends watch streams, so the gRPC stop need not wait for them
        self.grpc_server.stop(grace).wait()
        if self.http_server is not None:
            self.http_server.shutdown()
            self.http_server.server_close()
        for thread in (self._http_thread, self._health_thread):
            if thread is not None:
                thread.join(5.0)

    def wait(self) -> None:
        """Block until the gRPC server stops (for a CLI command)."""
        self.grpc_server.wait_for_termination()


def _track_health(handle: ServerHandle, announced: threading.Event) -> None:
    """SERVING once the scheduler is ready; NOT_SERVING again if its thread ends (a failure, or
    stop(), by which time shutdown has been announced anyway)."""
    service = handle.service
    codes = health_pb2.HealthCheckResponse
    with contextlib.suppress(RuntimeError):  # the scheduler failed: stay NOT_SERVING
        service.wait_ready()
    ready = service.ready
    for name in ("", *SERVICE_NAMES):
        handle.health.set(name, codes.SERVING if ready else codes.NOT_SERVING)
    announced.set()
    if ready:
        service.join()
        for name in ("", *SERVICE_NAMES):
            handle.health.set(name, codes.NOT_SERVING)


def control_factory(
    settings: Settings,
    nodes: Sequence[Node] = (),
    *,
    runtime: str = "local",
    store_path: str | Path | None = None,
    ray_address: str | None = None,
) -> Callable[[], ControlPlane]:
    """How the service builds its control plane: "local" (one process) or "ray" (actors)."""
    if runtime == "local":
        return lambda: LocalControl(settings, nodes, store_path)
    if runtime == "ray":
        from gosched.runtime.ray_control import RayControl  # imports ray: only when asked for

        ray_settings = settings.model_copy(update={"store_path": str(store_path or settings.store_path)})
        return lambda: RayControl(ray_settings, nodes, address=ray_address)
    raise ValueError(f"runtime must be 'local' or 'ray', got {runtime!r}")


def serve(
    settings: Settings,
    nodes: Sequence[Node] = (),
    grpc_port: int = DEFAULT_GRPC_PORT,
    http_port: int | None = DEFAULT_HTTP_PORT,
    *,
    host: str = "[::]",
    http_host: str = "0.0.0.0",
    store_path: str | Path | None = None,
    max_workers: int = 64,
    wait_ready: bool = False,
    runtime: str = "local",
    ray_address: str | None = None,
    log_dir: str | Path | None = None,
    sim_task_seconds: float | None = None,
    heartbeat_interval_s: float = 1.0,
    node_timeout_s: float = 10.0,
) -> ServerHandle:
    """Start the scheduler and its API; returns at once (or once ready, with wait_ready).

    Port 0 picks a free port (see the handle's ports); http_port None serves no HTTP endpoint.
    The health service says NOT_SERVING until the scheduler has restored its state, SERVING after.
    `runtime` "ray" runs the dispatcher, the binder and the shards as Ray actors (starting Ray, or
    joining `ray_address`). Task output shipped by agents is kept under `log_dir` (default: beside
    the store). With `sim_task_seconds`, tasks on nodes without an agent run that long and succeed.
    """
    make = control_factory(settings, nodes, runtime=runtime, store_path=store_path, ray_address=ray_address)
    service = SchedulerService(make, queues=settings.queues)
    db = Path(store_path or settings.store_path)
    logs = LogStore(log_dir if log_dir is not None else db.parent / f"{db.name}.logs")
    gateway = AgentGateway(
        service, logs, heartbeat_interval_s=heartbeat_interval_s, node_timeout_s=node_timeout_s
    )
    if sim_task_seconds is not None:
        service.tick_hooks.append(SimulatedTasks(sim_task_seconds).tick)
    metrics = SchedulerMetrics(service)
    service.on_round = metrics.observe_round

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="gosched-grpc"),
        options=SERVER_OPTIONS,
    )
    jobs_pb2_grpc.add_JobServiceServicer_to_server(JobServicer(service, logs), server)
    agent_pb2_grpc.add_AgentServiceServicer_to_server(gateway, server)
    cluster_pb2_grpc.add_ClusterServiceServicer_to_server(ClusterServicer(service, gateway), server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    for name in ("", *SERVICE_NAMES):
        health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    bound_grpc = server.add_insecure_port(f"{host}:{grpc_port}")
    if bound_grpc == 0:
        raise OSError(f"cannot listen on {host}:{grpc_port}")

    http_server = None
    if http_port is not None:
        http_server = ThreadingHTTPServer((http_host, http_port), _http_handler(service, metrics))
        http_server.daemon_threads = True

    server.start()
    service.start()
    handle = ServerHandle(
        service=service,
        metrics=metrics,
        grpc_server=server,
        health=health_servicer,
        http_server=http_server,
        grpc_port=bound_grpc,
        http_port=http_server.server_address[1] if http_server is not None else 0,
    )
    if http_server is not None:
        handle._http_thread = threading.Thread(
            target=http_server.serve_forever, name="gosched-http", daemon=True
        )
        handle._http_thread.start()
    announced = threading.Event()
    handle._health_thread = threading.Thread(
        target=_track_health, args=(handle, announced), name="gosched-health", daemon=True
    )
    handle._health_thread.start()
    if wait_ready:
        service.wait_ready()
        announced.wait()
    return handle
