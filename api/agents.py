"""The master's side of the node agents: the AgentService they connect to, and the loop that keeps
each agent running exactly the tasks the binder has bound to its node.

Level-triggered, as a kubelet is: on every tick, for each connected agent, the tasks resident on
its node (the binder's truth) are compared with those already sent to it; the missing ones are
launched and the ones no longer resident (cancelled, preempted, lost) are killed. A resent launch
is harmless (the agent ignores a task it already runs), so a reconnect simply starts again from the
tasks the agent says it runs.

Agents report through the stream; their reports are queued and applied in batches by the tick,
which runs in the scheduling thread under the service lock:
* RUNNING -> the task is running; SUCCEEDED / FAILED -> it ended and frees its resources;
* RUNNING with restarts -> the agent restarted the task's process (a service's): the service keeps
  the count and the latest reason for the task's current attempt (`gosched get`, explain); every
  later status of the run (the next restart's, its end) carries the latest restart's count and
  where its process's output starts, so its log mark survives the restart's own status lost;
* FAILED with a message starting "lost:" -> the agent no longer has it: it goes back to the queue.
An agent silent for longer than `node_timeout_s` loses its node: the node becomes not ready and its
tasks are queued again (a gang that drops below its min_member is evicted whole). When the agent
comes back, it is told the tasks the master expects there (none of the requeued ones), and kills
the rest, so nothing runs twice. An agent that registers again while its session is known is
expected to run what that session was sent (a task bound meanwhile is launched), and the kills in
flight carry over, sent again on the new stream (the old one may have lost them): their runs' ends
(and last output) are the kills', never a new run's.

An agent that stops on purpose and kills its tasks (not one told to keep them for the next agent)
says so first: a node update with the state NOT_READY. Its node goes not ready at once, keeping
its residents, so nothing more is bound there while the agent's "lost" reports come; once that
agent ends its stream (half-closes it: read to its end, nothing lost in transport), those reports
applied, the node is lost as at a timeout (whatever is still resident there is requeued), not
`node_timeout_s` later; a stream that broke instead leaves the node not ready until the timeout.
It is ready again when an agent registers it (an operator's cordon or drain outlives it, as it
outlives a loss).

Nodes registered by an agent carry the label AGENT_LABEL; after a master restart those nodes are
given `node_timeout_s` plus the agents' longest registration backoff to reconnect before their
tasks are requeued.

Register refuses (ALREADY_EXISTS) a node name whose session is connected and was heard from within
LIVE_HEARTBEATS heartbeats: two agents on one name would both run its tasks. A node that
re-registers smaller or with a NoExecute taint gives up the residents it cannot hold (the control
plane's add_nodes); the tick kills them on the agent.
"""

import logging
import queue
import threading
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import grpc

from gosched.api import convert
from gosched.api.errors import ANSWERED_KEY
from gosched.api.logs import STREAMS, LogStore
from gosched.api.service import SchedulerService, TaskRestarts
from gosched.common.errors import SpecError
from gosched.common.job import JobKind, split_task_id
from gosched.common.node import AGENT_LABEL, AGENT_MAX_BACKOFF_S, OPERATOR_STATES, Node, NodeState
from gosched.common.snapshots import JobSnapshot
from gosched.common.states import TaskState
from gosched.proto.v1 import agent_pb2, agent_pb2_grpc
from gosched.proto.v1 import types_pb2 as pb
from gosched.runtime.control import ControlPlane

log = logging.getLogger(__name__)

LOST_PREFIX = "lost:"
KILL_GRACE_S = 10.0
KILL_ANSWER_S = 5.0  # beyond the grace period, how long a kill waits for the agent's answer
TICK_S = 0.05
# A session whose stream is up and that was heard from within this many heartbeats holds its node:
# another agent registering that name is refused. A stream cut without a word (a half-open
# connection) goes quiet, so the agent behind it gets its node back once these have passed.
LIVE_HEARTBEATS = 3
LOG_OWNERS_KEPT = 100_000  # tasks whose latest launch's node is remembered (the oldest go first)
LOG_LOCK_STRIPES = 64  # a power of two: a task's log lock is one of these, picked by its id
# The label with the host an agent discovered (agent/discovery.py): a task's peers reach it there.
HOST_LABEL = "gosched.io/hostname"
# Where a job's rendezvous port (MASTER_PORT) is drawn from, by a hash of its id: from torch's
# default up, below Linux's ephemeral ports (32768 on). A job that sets MASTER_PORT keeps its own.
RENDEZVOUS_PORTS = range(29500, 32500)
# A larger job's launches carry its leader's host alone, not every task's: each launch would carry
# the whole list (a gang's launches, its square), and an environment string is at most 128 KiB.
MAX_TASK_HOSTS = 4096


