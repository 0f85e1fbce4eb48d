"""`gosched master` (the scheduler and its API, for real deployments) and `gosched up` (the
embedded default on one machine: a local Ray, the master, this machine's own agent, and simulated
nodes, with a sample job to show it working).

Exit status (cli/exits.py's codes): 2 (USAGE) for a flag or configuration that is invalid in
itself, refused before anything starts; 1 (FAILED) when the machine refuses the start (a port in
use, another master holding the store, Ray not answering) or the scheduler stops while running.
Each is one `error: ...` line on stderr, never a traceback.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from gosched.cli.config_errors import SettingsSources
from gosched.cli.exits import ExitCode
from gosched.cli.flags import check_count, check_seconds, refuse
from gosched.common.config import Settings, load_settings
from gosched.common.secret_files import SecretFileError

ConfigOpt = Annotated[str | None, typer.Option("--config", "-c", help="YAML config file.")]
ShardsOpt = Annotated[int | None, typer.Option(help="Scheduler shards (Ray actors).")]
StoreOpt = Annotated[str | None, typer.Option("--store", help="SQLite store path.")]
GrpcOpt = Annotated[int | None, typer.Option("--grpc-port", help="gRPC port (API and agents).")]
HttpOpt = Annotated[int | None, typer.Option("--http-port", help="HTTP port (/healthz /readyz /metrics).")]
TlsCertOpt = Annotated[
    str | None, typer.Option("--tls-cert", help="Serve gRPC over TLS: the PEM certificate (chain).")
]
TlsKeyOpt = Annotated[str | None, typer.Option("--tls-key", help="The PEM key of --tls-cert (unencrypted).")]
TlsClientCaOpt = Annotated[
    str | None,
    typer.Option("--tls-client-ca", help="Mutual TLS: clients and agents need a certificate this CA signed."),
]
ApiTokenOpt = Annotated[
    str | None,
    typer.Option(
        "--api-token-file", help="Jobs and cluster calls need one of this file's tokens (one a line)."
    ),
]
AgentTokenOpt = Annotated[
    str | None,
    typer.Option("--agent-token-file", help="Agents need one of this file's tokens (one a line)."),
]
SimNodesOpt = Annotated[int, typer.Option("--sim-nodes", help="Simulated nodes to add.")]
SimSecondsOpt = Annotated[
    float, typer.Option("--sim-task-seconds", help="How long a task on a simulated node runs.")
]


# The flags of `master` and `up` whose names are not --<setting with dashes>.
FLAG_NAMES = {"store_path": "--store", "ray_address": "--address", "runtime": "--in-process"}


def _settings(config: str | None, *, defaults: dict[str, Any] | None = None, **overrides: Any) -> Settings:
    return settings_or_exit(
        lambda: checked_settings(config, defaults=defaults, **overrides),
        config,
        defaults=defaults,
        overrides=overrides,
    )


def settings_or_exit(
    build: Callable[[], Settings],
    config: str | None = None,
    *,
    defaults: dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None,
    from_file: bool = True,
) -> Settings:
    """`build()`, or the reason it is invalid on stderr and exit 2: every command that takes
    settings from a file or flags reports them alike, never with a traceback. One line per error:
    the field's path, the reason and where the value came from (the file, a GOSCHED_* variable, a
    flag: `defaults` and `overrides` as given to load_settings; `from_file` false for settings made
    from flags alone). An unknown key gets the known key it most likely stands for."""
    try:
        return build()
    except Exception as exc:  # pydantic's ValidationError names each bad field
        source = (config or os.environ.get("GOSCHED_CONFIG")) if from_file else None
        sources = SettingsSources(source, defaults=defaults, overrides=overrides, flag_names=FLAG_NAMES)
        if isinstance(exc, ValidationError):
            told = [f"invalid configuration: {line}" for line in sources.error_lines(exc.errors())]
            if source:
                told.append(f"(settings from {source}, GOSCHED_* variables and flags)")
        elif isinstance(exc, OSError) and exc.filename is not None:  # the file itself
            told = [f"invalid configuration: cannot read {exc.filename}: {exc.strerror or exc}"]
        else:  # the YAML, a plugin name (the message names the field)
            told = [f"invalid configuration: {sources.described(str(exc))}"]
        typer.echo("\n".join(told), err=True)
        raise typer.Exit(ExitCode.USAGE) from exc


def flag_settings(**flags: Any) -> Settings:
    """Settings from a command's own flags (demo, bench), checked before the command starts: those
    commands build theirs deep inside the run, where a bad value would end in a traceback."""
    return settings_or_exit(lambda: Settings(**flags), overrides=flags, from_file=False)


def checked_settings(
    config: str | None, *, defaults: dict[str, Any] | None = None, **overrides: Any
) -> Settings:
    """load_settings, and the profile's plugin names checked against the registry (the config
    model itself cannot know them: plugins live in the shard's package)."""
    from gosched.scheduler_shard.framework.profile import check_profile

    settings = load_settings(config, defaults=defaults, **overrides)
    check_profile(settings.profile)
    return settings


