"""The commands that talk to a running master through the Python Client: submit, jobs, get,
describe, cancel, logs, explain, nodes, queues, status, cordon, drain, delete-node.

Every command takes `--master HOST:PORT` (env GOSCHED_MASTER, default localhost:9090) and, for a
secured master, `--tls-ca`, `--tls-cert`, `--tls-key` and `--token-file` (or env GOSCHED_TOKEN);
the listing ones take `-o table|wide|json|yaml`. Exit codes are in gosched.cli.exits.
"""

import contextlib
import os
import re
import sys
import time
from collections.abc import Iterator
from typing import Annotated

import typer

from gosched.api.channel import target_error
from gosched.api.client import Client, DeadlineExceeded, InvalidArgument
from gosched.api.convert import JobInfo
from gosched.api.errors import FailedPrecondition, GoschedError, NotFound, Unavailable
from gosched.cli import output as out
from gosched.cli.exits import CliError, ExitCode, error_message, reported
from gosched.cli.flags import check_seconds, refuse, security_flag_error
from gosched.cli.output import Format
from gosched.cli.progress import Progress
from gosched.cli.submit_spec import JobFlags, build_specs, flag_for
from gosched.common.node import NodeState
from gosched.common.secret_files import SecretFileError
from gosched.common.states import HOLDS_RESOURCES, JobState

DEFAULT_MASTER = "localhost:9090"
CALL_TIMEOUT_S = 20.0  # per call: a master that does not answer by then counts as unavailable
PAGE_SIZE = 500
# How long `submit --wait` keeps watching again for a master that went away (a restart): the job
# is durable and goes on meanwhile.
REWATCH_S = 60.0
REWATCH_EVERY_S = 1.0

MasterOpt = Annotated[
    str,
    typer.Option("--master", envvar="GOSCHED_MASTER", help="The master's gRPC address, HOST:PORT."),
]
# A secured master (README, "Securing the API"). The client certificate's env names are not
# GOSCHED_TLS_CERT/KEY: those are the master's own settings, read by a master started from the same shell.
TlsCaOpt = Annotated[
    str | None,
    typer.Option(
        "--tls-ca",
        envvar="GOSCHED_TLS_CA",
        help="PEM file of the CA that signed the master's certificate: TLS.",
    ),
]
TlsCertOpt = Annotated[
    str | None,
    typer.Option(
        "--tls-cert", envvar="GOSCHED_CLIENT_CERT", help="This client's PEM certificate, for mutual TLS."
    ),
]
TlsKeyOpt = Annotated[
    str | None,
    typer.Option("--tls-key", envvar="GOSCHED_CLIENT_KEY", help="The PEM key of --tls-cert (unencrypted)."),
]
TokenFileOpt = Annotated[
    str | None,
    typer.Option(
        "--token-file",
        envvar="GOSCHED_TOKEN_FILE",
        help="File holding the API token (its first line). Or the token itself in env GOSCHED_TOKEN.",
    ),
]
OutputOpt = Annotated[
    Format, typer.Option("--output", "-o", case_sensitive=False, help="table, wide, json or yaml.")
]
JobArg = Annotated[str, typer.Argument(help="The job's id.", show_default=False)]
NodeArg = Annotated[str, typer.Argument(help="The node's name.", show_default=False)]


@contextlib.contextmanager
def _client(
    master: str,
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    token_file: str | None,
    *,
    submitting: bool = False,
) -> Iterator[Client]:
    """A Client for the command body; its errors become a message and an exit code. The token:
    --token-file's (or GOSCHED_TOKEN_FILE's), else GOSCHED_TOKEN's."""
    token = (os.environ.get("GOSCHED_TOKEN") or None) if token_file is None else None
    with reported(master, submitting=submitting):
        why = target_error(master)
        if why is not None:
            raise CliError(f"--master: {why}")
        try:
            client = Client(
                master,
                timeout=CALL_TIMEOUT_S,
                tls_ca=tls_ca,
                tls_cert=tls_cert,
                tls_key=tls_key,
                token=token,
                token_file=token_file,
            )
        except SecretFileError as exc:
            raise CliError(str(security_flag_error(exc))) from None
        with client:
            yield client


