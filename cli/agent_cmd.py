"""`gosched agent`: the node agent, which registers this machine with the master and runs the tasks
bound to it. A secured master: --tls-ca, --tls-cert/--tls-key (mutual TLS), --token-file (the agent
token); flags only, no env (GOSCHED_TOKEN is a client's API token). --extended advertises countable
resources the agent cannot find itself (FPGAs, RDMA adapters): jobs ask for them under `extended`."""

import contextlib
import ctypes
import os
import signal
from collections.abc import Callable
from types import FrameType
from typing import Annotated

import typer

from gosched.agent.containers import RUNTIME_PROBE_S
from gosched.api.channel import ChannelSecurity, target_error
from gosched.cli.exits import ExitCode
from gosched.cli.flags import FlagError, check_seconds, refuse, security_flag_error
from gosched.common.node import AGENT_LABEL, RUNTIME_LABEL, Taint, TaintEffect
from gosched.common.quantity import parse_bytes, parse_count, parse_milli
from gosched.common.secret_files import SecretFileError
from gosched.common.spec import (
    BUILTIN_RESOURCES as SPEC_BUILTIN_RESOURCES,  # the names a job spec's `extended` refuses too
)
from gosched.common.spec import (
    MAX_EXTENDED,
    label_key_problem,  # the spec's own rule for resource names
)

# Labels the agent or the master set on an agent's node themselves: an operator's value would be
# overridden (AGENT_LABEL, by the master) or would claim a container runtime the probe did not find.
RESERVED_LABELS = {
    AGENT_LABEL: "set to true by the master on every node an agent registers",
    RUNTIME_LABEL: "set by the agent when its probe finds docker or podman working",
}


def parse_labels(text: str) -> dict[str, str]:
    """ "k=v,k2=v2" -> {"k": "v", "k2": "v2"}."""
    labels: dict[str, str] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"label {item!r} is not key=value")
        labels[key.strip()] = value.strip()
    return labels


def check_reserved_labels(labels: dict[str, str]) -> None:
    """Refuse the labels the agent (or the master) sets itself: the operator's would be silently
    replaced, or would send tasks with an image to a node that cannot run them."""
    for key in labels:
        if key in RESERVED_LABELS:
            raise ValueError(f"{key} is reserved: {RESERVED_LABELS[key]}")


def _quantity(flag: str, text: str | None, parse: Callable[[str, str], int]) -> int | None:
    """--cpus/--memory: None (the machine's), or a positive quantity; advertising none is no node."""
    if text is None:
        return None
    try:
        value = parse(text, "value")
    except ValueError as exc:  # QuantityError
        raise FlagError(flag, str(exc)) from None
    if value <= 0:
        raise FlagError(flag, f"must be more than 0, not {text!r} (leave it out to advertise the machine's)")
    return value


# What a node has built in, which an extended resource of the same name would shadow or double:
# CPUs and memory (--cpus, --memory) and the NVIDIA GPUs the agent finds through NVML (and counts
# itself: `nvidia.com/gpu` is the Kubernetes device plugin's name for them). Compared in lowercase.
# The names are the job spec's (common/spec.py), which refuses them under a job's `extended` too.
_BUILTIN_SOURCES = {
    "cpu": "the machine's CPUs (--cpus)",
    "memory": "the machine's memory (--memory)",
    "gpus": "the NVIDIA GPUs the agent finds itself",
}
BUILTIN_RESOURCES = {name: _BUILTIN_SOURCES[field] for name, field in SPEC_BUILTIN_RESOURCES.items()}
COUNT_RULE = f"a whole number from 1 to {MAX_EXTENDED}"  # a job spec takes up to MAX_EXTENDED too