def _check_sim_flags(sim_nodes: int, sim_task_seconds: float) -> None:
    try:
        check_count("--sim-nodes", sim_nodes, 0)
        check_seconds("--sim-task-seconds", sim_task_seconds, zero=True)  # NaN/inf: tasks never end
    except ValueError as exc:
        refuse(exc)


def missing_store(store_path: str) -> Path | None:
    """The store's path if it does not exist yet, asked before the start creates it (":memory:"
    never is): see note_new_store."""
    if store_path == ":memory:":
        return None
    path = Path(store_path)  # as serve() opens it (no ~ expansion there either)
    return None if path.exists() else path.absolute()


def note_new_store(path: Path | None) -> None:
    """Say so once the master has started on a store that did not exist (missing_store): a first
    start needs it made, but a mistyped --store on a restart would otherwise look like an empty
    cluster. Not before the start: one that fails makes no store (serve removes what it made)."""
    if path is not None:
        typer.echo(f"note: no store at {path}: started a new, empty one", err=True)


def stop_reason(error: BaseException | None) -> str:
    """Why the scheduler stopped, on one line: a SchedulerFailure's own words, else the
    exception's type and message (its repr would show quotes and escapes)."""
    from gosched.runtime.control import SchedulerFailure, describe_error

    if error is None:
        return "the scheduler stopped"
    why = str(error) if isinstance(error, SchedulerFailure) else describe_error(error)
    return f"the scheduler stopped: {why}"


