"""GoSched on Ray: the dispatcher, the binder and N shards as actors (runtime/ray_actors.py).

    rs = RayScheduler(settings, nodes, address=None)    # starts Ray, or joins `address`
    rs.submit(job) / rs.submit_many(jobs)
    rs.run_until_idle(timeout=300.0)                    # rounds of every shard, concurrently
    rs.job_state(job_id) / rs.task_states(job_id) / rs.stats() / rs.shutdown()

Who drives: this driver keeps one ShardCore.run_once call in flight per shard and waits on them
with ray.wait, starting a shard's next round as soon as its last one is done. A round is a whole
loop inside the shard actor (pull a UnitBatch from the dispatcher, plan it, commit the
ProposalBatch to the binder, apply the reply), so the shards plan at the same time in their own
processes while the binder actor, one thread, serialises the commits.

Failures:
* a shard actor dies (its round raises RayActorError): the binder has the dispatcher take back
  the shard's units (requeue_in_flight, ordered after every report the binder sent), Ray restarts
  the actor, and its next round resyncs its view from the binder (changes_since(0)) first;
* the binder or the dispatcher restarts (a shard reports it lost, or its incarnation changed): the
  driver lets the rounds in flight finish, reloads the dispatcher from the store (bindings are
  committed there before any report), gives it the nodes again, and resets every shard's view.
  The binder refuses a task already bound (its task_valid stage), so nothing is bound twice.
  Both open the SQLite store, a file of the driver's machine, so they are pinned to the driver's
  node (a hard node affinity: a restart never moves them to a machine with another store); the
  shards go wherever Ray places them.

A local start (no address) is Ray's head started by this process: its GCS, raylet, dashboard and
monitors share the fate of the *thread* that started them (PR_SET_PDEATHSIG): see _start_local and
stop_own_ray for how they are started and stopped so that nothing of the session outlives it.
"""

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import psutil
import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from gosched.binder.writer import START_TIMEOUT_S, wait_for_previous_writer
from gosched.common.config import Settings
from gosched.common.job import Job
from gosched.common.node import Node, keep_operator_states
from gosched.common.states import TaskState
from gosched.runtime.control import SchedulerFailure, describe_error
from gosched.runtime.ray_actors import IN_MEMORY, INLINE_BYTES, INLINE_ENV, NamedActor, make_actor_classes

# Seconds an idle shard waits before it asks the dispatcher again while others are still busy.
IDLE_POLL_S = 0.005


# Starting a local Ray can time out on a loaded small machine, waiting for its GCS ("Timed out
# waiting for file .../gcs_server_port_...", a RuntimeError) or for its raylet to register ("The
# current node timed out during startup", a plain Exception, after a fixed 30 s); a second try
# after a clean shutdown goes through.
RAY_START_TRIES = 3
# Joining a cluster at an address: ray.init itself waits without end for a GCS that does not answer
# (and 20 s, retrying, for one that refuses this process's credentials). First a TCP connect to the
# GCS's host:port, then Ray's own handshake with it, each within these seconds.
CONNECT_TIMEOUT_S = 3.0
HANDSHAKE_TIMEOUT_S = 10.0
AUTH_HINT = (
    "the cluster uses token authentication: set RAY_AUTH_MODE=token for the master (with the "
    "cluster's token in ~/.ray/auth_token, $RAY_AUTH_TOKEN_PATH or $RAY_AUTH_TOKEN), or on the "
    "head node use --address auto, for which Ray loads the token itself"
)


class RayUnreachable(SchedulerFailure):
    """No Ray cluster answers at the address given (nothing listens, or not Ray's GCS)."""


class RayJoinFailed(SchedulerFailure):
    """Ray did not start, or refused to let this process join its cluster (the message says why)."""


