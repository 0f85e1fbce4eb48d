"""The `gosched` command line."""

import json
from typing import Annotated

import typer

from gosched.common.config import load_settings

app = typer.Typer(help="GoSched: a sharded scheduler for GPU clusters.", no_args_is_help=True)
config_app = typer.Typer(help="Configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@app.command()
def bench(
    in_process: Annotated[
        bool, typer.Option("--in-process", help="Run all components in this process.")
    ] = False,
    nodes: Annotated[int, typer.Option(help="Simulated nodes.")] = 10_000,
    pods: Annotated[int, typer.Option("--pods", "--tasks", help="Tasks to schedule.")] = 50_000,
    shards: Annotated[str, typer.Option(help="Shard counts, comma separated (e.g. 1,2,4).")] = "1",
    profile: Annotated[str, typer.Option(help="default, minimal (fit check only) or both.")] = "default",
    batch_size: Annotated[int, typer.Option(help="Units per shard batch.")] = 512,
) -> None:
    """Measure scheduling throughput (SchedulingBasic: identical single-task jobs)."""
    from gosched.bench.in_process import profiles, run_scheduling_basic

    if not in_process:
        typer.echo("only --in-process is available in this version", err=True)
        raise typer.Exit(2)
    try:
        counts = [int(s) for s in shards.split(",") if s.strip()]
        chosen = profiles(profile)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    for count in counts:
        for prof in chosen:
            result = run_scheduling_basic(nodes, pods, count, profile=prof, batch_size=batch_size)
            typer.echo(result.line())


@app.command()
def replay(
    seeds: Annotated[int, typer.Option(help="Seeds (runs) per policy.")] = 10,
    policies: Annotated[str, typer.Option(help="Comma-separated policies, or 'all'.")] = "all",
    trace_dir: Annotated[
        str | None, typer.Option(help="openb trace folder (default ../shared/traces/openb-v2023).")
    ] = None,
    out: Annotated[str, typer.Option(help="Results folder.")] = "results/replay",
) -> None:
    """Replay the Alibaba GPU trace (FGD's fill-until-full experiment) for each placement policy."""
    from pathlib import Path

    from gosched.bench.replay import POLICIES, run_replay, table
    from gosched.bench.replay_report import write_results
    from gosched.bench.trace import load_nodes, load_tasks
    from gosched.bench.trace import trace_dir as find_trace

    folder = find_trace(trace_dir)
    node_csv, task_csv = folder / "openb_node_list_gpu_node.csv", folder / "openb_pod_list_default.csv"
    if not node_csv.exists() or not task_csv.exists():
        typer.echo(f"trace not found in {folder} (set --trace-dir or GOSCHED_TRACE_DIR)", err=True)
        raise typer.Exit(2)
    chosen = list(POLICIES) if policies == "all" else [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in POLICIES]
    if unknown:
        typer.echo(f"unknown policy {', '.join(unknown)} (known: {', '.join(POLICIES)})", err=True)
        raise typer.Exit(2)
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
    for path in write_results(results, Path(out), meta):
        typer.echo(f"wrote {path}")


@app.command()
def demo(
    nodes: Annotated[int, typer.Option(help="Simulated nodes.")] = 200,
    jobs: Annotated[int, typer.Option(help="Jobs to submit.")] = 2_000,
    shards: Annotated[int, typer.Option(help="Scheduler shards.")] = 2,
) -> None:
    """Run the scheduler in one process on simulated nodes and show it working."""
    from gosched.runtime.demo import run_demo

    run_demo(nodes=nodes, jobs=jobs, shards=shards, echo=typer.echo)


@config_app.command("show")
def config_show(
    config: Annotated[str | None, typer.Option("--config", "-c", help="YAML config file.")] = None,
) -> None:
    """Print the effective configuration (file, then GOSCHED_* env, then flags)."""
    try:
        settings = load_settings(config)
    except Exception as exc:  # pydantic's ValidationError names each bad field
        typer.echo(f"invalid configuration: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(json.dumps(settings.model_dump(mode="json"), indent=2))


if __name__ == "__main__":
    app()
