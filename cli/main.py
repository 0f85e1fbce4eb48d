"""The `gosched` command line."""

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

# gRPC's C core logs an INFO line each time Ray forks a worker while gRPC threads run; a person at
# a terminal needs errors only (set GRPC_VERBOSITY to see more).
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
# With fork support on, grpcio starts a poller thread in each child Ray forks for its daemons while
# our gRPC server runs; subprocess closes its fd before exec and about one child in a hundred (the
# raylet, the GCS) aborts, leaving a 30 s wait per try (grpc/grpc#43055). Nothing of ours uses gRPC
# in a forked child. Read when grpc is imported, so it is set before any import that loads grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import typer

from gosched.cli import agent_cmd, client_cmds, master_cmds
from gosched.cli.flags import FlagError, check_count, check_positive, choose, refuse

if TYPE_CHECKING:
    from gosched.bench.runner import RunResult

app = typer.Typer(help="GoSched: a sharded scheduler for GPU clusters.", no_args_is_help=True)
config_app = typer.Typer(help="Configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")
master_cmds.register(app)  # up, master
agent_cmd.register(app)  # agent
client_cmds.register(app)  # submit ... explain, cordon, drain, delete-node


@app.command()
def bench(
    workload: Annotated[str, typer.Option(help="Workload name, comma list, or 'all'.")] = "scheduling-basic",
    in_process: Annotated[
        bool, typer.Option("--in-process", help="All components in this process (no Ray).")
    ] = False,
    nodes: Annotated[int, typer.Option(help="Simulated nodes.")] = 10_000,
    pods: Annotated[int, typer.Option("--pods", "--tasks", help="Measured tasks.")] = 50_000,
    shards: Annotated[str, typer.Option(help="Shard counts, comma separated (e.g. 1,2,4,8).")] = "1",
    profile: Annotated[
        str, typer.Option(help="default, minimal (fit check only, the ceiling) or both.")
    ] = "default",
    batch_size: Annotated[int, typer.Option(help="Units per shard batch.")] = 512,
    out: Annotated[str, typer.Option(help="Results folder (table, JSON, PNG).")] = "results/bench",
    ingest: Annotated[
        bool, typer.Option("--ingest", help="Measure ingest instead: tasks submitted through gRPC.")
    ] = False,
    replicas: Annotated[int, typer.Option(help="--ingest: tasks per job.")] = 10,
    submit_batch: Annotated[int, typer.Option(help="--ingest: jobs per SubmitJobs call.")] = 500,
    rate: Annotated[
        str | None,
        typer.Option(
            help="Also run with the tasks arriving at this rate (tasks/s), or 'half' (half the peak "
            "just measured for the same workload, shards and profile); latency is then submission "
            "to binding. Ray only."
        ),
    ] = None,
    memory: Annotated[
        bool,
        typer.Option(
            "--memory", help="Measure memory instead: --nodes nodes and --pods tasks pending (Ray)."
        ),
    ] = False,
    messages: Annotated[
        bool,
        typer.Option(
            "--messages", help="Measure what the actors' messages cost to pack and unpack per task."
        ),
    ] = False,
    bodies: Annotated[
        bool,
        typer.Option(
            "--bodies",
            help="Time the actors' bodies per task without Ray (--pods tasks on --nodes nodes): "
            "the dispatcher and the binder, which bound throughput with many shards, and a "
            "shard's planning, its replies and the bindings of the others it takes.",
        ),
    ] = False,
) -> None:
    """Measure scheduling throughput, latency and conflicts per workload and shard count (or, with
    --ingest, how fast one gRPC client gets tasks accepted; with --memory, the control plane's
    memory; with --messages, what the actors' messages cost per task; with --bodies, the actors'
    work per task)."""
    import sys

    from gosched.bench.in_process import profiles
    from gosched.bench.report import table, write
    from gosched.bench.runner import run_in_process, run_ray
    from gosched.bench.workloads import WORKLOADS

    # Every flag is checked before any mode starts Ray or a run: a bad value must not cost a run
    # (or hang one: NaN and infinity compare false with everything, so they are refused by name).
    try:
        check_count("--nodes", nodes, 1)
        check_count("--pods", pods, 0 if memory else 1)  # --memory 0: the idle control plane
        check_count("--replicas", replicas, 1)
        check_count("--submit-batch", submit_batch, 1)
        if ingest and pods % replicas:  # ingest submits whole jobs: it would measure another count
            raise FlagError(
                "--pods",
                f"must be a multiple of --replicas ({replicas}) with --ingest: it submits jobs of "
                f"{replicas} tasks, so {pods} would measure {max(1, pods // replicas) * replicas}",
            )
        counts = _parse_shards(shards)
        fixed_rate = _parse_rate(rate, in_process)
        chosen_profiles = profiles(profile)
        names = choose("--workload", workload, list(WORKLOADS), "workload")
    except ValueError as exc:
        refuse(exc)
    # Each run builds its Settings from these flags: a bad one is reported here, before any runs.
    master_cmds.flag_settings(shards=max(counts), batch_size=batch_size)
    out_dir = _out_folder(out)
    if messages:
        _bench_messages(out_dir)
        return
    if bodies:
        _bench_bodies(pods, nodes, out_dir)
        return
    if ingest:
        _bench_ingest(pods, replicas, submit_batch, "local" if in_process else "ray", nodes, out_dir)
        return
    if memory:
        _bench_memory(nodes, pods, counts[0], out_dir)
        return
    run = run_in_process if in_process else run_ray
    results = []
    plan = [(n, c, p) for n in names for c in counts for p in chosen_profiles]
    with typer.progressbar(plan, label="benchmarking", file=sys.stderr) as bar:
        for name, count, prof in bar:
            result = run(WORKLOADS[name](nodes, pods), count, prof, batch_size)
            results.append(result)
            _echo_run(result)
            if rate is not None:
                offered = fixed_rate if fixed_rate is not None else result.tasks_per_s / 2
                paced = run_ray(WORKLOADS[name](nodes, pods), count, prof, batch_size, rate=offered)
                results.append(paced)
                _echo_run(paced)
    typer.echo(table(results))
    for path in write(results, out_dir, " ".join(sys.argv)):
        typer.echo(f"wrote {path}")