def _gcs_target(address: str) -> tuple[str, int] | None:
    """The GCS host and port ray.init will connect to for `address` (127.0.0.1 and localhost
    become this node's IP, as Ray does), or None for the addresses Ray resolves itself ("auto",
    "local", ray://...) and those it will refuse as malformed."""
    if address in ("auto", "local") or "://" in address:
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    host = host.strip("[]")
    with contextlib.suppress(Exception):
        from ray._private.services import resolve_ip_for_localhost

        host = resolve_ip_for_localhost(host)
    return host, int(port)


def _check_reachable(address: str) -> None:
    """Fail fast, naming the address, when no Ray cluster can answer there: ray.init would wait
    for ever. Addresses Ray resolves itself are left to it."""
    target = _gcs_target(address)
    if target is None:
        return
    host, port = target
    where = f"{host}:{port}"
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except socket.gaierror as exc:
        raise RayUnreachable(
            f"no Ray cluster answers at {address} (cannot resolve {host}: {exc.strerror})"
        ) from exc
    except ConnectionRefusedError as exc:
        raise RayUnreachable(f"no Ray cluster answers at {address} (connection refused at {where})") from exc
    except TimeoutError as exc:
        raise RayUnreachable(
            f"no Ray cluster answers at {address} (no answer from {where} within {CONNECT_TIMEOUT_S:.0f} s)"
        ) from exc
    except OSError as exc:
        raise RayUnreachable(f"no Ray cluster answers at {address} ({where}: {exc.strerror or exc})") from exc
    _check_handshake(address, where)


def _check_handshake(address: str, where: str) -> None:
    """Ray's own first call to the GCS (its cluster id), in a thread of its own: something else
    listening there never answers it, and a cluster with token authentication refuses it at once."""
    import ray._raylet

    gcs_client = getattr(ray._raylet, "GcsClient", None)  # Ray's own client (not typed)
    if gcs_client is None:  # another Ray: ray.init alone tells
        return
    outcome: list[BaseException | None] = []

    def handshake() -> None:
        try:
            gcs_client(address=where)
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=handshake, name="gosched-ray-handshake", daemon=True)
    thread.start()
    thread.join(HANDSHAKE_TIMEOUT_S)
    if not outcome:  # still waiting, in Ray's C++ client: left behind (a daemon thread)
        raise RayUnreachable(
            f"no Ray cluster answers at {address} (something listens at {where}, but no Ray GCS "
            f"answered there within {HANDSHAKE_TIMEOUT_S:.0f} s)"
        )
    exc = outcome[0]
    if exc is None:
        return
    if _is_auth_failure(exc):
        raise RayJoinFailed(_join_failure(address, exc)) from exc
    raise RayUnreachable(f"no Ray cluster answers at {address} ({describe_error(exc)})") from exc


def _is_auth_failure(exc: BaseException) -> bool:
    text = describe_error(exc, limit=2000)
    return any(word in text for word in ("InvalidAuthToken", "AuthenticationError", "Unauthenticated"))


def _join_failure(address: str | None, exc: BaseException) -> str:
    """One line: what failed, the innermost reason, and what to do about an authentication failure."""
    if address is None:
        return f"cannot start Ray on this machine: {describe_error(exc)}"
    if _is_auth_failure(exc):
        text = describe_error(exc, limit=2000)
        reason = text[text.find("InvalidAuthToken") :] if "InvalidAuthToken" in text else text
        reason = reason.split(". ", 1)[0].rstrip(".")
        return f"cannot join the Ray cluster at {address}: it refused this master ({reason}); {AUTH_HINT}"
    return f"cannot join the Ray cluster at {address}: {describe_error(exc)}"


def _ray_children() -> dict[int, psutil.Process]:
    """This process's children that run Ray's own programs (GCS, raylet, monitors, dashboard)."""
    ray_dir = os.path.dirname(ray.__file__) + os.sep
    found: dict[int, psutil.Process] = {}
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if any(arg.startswith(ray_dir) for arg in child.cmdline()):
                found[child.pid] = child
    return found


