"""How a client or a node agent reaches the master: a plaintext or a TLS channel, with a bearer token
on every call when one is given.

    security = ChannelSecurity.from_files(tls_ca="ca.crt", token_file="api.token")
    channel = open_channel("master:9090", security)

TLS is on when a CA (the one that signed the master's certificate) or a client certificate is
given; without a CA, the system's trusted roots check the master. A client certificate and key make
it mutual TLS. The token travels as `authorization: Bearer <token>` metadata, also over plaintext
(where anyone on the path can read it: use TLS with tokens). The agent uses this module too.
"""

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from gosched.common.secret_files import (
    SecretFileError,
    read_certificates,
    read_private_key,
    read_tokens,
    token_problem,
)


@dataclass(frozen=True, slots=True)
class ChannelSecurity:
    """What a channel to a secured master carries: PEM bytes and a token, read once."""

    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None
    token: str | None = None

    @property
    def tls(self) -> bool:
        return self.root_certificates is not None or self.certificate_chain is not None

    @classmethod
    def from_files(
        cls,
        *,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        token: str | None = None,
        token_file: str | None = None,
    ) -> "ChannelSecurity":
        """Read the files; SecretFileError naming the option (tls_ca, tls_cert, tls_key, token,
        token_file) if one cannot be used. A token file's first token is the one sent."""
        if tls_cert is not None and tls_key is None:
            raise SecretFileError("tls_key", "needed with a client certificate (mutual TLS needs both)")
        if tls_key is not None and tls_cert is None:
            raise SecretFileError("tls_cert", "needed with a client key (mutual TLS needs both)")
        if token is not None and token_file is not None:
            raise SecretFileError("token", "give a token or a token file, not both")
        if token is not None:
            why = token_problem(token) if token else "is empty"
            if why:
                raise SecretFileError("token", why)
        if token_file is not None:
            token = read_tokens(token_file, "token_file")[0]
        chain = key = None
        if tls_cert is not None and tls_key is not None:
            chain = read_certificates(tls_cert, "tls_cert")
            key = read_private_key(tls_key, "tls_key")
        roots = read_certificates(tls_ca, "tls_ca") if tls_ca is not None else None
        return cls(roots, chain, key, token)


def target_error(target: str) -> str | None:
    """Why `target` is no master address (None: it may be one). gRPC takes a port above 65535
    modulo 2**16, so `host:117641` would reach port 52105 unasked. A target with a scheme
    (`dns:///`, `unix:`, `ipv4:`) is left to gRPC."""
    if not target.strip():
        return "must be HOST:PORT, got an empty address"
    if ":/" in target or target.startswith(("unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:")):
        return None
    host, colon, port = target.rpartition(":")
    if not colon or not host or (":" in host and not host.startswith("[")):
        return None  # a bare host (gRPC's default port) or an IPv6 address without brackets
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"the port must be a number from 1 to 65535, got {port!r} in {target!r}"
    return None


def open_channel(
    target: str, security: ChannelSecurity | None = None, options: Sequence[tuple[str, Any]] = ()
) -> grpc.Channel:
    """A channel to `target` as `security` says (None: plaintext, no token)."""
    security = security or ChannelSecurity()
    if security.tls:
        credentials = grpc.ssl_channel_credentials(
            security.root_certificates, security.private_key, security.certificate_chain
        )
        channel = grpc.secure_channel(target, credentials, options=list(options))
    else:
        channel = grpc.insecure_channel(target, options=list(options))
    if security.token is None:
        return channel
    # An interceptor, not call credentials: gRPC sends those over TLS only, and a master may ask
    # for tokens on a plaintext port (behind a TLS-terminating proxy, say).
    return grpc.intercept_channel(channel, BearerToken(security.token))


class _Details(
    collections.namedtuple(
        "_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    """A call's details with other metadata (gRPC's own class cannot be built from outside)."""


class BearerToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer <token>` to every call's metadata."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [*(getattr(details, "metadata", None) or ()), self._header]
        return _Details(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)
