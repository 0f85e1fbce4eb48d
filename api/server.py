"""The API server: gRPC (JobService, ClusterService, health, reflection) and HTTP (/healthz,
/readyz, /metrics) around one SchedulerService.

    handle = serve(settings, nodes, grpc_port=9090, http_port=8080)
    ...
    handle.stop()

The handlers and their error mapping are in gosched.api.servicers, /metrics in gosched.api.metrics,
the HTTP endpoint in gosched.api.http. The AgentService (gosched.api.agents) is served on the same
port: node agents register there and hold their stream.

With the settings' tls_cert/tls_key the gRPC port serves TLS (mutual with tls_client_ca:
gosched.api.tls); with api_token_file/agent_token_file the calls need a bearer token
(gosched.api.auth). Health stays open; the HTTP endpoint is not covered by either.

`serve` binds its ports without SO_REUSEPORT and holds `<store>.lock` (flock) until stop, so a
second master on the same port or store fails at start (PortUnavailable naming the port, or
StoreBusy). The ports are bound before anything is made on disk; a start that fails after that
removes what it made (folders, lock file, log folder, a new store) before it lets the lock go.
"""

import contextlib
import errno
import fcntl
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import IO, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gosched.api.agents import AgentGateway
from gosched.api.auth import token_interceptor
from gosched.api.http import http_handler
from gosched.api.logs import LogStore
from gosched.api.metrics import SchedulerMetrics
from gosched.api.service import (
    SchedulerService,
)
from gosched.api.servicers import ClusterServicer, JobServicer
from gosched.api.store_purge import StorePurger
from gosched.api.tls import server_credentials
from gosched.common.config import Settings
from gosched.common.job import DEFAULT_QUEUE
from gosched.common.node import Node
from gosched.proto.v1 import agent_pb2, agent_pb2_grpc, cluster_pb2, cluster_pb2_grpc, jobs_pb2, jobs_pb2_grpc
from gosched.runtime.control import ControlPlane
from gosched.runtime.local_control import LocalControl
from gosched.runtime.sim_tasks import SimulatedTasks
from gosched.runtime.simulation import drop_stale_simulated

log = logging.getLogger(__name__)
C = TypeVar("C", bound=ControlPlane)

DEFAULT_GRPC_PORT = 9090
DEFAULT_HTTP_PORT = 8080
SERVICE_NAMES = (
    jobs_pb2.DESCRIPTOR.services_by_name["JobService"].full_name,
    cluster_pb2.DESCRIPTOR.services_by_name["ClusterService"].full_name,
    agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
)

# Agents ping every 10 s to find a dead connection (agent/link.py); accept pings down to 5 s apart.
# No SO_REUSEPORT (gRPC's Linux default): a second master on the port must fail, not share it.
SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]


class StoreBusy(RuntimeError):
    """Another master holds the store: two would both run its jobs."""


LOCK_ATTEMPTS = 20  # tries to lock a lock file that a failing start removed meanwhile


