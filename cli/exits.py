"""Exit codes of the client commands, and the one place that turns an error into code and message.

Scripts test these codes, so they are part of the interface:
0 ok; 1 the job failed, a wait ended badly, or anything else the master refused (its token
included, as kubectl does); 2 bad usage or an invalid spec; 3 not found;
4 refused by admission (resource exhausted); 5 the master is unavailable; 6 gave up waiting
(`submit --wait --timeout` ran out: the job goes on, neither failed nor done).

The long-running commands (`master`, `up`, `agent`) use two of them: 2 (USAGE) for a flag or
configuration invalid in itself, refused before anything starts; 1 (FAILED) for what the machine
refuses at start (a port in use, a store or work dir another process holds) or a stop on failure.
"""

import contextlib
import enum
from collections.abc import Iterator

import typer

from gosched.api.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    GoschedError,
    InvalidArgument,
    MessageTooLarge,
    NotFound,
    ResourceExhausted,
    SchedulerUnavailable,
    Unauthenticated,
    Unavailable,
)
from gosched.common.errors import SpecError


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    NOT_FOUND = 3
    EXHAUSTED = 4
    UNAVAILABLE = 5
    GAVE_UP = 6  # a wait's --timeout ran out; the job goes on
    INTERRUPTED = 130  # Ctrl-C, as a shell reports it


# First match wins; anything else the server says (INTERNAL, ...) is a plain failure.
_CODES: tuple[tuple[type[GoschedError], ExitCode], ...] = (
    (InvalidArgument, ExitCode.USAGE),
    (AlreadyExists, ExitCode.USAGE),  # the server reports it as a spec error on `id`
    (NotFound, ExitCode.NOT_FOUND),
    (MessageTooLarge, ExitCode.USAGE),  # too big to send or to answer: retrying cannot help
    (ResourceExhausted, ExitCode.EXHAUSTED),
    (Unavailable, ExitCode.UNAVAILABLE),
    (DeadlineExceeded, ExitCode.UNAVAILABLE),  # a unary call timed out: the master did not answer
    (FailedPrecondition, ExitCode.FAILED),
)


class CliError(Exception):
    """A problem found before or after talking to the master (an unreadable file, a bad flag)."""

    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def exit_code(exc: BaseException) -> ExitCode:
    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, SpecError):
        return ExitCode.USAGE
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return ExitCode.FAILED


def error_message(exc: BaseException, master: str, *, submitting: bool = False) -> str:
    """What the user reads on stderr: the server's own words, plus where they came from when the
    master could not be reached. `submitting`: the command submits jobs (a retry can submit twice)."""
    if isinstance(exc, CliError):
        return exc.message
    if isinstance(exc, SpecError):
        return str(exc)  # "field: reason"
    if isinstance(exc, SchedulerUnavailable):  # it answered: starting, stopped, or a part is down
        if exc.message == "the scheduler is not ready":
            return f"the master at {master} is not ready: {exc.message}"
        detail = exc.message.removeprefix("the scheduler is unavailable: ")
        return f"the master at {master} answers but its scheduler is unavailable: {detail or 'unavailable'}"
    if isinstance(exc, Unavailable):
        if "not ready" in exc.message:  # a master without the marker: it answered, it is starting
            return f"the master at {master} is not ready: {exc.message}"
        return (
            f"cannot reach the master at {master} (is it running? check --master or GOSCHED_MASTER, "
            "and --tls-ca if it serves TLS)\n"
            f"  {exc.message or 'unavailable'}"
        )
    if isinstance(exc, DeadlineExceeded):
        # The request reached the master and may yet be applied: a blind retry can submit twice.
        hint = "  the request may still take effect: check (gosched jobs) before retrying"
        if submitting:
            hint += ", or submit with --submission-id, which makes a retry return the first job"
        return f"the master at {master} did not answer in time: {exc.message}\n{hint}"
    if isinstance(exc, Unauthenticated):
        return (
            f"the master at {master} refused the call: {exc.message}\n"
            "  give its API token with --token-file, GOSCHED_TOKEN_FILE or GOSCHED_TOKEN"
        )
    if isinstance(exc, MessageTooLarge):
        return f"the request or its answer is too large for one gRPC message: {exc.message}"
    if isinstance(exc, ResourceExhausted):
        return f"refused by admission: {exc.message}"
    if isinstance(exc, GoschedError):
        return exc.message or exc.code.name
    return str(exc)


@contextlib.contextmanager
def reported(master: str, *, submitting: bool = False) -> Iterator[None]:
    """Run a command body; an error becomes `error: ...` on stderr and its exit code."""
    try:
        yield
    except (GoschedError, CliError, SpecError) as exc:
        typer.echo(f"error: {error_message(exc, master, submitting=submitting)}", err=True)
        raise typer.Exit(exit_code(exc)) from None
    except KeyboardInterrupt:
        typer.echo("", err=True)
        raise typer.Exit(ExitCode.INTERRUPTED) from None