@dataclass(frozen=True, slots=True)
class _Kill:
    """A kill sent to an agent and not yet answered."""

    msg: agent_pb2.KillTask  # sent again to the agent's next session: the old stream may have lost it
    until: float  # when it expires unanswered (monotonic)


@dataclass
class AgentSession:
    node: str
    session_id: str
    last_seen: float
    outbox: "queue.Queue[agent_pb2.SchedulerMessage | None]" = field(default_factory=queue.Queue)
    # Tasks launched there and not yet ended, with the time the run's binding was made (None: a
    # run found there, whichever it is). A task evicted and bound to the node again within one
    # tick keeps its id: its new time says the run sent is not the one wanted.
    sent: dict[str, float | None] = field(default_factory=dict)
    # Tasks told to stop, until their end is reported (or the grace period and some are over): that
    # end belongs to the killed run, and a relaunch waits for it, so an old run never stands in for
    # a new placement of the same task.
    killing: dict[str, _Kill] = field(default_factory=dict)
    # What each run launched from this session holds (memory, GPU indexes), kept while it is
    # being stopped: the room of a run that has not ended yet is not free on the machine.
    uses: dict[str, tuple[int, frozenset[int]]] = field(default_factory=dict)
    connected: bool = False
    limits: str = ""
    grace_s: float = 0.0  # allowed on top of the node timeout (an agent expected back after a restart)
    leaving: bool = False  # the agent said it is stopping (a node update NOT_READY): its end is final


@dataclass(frozen=True, slots=True)
class _Restart:
    """A restart report: the agent restarted the task's process (a service's) in its run."""

    node: str
    task_id: str
    run: float | None  # when the run the agent was sent was bound (None: a run found there)
    count: int
    reason: str
    at: float


