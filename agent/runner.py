"""The node agent process: registers this machine with the master and runs the tasks bound to it.

    runner = AgentRunner("master:9090", name="gpu-07")
    runner.run()          # until stop(): another thread, or a signal handler, calls it

Three threads: the link (Register + the Connect stream, reconnecting; launches and kills arrive
there), the worker (every TICK_S: notices exits, restarts services, ships logs, final statuses and
heartbeats into the outbox), and the caller's, which waits for stop() and then shuts down: kills
the tasks with a grace period, lets their last output and statuses go out, and returns. A fourth,
while a container runtime is configured or looked for, probes it again now and then: a docker
daemon that starts or stops after the agent does changes what the node can run.
"""

import contextlib
import fcntl
import importlib.metadata
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from gosched.agent import cgroups
from gosched.agent.containers import NO_RUNTIME, RUNTIME_PROBE_S, find_runtime, probe_runtime, runtime_kind
from gosched.agent.discovery import discover, load_nvml
from gosched.agent.executor import ShellExecutor
from gosched.agent.link import NAME_TAKEN_GIVE_UP_S, MasterLink
from gosched.agent.outbox import Outbox, task_of
from gosched.agent.state import StateFile
from gosched.agent.tasks import TaskTable, carry_restart
from gosched.agent.usage import UsageSampler
from gosched.api.channel import ChannelSecurity
from gosched.api.convert import node_from_proto, node_to_proto
from gosched.common.node import RUNTIME_LABEL, Node, NodeState, Taint
from gosched.proto.v1 import agent_pb2

log = logging.getLogger("gosched.agent")

AUTO = "auto"  # container_runtime: find docker or podman on PATH
TICK_S = 0.05
LOG_INTERVAL_S = 0.2  # a running task's new output goes up at most this often
LOG_CHUNKS_PER_TICK = 16  # per stream of a task, 64 KiB each
OUTBOX_HIGH = 256  # no more log chunks while this many messages wait (a slow or absent master)
STATE_SAVE_S = 1.0  # shipped log offsets are written to the state file at most this often
FLUSH_ON_STOP_S = 3.0  # how long a stopping agent waits for its last messages to go out
# The tasks of a stopping agent did not fail: "lost:" has the master queue them again elsewhere.
SHUTDOWN_MESSAGE = "lost: agent shutdown"


class WorkDirBusy(RuntimeError):
    """Another agent process holds the work dir (or, as NodeNameTaken, the node's name)."""


class MoreThanTheMachine(ValueError):
    """An override advertises more of a resource than the machine has: the node would be offered
    room that is not there (tasks packed onto it would starve or be OOM killed). `resource` is the
    AgentRunner option ("cpu_milli", "memory"), `asked` and `has` the amounts in its unit, and
    `has_text` what the machine has, for a person ("2 CPUs", "23.5 GiB")."""

    def __init__(self, resource: str, asked: int, has: int, has_text: str) -> None:
        super().__init__(f"{resource}={asked} is more than this machine has ({has_text})")
        self.resource, self.asked, self.has, self.has_text = resource, asked, has, has_text


class NodeNameTaken(WorkDirBusy):
    """The master refused this agent: another live agent holds the node's name. A WorkDirBusy, so
    that `gosched agent` reports it the same way: an error line and exit code 1."""


def agent_version() -> str:
    try:
        return importlib.metadata.version("gosched")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def default_work_dir(name: str) -> Path:
    return Path.home() / ".gosched" / "agent" / name