def _stop_half_started(before: dict[int, psutil.Process]) -> None:
    """Kill what a failed local start left running. ray.shutdown() knows nothing of a node whose
    start raised (ray.init had not kept it yet): its GCS, monitor, dashboard and log monitor went
    on through the next tries, a minute and more, on a machine of two cores."""
    procs: list[psutil.Process] = []
    for pid, child in _ray_children().items():
        if pid in before:
            continue
        with contextlib.suppress(psutil.Error):
            procs.extend(child.children(recursive=True))  # the raylet's agents and workers
        procs.append(child)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=5.0)


def _start_ray(address: str | None, **options: Any) -> None:
    """ray.init, tried again after a start-up that timed out; `options` go to a local start. An
    address is checked first (RayUnreachable within seconds, not a wait without end); a failure
    is raised as RayJoinFailed, whose message names its cause on one line.

    A local start that failed is cleaned up before the next try. One cause of such failures: gRPC
    (a server or channel in this process, fork support on) starts a poller thread in each child Ray
    forks, whose epoll fd subprocess closes before exec; the child, to be the raylet or the GCS,
    aborts (grpc/grpc#43055) and Ray waits 30 s for it. GRPC_ENABLE_FORK_SUPPORT=false, set before
    grpc is imported, prevents that."""
    if address is not None:
        _check_reachable(address)
    else:
        # Inherited by the Ray processes the local start makes (see ray_actors.INLINE_BYTES); a
        # value set already stands.
        os.environ.setdefault(INLINE_ENV, str(INLINE_BYTES))
    for attempt in range(1, RAY_START_TRIES + 1):
        before = _ray_children() if address is None else {}
        try:
            if address is None:
                _start_local({"include_dashboard": False, "logging_level": logging.WARNING, **options})
            else:
                ray.init(address=address, logging_level=logging.WARNING)
            return
        except Exception as exc:
            with contextlib.suppress(Exception):
                ray.shutdown()
            if address is None:
                _stop_half_started(before)
            if attempt == RAY_START_TRIES or "timed out" not in str(exc).lower():
                raise RayJoinFailed(_join_failure(address, exc)) from exc
            logging.getLogger(__name__).warning("Ray did not start (%s); trying again", exc)
            time.sleep(1.0)


# How often the thread that started a local Ray looks whether Ray's processes have ended yet.
OUTLIVE_POLL_S = 0.5


def _start_local(options: dict[str, Any]) -> None:
    """ray.init(**options) for a local start, from a thread that outlives the processes it makes.

    Ray starts its head's processes (GCS, raylet, dashboard, monitors) with PR_SET_PDEATHSIG:
    the kernel SIGKILLs them when the *thread* that forked them ends, not the process. Started from
    a thread that ends before ray.shutdown() (the API's scheduling thread does: SchedulerService
    stops it, then closes the control plane from another thread), the raylet and the GCS died
    killed, never told to stop; the raylet's dashboard and runtime-env agents, orphaned to PID 1,
    then waited 60 s to report the raylet's "unexpected" death to the dead GCS, deaf to SIGTERM
    (their main thread blocked in Ray's C++ client) -- a minute of two more processes after every
    `gosched up`. So a start from any thread but the main one (which lasts as long as the process)
    runs ray.init on a daemon thread of its own that stays until those processes have ended; at
    the process's exit it goes with them, as fate sharing means it to."""
    if threading.current_thread() is threading.main_thread():
        ray.init(**options)
        return
    started: Future[None] = Future()

    def start_and_outlive() -> None:
        before = set(_ray_children())
        try:
            ray.init(**options)
        except BaseException as exc:  # the caller cleans up what a failed start left
            started.set_exception(exc)
            return
        made = [proc for pid, proc in _ray_children().items() if pid not in before]
        started.set_result(None)
        while any(_running(proc) for proc in made):
            time.sleep(OUTLIVE_POLL_S)

    threading.Thread(target=start_and_outlive, name="gosched-ray-parent", daemon=True).start()
    started.result()


