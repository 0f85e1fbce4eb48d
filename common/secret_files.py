"""The files that secure the API: PEM certificates and keys, and bearer-token files.

Read with errors that name the setting or option (`what`) and say what is wrong, never what the
file holds. The settings check them at load (common/config.py); the server (api/tls.py,
api/auth.py) and the clients (api/channel.py) read them again when they start, so a file changed
or removed in between is still reported, not met as a failure deep inside gRPC (which reports a bad
certificate as a port it cannot bind).
"""

import ssl
from pathlib import Path
from typing import Any


class SecretFileError(ValueError):
    """A certificate, key or token file (`what`: the setting or option naming it) is unusable."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.what = what
        self.reason = reason

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), (self.what, self.reason)


def _read(path: str, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SecretFileError(what, f"cannot read {path}: {exc.strerror or exc}") from None
    if not data.strip():
        raise SecretFileError(what, f"{path} is empty")
    return data


def read_tokens(path: str, what: str) -> tuple[str, ...]:
    """The tokens of a token file: one a line, blank lines skipped (several let a token rotate:
    add the new one, move the clients over, remove the old)."""
    try:
        text = _read(path, what).decode()
    except UnicodeDecodeError:
        raise SecretFileError(what, f"{path} is not text (one token a line)") from None
    tokens = []
    for number, line in enumerate(text.splitlines(), 1):
        token = line.strip()
        if not token:
            continue
        reason = token_problem(token)
        if reason:
            raise SecretFileError(what, f"line {number} of {path}: {reason}")
        tokens.append(token)
    if not tokens:
        raise SecretFileError(what, f"{path} holds no token")
    return tuple(tokens)


def token_problem(token: str) -> str | None:
    """Why `token` cannot travel as `authorization: Bearer <token>` (None if it can)."""
    if not (token.isascii() and token.isprintable()) or any(c.isspace() for c in token):
        return "a token must be printable ASCII without spaces"
    return None


def read_certificates(path: str, what: str) -> bytes:
    """One or more PEM certificates (a chain, or the CAs to trust), checked to parse."""
    data = _read(path, what)
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise SecretFileError(what, f"{path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    try:
        ssl.create_default_context(cadata=data.decode("ascii", errors="replace"))
    except ssl.SSLError as exc:
        raise SecretFileError(what, f"{path}: not a valid PEM certificate ({exc.reason or exc})") from None
    return data


def read_private_key(path: str, what: str) -> bytes:
    """A PEM private key, unencrypted: gRPC has no way to ask for a passphrase."""
    data = _read(path, what)
    if b"PRIVATE KEY-----" not in data:
        raise SecretFileError(what, f"{path} holds no PEM private key (-----BEGIN ... PRIVATE KEY-----)")
    if b"ENCRYPTED" in data:
        raise SecretFileError(what, f"{path} is encrypted: gRPC needs the key unencrypted")
    return data


def check_key_pair(cert: str, key: str, cert_what: str, key_what: str) -> None:
    """The key in `key` is the one of the certificate in `cert` (each file checked on its own first)."""
    read_certificates(cert, cert_what)
    read_private_key(key, key_what)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key, password=b"")  # never a passphrase prompt
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or str(exc)
        raise SecretFileError(
            key_what, f"{key} is not the key of the certificate in {cert_what} ({cert}): {reason}"
        ) from None