def parse_extended(text: str) -> dict[str, int]:
    """ "example.com/fpga=2,rdma/hca=1" -> {"example.com/fpga": 2, "rdma/hca": 1}: each name as a
    job spec's `extended` names it (the spec's rule), each count a whole number >= 1, a name at
    most once (or again with the same count), none of the node's built-in resources."""
    extended: dict[str, int] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        name, eq, amount = (part.strip() for part in item.partition("="))
        if not eq or not name or not amount:
            raise ValueError(f"{item!r} is not NAME=COUNT (e.g. example.com/fpga=2)")
        if problem := label_key_problem(name, "resource name"):
            raise ValueError(problem)
        if (builtin := BUILTIN_RESOURCES.get(name.lower())) is not None:
            raise ValueError(f"{name} is a built-in resource, not an extended one: {builtin}")
        try:
            count = parse_count(amount, name)  # as a job spec's extended counts are read
        except ValueError:  # QuantityError: not a number, a unit, a fraction, negative, huge
            count = -1
        if not 1 <= count <= MAX_EXTENDED:
            none = " (leave the resource out to advertise none)" if count == 0 else ""
            raise ValueError(f"{name}={amount}: the count must be {COUNT_RULE}{none}")
        if extended.get(name, count) != count:
            raise ValueError(f"{name} given twice, as {extended[name]} and as {count}")
        extended[name] = count
    return extended