def _running(proc: psutil.Process) -> bool:
    """`proc` (the very process, not one that took its pid since) is alive, a zombie not counted."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# Seconds the processes of a stopped local Ray get to end by themselves before they are killed.
LEFTOVER_GRACE_S = 2.0


def _session_dir() -> str | None:
    """The session folder of the Ray this process started (/tmp/ray/session_...), or None."""
    with contextlib.suppress(Exception):
        node = getattr(ray._private.worker, "_global_node", None)
        if node is not None:
            return str(node.get_session_dir_path())
    return None


def session_processes(session_dir: str) -> list[psutil.Process]:
    """This user's Ray processes of the session in `session_dir`, wherever they are in the process
    tree (an agent whose raylet died is PID 1's): the head's programs name the folder in their
    command line, the raylet's agents and workers (their title changed to ray::...) hold its log
    files open. Not this process, nor anything but Ray's own programs (a worker's child such as
    the binder's store writer holds a worker's log file open too, and finishes its work itself)."""
    ray_dir = os.path.dirname(ray.__file__) + os.sep
    folder = session_dir.rstrip(os.sep)
    inside = folder + os.sep
    uid = os.getuid()
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid == os.getpid() or proc.uids().real != uid:
                continue
            cmdline = proc.cmdline()
            if not cmdline:
                continue
            if cmdline[0].startswith("ray::"):
                mine = any(f.path.startswith(inside) for f in proc.open_files())
            else:
                mine = any(arg.startswith(ray_dir) for arg in cmdline) and any(
                    inside in arg or arg.endswith(folder) for arg in cmdline
                )
            if mine:
                found.append(proc)
    return found


def stop_own_ray() -> None:
    """ray.shutdown() of the Ray this process started, then an end to what of its session is left.

    Ray's shutdown sends the raylet SIGTERM and SIGKILLs it a second later; the raylet stops its
    agents and workers only on a SIGTERM it had time to act on. On a loaded machine (two cores)
    it may not, and its agents then wait 60 s on the GCS, unkillable but by SIGKILL (see
    _start_local). Whatever of the session runs LEFTOVER_GRACE_S after the shutdown is killed."""
    session = _session_dir()
    ray.shutdown()
    if session is None:
        return
    left = [proc for proc in session_processes(session) if _running(proc)]
    if not left:
        return
    _, alive = psutil.wait_procs(left, timeout=LEFTOVER_GRACE_S)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    if alive:
        psutil.wait_procs(alive, timeout=5.0)
        logging.getLogger(__name__).info(
            "killed %d process(es) Ray's shutdown left of %s: %s",
            len(alive),
            session,
            ", ".join(f"{proc.pid}" for proc in alive),
        )


def _on_this_node() -> NodeAffinitySchedulingStrategy:
    """Where the binder and the dispatcher run, restarts included: on the driver's node. They open
    the SQLite store, a file of this machine; restarted elsewhere they would open an empty one."""
    return NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)


def _actor_names(shards: int) -> list[NamedActor]:
    """Names for one master's actors, in its driver's namespace: dispatcher, binder, each shard."""
    prefix = f"gosched-{uuid.uuid4().hex[:12]}"
    namespace = ray.get_runtime_context().namespace
    roles = ["dispatcher", "binder", *(f"shard-{i}" for i in range(shards))]
    return [NamedActor(f"{prefix}-{role}", namespace) for role in roles]


class RayScheduler:
    def __init__(self, settings: Settings, nodes: Sequence[Node] = (), address: str | None = None) -> None:
        self.settings = settings
        self._own_ray = False
        if not ray.is_initialized():
            _start_ray(address)
            self._own_ray = True
        if settings.store_path not in IN_MEMORY:
            # A writer of a binder of an earlier master (gone with its head node, say) may still be
            # writing its last batches: the dispatcher and the binder load the store after it.
            wait_for_previous_writer(settings.store_path, START_TIMEOUT_S)
        dispatcher_cls, binder_cls, shard_cls = make_actor_classes()
        # Named per master (two may share a Ray cluster): the constructors get each other by name.
        names = _actor_names(settings.shards)
        # The shards may run anywhere; the two that open the store only where the store is.
        here = _on_this_node()
        self.dispatcher = dispatcher_cls.options(
            scheduling_strategy=here, name=names[0].name, namespace=names[0].namespace
        ).remote(settings)
        self.binder = binder_cls.options(
            scheduling_strategy=here, name=names[1].name, namespace=names[1].namespace
        ).remote(settings.store_path, names[0], queues=settings.queues)
        self.binder_incarnation: str = ray.get(self.binder.get_incarnation.remote())
        self.dispatcher_incarnation: str = ray.get(
            self.dispatcher.set_binder.remote(self.binder, self.binder_incarnation)
        )
        self.shards = [
            shard_cls.options(name=names[2 + i].name, namespace=names[2 + i].namespace).remote(
                i, settings.profile, names[0], names[1]
            )
            for i in range(settings.shards)
        ]
        self.counters = {
            "rounds": 0,
            "proposals": 0,
            "unschedulable_units": 0,
            "shard_restarts": 0,
            "control_recoveries": 0,
        }
        if nodes:
            known, _ = ray.get(self.binder.cluster.remote())  # a restart: from the store
            ray.get(self.binder.add_nodes.remote(keep_operator_states(nodes, known)))
        self._wire(reset_shards=True)

    # -- wiring ------------------------------------------------------------------------------------
    def _wire(self, *, reset_shards: bool) -> None:
        """Give the dispatcher the binder's nodes and totals; give each shard its partition."""
        nodes, totals = ray.get(self.binder.cluster.remote())
        parts: list[list[str]] = ray.get(self.dispatcher.set_nodes.remote(nodes, totals))
        if reset_shards:
            ray.get([s.reset.remote(p) for s, p in zip(self.shards, parts, strict=True)])
        else:
            ray.get([s.set_partition.remote(p) for s, p in zip(self.shards, parts, strict=True)])

    def add_nodes(self, nodes: Sequence[Node]) -> None:
        """Register nodes; the shards learn them with their next reply."""
        ray.get(self.binder.add_nodes.remote(list(nodes)))
        self._wire(reset_shards=False)

    def remove_node(self, name: str) -> list[str]:
        """Delete a node; its tasks are queued again (returned). The shards learn it with their
        next reply, and their partitions are drawn again without it."""
        lost: list[str] = ray.get(self.binder.remove_node.remote(name))
        ray.get(self.dispatcher.on_released.remote(lost, TaskState.PENDING.value))
        self._wire(reset_shards=False)
        return lost

    # -- jobs --------------------------------------------------------------------------------------
    def submit(self, job: Job) -> str:
        return self.submit_many([job])[0]

    def submit_many(self, jobs: Sequence[Job]) -> list[str]:
        ids: list[str] = ray.get(self.dispatcher.submit_many.remote(list(jobs)))
        return ids

    def job_state(self, job_id: str) -> str:
        state: str = ray.get(self.dispatcher.job_state.remote(job_id))
        return state

    def task_states(self, job_id: str) -> list[str]:
        states: list[str] = ray.get(self.dispatcher.task_states.remote(job_id))
        return states

    def task_state_counts(self, job_ids: Sequence[str]) -> dict[str, int]:
        """How many tasks of these jobs are in each state (one call for all of them)."""
        counts: dict[str, int] = ray.get(self.dispatcher.task_state_counts.remote(list(job_ids)))
        return counts

    def explain(self, job_id: str) -> str:
        text: str = ray.get(self.dispatcher.explain.remote(job_id))
        return text

    def resident_node(self, tid: str) -> str | None:
        """The node a task is bound to at the binder, or None."""
        node: str | None = ray.get(self.binder.resident_node.remote(tid))
        return node

    def sync_shards(self) -> None:
        """Bring every shard's view up to the binder's version now."""
        ray.get([s.sync.remote() for s in self.shards])

    def resident_ids(self) -> list[str]:
        """Every task id resident at the binder, once per residence."""
        ids: list[str] = ray.get(self.binder.resident_ids.remote())
        return ids

    # -- the loop ----------------------------------------------------------------------------------
    def run_until_idle(
        self,
        timeout: float = 300.0,
        on_round: Callable[[int], None] | None = None,
        more_coming: Callable[[], bool] | None = None,
    ) -> int:
        """Run the shards' rounds until nothing is dispatched, nothing is in flight and no job is
        backing off. Returns the rounds run; raises TimeoutError after `timeout` seconds.
        `on_round(n)` is called after the n-th completed round (fault injection in tests);
        while `more_coming()` is true (jobs still being submitted) the run is never idle."""
        deadline = time.monotonic() + timeout
        rounds = 0
        outstanding: dict[Any, int] = {}
        idle: set[int] = set()
        retry_at: dict[int, float] = {}

        def start(s: int) -> None:
            outstanding[self.shards[s].run_once.remote()] = s

        for s in range(len(self.shards)):
            start(s)
        while True:
            if time.monotonic() > deadline:
                self._drain(outstanding)
                raise TimeoutError(f"not idle after {timeout}s")
            now = time.monotonic()
            for s, at in list(retry_at.items()):
                if at <= now:
                    del retry_at[s]
                    start(s)
            if not outstanding:
                if len(idle) == len(self.shards) and not retry_at:
                    counts = ray.get(self.dispatcher.counts.remote())
                    if counts["incarnation"] != self.dispatcher_incarnation:
                        self._recover()
                    elif more_coming is not None and more_coming() and counts["waiting"] == 0:
                        time.sleep(IDLE_POLL_S)
                    elif counts["in_flight"] == 0 and counts["waiting"] == 0:
                        if self._probe_idle():
                            return rounds
                    else:
                        pause = self.settings.retry_backoff_s if counts["in_flight"] == 0 else IDLE_POLL_S
                        time.sleep(max(pause, IDLE_POLL_S))
                    idle.clear()
                    for s in range(len(self.shards)):
                        start(s)
                    continue
                time.sleep(IDLE_POLL_S)
                continue
            ready, _ = ray.wait(list(outstanding), num_returns=1, timeout=0.05)
            lost_control = False
            for ref in ready:
                s = outstanding.pop(ref)
                try:
                    res = ray.get(ref)
                except RayActorError:
                    self._shard_lost(s)
                    start(s)
                    continue
                if "lost" in res or self._restarted(res):
                    lost_control = True
                    continue
                if res["idle"]:
                    idle.add(s)
                    if len(idle) < len(self.shards):
                        retry_at[s] = time.monotonic() + IDLE_POLL_S
                    continue
                idle.discard(s)
                rounds += 1
                self.counters["rounds"] += 1
                self.counters["proposals"] += res["proposals"]
                self.counters["unschedulable_units"] += res["unschedulable"]
                if on_round is not None:
                    on_round(rounds)
                for other in list(idle):  # work is flowing: the idle ones ask again
                    if other not in retry_at and other not in outstanding.values():
                        idle.discard(other)
                        start(other)
                start(s)
            if lost_control:
                self._drain(outstanding)
                retry_at.clear()
                idle.clear()
                self._recover()
                for s in range(len(self.shards)):
                    start(s)

    def _restarted(self, res: dict[str, Any]) -> bool:
        d_inc = res.get("dispatcher")
        b_inc = res.get("binder")
        return (d_inc is not None and d_inc != self.dispatcher_incarnation) or (
            b_inc is not None and b_inc != self.binder_incarnation
        )

    def _probe_idle(self) -> bool:
        """One more round on every shard: idle only if none of them got a batch."""
        results = []
        for s, shard in enumerate(self.shards):
            try:
                results.append(ray.get(shard.run_once.remote()))
            except RayActorError:
                self._shard_lost(s)  # its units go back to the queue
                return False
        busy = False
        for res in results:
            if "lost" in res or self._restarted(res):
                self._recover()
                return False
            if not res["idle"]:
                busy = True
                self.counters["rounds"] += 1
                self.counters["proposals"] += res["proposals"]
                self.counters["unschedulable_units"] += res["unschedulable"]
        return not busy

    def _drain(self, outstanding: dict[Any, int]) -> None:
        """Let the rounds in flight end (their results are dropped; a lost shard is handled)."""
        for ref in list(outstanding):
            try:
                ray.get(ref)
            except RayActorError:
                self.counters["shard_restarts"] += 1
        outstanding.clear()

    def _shard_lost(self, shard_id: int) -> None:
        """Ray restarts the shard; its units go back to the queue (it resyncs on its next round)."""
        self.counters["shard_restarts"] += 1
        # If the binder is down too, the recovery that follows reloads the dispatcher instead.
        with contextlib.suppress(RayActorError):
            ray.get(self.binder.requeue_shard.remote(shard_id))

    def _recover(self, timeout: float = 120.0) -> None:
        """After a binder or dispatcher restart: reload the dispatcher from the store, rewire the
        nodes and partitions, and reset every shard's view. Nothing runs meanwhile."""
        self.counters["control_recoveries"] += 1
        deadline = time.monotonic() + timeout
        # Every shard's calls still out (a prefetched batch, a commit) end before the reload reads
        # the store: one landing after it would hand out or bind units the reload cannot see.
        for shard in self.shards:
            with contextlib.suppress(RayActorError):
                ray.get(shard.quiesce.remote())
        # A commit's answer leaves before its batch is durable: the binder's writer lands it and the
        # dispatcher takes its report first. A restarting binder has recovered once it answers.
        with contextlib.suppress(RayActorError):
            ray.get(self.binder.settle.remote())
        while True:
            try:
                self.binder_incarnation = ray.get(self.binder.get_incarnation.remote())
                self.dispatcher_incarnation = ray.get(
                    self.dispatcher.reload.remote(self.binder, self.binder_incarnation)
                )
                self._wire(reset_shards=True)
                return
            except RayActorError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    # -- reporting ---------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters of the driver, the dispatcher and the binder; tasks_per_s from the first
        dispatch to the last binding."""
        out: dict[str, Any] = dict(self.counters)
        d = ray.get(self.dispatcher.stats.remote())
        b = ray.get(self.binder.stats.remote())
        out.update(d)
        out["binder_version"] = b["version"]
        out["binder_commits"] = b["commits"]
        out["reply_bytes"] = b["reply_bytes"]
        out["largest_reply"] = b["largest_reply"]
        span = d["last_bind"] - d["first_dispatch"]
        out["tasks_per_s"] = d["bound_tasks"] / span if span > 0 and d["first_dispatch"] else 0.0
        return out

    def reset_largest_reply(self) -> None:
        """stats()' largest_reply counts from here on (the binder's, which counts its whole life)."""
        ray.get(self.binder.reset_largest_reply.remote())

    def process_stats(self) -> dict[str, dict[str, float]]:
        """Per actor process: pid, RSS and peak RSS (MiB), busy seconds. Keys: dispatcher, binder,
        shard-0, shard-1, ..."""
        handles = {"dispatcher": self.dispatcher, "binder": self.binder}
        handles.update({f"shard-{i}": s for i, s in enumerate(self.shards)})
        got = ray.get([h.process_stats.remote() for h in handles.values()])
        return dict(zip(handles, got, strict=True))

    def drain_latencies(self) -> tuple[list[float], list[float]]:
        """Seconds per bound task since the last drain: (dispatch -> bind, submission -> bind)."""
        dispatched = ray.get(self.dispatcher.drain_latencies.remote())
        waited = ray.get(self.dispatcher.drain_wait_latencies.remote())
        return dispatched, waited

    def shutdown(self) -> None:
        """Kill the actors (and stop Ray if this scheduler started it)."""
        for handle in [*self.shards, self.binder, self.dispatcher]:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(handle, no_restart=True)
        if self._own_ray:
            stop_own_ray()