@dataclass
class _Reports:
    """What agents reported since the last tick, as (reporting node, task id)."""

    started: list[tuple[str, str]] = field(default_factory=list)
    restarts: list[_Restart] = field(default_factory=list)
    finished: dict[TaskState, list[tuple[str, str]]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # task id -> why it failed, where
    lost: list[tuple[str, str]] = field(default_factory=list)
    # Ended tasks leave their session's `sent` only once the end is applied (in the same tick as
    # the release), or a reconcile in between would see them resident and not sent: a relaunch.
    ended: list[tuple[AgentSession, str]] = field(default_factory=list)
    nodes: dict[str, Node] = field(default_factory=dict)  # the latest node update per agent's node
    # Agents that said they are stopping, then those whose stream ended after that (in the stream's
    # order, after their reports: a batch holds the reports read before it, and those come first).
    leaving: list[AgentSession] = field(default_factory=list)
    left: list[AgentSession] = field(default_factory=list)


class AgentGateway(agent_pb2_grpc.AgentServiceServicer):
    def __init__(
        self,
        service: SchedulerService,
        logs: LogStore,
        *,
        heartbeat_interval_s: float = 1.0,
        node_timeout_s: float = 10.0,
        kill_grace_s: float = KILL_GRACE_S,
    ) -> None:
        self.service = service
        self.logs = logs
        self.heartbeat_interval_s = heartbeat_interval_s
        self.node_timeout_s = node_timeout_s
        self.kill_grace_s = kill_grace_s
        self._lock = threading.Lock()  # guards sessions and reports (the gRPC threads write them)
        self.sessions: dict[str, AgentSession] = {}
        self._reports = _Reports()
        self._last_tick = 0.0
        self._adopted = False
        self._operator_state: dict[str, NodeState] = {}  # cordons of nodes lost meanwhile
        # The node of each task's latest launch: only its output goes into the task's log, not the
        # last words of an older run being stopped elsewhere (a run's owner changes only at a
        # launch, so a cancelled task's last words still arrive).
        self._log_owner: OrderedDict[str, str] = OrderedDict()
        self._owners_lock = threading.Lock()  # guards _log_owner itself (held for one step on it)
        # A chunk's owner check and write are one step against a launch's reset of that task's
        # log: a lock per task id stripe, so that chunks of other tasks are written meanwhile.
        self._log_locks = tuple(threading.Lock() for _ in range(LOG_LOCK_STRIPES))
        service.tick_hooks.append(self.tick)

    def _log_lock(self, task_id: str) -> threading.Lock:
        """The lock of the task's log: one stripe of LOG_LOCK_STRIPES, by the task's id."""
        return self._log_locks[hash(task_id) & (LOG_LOCK_STRIPES - 1)]

    @property
    def _live_s(self) -> float:
        return LIVE_HEARTBEATS * self.heartbeat_interval_s

    def agent_info(self, node: str) -> tuple[float, bool, str]:
        """(seconds since the node's agent was heard from, -1 if none; stream up; its limits)."""
        with self._lock:
            s = self.sessions.get(node)
            if s is None:
                return -1.0, False, ""
            return time.monotonic() - s.last_seen, s.connected, s.limits

    def uncordoned_state(self, node: Node) -> NodeState:
        """The state an uncordon leaves `node` in: ready, unless it is an agent's node whose agent
        is gone (lost while cordoned, or since): then not ready until the agent registers again,
        as kubectl uncordon leaves a NotReady node NotReady. Ready would never time out again, as
        no session is left to miss heartbeats, and tasks would be bound there for good."""
        if not dict(node.labels).get(AGENT_LABEL):
            return NodeState.READY  # simulated: no agent to wait for
        with self._lock:
            self._operator_state.pop(node.name, None)  # the cordon is lifted: not restored later
            s = self.sessions.get(node.name)
            return NodeState.READY if s is not None and not s.leaving else NodeState.NOT_READY

    def connected(self, node: str) -> bool:
        """An agent's stream for this node is up: the node is in use, not gone."""
        with self._lock:
            s = self.sessions.get(node)
            return s is not None and s.connected

    def stopping(self, task_id: str) -> bool:
        """A run of the task is being killed on some node (its last output may still come)."""
        with self._lock:
            return any(task_id in s.killing for s in self.sessions.values())

    def forget(self, node: str) -> None:
        """The node was deleted: no session to time out, no cordon to give back if an agent comes
        back under its name (it registers as a new node)."""
        with self._lock:
            self.sessions.pop(node, None)
            self._operator_state.pop(node, None)

    # -- gRPC ----------------------------------------------------------------------------------------
    def Register(self, request: agent_pb2.RegisterRequest, context: grpc.ServicerContext) -> Any:
        try:
            node = convert.node_from_proto(request.node)
        except (SpecError, ValueError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"node: {exc}")
        why = self.service.not_ready_reason
        if why is not None:
            context.set_trailing_metadata(((ANSWERED_KEY, "1"),))  # the master answers: retry
            context.abort(grpc.StatusCode.UNAVAILABLE, why)
        node = _as_agent_node(node)
        with self.service._changed:  # the tick (liveness) cannot run in between: same lock
            with self._lock:
                holder = self.sessions.get(node.name)
                quiet_s = time.monotonic() - holder.last_seen if holder is not None else 0.0
                held = holder is not None and holder.connected and quiet_s <= self._live_s
            if held:
                # Two agents on one name would both run its tasks and keep knocking each other
                # off. The agent itself, back after its stream ended, finds the session closed.
                context.abort(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"node {node.name} is held by another agent (connected, heard from "
                    f"{quiet_s:.1f}s ago): stop it, or give this agent another --name",
                )
            control = self.service.control
            known = control.nodes([node.name])
            state = known[0].node.state if known else NodeState.READY
            with self._lock:
                state = self._operator_state.pop(node.name, state)
            # An operator's cordon or drain outlives the agent (and a node loss in between).
            node = replace(node, state=state if state in OPERATOR_STATES else NodeState.READY)
            control.add_nodes([node])
            resident = control.resident_runs([node.name])[node.name]
            session = AgentSession(node.name, uuid.uuid4().hex, time.monotonic(), limits=request.limits)
            with self._lock:
                old = self.sessions.get(node.name)
                if old is None:  # a new node, or one lost meanwhile (nothing resident then)
                    session.sent = dict(resident)
                else:
                    # Only the runs the agent was sent (the runs it has): a task bound while its
                    # stream was down is launched by the reconcile, not answered "lost" by the
                    # agent. A session adopted after a master restart was "sent" every task.
                    session.sent = {t: old.sent[t] for t in resident if t in old.sent}
                    # Runs being stopped stay so: their ends are the kills', and the room they
                    # hold is not free until then (a relaunch waits for them). The runs carried
                    # over keep what they hold too: one killed later holds it until its end.
                    session.uses = {t: old.uses[t] for t in (*session.sent, *old.killing) if t in old.uses}
                    # Each kill is sent again on the new stream (the old one may have died with it
                    # unsent; the agent ignores a kill it already carries out), its answer due anew.
                    now = time.monotonic()
                    for tid, kill in old.killing.items():
                        until = now + kill.msg.grace_period_s + KILL_ANSWER_S
                        session.killing[tid] = _Kill(kill.msg, until)
                        session.outbox.put(agent_pb2.SchedulerMessage(kill=kill.msg))
                self.sessions[node.name] = session
                self._reports.nodes.pop(node.name, None)  # older than the node just registered
                # The agent keeps the runs being stopped, so their ends (and last output) come.
                expected = sorted({*session.sent, *session.killing})
            self.service.touch()
        if old is not None:
            old.outbox.put(None)  # ends the old stream
        log.info("agent %s registered (%d expected task(s))", node.name, len(expected))
        return agent_pb2.RegisterResponse(
            node_name=node.name,
            session_id=session.session_id,
            heartbeat_interval_s=self.heartbeat_interval_s,
            expected_task_ids=expected,
            log_resume=self._log_resume(node.name, expected),
        )

    def _log_resume(self, node: str, expected: list[str]) -> list[agent_pb2.LogOffset]:
        """Where each expected task's output stops here. A stream delivers in order, so what a
        broken one lost is the tail: the agent ships again from these offsets. Read now, the old
        stream's last chunks may still be written after: those come again, at the same offsets."""
        with self._owners_lock:  # a log another node's run owns does not take this node's output
            mine = [tid for tid in expected if self._log_owner.get(tid, node) == node]
        return [
            agent_pb2.LogOffset(task_id=tid, stream=stream, offset=self.logs.size(tid, stream))
            for tid in mine
            for stream in STREAMS
        ]

    def Connect(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            first = next(request_iterator)
        except StopIteration:
            return
        with self._lock:
            session = self.sessions.get(first.node_name)
        if session is None or session.session_id != first.session_id:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "unknown or replaced session: register again")
        assert session is not None
        session.connected = True
        self._receive(session, first)
        reader = threading.Thread(
            target=self._read, args=(session, request_iterator), name=f"agent-{session.node}", daemon=True
        )
        reader.start()
        try:
            while context.is_active():
                try:
                    msg = session.outbox.get(timeout=0.5)
                except queue.Empty:
                    continue
                if msg is None:
                    break
                yield msg
        finally:  # also when gRPC closes the generator: a stream that ended no longer holds the node
            session.connected = False

    def _read(self, session: AgentSession, messages: Iterator[Any]) -> None:
        clean = False  # the agent ended the stream itself (half-closed), after its last word
        try:
            for msg in messages:
                if msg.session_id != session.session_id:
                    break
                self._receive(session, msg)
            else:
                clean = True
        except grpc.RpcError:
            pass  # the stream broke: the agent reconnects, or its node times out
        finally:
            session.outbox.put(None)
        # A stopping agent's stream that ended cleanly was read to its end: everything it said
        # arrived, and the tick applies it before giving the node up. One that broke may have
        # lost reports in transport: its node (not ready) waits for a timeout or a new agent,
        # which sends again the ends the master may not have.
        if clean and session.leaving:
            with self._lock:
                if self.sessions.get(session.node) is session:
                    self._reports.left.append(session)
            self.service._wake.set()

    def _receive(self, session: AgentSession, msg: Any) -> None:
        session.last_seen = time.monotonic()
        body = msg.WhichOneof("body")
        if body == "task_status":
            self._on_status(session, msg.task_status)
        elif body == "node_update":
            self._on_node_update(session, msg.node_update)
        elif body == "log":
            chunk = msg.log
            with self._log_lock(chunk.task_id):  # not across a launch's reset of the task's log
                with self._owners_lock:
                    owner = self._log_owner.get(chunk.task_id, session.node)
                if owner != session.node:
                    return  # an older run's, on another node: the task's log is its new run's now
                try:
                    self.logs.write(chunk.task_id, chunk.stream or "stdout", chunk.offset, chunk.data)
                except ValueError as exc:
                    log.warning("agent %s sent a bad log chunk: %s", session.node, exc)

    def _on_node_update(self, session: AgentSession, update: Any) -> None:
        try:
            node = convert.node_from_proto(update)
        except (SpecError, ValueError) as exc:
            log.warning("agent %s sent a bad node update: %s", session.node, exc)
            return
        with self._lock:  # the name is the session's: an agent speaks for its own node only
            if self.sessions.get(session.node) is session:  # not a replaced session's late word
                if node.state is NodeState.NOT_READY:  # its agent is stopping (see the docstring)
                    if not session.leaving:
                        session.leaving = True
                        self._reports.leaving.append(session)
                else:
                    self._reports.nodes[session.node] = node
        self.service._wake.set()

    def _on_status(self, session: AgentSession, status: Any) -> None:
        state = convert.task_state_from_proto(status.state)
        tid, node = status.task_id, session.node
        restarted = False
        with self._lock:
            r = self._reports
            if state is TaskState.RUNNING:
                if tid not in session.killing:
                    r.started.append((node, tid))
                    if status.restarts > 0 and tid in session.sent:
                        why = status.message or f"exit code {status.exit_code}"
                        run, at = session.sent[tid], status.last_exit_time
                        r.restarts.append(_Restart(node, tid, run, status.restarts, why, at))
                        restarted = True
            elif state in (TaskState.SUCCEEDED, TaskState.FAILED):
                session.uses.pop(tid, None)
                stopped = session.killing.pop(tid, None) is not None
                # An end carries the run's latest restart, should the restart's own status have
                # been lost: the run sent here, or the one we stopped, unless the task was sent
                # here anew since (the log is that new run's then).
                restarted = status.restarts > 0 and (tid in session.sent) != stopped
                if not stopped:  # (one we stopped the binder released already)
                    r.ended.append((session, tid))
                    if state is TaskState.FAILED and status.message.startswith(LOST_PREFIX):
                        r.lost.append((node, tid))
                    else:
                        r.finished.setdefault(state, []).append((node, tid))
                        if state is TaskState.FAILED:
                            why = status.message or f"exit code {status.exit_code}"
                            r.failures[tid] = f"{why} (on {node})"
        if restarted:  # in the stream's order: the chunks before are the process before's
            self._mark_restart(session, status)
        self.service._wake.set()

    def _mark_restart(self, session: AgentSession, status: Any) -> None:
        tid = status.task_id
        with self._log_lock(tid):
            with self._owners_lock:
                owner = self._log_owner.get(tid, session.node)
            if owner == session.node:  # as a chunk's: an older run's, elsewhere, changes nothing
                starts = {"stdout": status.stdout_start, "stderr": status.stderr_start}
                before = {"stdout": status.previous_stdout_start, "stderr": status.previous_stderr_start}
                self.logs.mark_restart(tid, status.restarts, starts, before)

    # -- the tick (scheduling thread, service lock held) -------------------------------------------------
    def tick(self, control: ControlPlane) -> bool:
        now = time.monotonic()
        with self._lock:
            reports, self._reports = self._reports, _Reports()
        changed = self._apply(control, reports)
        if now - self._last_tick < TICK_S:
            return changed
        self._last_tick = now
        if not self._adopted:
            self._adopt_known_nodes(control, now)
        changed = self._check_liveness(control, now) or changed
        self._reconcile(control)
        return changed

    def _apply(self, control: ControlPlane, r: _Reports) -> bool:
        """Apply the reports about tasks still placed on the node that reported them; a report
        about a task placed elsewhere by now (or not at all) is about an older run: dropped."""
        relabelled = self._update_nodes(control, r.nodes)
        leaving = self._agents_leaving(control, r.leaving)
        reported = [*r.started, *r.lost, *(x for xs in r.finished.values() for x in xs)]
        if not reported:
            return self._agents_left(control, r.left) or leaving or relabelled
        placed = control.residents(sorted({node for node, _ in reported}))

        def here(items: list[tuple[str, str]]) -> list[str]:
            return [tid for node, tid in items if tid in placed.get(node, ())]

        started, lost = here(r.started), here(r.lost)
        if started:
            control.started(started)
        if r.restarts:
            self._note_restarts(control, r.restarts)
        for state, items in r.finished.items():
            tids = here(items)
            if tids:
                reasons = {t: r.failures[t] for t in tids if t in r.failures}
                control.finished(tids, state, reasons or None)
        if lost:
            control.lost(lost)
        with self._lock:
            for session, tid in r.ended:
                session.sent.pop(tid, None)
        self._agents_left(control, r.left)  # after their reports: a lost task is requeued as lost
        return True

    def _agents_leaving(self, control: ControlPlane, sessions: list[AgentSession]) -> bool:
        """Agents that said they are stopping: their nodes go not ready now, their residents
        staying until the agents' reports come (nothing is bound there meanwhile). A cordon or a
        drain is kept to give back when an agent registers the node again."""
        for s in sessions:
            with self._lock:
                if self.sessions.get(s.node) is not s:
                    continue
            before = control.nodes([s.node])
            if not before:
                continue
            if before[0].node.state in OPERATOR_STATES:
                with self._lock:
                    self._operator_state[s.node] = before[0].node.state
            control.set_node_state(s.node, NodeState.NOT_READY)
            log.info("agent %s is stopping: node not ready", s.node)
        return bool(sessions)

    def _agents_left(self, control: ControlPlane, sessions: list[AgentSession]) -> bool:
        """Agents whose stream ended after they said they were stopping: their nodes are lost now,
        as at a timeout, and what is still resident there (a task bound before the node went not
        ready, whose launch the stopping agent ignored) is requeued."""
        gone = []
        with self._lock:
            for s in sessions:
                if self.sessions.get(s.node) is s:  # not registered again meanwhile
                    del self.sessions[s.node]
                    gone.append(s)
        for s in gone:
            try:
                released = control.node_lost(s.node)
            except KeyError:  # deleted meanwhile
                continue
            log.info("agent %s stopped: node not ready, %d task(s) requeued", s.node, len(released))
        return bool(gone)

    def _note_restarts(self, control: ControlPlane, restarts: list[_Restart]) -> None:
        """Hand the service the restart reports of the runs still bound where they were sent: one
        of a run evicted and bound to the node again meanwhile (not yet killed) would otherwise be
        counted against the new attempt. Each report is noted with the task's attempt."""
        runs = control.resident_runs(sorted({x.node for x in restarts}))
        latest = {
            x.task_id: x
            for x in restarts
            if x.task_id in runs.get(x.node, {}) and x.run in (None, runs[x.node][x.task_id])
        }
        if not latest:
            return
        attempts = control.task_attempts(sorted(latest))
        self.service.note_restarts(
            {
                tid: TaskRestarts(attempts.get(tid, 0), x.count, x.reason, x.at, x.node)
                for tid, x in latest.items()
            }
        )

    @staticmethod
    def _update_nodes(control: ControlPlane, updates: dict[str, Node]) -> bool:
        """Nodes whose agents see their labels changed (a container runtime started or stopped).
        Only the labels are taken: capacity comes with a registration, and the state (a cordon, a
        drain, a loss) is not the agent's to lift."""
        if not updates:
            return False
        known = {snap.node.name: snap.node for snap in control.nodes(sorted(updates))}
        relabelled = [
            _as_agent_node(replace(known[name], labels=node.labels))
            for name, node in updates.items()
            if name in known
        ]
        changed = [node for node in relabelled if node != known[node.name]]
        if changed:
            control.add_nodes(changed)
        return bool(changed)

    def _adopt_known_nodes(self, control: ControlPlane, now: float) -> None:
        """After a restart: nodes of agents that have not reconnected yet get the node timeout to do
        so, plus the longest an agent waits between two tries at registering (it backed off while
        the master was down): a node is not lost for having been retried a moment too late."""
        self._adopted = True
        for snap in control.nodes():
            if dict(snap.node.labels).get(AGENT_LABEL) and snap.node.state != NodeState.NOT_READY:
                with self._lock:
                    if snap.node.name not in self.sessions:
                        self.sessions[snap.node.name] = AgentSession(
                            snap.node.name,
                            "",
                            now,
                            sent=dict.fromkeys(snap.task_ids),
                            grace_s=AGENT_MAX_BACKOFF_S,
                        )

    def _check_liveness(self, control: ControlPlane, now: float) -> bool:
        with self._lock:
            dead = [s for s in self.sessions.values() if now - s.last_seen > self.node_timeout_s + s.grace_s]
            for s in dead:
                del self.sessions[s.node]
        for s in dead:
            s.outbox.put(None)
            before = control.nodes([s.node])
            if before and before[0].node.state in OPERATOR_STATES:
                with self._lock:
                    self._operator_state[s.node] = before[0].node.state
            try:
                released = control.node_lost(s.node)
            except KeyError:
                continue
            log.warning(
                "node %s missed heartbeats for %.1fs: not ready, %d task(s) requeued",
                s.node,
                now - s.last_seen,
                len(released),
            )
        return bool(dead)

    def _reconcile(self, control: ControlPlane) -> None:
        with self._lock:
            live = [s for s in self.sessions.values() if s.connected]
        if not live:
            return
        runs = control.resident_runs([s.node for s in live])
        launches: dict[str, list[str]] = {}
        kills: dict[str, list[str]] = {}
        now = time.monotonic()
        for s in live:
            with self._lock:  # a kill never answered (the task had already gone) expires
                for tid in [tid for tid, kill in s.killing.items() if kill.until < now]:
                    del s.killing[tid]
                    s.uses.pop(tid, None)
                killing = set(s.killing)
            want = runs.get(s.node, {})
            with self._lock:
                for tid, started in s.sent.items():
                    if started is None and tid in want:
                        s.sent[tid] = want[tid]  # the run found there is the one bound now
                sent = dict(s.sent)
            new = sorted(t for t in want if t not in sent and t not in killing)
            # Not resident any more, or resident as another run (evicted and bound here again):
            # the run sent is stopped; the new one is launched once its end is in.
            gone = sorted(t for t, started in sent.items() if want.get(t, -1.0) != started)
            if new:
                launches[s.node] = new
            if gone:
                kills[s.node] = gone
        if not launches and not kills:
            return
        touched = (*launches.values(), *kills.values())
        job_ids = sorted({split_task_id(t)[0] for tids in touched for t in tids})
        snaps = {j: snap for j, snap in zip(job_ids, control.jobs(job_ids, placements=True), strict=True)}
        by_node = {s.node: s for s in live}
        attempts = control.task_attempts([t for tids in launches.values() for t in tids]) if launches else {}
        # Kills first: a launch onto the room of a run being stopped waits for that run's end.
        for node, tids in kills.items():
            s = by_node[node]
            for tid in tids:
                reason = _kill_reason(tid, snaps.get(split_task_id(tid)[0]))
                kill = agent_pb2.KillTask(task_id=tid, grace_period_s=self.kill_grace_s, reason=reason)
                with self._lock:
                    s.sent.pop(tid, None)
                    s.killing[tid] = _Kill(kill, now + self.kill_grace_s + KILL_ANSWER_S)
                s.outbox.put(agent_pb2.SchedulerMessage(kill=kill))
        hosts = _task_hosts(control, {split_task_id(t)[0] for tids in launches.values() for t in tids}, snaps)
        for node, tids in launches.items():
            s = by_node[node]
            msgs = [
                m
                for m in (_launch(t, snaps.get(split_task_id(t)[0]), attempts.get(t, 0), hosts) for t in tids)
                if m
            ]
            for msg in self._not_on_dying_room(control, s, msgs):
                tid = msg.task_id
                with self._log_lock(tid):
                    with self._owners_lock:
                        self._log_owner[tid] = node
                        self._log_owner.move_to_end(tid)
                        if len(self._log_owner) > LOG_OWNERS_KEPT:
                            self._log_owner.popitem(last=False)
                    self.logs.reset(tid)  # a new run: its output replaces the last run's
                with self._lock:
                    s.sent[tid] = runs[node][tid]
                    s.uses[tid] = (msg.memory, frozenset(g.index for g in msg.gpus))
                s.outbox.put(agent_pb2.SchedulerMessage(launch=msg))

    def _not_on_dying_room(
        self, control: ControlPlane, s: AgentSession, msgs: list[agent_pb2.LaunchTask]
    ) -> list[agent_pb2.LaunchTask]:
        """The launches that may start now. The binder hands a victim's room over when it evicts it,
        but the victim runs on through its grace period: a launch waits for the ends of the runs being
        stopped on its node when it would share a GPU with one of them, or when the machine's memory
        would not hold them all (as Kubernetes starts a preemptor only once its victims are gone)."""
        with self._lock:
            dying = [s.uses[t] for t in s.killing if t in s.uses]
        if not dying or not msgs:
            return msgs
        dying_gpus = frozenset().union(*(gpus for _, gpus in dying))
        (snap,) = control.nodes([s.node]) or (None,)
        over_memory = snap is not None and snap.memory_used + sum(m for m, _ in dying) > snap.node.memory
        if over_memory:
            return []
        return [m for m in msgs if dying_gpus.isdisjoint(g.index for g in m.gpus)]


def _task_hosts(
    control: ControlPlane, job_ids: set[str], snaps: dict[str, JobSnapshot | None]
) -> dict[str, list[str]]:
    """Each job's task hosts, by task index, for its launches (LaunchTask.task_hosts): the address
    of the node each task is placed on ("" for a task not placed now), which is the host its agent
    registered (HOST_LABEL: discovered, or the operator's --labels), else the node's name. A job
    of more than MAX_TASK_HOSTS tasks gets task 0's alone (its leader)."""
    jobs = [snap for j in sorted(job_ids) if (snap := snaps.get(j)) is not None]
    names = sorted({node for snap in jobs for node, _ in snap.placements.values()})
    address = dict.fromkeys(names, "")
    for ns in control.nodes(names) if names else ():
        address[ns.node.name] = dict(ns.node.labels).get(HOST_LABEL, "")
    hosts = {}
    for snap in jobs:
        where = {i: address[node] or node for i, (node, _) in snap.placements.items()}
        count = snap.job.total_replicas if snap.job.total_replicas <= MAX_TASK_HOSTS else 1
        hosts[snap.job.id] = [where.get(i, "") for i in range(count)]
    return hosts


def _leader_port(job_id: str) -> int:
    """The job's rendezvous port (MASTER_PORT): the same for every launch of the job, by any master
    (a stable hash, not Python's salted one), so a task bound again meets its running peers."""
    return RENDEZVOUS_PORTS[zlib.crc32(job_id.encode()) % len(RENDEZVOUS_PORTS)]


def _launch(
    tid: str, snap: JobSnapshot | None, attempt: int, hosts: dict[str, list[str]]
) -> agent_pb2.LaunchTask | None:
    if snap is None:
        return None
    job_id, index = split_task_id(tid)
    placed = snap.placements.get(index)
    if placed is None:
        return None
    group = snap.job.group_of(index)
    res = group.resources
    # The gang's rendezvous (agent/rendezvous.py): a gang is bound all together, so its tasks'
    # placements are all in the snapshot; a task bound again later sees its peers' current nodes.
    role_index = index - sum(g.replicas for g in snap.job.groups[: snap.job.group_index_of(index)])
    return agent_pb2.LaunchTask(
        task_id=tid,
        job_id=job_id,
        index=index,
        role=group.role,
        command=list(group.command),
        env=dict(group.env),
        cpu_milli=res.cpu_milli,
        memory=res.memory,
        gpus=[pb.GpuAssignment(index=i, milli=m) for i, m in placed[1]],
        attempt=attempt,
        service=snap.job.kind is JobKind.SERVICE,
        image=group.image,
        time_limit_s=snap.job.time_limit or 0.0,
        num_tasks=snap.job.total_replicas,
        role_index=role_index,
        role_replicas=group.replicas,
        task_hosts=hosts.get(job_id, ()),
        leader_port=_leader_port(job_id),
    )


def _kill_reason(tid: str, snap: JobSnapshot | None) -> str:
    if snap is None:
        return "released"
    state = snap.task_states[split_task_id(tid)[1]]
    if state is TaskState.CANCELLED:
        return "cancelled"
    if state in (TaskState.PREEMPTED, TaskState.PENDING, TaskState.SCHEDULED):
        return "preempted"
    return "released"


def _as_agent_node(node: Node) -> Node:
    """The node as the master keeps it for an agent: marked with AGENT_LABEL."""
    labels = {**dict(node.labels), AGENT_LABEL: "true"}
    return replace(node, labels=tuple(sorted(labels.items())))