def parse_taints(text: str) -> tuple[Taint, ...]:
    """ "key=value:Effect,key2:NoExecute,key3" -> taints; the effect defaults to NoSchedule."""
    taints = []
    effects = ", ".join(e.value for e in TaintEffect)
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        body, colon, effect = item.rpartition(":") if ":" in item else (item, "", "")
        key, _, value = body.partition("=")
        if not key.strip():
            raise ValueError(f"taint {item!r} has no key (key=value:Effect)")
        try:
            kind = TaintEffect(effect.strip()) if colon else TaintEffect.NO_SCHEDULE
        except ValueError as exc:
            raise ValueError(f"taint {item!r}: effect must be one of {effects}") from exc
        taints.append(Taint(key.strip(), value.strip(), kind))
    return tuple(taints)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `gosched` app."""

    @app.command()
    def agent(
        master: Annotated[
            str, typer.Option(help="The master's agent endpoint, HOST:PORT.")
        ] = "localhost:9090",
        name: Annotated[str | None, typer.Option(help="Node name (default: the hostname).")] = None,
        labels: Annotated[
            str,
            typer.Option(
                help="Node labels k=v,k2=v2, over the discovered ones (not gosched.io/agent or "
                "gosched.io/container-runtime: the agent sets those).",
            ),
        ] = "",
        taints: Annotated[
            str, typer.Option(help="Node taints key=value:Effect,... (Effect: NoSchedule by default).")
        ] = "",
        extended: Annotated[
            str,
            typer.Option(
                help="Extended resources to advertise, NAME=COUNT,... (e.g. example.com/fpga=2,rdma/hca=1): "
                "countable things the agent cannot find itself, which jobs request under `extended`. "
                "Names as in a job spec, counts whole numbers >= 1; not cpu, memory or GPUs (built in).",
            ),
        ] = "",
        cpus: Annotated[
            str | None,
            typer.Option(help="CPUs to advertise, at most the machine's (e.g. 2, 1500m); default all."),
        ] = None,
        memory: Annotated[
            str | None,
            typer.Option(help="Memory to advertise, at most the machine's (e.g. 4Gi); default all."),
        ] = None,
        work_dir: Annotated[
            str | None,
            typer.Option(help="Logs and state of the tasks (default ~/.gosched/agent/<name>)."),
        ] = None,
        grace: Annotated[
            float, typer.Option(help="Seconds a task has to exit on SIGTERM when the agent stops.")
        ] = 10.0,
        keep_tasks_on_stop: Annotated[
            bool,
            typer.Option(
                "--keep-tasks-on-stop",
                help="On SIGTERM, leave the tasks running for the next agent on this work dir to"
                " adopt (as a kubelet or slurmd restart does), not stop them. For restarts within the"
                " master's node timeout (node_timeout_s); drain a node before taking it away.",
            ),
        ] = False,
        stop_with_parent: Annotated[
            bool,
            typer.Option(
                "--stop-with-parent",
                hidden=True,  # gosched up's: its agent goes when up goes, however up ends
                help="Stop (as on SIGTERM) when the process that started this agent ends.",
            ),
        ] = False,
        runtime_probe: Annotated[
            float,
            typer.Option(
                help="Seconds between checks that docker/podman still works (0: only at start).",
            ),
        ] = RUNTIME_PROBE_S,
        tls_ca: Annotated[
            str | None,
            typer.Option("--tls-ca", help="PEM file of the CA that signed the master's certificate: TLS."),
        ] = None,
        tls_cert: Annotated[
            str | None, typer.Option("--tls-cert", help="This agent's PEM certificate, for mutual TLS.")
        ] = None,
        tls_key: Annotated[
            str | None, typer.Option("--tls-key", help="The PEM key of --tls-cert (unencrypted).")
        ] = None,
        token_file: Annotated[
            str | None,
            typer.Option("--token-file", help="File holding the agent token (its first line)."),
        ] = None,
    ) -> None:
        """Run the node agent: register this machine with the master and run the tasks bound to it."""
        # Every flag is checked before the agent probes the machine or reaches for the master.
        try:
            why = target_error(master)
            if why is not None:
                raise FlagError("--master", why)
            check_seconds("--grace", grace, zero=True)  # 0: SIGKILL at once
            check_seconds("--runtime-probe", runtime_probe, zero=True)  # 0: only at start
            cpu_milli = _quantity("--cpus", cpus, parse_milli)
            memory_bytes = _quantity("--memory", memory, parse_bytes)
            try:
                node_labels = parse_labels(labels)
                check_reserved_labels(node_labels)
            except ValueError as exc:
                raise FlagError("--labels", str(exc)) from None
            try:
                node_taints = parse_taints(taints)
            except ValueError as exc:
                raise FlagError("--taints", str(exc)) from None
            try:
                node_extended = parse_extended(extended)
            except ValueError as exc:
                raise FlagError("--extended", str(exc)) from None
            try:
                security = ChannelSecurity.from_files(
                    tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, token_file=token_file
                )
            except SecretFileError as exc:
                raise security_flag_error(exc) from None
        except FlagError as exc:
            refuse(exc)

        from gosched.agent.runner import AgentRunner, MoreThanTheMachine, WorkDirBusy

        try:
            runner = AgentRunner(
                master,
                name,
                work_dir=work_dir,
                labels=node_labels,
                taints=node_taints,
                cpu_milli=cpu_milli,
                memory=memory_bytes,
                extended=node_extended,
                runtime_probe_s=runtime_probe,
                shutdown_grace_s=grace,
                echo=typer.echo,
                security=security,
            )
        except MoreThanTheMachine as exc:  # --cpus/--memory: less than the machine's, as --help says
            flag, given = ("--cpus", cpus) if exc.resource == "cpu_milli" else ("--memory", memory)
            why = f"{given} is more than this machine has ({exc.has_text}); leave it out to advertise all"
            refuse(FlagError(flag, why))
        except ValueError as exc:  # SpecError: the node as a whole (e.g. a label the master refuses)
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(ExitCode.USAGE) from exc

        def on_signal(signum: int, frame: FrameType | None) -> None:
            # Ctrl-C at a terminal is someone ending a run by hand: its tasks go with it.
            keep = keep_tasks_on_stop and signum == signal.SIGTERM
            left = ", leaving the tasks running for the next agent to adopt" if keep else ""
            typer.echo(f"{signal.Signals(signum).name}: stopping{left}")
            runner.stop(kill_tasks=not keep)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        if stop_with_parent:
            _stop_with_parent()
        try:
            runner.run()
        except WorkDirBusy as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(ExitCode.FAILED) from exc
        typer.echo("agent stopped")


PR_SET_PDEATHSIG = 1  # prctl(2)


def _stop_with_parent() -> None:
    """SIGTERM this process when its parent ends: `gosched up`'s agent, so that an `up` killed
    (SIGKILL, OOM) does not leave it retrying for ever against a master that is gone. The kernel
    sends it (Linux); a parent gone before it was asked for is found by the ppid."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent or parent == 1:
        os.kill(os.getpid(), signal.SIGTERM)