def lock_store(db: Path) -> IO[str]:
    """Hold `<store>.lock` exclusively for as long as the returned file stays open (the agent's
    agent.lock does the same for its work dir), making the store's folder if need be; StoreBusy
    if another master holds it."""
    path = db.with_name(f"{db.name}.lock")
    for _ in range(LOCK_ATTEMPTS):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            handle: IO[str] = path.open("a+")
        except FileNotFoundError:  # a failed start removed the folder it had made: make it again
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.seek(0)
            holder = handle.read().strip()
            handle.close()
            pid = f" (pid {holder})" if holder else ""
            raise StoreBusy(
                f"another master{pid} holds the store {db}: stop it or use another --store"
            ) from exc
        # A failed start removes the lock file it made, holding it: a lock taken on that file once
        # it is gone guards nothing, so lock the one now at the path instead.
        try:
            if os.path.samestat(os.fstat(handle.fileno()), path.stat()):
                break
        except FileNotFoundError:
            pass
        handle.close()
    else:  # a dangling symlink, say: the path never yields a lock file that stays
        raise OSError(f"cannot lock {path}: it keeps vanishing or cannot be created")
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


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
    _store_lock: IO[str] | None = None  # held until stop(): no second master on the store
    _purger: StorePurger | None = None  # Settings.finished_job_ttl_s

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
        if self._purger is not None:
            self._purger.stop()
        if self._store_lock is not None:
            self._store_lock.close()  # releases the flock
            self._store_lock = None

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
    if not ready:
        return
    serving = True
    while service.alive:  # NOT_SERVING too while a component or the Ray cluster does not answer
        service.join(timeout=HEALTH_POLL_S)
        now = service.alive and service.not_ready_reason is None
        if now != serving:
            serving = now
            for name in ("", *SERVICE_NAMES):
                handle.health.set(name, codes.SERVING if now else codes.NOT_SERVING)
    for name in ("", *SERVICE_NAMES):
        handle.health.set(name, codes.NOT_SERVING)


HEALTH_POLL_S = 0.5  # how soon gRPC health follows the scheduler's readiness


PORT_TAKEN = "the port is taken (another master?) or the address is not this machine's"


class PortUnavailable(OSError):
    """The gRPC or the HTTP port (`kind`: "grpc" or "http") cannot be listened on; the message
    names the address and why."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def os_error_reason(exc: OSError) -> str:
    """Why a bind failed, in words a user acts on (a taken port, not "Address already in use")."""
    if exc.errno == errno.EADDRINUSE:
        return "the port is taken (another master?)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "the address is not this machine's"
    if exc.errno == errno.EACCES:
        return "permission denied (a port below 1024 needs privileges)"
    return exc.strerror or str(exc)


def bind_error(host: str, port: int) -> OSError | None:
    """Why gRPC could not listen on host:port, found by binding a socket as gRPC binds its own
    (SO_REUSEADDR, no SO_REUSEPORT; a wildcard host dual-stack on [::], else on 0.0.0.0; any one
    resolved address will do), or None. Asked first because gRPC's own failure also writes its C
    core's log lines to stderr; a port taken in between still fails in gRPC."""
    if port == 0:
        return None
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    candidates: list[tuple[int, tuple[str, int]]]
    if name in ("", "::", "0.0.0.0"):
        candidates = [(socket.AF_INET6, ("::", port)), (socket.AF_INET, ("0.0.0.0", port))]
    else:
        try:
            found = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except OSError:
            return None  # gRPC resolves it again and says why
        candidates = [(int(family), (str(addr[0]), port)) for family, _, _, _, addr in found]
    errors: list[OSError] = []
    for family, address in candidates:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                probe.bind(address)
                probe.listen()
            return None
        except OSError as exc:
            errors.append(exc)
    # "In use" over the rest: a machine without IPv6 fails [::] for that reason alone.
    return next((e for e in errors if e.errno == errno.EADDRINUSE), errors[-1] if errors else None)


def _listen(
    server: grpc.Server, host: str, port: int, credentials: grpc.ServerCredentials | None = None
) -> int:
    """Bind the gRPC port (TLS with `credentials`); PortUnavailable naming it if it is taken (gRPC
    itself raises RuntimeError)."""
    refused = bind_error(host, port)
    if refused is not None:
        raise PortUnavailable("grpc", f"cannot listen on {host}:{port}: {os_error_reason(refused)}")
    address = f"{host}:{port}"
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise PortUnavailable("grpc", f"cannot listen on {host}:{port}: {PORT_TAKEN}") from exc
    if bound == 0:  # older gRPC releases return 0 rather than raise
        raise PortUnavailable("grpc", f"cannot listen on {host}:{port}: {PORT_TAKEN}")
    return bound