def _stop_signals() -> threading.Event:
    """An event that Ctrl-C or SIGTERM sets from now on, instead of ending the process at once."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _wait_for_signal(handle: Any, stop: threading.Event | None = None) -> None:
    """Block until Ctrl-C or SIGTERM (`stop`, or from now on), or until the scheduler itself has
    stopped (then exit 1)."""
    stop = stop or _stop_signals()
    while not stop.wait(0.5):
        if not handle.service.alive:
            raise typer.Exit(_fail(stop_reason(handle.service.error)))


PORT_FLAGS = {"grpc": "--grpc-port", "http": "--http-port"}


def _start(settings: Settings, sim_nodes: int, sim_task_seconds: float | None) -> Any:
    """serve(), ready; a start the machine refuses is one `error:` line and exit 1 (the module's
    docstring has the rule)."""
    from gosched.api.server import PortUnavailable, serve
    from gosched.runtime.simulation import sim_nodes as make_sim_nodes

    nodes = make_sim_nodes(sim_nodes) if sim_nodes else []
    # SIGTERM during the start unwinds serve() as Ctrl-C does, so it removes what it made.
    previous = signal.signal(signal.SIGTERM, _interrupt_start)
    try:
        return serve(
            settings,
            nodes,
            grpc_port=settings.grpc_port,
            http_port=settings.http_port,
            runtime=settings.runtime,
            ray_address=settings.ray_address,
            log_dir=settings.log_dir,
            sim_task_seconds=sim_task_seconds,
            heartbeat_interval_s=settings.heartbeat_interval_s,
            node_timeout_s=settings.node_timeout_s,
            wait_ready=True,
        )
    except SecretFileError as exc:  # a certificate or token file gone bad since the settings were read
        typer.echo(f"error: cannot start the master: {exc}", err=True)
        raise typer.Exit(ExitCode.USAGE) from exc
    except PortUnavailable as exc:
        raise typer.Exit(_port_refused(exc)) from exc
    except OSError as exc:  # the store's folder cannot be made or opened
        typer.echo(f"error: cannot start the master: {exc}", err=True)
        raise typer.Exit(ExitCode.FAILED) from exc
    except RuntimeError as exc:  # StoreBusy, or the scheduler (Ray, the store) failed to come up
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.FAILED) from exc
    except KeyboardInterrupt as exc:
        typer.echo("stopped before the master was ready", err=True)
        raise typer.Exit(ExitCode.INTERRUPTED) from exc
    finally:
        signal.signal(signal.SIGTERM, previous)


def _port_refused(exc: Any) -> int:
    """A PortUnavailable, on one `error:` line naming the flag that chooses another port."""
    typer.echo(f"error: cannot start the master: {exc}; choose another with {PORT_FLAGS[exc.kind]}", err=True)
    return ExitCode.FAILED


def _refuse_taken_ports(settings: Settings) -> None:
    """Refuse a port that is taken (another `up` or master) before anything starts, as serve()
    refuses it: `up` says "starting Ray ..." first, and a local Ray takes seconds. Only a first
    look: serve() binds the ports and decides, so a port taken in between fails there, alike."""
    from gosched.api.server import PortUnavailable, bind_error
    from gosched.api.server import os_error_reason as why

    refused = bind_error("[::]", settings.grpc_port)  # serve()'s host; the probe gRPC's bind makes
    if refused is not None:
        exc = PortUnavailable("grpc", f"cannot listen on [::]:{settings.grpc_port}: {why(refused)}")
        raise typer.Exit(_port_refused(exc))
    if settings.http_port:
        try:  # as ThreadingHTTPServer binds it: SO_REUSEADDR, IPv4 on every address
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(("0.0.0.0", settings.http_port))
                probe.listen()
        except OSError as error:
            exc = PortUnavailable("http", f"cannot serve HTTP on 0.0.0.0:{settings.http_port}: {why(error)}")
            raise typer.Exit(_port_refused(exc)) from error


def _interrupt_start(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def master(
    config: ConfigOpt = None,
    shards: ShardsOpt = None,
    store: StoreOpt = None,
    grpc_port: GrpcOpt = None,
    http_port: HttpOpt = None,
    address: Annotated[
        str | None,
        typer.Option(
            "--address",
            help="Join the Ray cluster at this address ('auto': the one running on this machine). "
            "Default: this machine's Ray if one runs, else start one.",
        ),
    ] = None,
    in_process: Annotated[
        bool, typer.Option("--in-process", help="Run every component in this process (no Ray).")
    ] = False,
    sim_nodes: SimNodesOpt = 0,
    sim_task_seconds: SimSecondsOpt = 5.0,
    tls_cert: TlsCertOpt = None,
    tls_key: TlsKeyOpt = None,
    tls_client_ca: TlsClientCaOpt = None,
    api_token_file: ApiTokenOpt = None,
    agent_token_file: AgentTokenOpt = None,
) -> None:
    """Run the scheduler (dispatcher, binder, shards as Ray actors) and serve its API.

    Exits 2 on an invalid flag or configuration, before starting; 1 if the start is refused (a port
    in use, another master on the store, Ray not answering) or the scheduler stops.
    """
    _check_sim_flags(sim_nodes, sim_task_seconds)
    settings = _settings(
        config,
        shards=shards,
        store_path=store,
        grpc_port=grpc_port,
        http_port=http_port,
        ray_address=address,
        runtime="local" if in_process else None,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_client_ca=tls_client_ca,
        api_token_file=api_token_file,
        agent_token_file=agent_token_file,
    )
    new_store = missing_store(settings.store_path)  # before _start creates it
    handle = _start(settings, sim_nodes, sim_task_seconds if sim_nodes else None)
    stop = _stop_signals()  # before "ready": a supervisor may send SIGTERM as soon as it reads it
    note_new_store(new_store)
    typer.echo(
        f"gosched master ready: gRPC :{handle.grpc_port}, HTTP :{handle.http_port}, "
        f"{settings.shards} shard(s) on {settings.runtime}, store {settings.store_path}"
    )
    try:
        _wait_for_signal(handle, stop)
    finally:
        typer.echo("stopping")
        handle.stop()


UP_SHARDS = 4  # the embedded default shows several shards at work
SAMPLE_SCRIPT = "echo hello from gosched on $(hostname); echo GPUs: ${CUDA_VISIBLE_DEVICES:-none}"
DEMO_WAIT_S = 60.0  # how long the demo waits for its sample jobs (--demo-wait)
AGENT_WAIT_S = 60.0  # and, before them, for this machine's agent to register


def up(
    config: ConfigOpt = None,
    shards: ShardsOpt = None,
    store: StoreOpt = None,
    grpc_port: GrpcOpt = None,
    http_port: HttpOpt = None,
    sim_nodes: SimNodesOpt = 16,
    sim_task_seconds: SimSecondsOpt = 3.0,
    work_dir: Annotated[str, typer.Option(help="Where the store, logs and agent files go.")] = ".gosched",
    detach_after_demo: Annotated[
        bool,
        typer.Option(
            "--exit-after-demo",
            help="Stop once the sample jobs have finished; exit 1 if one did not succeed in time.",
        ),
    ] = False,
    demo_wait: Annotated[
        float,
        typer.Option(
            "--demo-wait",
            help="How long the demo waits for its sample jobs to finish, in seconds; then it says "
            "what is unfinished, and the cluster serves on.",
        ),
    ] = DEMO_WAIT_S,
) -> None:
    """The embedded default: a local Ray, the master, this machine's agent, simulated nodes.

    The settings' runtime is honoured: with `runtime: local` (in the -c file or GOSCHED_RUNTIME)
    every component runs in this process, without Ray, and the first line says so. Sample jobs
    show it working; what they do (fail, get cancelled, still wait after --demo-wait) is reported
    one line each and the cluster serves on. Exits 2 on an invalid flag or configuration, before
    starting; 1 if the start is refused (a port in use, another master on the store) or something
    stops on a failure; with --exit-after-demo, 1 also when the demo did not go as expected.
    """
    from gosched import Client

    _check_sim_flags(sim_nodes, sim_task_seconds)
    try:
        check_seconds("--demo-wait", demo_wait, zero=False)
    except ValueError as exc:
        refuse(exc)
    root = Path(work_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    settings = _settings(
        config,
        # up's own defaults: below the config file and GOSCHED_* env, which a flag overrides
        defaults={"shards": UP_SHARDS, "store_path": str(root / "gosched.db")},
        shards=shards,
        store_path=store,
        grpc_port=grpc_port,
        http_port=http_port,
    )
    if settings.tls_cert is not None:
        # Its own agent and client reach it at 127.0.0.1 and hold no CA or client certificate.
        refuse(
            ValueError("tls_cert: gosched up serves plaintext on this machine; serve TLS with gosched master")
        )
    _refuse_taken_ports(settings)
    new_store = missing_store(settings.store_path)  # before _start creates it
    started = time.monotonic()
    typer.echo(_starting(settings, config))
    handle = _start(settings, sim_nodes, sim_task_seconds)
    note_new_store(new_store)
    target = f"127.0.0.1:{handle.grpc_port}"
    me = socket.gethostname()
    stop = _stop_signals()  # Ctrl-C during the demo stops it all as it does after
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gosched.cli.main",
            "agent",
            "--master",
            target,
            "--name",
            me,
            "--work-dir",
            str(root / "agent"),
            "--stop-with-parent",  # an `up` that dies takes it along, however it dies
            *(["--token-file", settings.agent_token_file] if settings.agent_token_file else []),
        ],
        stdout=subprocess.DEVNULL if detach_after_demo else None,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # Ctrl-C reaches us; we stop the agent ourselves
    )
    try:
        with Client(target, timeout=30, token_file=settings.api_token_file) as client:
            problems = _show_working(
                client, me, started, wait_s=demo_wait, stop=stop, cancel_unfinished=detach_after_demo
            )
        if stop.is_set():
            if detach_after_demo:
                raise typer.Exit(ExitCode.INTERRUPTED)
        elif detach_after_demo:
            for problem in problems:
                typer.echo(f"error: demo: {problem}", err=True)
            if problems:
                raise typer.Exit(ExitCode.FAILED)
        else:
            for problem in problems:
                typer.echo(f"demo: {problem}")
            typer.echo(
                f"running: gRPC {target}, metrics http://localhost:{handle.http_port}/metrics; "
                "Ctrl-C stops it all"
            )
            _wait_for_signal(handle, stop)
    finally:
        typer.echo("stopping the agent and the master")
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(15)
        except subprocess.TimeoutExpired:
            agent.kill()
        handle.stop()


def _starting(settings: Settings, config: str | None) -> str:
    """What `up` starts: Ray and the master, or (runtime: local, from the file or the env) the
    master alone, saying where that came from: `gosched config show` reports the same runtime."""
    if settings.runtime != "local":
        return f"starting Ray and the master ({settings.shards} shards) ..."
    source = SettingsSources(config or os.environ.get("GOSCHED_CONFIG")).source_of(("runtime",))
    why = f"runtime: local, {source}" if source else "runtime: local"
    return (
        f"starting the master ({settings.shards} shards) in this process, without Ray ({why}; "
        "runtime: ray runs it on a local Ray) ..."
    )


def _show_working(
    client: Any,
    me: str,
    started: float,
    *,
    wait_s: float = DEMO_WAIT_S,
    stop: threading.Event | None = None,
    cancel_unfinished: bool = False,
) -> list[str]:
    """The demo: the cluster, sample jobs run (a shell job on this machine, a GPU gang, GPU
    shares), the shell job's output, and why an oversized job is pending (then cancelled).

    Returns what did not go as expected, one line each: a sample job that ended other than
    succeeded, or is still unfinished `wait_s` after its submission (left to run, or cancelled
    with `cancel_unfinished`), an agent that did not register, a call the master refused. It
    raises on none of them: the cluster serving matters more than its demo. Returns early, with
    nothing, once `stop` is set (Ctrl-C)."""
    from gosched.api.errors import GoschedError

    stop = stop or threading.Event()
    problems: list[str] = []
    try:
        _demo(client, me, started, wait_s, stop, cancel_unfinished, problems)
    except GoschedError as exc:  # the master refused a call, or did not answer in time
        problems.append(f"the demo stopped: {' '.join(str(exc).split())}")
    return [] if stop.is_set() else problems


def _submit_gpu_samples(client: Any, stamp: int) -> tuple[str, str]:
    """The demo's GPU jobs: a gang of 4 tasks of 2 GPUs each, and 6 notebooks of a quarter GPU."""
    gang = client.submit(
        {
            "id": f"train-{stamp}",
            "replicas": 4,
            "min_member": 4,
            "gpus": 2,
            "cpu": "8",
            "memory": "32Gi",
            "command": ["python", "train.py"],
        }
    )
    shares = client.submit(
        {
            "id": f"notebooks-{stamp}",
            "replicas": 6,
            "gpus": "0.25",
            "cpu": "2",
            "memory": "8Gi",
            "command": ["jupyter", "lab"],
        }
    )
    return gang, shares


