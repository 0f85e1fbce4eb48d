"""The tasks this agent runs: launches, kills, exits, service restarts, and the tasks adopted from
a previous agent process. An adopted task is not this process's child: how it ended is what its
shim recorded in its exit file (agent/shim.py), read once its process is gone, and unknown only
if the shim did not get to write it (killed with the task, or the machine restarted).

Not thread-safe: the runner calls it under its lock. RUNNING statuses go out at once through
`report`; a task's final status waits in its record (`final`) until the runner has shipped the
task's last log bytes, and `finish` then forgets the task.
"""

import logging
import signal
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, cast

from google.protobuf.message import DecodeError

from gosched.agent.adopted import AdoptedProcess, create_time, same_process_alive
from gosched.agent.cgroups import TaskCgroup
from gosched.agent.containers import NO_RUNTIME, Container, container_name
from gosched.agent.executor import ShellExecutor, TaskExit, TaskSpec
from gosched.agent.logship import TaskLogs
from gosched.agent.rendezvous import gang_env
from gosched.agent.shim import read_status
from gosched.agent.state import SavedFinal, SavedState, SavedTask
from gosched.common.spec import format_duration
from gosched.proto.v1 import agent_pb2, types_pb2

log = logging.getLogger("gosched.agent")

if TYPE_CHECKING:
    State: TypeAlias = types_pb2.TaskState  # how the generated stubs type an enum value
else:
    State = int

RUNNING = types_pb2.TASK_STATE_RUNNING
SUCCEEDED = types_pb2.TASK_STATE_SUCCEEDED
FAILED = types_pb2.TASK_STATE_FAILED
NO_EXIT_CODE = -1  # the task never ran, or its exit code cannot be known
LOST_HERE = "lost: not running on this node"
LOST_RESTART = "lost: agent restarted"
EXIT_UNKNOWN = "exit code unknown (agent restarted)"
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
STABLE_RUN_S = 60.0  # a service that ran this long before it exited starts its backoff over
STALE_GRACE_S = 5.0  # the master may already run a stale task elsewhere: do not wait long
TIME_LIMIT_GRACE_S = 10.0  # SIGTERM to SIGKILL for a task past its time limit (Slurm's KillWait)
FINISHED_KEPT = 1024  # final statuses (and log files) kept, to resend if the master did not get them


def task_status(task_id: str, state: State, exit_code: int = 0, message: str = "") -> agent_pb2.TaskStatus:
    return agent_pb2.TaskStatus(
        task_id=task_id,
        state=state,
        exit_code=exit_code,
        message=message,
        time=time.time(),
    )


def launch_env(msg: agent_pb2.LaunchTask) -> dict[str, str]:
    """What the task learns about itself and its job's other tasks (agent/rendezvous.py), under
    the task's own env (which wins)."""
    env = {
        "GOSCHED_JOB_ID": msg.job_id,
        "GOSCHED_TASK_INDEX": str(msg.index),
        "GOSCHED_TASK_ROLE": msg.role,
        "GOSCHED_ATTEMPT": str(msg.attempt),
        **gang_env(msg),
    }
    env.update(msg.env)
    return env


def gpu_indexes(msg: agent_pb2.LaunchTask) -> list[int]:
    """The GPUs the task may see: a share of a GPU still exposes the whole device."""
    return list(dict.fromkeys(g.index for g in msg.gpus))


def describe_exit(end: TaskExit, killed: str | None, container: bool) -> tuple[State, int, str]:
    """(state, exit code, message) of a task's process exit. A death by signal N is exit 128+N."""
    if end.reason == "failed_to_start":
        return FAILED, NO_EXIT_CODE, f"failed to start: {end.message}"
    code = end.exit_code
    exit_code = NO_EXIT_CODE if code is None else (128 - code if code < 0 else code)
    if end.reason == "oom_killed":
        return FAILED, exit_code, "OOM killed"
    if killed is not None:
        return FAILED, exit_code, killed
    if code == 0:
        return SUCCEEDED, 0, ""
    if code is not None and code < 0:
        return FAILED, exit_code, f"killed by signal {signal.Signals(-code).name}"
    if container and code == 125:
        return FAILED, exit_code, "exit code 125 (the container runtime could not run it)"
    return FAILED, exit_code, f"exit code {code}"