# == jobs ==========================================================================================
def submit(
    file: Annotated[
        str | None, typer.Option("--file", "-f", help="Job spec, YAML or JSON ('-': stdin).")
    ] = None,
    gpus: Annotated[
        str | None, typer.Option(help="GPUs per task: whole (2) or a share of one GPU (0.5).")
    ] = None,
    cpus: Annotated[
        str | None, typer.Option("--cpus", "--cpu", help="CPU cores per task (4, 0.5, 500m).")
    ] = None,
    mem: Annotated[
        str | None, typer.Option("--mem", "--memory", help="Memory per task (16Gi, 512Mi).")
    ] = None,
    replicas: Annotated[int | None, typer.Option(min=1, help="Tasks (default 1).")] = None,
    min_member: Annotated[
        int | None, typer.Option(min=1, help="Gang size: place none until this many fit (default 1).")
    ] = None,
    queue: Annotated[str | None, typer.Option(help="Queue (default: default).")] = None,
    priority: Annotated[int | None, typer.Option(help="Priority within the queue (default 0).")] = None,
    name: Annotated[str | None, typer.Option(help="The job's id (default: generated).")] = None,
    tenant: Annotated[str | None, typer.Option(help="Tenant (default: default).")] = None,
    gpu_model: Annotated[
        list[str] | None, typer.Option("--gpu-model", help="An acceptable GPU model (repeat, or a,b).")
    ] = None,
    gpu_topology: Annotated[
        str | None,
        typer.Option(
            "--gpu-topology",
            help="preferred (default), single-numa (all GPUs on one NUMA node, or wait) or "
            "single-numa-nvlink (and NVLink-connected).",
        ),
    ] = None,
    selector: Annotated[
        list[str] | None, typer.Option("--selector", help="Node label KEY=VALUE the node must have (repeat).")
    ] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="Environment KEY=VALUE (repeat).")] = None,
    image: Annotated[
        str | None, typer.Option(help="Run the command in this container image (docker/podman on the node).")
    ] = None,
    submission_id: Annotated[
        str | None, typer.Option(help="Idempotency key: submitting again returns the first job's id.")
    ] = None,
    time_limit: Annotated[
        str | None,
        typer.Option(
            "--time-limit",
            "--time",
            help="How long each task may run before it is stopped and fails: 90s, 45m, 2h, 1h30m, "
            "HH:MM:SS or D-HH:MM:SS.",
        ),
    ] = None,
    max_retries: Annotated[
        int | None,
        typer.Option("--max-retries", help="Times each task is run again after it fails (default 0)."),
    ] = None,
    deadline: Annotated[
        str | None,
        typer.Option(
            "--deadline",
            help="When the job must be done by: ISO-8601 (2027-01-01T09:00:00Z), unix seconds, or "
            "now+DURATION (now+6h). A job that could no longer end by it (--time from now) is cancelled, "
            "not started, as Slurm's --deadline; one that already could not is refused.",
        ),
    ] = None,
    toleration: Annotated[
        list[str] | None,
        typer.Option(
            "--toleration",
            help="Tolerate a node taint (repeat): KEY=VALUE:EFFECT, KEY:EFFECT (any value), KEY=VALUE or "
            "KEY (any effect); EFFECT is NoSchedule, PreferNoSchedule or NoExecute.",
        ),
    ] = None,
    kind: Annotated[
        str | None,
        typer.Option(
            "--kind",
            help=(
                "batch (default) or service: long-running, its node agent restarts its process whenever"
                " it exits (exit code 0 too), never after a kill (cancel, preemption, time limit)."
            ),
        ),
    ] = None,
    preemptible: Annotated[
        bool | None,
        typer.Option(
            "--preemptible/--no-preemptible",
            help="Whether higher-priority or reclaiming work may evict its tasks (default: preemptible).",
        ),
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Follow the job to its end: exit 0 if it succeeded, 1 if not (6: gave up, --timeout).",
        ),
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option(min=0, help="With --wait: give up after this many seconds (exit 6; the job goes on)."),
    ] = None,
    master: MasterOpt = DEFAULT_MASTER,
    tls_ca: TlsCaOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    token_file: TokenFileOpt = None,
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The command to run, after --, word by word.", show_default=False),
    ] = None,
) -> None:
    """Submit a job from a file (-f) or from flags and the command after --; prints its id."""
    if timeout is not None and not wait:  # it bounds the wait alone: without one it would do nothing
        refuse(
            ValueError("--timeout: only with --wait (it bounds the wait; the job itself has --time-limit)")
        )
    if timeout is not None:
        try:
            check_seconds("--timeout", timeout, zero=True)  # no --timeout is the endless wait, not inf
        except ValueError as exc:
            refuse(exc)
    flags = JobFlags(
        command=tuple(command or ()),
        cpus=cpus,
        mem=mem,
        gpus=gpus,
        replicas=replicas,
        gpu_models=tuple(gpu_model or ()),
        gpu_topology=gpu_topology,
        selectors=tuple(selector or ()),
        env=tuple(env or ()),
        image=image,
        name=name,
        tenant=tenant,
        queue=queue,
        priority=priority,
        min_member=min_member,
        submission_id=submission_id,
        time_limit=time_limit,
        max_retries=max_retries,
        deadline=deadline,
        tolerations=tuple(toleration or ()),
        kind=kind,
        preemptible=preemptible,
    )
    with _client(master, tls_ca, tls_cert, tls_key, token_file, submitting=True) as client:
        specs = build_specs(file, flags, sys.stdin)
        if len(specs) > 1 and wait:
            raise CliError(f"--wait: follows one job, and {file} holds {len(specs)}: submit each on its own")
        try:
            # Several documents: one request, all or none (each is validated before any is sent).
            job_ids = [client.submit(specs[0])] if len(specs) == 1 else client.submit_many(specs)
        except InvalidArgument as exc:
            if file is None:
                raise _name_the_flag(exc) from None
            raise _name_the_document(exc, file) if len(specs) > 1 else exc from None
        for job_id in job_ids:
            typer.echo(job_id)
        if wait:
            _wait(client, job_ids[0], timeout)


