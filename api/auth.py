"""Bearer tokens on the gRPC API: a server interceptor that lets a call through only if its
`authorization: Bearer <token>` metadata holds one of the tokens of the call's service.

    interceptor = token_interceptor(settings)   # None when no token file is set

The agent token (agent_token_file) guards the AgentService; the API token (api_token_file) guards
everything else (JobService, ClusterService, reflection, and any service added later) except
health, which stays open so that probes need no secret. A refused call ends UNAUTHENTICATED with
a message that says which token is missing or wrong, never what was sent.
"""

import hmac
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health

from gosched.common.config import Settings
from gosched.common.secret_files import read_tokens
from gosched.proto.v1 import agent_pb2

log = logging.getLogger(__name__)

AGENT_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name
OPEN_SERVICES = frozenset({health.SERVICE_NAME})


@dataclass(frozen=True, slots=True)
class Guard:
    """The tokens one group of services accepts; `name` ("API token") and `setting` (the file's
    setting) are what a refusal names."""

    name: str
    setting: str
    tokens: tuple[bytes, ...]

    def refusal(self, metadata: Sequence[tuple[str, Any]] | None) -> str | None:
        """Why a call with this metadata is refused, or None if it carries one of the tokens."""
        presented = _bearer(metadata)
        if presented is None:
            return f"missing {self.name}: send metadata 'authorization: Bearer <token>' ({self.setting})"
        # Every token compared, each in constant time: how soon it fails says nothing of the tokens.
        matched = False
        for token in self.tokens:
            matched |= hmac.compare_digest(presented, token)
        return None if matched else f"wrong {self.name}: it is not one of the master's ({self.setting})"


def _bearer(metadata: Sequence[tuple[str, Any]] | None) -> bytes | None:
    for key, value in metadata or ():
        if key != "authorization":
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip().encode()
    return None


class TokenAuth(grpc.ServerInterceptor):
    """Refuses calls without the token of their service (no guard for a group: open)."""

    def __init__(self, api: Guard | None, agent: Guard | None) -> None:
        self.api = api
        self.agent = agent

    def guard_of(self, method: str) -> Guard | None:
        """The guard of a full method name, "/gosched.v1.JobService/SubmitJob"."""
        service = method.lstrip("/").partition("/")[0]
        if service in OPEN_SERVICES:
            return None
        return self.agent if service == AGENT_SERVICE else self.api

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = str(getattr(handler_call_details, "method", ""))
        handler = continuation(handler_call_details)
        guard = self.guard_of(method)
        if guard is None or handler is None:
            return handler
        why = guard.refusal(getattr(handler_call_details, "invocation_metadata", None))
        return handler if why is None else _refusing(handler, method, why)


def _refusing(handler: grpc.RpcMethodHandler, method: str, why: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that ends the call UNAUTHENTICATED before reading it."""

    def refuse(request: Any, context: grpc.ServicerContext) -> Any:
        log.warning("refused %s from %s: %s", method, context.peer(), why)
        context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)


def token_interceptor(settings: Settings) -> TokenAuth | None:
    """The interceptor for the settings' token files, or None when neither is set. The files are
    read again here (they were checked at load): SecretFileError naming the setting if one went bad."""
    api = _guard("API token", "api_token_file", settings.api_token_file)
    agent = _guard("agent token", "agent_token_file", settings.agent_token_file)
    return None if api is None and agent is None else TokenAuth(api, agent)


def _guard(name: str, setting: str, path: str | None) -> Guard | None:
    if path is None:
        return None
    return Guard(name, setting, tuple(t.encode() for t in read_tokens(path, setting)))