def _new_paths(*paths: Path) -> list[Path]:
    """Those of `paths` and of their folders that do not exist yet: what a start that fails may
    remove again, having made them."""
    new: list[Path] = []
    for path in paths:
        while path not in new and not os.path.lexists(path):
            new.append(path)
            path = path.parent
    return new


def _undo_start(db: Path, log_root: Path, made: Sequence[Path], store_new: bool) -> None:
    """Remove what a failed start made, the lock still held: a new store's files, then the log
    folder, then the lock file, then the folders, deepest first. The lock file goes after the
    store's files, so that a master that locks the path anew finds no store this start is
    removing (lock_store checks that the file it locked is still the path's)."""
    lock = db.with_name(f"{db.name}.lock")
    ends = ("", "-wal", "-shm", ".writer.lock")  # .writer.lock: the binder's writer (binder/writer.py)
    files = [db.with_name(db.name + end) for end in ends] if store_new else []
    firsts = [p for p in (log_root, lock) if p in made]
    folders = sorted((p for p in made if p not in firsts), key=lambda p: len(p.parts), reverse=True)
    _remove_new([*files, *firsts, *folders])


def _remove_new(paths: Iterable[Path]) -> None:
    """Remove `paths` in their order; a folder only if empty (a log folder with output in it, or
    one another process has put something in since, stays)."""
    for path in paths:
        with contextlib.suppress(OSError):  # not empty, or not there
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()


def absolute_store(store_path: str | Path) -> str:
    """The store's path made absolute against this process's working directory (":memory:" kept)."""
    text = str(store_path)
    return text if text == ":memory:" else os.path.abspath(text)


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
        return lambda: _without_stale_simulated(LocalControl(settings, nodes, store_path), nodes)
    if runtime == "ray":
        from gosched.runtime.ray_control import RayControl  # imports ray: only when asked for

        # The actors' working directory is their raylet's, not this process's: a relative store
        # path must be made absolute here, or they open another file than the one locked here.
        ray_settings = settings.model_copy(
            update={"store_path": absolute_store(store_path or settings.store_path)}
        )
        return lambda: _without_stale_simulated(RayControl(ray_settings, nodes, address=ray_address), nodes)
    raise ValueError(f"runtime must be 'local' or 'ray', got {runtime!r}")


def _without_stale_simulated(control: C, nodes: Sequence[Node]) -> C:
    stale = drop_stale_simulated(control, nodes)
    if stale:
        log.warning(
            "removed %d simulated node(s) an earlier start left in the store (not given again): %s%s",
            len(stale),
            ", ".join(stale[:5]),
            " ..." if len(stale) > 5 else "",
        )
    return control