class AgentRunner:
    def __init__(
        self,
        master: str = "localhost:9090",
        name: str | None = None,
        *,
        work_dir: str | Path | None = None,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Taint] = (),
        cpu_milli: int | None = None,
        memory: int | None = None,
        extended: Mapping[str, int] | None = None,
        container_runtime: str | None = AUTO,
        runtime_probe_s: float = RUNTIME_PROBE_S,
        shutdown_grace_s: float = 10.0,
        name_taken_give_up_s: float = NAME_TAKEN_GIVE_UP_S,
        echo: Callable[[str], None] | None = None,
        nvml: Any = AUTO,
        security: ChannelSecurity | None = None,
    ) -> None:
        """`cpu_milli` / `memory` advertise less than the machine has (at most what it has: more
        raises MoreThanTheMachine, a ValueError); `extended` the countable
        resources it has that the agent cannot find (e.g. {"example.com/fpga": 2}), sent with every
        registration; `container_runtime` is the docker/podman program for tasks with an image
        (AUTO: look on PATH, None: none), probed again every `runtime_probe_s` seconds (0: only at
        start); `nvml` an initialised pynvml-like module (AUTO: load pynvml, None: a CPU-only
        node). If the master says another agent holds the node's name, run() stops and raises
        NodeNameTaken (once registered, only after `name_taken_give_up_s` of such answers: see
        agent/link.py). `security`: TLS and the agent token for a secured master
        (gosched.api.channel; None: plaintext)."""
        self.master = master
        self.name = name or socket.gethostname()
        self.work_dir = Path(work_dir) if work_dir is not None else default_work_dir(self.name)
        self.shutdown_grace_s = shutdown_grace_s
        self.echo = echo or log.info
        self._nvml: Any
        self._nvml, nvml_status = load_nvml() if nvml is AUTO else (nvml, "given" if nvml else "none given")
        self.machine = discover(self._nvml, nvml_status)
        # A runtime is used only if it works: found on PATH or given, probed here and then every
        # runtime_probe_s (see _watch_runtime).
        self._runtime_choice = container_runtime
        self.runtime_probe_s = runtime_probe_s
        self.container_runtime, self.no_runtime_reason = _working_runtime(container_runtime)
        self._labels = dict(labels or {})  # the operator's: they win over what the agent finds
        found = {RUNTIME_LABEL: runtime_kind(self.container_runtime)} if self.container_runtime else {}
        node = self.machine.to_node(self.name, {**found, **self._labels}, tuple(taints), extended)
        if cpu_milli is not None:
            if cpu_milli > node.cpu_milli:
                raise MoreThanTheMachine(
                    "cpu_milli", cpu_milli, node.cpu_milli, f"{node.cpu_milli / 1000:g} CPUs"
                )
            node = replace(node, cpu_milli=cpu_milli)
        if memory is not None:
            if memory > node.memory:
                raise MoreThanTheMachine("memory", memory, node.memory, f"{node.memory / 2**30:.1f} GiB")
            node = replace(node, memory=memory)
        self.node: Node = node_from_proto(node_to_proto(node))  # validated as the master will
        self.limits = "none: not started"
        self.node_name = self.name  # as the master calls it, once registered
        self.registered = threading.Event()

        self._lock = threading.Lock()  # guards the task table (the link and the worker both use it)
        self._stop = threading.Event()
        self._kill_on_stop = True
        self._done = threading.Event()
        self._outbox = Outbox()
        self._usage = UsageSampler(self._nvml)
        self._state = StateFile(self.work_dir / "state.json")
        self._tasks: TaskTable | None = None
        self._held: list[agent_pb2.TaskStatus] = []  # RUNNING reports waiting for the state file
        self._refused: str | None = None
        self._link = MasterLink(
            master,
            self._register_request,
            self._on_registered,
            self._on_message,
            self._outbox,
            self.echo,
            on_refused=self._on_refused,
            name_taken_give_up_s=name_taken_give_up_s,
            security=security,
        )
        self._next_heartbeat = 0.0
        self._heartbeat_s = 1.0
        self._next_logs = 0.0
        self._offsets_moved = False
        self._last_save = 0.0

    # -- public ---------------------------------------------------------------------------------------
    def run(self) -> None:
        """Run until stop(); then kill the tasks (unless stop(kill_tasks=False)) and return."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with _exclusive(self.work_dir / "agent.lock"):
            tasks = self._start_tasks()
            worker = threading.Thread(target=self._work, name="agent-worker", daemon=True)
            link = threading.Thread(target=self._link.run, name="agent-link", daemon=True)
            worker.start()
            link.start()
            if self._runtime_choice is not None and self.runtime_probe_s > 0:
                threading.Thread(target=self._watch_runtime, name="agent-runtime", daemon=True).start()
            try:
                while not self._stop.wait(0.5):
                    pass
                self._shut_down(tasks)
            finally:
                self._done.set()
                worker.join(5)
                self._link.close()
                link.join(5)
                # What still runs, for the next agent. It ships output again from the first log
                # chunk the master is not known to have: queued, or taken by a stream the link
                # could not drain (lost in its transport when it was cut).
                with self._lock:
                    self._state.save(tasks.snapshot(self._outbox.log_offsets(taken=True)))
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
        if self._refused is not None:
            raise NodeNameTaken(self._refused)

    def stop(self, kill_tasks: bool = True) -> None:
        """Ask run() to return. With kill_tasks=False the tasks keep running and the next agent
        started on this work dir adopts them."""
        self._kill_on_stop = kill_tasks
        self._stop.set()

    @property
    def connected(self) -> bool:
        return self._link.session is not None

    def running_task_ids(self) -> list[str]:
        with self._lock:
            return [] if self._tasks is None else self._tasks.running_ids()

    # -- start and stop -------------------------------------------------------------------------------
    def _start_tasks(self) -> TaskTable:
        support = cgroups.detect()
        if support.available:
            self.limits = "cgroup v2 (cpu, memory)"
        else:
            self.limits = f"none: {support.reason}"
            self.echo(f"tasks run without CPU/memory limits ({support.reason})")
        if self.container_runtime is None:
            self.echo(f"tasks with an image cannot run here: {self.no_runtime_reason}")
        executor = ShellExecutor(self.work_dir / "logs", support)
        no_runtime = f"{NO_RUNTIME} ({self.no_runtime_reason})"
        tasks = TaskTable(executor, self._report, self.container_runtime, self.echo, no_runtime)
        saved = self._state.load()
        alive = tasks.adopt(saved)
        if saved.tasks:
            ended = len(saved.tasks) - alive
            self.echo(f"adopted {alive} running task(s) of the previous agent; {ended} ended")
        with self._lock:
            self._tasks = tasks
        return tasks

    def _shut_down(self, tasks: TaskTable) -> None:
        if not self._kill_on_stop:
            return  # the node stays as it is: the next agent on the work dir adopts the tasks
        with self._lock:
            # Leaving on purpose, as a kubelet or slurmd going away: the node is told not ready
            # first, so that the master binds nothing more to it (the tasks' "lost" reports, which
            # follow on the stream, requeue them elsewhere), and gives it up once the stream ends,
            # not a node timeout later. An older master takes only the labels of a node update.
            leaving = replace(self.node, state=NodeState.NOT_READY)
            self._outbox.put(agent_pb2.AgentMessage(node_update=node_to_proto(leaving)))
            count = len(tasks.running_ids())
            tasks.kill_all(SHUTDOWN_MESSAGE, self.shutdown_grace_s)
        if count:
            self.echo(f"stopping: killing {count} task(s)")
        deadline = time.monotonic() + self.shutdown_grace_s + 5
        while time.monotonic() < deadline and self._locked(tasks.has_processes):
            time.sleep(TICK_S)
        # Their last output and final statuses go out if the master is there to take them.
        deadline = time.monotonic() + FLUSH_ON_STOP_S
        while time.monotonic() < deadline and self.connected:
            if not self._locked(tasks.has_unreported) and not len(self._outbox):
                break
            time.sleep(TICK_S)

    def _locked(self, fn: Callable[[], bool]) -> bool:
        with self._lock:
            return fn()

    # -- the link's callbacks (its thread) ----------------------------------------------------------
    def _register_request(self) -> agent_pb2.RegisterRequest:
        return agent_pb2.RegisterRequest(
            node=node_to_proto(self.node), agent_version=agent_version(), limits=self.limits
        )

    def _on_registered(self, response: agent_pb2.RegisterResponse) -> agent_pb2.AgentMessage:
        expected = set(response.expected_task_ids)
        with self._lock:
            tasks = self._tasks
            assert tasks is not None
            resume = {(r.task_id, r.stream): r.offset for r in response.log_resume}
            resend, resent = tasks.reconcile(expected, resume)
            # Queued messages of tasks the master does not expect concern nobody any more. A node
            # update stays: it may be newer than the node this registration sent. Queued output
            # the master resumes from its own offsets is read again from there (what it lost comes
            # first, with no hole in between); so is a final status that goes out again after it.
            self._outbox.keep_only(
                lambda m: (
                    m.HasField("node_update")
                    or (task_of(m) in expected and _kept_on_resume(m, resume, resent))
                )
            )
            queued = self._outbox.final_status_ids()
            for status in resend:
                if status.task_id not in queued:
                    self._outbox.put(agent_pb2.AgentMessage(task_status=status))
            running = tasks.running_ids()
            self._heartbeat_s = response.heartbeat_interval_s if response.heartbeat_interval_s > 0 else 1.0
            self._next_heartbeat = time.monotonic() + self._heartbeat_s
        self.node_name = response.node_name or self.name
        node = self.node
        again = " again" if self.registered.is_set() else ""
        extended = "".join(f", {name}={count}" for name, count in node.extended)
        self.echo(
            f"registered{again} as {self.node_name} with {node.cpu_milli / 1000:g} CPUs, "
            f"{node.memory / 2**30:.1f} GiB memory, {len(node.gpus)} GPUs{extended} "
            f"({len(running)} task(s) running, {len(expected)} expected)"
        )
        self.registered.set()
        return self._heartbeat(running)

    def _on_message(self, msg: agent_pb2.SchedulerMessage) -> None:
        body = msg.WhichOneof("body")
        if body == "launch" and self._stop.is_set():
            return  # stopping: nothing new starts (the master sees the node go)
        try:
            with self._lock:
                assert self._tasks is not None
                if body == "launch":
                    self._tasks.launch(msg.launch)
                elif body == "kill":
                    self._tasks.kill(msg.kill.task_id, msg.kill.grace_period_s, msg.kill.reason)
                self._release(self._tasks, time.monotonic())
        except Exception:  # one bad message must not take the stream down
            log.exception("could not handle %s from the master", body)

    def _on_refused(self, why: str) -> None:
        """Another agent holds this node: stop, and kill the tasks (the master counts on that
        agent for them now, so ours would run twice)."""
        self._refused = why
        self.echo(f"stopping: {why}")
        self.stop(kill_tasks=True)

    def _report(self, status: agent_pb2.TaskStatus) -> None:
        self._held.append(status)  # until the state file knows the task (see _release)

    def _release(self, tasks: TaskTable, now: float) -> None:
        """Write the state file if the tasks changed, then let their RUNNING reports go: a master
        told that a task runs can count on a restarted agent to know it too."""
        if tasks.dirty or (self._offsets_moved and now - self._last_save >= STATE_SAVE_S):
            self._save(tasks, now)
        for status in self._held:
            self._outbox.put(agent_pb2.AgentMessage(task_status=status))
        self._held.clear()

    # -- the container runtime's prober ----------------------------------------------------------------
    def _watch_runtime(self) -> None:
        while not self._done.wait(self.runtime_probe_s):
            try:
                self._runtime_probed(*_working_runtime(self._runtime_choice))
            except Exception:  # keep probing whatever one probe hit
                log.exception("probing the container runtime failed")

    def _runtime_probed(self, runtime: str | None, why: str) -> None:
        """Take a probe's answer: tasks with an image use (or fail without) the runtime from now
        on, and if that changes what the node offers, the master is told its new labels."""
        with self._lock:
            had = self.container_runtime
            if (runtime, why) == (had, self.no_runtime_reason):
                return
            self.container_runtime, self.no_runtime_reason = runtime, why
            if self._tasks is not None:
                self._tasks.container_runtime = runtime
                self._tasks.no_runtime = f"{NO_RUNTIME} ({why})" if runtime is None else NO_RUNTIME
            labels = dict(self.node.labels)
            if RUNTIME_LABEL not in self._labels:
                labels.pop(RUNTIME_LABEL, None)
                if runtime is not None:
                    labels[RUNTIME_LABEL] = runtime_kind(runtime)
            relabelled = labels != dict(self.node.labels)
            if relabelled:
                self.node = replace(self.node, labels=tuple(sorted(labels.items())))
                self._outbox.put(agent_pb2.AgentMessage(node_update=node_to_proto(self.node)))
        if runtime is not None and runtime != had:
            self.echo(f"container runtime {runtime} works now: tasks with an image can run here")
        elif runtime is None and had is not None:
            self.echo(f"tasks with an image cannot run here any more: {why}")

    def _heartbeat(self, running: list[str]) -> agent_pb2.AgentMessage:
        beat = agent_pb2.Heartbeat(time=time.time(), usage=self._usage.sample(), running_task_ids=running)
        return agent_pb2.AgentMessage(heartbeat=beat)

    # -- the worker -----------------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._done.is_set():
            try:
                self._tick()
            except Exception:  # keep supervising the tasks whatever one tick hit
                log.exception("agent tick failed")
            self._done.wait(TICK_S)

    def _tick(self) -> None:
        now = time.monotonic()
        session = self._link.session
        beat: list[str] | None = None
        with self._lock:
            tasks = self._tasks
            assert tasks is not None
            tasks.poll()
            if session is not None:
                self._ship(tasks, now >= self._next_logs)
                if now >= self._next_logs:
                    self._next_logs = now + LOG_INTERVAL_S
                if now >= self._next_heartbeat and not self._stop.is_set():  # stopping: the node goes
                    self._next_heartbeat = now + self._heartbeat_s
                    beat = tasks.running_ids()
            self._release(tasks, now)
        if beat is not None:
            self._outbox.put(self._heartbeat(beat))

    def _ship(self, tasks: TaskTable, logs_due: bool) -> None:
        """New output of the tasks; an ended task's last output, then its final status."""
        for task_id, rec in list(tasks.records.items()):
            if rec.stale or (rec.final is None and not logs_due):
                continue
            if len(self._outbox) >= OUTBOX_HIGH:
                return
            for chunk in rec.logs.chunks(LOG_CHUNKS_PER_TICK):
                self._outbox.put(agent_pb2.AgentMessage(log=chunk))
                self._offsets_moved = True
            if rec.final is not None and rec.logs.at_end():
                # with the run's latest restart: the master's mark, should that restart's own
                # status have been lost (and kept so when the master is sent it again)
                final = carry_restart(rec, rec.final)
                self._outbox.put(agent_pb2.AgentMessage(task_status=final))
                tasks.finish(task_id)

    def _save(self, tasks: TaskTable, now: float) -> None:
        try:
            # The offsets of chunks still queued: the outbox is lost if the agent dies.
            self._state.save(tasks.snapshot(self._outbox.log_offsets()))
        except OSError as exc:
            log.warning("could not write the agent state %s: %s", self._state.path, exc)
        tasks.dirty = False
        self._offsets_moved = False
        self._last_save = now


def _kept_on_resume(
    msg: agent_pb2.AgentMessage, resume: Mapping[tuple[str, str], int], resent: set[str]
) -> bool:
    """Whether a message queued for an expected task still goes out as it is after a registration."""
    if msg.HasField("log"):
        return (msg.log.task_id, msg.log.stream) not in resume
    if msg.HasField("task_status"):
        return msg.task_status.task_id not in resent
    return True


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold a lock on the work dir: two agents on one state file would fight over the tasks."""
    handle: IO[str] = path.open("a")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise WorkDirBusy(f"another agent is using {path.parent}") from exc
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield
    finally:
        handle.close()


def _working_runtime(choice: str | None) -> tuple[str | None, str]:
    """(the container runtime to use, or None; and if None, why): AUTO looks on PATH, None is
    none configured, anything else is the program to probe."""
    if choice == AUTO:
        return find_runtime()
    if choice is None:
        return None, "none configured"
    why = probe_runtime(choice)
    return (None, why) if why else (choice, "")