@dataclass(slots=True)
class TaskRecord:
    launch: agent_pb2.LaunchTask
    logs: TaskLogs
    container: Container | None = None
    pid: int = 0
    created: float = 0.0  # the process's creation time: with the pid, what identifies it
    cgroup: str = ""
    exit_file: str = ""  # where the task's shim records its exit code
    nonce: str = ""  # the mark in the environment of the run's processes (agent/proctrack.py)
    adopted: AdoptedProcess | None = None  # set when a previous agent process started it
    started_at: float = 0.0  # monotonic, of the current run
    restarts: int = 0  # of this run (this launch): each restart is reported to the master
    # Where the latest restart's process's output starts, and the process's before it (stdout,
    # stderr each): every later status of the run carries them again (carry_restart).
    starts: tuple[int, int] = (0, 0)
    previous_starts: tuple[int, int] = (0, 0)
    backoff_s: float = BACKOFF_FIRST_S
    restart_at: float | None = None  # a service whose process exited, waiting for its restart
    restart_why: str = ""
    restart_code: int = NO_EXIT_CODE  # how the process behind the coming restart ended
    restart_time: float = 0.0  # when (unix seconds)
    killed: str | None = None  # set when killed on purpose: the message of its final status
    stale: bool = False  # the master does not expect it: killed, never reported
    kill_deadline: float = 0.0  # when a kill's SIGKILL is due (unix seconds: saved for the next agent)
    ends_by: float = 0.0  # when the launch's time limit runs out (unix seconds, saved); 0: no limit
    final: agent_pb2.TaskStatus | None = None  # it ended; sent once its logs are shipped
    relaunch: agent_pb2.LaunchTask | None = None  # a launch that waits for the stale run to end
    # The waiting launch was killed before it started: the master waits for its end (this
    # message), reported once the stale run is gone.
    relaunch_killed: str | None = None

    @property
    def task_id(self) -> str:
        return self.launch.task_id

    @property
    def has_process(self) -> bool:
        return self.final is None and self.restart_at is None


