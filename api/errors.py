"""Errors the Client raises: one class per gRPC status it expects, each carrying code and message."""

from typing import Any

import grpc


class GoschedError(Exception):
    """A call to the scheduler failed. `code` is the grpc.StatusCode, `message` the server's text."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class InvalidArgument(GoschedError):
    """The request (usually the job spec) is invalid; `field` names the offending field when known."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, message: str, code: grpc.StatusCode | None = None, field: str = "") -> None:
        super().__init__(message, code)
        self.field = field or message.partition(": ")[0]


class NotFound(GoschedError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(GoschedError):
    code = grpc.StatusCode.ALREADY_EXISTS


class ResourceExhausted(GoschedError):
    """Admission control refused the job (too many pending, tenant rate limit)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class MessageTooLarge(GoschedError):
    """A request or answer over gRPC's message size limit. Not a ResourceExhausted (admission): a
    client that backs off and retries on those would retry this one for ever."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(GoschedError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(GoschedError):
    """The scheduler is not reachable or not ready yet."""

    code = grpc.StatusCode.UNAVAILABLE


# Trailing metadata a master puts on the UNAVAILABLE it answers itself (its scheduler is starting,
# stopped, or a component or its Ray cluster does not answer): gRPC's own UNAVAILABLE, for a master
# that cannot be reached, never carries it.
ANSWERED_KEY = "gosched-master-answered"


class SchedulerUnavailable(Unavailable):
    """The master answered, but its scheduler cannot serve now (the message says why)."""


class Unauthenticated(GoschedError):
    """The master wants a token this call did not carry, or not this one (the message says which)."""

    code = grpc.StatusCode.UNAUTHENTICATED


class DeadlineExceeded(GoschedError, TimeoutError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


_BY_CODE: dict[Any, type[GoschedError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        ResourceExhausted,
        FailedPrecondition,
        Unavailable,
        Unauthenticated,
        DeadlineExceeded,
    )
}


def from_rpc_error(exc: grpc.RpcError) -> GoschedError:
    """The GoschedError matching a grpc.RpcError (GoschedError itself for other codes)."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    cls = _BY_CODE.get(code, GoschedError)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "message larger than max" in (details or ""):
        cls = MessageTooLarge  # gRPC's own size check, at either end
    if code == grpc.StatusCode.UNAVAILABLE and _answered(exc):
        cls = SchedulerUnavailable
    return cls(details or "", code)


def _answered(exc: grpc.RpcError) -> bool:
    """Whether the master itself sent this error (its trailing metadata says so)."""
    try:
        trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    except Exception:  # not a call's error (a channel that never connected)
        return False
    return any(key == ANSWERED_KEY for key, _ in trailing or ())