def _demo(
    client: Any,
    me: str,
    started: float,
    wait_s: float,
    stop: threading.Event,
    cancel_unfinished: bool,
    problems: list[str],
) -> None:
    from gosched.api.client import FINAL_STATES
    from gosched.api.errors import GoschedError
    from gosched.cli.output import jobs_view, nodes_view
    from gosched.common.states import JobState

    deadline = time.monotonic() + AGENT_WAIT_S
    while not any(n.name == me for n in client.nodes()):
        if time.monotonic() > deadline:
            problems.append(
                f"this machine's agent did not register within {AGENT_WAIT_S:g}s; no sample jobs run"
            )
            return
        if stop.wait(0.2):
            return
    nodes = client.nodes()
    typer.echo("\n" + _cluster_line(nodes, me))
    typer.echo(nodes_view(nodes))
    stamp = int(time.time())
    too_big = ""
    gpus = any(info.node.gpus for info in nodes)
    if not gpus:  # they could never run: waiting for them would only end the demo in a failure
        typer.echo("no GPUs in the cluster: the GPU sample jobs (a gang, GPU shares) are left out")
    try:
        local = client.submit(_sample_job(f"hello-{stamp}"))
        ids: tuple[str, ...] = (local,)
        if gpus:
            ids += _submit_gpu_samples(client, stamp)
        too_big = client.submit({"id": f"too-big-{stamp}", "gpus": 16, "cpu": "1", "command": ["true"]})
        # One deadline for all, polled: Ctrl-C is seen within a quarter second.
        ends = time.monotonic() + wait_s
        infos = [client.get(job_id) for job_id in ids]
        while not all(info.state in FINAL_STATES for info in infos) and time.monotonic() < ends:
            if stop.wait(0.25):
                return
            infos = [client.get(job_id) for job_id in ids]
        big = client.get(too_big)
        typer.echo("\njobs:")
        typer.echo(jobs_view([*infos, big]))
        for info in infos:
            if info.state is JobState.SUCCEEDED:
                continue
            why = _one_line(client.explain(info.id))
            if info.state in FINAL_STATES:
                problems.append(
                    f"sample job {info.id} ended {info.state.value}" + (f": {why}" if why else "")
                )
                continue
            left = f"left to run (gosched cancel {info.id} stops it)"
            if cancel_unfinished:
                with contextlib.suppress(GoschedError):  # ended meanwhile
                    client.cancel(info.id)
                left = "cancelled"
            problems.append(
                f"sample job {info.id} still {info.state.value} after {wait_s:g}s"
                + (f" ({why})" if why else "")
                + f"; {left}"
            )
        if infos[0].state is JobState.SUCCEEDED:
            out = b"".join(client.logs(local, 0)).decode(errors="replace").strip()
            typer.echo(
                f"\noutput of {local} (ran on this machine by its agent):\n  " + out.replace("\n", "\n  ")
            )
        if big.state is JobState.PENDING:
            typer.echo(f"\nwhy {too_big} is pending:\n  " + client.explain(too_big).replace("\n", "\n  "))
        else:
            problems.append(f"sample job {too_big} is {big.state.value}, not pending as it should be")
    finally:
        if too_big:  # it could never run: nothing of it outlives the demo
            with contextlib.suppress(GoschedError):  # ended already, or the master is gone
                client.cancel(too_big)
    if not problems:
        typer.echo(f"\nup and working in {time.monotonic() - started:.1f}s")
    else:
        typer.echo(f"\nup in {time.monotonic() - started:.1f}s; the demo did not go as expected:")