class TaskTable:
    def __init__(
        self,
        executor: ShellExecutor,
        report: Callable[[agent_pb2.TaskStatus], None],
        container_runtime: str | None,
        echo: Callable[[str], None],
        no_runtime: str = NO_RUNTIME,
    ) -> None:
        self.executor = executor
        self.report = report
        self.container_runtime = container_runtime
        self.no_runtime = no_runtime  # why a task with an image fails here, if it does
        self.echo = echo
        self.records: dict[str, TaskRecord] = {}
        self.finished: OrderedDict[str, agent_pb2.TaskStatus] = OrderedDict()
        self.dirty = False  # the set of tasks changed since the state file was written

    # -- commands from the master --------------------------------------------------------------------
    def launch(self, msg: agent_pb2.LaunchTask) -> None:
        rec = self.records.get(msg.task_id)
        if rec is not None:
            if rec.stale:
                rec.relaunch, rec.relaunch_killed = msg, None  # started once the stale run is gone
                return
            if rec.final is None:
                return  # running (or a service about to restart): a resent launch
            del self.records[msg.task_id]  # ended, not yet reported: this launch supersedes it
        self.finished.pop(msg.task_id, None)
        self._start(msg)

    def kill(self, task_id: str, grace_s: float, reason: str, message: str | None = None) -> None:
        """SIGTERM, SIGKILL after the grace; the final status says `message` (default "killed: <reason>")."""
        rec = self.records.get(task_id)
        message = message or f"killed: {reason or 'no reason given'}"
        if rec is not None and rec.stale:
            # The kill is for the launch that waits for the stale run: it must never start (its
            # task may be cancelled), and its end, once the stale run is gone, ends the kill.
            if rec.relaunch is not None:
                rec.relaunch = None
                rec.relaunch_killed = message
            return
        if rec is None or rec.final is not None or rec.killed is not None:
            return  # not running, or already being killed
        if rec.restart_at is not None:
            rec.restart_at = None
            rec.final = task_status(task_id, FAILED, NO_EXIT_CODE, message)
            self._say_end(rec.final)
            self.dirty = True
            return
        rec.killed = message
        self._signal(rec, grace_s)

    def kill_all(self, message: str, grace_s: float) -> None:
        for rec in list(self.records.values()):
            rec.relaunch = None
            if not rec.stale:
                self.kill(rec.task_id, grace_s, "", message)

    # -- what happened -------------------------------------------------------------------------------
    def poll(self) -> None:
        """Notice exits (and escalate kills), restart services whose backoff has run out."""
        for end in self.executor.poll():
            rec = self.records.get(end.task_id)
            if rec is not None and rec.adopted is None:
                self._ended(rec, *describe_exit(end, rec.killed, rec.container is not None))
        now, wall = time.monotonic(), time.time()
        for rec in list(self.records.values()):
            if rec.ends_by and wall >= rec.ends_by and rec.final is None and rec.killed is None:
                self._time_out(rec)
            if rec.adopted is not None and rec.has_process and rec.adopted.ended():
                rec.adopted = None
                self._ended(rec, *self._adopted_exit(rec))
            elif rec.restart_at is not None and now >= rec.restart_at:
                self._restart(rec)

    def _time_out(self, rec: TaskRecord) -> None:
        """Stop a task past its time limit, as a kill whose final status says so (a service waiting
        for its restart fails at once: kill() sees to both)."""
        if rec.stale:
            return  # being stopped already, and its end is nobody's to report
        limit = format_duration(rec.launch.time_limit_s)
        self.kill(rec.task_id, TIME_LIMIT_GRACE_S, "", f"killed: time limit of {limit} reached")

    def finish(self, task_id: str) -> None:
        """The task's final status has been handed to the stream: forget it, but remember the status."""
        rec = self.records.pop(task_id, None)
        if rec is None or rec.final is None:
            return
        self._remember(rec.final)

    def _remember(self, final: agent_pb2.TaskStatus) -> None:
        """Keep a final status handed to the stream, to resend if the master did not get it."""
        self.finished[final.task_id] = final
        self.finished.move_to_end(final.task_id)
        while len(self.finished) > FINISHED_KEPT:
            old, _ = self.finished.popitem(last=False)
            for path in self.executor.log_paths(old):  # the master has them; keep the disk bounded
                path.unlink(missing_ok=True)
        self.dirty = True

    def running_ids(self) -> list[str]:
        return sorted(t for t, r in self.records.items() if r.final is None and not r.stale)

    def has_processes(self) -> bool:
        return any(r.has_process for r in self.records.values())

    def has_unreported(self) -> bool:
        return any(r.final is not None for r in self.records.values())

    # -- (re)registration ------------------------------------------------------------------------------
    def reconcile(
        self, expected: set[str], resume: Mapping[tuple[str, str], int] | None = None
    ) -> tuple[list[agent_pb2.TaskStatus], set[str]]:
        """Match what runs here with what the master expects: kill what it does not expect (without a
        report). `resume`: per (task, stream), how much of the output the master holds (what a
        broken stream lost is shipped again from there). Returns the statuses to send for expected
        tasks that do not run here, and the tasks whose final status, already handed to a stream,
        goes out again after their output's lost tail (the caller drops any queued copy)."""
        resume = resume or {}
        for task_id, rec in list(self.records.items()):
            if task_id in expected:
                if rec.stale:  # expected again while still dying: report its end after all
                    rec.stale = False
                    lost = "lost: killed while the master did not expect it"
                    rec.killed = rec.relaunch_killed or rec.killed or lost
                for stream in rec.logs.streams:
                    at = resume.get((task_id, stream.name))
                    if at is not None:
                        stream.offset = at
                        self.dirty = True
                continue
            if not rec.has_process:
                del self.records[task_id]  # nothing runs, and nobody waits for its status
                self.dirty = True
                continue
            # A launch sent before this registration is not wanted any more (nor its end).
            rec.relaunch = rec.relaunch_killed = None
            if not rec.stale:
                rec.stale = True
                self._signal(rec, STALE_GRACE_S)
                self.echo(f"killing {task_id}: the master does not expect it on this node")
        out: list[agent_pb2.TaskStatus] = []
        again: set[str] = set()
        for task_id in sorted(expected - self.records.keys()):
            previous = self.finished.get(task_id)  # it ended, but the master did not get the status
            if previous is not None and (task_id, "stdout") in resume:
                # Its record again, ended: the worker ships the output from where the master's
                # stops, then the status (as for any ended task), then forgets it again.
                del self.finished[task_id]
                paths = self.executor.log_paths(task_id)
                held = (resume[(task_id, "stdout")], resume.get((task_id, "stderr"), 0))
                logs = TaskLogs.of(task_id, *paths, held)
                ended = agent_pb2.LaunchTask(task_id=task_id)  # what it was launched with is gone
                self.records[task_id] = TaskRecord(ended, logs, final=previous)
                self.dirty = True
                again.add(task_id)
                continue
            if previous is None:
                previous = task_status(task_id, FAILED, NO_EXIT_CODE, LOST_HERE)
            out.append(previous)
        return out, again

    # -- state file ----------------------------------------------------------------------------------
    def snapshot(self, unsent: Mapping[tuple[str, str], int] | None = None) -> SavedState:
        """What the state file keeps. `unsent`: the lowest offset of each (task, stream)'s log
        chunks the master may not have (Outbox.log_offsets): the saved offsets go back to them, or
        the next agent would resume past bytes the master never got (a hole in its log)."""
        unsent = unsent or {}
        out = []
        for rec in self.records.values():
            final = rec.final
            out_at, err_at = (
                min(s.offset, unsent.get((rec.task_id, s.name), s.offset)) for s in rec.logs.streams
            )
            out.append(
                SavedTask(
                    task_id=rec.task_id,
                    launch=SavedTask.encode_launch(rec.launch),
                    pid=rec.pid if rec.has_process else 0,
                    create_time=rec.created,
                    stdout=str(rec.logs.stdout.path),
                    stderr=str(rec.logs.stderr.path),
                    stdout_offset=out_at,
                    stderr_offset=err_at,
                    container_runtime=rec.container.runtime if rec.container else "",
                    container_name=rec.container.name if rec.container else "",
                    cgroup=rec.cgroup,
                    exit_file=rec.exit_file,
                    nonce=rec.nonce,
                    final_state=final.state if final is not None else 0,
                    final_exit_code=final.exit_code if final is not None else 0,
                    final_message=final.message if final is not None else "",
                    restarts=rec.restarts,
                    backoff_s=rec.backoff_s,
                    restart_starts=[*rec.previous_starts, *rec.starts] if rec.restarts else [],
                    killed=rec.killed,
                    kill_deadline=rec.kill_deadline,
                    stale=rec.stale,
                    ends_by=rec.ends_by,
                )
            )
        finished = [
            SavedFinal(f.task_id, f.state, f.exit_code, f.message, f.time) for f in self.finished.values()
        ]
        return SavedState(out, finished)

    def adopt(self, state: SavedState) -> int:
        """Take over the tasks of a previous agent process: those still alive are watched again,
        the others are reported lost; and the final statuses it handed to the stream, to send again
        if the master expects them still. Returns how many were adopted alive."""
        for f in state.finished:
            self.finished[f.task_id] = agent_pb2.TaskStatus(
                task_id=f.task_id,
                state=cast(State, f.state),
                exit_code=f.exit_code,
                message=f.message,
                time=f.time,
            )
        alive = 0
        for s in state.tasks:
            try:
                msg = s.decode_launch()
            except (ValueError, DecodeError) as exc:
                log.warning("state of task %s is unreadable (%s): dropped", s.task_id, exc)
                continue
            logs = TaskLogs.of(s.task_id, Path(s.stdout), Path(s.stderr), (s.stdout_offset, s.stderr_offset))
            rec = TaskRecord(
                msg,
                logs,
                cgroup=s.cgroup,
                exit_file=s.exit_file,
                nonce=s.nonce,
                restarts=s.restarts,
                backoff_s=s.backoff_s or BACKOFF_FIRST_S,  # the next restart's wait goes on (0: older file)
                killed=s.killed,  # a kill's end is the kill's, never a service's crash to restart
                stale=s.stale,
                kill_deadline=s.kill_deadline,
                ends_by=s.ends_by,  # the limit runs on while no agent watched
            )
            if len(s.restart_starts) == 4:  # an older agent's file has none
                rec.previous_starts = (int(s.restart_starts[0]), int(s.restart_starts[1]))
                rec.starts = (int(s.restart_starts[2]), int(s.restart_starts[3]))
            if s.container_name:
                rec.container = Container(s.container_runtime, s.container_name)
            self.records[s.task_id] = rec
            if s.final_state:
                final_state = cast(State, s.final_state)
                rec.final = task_status(s.task_id, final_state, s.final_exit_code, s.final_message)
            elif same_process_alive(s.pid, s.create_time):
                rec.pid, rec.created = s.pid, s.create_time
                rec.adopted = AdoptedProcess(s.pid, s.create_time, s.nonce, s.cgroup, s.exit_file)
                rec.started_at = time.monotonic()
                if rec.kill_deadline:  # being killed: SIGKILL when the grace left runs out
                    rec.adopted.resume_kill(rec.kill_deadline - time.time())
                alive += 1
            elif s.pid and rec.exit_file and read_status(rec.exit_file) is not None:
                self._ended(rec, *self._adopted_exit(rec))  # it ended while no agent watched
            else:
                rec.final = task_status(s.task_id, FAILED, NO_EXIT_CODE, LOST_RESTART)
                self._clean_up(rec)
        self.dirty = True
        return alive

    # -- internals -----------------------------------------------------------------------------------
    def _start(self, msg: agent_pb2.LaunchTask) -> None:
        task_id = msg.task_id
        out, err = self.executor.log_paths(task_id)
        # A launch is a new run: its output starts the files afresh, as the master's copy does
        # (an earlier run's bytes would be shipped again from offset 0). A service's restarts
        # within the run append.
        for path in (out, err):
            path.unlink(missing_ok=True)
        rec = TaskRecord(msg, TaskLogs.of(task_id, out, err))
        if msg.time_limit_s > 0:  # counted from this launch: a service's restarts do not reset it
            rec.ends_by = time.time() + msg.time_limit_s
        self.records[task_id] = rec
        self.dirty = True
        why = self._spawn(rec)
        if why is not None:
            rec.final = task_status(task_id, FAILED, NO_EXIT_CODE, why)
            self.echo(f"{task_id} failed: {why}")
            return
        self.report(task_status(task_id, RUNNING))
        self.echo(f"{task_id} started (pid {rec.pid})")

    def _spawn(self, rec: TaskRecord) -> str | None:
        """Start the task's process; why not, if it cannot start."""
        msg, task_id = rec.launch, rec.task_id
        gpus, env = gpu_indexes(msg), launch_env(msg)
        if msg.image:
            if self.container_runtime is None:
                return self.no_runtime
            rec.container = Container(self.container_runtime, container_name(task_id))
            env["GOSCHED_TASK_ID"] = task_id
            argv = rec.container.run_argv(msg.image, list(msg.command), env, gpus, msg.cpu_milli, msg.memory)
            # The runtime enforces the limits, so the client process itself gets none.
            spec = TaskSpec(task_id, [rec.container.shell_command(argv)], gpus=gpus)
        else:
            spec = TaskSpec(
                task_id, list(msg.command), env=env, gpus=gpus, cpu_milli=msg.cpu_milli, memory=msg.memory
            )
        try:
            end = self.executor.start(spec)
        except Exception as exc:  # any launch failure is the task's FAILED status, never a lost launch
            return f"failed to start: {exc or type(exc).__name__}"
        if end is not None:
            return f"failed to start: {end.message}"
        rec.pid = self.executor.pid(task_id) or 0
        rec.created = create_time(rec.pid)
        cgroup = self.executor.cgroup_path(task_id)
        rec.cgroup = "" if cgroup is None else str(cgroup)
        rec.exit_file = str(self.executor.status_path(task_id))
        rec.nonce = self.executor.nonce(task_id)
        rec.adopted = None
        rec.started_at = time.monotonic()
        self.dirty = True
        return None

    def _signal(self, rec: TaskRecord, grace_s: float) -> None:
        rec.kill_deadline = time.time() + grace_s
        self.dirty = True  # the state file keeps the kill, for an agent restarted meanwhile
        if rec.adopted is not None:
            rec.adopted.kill(grace_s)
        else:
            self.executor.kill(rec.task_id, grace_s)

    def _adopted_exit(self, rec: TaskRecord) -> tuple[State, int, str]:
        """How a task that is not our child ended: as if we had waited for it, from the exit code
        its shim recorded; without one, only what the kill or the cgroup tells."""
        oom = bool(rec.cgroup) and TaskCgroup(Path(rec.cgroup)).oom_killed()
        code = read_status(rec.exit_file) if rec.exit_file else None
        if code is not None:
            reason = "oom_killed" if oom else "exited" if rec.killed is None else "killed"
            end = TaskExit(rec.task_id, code, reason, -code if code < 0 else None)
            return describe_exit(end, rec.killed, rec.container is not None)
        if rec.killed is not None:
            return FAILED, NO_EXIT_CODE, rec.killed
        if oom:
            return FAILED, NO_EXIT_CODE, "OOM killed"
        return FAILED, NO_EXIT_CODE, EXIT_UNKNOWN

    def _clean_up(self, rec: TaskRecord) -> None:
        """What an ended run leaves outside its process: a container (if its client was SIGKILLed),
        a cgroup, the exit file (read by now; the executor removes those of its own runs, and
        removing one twice is harmless)."""
        if rec.container is not None:
            rec.container.remove_soon()
        if rec.cgroup:
            TaskCgroup(Path(rec.cgroup)).remove()
        if rec.exit_file:
            Path(rec.exit_file).unlink(missing_ok=True)

    def _ended(self, rec: TaskRecord, state: State, exit_code: int, message: str) -> None:
        task_id = rec.task_id
        self._clean_up(rec)
        rec.pid = 0
        self.dirty = True
        if rec.stale:
            del self.records[task_id]
            self.echo(f"{task_id} stopped (not expected here)")
            if rec.relaunch is not None:
                self._start(rec.relaunch)
            elif rec.relaunch_killed is not None:  # the killed launch's end: its kill is over
                final = task_status(task_id, FAILED, NO_EXIT_CODE, rec.relaunch_killed)
                self._remember(final)
                self.report(final)
            return
        if rec.launch.service and rec.killed is None:
            # A service runs until stopped: its process is restarted whatever its exit code (as a
            # pod's with restartPolicy: Always), never after a kill (cancel, stop, time limit).
            self._schedule_restart(rec, message or f"exit code {exit_code}", exit_code)
            return
        rec.final = task_status(task_id, state, exit_code, message)
        self._say_end(rec.final)

    def _say_end(self, status: agent_pb2.TaskStatus) -> None:
        if status.state == SUCCEEDED:
            self.echo(f"{status.task_id} succeeded")
        elif status.message.startswith(("killed:", "lost:")):
            self.echo(f"{status.task_id} {status.message}")
        else:
            self.echo(f"{status.task_id} failed: {status.message}")

    def _schedule_restart(self, rec: TaskRecord, why: str, exit_code: int = NO_EXIT_CODE) -> None:
        now = time.monotonic()
        if now - rec.started_at >= STABLE_RUN_S:
            rec.backoff_s = BACKOFF_FIRST_S
        rec.restart_at = now + rec.backoff_s
        rec.restart_why = why
        rec.restart_code = exit_code
        rec.restart_time = time.time()
        self.echo(f"{rec.task_id} (service) {why}; restarting in {rec.backoff_s:g}s")
        rec.backoff_s = min(rec.backoff_s * 2, BACKOFF_MAX_S)
        self.dirty = True

    def _restart(self, rec: TaskRecord) -> None:
        rec.restart_at = None
        rec.restarts += 1
        rec.started_at = time.monotonic()
        out, err = (_size(stream.path) for stream in rec.logs.streams)  # the process before is over
        rec.previous_starts, rec.starts = rec.starts, (out, err)
        self.dirty = True
        why = self._spawn(rec)
        if why is not None:
            self._schedule_restart(rec, why)
            return
        # One status per restart: the master shows the count and the latest reason (`gosched get`).
        status = task_status(rec.task_id, RUNNING, rec.restart_code, rec.restart_why)
        status.last_exit_time = rec.restart_time
        self.report(carry_restart(rec, status))
        self.echo(f"{rec.task_id} restarted after {rec.restart_why} (restart {rec.restarts})")


def carry_restart(rec: TaskRecord, status: agent_pb2.TaskStatus) -> agent_pb2.TaskStatus:
    """`status` (of the run `rec`), carrying the run's latest restart and where its process's and
    the one before's output start: the master marks the restart from whichever status of the run
    comes first (the restart's own may be lost with a broken stream). A run never restarted: as is."""
    if rec.restarts > 0:
        status.restarts = rec.restarts
        status.stdout_start, status.stderr_start = rec.starts
        status.previous_stdout_start, status.previous_stderr_start = rec.previous_starts
    return status


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except (OSError, ValueError):  # none yet (the process wrote nothing)
        return 0
