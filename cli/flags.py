"""Bad flag values as usage errors: `error: <flag>: <reason>` on stderr and exit 2, never a traceback,
and before the command starts anything (the same convention as cli/main.py's bench and replay)."""

import math
from collections.abc import Mapping, Sequence
from typing import NoReturn

import typer

from gosched.common.secret_files import SecretFileError

# The client options of gosched.api.channel (and Client) as the commands spell them.
SECURITY_FLAGS = {
    "tls_ca": "--tls-ca",
    "tls_cert": "--tls-cert",
    "tls_key": "--tls-key",
    "token_file": "--token-file",
    "token": "GOSCHED_TOKEN",
}


class FlagError(ValueError):
    """A bad flag value, reported as `error: <flag>: <reason>`."""

    def __init__(self, flag: str, reason: str) -> None:
        super().__init__(f"{flag}: {reason}")


def refuse(exc: ValueError) -> NoReturn:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(2) from exc


def check_seconds(flag: str, value: float, *, zero: bool) -> None:
    """A duration in seconds: finite, >= 0 (`zero`) or > 0. `value < 0` alone lets NaN through (every
    comparison with it is false), and infinity would overflow the waits it ends up in."""
    low = value >= 0 if zero else value > 0
    if not (math.isfinite(value) and low):
        raise FlagError(flag, f"must be a finite number of seconds {'>= 0' if zero else '> 0'}, got {value}")


def check_positive(flag: str, value: float) -> None:
    """A finite number > 0: `value <= 0` alone lets NaN through, and infinity after it."""
    if not (math.isfinite(value) and value > 0):
        raise FlagError(flag, f"must be a finite number > 0, got {value}")


def check_count(flag: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise FlagError(flag, f"must be >= {minimum}, got {value}")


def choose(flag: str, text: str, known: Sequence[str], what: str) -> list[str]:
    """A comma-separated list of names out of `known` ("all": every one), none unknown, not empty."""
    names = list(known) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        found = f"unknown {what} {', '.join(unknown)}" if unknown else f"no {what} in {text!r}"
        raise FlagError(flag, f"{found} (known: {', '.join(known)}, or all)")
    return names


def security_flag_error(exc: SecretFileError, flags: Mapping[str, str] = SECURITY_FLAGS) -> FlagError:
    """A TLS or token option's error (named as gosched.api.channel names it) as the flag's."""
    return FlagError(flags.get(exc.what, exc.what), exc.reason)
