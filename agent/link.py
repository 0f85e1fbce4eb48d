"""The agent's connection to the master: Register, then one Connect stream, again and again.

Whenever the stream breaks or the master cannot be reached, the link registers anew with backoff
(0.2 s doubling to 5 s); tasks keep running meanwhile. Each registration starts a session: its
first message is a heartbeat, then whatever waits in the outbox, stamped with the session's ids.

A registration refused with UNAUTHENTICATED (a secured master, and no or the wrong agent token)
is said at once and again every AUTH_RESAY_S while the link keeps trying.

A registration refused with ALREADY_EXISTS means another live agent holds the node's name. A
link that never had a session gives up at once; one that had tries for NAME_TAKEN_GIVE_UP_S first
(the master may not have seen its own last stream end yet). Giving up ends run() and calls
`on_refused`: the agent stops rather than retry forever.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc

from gosched.agent.outbox import Outbox
from gosched.api.channel import ChannelSecurity, open_channel
from gosched.common.node import AGENT_MAX_BACKOFF_S
from gosched.proto.v1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger("gosched.agent")
BACKOFF_FIRST_S = 0.2
BACKOFF_MAX_S = AGENT_MAX_BACKOFF_S  # the master allows for it after a restart
STABLE_SESSION_S = 5.0  # a session that lasted this long starts the backoff over
REGISTER_TIMEOUT_S = 5.0
TAKE_WAIT_S = 0.2  # how often a stream's sender looks whether its session has closed
# How long a link that had a session keeps trying when told its name is taken: longer than the
# master waits (3 heartbeats) before it counts a silent stream as no longer holding the name.
NAME_TAKEN_GIVE_UP_S = 5.0
AUTH_RESAY_S = 60.0  # how often a link whose token the master refuses says so again
# Pings find a master that vanished without closing the connection. Servers refuse pings more
# often than every 5 minutes by default while they send nothing (GOAWAY "too_many_pings").
# Pings find a master that vanished without closing the connection within ~15 s; the master's
# server accepts pings this often (api/server.py SERVER_OPTIONS), gRPC's default would refuse them.
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


@dataclass(slots=True)
class Session:
    node_name: str
    session_id: str
    heartbeat_s: float
    closed: threading.Event = field(default_factory=threading.Event)
    call: grpc.Future | None = None  # the Connect call, once made
    half_closed: bool = False  # the agent ended its side, its outbox drained (the link closing)


class MasterLink:
    def __init__(
        self,
        master: str,
        register_request: Callable[[], agent_pb2.RegisterRequest],
        registered: Callable[[agent_pb2.RegisterResponse], agent_pb2.AgentMessage],
        on_message: Callable[[agent_pb2.SchedulerMessage], None],
        outbox: Outbox,
        echo: Callable[[str], None],
        on_refused: Callable[[str], None] | None = None,
        name_taken_give_up_s: float = NAME_TAKEN_GIVE_UP_S,
        security: ChannelSecurity | None = None,
    ) -> None:
        """`registered` reconciles after each registration and returns the session's first heartbeat;
        `on_refused` is told why when the link gives up because another agent holds the node;
        `security`: TLS and the agent token for a secured master (None: plaintext)."""
        self.master = master
        self.security = security
        self._register_request = register_request
        self._registered = registered
        self._on_message = on_message
        self.outbox = outbox
        self.echo = echo
        self._on_refused = on_refused
        self.name_taken_give_up_s = name_taken_give_up_s
        self.refused: str | None = None  # why the master refused this agent for good
        self._lock = threading.Lock()
        self._session: Session | None = None
        self._channel: grpc.Channel | None = None
        self._stop = threading.Event()
        self._draining = threading.Event()  # closing: end the request stream once the outbox is empty
        self.sessions_started = 0

    @property
    def session(self) -> Session | None:
        """The open session, if the stream is up."""
        with self._lock:
            return self._session

    def close(self, drain_s: float = 2.0) -> None:
        """Stop reconnecting and end the stream: the outbox is sent first, then the stream is
        half-closed so that the master ends it; cancelled if that takes longer than `drain_s`."""
        self._stop.set()
        self._draining.set()
        self.outbox.wake()
        deadline = time.monotonic() + drain_s
        while self.session is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._lock:
            session, channel = self._session, self._channel
        if session is not None:
            session.closed.set()
        if channel is not None:
            channel.close()  # also cancels a Register or Connect in flight
        self.outbox.wake()

    def run(self) -> None:
        backoff = BACKOFF_FIRST_S
        said: tuple[str, float] | None = None  # the last registration failure told, and when
        taken_since: float | None = None  # when the master first said the name is taken
        while not self._stop.is_set():
            channel = open_channel(self.master, self.security, CHANNEL_OPTIONS)
            with self._lock:
                self._channel = channel
            if self._stop.is_set():  # close() came before the channel was there to close
                channel.close()
                return
            try:
                stub = agent_pb2_grpc.AgentServiceStub(channel)
                try:
                    response = stub.Register(self._register_request(), timeout=REGISTER_TIMEOUT_S)
                except grpc.RpcError as exc:
                    if self._stop.is_set():
                        return
                    if isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.ALREADY_EXISTS:
                        taken_since = self._name_taken(exc, taken_since)
                        if taken_since is None:
                            return
                    else:
                        said = self._register_failed(exc, said)
                else:
                    said = None
                    taken_since = None
                    started = time.monotonic()
                    try:
                        why = self._stream(stub, response)
                    except Exception as exc:  # a bug here must not end the agent's link for good
                        log.exception("the session with the master failed")
                        why = f"internal error: {exc}"
                    if self._stop.is_set():
                        return
                    self.echo(f"lost the master ({why}); reconnecting")
                    if time.monotonic() - started >= STABLE_SESSION_S:
                        backoff = BACKOFF_FIRST_S
            finally:
                with self._lock:
                    self._channel = None
                channel.close()
            self._stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _register_failed(
        self, exc: grpc.RpcError, said: tuple[str, float] | None
    ) -> tuple[str, float] | None:
        """Tell why a registration failed, once per kind of failure; a refused token again every
        AUTH_RESAY_S, since the link goes on trying (the master's tokens may be rotated to it).
        Returns what was last told, and when."""
        now = time.monotonic()
        if isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            kind = "token"
            text = (
                f"the master at {self.master} refused this agent's token ({exc.details()}); "
                "check --token-file against the master's agent_token_file; retrying"
            )
        else:
            kind = "unreachable"
            text = f"cannot register with the master at {self.master}: {_why(exc)}; retrying"
        if said is not None and said[0] == kind and (kind != "token" or now - said[1] < AUTH_RESAY_S):
            return said
        self.echo(text)
        return kind, now

    def _name_taken(self, exc: grpc.Call, since: float | None) -> float | None:
        """Another agent holds the node's name: when the master first said so, or None once this
        link has given up."""
        now = time.monotonic()
        give_up_s = self.name_taken_give_up_s if self.sessions_started else 0.0
        if now - (now if since is None else since) >= give_up_s:
            self.refused = f"the master at {self.master} refused this agent: {exc.details()}"
            self._stop.set()
            if self._on_refused is not None:
                self._on_refused(self.refused)
            return None
        if since is None:
            self.echo(f"the master refused this agent ({exc.details()}); trying again for {give_up_s:g}s")
        return now if since is None else since

    def _stream(self, stub: agent_pb2_grpc.AgentServiceStub, response: agent_pb2.RegisterResponse) -> str:
        """Hold one session's stream until it breaks; returns why it ended."""
        first = self._registered(response)
        session = Session(response.node_name, response.session_id, response.heartbeat_interval_s)
        self.outbox.untrack()
        call = stub.Connect(self._requests(session, first))
        session.call = call
        with self._lock:
            self._session = session
        self.sessions_started += 1
        if self._stop.is_set():
            call.cancel()
        why = "the stream ended"
        try:
            for msg in call:
                self._on_message(msg)
            if session.half_closed:  # the master ends the stream once it has read all of it
                self.outbox.untrack()
        except grpc.RpcError as exc:
            why = _why(exc)
        finally:
            session.closed.set()
            call.cancel()  # the master sees the stream end now, not after our next registration
            with self._lock:
                self._session = None
            self.outbox.wake()
        return why

    def _requests(self, session: Session, first: agent_pb2.AgentMessage) -> Iterator[agent_pb2.AgentMessage]:
        yield _stamped(first, session)
        while not session.closed.is_set():
            msg = self.outbox.take(TAKE_WAIT_S)
            if msg is None:
                if self._draining.is_set():
                    session.half_closed = True
                    return  # half-close: the master ends the stream once it has read everything
                continue
            if session.closed.is_set() or (session.call is not None and session.call.done()):
                self.outbox.put_front(msg)  # for the next session: this stream would drop it
                return
            yield _stamped(msg, session)


def _stamped(msg: agent_pb2.AgentMessage, session: Session) -> agent_pb2.AgentMessage:
    msg.node_name = session.node_name
    msg.session_id = session.session_id
    return msg


def _why(exc: grpc.RpcError) -> str:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    name = code.name if code is not None else "error"
    return f"{name}: {details}" if details else name