def serve(
    settings: Settings,
    nodes: Sequence[Node] = (),
    grpc_port: int = DEFAULT_GRPC_PORT,
    http_port: int | None = DEFAULT_HTTP_PORT,
    *,
    host: str = "[::]",
    http_host: str = "0.0.0.0",
    store_path: str | Path | None = None,
    max_workers: int | None = None,
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
    Every agent's stream, WatchJob and followed StreamLogs holds one of the `max_workers` threads
    (settings.grpc_workers by default) for as long as it lasts: size it for the agents and
    watchers expected. Watches and follows may take a quarter of them; more are refused
    (RESOURCE_EXHAUSTED), so that a flood of watchers cannot starve the other calls. `runtime` "ray" runs
    the dispatcher, the binder and the shards as Ray actors (starting Ray, or joining
    `ray_address`). Task output shipped by agents is kept under `log_dir` (default: beside
    the store). With `sim_task_seconds`, tasks on nodes without an agent run that long and succeed.
    """
    if DEFAULT_QUEUE not in {q.name for q in settings.queues}:  # allowed: every job may name one
        known = ", ".join(q.name for q in settings.queues)
        why = "no queue is named %r (queues: %s): a job that names no queue will be refused"
        log.warning(why, DEFAULT_QUEUE, known)
    # TLS and tokens first (SecretFileError naming the setting): nothing is bound or made yet.
    credentials = server_credentials(settings)
    auth = token_interceptor(settings)
    db_path = absolute_store(store_path or settings.store_path)
    make = control_factory(settings, nodes, runtime=runtime, store_path=db_path, ray_address=ray_address)
    service = SchedulerService(make, queues=settings.queues, store_path=db_path)
    db = Path(db_path)
    log_root = Path(log_dir) if log_dir is not None else db.parent / f"{db.name}.logs"
    metrics = SchedulerMetrics(service)
    service.on_round = metrics.observe_round

    workers = max_workers or settings.grpc_workers
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gosched-grpc"),
        options=SERVER_OPTIONS,
        interceptors=[auth] if auth is not None else None,
    )
    http_server: ThreadingHTTPServer | None = None
    store_lock: IO[str] | None = None
    made: list[Path] = []
    store_new = False
    handle: ServerHandle | None = None
    try:
        # The ports first: a port taken (the commonest failure at start) then leaves nothing made on
        # disk. They are not served before start() below.
        bound_grpc = _listen(server, host, grpc_port, credentials)
        if http_port is not None:
            try:
                http_server = ThreadingHTTPServer((http_host, http_port), http_handler(service, metrics))
            except OSError as exc:  # name the port: "Address already in use" alone does not
                raise PortUnavailable(
                    "http", f"cannot serve HTTP on {http_host}:{http_port}: {os_error_reason(exc)}"
                ) from exc
            http_server.daemon_threads = True

        # Then the store, before anything runs: a second master on it fails here, naming it.
        if str(db) != ":memory:":
            made = _new_paths(db.with_name(f"{db.name}.lock"), log_root)
            store_lock = lock_store(db)
            # Judged under the lock: an existing store's -wal may hold its last transactions.
            store_new = not db.exists()
        logs = LogStore(log_root)
        gateway = AgentGateway(
            service, logs, heartbeat_interval_s=heartbeat_interval_s, node_timeout_s=node_timeout_s
        )
        if sim_task_seconds is not None:
            service.tick_hooks.append(SimulatedTasks(sim_task_seconds).tick)

        jobs = JobServicer(service, logs, max_streams=max(1, workers // 4), stopping=gateway.stopping)
        jobs_pb2_grpc.add_JobServiceServicer_to_server(jobs, server)
        agent_pb2_grpc.add_AgentServiceServicer_to_server(gateway, server)
        cluster_pb2_grpc.add_ClusterServiceServicer_to_server(ClusterServicer(service, gateway), server)
        health_servicer = health.HealthServicer(experimental_non_blocking=True)
        for name in ("", *SERVICE_NAMES):
            health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )

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
            _store_lock=store_lock,
        )
        if http_server is not None:
            handle._http_thread = threading.Thread(
                target=http_server.serve_forever, name="gosched-http", daemon=True
            )
            handle._http_thread.start()
        if settings.finished_job_ttl_s is not None and str(db) != ":memory:":
            handle._purger = StorePurger(db_path, settings.finished_job_ttl_s, logs=logs)
            handle._purger.start()
        announced = threading.Event()
        handle._health_thread = threading.Thread(
            target=_track_health, args=(handle, announced), name="gosched-health", daemon=True
        )
        handle._health_thread.start()
        if wait_ready:
            service.wait_ready()
            # Ready, so taking jobs (calls are refused before): the store stays, whatever comes.
            made, store_new = [], False
            announced.wait()
    except BaseException:
        # Nothing half-started stays behind: the ports and the store are free for the next try.
        if handle is not None:
            handle._store_lock = None  # kept until what this start made is removed
            handle.stop()
        else:
            server.stop(None)
            if http_server is not None:
                http_server.server_close()
        if store_lock is not None:
            _undo_start(db, log_root, made, store_new)
            store_lock.close()
        raise
    return handle