def _name_the_document(exc: InvalidArgument, file: str) -> InvalidArgument:
    """Rewrite "jobs[1].cpu: ..." (of a request of several jobs) as "job.yaml, document 2: cpu: ..."."""
    found = re.match(r"jobs\[(\d+)\]\.", exc.field or "")
    if found is None:
        return exc
    field = exc.field[found.end() :]
    reason = exc.message.partition(": ")[2] or exc.message
    where = "stdin" if file == "-" else file
    return InvalidArgument(f"{where}, document {int(found[1]) + 1}: {field}: {reason}", field=field)


def _name_the_flag(exc: InvalidArgument) -> InvalidArgument:
    """Rewrite "cpu: ..." as "cpu (--cpus): ...", so an error in a spec built from flags names the flag."""
    flag = flag_for(exc.field) if exc.field else None
    if flag is None:
        return exc
    reason = exc.message.partition(": ")[2] or exc.message
    return InvalidArgument(f"{exc.field} ({flag}): {reason}", field=exc.field)


def _wait(client: Client, job_id: str, timeout: float | None) -> None:
    """Show the job's progress until it ends; exit 1 unless it succeeded."""
    progress = Progress(sys.stderr)
    last: JobInfo | None = None
    deadline = None if timeout is None else time.monotonic() + timeout
    gone_since: float | None = None  # when the master stopped answering
    try:
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                for info in client.watch(job_id, timeout=left):
                    gone_since = None
                    progress.show(info)
                    last = info
                break
            except Unavailable as exc:
                now = time.monotonic()
                if gone_since is None:
                    gone_since = now
                    progress.close()
                    typer.echo(f"the master went away ({exc.message}): watching {job_id} again", err=True)
                if now - gone_since >= REWATCH_S or (deadline is not None and now >= deadline):
                    state = last.state.value if last else "unknown"
                    raise CliError(
                        f"lost the master for {now - gone_since:.0f}s: job {job_id} was {state} "
                        f"(it goes on; gosched get {job_id})",
                        ExitCode.UNAVAILABLE,
                    ) from None
                time.sleep(REWATCH_EVERY_S)
    except DeadlineExceeded:
        state = last.state.value if last else "unknown"
        raise CliError(
            f"gave up waiting after {timeout:g}s: job {job_id} is still {state} (it goes on)",
            ExitCode.GAVE_UP,
        ) from None
    finally:
        progress.close()
    if last is None or not last.final:
        raise CliError(f"the watch of {job_id} ended before the job did", ExitCode.FAILED)
    typer.echo(f"job {job_id} {last.state.value}", err=True)
    if last.state is not JobState.SUCCEEDED:
        raise typer.Exit(ExitCode.FAILED)