def _cluster_line(nodes: list[Any], me: str) -> str:
    """The cluster on one line, "cluster: 18 nodes, 32 GPUs: this machine (vm), 1 other agent node
    and 16 simulated": the nodes an agent registered (AGENT_LABEL) apart from the simulated ones,
    and from those registered otherwise (through the ClusterService), which neither runs."""
    from gosched.common.node import AGENT_LABEL, NodeState

    agents = [n for n in nodes if n.name != me and AGENT_LABEL in n.node.label_dict()]
    simulated = sum(1 for n in nodes if n.name != me and n.simulated)
    others = len(nodes) - 1 - len(agents) - simulated
    gone = sum(1 for n in agents if n.node.state is NodeState.NOT_READY)
    parts = [f"this machine ({me})"]
    if agents:
        parts.append(_count(len(agents), "other agent node") + (f" ({gone} not ready)" if gone else ""))
    if simulated:
        parts.append(f"{simulated} simulated")
    if others:
        parts.append(_count(others, "other node") + " (registered without an agent)")
    named = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    gpus = sum(len(n.node.gpus) for n in nodes)
    return f"cluster: {_count(len(nodes), 'node')}, {_count(gpus, 'GPU')}: {named}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _one_line(text: str) -> str:
    """A job's explanation on one line: its "last unschedulable" reason if it has one, else its
    lines after the first (the job's summary, which the jobs table shows) joined."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("last unschedulable: "):
            return line.removeprefix("last unschedulable: ")
    return "; ".join(lines[1:] if len(lines) > 1 else lines)


def _sample_job(job_id: str) -> dict[str, Any]:
    """A small shell job for this machine's agent (the only node with a real agent here)."""
    return {
        "id": job_id,
        "command": ["sh", "-c", SAMPLE_SCRIPT],
        "cpu": "100m",
        "memory": "64Mi",
        "node_selector": {"gosched.io/agent": "true"},
    }


def _fail(message: str) -> int:
    typer.echo(f"error: {message}", err=True)
    return ExitCode.FAILED


def register(app: typer.Typer) -> None:
    """Add `master` and `up` to the `gosched` app."""
    app.command()(master)
    app.command()(up)