def _parse_shards(text: str) -> list[int]:
    """--shards: whole numbers >= 1, comma separated; an empty entry (`1,,2`) is a typo, not a skip."""
    counts = []
    for entry in text.split(","):
        try:
            count = int(entry.strip())
        except ValueError:
            count = 0
        if count < 1:
            raise FlagError("--shards", f"each entry must be a whole number >= 1 (e.g. 1,2,4), not {entry!r}")
        counts.append(count)
    return counts


def _parse_rate(rate: str | None, in_process: bool) -> float | None:
    """--rate: None, 'half' (None here: decided per run) or a positive number of tasks/s."""
    if rate is None or rate == "half":
        if rate is not None and in_process:
            raise FlagError("--rate", "needs the Ray runtime (leave out --in-process)")
        return None
    try:
        value = float(rate)
    except ValueError:
        raise FlagError("--rate", f"must be a number of tasks/s or 'half', not {rate!r}") from None
    check_positive("--rate", value)
    if in_process:
        raise FlagError("--rate", "needs the Ray runtime (leave out --in-process)")
    return value


def _out_folder(out: str) -> Path:
    """--out, created now: a folder that cannot be made (a file in the way, no permission) is a usage
    error before the runs, not a traceback after them."""
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        refuse(FlagError("--out", f"cannot create folder {out}: {exc.strerror or exc}"))
    if not os.access(path, os.W_OK | os.X_OK):
        refuse(FlagError("--out", f"cannot write in folder {out}: permission denied"))
    return path


def _echo_run(result: "RunResult") -> None:
    paced = f", offered {result.offered_rate:,.0f}/s" if result.offered_rate else ""
    lat = f", p99 {result.p99_ms:.0f} ms" if result.p99_ms is not None else ""
    typer.echo(
        f"\n{result.tasks_per_s:,.0f} tasks/s  ({result.workload}, {result.runtime}, {result.shards} "
        f"shard(s), profile {result.profile}{paced}, {result.bound:,} of {result.tasks:,} tasks bound in "
        f"{result.seconds:.2f}s{lat})"
    )


def _bench_messages(out: Path) -> None:
    from gosched.bench.message_costs import measure
    from gosched.bench.message_costs import table as cost_table
    from gosched.bench.report import write_result

    costs = measure()
    typer.echo(cost_table(costs))
    typer.echo(f"wrote {write_result(out, 'messages.json', {'messages': [c.as_dict() for c in costs]})}")


def _bench_bodies(tasks: int, nodes: int, out: Path) -> None:
    from gosched.bench.actor_bodies import ceilings, measure
    from gosched.bench.actor_bodies import table as body_table
    from gosched.bench.report import write_result

    costs = measure(tasks, nodes)
    typer.echo(body_table(costs))
    result: dict[str, object] = {
        "bodies": [c.as_dict() for c in costs],
        "ceiling_tasks_per_s": {str(s): t for s, t in ceilings(costs).items()},
    }
    typer.echo(f"wrote {write_result(out, 'bodies.json', result)}")


def _bench_memory(nodes: int, pending: int, shards: int, out: Path) -> None:
    from gosched.bench.memory import measure_memory
    from gosched.bench.report import write_result

    result = measure_memory(nodes, pending, shards)
    parts = ", ".join(f"{k} {v:,.0f}" for k, v in result.rss_mib.items())
    typer.echo(
        f"control plane {result.control_plane_mib:,.0f} MiB with {nodes:,} nodes and {pending:,} tasks "
        f"pending, {shards} shard(s) ({parts}; Ray's daemons apart: {result.ray_daemons_mib:,.0f} MiB)"
    )
    typer.echo(f"wrote {write_result(out, 'memory.json', result.as_dict())}")