def jobs(
    state: Annotated[
        JobState | None, typer.Option(case_sensitive=False, help="Only jobs in this state.")
    ] = None,
    queue: Annotated[str, typer.Option(help="Only jobs of this queue.")] = "",
    tenant: Annotated[str, typer.Option(help="Only jobs of this tenant.")] = "",
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many (default: all).")] = None,
    output: OutputOpt = Format.TABLE,
    master: MasterOpt = DEFAULT_MASTER,
    tls_ca: TlsCaOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """List jobs in submission order (every page, or --limit). An unknown --queue exits 3."""
    with _client(master, tls_ca, tls_cert, tls_key, token_file) as client:
        if queue:
            known = [q.name for q in client.queues()]
            if queue not in known:
                raise CliError(
                    f"--queue: unknown queue {queue!r} (known: {', '.join(known)}; gosched queues)",
                    ExitCode.NOT_FOUND,
                )
        found = client.list(
            state=state, queue=queue, tenant=tenant, page_size=min(limit or PAGE_SIZE, PAGE_SIZE), limit=limit
        )
    out.emit(
        output,
        lambda: [out.job_data(info) for info in found],
        lambda: out.jobs_view(found, wide=output is Format.WIDE),
    )


def get(
    job: JobArg,
    output: OutputOpt = Format.TABLE,
    master: MasterOpt = DEFAULT_MASTER,
    tls_ca: TlsCaOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """Show one job and its tasks with their restarts, nodes and GPUs."""
    with _client(master, tls_ca, tls_cert, tls_key, token_file) as client:
        info = client.get(job)
    out.emit(output, lambda: out.job_data(info, tasks=True), lambda: out.job_view(info))


def describe(
    job: JobArg,
    output: OutputOpt = Format.TABLE,
    master: MasterOpt = DEFAULT_MASTER,
    tls_ca: TlsCaOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """Show everything about a job: its spec, its tasks, and why it is where it is."""
    with _client(master, tls_ca, tls_cert, tls_key, token_file) as client:
        info = client.get(job)
        why = client.explain(job)
    out.emit(
        output,
        lambda: {**out.job_data(info, tasks=True, spec=True), "explanation": why},
        lambda: out.describe_view(info, why),
    )


def cancel(
    job_ids: Annotated[list[str], typer.Argument(help="The jobs' ids, one or more.", show_default=False)],
    output: OutputOpt = Format.TABLE,
    master: MasterOpt = DEFAULT_MASTER,
    tls_ca: TlsCaOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """Cancel jobs' unfinished tasks. Each job given is cancelled even if another is unknown or has
    finished already (an error line for each of those): exit 3 if one is unknown, else 1 if one has
    finished already."""
    ids = list(dict.fromkeys(job_ids))  # each once, in the order given
    done: list[JobInfo] = []
    refused: list[GoschedError] = []
    with _client(master, tls_ca, tls_cert, tls_key, token_file) as client:
        try:
            for job_id in ids:
                try:
                    done.append(client.cancel(job_id))
                except (NotFound, FailedPrecondition) as exc:
                    refused.append(exc)
        finally:  # what was cancelled shows, also when the master goes away midway
            if done:
                out.emit(
                    output,
                    # One job: its object, as before; several: a list of them (as kubectl's List).
                    lambda: (
                        out.job_data(done[0], tasks=True)
                        if len(ids) == 1
                        else [out.job_data(info, tasks=True) for info in done]
                    ),
                    lambda: "\n".join(
                        f"job {info.id} {info.state.value}: {out.counts_text(info)}" for info in done
                    ),
                )
    for why in refused:
        typer.echo(f"error: {error_message(why, master)}", err=True)
    if refused:  # one job: its code, as before; several: 3 if one is unknown, else 1
        unknown = any(isinstance(why, NotFound) for why in refused)
        raise typer.Exit(ExitCode.NOT_FOUND if unknown else ExitCode.FAILED)


def explain(
    job: JobArg,
    output: OutputOpt = Format.TABLE,
    master: MasterOpt = DEFAULT_MASTER,
    tls_ca: TlsCaOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """Why a job is where it is, e.g. per filter how many nodes ruled it out."""
    with _client(master, tls_ca, tls_cert, tls_key, token_file) as client:
        why = client.explain(job)
    out.emit(output, lambda: {"id": job, "explanation": why}, lambda: why)


def logs(
    job: JobArg,
    task: Annotated[int, typer.Option(min=0, help="The task's index within the job.")] = 0,
    stderr: Annotated[bool, typer.Option("--stderr", help="The task's stderr instead of stdout.")] = False,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new output until the task ends.")
    ] = False,
    previous: Annotated[
        bool,
        typer.Option(
            "--previous", "-p", help="The task's run before its current one (a retry's failed run)."
        ),
    ] = False,
    master: MasterOpt = DEFAULT_MASTER,
    tls_ca: TlsCaOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """Print a task's output as the master keeps it, byte for byte."""
    if previous and follow:
        typer.echo("error: --previous: that run has ended, so --follow has nothing to follow", err=True)
        raise typer.Exit(ExitCode.USAGE)
    sink = typer.get_binary_stream("stdout")
    with _client(master, tls_ca, tls_cert, tls_key, token_file) as client:
        wrote = False
        stream = "stderr" if stderr else "stdout"
        try:
            for data in _log_bytes(client, job, task, stream, follow=follow, previous=previous):
                wrote = True
                sink.write(data)
                sink.flush()  # as it comes: someone may be watching
        except InvalidArgument as exc:
            if exc.field != "task_index":
                raise
            raise CliError(
                f"--task: {exc.message.partition(': ')[2]}"
            ) from None  # the flag, not the RPC's field
        if not wrote and previous:
            typer.echo(f"no output from a previous run of task {task} of {job}", err=True)
        elif not wrote:  # say why there is nothing, on stderr: stdout stays the output alone
            typer.echo(_no_output(client, job, task), err=True)


def _log_bytes(
    client: Client, job: str, task: int, stream: str, *, follow: bool, previous: bool
) -> Iterator[bytes]:
    """The task's output; a follower whose master goes away (a restart) follows again, as
    `submit --wait` watches again (for REWATCH_S), from the byte after the last one it yielded."""
    at = 0  # where the bytes yielded so far end, in the run being read
    gone_since: float | None = None  # when the master stopped answering
    while True:
        try:
            if gone_since is not None:
                client.get(job)  # the master answers again (or this raises at once)
                gone_since = None
            for offset, data in client.log_chunks(
                job, task, stream=stream, follow=follow, previous=previous, offset=at
            ):
                at = offset + len(data)
                yield data
            return
        except Unavailable as exc:
            if not follow:
                raise
            now = time.monotonic()
            if gone_since is None:
                gone_since = now
                typer.echo(
                    f"the master went away ({exc.message}): following task {task} of {job} again", err=True
                )
            if now - gone_since >= REWATCH_S:
                raise CliError(
                    f"lost the master for {now - gone_since:.0f}s while following task {task} of {job} "
                    f"(after {at} bytes of this run; gosched logs {job} --task {task})",
                    ExitCode.UNAVAILABLE,
                ) from None
            time.sleep(REWATCH_EVERY_S)


def _no_output(client: Client, job: str, task: int) -> str:
    """Why a task has no output: none yet or none written, or it was on a simulated node, where no
    process is run at all."""
    found = client.get(job).tasks[task]
    said = f"no output from task {task} of {job} (it is {found.state.value})"
    if not found.node:
        return said
    try:
        simulated = client.node(found.node).simulated
    except NotFound:  # the node is gone: it can no longer tell
        return said
    if not simulated:
        return said
    where = "is" if found.state in HOLDS_RESOURCES else "ran"
    return f"{said}: it {where} on simulated node {found.node}, where no process is run"


# == cluster =======================================================================================
def nodes(
    state: Annotated[
        NodeState | None, typer.Option(case_sensitive=False, help="Only nodes in this state.")
    ] = None,
    output: OutputOpt = Format.TABLE,
    master: MasterOpt = DEFAULT_MASTER,
    tls_ca: TlsCaOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """List nodes with their CPU, memory and GPUs used/total; -o wide adds extended resources,
    labels, taints, GPUs."""
    with _client(master, tls_ca, tls_cert, tls_key, token_file) as client:
        found = client.nodes(state)
    out.emit(
        output,
        lambda: [out.node_data(n) for n in found],
        lambda: out.nodes_view(found, wide=output is Format.WIDE),
    )


def cordon(
    node: NodeArg,
    undo: Annotated[bool, typer.Option("--undo", help="Uncordon: place new tasks there again.")] = False,
    output: OutputOpt = Format.TABLE,
    master: MasterOpt = DEFAULT_MASTER,
    tls_ca: TlsCaOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """Stop placing new tasks on a node (its tasks stay); --undo resumes."""
    with _client(master, tls_ca, tls_cert, tls_key, token_file) as client:
        info = client.cordon(node, uncordon=undo)
    out.emit(output, lambda: out.node_data(info), lambda: out.node_line(info))


def drain(
    node: NodeArg,
    undo: Annotated[
        bool, typer.Option("--undo", help="End the drain: place new tasks there again (as cordon --undo).")
    ] = False,
    output: OutputOpt = Format.TABLE,
    master: MasterOpt = DEFAULT_MASTER,
    tls_ca: TlsCaOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """Mark a node draining: no new tasks; its tasks stay until they end (then it reads drained,
    and the machine may be taken down); --undo resumes, as Slurm's scontrol update state=resume."""
    with _client(master, tls_ca, tls_cert, tls_key, token_file) as client:
        info = client.cordon(node, uncordon=True) if undo else client.drain(node)
    out.emit(output, lambda: out.node_data(info), lambda: out.node_line(info))


def delete_node(
    node: NodeArg,
    force: Annotated[
        bool, typer.Option("--force", help="Also when tasks run there: they are queued again.")
    ] = False,
    master: MasterOpt = DEFAULT_MASTER,
    tls_ca: TlsCaOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """Remove a node whose machine is gone for good (its agent stopped)."""
    with _client(master, tls_ca, tls_cert, tls_key, token_file) as client:
        try:
            requeued = client.delete_node(node, force=force)
        except FailedPrecondition as exc:  # the server's words serve API clients too: say the CLI's way
            raise FailedPrecondition(_cli_words(exc.message)) from None
    more = f"; {len(requeued)} task(s) queued again" if requeued else ""
    typer.echo(f"node {node} deleted{more}")


def _cli_words(message: str) -> str:
    """A server message without its words for API clients ("; force in the DeleteNode request")."""
    return re.sub(r"; \w+ in the \w+ request\)", ")", message)


def queues(
    output: OutputOpt = Format.TABLE,
    master: MasterOpt = DEFAULT_MASTER,
    tls_ca: TlsCaOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """List queues with their policy, guarantee, cap and current share."""
    with _client(master, tls_ca, tls_cert, tls_key, token_file) as client:
        found = client.queues()
    out.emit(output, lambda: [out.queue_data(q) for q in found], lambda: out.queues_view(found))


def status(
    output: OutputOpt = Format.TABLE,
    master: MasterOpt = DEFAULT_MASTER,
    tls_ca: TlsCaOpt = None,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """The scheduler's status: readiness, capacity in use, job counts."""
    with _client(master, tls_ca, tls_cert, tls_key, token_file) as client:
        found = client.status()
    out.emit(output, lambda: found, lambda: out.status_view(found))


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `gosched` app."""
    # Options end at the command's first word, so its own flags (python train.py --lr 1) stay its own.
    app.command("submit", context_settings={"allow_interspersed_args": False})(submit)
    for command in (jobs, get, describe, cancel, logs, explain, nodes, queues, status, cordon, drain):
        app.command(command.__name__)(command)
    app.command("delete-node")(delete_node)