def _bench_ingest(tasks: int, replicas: int, batch: int, runtime: str, nodes: int, out: Path) -> None:
    from gosched.bench.ingest import ingest_line, run_ingest
    from gosched.bench.report import write_result

    result = run_ingest(
        tasks, replicas=replicas, batch=batch, runtime="local" if runtime == "local" else "ray", nodes=nodes
    )
    typer.echo(ingest_line(result))
    typer.echo(f"wrote {write_result(out, 'ingest.json', result.as_dict())}")


@app.command()
def replay(
    seeds: Annotated[int, typer.Option(help="Seeds (runs) per policy.")] = 10,
    policies: Annotated[str, typer.Option(help="Comma-separated policies, or 'all'.")] = "all",
    trace_dir: Annotated[
        str | None, typer.Option(help="openb trace folder (default ../shared/traces/openb-v2023).")
    ] = None,
    out: Annotated[str, typer.Option(help="Results folder.")] = "results/replay",
    timed: Annotated[
        bool, typer.Option("--timed", help="Replay creation/deletion times through a running master.")
    ] = False,
    compress: Annotated[float, typer.Option(help="--timed: trace seconds per wall second.")] = 100_000.0,
    runtime: Annotated[str, typer.Option(help="--timed: 'ray' or 'local' (in process).")] = "ray",
    limit_s: Annotated[float | None, typer.Option(help="--timed: stop after this many wall seconds.")] = None,
) -> None:
    """Replay the Alibaba GPU trace: FGD's fill-until-full experiment for each placement policy, or
    (--timed) its arrivals and lifetimes in time through the running system."""

    from gosched.bench.replay import POLICIES, run_replay, table
    from gosched.bench.replay_report import write_results
    from gosched.bench.trace import load_nodes, load_tasks
    from gosched.bench.trace import trace_dir as find_trace

    # The flags first, so that a bad one is named even where the trace is missing.
    try:
        check_count("--seeds", seeds, 1)
        chosen = choose("--policies", policies, list(POLICIES), "policy")
        if runtime not in ("ray", "local"):
            raise FlagError("--runtime", f"must be ray or local, not {runtime!r}")
        check_positive("--compress", compress)
        if limit_s is not None:
            check_positive("--limit-s", limit_s)
    except ValueError as exc:
        refuse(exc)
    folder = find_trace(trace_dir)
    node_csv, task_csv = folder / "openb_node_list_gpu_node.csv", folder / "openb_pod_list_default.csv"
    if not node_csv.exists() or not task_csv.exists():
        typer.echo(f"trace not found in {folder} (set --trace-dir or GOSCHED_TRACE_DIR)", err=True)
        raise typer.Exit(2)
    out_dir = _out_folder(out)
    if timed:
        from gosched.bench.timed_replay import load_timed_tasks, run_timed_replay, summary, write_timed

        with typer.progressbar(length=100, label="replaying in time") as bar:
            done = [0]

            def advance(fraction: float) -> None:
                step = int(fraction * 100) - done[0]
                if step > 0:
                    bar.update(step)
                    done[0] += step

            result = run_timed_replay(
                load_nodes(node_csv),
                load_timed_tasks(task_csv),
                compress=compress,
                runtime=runtime,
                limit_s=limit_s,
                progress=advance,
            )
        typer.echo(summary(result))
        for path in write_timed(result, out_dir):
            typer.echo(f"wrote {path}")
        return
    nodes, tasks = load_nodes(node_csv), load_tasks(task_csv)
    total = len(chosen) * seeds
    with typer.progressbar(length=total, label="replaying") as bar:
        results = run_replay(nodes, tasks, chosen, list(range(seeds)), progress=lambda _: bar.update(1))
    typer.echo(table(results))
    meta = {
        "trace": str(folder),
        "nodes": len(nodes),
        "gpus": sum(len(n.gpus) for n in nodes),
        "seeds": seeds,
    }
    for path in write_results(results, out_dir, meta):
        typer.echo(f"wrote {path}")


@app.command()
def demo(
    nodes: Annotated[int, typer.Option(help="Simulated nodes.")] = 200,
    jobs: Annotated[int, typer.Option(help="Jobs to submit.")] = 2_000,
    shards: Annotated[int, typer.Option(help="Scheduler shards.")] = 2,
) -> None:
    """Run the scheduler in one process on simulated nodes and show it working."""
    from gosched.runtime.demo import run_demo

    try:
        check_count("--nodes", nodes, 0)  # 0: the local node alone
        check_count("--jobs", jobs, 0)
    except ValueError as exc:
        refuse(exc)
    master_cmds.flag_settings(shards=shards)  # run_demo builds its Settings from this flag
    run_demo(nodes=nodes, jobs=jobs, shards=shards, echo=typer.echo)


@config_app.command("show")
def config_show(
    config: Annotated[str | None, typer.Option("--config", "-c", help="YAML config file.")] = None,
) -> None:
    """Print the effective configuration (file, then GOSCHED_* env; a command's flags go on top) and
    check the profile's plugin names."""
    settings = master_cmds.settings_or_exit(lambda: master_cmds.checked_settings(config), config)
    typer.echo(json.dumps(settings.model_dump(mode="json"), indent=2))


if __name__ == "__main__":
    app()
